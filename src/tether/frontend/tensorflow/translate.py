"""The translator: TensorFlow nodes in, ONNX nodes out, one value per TensorFlow tensor.

Each value knows its ONNX name, its constant value when it has one (constants fold through the ops that take
them, so a weight computed from other weights becomes one initializer), its TensorFlow shape when it is known,
and its layout. TensorFlow works in NHWC; ONNX convolutions and pools in NCHW. A rank-4 value made by a
convolution or a pool stays in NCHW (``perm`` (0, 3, 1, 2): ONNX dim i is TensorFlow dim perm[i]); ops that do
not care about the layout (elementwise math, bias, batch norm, activations, padding and reductions with constant
axes) keep it, and an op that needs the TensorFlow layout asks for a view, which inserts one Transpose. So a
chain of convolutions has transposes only at its ends.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tether.errors import UnsupportedOpError
from tether.frontend.tensorflow.graph import TFNode
from tether.frontend.tensorflow.tensors import np_dtype

OPSET = 18
Perm = Optional[Tuple[int, ...]]
NCHW: Tuple[int, ...] = (0, 3, 1, 2)

ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
              np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int32): TensorProto.INT32,
              np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int16): TensorProto.INT16,
              np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8,
              np.dtype(np.uint16): TensorProto.UINT16, np.dtype(np.uint32): TensorProto.UINT32,
              np.dtype(np.uint64): TensorProto.UINT64, np.dtype(np.bool_): TensorProto.BOOL}


@dataclasses.dataclass
class Value:
    """A TensorFlow tensor in the ONNX graph being built."""

    name: Optional[str]                    # ONNX name (None: a constant not yet written as an initializer)
    const: Optional[np.ndarray] = None
    shape: Optional[Tuple[Optional[int], ...]] = None     # TensorFlow's shape (None: rank unknown)
    perm: Perm = None                      # None: stored in TensorFlow's layout
    dtype: Optional[np.dtype] = None
    # a SpaceToBatchND not yet computed: (input, block shape, paddings); a convolution consumes it as a dilation
    space_to_batch: Optional[Tuple["Value", List[int], List[List[int]]]] = None
    # a dilated convolution's result still to go through BatchToSpaceND: its block shape
    batch_to_space: Optional[List[int]] = None
    # a vector computed at run time whose elements are partly known (a shape made of a dynamic batch size and
    # constant dimensions): each element's value, or None
    elements: Optional[List[Optional[int]]] = None
    # a TensorList (the tensor arrays of a loop): its items, None where none was written yet
    items: Optional[List[Optional["Value"]]] = None

    @property
    def rank(self) -> Optional[int]:
        if self.const is not None:
            return self.const.ndim
        return None if self.shape is None else len(self.shape)


Converter = Callable[["Translator", TFNode, List[Value]], Sequence[Value]]


def inverse(perm: Sequence[int]) -> Tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


class Translator:
    def __init__(self) -> None:
        self.nodes: List[Any] = []
        self.initializers: List[Any] = []
        self._names: Dict[str, int] = {}
        self._views: Dict[Tuple[str, Perm], str] = {}
        self.node: Optional[TFNode] = None        # the TensorFlow node being translated (names its ONNX nodes)
        self.resources: Any = {}                   # variable node name -> its value (``.get``)

    # -- names and nodes -------------------------------------------------------------------------------------
    def reserve(self, name: str) -> None:
        """Keep ``name`` (a graph input or output) from being given to any other ONNX value."""
        self._names[name] = max(self._names.get(name, 0), 1)

    def unique(self, base: str) -> str:
        n = self._names.get(base, 0)
        name = base if n == 0 else "%s__%d" % (base, n)
        while n and name in self._names:
            n += 1
            name = "%s__%d" % (base, n)
        self._names[base] = n + 1
        self._names.setdefault(name, 1)
        return name

    def emit(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attrs: Any) -> List[str]:
        base = self.node.name if self.node is not None else op_type
        outs = [self.unique("%s/%s" % (base, op_type) if outputs == 1 else "%s/%s_%d" % (base, op_type, k))
                for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.unique(base + "/" + op_type),
                                           **attrs))
        return outs

    def emit1(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.emit(op_type, inputs, 1, **attrs)[0]

    # -- constants -------------------------------------------------------------------------------------------
    def constant(self, array: np.ndarray) -> Value:
        array = np.asarray(array)
        return Value(None, array, array.shape, None, array.dtype)

    def ints(self, values: Sequence[int]) -> str:
        """An int64 initializer (a shape, axes, pads...)."""
        return self.name(self.constant(np.asarray(values, dtype=np.int64)))

    def name(self, v: Value) -> str:
        """``v``'s ONNX name in whatever layout it is stored in."""
        if v.name is None:
            if v.items is not None:
                raise UnsupportedOpError("node %s: a TensorList reaches an op that reads tensors (tether translates "
                                         "TensorList ops between loops)" % (self.node.name if self.node else "?"))
            if v.space_to_batch is not None:
                raise UnsupportedOpError("node %s: it reads a SpaceToBatchND, which tether translates only as the "
                                         "input of a convolution (a dilated convolution)"
                                         % (self.node.name if self.node else "?"))
            if v.const.dtype == np.object_:
                raise UnsupportedOpError("node %s: a string tensor reaches an op tether computes"
                                         % (self.node.name if self.node else "?"))
            v.name = self.unique((self.node.name if self.node is not None else "const") + "/const")
            self.initializers.append(numpy_helper.from_array(np.array(v.const, order="C"), v.name))
        return v.name

    # -- layout ----------------------------------------------------------------------------------------------
    def view(self, v: Value, perm: Perm = None) -> str:
        """``v``'s ONNX name stored as ``np.transpose(tf_value, perm)`` (None: TensorFlow's own layout)."""
        if v.space_to_batch is not None or v.items is not None:
            return self.name(v)                    # refused there
        if v.const is not None:
            return self.name(v if perm is None else self.constant(np.transpose(v.const, perm)))
        if v.perm == perm:
            return self.name(v)
        n = len(v.perm if v.perm is not None else perm)
        have = v.perm if v.perm is not None else tuple(range(n))
        want = perm if perm is not None else tuple(range(n))
        inv = inverse(have)
        rel = tuple(inv[p] for p in want)
        if rel == tuple(range(n)):
            return self.name(v)
        key = (self.name(v), perm)
        if key not in self._views:
            self._views[key] = self.emit1("Transpose", [self.name(v)], perm=list(rel))
        return self._views[key]

    def tf(self, v: Value) -> str:
        """``v`` in TensorFlow's layout."""
        return self.view(v, None)

    def nchw(self, v: Value) -> str:
        return self.view(v, NCHW)

    @staticmethod
    def onnx_axis(v: Value, axis: int) -> int:
        """Where TensorFlow axis ``axis`` of ``v`` lies in its stored layout."""
        if v.perm is None:
            return axis
        return v.perm.index(axis % len(v.perm))

    def out(self, name: str, like: Optional[Value] = None, shape: Optional[Tuple] = None, perm: Perm = None,
            dtype: Optional[np.dtype] = None) -> Value:
        return Value(name, None, shape if shape is not None else (like.shape if like is not None else None),
                     perm, dtype if dtype is not None else (like.dtype if like is not None else None))


def node_dtype(node: TFNode, attr: str = "T") -> Optional[np.dtype]:
    dt = node.attr(attr)
    if dt is None:
        return None
    return np_dtype(dt, "node %s (%s)" % (node.name, node.op))


def require_const(node: TFNode, v: Value, what: str) -> np.ndarray:
    if v.const is None:
        raise UnsupportedOpError("node %s (%s): its %s must be a constant (it is computed at run time; if it "
                                 "comes from the input's size, give the input shapes: shape={name: [...]})"
                                 % (node.name, node.op, what))
    return v.const
