"""Tuning tasks: the tunable kernels of a model's kernel plan, each with its config space and its weight.

A task is one te task of ``graph.plan.plan_kernels`` (the plan ``tether.build_graph`` compiles): the same passes,
the same weight packing, the same deduplication by ``kernel_signature``, for one target; loop-IR kernels and numpy
nodes take no schedule config and are not tasks. Its weight is how many nodes of the model run it; its key
(``graph.plan.task_key``) is what a tuning log and ``build_graph(tuning_log=)`` use.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether import driver, ops
from tether.graph.ir import Graph
from tether.graph.plan import KernelTask, plan_kernels
from tether.target import Target
from tether.tune.log import target_id
from tether.tune.space import ConfigSpace

log = logging.getLogger(__name__)

KERNEL_NAME = "tuned"     # the function name of every candidate module


@dataclass
class Task:
    """One distinct tunable kernel of a model on one target: a view of its task in the kernel plan."""

    key: str
    name: str                       # the node's ops label, e.g. "conv2d+add+clip"
    signature: str
    target: Target
    weight: int
    space: ConfigSpace
    args: List[Tuple[Tuple[int, ...], str]]    # (shape, dtype) of every kernel argument, inputs then output
    planned: KernelTask = field(repr=False)

    @classmethod
    def of(cls, planned: KernelTask) -> "Task":
        args, space = planned.interface()
        return cls(planned.key, planned.name, planned.signature, planned.plan.target, planned.weight, space, args,
                   planned)

    def lower(self, config: Optional[Dict[str, Any]] = None) -> tuple:
        """(placeholders, output te tensor) of the kernel, fresh (te graphs are not shared between builds), with
        its weights laid out for `config` (its conv_panel, as build_graph packs them)."""
        placeholders, out, _ = self.planned.lower(config)
        return placeholders, out

    def build(self, config: Optional[Dict[str, Any]]) -> Any:
        """The kernel with `config` as a one-function Module (tether.artifact.Module) named KERNEL_NAME."""
        placeholders, out = self.lower(config)
        sch = ops.schedule([out], self.target, config=config)
        return driver.build(sch, placeholders + [out], target=self.target, name=KERNEL_NAME, jobs=1)

    def layout(self, config: Optional[Dict[str, Any]]) -> Optional[int]:
        """The panel width `config` repacks this kernel's conv weight to, or None when it keeps the task's layout
        (configs with the same layout share their input arrays)."""
        return self.planned.layout(config)

    def inputs(self, seed: int = 0, config: Optional[Dict[str, Any]] = None) -> List[np.ndarray]:
        """Deterministic random inputs (every argument but the output) for measuring and checking; with a
        `config` that repacks the conv weight, that argument in its layout (the same weights, so the same answer)."""
        arrays = self._default_inputs(seed)
        width = self.layout(config)
        if width is not None:
            wname = self.planned.panel_weight()
            k = self.planned.node.body_params().index(wname)
            oc = self.planned.plan.panel_weights[wname][0]
            arrays[k] = ops.linear.pack_panels_array(ops.linear.unpack_panels_array(arrays[k], oc), width)
        return arrays

    def _default_inputs(self, seed: int) -> List[np.ndarray]:
        rng = np.random.default_rng(seed)
        arrays = []
        for shape, dtype in self.args[:-1]:
            dt = np.dtype(dtype)
            if dt.kind == "f":
                arrays.append(rng.uniform(-1, 1, shape).astype(dt))
            elif dt.kind == "b":
                arrays.append(rng.random(shape) < 0.5)
            else:
                arrays.append(rng.integers(0, 4, shape).astype(dt))
        return arrays

    def record(self) -> Dict[str, Any]:
        """The log's ``task`` line."""
        return {"kind": "task", "task": self.key, "name": self.name, "target": target_id(self.target),
                "weight": self.weight, "space": {k: list(ch) for k, ch in self.space.knobs},
                "space_kind": self.space.kind, "args": [[list(s), d] for s, d in self.args]}


def extract_tasks(graph: Graph, params: Dict[str, np.ndarray], target: Any = "host", opt_level: int = 3,
                  only: Optional[Sequence[str]] = None, precision: str = "fp32") -> List[Task]:
    """The model's tunable kernels for `target` as build_graph compiles them (the te tasks of its kernel plan),
    heaviest (weight) first, ties in graph order. ``only``: keep the tasks whose ops label contains one of these
    strings. ``precision``: as build_graph's (an fp16 build's kernels are other tasks, with other keys)."""
    plan = plan_kernels(graph, params, target, opt_level, precision)
    tasks = [Task.of(t) for t in plan.tunable_tasks() if not only or any(s in t.name for s in only)]
    tasks.sort(key=lambda t: -t.weight)
    log.info("%d tasks (%d kernel nodes) for %s", len(tasks), sum(t.weight for t in tasks),
             plan.target.preset or plan.target.triple)
    return tasks
