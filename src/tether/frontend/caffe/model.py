"""A Caffe model (a .prototxt net and the .caffemodel of its weights) as an ONNX ModelProto, and its coverage.

The user names either file. A .prototxt takes its weights from the .caffemodel with the same stem beside it; a
.caffemodel carries its net too, but a .prototxt of the same stem beside it is the net when present (trained
snapshots often have data layers where a deploy net has an Input). Weights go to layers by name, as Caffe's
CopyTrainedLayersFrom does. Layers the TEST phase excludes are left out. The graph's inputs are the net's input
blobs; its outputs are the blobs no later layer reads, named as in the net.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.caffe.layers import LAYERS, V1_TYPES, Translator, blob_array, blobs_needed
from tether.frontend.caffe.proto import messages

FORMAT = "Caffe"
TEST = 1
_DATA_LAYERS = {"Data", "ImageData", "MemoryData", "HDF5Data", "DummyData", "WindowData", "AnnotatedData",
                "Python", "VideoData"}


class Layer:
    """A LayerParameter or a V1LayerParameter seen alike: type as a string, parameters by their field names."""

    def __init__(self, msg: Any, v1: bool) -> None:
        self.msg = msg
        self.v1 = v1
        if v1:
            enum = msg.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_number.get(msg.type)
            self.type = V1_TYPES.get(enum.name, enum.name) if enum is not None else "V1 type %d" % msg.type
        else:
            self.type = msg.type
        self.name = msg.name or "(unnamed %s)" % self.type

    def __getattr__(self, item: str) -> Any:
        return getattr(self.msg, item)


def _is_text(path: str) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 4
    return True


def parse_prototxt(path: str) -> Any:
    from google.protobuf import text_format

    net = messages()["NetParameter"]()
    try:
        with open(path, "rb") as fh:
            text_format.Parse(fh.read().decode("utf-8"), net, allow_unknown_field=True)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise InvalidInput("%s is not a valid Caffe .prototxt: %s" % (path, " ".join(str(exc).split()))) from None
    return net


def parse_caffemodel(path: str) -> Any:
    from google.protobuf.message import DecodeError

    net = messages()["NetParameter"]()
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        net.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput("%s is not a valid .caffemodel: its NetParameter protobuf does not parse (%s), so it is "
                           "truncated or not Caffe" % (path, " ".join(str(exc).split()) or type(exc).__name__)) \
            from None
    if not net.layer and not net.layers:
        raise InvalidInput("%s is not a valid .caffemodel: its NetParameter has no layers" % path)
    return net


def companions(path: str, need_weights: bool = True) -> Tuple[Optional[str], Optional[str]]:
    """(prototxt, caffemodel) for the file the user named; either may be None (a .caffemodel alone; a
    .prototxt without weights when ``need_weights`` is false)."""
    stem = os.path.splitext(path)[0]
    if _is_text(path):
        weights = stem + ".caffemodel"
        if os.path.isfile(weights):
            return path, weights
        if need_weights:
            raise InvalidInput("%s is a Caffe .prototxt, but its weights %s are missing: expected the .caffemodel "
                               "beside it with the same name" % (path, weights))
        return path, None
    proto = stem + ".prototxt"
    return (proto if os.path.isfile(proto) and proto != path else None), path


def _layers(net: Any) -> List[Layer]:
    return [Layer(m, False) for m in net.layer] + [Layer(m, True) for m in net.layers]


def _in_test_phase(layer: Layer) -> bool:
    def matches(rule) -> bool:
        return not rule.HasField("phase") or rule.phase == TEST
    if layer.msg.include:
        return any(matches(r) for r in layer.msg.include)
    return not any(matches(r) for r in layer.msg.exclude)


def _net_inputs(net: Any) -> List[Tuple[str, Tuple[int, ...]]]:
    """The deprecated NetParameter input fields: names with input_shape, or 4 input_dim values each."""
    out = []
    for i, name in enumerate(net.input):
        if i < len(net.input_shape):
            out.append((name, tuple(int(d) for d in net.input_shape[i].dim)))
        elif len(net.input_dim) >= 4 * (i + 1):
            out.append((name, tuple(int(d) for d in net.input_dim[4 * i:4 * i + 4])))
        else:
            out.append((name, ()))
    return out


def translate(proto_path: Optional[str], model_path: Optional[str]) -> Translator:
    """Every layer as ONNX nodes; what is not covered is collected in ``refused``. Without ``model_path`` the
    weights are zeros of the shapes the layers need (enough to check coverage)."""
    weights_net = parse_caffemodel(model_path) if model_path else None
    net = parse_prototxt(proto_path) if proto_path else weights_net
    path = proto_path or model_path
    trained: Dict[str, List[Any]] = {}
    if weights_net is not None:
        for layer in _layers(weights_net):
            if layer.msg.blobs:
                trained[layer.msg.name] = list(layer.msg.blobs)
    t = Translator(net.name or os.path.splitext(os.path.basename(path))[0], path)
    blobs: Dict[str, Optional[Tuple[str, Tuple[int, ...]]]] = {}
    version: Dict[str, int] = {}            # blob name -> how many times it has been written (in-place layers)
    consumed = set()
    produced: List[Tuple[str, int]] = []

    def define(name: str, value: Optional[Tuple[str, Tuple[int, ...]]]) -> None:
        blobs[name] = value
        version[name] = version.get(name, 0) + 1
        produced.append((name, version[name]))

    for name, shape in _net_inputs(net):
        if not shape:
            raise InvalidInput("%s: input %r has no shape (input_shape or input_dim)" % (path, name))
        define(name, (t.b.input(name, shape), shape))
    for layer in _layers(net):
        if not _in_test_phase(layer):
            continue
        if layer.v1:
            t.v1_layers.add(layer.name)
        if layer.type == "Input":
            shapes = [tuple(int(d) for d in s.dim) for s in layer.msg.input_param.shape]
            for i, top in enumerate(layer.msg.top):
                shape = shapes[i] if i < len(shapes) else shapes[0] if shapes else ()
                if not shape:
                    raise InvalidInput("%s: Input layer %r gives %r no shape" % (path, layer.name, top))
                define(top, (t.b.input(top, shape), shape))
            continue
        missing = [b for b in layer.msg.bottom if b not in blobs]
        if missing:
            raise InvalidInput("%s: layer %r reads blob %r, which no layer before it writes"
                               % (path, layer.name, missing[0]))
        ins = [blobs[b] for b in layer.msg.bottom]
        for b in layer.msg.bottom:
            consumed.add((b, version[b]))
        fn = LAYERS.get(layer.type)
        outs = None
        if fn is None:
            why = "a data layer; a deploy net starts with an Input layer" if layer.type in _DATA_LAYERS else ""
            t.refuse(layer, why)
        elif all(v is not None for v in ins):
            layer_blobs = trained.get(layer.msg.name, list(layer.msg.blobs))
            arrays = [blob_array(b) for b in layer_blobs]
            if len(arrays) < blobs_needed(layer):
                if model_path:
                    raise InvalidInput("%s: layer %r (%s) has %d weight blob(s), expected %d"
                                       % (model_path, layer.name, layer.type, len(arrays), blobs_needed(layer)))
                arrays = _zeros_for(layer, ins)
            outs = fn(t, layer, ins, arrays)
        tops = list(layer.msg.top)
        for i, top in enumerate(tops):
            define(top, outs[i] if outs is not None and i < len(outs) else None)
    # outputs: the last version of each blob that no layer read after it was written
    for name, ver in produced:
        if ver == version[name] and (name, ver) not in consumed and blobs[name] is not None:
            value = blobs[name][0]
            if value not in [i.name for i in t.b.inputs]:
                t.b.output(value, name)
    if not t.b.outputs and not t.refused:
        raise InvalidInput("%s has no layers after its inputs, expected a net that computes something" % path)
    return t


def _zeros_for(layer: Layer, ins: List[Tuple[str, Tuple[int, ...]]]) -> List[np.ndarray]:
    """Weights of the right shapes, all zero, for a net read without its .caffemodel (coverage only)."""
    shape = ins[0][1] if ins else ()
    c = shape[1] if len(shape) > 1 else 1
    if layer.type in ("Convolution", "Deconvolution"):
        p = layer.convolution_param
        k = [int(v) for v in p.kernel_size] or [p.kernel_h or 1, p.kernel_w or 1]
        kh, kw = (k[0], k[-1])
        if layer.type == "Convolution":
            w = np.zeros((p.num_output, max(1, c // max(1, p.group)), kh, kw), np.float32)
        else:
            w = np.zeros((c, max(1, p.num_output // max(1, p.group)), kh, kw), np.float32)
        return [w, np.zeros(p.num_output, np.float32)]
    if layer.type == "InnerProduct":
        p = layer.inner_product_param
        k = int(np.prod(shape[p.axis % max(1, len(shape)):])) if shape else 1
        return [np.zeros((p.num_output, k), np.float32), np.zeros(p.num_output, np.float32)]
    if layer.type == "BatchNorm":
        return [np.zeros(c, np.float32), np.ones(c, np.float32), np.ones(1, np.float32)]
    return [np.ones(c, np.float32), np.zeros(c, np.float32)]


def _refusal_text(path: str, t: Translator) -> str:
    items = ["%s (layer %r, %s%s)" % (op, name, "caffe.V1LayerParameter" if name in t.v1_layers else
                                      "caffe.LayerParameter", ": " + why if why else "") for op, name, why in t.refused]
    return "%s: %d Caffe layer(s) tether does not cover: %s" % (path, len(items), "; ".join(items))


def to_onnx(prototxt_path: Optional[str], caffemodel_path: Optional[str] = None) -> Any:
    """The Caffe model as an ONNX ModelProto. ``prototxt_path`` may be a .caffemodel (then the net is in it, or in
    the .prototxt of the same stem beside it); ``caffemodel_path`` defaults to the one beside the .prototxt."""
    if caffemodel_path is None:
        prototxt_path, caffemodel_path = companions(prototxt_path)
    t = translate(prototxt_path, caffemodel_path)
    if t.refused:
        raise UnsupportedOpError(_refusal_text(prototxt_path or caffemodel_path, t))
    return t.b.model()


def read_model(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    """The reader :mod:`tether.frontend.readers` calls for both Caffe formats."""
    return to_onnx(*companions(path))


def op_coverage(path: str) -> List[Dict[str, Any]]:
    """One row per layer type of the net (the TEST phase's layers): covered or not, with the layers' names."""
    proto, weights = companions(path, need_weights=False)
    t = translate(proto, weights)
    net = parse_prototxt(proto) if proto else parse_caffemodel(weights)
    refused = {(op, name) for op, name, _ in t.refused}
    rows: "OrderedDict[str, Dict[str, Any]]" = OrderedDict()
    for layer in _layers(net):
        if not _in_test_phase(layer):
            continue
        r = rows.setdefault(layer.type, {"op_type": layer.type, "domain": FORMAT, "opset": "V1" if layer.v1 else "",
                                         "covered": True, "nodes": []})
        r["covered"] = r["covered"] and (layer.type == "Input" or layer.type in LAYERS) and \
            (layer.type, layer.name) not in refused
        r["nodes"].append(layer.name)
    return list(rows.values())


def from_caffe(prototxt_path: str, caffemodel_path: Optional[str] = None, shape: Optional[Dict[str, Any]] = None):
    """(graph, params) of a Caffe model: ``from_onnx`` of its translation."""
    from tether.frontend.onnx import from_onnx

    return from_onnx(to_onnx(prototxt_path, caffemodel_path), shape=shape)
