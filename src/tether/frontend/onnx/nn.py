"""Converters of the ONNX neural-network layers: convolution (and its transpose), pooling, batch norm, LRN,
softmax, Gemm and MatMul."""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, norm_axis, str_attr
from tether.graph import op_info

CONVERTERS = ConverterTable(__name__)


def spatial_pads(a: dict, in_sp: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int]) -> List[int]:
    """The begin-then-end pads of a window op (ONNX ``pads`` order) from its ``auto_pad`` or ``pads`` attribute."""
    nd = len(in_sp)
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-in_sp[i] // s[i])
            total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i], 0)
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        return begin + end
    if auto == "VALID":
        return [0] * (2 * nd)
    return list(a.get("pads", [0] * (2 * nd)))


@CONVERTERS.register("Conv")
def _conv(im, node, ins, a):
    xt, wt = im.type(ins[0]), im.type(ins[1])
    nd = len(xt.shape) - 2
    k = list(a.get("kernel_shape", wt.shape[2:]))
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    pads = spatial_pads(a, xt.shape[2:], k, s, d)
    group = int(a.get("group", 1))
    x, w = ins[0], ins[1]
    if nd == 1:     # a 1-D conv is a 2-D conv over a height of one
        x = emit_reshape(im, x, xt.shape[:2] + (1,) + xt.shape[2:])
        w = emit_reshape(im, w, wt.shape[:2] + (1,) + wt.shape[2:])
        s, d, pads = [1] + s, [1] + d, [0, pads[0], 0, pads[1]]
    elif nd == 3:
        bias = ins[2] if len(ins) > 2 and ins[2] else None
        _conv3d(im, node.name, x, w, s, d, pads, group, bias, node_output(node))
        return
    elif nd != 2:
        raise UnsupportedOpError("node %s: %d-D Conv (only 1-D, 2-D and 3-D)" % (node.name, nd))
    attrs = {"strides": s, "dilations": d, "pads": pads, "groups": group}
    has_bias = len(ins) > 2 and ins[2]
    final = node_output(node) if nd == 2 and not has_bias else None
    y = im.emit("conv2d", [x, w], attrs, node.name, final)
    if has_bias:
        b = emit_reshape(im, ins[2], (1, im.type(ins[2]).shape[0], 1, 1))
        y = im.emit("add", [y, b], {}, node.name + "_bias", node_output(node) if nd == 2 else None)
    if nd == 1:
        t = im.type(y)
        emit_reshape(im, y, (t.shape[0], t.shape[1], t.shape[3]), node.name + "_squeeze", node.output[0])


def _temporal_conv(im, name: str, x: str, w: str, s: int, d: int, pads, g: int, bias, out) -> str:
    """A 3-D conv whose kernel spans depth only (a (2+1)D video net's kd x 1 x 1 temporal conv) as a 2-D conv over
    (depth, H*W) with a kd x 1 kernel: no gather of depth taps, no batch of frames, the input read in place."""
    n, c, depth, h, wd = im.type(x).shape
    m, cg, kd = im.type(w).shape[:3]
    x4 = emit_reshape(im, x, (n, c, depth, h * wd))
    w4 = emit_reshape(im, w, (m, cg, kd, 1))
    y = im.emit("conv2d", [x4, w4], {"strides": [s, 1], "dilations": [d, 1], "pads": [pads[0], 0, pads[1], 0],
                                     "groups": g}, name + "_conv2d")
    if bias is not None:
        y = im.emit("add", [y, emit_reshape(im, bias, (1, m, 1, 1))], {}, name + "_bias")
    dout = im.type(y).shape[2]
    return im.emit("reshape", [y], {"shape": (n, m, dout, h, wd)}, name + "_volume", out)


def _conv3d(im, name: str, x: str, w: str, s, d, pads, g: int, bias, out) -> str:
    """A 3-D conv as one 2-D conv: the depth taps of each output depth become input channels. The input's depth
    frames each output depth reads are gathered as channels (group, tap, channel), the output depths join the
    batch, and the weight (m, c/g, kd, kh, kw) is laid out (m, kd, c/g, kh, kw) to match; so the 2-D conv
    kernels, their schedules and their tuning serve video and volume models, at the cost of an input kd/sd times
    as large."""
    n, c, depth, h, wd = im.type(x).shape
    m, cg, kd, kh, kw = im.type(w).shape
    if c != cg * g or m % g:
        raise UnsupportedOpError("node %s: Conv weight %s for input %s and group %d"
                                 % (name, im.type(w).shape, im.type(x).shape, g))
    if (kh, kw) == (1, 1) and list(s[1:]) == [1, 1] and not any(pads[i] for i in (1, 2, 4, 5)):
        return _temporal_conv(im, name, x, w, s[0], d[0], (pads[0], pads[3]), g, bias, out)
    if pads[0] or pads[3]:
        x = im.emit("pad", [x], {"pads": [0, 0, pads[0], 0, 0, 0, 0, pads[3], 0, 0], "value": 0.0,
                                 "mode": "constant"}, name + "_dpad")
        depth += pads[0] + pads[3]
    dout = (depth - d[0] * (kd - 1) - 1) // s[0] + 1
    if dout < 1:
        raise UnsupportedOpError("node %s: Conv kernel depth %d (dilation %d) is deeper than the padded input's %d"
                                 % (name, kd, d[0], depth))
    x6 = emit_reshape(im, x, (n, g, cg, depth, h, wd))
    taps = np.arange(dout)[:, None] * s[0] + np.arange(kd)[None, :] * d[0]      # (output depth, tap) -> depth
    if taps.shape != (depth, 1) or taps[:, 0].tolist() != list(range(depth)):
        # one gather of every tap's depth slice (not a slice per tap and a concat: a pass over the input fewer)
        x6 = im.emit("gather", [x6, im.add_const(taps.astype(np.int64), name + "_taps")],
                     {"axis": 3, "shape": [n, g, cg, dout, kd, h, wd]}, name + "_taps")
    x6 = emit_reshape(im, x6, (n, g, cg, dout, kd, h, wd))
    moved = im.emit("transpose", [x6], {"axes": [0, 3, 1, 4, 2, 5, 6]}, name + "_depth_to_batch")
    x2 = emit_reshape(im, moved, (n * dout, g * kd * cg, h, wd))
    w5 = im.emit("transpose", [w], {"axes": [0, 2, 1, 3, 4]}, name + "_wtaps")
    w2 = emit_reshape(im, w5, (m, kd * cg, kh, kw))
    y = im.emit("conv2d", [x2, w2], {"strides": list(s[1:]), "dilations": list(d[1:]),
                                     "pads": [pads[1], pads[2], pads[4], pads[5]], "groups": g}, name + "_conv2d")
    ho, wo = im.type(y).shape[2:]
    y = emit_reshape(im, y, (n, dout, m, ho, wo))
    if bias is None:
        return im.emit("transpose", [y], {"axes": [0, 2, 1, 3, 4]}, name, out)
    y = im.emit("transpose", [y], {"axes": [0, 2, 1, 3, 4]}, name + "_batch_to_depth")
    b = emit_reshape(im, bias, (1, m, 1, 1, 1))
    return im.emit("add", [y, b], {}, name + "_bias", out)


def _pool(kind):
    def conv(im, node, ins, a):
        indices = len(node.output) > 1 and node.output[1]
        xt = im.type(ins[0])
        nd = len(xt.shape) - 2
        k = list(a["kernel_shape"])
        s = list(a.get("strides", [1] * nd))
        d = list(a.get("dilations", [1] * nd))
        attrs = {"kernel": k, "strides": s, "dilations": d, "pads": spatial_pads(a, xt.shape[2:], k, s, d),
                 "ceil_mode": int(a.get("ceil_mode", 0)), "count_include_pad": int(a.get("count_include_pad", 0))}
        im.emit(kind, [ins[0]], attrs, node.name, node_output(node))
        if indices:     # the flat index of each window's first maximum
            im.emit("max_pool_indices", [ins[0]], dict(attrs, storage_order=int(a.get("storage_order", 0))),
                    node.name + "_indices", [node.output[1]])
    return conv


CONVERTERS.add("MaxPool", _pool("max_pool"))
CONVERTERS.add("AveragePool", _pool("avg_pool"))


@CONVERTERS.register("GlobalAveragePool", "GlobalMaxPool")
def _gpool(im, node, ins, a):
    op = "global_avg_pool" if node.op_type == "GlobalAveragePool" else "global_max_pool"
    im.emit(op, [ins[0]], {}, node.name, node_output(node))


@CONVERTERS.register("BatchNormalization")
def _bn(im, node, ins, a):
    if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
        _bn_training(im, node, ins, a)
        return
    im.emit("batch_norm", ins[:5], {"epsilon": float(a.get("epsilon", 1e-5))}, node.name, node_output(node))


def _bn_training(im, node, ins, a):
    """Training-mode batch norm: normalise with the batch's own statistics and update the running ones."""
    x = ins[0]
    t = im.type(x)
    nd = len(t.shape)
    eps, momentum = float(a.get("epsilon", 1e-5)), float(a.get("momentum", 0.9))
    axes = [i for i in range(nd) if i != 1]
    vec = (1, t.shape[1]) + (1,) * (nd - 2)
    dt = t.dtype

    def const(v):
        return im.add_const(np.array(v, dtype=dt))

    m = im.emit("mean", [x], {"axes": axes, "keepdims": True}, node.name + "_mean")
    d = im.emit("sub", [x, m])
    var = im.emit("mean", [im.emit("mul", [d, d])], {"axes": axes, "keepdims": True}, node.name + "_var")
    inv = im.emit("div", [emit_reshape(im, ins[1], vec), im.emit("sqrt", [im.emit("add", [var, const(eps)])])])
    im.emit("add", [im.emit("mul", [d, inv]), emit_reshape(im, ins[2], vec)], {}, node.name, node_output(node, 0))
    for k, (running, batch) in enumerate(((ins[3], m), (ins[4], var)), start=1):
        if len(node.output) > k and node.output[k]:
            upd = im.emit("mul", [emit_reshape(im, batch, (t.shape[1],)), const(1.0 - momentum)])
            im.emit("add", [im.emit("mul", [running, const(momentum)]), upd], {}, node.name + "_running%d" % k,
                    node_output(node, k))


@CONVERTERS.register("LRN")
def _lrn(im, node, ins, a):
    im.emit("lrn", [ins[0]], {"size": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)),
                              "beta": float(a.get("beta", 0.75)), "bias": float(a.get("bias", 1.0))},
            node.name, node_output(node))


@CONVERTERS.register("Softmax")
def _softmax(im, node, ins, a):
    t = im.type(ins[0])
    nd = len(t.shape)
    if im.opset >= 13:
        im.emit("softmax", [ins[0]], {"axis": norm_axis(a.get("axis", -1), nd)}, node.name, node_output(node))
        return
    # before opset 13 softmax works on the input coerced to 2-D at `axis`
    axis = norm_axis(a.get("axis", 1), nd)
    lead = int(np.prod(t.shape[:axis], dtype=np.int64))
    flat = emit_reshape(im, ins[0], (lead, t.size // max(lead, 1)))
    y = im.emit("softmax", [flat], {"axis": 1}, node.name)
    emit_reshape(im, y, t.shape, node.name + "reshape", node.output[0])


@CONVERTERS.register("Gemm")
def _gemm(im, node, ins, a):
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    A, B = ins[0], ins[1]
    if a.get("transA", 0):
        A = im.emit("transpose", [A], {"axes": [1, 0]}, node.name + "_transA")
    if not a.get("transB", 0):   # dense wants the weight as [N, K]; folds away when B is a constant
        B = im.emit("transpose", [B], {"axes": [1, 0]}, node.name + "_transB")
    has_c = len(ins) > 2 and bool(ins[2]) and beta != 0.0
    last_is_dense = alpha == 1.0 and not has_c
    y = im.emit("dense", [A, B], {}, node.name, node_output(node) if last_is_dense else None)
    if alpha != 1.0:
        y = im.emit("scale_shift", [y], {"scale": alpha, "shift": 0.0}, node.name + "_alpha",
                    node_output(node) if not has_c else None)
    if has_c:
        C = ins[2]
        if beta != 1.0:
            C = im.emit("scale_shift", [C], {"scale": beta, "shift": 0.0}, node.name + "_beta")
        im.emit("add", [y, C], {}, node.name + "_bias", node_output(node))


@CONVERTERS.register("MatMul")
def _matmul(im, node, ins, a):
    at, bt = im.type(ins[0]), im.type(ins[1])
    A, B = ins[0], ins[1]
    a_shape, b_shape = list(at.shape), list(bt.shape)
    if len(a_shape) == 1:
        A = emit_reshape(im, A, [1] + a_shape)
        a_shape = [1] + a_shape
    if len(b_shape) == 1:
        B = emit_reshape(im, B, b_shape + [1])
        b_shape = b_shape + [1]
    M, K, N = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = list(op_info.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    onnx_shape = list(batch)
    if len(at.shape) > 1:
        onnx_shape.append(M)
    if len(bt.shape) > 1:
        onnx_shape.append(N)
    nb = int(np.prod(batch, dtype=np.int64)) if batch else 1
    if len(b_shape) == 2:
        # one weight matrix shared by every row: a dense over the flattened rows of A
        A2 = emit_reshape(im, A, (int(np.prod(a_shape[:-1], dtype=np.int64)), K))
        Bt = im.emit("transpose", [B], {"axes": [1, 0]}, node.name + "_transB")
        y = im.emit("dense", [A2, Bt], {}, node.name)
    else:
        Af = A if tuple(a_shape[:-2]) == tuple(batch) else im.emit("broadcast_to", [A], {"shape": batch + [M, K]})
        Bf = B if tuple(b_shape[:-2]) == tuple(batch) else im.emit("broadcast_to", [B], {"shape": batch + [K, N]})
        y = im.emit("batch_matmul", [emit_reshape(im, Af, (nb, M, K)), emit_reshape(im, Bf, (nb, K, N))], {}, node.name)
    im.emit("reshape", [y], {"shape": tuple(onnx_shape)}, node.name + "out", node_output(node))

def _conv_transpose_pads(node, a: dict, in_sp, k, s, d, out_pad) -> List[int]:
    nd = len(in_sp)
    auto = str_attr(a, "auto_pad", "NOTSET")
    if "output_shape" in a or auto in ("SAME_UPPER", "SAME_LOWER"):
        if "output_shape" in a:
            target = list(a["output_shape"])[-nd:]
        else:
            target = [in_sp[i] * s[i] for i in range(nd)]
        begin, end = [], []
        for i in range(nd):
            total = s[i] * (in_sp[i] - 1) + out_pad[i] + ((k[i] - 1) * d[i] + 1) - target[i]
            # onnxruntime (which tether follows): SAME_UPPER puts the odd unit at the end, anything else at
            # the start
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
        return begin + end
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto != "NOTSET":
        raise UnsupportedOpError("node %s: ConvTranspose auto_pad %r" % (node.name, auto))
    return list(a.get("pads", [0] * (2 * nd)))


def _conv_transpose_phases(im, node, ins, x, w, xshape, k, s, pads, out_pad, g, mg, nd) -> None:
    """Strided transposed conv as s0*s1 stride-1 convs, one per output phase (oy % s0, ox % s1), each with the
    sub-kernel of the taps that reach that phase: s0*s1 times fewer multiply-adds than convolving the
    zero-inserted input. Output rows oy = s*q + a get sum_t x[q + c_a - t] * w[k0_a + s*t] with
    k0_a = (a + pad) % s and c_a = (a + pad) // s: a correlation with the reversed sub-kernel. The phases are
    stacked (a view concat: each conv writes its slice), interleaved by one transpose, and cropped."""
    n, c, h, wd = xshape
    out = [s[i] * (xshape[2 + i] - 1) + out_pad[i] + k[i] - pads[i] - pads[i + 2] for i in range(2)]
    qmax = [-(-out[i] // s[i]) for i in range(2)]
    # weight (c, m/g, kh, kw) -> (m, c/g, kh, kw), not flipped: each phase slices its taps in reverse
    w5 = emit_reshape(im, w, (g, c // g, mg, k[0], k[1]))
    w5 = im.emit("transpose", [w5], {"axes": [0, 2, 1, 3, 4]}, node.name + "_wT")
    w4 = emit_reshape(im, w5, (g * mg, c // g, k[0], k[1]))
    has_bias = len(ins) > 2 and bool(ins[2])
    bias = emit_reshape(im, ins[2], (1, g * mg, 1, 1)) if has_bias else None
    phases = []
    for a0 in range(s[0]):
        for a1 in range(s[1]):
            begin, end, step, conv_pads = [0, 0], [g * mg, c // g], [1, 1], [0, 0, 0, 0]
            for i, ai in enumerate((a0, a1)):
                k0, ci = (ai + pads[i]) % s[i], (ai + pads[i]) // s[i]
                taps = -(-(k[i] - k0) // s[i])
                last = k0 + s[i] * (taps - 1)
                begin.append(last)
                end.append(k0 - 1)
                step.append(-s[i])
                conv_pads[i] = taps - 1 - ci                                   # may be negative: cropped
                conv_pads[i + 2] = qmax[i] - xshape[2 + i] - conv_pads[i] + taps - 1
            wp = im.emit("strided_slice", [w4], {"begin": begin, "end": end, "step": step},
                         node.name + "_w%d%d" % (a0, a1))
            xp = x
            if any(p < 0 for p in conv_pads):     # conv2d takes non-negative pads: crop (and pad) first
                xp = im.emit("pad", [x], {"pads": [0, 0, conv_pads[0], conv_pads[1], 0, 0, conv_pads[2],
                                                   conv_pads[3]], "value": 0.0, "mode": "constant"},
                             node.name + "_crop%d%d" % (a0, a1))
                conv_pads = [0, 0, 0, 0]
            y = im.emit("conv2d", [xp, wp], {"strides": [1, 1], "dilations": [1, 1],
                                             "pads": [conv_pads[0], conv_pads[1], conv_pads[2], conv_pads[3]],
                                             "groups": g}, node.name + "_phase%d%d" % (a0, a1))
            if bias is not None:
                y = im.emit("add", [y, bias], {}, node.name + "_bias%d%d" % (a0, a1))
            phases.append(y)
    # phase-major along the batch axis: (s0*s1*n, m, q0, q1), a view concat the convs write into directly
    stacked = im.emit("concat", phases, {"axis": 0}, node.name + "_phases") if len(phases) > 1 else phases[0]
    six = emit_reshape(im, stacked, (s[0], s[1], n, g * mg, qmax[0], qmax[1]))
    inter = im.emit("transpose", [six], {"axes": [2, 3, 4, 0, 5, 1]}, node.name + "_interleave")
    full = emit_reshape(im, inter, (n, g * mg, qmax[0] * s[0], qmax[1] * s[1]))
    if list(out) != [qmax[0] * s[0], qmax[1] * s[1]]:
        full = im.emit("strided_slice", [full], {"begin": [0, 0, 0, 0], "end": [n, g * mg, out[0], out[1]],
                                                 "step": [1, 1, 1, 1]}, node.name + "_crop")
    if nd == 1:
        emit_reshape(im, full, (n, g * mg, out[1]), node.name + "_squeeze", node.output[0])
    else:
        emit_reshape(im, full, (n, g * mg, out[0], out[1]), node.name + "out", node.output[0])


def _conv_transpose3d(im, node, ins, k, s, d, pads, out_pad, g: int, mg: int) -> None:
    """A 3-D transposed conv as the 3-D conv of the zero-inserted, padded input with the flipped, transposed
    weight (the definition; the 2-D path's per-phase split would save the multiplications by the zeros)."""
    x, w = ins[0], ins[1]
    n, c, depth, h, wd = im.type(x).shape
    bias = ins[2] if len(ins) > 2 and ins[2] else None
    if g == 1 and list(k) == list(s) and list(d) == [1, 1, 1]:
        _conv_transpose3d_blocks(im, node, x, w, k, pads, out_pad, mg, bias)
        return
    if any(si > 1 for si in s):     # (n, c, D, 1, H, 1, W, 1) padded to strides, flattened, the tail cropped
        x8 = emit_reshape(im, x, (n, c, depth, 1, h, 1, wd, 1))
        x8 = im.emit("pad", [x8], {"pads": [0] * 8 + [0, 0, 0, s[0] - 1, 0, s[1] - 1, 0, s[2] - 1], "value": 0.0,
                                   "mode": "constant"}, node.name + "_dilate")
        x = emit_reshape(im, x8, (n, c, depth * s[0], h * s[1], wd * s[2]))
    begin = [d[i] * (k[i] - 1) - pads[i] for i in range(3)]
    end = [d[i] * (k[i] - 1) - pads[i + 3] + out_pad[i] - (s[i] - 1) for i in range(3)]
    if any(begin) or any(end):
        x = im.emit("pad", [x], {"pads": [0, 0] + begin + [0, 0] + end, "value": 0.0, "mode": "constant"},
                    node.name + "_pad")
    # weight (c, m/g, kd, kh, kw) -> (g, m/g, c/g, kd, kh, kw) -> (m, c/g, kd, kh, kw), flipped in space
    w6 = emit_reshape(im, w, (g, c // g, mg) + tuple(k))
    w6 = im.emit("transpose", [w6], {"axes": [0, 2, 1, 3, 4, 5]}, node.name + "_wT")
    w5 = emit_reshape(im, w6, (g * mg, c // g) + tuple(k))
    w5 = im.emit("strided_slice", [w5], {"begin": [0, 0] + [ki - 1 for ki in k], "end": [g * mg, c // g, -1, -1, -1],
                                         "step": [1, 1, -1, -1, -1]}, node.name + "_wflip")
    _conv3d(im, node.name, x, w5, [1, 1, 1], d, [0] * 6, g, bias, node_output(node))


def _conv_transpose3d_blocks(im, node, x: str, w: str, k, pads, out_pad, m: int, bias) -> None:
    """A 3-D transposed conv whose kernel equals its stride (a U-Net's 2x2x2 upsampling): each input voxel writes
    its own block of the output, so it is one dense (channels -> m * block voxels) and a depth-to-space move; the
    pads crop it and the output padding adds planes that get the bias alone."""
    n, c, depth, h, wd = im.type(x).shape
    block = int(np.prod(k))
    rows = im.emit("transpose", [x], {"axes": [0, 2, 3, 4, 1]}, node.name + "_voxels")
    rows = emit_reshape(im, rows, (n * depth * h * wd, c))
    wt = im.emit("transpose", [emit_reshape(im, w, (c, m * block))], {"axes": [1, 0]}, node.name + "_wT")
    y = im.emit("dense", [rows, wt], {}, node.name + "_blocks")
    y = emit_reshape(im, y, (n, depth, h, wd, m, k[0], k[1], k[2]))
    y = im.emit("transpose", [y], {"axes": [0, 4, 1, 5, 2, 6, 3, 7]}, node.name + "_to_space")
    y = emit_reshape(im, y, (n, m, depth * k[0], h * k[1], wd * k[2]))
    edges = [-p for p in pads[:3]] + [out_pad[i] - pads[i + 3] for i in range(3)]
    last = bias is None
    if any(edges):
        y = im.emit("pad", [y], {"pads": [0, 0] + edges[:3] + [0, 0] + edges[3:], "value": 0.0, "mode": "constant"},
                    node.name + ("" if last else "_crop"), node_output(node) if last else None)
    elif last:
        emit_reshape(im, y, (n, m, depth * k[0], h * k[1], wd * k[2]), node.name + "_out", node.output[0])
    if not last:
        b = emit_reshape(im, bias, (1, m, 1, 1, 1))
        im.emit("add", [y, b], {}, node.name + "_bias", node_output(node))


@CONVERTERS.register("ConvTranspose")
def _conv_transpose(im, node, ins, a):
    xt, wt = im.type(ins[0]), im.type(ins[1])
    if xt.dtype != "float32":
        raise UnsupportedOpError("node %s: ConvTranspose on %s tensors (float32 only)" % (node.name, xt.dtype))
    nd = len(xt.shape) - 2
    if nd not in (1, 2, 3):
        raise UnsupportedOpError("node %s: %d-D ConvTranspose (only 1-D, 2-D and 3-D)" % (node.name, nd))
    g = int(a.get("group", 1))
    n, c = xt.shape[:2]
    cin, mg = wt.shape[:2]
    k = list(a.get("kernel_shape", wt.shape[2:]))
    s = list(a.get("strides", [1] * nd))
    d = list(a.get("dilations", [1] * nd))
    out_pad = list(a.get("output_padding", [0] * nd))
    if cin != c or c % g or list(wt.shape[2:]) != k:
        raise UnsupportedOpError("node %s: ConvTranspose weight %s for input %s, group %d, kernel %s"
                                 % (node.name, wt.shape, xt.shape, g, k))
    pads = _conv_transpose_pads(node, a, list(xt.shape[2:]), k, s, d, out_pad)
    x, w = ins[0], ins[1]
    in_sp = list(xt.shape[2:])
    if nd == 3:
        _conv_transpose3d(im, node, ins, k, s, d, pads, out_pad, g, mg)
        return
    if nd == 1:     # as 2-D over a height of one
        x = emit_reshape(im, x, (n, c, 1, in_sp[0]))
        w = emit_reshape(im, w, (cin, mg, 1, k[0]))
        in_sp, k, s, d, out_pad = [1] + in_sp, [1] + k, [1] + s, [1] + d, [0] + out_pad
        pads = [0, pads[0], 0, pads[1]]
    h, wd = in_sp
    if (s[0] > 1 or s[1] > 1) and d == [1, 1] and all(k[i] >= s[i] for i in range(2)):
        _conv_transpose_phases(im, node, ins, x, w, (n, c, h, wd), k, s, pads, out_pad, g, mg, nd)
        return
    # zeros between elements: (n, c, h, 1, w, 1) padded to (n, c, h, s0, w, s1), flattened, the tail cropped
    if s[0] > 1 or s[1] > 1:
        x6 = emit_reshape(im, x, (n, c, h, 1, wd, 1))
        x6 = im.emit("pad", [x6], {"pads": [0] * 6 + [0, 0, 0, s[0] - 1, 0, s[1] - 1], "value": 0.0,
                                   "mode": "constant"}, node.name + "_dilate")
        x = emit_reshape(im, x6, (n, c, h * s[0], wd * s[1]))
    crop = [s[0] - 1, s[1] - 1]
    begin = [d[i] * (k[i] - 1) - pads[i] for i in range(2)]
    end = [d[i] * (k[i] - 1) - pads[i + 2] + out_pad[i] - crop[i] for i in range(2)]
    if any(begin) or any(end):
        x = im.emit("pad", [x], {"pads": [0, 0] + begin + [0, 0] + end, "value": 0.0, "mode": "constant"},
                    node.name + "_pad")
    # weight (c, m/g, kh, kw) -> (g, c/g, m/g, kh, kw) -> (g, m/g, c/g, kh, kw) -> (m, c/g, kh, kw), flipped
    w5 = emit_reshape(im, w, (g, c // g, mg, k[0], k[1]))
    w5 = im.emit("transpose", [w5], {"axes": [0, 2, 1, 3, 4]}, node.name + "_wT")
    w4 = emit_reshape(im, w5, (g * mg, c // g, k[0], k[1]))
    w4 = im.emit("strided_slice", [w4], {"begin": [0, 0, k[0] - 1, k[1] - 1], "end": [g * mg, c // g, -1, -1],
                                         "step": [1, 1, -1, -1]}, node.name + "_wflip")
    attrs = {"strides": [1, 1], "dilations": d, "pads": [0, 0, 0, 0], "groups": g}
    has_bias = len(ins) > 2 and bool(ins[2])
    final = node_output(node) if nd == 2 and not has_bias else None
    y = im.emit("conv2d", [x, w4], attrs, node.name, final)
    if has_bias:
        b = emit_reshape(im, ins[2], (1, g * mg, 1, 1))
        y = im.emit("add", [y, b], {}, node.name + "_bias", node_output(node) if nd == 2 else None)
    if nd == 1:
        t = im.type(y)
        emit_reshape(im, y, (t.shape[0], t.shape[1], t.shape[3]), node.name + "_squeeze", node.output[0])


# ---------------------------------------------------------------- index-driven ops: Gather (general),
# GatherElements, GatherND, OneHot, Trilu, EyeLike, DepthToSpace, SpaceToDepth
