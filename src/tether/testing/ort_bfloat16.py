"""Run a model with bfloat16 inputs or outputs through onnxruntime, whose Python API cannot feed or fetch bfloat16
arrays ("No corresponding Numpy type for Tensor Type. bfloat16"): the model is wrapped so that each bfloat16 input
arrives as float32 and is Cast to bfloat16 inside, and each bfloat16 output is Cast to float32 inside and handed
back as ``ml_dtypes.bfloat16``. Both casts are exact, so the results are onnxruntime's own bfloat16 values.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional

import numpy as np

_SUFFIX = "__tether_f32"


def has_bfloat16_io(model: Any) -> bool:
    from onnx import TensorProto
    return any(vi.type.tensor_type.elem_type == TensorProto.BFLOAT16
               for vi in list(model.graph.input) + list(model.graph.output))


def wrap(model: Any) -> Any:
    """``model`` with float32 in place of its bfloat16 graph inputs and outputs (Casts inside)."""
    import onnx
    from onnx import TensorProto, helper

    wrapped = onnx.ModelProto()
    wrapped.CopyFrom(model)
    g = wrapped.graph
    inputs, outputs = list(g.input), list(g.output)
    nodes = list(g.node)
    del g.input[:], g.output[:], g.node[:]
    pre, post = [], []
    for vi in inputs:
        if vi.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                    for d in vi.type.tensor_type.shape.dim]
            g.input.append(helper.make_tensor_value_info(vi.name + _SUFFIX, TensorProto.FLOAT, dims))
            pre.append(helper.make_node("Cast", [vi.name + _SUFFIX], [vi.name], to=TensorProto.BFLOAT16))
        else:
            g.input.append(vi)
    for vi in outputs:
        if vi.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            g.output.append(helper.make_tensor_value_info(vi.name + _SUFFIX, TensorProto.FLOAT, None))
            post.append(helper.make_node("Cast", [vi.name], [vi.name + _SUFFIX], to=TensorProto.FLOAT))
        else:
            g.output.append(vi)
    g.node.extend(pre + nodes + post)
    return wrapped


class Session:
    """An onnxruntime session over ``model`` that takes and returns bfloat16 (ml_dtypes) arrays."""

    def __init__(self, model: Any, options: Optional[Any] = None) -> None:
        import onnxruntime as ort
        from onnx import TensorProto

        self._bf16_in = {vi.name for vi in model.graph.input if vi.type.tensor_type.elem_type == TensorProto.BFLOAT16}
        self._bf16_out = [vi.type.tensor_type.elem_type == TensorProto.BFLOAT16 for vi in model.graph.output]
        self._sess = ort.InferenceSession(wrap(model).SerializeToString(), options,
                                          providers=["CPUExecutionProvider"])

    def run(self, output_names: None, feeds: Mapping[str, np.ndarray]) -> List[np.ndarray]:
        import ml_dtypes

        if output_names is not None:
            raise ValueError("this session returns every output (output_names must be None)")
        ort_feeds = {}
        for name, value in feeds.items():
            if name in self._bf16_in:
                ort_feeds[name + _SUFFIX] = np.asarray(value).astype(np.float32)
            else:
                ort_feeds[name] = value
        outs = self._sess.run(None, ort_feeds)
        return [o.astype(ml_dtypes.bfloat16) if bf16 else o for o, bf16 in zip(outs, self._bf16_out)]
