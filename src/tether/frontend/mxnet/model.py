"""An MXNet model (``prefix-symbol.json``, the graph, and ``prefix-NNNN.params``, the weights of epoch NNNN) as an
ONNX ModelProto, and its op coverage.

The user names either file: beside a symbol file the .params of the highest epoch with its prefix is used;
beside a .params file, the symbol file of its prefix. The graph's inputs are the symbol's variables that the
.params file does not hold (labels of output layers excepted), 4-D unless ``shape`` gives them; its outputs are
the symbol's heads.
"""
from __future__ import annotations

import glob
import json
import os
import re
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.mxnet.ops import LABELLED, OPS, Node, Translator
from tether.frontend.mxnet.params import is_params, read_params

FORMAT = "MXNet"
_EPOCH = re.compile(r"^(.*)-(\d+)\.params$")


def _is_params_file(path: str) -> bool:
    with open(path, "rb") as fh:
        return is_params(fh.read(16))


def companions(path: str, need_params: bool = True) -> Tuple[str, Optional[str]]:
    """(symbol.json, .params) for the file the user named."""
    if _is_params_file(path):
        m = _EPOCH.match(path)
        prefix = m.group(1) if m else os.path.splitext(path)[0]
        symbol = prefix + "-symbol.json"
        if not os.path.isfile(symbol):
            raise InvalidInput("%s is an MXNet .params file: expected its graph %s beside it (not found)"
                               % (path, symbol))
        return symbol, path
    prefix = path[:-len("-symbol.json")] if path.endswith("-symbol.json") else os.path.splitext(path)[0]
    found = sorted((int(m.group(2)), p) for p in glob.glob(glob.escape(prefix) + "-*.params")
                   for m in [_EPOCH.match(p)] if m and m.group(1) == prefix)
    if found:
        return path, found[-1][1]
    if need_params:
        raise InvalidInput("%s is an MXNet symbol, but its weights are missing: expected %s-NNNN.params beside it"
                           % (path, prefix))
    return path, None


def read_symbol(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("%s is not a valid MXNet symbol file: %s" % (path, " ".join(str(exc).split()))) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise InvalidInput("%s is not an MXNet symbol file: expected a JSON object with a \"nodes\" list" % path)
    return doc


def translate(symbol_path: str, params_path: Optional[str],
              shape: Optional[Mapping[str, Sequence[int]]] = None) -> Translator:
    doc = read_symbol(symbol_path)
    params = read_params(params_path) if params_path else {}
    nodes = [Node(n) for n in doc["nodes"]]
    t = Translator(os.path.basename(symbol_path).replace("-symbol.json", ""), symbol_path, params)
    labels = {n.inputs[k][0] for n in nodes if n.op in LABELLED for k in range(1, len(n.inputs))}
    shape = dict(shape or {})
    values: Dict[int, Optional[str]] = {}
    for i, n in enumerate(nodes):
        n.input_names = [nodes[ref[0]].name for ref in n.inputs if ref[0] < len(nodes)]
        if n.op == "null":
            if n.name in params:
                values[i] = t.b.const(n.name, params[n.name])
            elif i in labels:
                values[i] = None
            elif params_path or n.name in shape or not any(n.name.endswith(s) for s in _WEIGHT_SUFFIXES):
                dims = list(shape.get(n.name, ("N", "C", "H", "W")))
                values[i] = t.b.input(n.name, dims)
            else:                                       # coverage without the .params: a stand-in weight
                values[i] = t.b.const(n.name, np.zeros((1,), np.float32))
            continue
        refs = [ref[0] for ref in n.inputs]
        if any(r >= i for r in refs):
            raise InvalidInput("%s: node %r reads node %d, expected the nodes in topological order"
                               % (symbol_path, n.name, max(refs)))
        ins = [values[r] for r in refs if not (n.op in LABELLED and r in labels)]
        fn = OPS.get(n.op)
        if fn is None:
            t.refuse(n)
            values[i] = None
        elif any(v is None for v in ins):
            values[i] = None
        else:
            values[i] = fn(t, n, ins)
    heads = doc.get("heads") or [[len(nodes) - 1, 0, 0]]
    for head in heads:
        idx = head[0] if isinstance(head, list) else head
        if values.get(idx) is not None:
            t.b.output(values[idx], nodes[idx].name + "_output")
    return t


_WEIGHT_SUFFIXES = ("_weight", "_bias", "_gamma", "_beta", "_moving_mean", "_moving_var", "_alpha")


def _refusal_text(path: str, t: Translator, version: str) -> str:
    items = ["%s (node %r, %s%s)" % (op, name, version, ": " + why if why else "") for op, name, why in t.refused]
    return "%s: %d MXNet op(s) tether does not cover: %s" % (path, len(items), "; ".join(items))


def _version(path: str) -> str:
    v = read_symbol(path).get("attrs", {}).get("mxnet_version")
    return "mxnet %s" % (v[1] if isinstance(v, list) and len(v) > 1 else "version unknown")


def to_onnx(symbol_path: str, params_path: Optional[str] = None,
            shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    if params_path is None:
        symbol_path, params_path = companions(symbol_path)
    t = translate(symbol_path, params_path, shape)
    if t.refused:
        raise UnsupportedOpError(_refusal_text(symbol_path, t, _version(symbol_path)))
    return t.b.model()


def read_model(path: str, shape: Optional[Mapping[str, Sequence[int]]] = None) -> Any:
    """The reader :mod:`tether.frontend.readers` calls; the file pair holds no input shapes: ``shape`` gives them."""
    return to_onnx(*companions(path), shape=shape)


def op_coverage(path: str) -> List[Dict[str, Any]]:
    symbol, params = companions(path, need_params=False)
    t = translate(symbol, params)
    refused = {name for _, name, _ in t.refused}
    rows: "OrderedDict[str, Dict[str, Any]]" = OrderedDict()
    for n in (Node(d) for d in read_symbol(symbol)["nodes"]):
        if n.op == "null":
            continue
        r = rows.setdefault(n.op, {"op_type": n.op, "domain": FORMAT, "opset": "", "covered": True, "nodes": []})
        r["covered"] = r["covered"] and n.op in OPS and n.name not in refused
        r["nodes"].append(n.name)
    return list(rows.values())


def from_mxnet(symbol_path: str, params_path: Optional[str] = None,
               shape: Optional[Mapping[str, Sequence[int]]] = None):
    """(graph, params) of an MXNet model; ``shape`` gives the input shapes (the symbol holds none)."""
    from tether.frontend.onnx import from_onnx

    return from_onnx(to_onnx(symbol_path, params_path, shape), shape=shape)
