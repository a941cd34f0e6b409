"""Converters of the ONNX signal ops whose output depends only on their (constant) scalar arguments:
HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix become constants at import time."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ONNX_DTYPES, ConverterTable

CONVERTERS = ConverterTable(__name__)


def _scalar(im, node, value: str, what: str):
    c = im.require_const(value, "%s %s" % (node.op_type, what), node.name)
    if c.size != 1:
        raise UnsupportedOpError("node %s: %s %s must be a scalar, got shape %s"
                                 % (node.name, node.op_type, what, c.shape))
    return c.reshape(()).item()


def _out_dtype(node, a, default: int = 1) -> str:
    code = int(a.get("output_datatype", default))
    dt = ONNX_DTYPES.get(code)
    if dt is None or dt == "float16":
        raise UnsupportedOpError("node %s: %s output_datatype %d (tether implements %s)"
                                 % (node.name, node.op_type, code,
                                    ", ".join(v for v in ONNX_DTYPES.values() if v != "float16")))
    return dt


# the cosine-sum windows: w[n] = sum_k (-1)**k a_k cos(2 pi k n / N), N = size (periodic) or size - 1
_WINDOWS = {"HannWindow": (0.5, 0.5), "HammingWindow": (25.0 / 46.0, 1 - 25.0 / 46.0),
            "BlackmanWindow": (0.42, 0.5, 0.08)}


def window(op_type: str, size: int, periodic: bool) -> np.ndarray:
    """The window in float64 (ONNX's definitions)."""
    n = np.arange(size, dtype=np.float64)
    denom = size if periodic else size - 1
    phase = 2 * np.pi * n / denom if denom else np.zeros_like(n)
    w = np.zeros(size)
    for k, coeff in enumerate(_WINDOWS[op_type]):
        w += (-1) ** k * coeff * np.cos(k * phase)
    return w


@CONVERTERS.register(*_WINDOWS)
def _window(im, node, ins, a):
    size = int(_scalar(im, node, ins[0], "size"))
    if size < 1:
        raise UnsupportedOpError("node %s: %s of size %d (tensors here have no empty dimensions)"
                                 % (node.name, node.op_type, size))
    dt = _out_dtype(node, a)
    im.add_const(window(node.op_type, size, bool(a.get("periodic", 1))).astype(dt), name=node.output[0])


def mel_weight_matrix(num_mel_bins: int, dft_length: int, sample_rate: int, lower_hz: float,
                      upper_hz: float) -> np.ndarray:
    """ONNX MelWeightMatrix (triangular filters on the mel scale, bins on integer spectrogram indices)."""
    bins = np.arange(num_mel_bins + 2)
    low = 2595 * np.log1p(lower_hz / 700) / np.log(10)
    high = 2595 * np.log1p(upper_hz / 700) / np.log(10)
    mel = bins * ((high - low) / bins.shape[0]) + low
    hz = 700 * np.expm1(mel / 2595 * np.log(10))
    idx = (((dft_length + 1) * hz) // sample_rate).astype(np.int64)
    out = np.zeros((dft_length // 2 + 1, num_mel_bins))
    for i in range(num_mel_bins):
        lo, mid, hi = idx[i], idx[i + 1], idx[i + 2]
        if mid == lo:
            out[mid, i] = 1
        else:
            for j in range(lo, mid + 1):
                out[j, i] = (j - lo) / float(mid - lo)
        for j in range(mid, hi):
            out[j, i] = (hi - j) / float(hi - mid)
    return out


@CONVERTERS.register("MelWeightMatrix")
def _mel(im, node, ins, a):
    args = [_scalar(im, node, v, what) for v, what in zip(ins, ("num_mel_bins", "dft_length", "sample_rate",
                                                                 "lower_edge_hertz", "upper_edge_hertz"))]
    m = mel_weight_matrix(int(args[0]), int(args[1]), int(args[2]), float(args[3]), float(args[4]))
    im.add_const(m.astype(_out_dtype(node, a)), name=node.output[0])
