#!/usr/bin/env python3
"""Fingerprints of compiled models: the sha256 of deploy.so, deploy.json and deploy.params per model and target.

    python scripts/build_fingerprints.py [--models squeezenet,mobilenet_v2,...] [--targets host,rasp4b]
        [--json out.json] [--compare base.json]

A refactoring of the compiler that must not change generated code is checked by running this before and after
(`--json` on the old tree, `--compare` on the new): any model whose files differ is printed and the exit status
is 1. Models: the light models of the onnx wheel, mobilenet_v2 (scripts/make_mobilenet_v2.py), the digits CNN,
the model kinds of tether.testing.model_kinds (test size) and mobilenet_v2 quantized to int8 (QDQ).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_models import LIGHT, load_model  # noqa: E402

KINDS = ["db_detector", "svtr_recognizer", "yolov8_detector", "yolox_detector", "picodet_layout",
         "crnn_recognizer", "vad", "mobilenetv3_cls", "transformer_encoder"]
DEFAULT_MODELS = LIGHT[:3] + ["mobilenet_v2", "digits", "mobilenet_v2_int8"] + KINDS


def _model(name: str, work: str):
    if name in KINDS:
        from tether.testing.model_kinds import KINDS as BUILDERS
        return BUILDERS[name]("test")[0], None
    if name == "mobilenet_v2_int8":
        import onnx
        from quantize_model import quantize
        fp32 = os.path.join(work, "mnv2.onnx")
        onnx.save(load_model("mobilenet_v2"), fp32)
        out = os.path.join(work, "mnv2_int8.onnx")
        quantize(fp32, out, fmt="qdq")
        return onnx.load(out), None
    return load_model(name), ({"input": (1, 1, 8, 8)} if name == "digits" else None)


def fingerprint(name: str, target: str, work: str) -> dict:
    import tether
    from tether.frontend import from_onnx

    model, shape = _model(name, work)
    graph, params = from_onnx(model, shape=shape)
    folder = os.path.join(work, "%s-%s" % (name, target))
    paths = tether.build_graph(graph, params, target=target, opt_level=3).export(folder)
    out = {}
    for kind in ("so", "json", "params"):
        with open(paths[kind], "rb") as fh:
            out[kind] = hashlib.sha256(fh.read()).hexdigest()[:16]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--targets", default="host,rasp4b")
    ap.add_argument("--json", help="write the fingerprints here")
    ap.add_argument("--compare", help="a --json file of an earlier run: report every model whose files differ")
    args = ap.parse_args()
    base = None
    if args.compare:
        with open(args.compare, encoding="utf-8") as fh:
            base = json.load(fh)
    result, changed = {}, []
    with tempfile.TemporaryDirectory(prefix="tether-fp-") as work:
        for target in args.targets.split(","):
            for name in args.models.split(","):
                key = "%s@%s" % (name, target)
                result[key] = fp = fingerprint(name, target, work)
                verdict = ""
                if base is not None:
                    if key not in base:
                        verdict = "  (not in base)"
                    else:
                        diff = [k for k in fp if fp[k] != base[key].get(k)]
                        verdict = "  DIFFERS: " + ",".join(diff) if diff else "  same"
                        if diff:
                            changed.append(key)
                print("%-28s so=%s json=%s params=%s%s" % (key, fp["so"], fp["json"], fp["params"], verdict),
                      flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1, sort_keys=True)
    if base is not None:
        print("%d of %d builds differ from %s" % (len(changed), len(result), args.compare))
        sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
