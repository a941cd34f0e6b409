"""Pooling over NCHW: 2-D max, average (count_include_pad either way, ceil_mode), global average / max; N-D
max / average (``pool_nd``)."""
from __future__ import annotations

import numpy as np

from tether import te

from . import common as c
from .shape import pad
from .window import padded_reader

# Padding value for max pooling: the lowest float32, not -inf, so a window never yields inf arithmetic.
_LOWEST = float(np.finfo(np.float32).min)


def _pool_geometry(size: int, k: int, s: int, lo: int, hi: int, d: int, ceil_mode: bool) -> tuple:
    """(output extent, extra high padding the padded input needs so every window is in bounds)."""
    eff = (k - 1) * d + 1
    span = size + lo + hi - eff
    if span < 0:
        raise ValueError(f"pool window {k} (dilation {d}) does not fit extent {size} with padding {lo}/{hi}")
    out = (-(-span // s) if ceil_mode else span // s) + 1
    # PyTorch/ONNX rule: the last window must start inside the input or the low padding
    if ceil_mode and (out - 1) * s >= size + lo:
        out -= 1
    need = (out - 1) * s + eff
    return out, max(hi, need - size - lo)


# An unpadded pool with a column stride up to this reads the input directly: the code generator loads a vector of
# output columns' taps as the span they cover and shuffles the lanes out (codegen/expr.py strided_load). The
# column-phase copy it made before (ops.window.padded_reader) was a scalar pass over the input, its index clamped
# per element: 3x3 s2 max pools at 2.6x onnxruntime's time (squeezenet's 0.32 ms -> 0.23, alexnet's 0.34 ->
# 0.07, vgg19's 2x2 s2 2.2 -> 0.8, densenet121's 2x2 s2 average pools 0.48 -> 0.06). Wider strides would gather
# per lane, so they keep the phases; so do padded pools (read through a padded copy and the stride, resnet50's
# 3x3 s2 pad 1 max pool measured the same as its per-channel phases: 0.21 ms against 0.20).
STRIDED_READ_MAX = 4


def window_setup(x, kernel, stride, padding, dilation, ceil_mode, fill, name):
    """``(read, geo)`` of a 2-D pooling window over NCHW ``x``: ``read(b, c, row, xx, rx)`` reads the input padded
    with ``fill`` at input row ``row`` and column tap ``rx`` of output column ``xx`` (ops.window.padded_reader), and
    ``geo`` holds the window's sizes, strides, dilations, pads and output extent."""
    n, ch, h, w = c.shape_of(x)
    kh, kw = c.to_pair(kernel, "kernel")
    sh, sw = c.to_pair(kernel if stride is None else stride, "stride")
    dh, dw = c.to_pair(dilation, "dilation")
    top, left, bottom, right = c.to_padding4(padding)
    oh, extra_b = _pool_geometry(h, kh, sh, top, bottom, dh, ceil_mode)
    ow, extra_r = _pool_geometry(w, kw, sw, left, right, dw, ceil_mode)
    if top or left or extra_b or extra_r or sw > STRIDED_READ_MAX:
        read = padded_reader(x, (top, left, extra_b, extra_r), sw, dw, kw, ow, name, fill)
    else:
        # (a stride: the input read directly, each vector of output columns' taps one load and a shuffle)
        def read(b, cc, row, xx, rx):
            return x[b, cc, row, xx * sw + rx * dw]
    geo = dict(n=n, ch=ch, h=h, w=w, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw, top=top, left=left,
               bottom=bottom, right=right, oh=oh, ow=ow)
    return read, geo


def max_pool2d(x, kernel, stride=None, padding=0, dilation=1, ceil_mode: bool = False, name: str = "max_pool2d"):
    # the padding is the dtype's lowest value: float32's lowest does not convert to an integer type (an int8 max
    # pool padded with it read 0 there, above every negative value)
    dtype = str(x.dtype)
    fill = (float(np.finfo(np.float16).min) if dtype == "float16" else _LOWEST if dtype.startswith("float")
            else int(np.iinfo(dtype).min))    # (float16: float32's lowest would round to -inf)
    read, g = window_setup(x, kernel, stride, padding, dilation, ceil_mode, fill, name)
    ry = te.reduce_axis((0, g["kh"]), name="ry")
    rx = te.reduce_axis((0, g["kw"]), name="rx")
    return c.compute((g["n"], g["ch"], g["oh"], g["ow"]),
                     lambda b, o, y, xx: te.max(read(b, o, y * g["sh"] + ry * g["dh"], xx, rx), axis=[ry, rx]),
                     name, c.POOL)


def _window_counts(out: int, k: int, s: int, d: int, lo: int, hi: int) -> np.ndarray:
    """How many taps of each output position's window fall in [lo, hi) of the (unpadded) coordinate."""
    start = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d
    return ((start >= lo) & (start < hi)).sum(axis=1)


def avg_pool2d(x, kernel, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               count_include_pad: bool = False, name: str = "avg_pool2d"):
    """Average pooling; the divisor counts the taps inside the input (or inside input + padding when
    `count_include_pad`), never the extra taps ceil_mode adds past the padding."""
    read, g = window_setup(x, kernel, stride, padding, dilation, ceil_mode, 0.0, name)
    # window tap coordinates are in padded space: input occupies [top, top + h)
    if count_include_pad:
        ch_ = _window_counts(g["oh"], g["kh"], g["sh"], g["dh"], 0, g["top"] + g["h"] + g["bottom"])
        cw_ = _window_counts(g["ow"], g["kw"], g["sw"], g["dw"], 0, g["left"] + g["w"] + g["right"])
    else:
        ch_ = _window_counts(g["oh"], g["kh"], g["sh"], g["dh"], g["top"], g["top"] + g["h"])
        cw_ = _window_counts(g["ow"], g["kw"], g["sw"], g["dw"], g["left"], g["left"] + g["w"])
    ry = te.reduce_axis((0, g["kh"]), name="ry")
    rx = te.reduce_axis((0, g["kw"]), name="rx")
    win = c.compute((g["n"], g["ch"], g["oh"], g["ow"]),
                    lambda b, o, y, xx: te.sum(read(b, o, y * g["sh"] + ry * g["dh"], xx, rx), axis=[ry, rx]),
                    f"{name}_sum", c.POOL)
    uniform = len(set(ch_.tolist())) == 1 and len(set(cw_.tolist())) == 1
    if uniform:
        inv = c.const(1.0 / float(ch_[0] * cw_[0]), x.dtype)
        return c.compute(win.shape, lambda b, o, y, xx: win[b, o, y, xx] * inv, name, c.ELEMWISE)
    # divisors differ only near the borders: build 1/count from two small per-axis tables of constants
    inv_h, inv_w = _const_table(1.0 / ch_, x.dtype), _const_table(1.0 / cw_, x.dtype)
    return c.compute(win.shape, lambda b, o, y, xx: win[b, o, y, xx] * inv_h(y) * inv_w(xx), name, c.BROADCAST)


def _const_table(values: np.ndarray, dtype: str):
    """idx -> expression selecting values[idx]: a run-length chain of selects (tables are short)."""
    vals = [float(v) for v in values]
    runs = []  # (end, value)
    for i, v in enumerate(vals):
        if runs and runs[-1][1] == v:
            runs[-1] = (i + 1, v)
        else:
            runs.append((i + 1, v))

    def f(i):
        expr = c.const(runs[-1][1], dtype)
        for end, v in reversed(runs[:-1]):
            expr = te.if_then_else(i < end, c.const(v, dtype), expr)
        return expr

    return f


def pool_nd(x, kind: str, kernel, strides, dilations, pads, ceil_mode: bool = False,
            count_include_pad: bool = False):
    """N-D max (``kind`` "max") or average ("avg") pooling over the axes after the first two, written directly in
    te; ``pads``: the low pads of every spatial axis, then the high ones. The same divisor rule as avg_pool2d."""
    shape = c.shape_of(x)
    nd = len(shape) - 2
    k, s, d, p = kernel, strides, dilations, pads
    geometry = [_pool_geometry(shape[2 + i], k[i], s[i], p[i], p[i + nd], d[i], ceil_mode) for i in range(nd)]
    outs = [g[0] for g in geometry]
    hi = [g[1] for g in geometry]
    fill = _LOWEST if kind == "max" else 0.0
    xp = pad(x, [0, 0] + list(p[:nd]), [0, 0] + hi, fill) if any(p[:nd]) or any(hi) else x
    rs = [te.reduce_axis((0, k[i]), name="r%d" % i) for i in range(nd)]

    def f(*idx):
        src = tuple(idx[:2]) + tuple(idx[2 + i] * s[i] + rs[i] * d[i] for i in range(nd))
        return te.max(xp[src], axis=rs) if kind == "max" else te.sum(xp[src], axis=rs)
    win = c.compute(tuple(shape[:2]) + tuple(outs), f, kind + "_pool", c.REDUCE)
    if kind == "max":
        return win
    tables = []
    for i in range(nd):
        lo_ = 0 if count_include_pad else p[i]
        hi_ = (p[i] + shape[2 + i] + p[i + nd]) if count_include_pad else p[i] + shape[2 + i]
        tables.append(_const_table(1.0 / _window_counts(outs[i], k[i], s[i], d[i], lo_, hi_), x.dtype))

    def g(*idx):
        v = win[idx]
        for i in range(nd):
            v = v * tables[i](idx[2 + i])
        return v
    return c.compute(win.shape, g, "avg_pool", c.BROADCAST)


def _global(x, kind: str, name: str):
    n, ch, h, w = c.shape_of(x)
    ry = te.reduce_axis((0, h), name="ry")
    rx = te.reduce_axis((0, w), name="rx")
    if kind == "max":
        return c.compute((n, ch, 1, 1), lambda b, o, _y, _x: te.max(x[b, o, ry, rx], axis=[ry, rx]), name,
                         c.GLOBAL_POOL)
    inv = c.const(1.0 / (h * w), x.dtype)
    return c.compute((n, ch, 1, 1), lambda b, o, _y, _x: te.sum(x[b, o, ry, rx] * inv, axis=[ry, rx]), name,
                     c.GLOBAL_POOL)


def global_avg_pool2d(x, name: str = "global_avg_pool2d"):
    return _global(x, "avg", name)


def global_max_pool2d(x, name: str = "global_max_pool2d"):
    return _global(x, "max", name)
