"""TFLite -> ONNX: ``to_onnx(path)`` reads a ``.tflite`` flatbuffer without TensorFlow and translates its main
subgraph into an ONNX ModelProto, which ``from_onnx`` imports (``from_tflite`` does both).

Modules: ``flatbuffer`` (the file as plain objects: tensors, constant data, quantization, sparsity, operators
with their options keyed by schema.fbs names, signatures), ``state`` (the translation ``Context``), ``table``
(the converter table type), one module per op family (``nn``, ``elementwise``, ``tensor``, ``reduce``,
``resize``, ``weights``, ``pointwise``, ``indexing``, ``argmax``, ``accumulate``, ``spatial``, ``matmul``,
``conv3d``, ``detection``, ``recurrent``, ``segments``, ``control_flow``, ``mediapipe``, ``mediapipe_transforms``,
``spectral``, ``variables``) each with its own ``CONVERTERS``, ``converters`` (their merge: one converter per op),
the quantized families (``quantized``, ``quantized_arith``, ``quantized_products``) merged in
``quantized_converters``, and ``translate`` (the walk, the one-line error naming every unsupported op, the
``--check`` coverage rows).

Writing a converter: in a family module, ``CONVERTERS = table.ConverterTable("tflite <family>")`` and
``@CONVERTERS.register("OP_NAME") def conv(ctx, op)`` (a custom op: its custom code; ``op.custom_options_map()``
decodes its FlexBuffer options); name the module in ``converters.FAMILIES`` (ops on quantized tensors: a
``QUANTIZED`` table, ``quantized_converters.QUANTIZED_FAMILIES``). Here ``op`` is a
``flatbuffer.Operator`` (``op.inputs``/``op.outputs`` are tensor indices, -1 for an absent optional input;
``op.options`` holds the builtin options by schema.fbs field name, e.g. ``op.options["stride_w"]``;
``op.version``). Rank-4 activations are held NCHW inside the ONNX graph; TFLite's NHWC is converted only where
an op needs it. The ``Context`` API:

- ``ctx.nhwc(t)`` -> ONNX name of tensor ``t`` in TFLite's layout (a cached Transpose if it is held NCHW);
- ``ctx.nchw(t)`` -> a rank-4 tensor held NCHW (a cached Transpose, or a transposed constant);
- ``ctx.held(t)`` -> (name, layout) as held now, for layout-agnostic ops; ``ctx.layout(t)``: ``NCHW``/``NATIVE``;
- ``ctx.aligned([t1, t2...])`` -> (names, layout): broadcasting inputs in one common layout;
- ``state.nchw_axis(axis)`` -> the NCHW axis of an NHWC axis, for ops working on NCHW-held values
  (``state.NCHW``, ``state.NATIVE``, ``state.TO_NCHW``/``TO_NHWC`` are the layouts and permutations);
- ``ctx.const(t)`` -> numpy value (TFLite layout) of a constant or folded tensor, else None;
  ``ctx.int_list(t, what)`` -> a constant int input as a list (refuses a run-time one);
- ``ctx.tensor(t)`` (shape, dtype, quantization, name), ``ctx.shape(t)``, ``ctx.rank(t)``;
- ``ctx.emit1(op_type, inputs, **attrs)`` -> output name; ``ctx.emit(..., outputs=n, domain=...)`` -> names;
  ``ctx.add_const(array, hint)`` -> initializer name; ``ctx.transposed_const(t, perm)`` -> permuted weights;
- ``ctx.set_output(t, name, layout=NATIVE)`` binds an output (``NCHW`` for a rank-4 value held NCHW);
  ``ctx.set_const(t, array)`` binds a value folded now;
- ``ctx.variables``: the resource variables' values so far, by (container, shared_name) (``variables``);
- ``fused.apply_from(ctx, name)`` applies the op's ``fused_activation_function``;
- raise ``UnsupportedOpError("%s: why" % ctx.where())`` for a case not covered: the walk collects it, and
  one error names every op not covered. ``translate.is_quantized(subgraph, t)`` tells quantized tensors.

Graph inputs and outputs keep TFLite's layout (NHWC), dtypes and names (the signature's, else the tensors').
Float16 and sparse weights are folded to float32 constants; fused TANH/SIGN_BIT activations are ignored as
LiteRT ignores them.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from tether.frontend.tflite.flatbuffer import Model, read_model
from tether.frontend.tflite.translate import op_coverage, to_onnx


def from_tflite(model, shape: Optional[Mapping[str, Sequence[int]]] = None,
                names: str = "signature") -> Tuple[Any, Dict[str, Any]]:
    """Import a TFLite model (path or :class:`Model`) as ``(graph, params)``, like ``from_onnx``."""
    from tether.frontend.onnx import from_onnx

    return from_onnx(to_onnx(model, names=names), shape=shape)


def read_onnx(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    """The reader of :mod:`tether.frontend.readers`: the file as an ONNX ModelProto."""
    return to_onnx(path)


__all__ = ["Model", "from_tflite", "op_coverage", "read_model", "read_onnx", "to_onnx"]
