"""A Darknet model (a .cfg and the .weights written for it) as an ONNX ModelProto, and its layer coverage.

The user names either file; the other is the one beside it with the same stem. The graph has one input,
``data`` [1, channels, height, width] from [net], and one output per layer whose output no other layer reads (as
OpenCV's getUnconnectedOutLayers lists them), named ``<type>_<layer number>``.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.darknet.cfg import Network, parse_cfg
from tether.frontend.darknet.layers import JOINS, LAYERS, Translator, Value
from tether.frontend.darknet.weights import WeightsFile

FORMAT = "Darknet"
_NET = re.compile(r"^\s*\[(net|network)\]\s*$")


def is_cfg_text(text: str) -> bool:
    """Whether ``text`` starts (after comments) with the [net] section of a Darknet .cfg."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and ln.lstrip()[0] not in "#;"), "")
    return bool(_NET.match(first))


def _is_cfg_file(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return False
    if b"\0" in head:
        return False
    return is_cfg_text(head.decode("utf-8", errors="replace"))


def companions(path: str, need_weights: bool = True) -> Tuple[str, Optional[str]]:
    """(cfg, weights) for the file the user named: the other one is beside it with the same stem."""
    stem = os.path.splitext(path)[0]
    if _is_cfg_file(path):
        weights = stem + ".weights"
        if os.path.isfile(weights):
            return path, weights
        if need_weights:
            raise InvalidInput("%s is a Darknet .cfg, but its weights %s are missing: expected the .weights file "
                               "beside it with the same name" % (path, weights))
        return path, None
    cfg = stem + ".cfg"
    if not os.path.isfile(cfg):
        raise InvalidInput("%s: expected a Darknet .cfg, or a .weights file with its .cfg %s beside it (not found)"
                           % (path, cfg))
    if not _is_cfg_file(cfg):
        raise InvalidInput("%s is not a Darknet .cfg (expected a [net] section first), so %s has no network"
                           % (cfg, path))
    return cfg, path


def _read_network(cfg_path: str) -> Network:
    try:
        with open(cfg_path, "rb") as fh:
            text = fh.read().decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("%s is not a Darknet .cfg: it is not text" % cfg_path) from None
    return parse_cfg(text, cfg_path)


def translate(cfg_path: str, weights_path: Optional[str]) -> Translator:
    """Every layer of the .cfg as ONNX nodes; what is not covered is collected in ``refused``, not raised.
    Without ``weights_path`` the weights are zeros (enough to check coverage)."""
    net = _read_network(cfg_path)
    weights = WeightsFile(weights_path) if weights_path else None
    t = Translator(net, weights, cfg_path, os.path.splitext(os.path.basename(cfg_path))[0])
    h, w, c = (net.net.int(k, d, cfg_path) for k, d in (("height", 416), ("width", 416), ("channels", 3)))
    if min(h, w, c) < 1:
        raise InvalidInput("%s: [net] has height=%d width=%d channels=%d, expected positive sizes"
                           % (cfg_path, h, w, c))
    if not net.layers:
        raise InvalidInput("%s has a [net] section but no layers" % cfg_path)
    t.input_hw = (h, w)
    prev: Optional[Value] = Value(t.b.input("data", [1, c, h, w]), c, h, w)
    for s in net.layers:
        if s.type not in JOINS and s.index > 0:
            t.consumed.add(s.index - 1)
        fn = LAYERS.get(s.type)
        if fn is None:
            t.refuse(s.type, s)
            out = None
        elif prev is None and s.type not in JOINS:
            out = None
        else:
            out = fn(t, s, prev)
        if out is None:
            t.weights = None     # where the next layer's weights start is unknown now; finish the pass dry
        t.outputs.append(out)
        prev = out
    for i, v in enumerate(t.outputs):
        if i not in t.consumed and v is not None:
            t.b.output(v.name, "%s_%d" % (net.layers[i].type, i))
    return t


def _refusal_text(path: str, t: Translator, version: str) -> str:
    items = ["%s (layer %d at line %d, %s%s)" % (op, s.index, s.line, version, ": " + why if why else "")
             for op, s, why in t.refused]
    return "%s: %d Darknet layer(s) tether does not cover: %s" % (path, len(items), "; ".join(items))


def to_onnx(cfg_path: str, weights_path: Optional[str] = None) -> Any:
    """The Darknet model as an ONNX ModelProto; ``weights_path`` defaults to the .weights beside the .cfg."""
    cfg_path, found = companions(cfg_path) if weights_path is None else (cfg_path, weights_path)
    t = translate(cfg_path, found)
    if t.refused:
        raise UnsupportedOpError(_refusal_text(cfg_path, t, WeightsFile(found).version_text))
    return t.b.model("from %s" % os.path.basename(cfg_path))


def read_model(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    """The reader :mod:`tether.frontend.readers` calls: ``path`` is the .cfg or the .weights."""
    return to_onnx(*companions(path))


def op_coverage(path: str) -> List[Dict[str, Any]]:
    """One row per layer type (and per activation) of the .cfg: covered or not, with its layers. Needs no
    .weights."""
    cfg_path, _ = companions(path, need_weights=False)
    t = translate(cfg_path, None)
    rows: "OrderedDict[str, Dict[str, Any]]" = OrderedDict()

    def row(op: str, layer: int, covered: bool) -> None:
        r = rows.setdefault(op, {"op_type": op, "domain": FORMAT, "opset": "", "covered": True, "nodes": []})
        r["covered"] = r["covered"] and covered
        name = "layer %d" % layer
        if name not in r["nodes"]:
            r["nodes"].append(name)

    for s in t.net.layers:
        row(s.type, s.index, s.type in LAYERS)
        if "activation" in s.options:
            row("activation=%s" % s.options["activation"].lower(), s.index, True)
    for op, s, _ in t.refused:
        row(op, s.index, False)
    return list(rows.values())


def from_darknet(cfg_path: str, weights_path: Optional[str] = None, shape: Optional[Dict[str, Any]] = None):
    """(graph, params) of a Darknet model: ``from_onnx`` of its translation. The input is ``data``."""
    from tether.frontend.onnx import from_onnx

    return from_onnx(to_onnx(cfg_path, weights_path), shape=shape)
