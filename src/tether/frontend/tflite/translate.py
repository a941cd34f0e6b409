"""A TFLite model -> an ONNX ModelProto, through the converter tables; and the op coverage table for ``--check``.

The main subgraph is translated op by op. An op no converter covers, or whose converter refuses it, is noted
and the walk goes on (ops fed by its outputs are skipped, not reported), so one UnsupportedOpError names every
op the model needs that tether lacks: op, version, node index and output tensor.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.tflite.converters import CONVERTERS
from tether.frontend.tflite.quantized_converters import QUANTIZED
from tether.frontend.tflite.flatbuffer import Model, Operator, Subgraph, read_model
from tether.frontend.tflite.state import Context, onnx_dtype
from tether.frontend.tflite.table import Converter

OPSET = 20                   # ONNX opset of the translated graph (Gelu is opset 20)
QUANTIZED_DTYPES = ("int8", "uint8", "int16", "int4")


def is_quantized(subgraph: Subgraph, index: int) -> bool:
    """Whether tensor ``index`` holds integers standing for reals (affine quantization)."""
    t = subgraph.tensors[index]
    return t.quantization is not None and t.dtype in QUANTIZED_DTYPES


def converter_for(subgraph: Subgraph, op: Operator) -> Tuple[Optional[Converter], str]:
    """The converter of ``op``, or (None, why not)."""
    quantized = any(is_quantized(subgraph, i) for i in list(op.inputs) + list(op.outputs) if i >= 0)
    key = op.custom_code if op.op == "CUSTOM" else op.op       # a custom op is keyed by its custom code
    if quantized and key in QUANTIZED:
        return QUANTIZED[key], ""
    if quantized and key in CONVERTERS:
        kinds = sorted({subgraph.tensors[i].dtype for i in list(op.inputs) + list(op.outputs)
                        if i >= 0 and is_quantized(subgraph, i)})
        return None, "quantized tensors (%s) are not supported yet" % ", ".join(kinds)
    if key in CONVERTERS:
        return CONVERTERS[key], ""
    return None, "custom op %r: no converter" % op.custom_code if op.op == "CUSTOM" else "no converter"


def _node_label(subgraph: Subgraph, op: Operator) -> str:
    out = subgraph.tensors[op.outputs[0]].name if op.outputs else ""
    return "%d:%s" % (op.index, out) if out else "%d" % op.index


def _io_names(model: Model, subgraph: Subgraph, names: str) -> Tuple[List[str], List[str]]:
    """Graph input and output names: the signature's when ``names`` is "signature" and the model's signature
    names every input and output of the main subgraph once, else the tensors' names (made unique)."""
    def by_tensor(indices):
        out, seen = [], set()
        for i in indices:
            name = subgraph.tensors[i].name or "t%d" % i
            while name in seen:
                name += "_"
            seen.add(name)
            out.append(name)
        return out

    ins, outs = by_tensor(subgraph.inputs), by_tensor(subgraph.outputs)
    if names == "signature":
        for sig in model.signatures:
            if sig.subgraph != 0:
                continue
            rin = {t: n for n, t in sig.inputs.items()}
            rout = {t: n for n, t in sig.outputs.items()}
            if set(rin) == set(subgraph.inputs) and set(rout) == set(subgraph.outputs) and \
                    len(set(rin.values()) | set(rout.values())) == len(rin) + len(rout):
                return [rin[i] for i in subgraph.inputs], [rout[i] for i in subgraph.outputs]
    elif names != "tensor":
        raise ValueError("names must be 'signature' or 'tensor', not %r" % names)
    return ins, outs


def _value_info(helper, name: str, dtype: str, shape: Optional[List[int]]):
    return helper.make_tensor_value_info(name, onnx_dtype(dtype), shape)


class _Walk:
    """One translation of the main subgraph, recording the ops it could not convert."""

    def __init__(self, model: Model, names: str = "signature") -> None:
        if not model.subgraphs:
            raise InvalidInput("%s is not a valid TFLite model: it has no subgraph" % model.path)
        self.model = model
        self.g = model.subgraphs[0]
        self.ctx = Context(self.g)
        self.ctx.model = model          # control-flow ops translate the subgraphs they name,
        self.ctx.converter_for = converter_for   # with the same tables (passed here: they include control flow)
        self.failures: List[Tuple[Operator, str]] = []
        self.in_names, self.out_names = _io_names(model, self.g, names)
        for n in self.in_names + self.out_names:
            self.ctx.reserve(n)

    def run(self) -> None:
        ctx, g = self.ctx, self.g
        for i, name in zip(g.inputs, self.in_names):
            ctx.set_output(i, name)
        poisoned = set()
        for op in g.operators:
            if any(i in poisoned for i in op.inputs if i >= 0):
                poisoned.update(op.outputs)
                continue
            fn, why = converter_for(g, op)
            if fn is None:
                self.failures.append((op, why))
                poisoned.update(op.outputs)
                continue
            ctx.op = op
            try:
                fn(ctx, op)
            except UnsupportedOpError as exc:
                self.failures.append((op, str(exc)))
                poisoned.update(op.outputs)
                continue
            except (ValueError, IndexError, KeyError, TypeError) as exc:
                # the op's tensors contradict it (ranks, shapes, missing inputs): a corrupt or inconsistent file
                raise InvalidInput("%s is not a consistent TFLite model: %s does not fit its tensors (%s)"
                                   % (self.model.path, ctx.where(), " ".join(str(exc).split()) or
                                      type(exc).__name__)) from None
            finally:
                ctx.op = None
            for t in op.outputs:
                if t >= 0 and not ctx.bound(t):
                    raise RuntimeError("converter of %s left output %d (%s) unbound"
                                       % (op.op, t, g.tensors[t].name))

    def error(self) -> Optional[str]:
        if not self.failures:
            return None
        groups: Dict[Tuple[str, int, str], List[str]] = {}
        for op, why in self.failures:
            groups.setdefault((op.op if op.op != "CUSTOM" else "CUSTOM %s" % op.custom_code, op.version, why),
                              []).append(_node_label(self.g, op))
        parts = []
        for (name, version, why), nodes in groups.items():
            listing = ", ".join(nodes[:6]) + (" ..." if len(nodes) > 6 else "")
            parts.append("%s v%d (node%s %s): %s" % (name, version, "" if len(nodes) == 1 else "s", listing, why))
        return "%s: %d TFLite op(s) not supported: %s" % (self.model.path, len(self.failures), "; ".join(parts))

    def onnx_model(self) -> Any:
        from onnx import helper

        ctx, g = self.ctx, self.g
        outputs = []
        used = set(self.in_names)
        for i, name in zip(g.outputs, self.out_names):
            value = ctx.nhwc(i)
            if ctx.produced(value) and value not in used:
                ctx.rename(value, name)
            else:           # a graph input, a constant, or a value another output already took
                ctx.nodes.append(helper.make_node("Identity", [value], [name], name=ctx.fresh("Identity_" + name)))
            used.add(name)
            t = g.tensors[i]
            # a dynamic dim (-1 in shape_signature) stays unnamed: the run-time shape decides it
            dims = [None if d < 0 else d for d in t.shape_signature] if t.shape_signature else list(t.shape)
            dtype = ctx.const(i).dtype.name if ctx.const(i) is not None else t.dtype
            outputs.append(_value_info(helper, name, dtype, dims))
        inputs = []
        for i, name in zip(g.inputs, self.in_names):
            t = g.tensors[i]
            inputs.append(_value_info(helper, name, t.dtype, list(t.shape)))
        graph = helper.make_graph(ctx.nodes, g.name or "tflite", inputs, outputs, ctx.initializers)
        domains = sorted({n.domain for n in ctx.nodes if n.domain not in ("", "ai.onnx")})
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in domains]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="tether.frontend.tflite")
        model.ir_version = 9
        return model


def _load(model: Union[str, Model]) -> Model:
    return read_model(str(model)) if not isinstance(model, Model) else model


def to_onnx(model: Union[str, Model], names: str = "signature") -> Any:
    """The TFLite model (a path or a read :class:`Model`) as an ONNX ModelProto: NHWC inputs and outputs as in
    the file, named by the model's signature (``names="signature"``, when it names them all) or by tensor names
    (``names="tensor"``). Raises UnsupportedOpError naming every op not covered, InvalidInput for a bad file."""
    walk = _Walk(_load(model), names)
    walk.run()
    err = walk.error()
    if err:
        raise UnsupportedOpError(err)
    return walk.onnx_model()


def op_coverage(model: Union[str, Model]) -> List[Dict[str, Any]]:
    """One row per (TFLite op, version): whether tether converts every node of it, and the nodes."""
    walk = _Walk(_load(model))
    walk.run()
    failed = {op.index for op, _ in walk.failures}
    rows: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for op in walk.g.operators:
        name = op.op if op.op != "CUSTOM" else op.custom_code or "CUSTOM"
        row = rows.setdefault((name, op.version), {"op_type": name, "domain": "TFLite", "opset": op.version,
                                                   "covered": True, "nodes": []})
        row["nodes"].append(_node_label(walk.g, op))
        if op.index in failed:
            row["covered"] = False
    return list(rows.values())

