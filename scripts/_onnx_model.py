"""The model files the make_*.py scripts write: generated ONNX nodes wrapped into a checked model (opset 13, IR
version 8), and the command line that writes one."""
from __future__ import annotations

import argparse
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


def image_model_options(doc: str, output: str) -> argparse.ArgumentParser:
    """The options of a script that writes an ImageNet-shaped model: the file, the weights' seed, the input size."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("-o", "--output", default=output)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=224)
    return ap


def save_model(model, path: str) -> None:
    import onnx

    onnx.save(model, path)
    print("wrote %s: %d nodes, %d initializers" % (path, len(model.graph.node), len(model.graph.initializer)))
