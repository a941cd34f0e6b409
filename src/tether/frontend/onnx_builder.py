"""A small ONNX graph writer for the translating frontends (Darknet, Caffe): nodes, weights and inputs go in one
by one under unique names, and ``model()`` returns the ModelProto that :func:`tether.frontend.from_onnx` reads.

Translators think in layers, not in ONNX value names: ``node`` returns the output name(s) it made, ``const``
returns the name of a new initializer, so a layer is a few calls chained by the names they return.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Set, Union

import numpy as np

OPSET = 17


class OnnxBuilder:
    """Collects one ONNX graph; every value name it hands out is unique within it."""

    def __init__(self, graph_name: str, producer: str) -> None:
        self.graph_name = graph_name
        self.producer = producer
        self.nodes: List[Any] = []
        self.initializers: List[Any] = []
        self.inputs: List[Any] = []
        self.outputs: List[Any] = []
        self._names: Set[str] = set()

    def unique(self, hint: str) -> str:
        """``hint`` itself if no value has that name yet, else ``hint_1``, ``hint_2``..."""
        name, i = hint, 0
        while name in self._names:
            i += 1
            name = "%s_%d" % (hint, i)
        self._names.add(name)
        return name

    def input(self, name: str, shape: Sequence[Optional[int]], dtype: Any = np.float32) -> str:
        from onnx import helper

        name = self.unique(name)
        self.inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                         list(shape)))
        return name

    def const(self, hint: str, value: Any, dtype: Any = None) -> str:
        from onnx import numpy_helper

        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        name = self.unique(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def ints(self, hint: str, values: Sequence[int]) -> str:
        """An int64 vector initializer (shapes, axes, pads of the ops that take them as inputs)."""
        return self.const(hint, np.asarray(list(values), dtype=np.int64))

    def node(self, op_type: str, inputs: Sequence[str], name: str, outputs: int = 1, domain: str = "",
             **attrs: Any) -> Union[str, List[str]]:
        """Append an ``op_type`` node named after ``name``; returns its output name (a list when ``outputs`` > 1).
        An empty input name stands for an omitted optional input."""
        from onnx import helper

        node_name = self.unique(name)
        outs = [node_name] + [self.unique("%s:%d" % (node_name, i)) for i in range(1, outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, domain=domain or None,
                                           **{k: v for k, v in attrs.items() if v is not None}))
        return outs[0] if outputs == 1 else outs

    def output(self, value: str, name: Optional[str] = None) -> str:
        """Declare ``value`` a graph output (through an Identity named ``name`` when given and different)."""
        from onnx import TensorProto, helper

        if name is not None and name != value:
            value = self.node("Identity", [value], name)
        self.outputs.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, None))
        return value

    def model(self, doc: str = "") -> Any:
        from onnx import helper

        graph = helper.make_graph(self.nodes, self.graph_name, self.inputs, self.outputs, self.initializers,
                                  doc_string=doc or None)
        return helper.make_model(graph, producer_name=self.producer, opset_imports=[helper.make_opsetid("", OPSET)])

