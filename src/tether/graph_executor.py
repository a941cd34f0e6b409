"""Run a compiled model on this machine: ``graph_executor.load("out/")``.

The executor is the device runtime's own (``tether_rpc.graph_executor.GraphExecutor``), so a local run and a
remote run execute the same code; only the module loading differs.
"""
from __future__ import annotations

import os
import tempfile
from typing import Mapping, Union

import numpy as np

from tether_rpc.graph_executor import GraphExecutor
from tether_rpc.module import load_module

__all__ = ["GraphExecutor", "load", "create", "from_factory"]


def load(folder: str) -> GraphExecutor:
    """Load deploy.json + deploy.so + deploy.params from `folder` (as written by ``GraphFactory.export``)."""
    if not os.path.isfile(os.path.join(folder, "deploy.json")):
        raise FileNotFoundError("%s has no deploy.json: export a model there with tether.build_graph(...).export()"
                                % folder)
    return GraphExecutor.from_folder(folder, load_module=load_module)


def create(graph_json: Union[str, dict], lib_path: str,
           params: Union[None, bytes, str, Mapping[str, np.ndarray]] = None) -> GraphExecutor:
    """An executor from a graph JSON, a library path and params (dict, params-file bytes or path)."""
    return GraphExecutor(graph_json, load_module(lib_path), params)


def from_factory(factory) -> GraphExecutor:
    """Run a model just built with ``tether.build_graph`` here, keeping no files: it is exported to a temporary
    folder, loaded, and the folder is removed (the loaded library stays mapped). Use ``factory.export`` and
    ``load`` to keep the artifact."""
    with tempfile.TemporaryDirectory(prefix="tether-run-") as folder:
        factory.export(folder)
        return load(folder)
