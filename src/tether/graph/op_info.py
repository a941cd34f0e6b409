"""The graph layer's reading of the op table (``tether.kernels.table.OPS``): each graph op's shape rule, numpy
meaning and fusion pattern, as the passes, the reference interpreter and the frontends ask for them.

Patterns, from most to least fusable: ``elemwise`` (fusable as an epilogue into any producer), ``alias`` (a
reinterpretation of the same bytes, a reshape: no kernel at all), ``injective`` and ``complex`` (their own kernel;
``complex`` accepts elementwise epilogues), ``opaque`` (its own kernel, nothing fused) and ``numpy`` (run as numpy
on the device between kernels). The definitions themselves are in ``tether.kernels`` (``core`` and its siblings).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from tether.graph.ir import Node, TensorType
from tether.kernels.core import NUMPY_DYNAMIC, broadcast_shapes
from tether.kernels.table import OPS

__all__ = ["OPS", "broadcast_shapes", "infer", "evaluate", "pattern", "is_alias", "dynamic_outputs"]


def infer(op: str, attrs: dict, in_types: Sequence[TensorType]) -> List[TensorType]:
    return OPS.infer(op, attrs, in_types)


def evaluate(op: str, attrs: dict, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
    return OPS.evaluate(op, attrs, arrays)


def pattern(op: str) -> str:
    return OPS.pattern(op)


def is_alias(node: Node) -> bool:
    """A single (unfused) node whose output reinterprets its input's bytes (pattern ``alias``: a reshape): it gets
    no kernel and no storage of its own."""
    return OPS.is_alias(node)


def dynamic_outputs(op: str, dynamic_input: bool = False) -> Tuple[int, ...]:
    """The outputs of ``op`` whose shape is data-dependent; every output, for a numpy op reading such a value."""
    if OPS.pattern(op) != "numpy":
        return ()
    return tuple(range(8)) if dynamic_input else NUMPY_DYNAMIC.get(op, ())
