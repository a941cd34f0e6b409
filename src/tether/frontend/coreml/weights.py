"""The values of a NeuralNetwork ``WeightParams``: float32, float16 bytes, raw float32 bytes, or quantized bytes
(linear with per-channel scale and bias, or a lookup table) of 1 to 8 bits."""
from __future__ import annotations

from typing import Optional

import numpy as np

from tether.errors import InvalidInput


def _unpack_bits(raw: bytes, bits: int, count: int) -> np.ndarray:
    """``count`` unsigned ``bits``-wide values packed into ``raw`` from the most significant bit of each byte down
    (the order coremltools' weight quantizer writes)."""
    if bits == 8:
        return np.frombuffer(raw, dtype=np.uint8)[:count].astype(np.int64)
    stream = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))
    stream = stream[:count * bits].reshape(-1, bits).astype(np.int64)
    return (stream << np.arange(bits - 1, -1, -1, dtype=np.int64)).sum(axis=1)


def weight_array(wp, count: Optional[int] = None, what: str = "weights") -> np.ndarray:
    """The flat float32 values of ``wp`` (``count`` of them when given); per-channel quantization scales run over
    the leading (output channel) axis of the values."""
    if len(wp.floatValue):
        values = np.asarray(wp.floatValue, dtype=np.float32)
    elif len(wp.float16Value):
        values = np.frombuffer(wp.float16Value, dtype="<f2").astype(np.float32)
    elif wp.HasField("quantization") and (len(wp.rawValue) or len(wp.int8RawValue)):
        q = wp.quantization
        bits = q.numberOfBits or 8
        raw = wp.rawValue if len(wp.rawValue) else wp.int8RawValue
        n = count if count is not None else len(raw) * 8 // bits
        if len(wp.int8RawValue):
            codes = np.frombuffer(raw, dtype=np.int8)[:n].astype(np.float32)
        else:
            codes = _unpack_bits(raw, bits, n).astype(np.float32)
        kind = q.WhichOneof("QuantizationType")
        if kind == "linearQuantization":
            lq = q.linearQuantization
            scale = np.asarray(lq.scale, dtype=np.float32) if len(lq.scale) else np.ones(1, np.float32)
            bias = np.asarray(lq.bias, dtype=np.float32) if len(lq.bias) else np.zeros(1, np.float32)
            per = codes.reshape(max(len(scale), len(bias)), -1)        # one scale and bias per output channel
            values = (per * scale.reshape(-1, 1) + bias.reshape(-1, 1)).reshape(-1)
        elif kind == "lookupTableQuantization":
            table = np.asarray(q.lookupTableQuantization.floatValue, dtype=np.float32)
            values = table[codes.astype(np.int64)]
        else:
            raise InvalidInput("%s: quantized without a linear or lookup-table quantization" % what)
    elif len(wp.rawValue):
        values = np.frombuffer(wp.rawValue, dtype="<f4").astype(np.float32)
    else:
        values = np.zeros(0, np.float32)
    if count is not None and values.size != count:
        raise InvalidInput("the model's %s hold %d values; the layer needs %d" % (what, values.size, count))
    return values
