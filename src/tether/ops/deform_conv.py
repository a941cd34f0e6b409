"""ONNX DeformConv (2-D): a convolution whose every kernel tap samples the input at its regular position plus a
learned offset (bilinear, zero outside the image), optionally scaled by a mask; torchvision's deform_conv2d.
One reduce stage over (input channel of the group, kh, kw); the sampling is grid_sample's linear interpolation
with zeros padding on pixel coordinates."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tether import te

from . import common as c
from .grid_sample import TeBackend, interpolate


def _geometry(xs, ws, offs, strides, pads, dilations, group, offset_group):
    n, cin, h, w = xs
    oc, icpg, kh, kw = ws
    if cin != icpg * group or oc % group or cin % offset_group or offs[1] != offset_group * 2 * kh * kw:
        raise ValueError("deform_conv: X %s, W %s, offset %s, group %d, offset_group %d"
                         % (xs, ws, offs, group, offset_group))
    return n, cin, h, w, oc, icpg, kh, kw


def deform_conv2d(x, weight, offset, mask=None, bias=None, strides: Sequence[int] = (1, 1),
                  pads: Sequence[int] = (0, 0, 0, 0), dilations: Sequence[int] = (1, 1), group: int = 1,
                  offset_group: int = 1, name: str = "deform_conv2d"):
    xs, ws, offs = c.shape_of(x), c.shape_of(weight), c.shape_of(offset)
    n, cin, h, w, oc, icpg, kh, kw = _geometry(xs, ws, offs, strides, pads, dilations, group, offset_group)
    oh, ow = offs[2], offs[3]
    ocpg, icpog = oc // group, cin // offset_group
    ric = te.reduce_axis((0, icpg), name="ric")
    rkh = te.reduce_axis((0, kh), name="rkh")
    rkw = te.reduce_axis((0, kw), name="rkw")
    dt = x.dtype

    def f(b, o, i, j):
        ic = (o // ocpg) * icpg + ric
        og = ic // icpog
        k = rkh * kw + rkw
        dh = offset[b, og * (2 * kh * kw) + k * 2, i, j]
        dw = offset[b, og * (2 * kh * kw) + k * 2 + 1, i, j]
        ph = te.cast(i * strides[0] - pads[0] + rkh * dilations[0], dt) + dh
        pw = te.cast(j * strides[1] - pads[1] + rkw * dilations[1], dt) + dw
        v = interpolate(TeBackend(x, b, ic, dt), [ph, pw], (h, w), "linear", "zeros", True)
        term = weight[o, ric, rkh, rkw] * v
        if mask is not None:
            term = term * mask[b, og * (kh * kw) + k, i, j]
        return te.sum(term, axis=[ric, rkh, rkw])
    out = c.compute((n, oc, oh, ow), f, name, c.REDUCE)
    if bias is None:
        return out
    return c.compute((n, oc, oh, ow), lambda b, o, i, j: out[b, o, i, j] + bias[o], name + "_bias", c.BROADCAST)


def _bilinear_zeros(img: np.ndarray, ph: np.ndarray, pw: np.ndarray) -> np.ndarray:
    """img (C, H, W) sampled at (ph, pw) arrays: (C, *ph.shape), zero outside."""
    h, w = img.shape[1:]
    h0, w0 = np.floor(ph).astype(np.int64), np.floor(pw).astype(np.int64)
    fh, fw = ph - h0, pw - w0
    out = np.zeros((img.shape[0],) + ph.shape, np.float64)
    for dh, wh in ((0, 1 - fh), (1, fh)):
        for dw, ww in ((0, 1 - fw), (1, fw)):
            hh, ww_ = h0 + dh, w0 + dw
            ok = (hh >= 0) & (hh < h) & (ww_ >= 0) & (ww_ < w)
            v = img[:, np.clip(hh, 0, h - 1), np.clip(ww_, 0, w - 1)]
            out += np.where(ok, v * (wh * ww), 0.0)
    return out


def deform_conv2d_np(x: np.ndarray, weight: np.ndarray, offset: np.ndarray, mask: Optional[np.ndarray] = None,
                     bias: Optional[np.ndarray] = None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
                     group: int = 1, offset_group: int = 1) -> np.ndarray:
    n, cin, h, w, oc, icpg, kh, kw = _geometry(x.shape, weight.shape, offset.shape, strides, pads, dilations, group,
                                               offset_group)
    oh, ow = offset.shape[2:]
    icpog = cin // offset_group
    base_h = (np.arange(oh) * strides[0] - pads[0])[:, None]
    base_w = (np.arange(ow) * strides[1] - pads[1])[None, :]
    cols = np.zeros((n, cin, kh, kw, oh, ow))
    for b in range(n):
        for g in range(offset_group):
            for a in range(kh):
                for e in range(kw):
                    k = a * kw + e
                    ph = base_h + a * dilations[0] + offset[b, g * 2 * kh * kw + 2 * k]
                    pw = base_w + e * dilations[1] + offset[b, g * 2 * kh * kw + 2 * k + 1]
                    v = _bilinear_zeros(x[b, g * icpog:(g + 1) * icpog].astype(np.float64), ph, pw)
                    if mask is not None:
                        v = v * mask[b, g * kh * kw + k]
                    cols[b, g * icpog:(g + 1) * icpog, a, e] = v
    out = np.zeros((n, oc, oh, ow))
    ocpg = oc // group
    for g in range(group):
        out[:, g * ocpg:(g + 1) * ocpg] = np.einsum("bcklij,ockl->boij", cols[:, g * icpg:(g + 1) * icpg],
                                                    weight[g * ocpg:(g + 1) * ocpg].astype(np.float64))
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    return out.astype(x.dtype)
