"""Wraps generated ONNX nodes into the checked model the make_*.py scripts write (opset 13, IR version 8)."""
from __future__ import annotations

from typing import Sequence, Tuple


def checked_model(name: str, nodes: list, initializers: list, input: Tuple[str, Sequence], output: Tuple[str, Sequence],
                  producer: str):
    """A one-input, one-output float32 model; ``input``/``output`` are (name, shape), a shape may name its dims."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(input[0], TensorProto.FLOAT, input[1])],
                              [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                              producer_name=producer)
    onnx.checker.check_model(model)
    return model
