"""An ONNX graph under construction, which knows the static shape of every tensor it holds.

The Core ML translators need shapes while they translate (a legacy layer works on the last three axes of
whatever rank it gets; a SAME pooling's pads depend on the input size), so each node's output types are inferred
by ONNX's own per-node shape inference as the node is added, with the values of the constants it reads.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

OPSET = 17
_SMALL_CONST = 1 << 12     # constants up to this many elements take part in shape inference as values


class OnnxGraph:
    """Nodes, initializers and the inferred type of every tensor name; ``node`` adds one and returns its outputs."""

    def __init__(self, name: str):
        from onnx import helper

        self.name = name
        self.nodes: List = []
        self.initializers: List = []
        self.inputs: List = []
        self.outputs: List = []
        self.types: Dict[str, object] = {}
        self.values: Dict[str, np.ndarray] = {}
        self._taken: Set[str] = set()
        self._count: Dict[str, int] = {}
        self._helper = helper

    # -- names and values ----------------------------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        """A tensor or node name not taken yet, ``hint`` itself when it is free."""
        hint = hint or "t"
        name = hint
        while name in self._taken:
            self._count[hint] = self._count.get(hint, 0) + 1
            name = "%s__%d" % (hint, self._count[hint])
        self._taken.add(name)
        return name

    def reserve(self, names: Sequence[str]) -> None:
        """Keep ``names`` (the model's own input and output names) from being handed out by :meth:`fresh`."""
        self._taken.update(names)

    def const(self, value, hint: str = "const", dtype=None) -> str:
        from onnx import numpy_helper

        arr = np.asarray(value, dtype=dtype) if dtype is not None else np.asarray(value)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        elif arr.dtype == np.int32 and dtype is None:
            arr = arr.astype(np.int64)
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.array(arr, order="C"), name))  # keeps 0-d 0-d
        self.values[name] = arr
        self.types[name] = self._helper.make_tensor_type_proto(
            self._helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))
        return name

    def ints(self, values: Sequence[int], hint: str = "ints") -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), hint)

    def add_input(self, name: str, elem_type: int, shape: Sequence[int]) -> str:
        vi = self._helper.make_tensor_value_info(name, elem_type, list(shape))
        self.inputs.append(vi)
        self.types[name] = vi.type
        self._taken.add(name)
        return name

    def add_output(self, name: str) -> None:
        t = self.types.get(name)
        if t is not None and t.HasField("tensor_type"):
            vi = self._helper.make_value_info(name, t)
        else:
            vi = self._helper.make_empty_tensor_value_info(name)
        self.outputs.append(vi)

    # -- shapes ----------------------------------------------------------------------------------------------

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        """The static shape of ``name``, or None when a dimension (or the rank) is not known."""
        t = self.types.get(name)
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        dims = []
        for d in t.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                return None
            dims.append(int(d.dim_value))
        return tuple(dims)

    def rank(self, name: str) -> Optional[int]:
        t = self.types.get(name)
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        return len(t.tensor_type.shape.dim)

    def elem_type(self, name: str) -> int:
        t = self.types.get(name)
        return t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else 0

    def value(self, name: str) -> Optional[np.ndarray]:
        return self.values.get(name)

    # -- nodes -----------------------------------------------------------------------------------------------

    def node(self, op: str, inputs: Sequence[str], hint: str = "", outputs: Union[int, Sequence[str]] = 1,
             domain: str = "", **attrs) -> Union[str, List[str]]:
        """Add ``op`` reading ``inputs`` ("" for an omitted optional input); returns its output name, or the list
        of names when ``outputs`` is a count above one or a list of names."""
        from onnx import defs, shape_inference

        if isinstance(outputs, int):
            names = [self.fresh(hint or op) for _ in range(outputs)]
        else:
            names = list(outputs)
            self._taken.update(names)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = self._helper.make_node(op, list(inputs), names, name=self.fresh("n_" + (hint or op)), domain=domain,
                                      **attrs)
        self.nodes.append(node)
        if not domain:
            try:
                schema = defs.get_schema(op, OPSET)
                types = {i: self.types[i] for i in inputs if i and i in self.types}
                data = {}
                from onnx import numpy_helper
                for i in inputs:
                    v = self.values.get(i)
                    if v is not None and v.size <= _SMALL_CONST:
                        data[i] = numpy_helper.from_array(v, i)
                out = shape_inference.infer_node_outputs(schema, node, types, data)
                for n, t in out.items():
                    self.types[n] = t
            except Exception:       # noqa: BLE001 - an unknown shape only limits later layers, which say so
                pass
        self._fold(node)
        return names[0] if isinstance(outputs, int) and outputs == 1 else names

    def _fold(self, node) -> None:
        """Record the value of a shape-only computation whose inputs are all known, so later layers can use it."""
        if node.op_type == "Shape":
            s = self.shape(node.input[0])
            if s is not None:
                self.values[node.output[0]] = np.asarray(s, dtype=np.int64)

    def model(self, producer: str = "tether.frontend.coreml"):
        g = self._helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        m = self._helper.make_model(g, opset_imports=[self._helper.make_opsetid("", OPSET)],
                                    producer_name=producer, ir_version=8)
        return m

    # -- small compositions used by both translators ------------------------------------------------------------

    def reshape(self, x: str, shape: Sequence[int], hint: str = "reshape") -> str:
        return self.node("Reshape", [x, self.ints(shape, hint + "_shape")], hint)

    def transpose(self, x: str, perm: Sequence[int], hint: str = "transpose") -> str:
        return self.node("Transpose", [x], hint, perm=list(perm))

    def unsqueeze(self, x: str, axes: Sequence[int], hint: str = "unsqueeze") -> str:
        return self.node("Unsqueeze", [x, self.ints(axes, hint + "_axes")], hint)

    def squeeze(self, x: str, axes: Sequence[int], hint: str = "squeeze") -> str:
        return self.node("Squeeze", [x, self.ints(axes, hint + "_axes")], hint)

    def scalar(self, v: float, hint: str = "scalar") -> str:
        return self.const(np.asarray(v, dtype=np.float32), hint)
