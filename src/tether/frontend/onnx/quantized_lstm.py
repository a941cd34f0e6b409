"""onnxruntime's ``DynamicQuantizeLSTM`` (domain ``com.microsoft``, what ``quantize_dynamic`` writes for an LSTM),
computed as onnxruntime's CPU kernel does (contrib_ops/cpu/quantization/dynamic_quantize_lstm.cc, which runs the
float LSTM of providers/cpu/rnn with its two GEMMs quantized):

- the input projection: X (all steps and batch rows at once) quantized to uint8 as DynamicQuantizeLinear does,
  the integer product with ``W`` (``[D, input, 4H]``, int8 or uint8 minus its zero point), scaled by
  ``x_scale * W_scale`` (per direction, or per direction and column), plus the float biases ``Wb + Rb``;
- each step: the direction's hidden state of all batch rows quantized the same way, its integer product with
  ``R`` (``[D, H, 4H]``) scaled by ``h_scale * R_scale`` and added (the ``recurrent`` op with ``quant_h``,
  kernels/recurrent_op.py), then the float gate arithmetic of the LSTM.

onnxruntime takes one zero point per direction (its first element; per-channel zero points must agree, as it
checks), and so does tether. Refused with an ``UnsupportedOpError``: ``sequence_lens`` other than the full length
(onnxruntime quantizes the held state of finished rows with the others only when Y is not read: not implemented),
run-time weights, scales or zero points, and weights whose integer products could exceed float32's exact range.
onnxruntime splits the batch across threads at more than one thread (each block quantized on its own); tether
quantizes the whole batch as onnxruntime does at one thread (or at batch 1, where both agree).
"""
from __future__ import annotations

import types

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx import quantized
from tether.frontend.onnx.importer import ConverterTable, Importer, emit_reshape, require_dtype, str_attr
from tether.frontend.onnx.recurrent import DIRECTIONS, activation_functions, optional_input

CONVERTERS = ConverterTable(__name__)

EXACT = 2 ** 24     # float32 holds every integer below this: the product's partial sums must stay under it


def _per_direction(node, value: np.ndarray, ndir: int, n: int, what: str) -> np.ndarray:
    """A scale or zero point of shape [D] (per direction) or [D, 4H] (per column) as [D, 4H]."""
    v = np.asarray(value)
    if v.shape in ((ndir,), (ndir, 1)):
        return np.repeat(v.reshape(ndir, 1), n, axis=1)
    if v.shape == (ndir, n):
        return v
    raise UnsupportedOpError("node %s: DynamicQuantizeLSTM %s of shape %s (onnxruntime takes [%d] or [%d, %d])"
                             % (node.name, what, v.shape, ndir, ndir, n))


def _weights(im: Importer, node, w: str, scale: str, zp: str, ndir: int, n: int, name: str):
    """(integer weights minus the zero point as int64 [D, K, 4H], scales float32 [D, 4H])."""
    wq = im.require_const(w, name, node.name)
    if wq.dtype not in (np.int8, np.uint8) or wq.ndim != 3 or wq.shape[0] != ndir or wq.shape[2] != n:
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM %s of type %s and shape %s (int8/uint8 [%d, K, %d] "
                                 "expected)" % (node.name, name, wq.dtype, wq.shape, ndir, n))
    s = _per_direction(node, im.require_const(scale, name + " scale", node.name), ndir, n, name + " scale")
    z = _per_direction(node, im.require_const(zp, name + " zero point", node.name), ndir, n, name + " zero point")
    if np.asarray(s).dtype != np.float32 or z.dtype != wq.dtype:
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM %s scale %s / zero point %s (float32 and the "
                                 "weight's %s expected)" % (node.name, name, s.dtype, z.dtype, wq.dtype))
    if np.any(z != z[:, :1]):
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM %s zero points vary within a direction "
                                 "(onnxruntime takes one per direction)" % (node.name, name))
    w64 = wq.astype(np.int64) - z[:, :1, None].astype(np.int64).reshape(ndir, 1, 1)
    # a uint8 activation minus its zero point is in [-255, 255]: every partial sum stays under the bound
    worst = 255 * int(np.abs(w64).sum(axis=1).max())
    if worst >= EXACT:
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM %s products up to %d exceed float32's exact "
                                 "integers (2**24)" % (node.name, name, worst))
    return w64, s.astype(np.float32)


def _dynamic_quantize_lstm(im: Importer, node, ins, a):
    x, w, r = ins[0], ins[1], ins[2]
    require_dtype(im, node, x, ("float32",))
    if len(ins) < 12 or not all(ins[8:12]):
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM without its W/R scales and zero points" % node.name)
    direction = str_attr(a, "direction", "forward")
    if direction not in DIRECTIONS:
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM direction %r" % (node.name, direction))
    dirs = DIRECTIONS[direction]
    ndir = len(dirs)
    seq, batch, nin = im.type(x).shape
    hid = int(a.get("hidden_size", im.type(r).shape[1]))
    n = 4 * hid
    if int(a.get("input_forget", 0)) not in (0, 1):
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM input_forget %r" % (node.name, a["input_forget"]))
    acts = activation_functions(node, "lstm", a, ndir)
    w64, ws = _weights(im, node, w, ins[8], ins[9], ndir, n, "W")
    r64, rs = _weights(im, node, r, ins[10], ins[11], ndir, n, "R")
    if w64.shape[1] != nin or r64.shape[1] != hid:
        raise UnsupportedOpError("node %s: DynamicQuantizeLSTM W %s / R %s do not fit input size %d and "
                                 "hidden_size %d" % (node.name, w64.shape, r64.shape, nin, hid))
    lens = optional_input(ins, 4)
    if lens is not None:
        const = im.const(lens)
        if const is None or not np.all(np.asarray(const) == seq):
            raise UnsupportedOpError("node %s: DynamicQuantizeLSTM with sequence_lens other than the full length "
                                     "(not implemented)" % node.name)

    # the input projection: X quantized once, one integer GEMM for every direction, scaled per column
    xq, sx, zx = (im.fresh(node.name + s) for s in ("_x_quantized", "_x_scale", "_x_zero_point"))
    dql = types.SimpleNamespace(name=node.name + "_quantize_x", op_type="DynamicQuantizeLinear",
                                output=[xq, sx, zx], input=[x])
    quantized.CONVERTERS["DynamicQuantizeLinear"](im, dql, [x], {})
    x32 = im.emit("sub", [im.emit("cast", [emit_reshape(im, xq, (seq * batch, nin))], {"to": "int32"}),
                          im.emit("cast", [zx], {"to": "int32"})])
    w_rows = np.ascontiguousarray(np.transpose(w64, (0, 2, 1)).reshape(ndir * n, nin).astype(np.int32))
    acc = im.emit("dense", [x32, im.add_const(w_rows, node.name + "_w_int")])
    mult = im.emit("mul", [sx, im.add_const(ws.reshape(ndir * n), node.name + "_w_scale")])
    xw = im.emit("mul", [im.emit("cast", [acc], {"to": "float32"}), mult])
    bias = optional_input(ins, 3)
    if bias is not None:
        require_dtype(im, node, bias, ("float32",))
        wb = im.emit("strided_slice", [bias], {"begin": [0, 0], "end": [ndir, n], "step": [1, 1]})
        rb = im.emit("strided_slice", [bias], {"begin": [0, n], "end": [ndir, 2 * n], "step": [1, 1]})
        xw = im.emit("add", [xw, emit_reshape(im, im.emit("add", [wb, rb]), (ndir * n,))])
    xw = emit_reshape(im, xw, (seq, batch, ndir * n))

    def state(k: int) -> str:
        v = optional_input(ins, k)
        if v is None:
            return im.add_const(np.zeros((ndir, batch, hid), np.float32))
        require_dtype(im, node, v, ("float32",))
        return v
    inputs = [xw, im.add_const(r64.astype(np.float32), node.name + "_r_int"), state(5), state(6)]
    attrs = {"cell": "lstm", "hidden": hid, "directions": dirs, "acts": acts,
             "clip": float(a["clip"]) if "clip" in a else None, "input_forget": int(a.get("input_forget", 0)),
             "linear_before_reset": 0, "has_peephole": 0, "has_seq_lens": 0, "quant_h": 1}
    p = optional_input(ins, 7)
    if p is not None:
        require_dtype(im, node, p, ("float32",))
        inputs.append(p)
        attrs["has_peephole"] = 1
    inputs.append(im.add_const(rs, node.name + "_r_scale"))
    outs = [node.output[k] if len(node.output) > k and node.output[k] else im.fresh(node.name + "_out")
            for k in range(3)]
    im.emit("recurrent", inputs, attrs, node.name, outs)


CONVERTERS.add("com.microsoft.DynamicQuantizeLSTM", _dynamic_quantize_lstm)
