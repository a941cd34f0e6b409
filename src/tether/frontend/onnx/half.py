"""float16 and bfloat16 models: the half type is stored, float32 is computed.

bfloat16 goes the same way as float16 below ("float16" stands for either): its casts to and from float32 round as
onnxruntime's do (to nearest even), and a node that only moves values (Transpose, Concat, Gather, ...) is exact
through float32, since every bfloat16 value is a float32 value.

An ONNX node that reads float16 tensors is converted as the same node on float32: its float16 inputs are cast to
float32 first (exact), the node's own converter runs unchanged, and each float32 result the model declares as
float16 is cast back (rounded to nearest even). onnxruntime's CPU provider does the same for most ops (it inserts
casts around the float16 nodes it has no kernel for, and its native float16 kernels accumulate in float32), so
results agree up to the accumulation order. The casts are elementwise, so the graph passes fuse them into the
kernels around them: a kernel loads float16, computes in float32 and rounds once when it stores; a float16 result
that only feeds further computing nodes is not rounded in between (see ``_twins``).

``Cast``/``CastLike`` convert between float16 and the other types themselves, and a node that only passes values
through unchanged (``Identity``, ``Shape``, ``Size``) needs no float32 detour.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ONNX_DTYPES, Importer

HALF = "float16"
HALF_TYPES = ("float16", "bfloat16")
# ops that take float16 as it is: their converters move or describe values without computing with them
NATIVE = frozenset({"Cast", "CastLike", "Identity", "Shape", "Size"})


def declared_types(model) -> Dict[str, str]:
    """Element type of every value ONNX shape inference can type (graph outputs, value_info), by name."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:   # noqa: BLE001 - inference is a hint here; without it float32 results map back to float16
        inferred = model
    types: Dict[str, str] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        elem = vi.type.tensor_type.elem_type
        if elem in ONNX_DTYPES:
            types[vi.name] = ONNX_DTYPES[elem]
    return types


def _twins(im: Importer) -> Dict[str, str]:
    """float16 value -> the float32 value it was rounded from, for the nodes that compute on it next: between
    two computing nodes a result stays float32 (rounded once, where the model stores or outputs it), as in
    onnxruntime, whose cast insertion drops the Cast pairs between consecutive float16 nodes it runs in float32.
    The float16 copy is still made, for graph outputs and the nodes that take float16 as it is; dead-code
    elimination drops it when nothing reads it."""
    if not hasattr(im, "half_twins"):
        im.half_twins = {}
    return im.half_twins


class DeclaredTypes:
    """``declared_types(model)``, computed once and only when a float16 node needs it (shape inference over a
    whole model is not free)."""

    def __init__(self, model) -> None:
        self._model = model
        self._types: Optional[Dict[str, str]] = None

    def get(self) -> Dict[str, str]:
        if self._types is None:
            self._types = declared_types(self._model)
        return self._types


def reads_half(im: Importer, ins: List[str]) -> bool:
    return any(x and x in im.types and str(im.types[x].dtype) in HALF_TYPES for x in ins)


def convert_in_float32(im: Importer, node, ins: List[str], attrs: dict, convert: Callable,
                       declared: Dict[str, str]) -> None:
    """Run ``convert`` (the node's converter) on float32 copies of its float16 inputs; cast its float32 results
    back to float16 where the model declares float16 (or, undeclared, where the node read float16)."""
    import onnx

    twins = _twins(im)
    f32_ins = []
    half = HALF
    for x in ins:
        if x and str(im.type(x).dtype) in HALF_TYPES:
            half = str(im.type(x).dtype)
            x = twins.get(x) or im.emit("cast", [x], {"to": "float32"}, node.name + "_to_f32")
        f32_ins.append(x)
    shadow = onnx.NodeProto()
    shadow.CopyFrom(node)
    temps: List[Optional[str]] = []
    del shadow.output[:]
    for o in node.output:
        t = im.fresh((o or "unused") + "_f32") if o else ""
        shadow.output.append(t)
        temps.append(t or None)
    del shadow.input[:]
    shadow.input.extend(f32_ins)
    try:
        convert(im, shadow, f32_ins, attrs)
    except UnsupportedOpError as exc:
        raise UnsupportedOpError("%s (the node reads %s, which tether converts as float32)" % (exc, half)) from None
    for o, t in zip(node.output, temps):
        if not o or t is None or t not in im.types:
            continue
        dt = str(im.types[t].dtype)
        want = declared.get(o, half if dt == "float32" else dt)
        if t in im.dynamic:
            # a data-dependent result (Compress, Unique, ... of float16): no kernel can cast it, a numpy node can
            to = want if dt == "float32" and want in HALF_TYPES else dt
            im.emit("dyn_cast", [t], {"from": dt, "to": to}, node.name + "_to_" + to, [o])
        elif dt == "float32" and want in HALF_TYPES:
            im.emit("cast", [t], {"to": want}, node.name + "_to_" + want, [o])
            twins[o] = t
        elif t in im.consts:
            im.add_const(im.consts[t], name=o)
        else:
            im.emit("reshape", [t], {"shape": im.type(t).shape}, node.name + "_out", [o])


def pass_through(im: Importer, node, ins: List[str]) -> None:
    """After a Cast/CastLike/Identity from float16 to float16 (a no-op, which onnxruntime's optimizer removes):
    its output has the float32 twin its input had, so the next computing node does not see an extra rounding."""
    twins = _twins(im)
    if node.op_type in ("Cast", "CastLike", "Identity") and ins and ins[0] in twins and node.output \
            and node.output[0] in im.types and str(im.types[node.output[0]].dtype) in HALF_TYPES \
            and im.types[node.output[0]].dtype == im.types[ins[0]].dtype:
        twins[node.output[0]] = twins[ins[0]]
