"""Max pooling of channels-last activations: ``max_pool2d_nhwc``, for the int8 values graph/passes/int8_layout.py
keeps channels last (resnet50's max pool between its stem conv and its first block) and the float ones of
graph/passes/float_layout.py.

The maximum of integers is exact in the integers themselves, so the pool runs on the bytes (the QDQ form's
float32 detour, ``cast -> max_pool -> cast``, gives the same values): ``x (1, H, W, C)`` -> ``(1, OH, OW, C)``,
the padding read as the dtype's lowest value (never the maximum: every window holds one pixel of the image), the
vector along the channels, the window's taps unrolled.
"""
from __future__ import annotations

import numpy as np

from tether import te

from . import common as c
from . import schedules
from .conv import output_geometry
from .qnn import RANGES
from .qdepthwise_nhwc import channel_vector
from .schedules import axis_extent, numel

QMAX_POOL_NHWC = "qmax_pool_nhwc"     # the tag of the pool stage (its schedule: below)


def max_pool2d_nhwc(x, kernel, stride, padding, name: str = "max_pool2d_nhwc"):
    """x (1, H, W, C) uint8/int8, float32 or float16 -> (1, OH, OW, C): the maximum over each kernel window (no
    dilation). Float pools are the channels-last ones of graph/passes/float_layout.py."""
    n, h, wd, ch = c.shape_of(x)
    dtype = str(x.dtype)
    if dtype not in ("uint8", "int8", "float32", "float16"):
        raise ValueError("%s: activations must be uint8, int8, float32 or float16, got %s" % (name, dtype))
    kh, kw = kernel
    sh, sw, _, _, p4, oh, ow = output_geometry(h, wd, kh, kw, stride, padding, 1, name)
    top, left = p4[0], p4[1]
    lowest = c.const(RANGES[dtype][0] if dtype in RANGES else float(np.finfo(dtype).min), dtype)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def tap(b, y, xx, q):
        yy, xc = y * sh + ry - top, xx * sw + rx - left
        v = x[b, c.clamp_index(yy, h), c.clamp_index(xc, wd), q]
        return te.if_then_else(c.all_of([yy >= 0, yy < h, xc >= 0, xc < wd]), v, lowest) if any(p4) else v

    return c.compute((n, oh, ow, ch), lambda b, y, xx, q: te.max(tap(b, y, xx, q), axis=[ry, rx]), name,
                     QMAX_POOL_NHWC)


def schedule_qmax_pool_nhwc(s, t, fam, ctx) -> None:
    """Output rows parallel; per output pixel the window's taps unrolled over vectors of channels."""
    st = s[t]
    b, y, x, q = t.op.axis
    lanes = fam.lanes * (4 if str(t.dtype) in ("uint8", "int8") else 1)    # bytes: four per float32 lane
    # (a float16 kernel's family counts its lanes in halves already: schedules.family_of)
    qo, qi = st.split(q, factor=channel_vector(fam, int(t.shape[3]), lanes))
    rd = list(t.op.reduce_axis)
    st.reorder(b, y, x, qo, *rd, qi)
    for r in rd:
        if axis_extent(r) <= fam.window_unroll:
            st.unroll(r)
    st.vectorize(qi)
    if numel(t) >= fam.parallel_min:
        st.parallel(st.fuse(b, y))


schedules._BY_TAG[QMAX_POOL_NHWC] = schedule_qmax_pool_nhwc
