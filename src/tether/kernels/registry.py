"""The op table's types: one entry per graph op, holding its definition and, per target kind, its kernel strategy.

- ``OpDef``: the op's fusion ``pattern``, its shape/dtype rule ``infer(attrs, *in_types) -> [TensorType]`` and
  its numpy meaning ``ref(attrs, *arrays) -> [ndarray]`` (constant folding, the reference interpreter);
- a strategy says how a node of the op becomes code on one kind of target:
  ``TeLowering`` (a te compute, scheduled by ``ops.schedule`` with a tunable config space; elementwise ops of a
  fused node are lowered this way inside their group's kernel), ``LoopKernel`` (loop IR written directly, no
  schedule config) or ``DeviceNumpy`` (no kernel: the device runs the op with numpy between kernels).

Strategies are keyed by target kind (``target_kind``: ``"cpu"`` for every CPU target LLVM compiles for, the GPU
API for a GPU target), so a new kind of target adds its own strategies without touching the CPU ones. ``OpTable``
refuses a second definition or a second strategy for the same op and kind; ``tether.kernels.table`` fills the one
table explicitly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tether.gpu_target import is_gpu_spec
from tether.graph.ir import Node, TensorType
from tether.target import as_target

#: the kinds of target a strategy can be written for: CPUs, and GPUs per API (tether.gpu_target.GPU_APIS)
TARGET_KINDS = ("cpu", "opencl", "vulkan", "cuda")


def target_kind(target: Any) -> str:
    """The kind of `target` whose strategies apply: the GPU API of a GPU target ("opencl", "vulkan", "cuda"),
    "cpu" for every other target (a Target or a target string)."""
    if isinstance(target, str):
        if not is_gpu_spec(target):
            return "cpu"
        target = as_target(target)
    gpu = getattr(target, "gpu", None)
    return gpu.api if gpu is not None else "cpu"


@dataclass(frozen=True)
class OpDef:
    name: str
    pattern: str
    infer: Callable[..., List[TensorType]]
    ref: Callable[..., List[np.ndarray]]


@dataclass(frozen=True)
class TeLowering:
    """``lower(attrs, *te_inputs) -> te.Tensor``: the op as a te compute; its kernel's schedule is tunable."""

    lower: Callable[..., Any]
    lowering = "te"
    tunable = True


# build(node, types, target, name, compile_body) -> tir.PrimFunc; compile_body(node, types, target, name) compiles
# one node of a body the kernel runs inside (a Loop's), returning None for a node that is a view of its input
BodyCompiler = Callable[[Node, Dict[str, TensorType], Any, str], Any]


@dataclass(frozen=True)
class LoopKernel:
    """``build(node, types, target, name, compile_body) -> tir.PrimFunc``: the kernel written as loop IR (loops
    carrying state, or a hand-blocked reduction); it takes no schedule config."""

    build: Callable[..., Any]
    lowering = "loop_ir"
    tunable = False


@dataclass(frozen=True)
class DeviceNumpy:
    """No kernel: the device runs the op as numpy between kernels (graph JSON version 3, graph/numpy_nodes.py)."""

    lowering = "numpy"
    tunable = False


Strategy = Any     # TeLowering | LoopKernel | DeviceNumpy


@dataclass
class OpEntry:
    definition: OpDef
    strategies: Dict[str, Strategy]      # target kind -> strategy


class OpTable:
    """Graph op name -> OpEntry, filled once; a second definition or strategy raises ValueError."""

    def __init__(self) -> None:
        self._entries: Dict[str, OpEntry] = {}

    # ---- filling
    def define(self, definition: OpDef) -> None:
        if definition.name in self._entries:
            raise ValueError("graph op %r is defined twice" % definition.name)
        self._entries[definition.name] = OpEntry(definition, {})

    def define_all(self, definitions: Iterable[OpDef]) -> None:
        for d in definitions:
            self.define(d)

    def add_strategy(self, kind: str, op: str, strategy: Strategy) -> None:
        if kind not in TARGET_KINDS:
            raise ValueError("strategy for graph op %r: unknown target kind %r (expected one of %s)"
                             % (op, kind, ", ".join(TARGET_KINDS)))
        if op not in self._entries:
            raise ValueError("strategy for graph op %r, which has no definition" % op)
        strategies = self._entries[op].strategies
        if kind in strategies:
            raise ValueError("graph op %r has a second %s strategy" % (op, kind))
        strategies[kind] = strategy

    def add_strategies(self, kind: str, strategies: Mapping[str, Strategy]) -> None:
        for op, s in strategies.items():
            self.add_strategy(kind, op, s)

    # ---- reading
    def __getitem__(self, op: str) -> OpDef:
        return self._entries[op].definition

    def __contains__(self, op: object) -> bool:
        return op in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, op: str) -> OpEntry:
        return self._entries[op]

    def strategy(self, op: str, kind: str) -> Optional[Strategy]:
        entry = self._entries.get(op)
        return entry.strategies.get(kind) if entry is not None else None

    def infer(self, op: str, attrs: dict, in_types: Sequence[TensorType]) -> List[TensorType]:
        return self[op].infer(attrs, *in_types)

    def evaluate(self, op: str, attrs: dict, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        return [np.asarray(a, order="C") for a in self[op].ref(attrs, *arrays)]

    def pattern(self, op: str) -> str:
        return self[op].pattern

    def is_alias(self, node: Node) -> bool:
        """A single (unfused) node whose output reinterprets its input's bytes (pattern ``alias``: a reshape): it
        gets no kernel and no storage of its own."""
        return node.op != "fused" and self.pattern(node.op) == "alias"

    def run_nodes(self, nodes: List[Node], env: Dict[str, np.ndarray]) -> None:
        """Run `nodes` in order with their numpy definitions, reading and writing `env` (fused nodes run their
        body)."""
        for node in nodes:
            if node.op == "fused":
                inner = {name: env[src] for name, src in zip(node.body_params(), node.inputs)}
                self.run_nodes(node.body(), inner)
                for out, src in zip(node.outputs, node.attrs["results"]):
                    env[out] = inner[src]
                continue
            outs = self.evaluate(node.op, node.attrs, [env[i] for i in node.inputs])
            for name, value in zip(node.outputs, outs):
                env[name] = value


def kernel_shape(shape: Sequence[int]) -> Tuple[int, ...]:
    """Kernels never see rank-0 tensors: a scalar is passed as one element of shape (1,)."""
    return tuple(int(d) for d in shape) or (1,)
