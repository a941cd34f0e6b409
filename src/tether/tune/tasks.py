"""Tuning tasks: the distinct kernels of a compiled model, each with its config space and its weight.

A task is one kernel as ``tether.build_graph`` compiles it: the same passes, the same conv weight packing, the same
deduplication by ``kernel_signature`` (ops, attributes, argument types), for one target. Its weight is how many
nodes of the model run it; its key (``log.task_key``) is what a tuning log and ``build_graph(tuning_log=)`` use.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether import driver, ops
from tether.graph.build import kernel_signature, prepare_graph
from tether.graph.conv_gemm import panel_type, panel_weight
from tether.graph.ir import Graph, Node, TensorType
from tether.graph.loop_kernel import DIRECT_KERNELS
from tether.graph.passes import needs_kernel
from tether.graph.to_te import lower_kernel
from tether.ops.schedules import family_of
from tether.target import Target, as_target
from tether.tune.log import target_id, task_key
from tether.tune.space import ConfigSpace, space_for

log = logging.getLogger(__name__)

KERNEL_NAME = "tuned"     # the function name of every candidate module


@dataclass
class Task:
    """One distinct kernel of a model on one target."""

    key: str
    name: str                       # the node's ops label, e.g. "conv2d+add+clip"
    signature: str
    target: Target
    weight: int
    space: ConfigSpace
    args: List[Tuple[Tuple[int, ...], str]]    # (shape, dtype) of every kernel argument, inputs then output
    node: Node = field(repr=False)
    types: Dict[str, TensorType] = field(repr=False)
    panel_weights: Dict[str, tuple] = field(repr=False, default_factory=dict)

    def lower(self, config: Optional[Dict[str, Any]] = None) -> tuple:
        """(placeholders, output te tensor) of the kernel, fresh (te graphs are not shared between builds), with
        its weights laid out for `config` (its conv_panel, as build_graph packs them)."""
        placeholders, out, _ = lower_kernel(self.node, self._types_for(config), conv_gemm=True,
                                            panel_weights=self.panel_weights)
        return placeholders, out

    def build(self, config: Optional[Dict[str, Any]]) -> Any:
        """The kernel with `config` as a one-function Module (tether.artifact.Module) named KERNEL_NAME."""
        placeholders, out = self.lower(config)
        sch = ops.schedule([out], self.target, config=config)
        return driver.build(sch, placeholders + [out], target=self.target, name=KERNEL_NAME, jobs=1)

    # ---- the conv weight layout a config's conv_panel asks for (issue 15): the kernel's argument changes with it
    def layout(self, config: Optional[Dict[str, Any]]) -> Optional[int]:
        """The panel width `config` repacks this kernel's conv weight to, or None when it keeps the task's layout
        (configs with the same layout share their input arrays)."""
        width = (config or {}).get("conv_panel")
        wname = panel_weight(self.node, self.panel_weights)
        if not width or wname is None or int(self.types[wname].shape[2]) == width:
            return None
        return int(width)

    def _types_for(self, config: Optional[Dict[str, Any]]) -> Dict[str, TensorType]:
        width = self.layout(config)
        if width is None:
            return self.types
        wname = panel_weight(self.node, self.panel_weights)
        types = dict(self.types)
        types[wname] = panel_type(self.types, wname, self.panel_weights[wname][0], width)
        return types

    def inputs(self, seed: int = 0, config: Optional[Dict[str, Any]] = None) -> List[np.ndarray]:
        """Deterministic random inputs (every argument but the output) for measuring and checking; with a
        `config` that repacks the conv weight, that argument in its layout (the same weights, so the same answer)."""
        arrays = self._default_inputs(seed)
        width = self.layout(config)
        if width is not None:
            wname = panel_weight(self.node, self.panel_weights)
            k = self.node.body_params().index(wname)
            oc = self.panel_weights[wname][0]
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
                  only: Optional[Sequence[str]] = None) -> List[Task]:
    """The model's distinct kernels for `target` as build_graph compiles them, heaviest (weight) first, ties in
    graph order. ``only``: keep the tasks whose ops label contains one of these strings."""
    tgt = as_target(target)
    fam = family_of(tgt)
    graph, params, panel_weights = prepare_graph(graph, params, opt_level, tgt)
    by_sig: Dict[str, Task] = {}
    order: List[str] = []
    for node in graph.nodes:
        if not needs_kernel(node) or node.op in DIRECT_KERNELS:
            continue      # (kernels written as loop IR, softmax and recurrent cells, take no schedule config)
        sig = kernel_signature(node, graph.types)
        if sig in by_sig:
            by_sig[sig].weight += 1
            continue
        label = node.ops_label()
        if only and not any(s in label for s in only):
            continue
        placeholders, out, _ = lower_kernel(node, graph.types, conv_gemm=opt_level >= 3, panel_weights=panel_weights)
        args = [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in placeholders + [out]]
        by_sig[sig] = Task(task_key(sig, tgt), label, sig, tgt, 1, space_for(out, fam), args, node, graph.types,
                           panel_weights)
        order.append(sig)
    tasks = [by_sig[s] for s in order]
    tasks.sort(key=lambda t: -t.weight)
    log.info("%d tasks (%d kernel nodes) for %s", len(tasks), sum(t.weight for t in tasks), tgt.preset or tgt.triple)
    return tasks
