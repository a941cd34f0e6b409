"""The ONNX graph a Keras model becomes, built node by node, and the layout of each value in it.

Keras tensors are channels-last (NHWC); ONNX's convolutions, pools and resizes are channels-first. Each value
therefore records how its ONNX tensor relates to the Keras tensor: ``cf`` False means the same axes, ``cf``
True means the Keras channel axis (the last) moved to position 1 (``channels_first_perm``). Layers that work
per element or per channel keep whatever layout their input has; convolution-like layers ask for channels-first;
layers that read the axes in Keras order (Flatten, Reshape, Dense...) ask for the Keras order. So a chain of
convolutions transposes once on the way in and once on the way out, and never in between.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
Shape = Optional[Tuple[Optional[int], ...]]


def channels_first_perm(rank: int) -> List[int]:
    """Keras (channels-last) axes -> channels-first: (0, rank-1, 1, ..., rank-2)."""
    return [0, rank - 1] + list(range(1, rank - 1))


def channels_last_perm(rank: int) -> List[int]:
    return [0] + list(range(2, rank)) + [1]


@dataclasses.dataclass(frozen=True)
class Value:
    """A Keras tensor in the ONNX graph: the ONNX value ``name``, the Keras rank, whether the ONNX tensor holds
    it channels-first, and its Keras shape when the file records it (None per unknown dimension)."""

    name: str
    rank: int
    cf: bool = False
    shape: Shape = None

    def onnx_axis(self, axis: int) -> int:
        """The ONNX axis holding Keras axis ``axis`` (negative counts from the end)."""
        axis = axis % self.rank
        return channels_first_perm(self.rank).index(axis) if self.cf else axis


class Builder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: List = []
        self.initializers: List = []
        self.inputs: List = []
        self.outputs: List = []
        self.names: Dict[str, int] = {}         # hint -> how many names it has given
        self.used: set = set()
        self._converted: Dict[Tuple[str, bool], str] = {}    # (value, cf) -> the value in the other layout

    def fresh(self, hint: str) -> str:
        hint = hint.replace(":", "_") or "v"
        n = self.names.get(hint, 0)
        name = hint if n == 0 else "%s_%d" % (hint, n)
        while name in self.used:
            n += 1
            name = "%s_%d" % (hint, n)
        self.names[hint] = n + 1
        self.used.add(name)
        return name

    def const(self, array: Union[np.ndarray, Sequence, float, int], hint: str = "const",
              dtype: Optional[type] = None) -> str:
        arr = np.asarray(array, dtype=dtype)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(arr.copy(order="C"), name))    # 0-d stays 0-d
        return name

    def ints(self, values: Sequence[int], hint: str = "shape") -> str:
        return self.const(np.asarray(list(values), np.int64), hint)

    def op(self, op_type: str, inputs: Sequence[str], hint: str, outputs: int = 1, domain: str = "",
           **attrs) -> Union[str, List[str]]:
        """Add one node; returns its output name (a list when ``outputs`` > 1)."""
        outs = [self.fresh("%s_%s" % (hint, op_type) if k == 0 else "%s_%s_%d" % (hint, op_type, k))
                for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(hint + "/" + op_type),
                                           domain=domain or None, **attrs))
        return outs[0] if outputs == 1 else outs

    # ---- layouts
    def transpose(self, name: str, perm: Sequence[int], hint: str) -> str:
        return self.op("Transpose", [name], hint, perm=list(perm))

    def keras_order(self, v: Value) -> str:
        """``v``'s ONNX value with the Keras axis order."""
        if not v.cf:
            return v.name
        key = (v.name, False)
        if key not in self._converted:
            self._converted[key] = self._unit_spatial(v, [0] + [1] * (v.rank - 2) + [-1], "_nhwc") or \
                self.transpose(v.name, channels_last_perm(v.rank), v.name + "_nhwc")
        return self._converted[key]

    def channels_first(self, v: Value) -> str:
        """``v``'s ONNX value with the channel axis at position 1."""
        if v.cf or v.rank < 3:
            return v.name
        key = (v.name, True)
        if key not in self._converted:
            self._converted[key] = self._unit_spatial(v, [0, -1] + [1] * (v.rank - 2), "_nchw") or \
                self.transpose(v.name, channels_first_perm(v.rank), v.name + "_nchw")
        return self._converted[key]

    def _unit_spatial(self, v: Value, target: List[int], suffix: str) -> Optional[str]:
        """With every spatial size 1 (a squeeze-and-excite vector), both layouts hold the same bytes: a Reshape
        instead of a Transpose."""
        if v.shape is None or any(d != 1 for d in v.shape[1:-1]):
            return None
        return self.op("Reshape", [v.name, self.ints(target, v.name + suffix)], v.name + suffix)

    def in_layout(self, v: Value, cf: bool) -> str:
        return self.channels_first(v) if cf else self.keras_order(v)

    def keras_const(self, v: Value, array: np.ndarray, hint: str) -> str:
        """A constant shaped for the Keras tensor's trailing axes (a per-channel vector, a per-position map),
        broadcastable against ``v`` in its ONNX layout."""
        arr = np.asarray(array, np.float32)
        if arr.ndim == 0:
            return self.const(arr, hint)
        arr = arr.reshape((1,) * (v.rank - arr.ndim) + arr.shape)
        if v.cf:
            arr = np.transpose(arr, channels_first_perm(v.rank))
        return self.const(arr, hint)

    # ---- the model
    def add_input(self, name: str, shape: Sequence[Optional[int]], dtype: int = TensorProto.FLOAT) -> str:
        name = self.fresh(name)
        # an unknown batch size is 1 (shape= fixes another); any other unknown dimension stays symbolic
        dims = [d if isinstance(d, int) and d >= 0 else 1 if k == 0 else "%s_d%d" % (name, k)
                for k, d in enumerate(shape)]
        self.inputs.append(helper.make_tensor_value_info(name, dtype, dims))
        return name

    def add_output(self, name: str) -> None:
        self.outputs.append(helper.make_empty_tensor_value_info(name))     # types follow from the graph

    def model(self, producer_version: str):
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="keras",
                                 producer_version=producer_version, ir_version=8)
