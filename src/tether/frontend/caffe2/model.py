"""A Caffe2 model (predict_net.pb, the ops, and init_net.pb, the ops that fill the trained weights) as an ONNX
ModelProto, and its op coverage.

The user names either file; the other is beside it with "predict" and "init" swapped in its name. The graph's
inputs are the predict net's external inputs that the init net does not fill (4-D, NCHW, of unknown size unless
``shape`` gives it: Caffe2 files hold no input shapes); its outputs are the external outputs (or, when the net
declares none, the blobs no later op reads).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.caffe2.ops import FILLS, OPS, Args, Translator
from tether.frontend.caffe2.proto import messages

FORMAT = "Caffe2"


def parse_net(path: str) -> Any:
    from google.protobuf.message import DecodeError

    net = messages()["NetDef"]()
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        net.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput("%s is not a valid Caffe2 net: its NetDef protobuf does not parse (%s), so it is "
                           "truncated or not Caffe2" % (path, " ".join(str(exc).split()) or type(exc).__name__)) \
            from None
    if not net.op:
        raise InvalidInput("%s is not a valid Caffe2 net: its NetDef has no ops" % path)
    return net


def _is_init_net(net: Any) -> bool:
    return all(op.type in FILLS or op.type.endswith("Fill") for op in net.op)


def companions(path: str, need_init: bool = True) -> Tuple[str, Optional[str]]:
    """(predict net, init net) for the file the user named."""
    folder, name = os.path.split(path)
    if _is_init_net(parse_net(path)):
        other = os.path.join(folder, name.replace("init", "predict"))
        if other == path or not os.path.isfile(other):
            raise InvalidInput("%s is a Caffe2 init net (weights only): expected its predict net %s beside it"
                               % (path, other))
        return other, path
    other = os.path.join(folder, name.replace("predict", "init"))
    if other != path and os.path.isfile(other):
        return path, other
    if need_init:
        raise InvalidInput("%s is a Caffe2 predict net, but its weights are missing: expected the init net %s "
                           "beside it" % (path, other if other != path else "init_net.pb"))
    return path, None


def read_weights(path: str) -> Tuple[Dict[str, np.ndarray], List[str]]:
    """The blobs an init net fills with given values, and the fill ops it has that give none (random ones)."""
    weights: Dict[str, np.ndarray] = {}
    other: List[str] = []
    for op in parse_net(path).op:
        a = Args(op)
        shape = a.ints("shape") or []
        if op.type == "ConstantFill":
            value = a.f("value", 0.0) if "value" in a else 0.0
            weights[op.output[0]] = np.full(shape, value, np.float32)
        elif op.type in FILLS:
            dtype = FILLS[op.type]
            values = a.ints("values") if np.issubdtype(dtype, np.integer) or dtype is np.bool_ else None
            if values is None:
                values = list(next((x.floats for x in op.arg if x.name == "values"), []))
            arr = np.asarray(values, dtype)
            if int(np.prod(shape)) != arr.size:
                raise InvalidInput("%s: %s of %r has %d values for shape %s" % (path, op.type, op.output[0],
                                                                             arr.size, shape))
            weights[op.output[0]] = arr.reshape(shape).astype(np.float32 if dtype is np.float64 else dtype)
        else:
            other.append("%s (%s)" % (op.type, op.output[0] if op.output else "?"))
    return weights, other


def translate(predict_path: str, init_path: Optional[str],
              shape: Optional[Mapping[str, Sequence[int]]] = None) -> Translator:
    net = parse_net(predict_path)
    weights, fills = read_weights(init_path) if init_path else ({}, [])
    if fills:
        raise InvalidInput("%s fills %s with random values, expected trained values (GivenTensorFill)"
                           % (init_path, ", ".join(fills[:4])))
    t = Translator(net.name or "caffe2", predict_path, weights)
    values: Dict[str, Optional[Tuple[str, int]]] = {}
    consts: Dict[str, str] = {}
    read_after: Dict[str, int] = {}          # blob -> index of the last op reading it
    written: "OrderedDict[str, int]" = OrderedDict()
    shape = dict(shape or {})
    for name in net.external_input:
        if name not in weights and (init_path or name in shape or not _looks_like_weight(net, name)):
            dims = list(shape.get(name, ("N", "C", "H", "W")))
            values[name] = (t.b.input(name, dims), len(dims))
    for i, op in enumerate(net.op):
        label = op.name or "%s_%d" % (op.type, i)
        ins: List[Optional[Tuple[str, int]]] = []
        for blob in op.input:
            read_after[blob] = i
            if blob in values:
                ins.append(values[blob])
            elif blob in weights:
                if blob not in consts:
                    consts[blob] = t.b.const(blob, weights[blob])
                ins.append((consts[blob], weights[blob].ndim))
            elif not init_path:                  # coverage without the init net: a stand-in weight
                ins.append((t.b.const(blob, np.zeros((1, 1, 1, 1), np.float32)), 4))
            else:
                raise InvalidInput("%s: op %s reads blob %r, which neither an earlier op nor %s gives"
                                   % (predict_path, label, blob, os.path.basename(init_path)))
        fn = OPS.get(op.type)
        outs = None
        if fn is None:
            t.refuse(op, label)
        elif all(v is not None for v in ins):
            outs = fn(t, op, label, Args(op), ins)
        for k, blob in enumerate(op.output):
            values[blob] = outs[k] if outs is not None and k < len(outs) else None
            written[blob] = i
            written.move_to_end(blob)
    outputs = list(net.external_output) or [b for b, i in written.items() if read_after.get(b, -1) <= i]
    for blob in outputs:
        if blob not in values:
            raise InvalidInput("%s: external output %r is written by no op" % (predict_path, blob))
        if values[blob] is not None:
            t.b.output(values[blob][0], blob)
    return t


def _looks_like_weight(net: Any, name: str) -> bool:
    """Without an init net, an external input that is an op's second or later input is taken for a weight."""
    return any(name in list(op.input)[1:] for op in net.op) and not any(name == op.input[0] for op in net.op
                                                                         if op.input)


def _refusal_text(path: str, t: Translator) -> str:
    items = ["%s (op %s, caffe2.OperatorDef%s)" % (op, label, ": " + why if why else "") for op, label, why in
             t.refused]
    return "%s: %d Caffe2 op(s) tether does not cover: %s" % (path, len(items), "; ".join(items))


def to_onnx(predict_path: str, init_path: Optional[str] = None,
            shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    """The Caffe2 model as an ONNX ModelProto; either file may be named first."""
    if init_path is None:
        predict_path, init_path = companions(predict_path)
    t = translate(predict_path, init_path, shape)
    if t.refused:
        raise UnsupportedOpError(_refusal_text(predict_path, t))
    return t.b.model()


def read_model(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    """The reader :mod:`tether.frontend.readers` calls; the file pair holds no input shapes: ``shape`` gives them."""
    return to_onnx(*companions(path), shape=shape)


def op_coverage(path: str) -> List[Dict[str, Any]]:
    predict, init = companions(path, need_init=False)
    t = translate(predict, init)
    refused = {label for _, label, _ in t.refused}
    rows: "OrderedDict[str, Dict[str, Any]]" = OrderedDict()
    for i, op in enumerate(parse_net(predict).op):
        label = op.name or "%s_%d" % (op.type, i)
        r = rows.setdefault(op.type, {"op_type": op.type, "domain": FORMAT, "opset": "", "covered": True,
                                      "nodes": []})
        r["covered"] = r["covered"] and op.type in OPS and label not in refused
        r["nodes"].append(label)
    return list(rows.values())


def from_caffe2(predict_net_path: str, init_net_path: Optional[str] = None,
                shape: Optional[Mapping[str, Sequence[int]]] = None):
    """(graph, params) of a Caffe2 model; ``shape`` gives the input shapes (the files hold none)."""
    from tether.frontend.onnx import from_onnx

    return from_onnx(to_onnx(predict_net_path, init_net_path, shape), shape=shape)
