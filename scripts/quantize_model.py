#!/usr/bin/env python3
"""Quantize an ONNX model with onnxruntime.quantization.quantize_static (random calibration inputs), in the QDQ
form (QuantizeLinear/DequantizeLinear around each op) or the QOperator form (QLinearConv, QLinearMatMul, ...).

    python scripts/quantize_model.py model.onnx -o model_int8.onnx [--format qdq|qoperator] [--per-channel]
        [--activations uint8|int8] [--calibration 8] [--seed 0]

Also importable: ``quantize(model_path, out_path, fmt, per_channel, activations, n_calibration, seed)``.
Calibration uses uniform random inputs in [0, 1): the models here have random weights, so any input distribution
serves, and the same inputs drive the comparisons with onnxruntime (tests/test_int8_models.py).
"""
from __future__ import annotations

import argparse
import logging

import numpy as np


def random_inputs(model_path: str, n: int, seed: int = 0) -> list:
    import onnx
    model = onnx.load(model_path)
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        d = {}
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            shape = [x.dim_value or 1 for x in vi.type.tensor_type.shape.dim]
            d[vi.name] = rng.random(shape, dtype=np.float32)
        feeds.append(d)
    return feeds


def quantize(model_path: str, out_path: str, fmt: str = "qdq", per_channel: bool = True,
             activations: str = "uint8", n_calibration: int = 8, seed: int = 0) -> str:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(random_inputs(model_path, n_calibration, seed))

        def get_next(self):
            return next(self.it, None)

    pre = out_path + ".pre.onnx"
    quant_pre_process(model_path, pre, skip_symbolic_shape=True)
    quantize_static(pre, out_path, Reader(),
                    quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                    per_channel=per_channel,
                    activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    import os
    os.remove(pre)
    return out_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--format", choices=["qdq", "qoperator"], default="qdq")
    ap.add_argument("--per-channel", action="store_true")
    ap.add_argument("--activations", choices=["uint8", "int8"], default="uint8")
    ap.add_argument("--calibration", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    quantize(args.model, args.output, args.format, args.per_channel, args.activations, args.calibration, args.seed)
    logging.info("wrote %s", args.output)


if __name__ == "__main__":
    main()
