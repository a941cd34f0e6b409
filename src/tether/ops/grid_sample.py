"""ONNX GridSample: sample X (N, C, *spatial) at the normalised positions of a grid (N, *out, nd), for 2-D and 3-D
spatial shapes; modes nearest, linear (bilinear/trilinear) and cubic (bicubic, 2-D), padding modes zeros, border
and reflection, align_corners; the semantics of ONNX's reference (PyTorch's grid_sample).

The algorithm is written once over a small backend (``TeBackend`` builds te expressions for the kernel,
``_NumpyBackend`` evaluates arrays for constant folding), so the kernel and its numpy meaning cannot drift apart.
Interpolation is nested like the reference: the innermost spatial axis first.
"""
from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

from tether import te

from . import common as c

MODES = ("nearest", "linear", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")
_CUBIC_A = -0.75
COORDS = "grid_sample_coords"     # a tag of its own: not injective, so the scheduler keeps it a separate stage


def _cubic_weights(B, f) -> List[Any]:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for a fraction f in [0, 1)."""
    a = _CUBIC_A
    K = B.K
    x1, x2, x3 = f + K(1.0), K(1.0) - f, K(2.0) - f
    return [((K(a) * x1 - K(5 * a)) * x1 + K(8 * a)) * x1 - K(4 * a),
            ((K(a + 2) * f - K(a + 3)) * f) * f + K(1.0),
            ((K(a + 2) * x2 - K(a + 3)) * x2) * x2 + K(1.0),
            ((K(a) * x3 - K(5 * a)) * x3 + K(8 * a)) * x3 - K(4 * a)]


def _reflect(B, x, lo: float, hi: float):
    """Reflect x by the near border until it lies in [lo, hi] (the reference's _gs_reflect)."""
    K = B.K
    rng = hi - lo
    if rng == 0:
        return B.where(x == x, K(lo), K(lo))
    below = x < K(lo)
    dx = B.where(below, K(lo) - x, x - K(hi))
    n = B.floor(dx / K(rng))
    r = dx - n * K(rng)
    even = (n - K(2.0) * B.floor(n * K(0.5))) == K(0.0)
    inside_below = B.where(even, K(lo) + r, K(hi) - r)
    inside_above = B.where(even, K(hi) - r, K(lo) + r)
    return B.where(below, inside_below, B.where(x > K(hi), inside_above, x))


def _rint(B, v):
    """Round half to even (PyTorch's nearest)."""
    K = B.K
    r = B.floor(v + K(0.5))
    odd = (r - K(2.0) * B.floor(r * K(0.5))) != K(0.0)
    return B.where(((r - v) == K(0.5)) & odd, r - K(1.0), r)


def coordinates(B, g: Sequence[Any], dims: Sequence[int], mode: str, padding: str, align: bool) -> List[Any]:
    """The sampling position in input pixels along each spatial axis (d = 0 the outermost), from the normalised
    grid coordinates g[d]: rounded for nearest, moved into the borders for border/reflection padding."""
    K = B.K
    coords = []
    for d, size in enumerate(dims):
        v = g[d]
        v = ((v + K(1.0)) / K(2.0)) * K(size - 1.0) if align else ((v + K(1.0)) * K(float(size)) - K(1.0)) / K(2.0)
        if mode == "nearest":
            v = _rint(B, v)
        lo, hi = _bounds(size, align)
        # cubic clamps or reflects each tap, not the coordinate (PyTorch and onnxruntime; ONNX's reference also
        # moves the coordinate, which differs just outside the border)
        if padding != "zeros" and mode != "cubic":
            adj = B.clampf(v, 0.0, size - 1.0) if padding == "border" else _reflect(B, v, lo, hi)
            v = B.where((v < K(lo)) | (v > K(hi)), adj, v)
        coords.append(v)
    return coords


def _bounds(size: int, align: bool):
    return (0.0, size - 1.0) if align else (-0.5, size - 0.5)


def interpolate(B, coords: Sequence[Any], dims: Sequence[int], mode: str, padding: str, align: bool):
    """The value at the positions ``coords`` (from ``coordinates``)."""
    K = B.K

    def fetch(idx):
        valid = None
        ci = []
        for d, i in enumerate(idx):
            size = dims[d]
            if padding == "zeros":
                ok = (i >= B.I(0)) & (i < B.I(size))
                valid = ok if valid is None else valid & ok
            elif padding == "reflection":
                i = B.to_int(_reflect(B, B.to_float(i), *_bounds(size, align)))
            ci.append(B.clampi(i, size))
        v = B.load(ci)
        return v if valid is None else B.where(valid, v, K(0.0))

    if mode == "nearest":
        return fetch([B.to_int(v) for v in coords])
    taps = []
    for v in coords:
        i0 = B.floor(v)
        f = v - i0
        i0 = B.to_int(i0)
        if mode == "linear":
            taps.append([(i0, K(1.0) - f), (i0 + B.I(1), f)])
        else:
            taps.append([(i0 + B.I(k - 1), w) for k, w in enumerate(_cubic_weights(B, f))])

    def interp(d, prefix):
        if d == len(coords):
            return fetch(prefix)
        total = None
        for i, w in taps[d]:
            term = w * interp(d + 1, prefix + [i])
            total = term if total is None else total + term
        return total
    # nest with the innermost axis interpolated first, as the reference does
    return interp(0, [])


class TeBackend:
    """The te backend of ``interpolate``: constants, selects and clamps as te expressions (deform_conv uses it too)."""

    def __init__(self, x, n, ch, dtype: str) -> None:
        self.x, self.n, self.ch, self.dtype = x, n, ch, dtype

    def K(self, v):
        return c.const(float(v), self.dtype)

    def I(self, v):     # noqa: E743 - an integer constant
        return c.const(int(v), "int32")

    where = staticmethod(te.if_then_else)
    floor = staticmethod(te.floor)

    def to_int(self, v):
        return te.cast(v, "int32")

    def to_float(self, i):
        return te.cast(i, self.dtype)

    def clampi(self, i, size: int):
        return c.max2(c.min2(i, self.I(size - 1)), self.I(0))

    def clampf(self, v, lo: float, hi: float):
        return c.max2(c.min2(v, self.K(hi)), self.K(lo))

    def load(self, ci):
        return self.x[(self.n, self.ch) + tuple(ci)]


def grid_sample(x, grid, mode: str = "linear", padding_mode: str = "zeros", align_corners: bool = False,
                name: str = "grid_sample"):
    xs, gs = c.shape_of(x), c.shape_of(grid)
    nd = len(xs) - 2
    if mode not in MODES or padding_mode not in PADDING_MODES or nd not in (2, 3) or gs[-1] != nd \
            or len(gs) != nd + 2 or gs[0] != xs[0] or (mode == "cubic" and nd != 2):
        raise ValueError("grid_sample: mode %r, padding %r, X %s, grid %s" % (mode, padding_mode, xs, gs))
    dims = xs[2:]

    # the positions are a stage of their own (one per axis), so the kernel's taps load them instead of repeating
    # the whole coordinate expression in every tap (which made 3-D reflection take minutes to compile)
    def coord_stage(d):
        def f(*idx):
            B = TeBackend(x, None, None, x.dtype)
            g = [grid[tuple(idx) + (nd - 1 - k,)] for k in range(nd)]    # the grid lists x (innermost) first
            return coordinates(B, g, dims, mode, padding_mode, align_corners)[d]
        return c.compute((gs[0],) + tuple(gs[1:-1]), f, "%s_pos%d" % (name, d), COORDS)
    pos = [coord_stage(d) for d in range(nd)]

    def f(*idx):
        n, ch, o = idx[0], idx[1], idx[2:]
        B = TeBackend(x, n, ch, x.dtype)
        return interpolate(B, [p[(n,) + tuple(o)] for p in pos], dims, mode, padding_mode, align_corners)
    return c.compute((xs[0], xs[1]) + tuple(gs[1:-1]), f, name, c.INJECTIVE)


class _NumpyBackend:
    def __init__(self, x: np.ndarray, out_ndim: int) -> None:
        self.x = x
        self.dtype = x.dtype
        shape = [1] * (2 + out_ndim)
        self.n = np.arange(x.shape[0]).reshape([-1] + shape[1:])
        self.ch = np.arange(x.shape[1]).reshape([1, -1] + shape[2:])

    def K(self, v):
        return self.dtype.type(v)

    def I(self, v):     # noqa: E743
        return np.int64(v)

    @staticmethod
    def where(cond, a, b):
        return np.where(cond, a, b)

    def floor(self, v):
        return np.floor(v)

    def to_int(self, v):
        return np.trunc(v).astype(np.int64)

    def to_float(self, i):
        return i.astype(self.dtype)

    def clampi(self, i, size: int):
        return np.clip(i, 0, size - 1)

    def clampf(self, v, lo: float, hi: float):
        return np.clip(v, self.K(lo), self.K(hi))

    def load(self, ci):
        return self.x[(self.n, self.ch) + tuple(ci)]


def grid_sample_np(x: np.ndarray, grid: np.ndarray, mode: str = "linear", padding_mode: str = "zeros",
                   align_corners: bool = False) -> np.ndarray:
    nd = x.ndim - 2
    B = _NumpyBackend(x, nd)
    g = [grid[:, None, ..., nd - 1 - d].astype(x.dtype) for d in range(nd)]    # (N, 1, *out)
    with np.errstate(invalid="ignore"):
        pos = coordinates(B, g, x.shape[2:], mode, padding_mode, align_corners)
        y = interpolate(B, pos, x.shape[2:], mode, padding_mode, align_corners)
    return np.broadcast_to(y, (x.shape[0], x.shape[1]) + grid.shape[1:-1]).astype(x.dtype)
