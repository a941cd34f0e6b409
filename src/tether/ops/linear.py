"""Linear algebra: matmul (X @ W), dense (X @ W.T + bias) and batch_matmul.

Large products pack the right-hand operand into panels `P[n // NR, k, n % NR]` (zero padded up to a multiple
of NR) so the micro-kernel reads B contiguously along k and never strides by a power-of-two row length, which
aliases L1 cache sets.  The panel width is fixed at 16 float32: two AVX2 vectors or four NEON vectors, a width
whose register-blocked micro-kernel fits the register file of every target family.
"""
from __future__ import annotations

from tether import te

from . import common as c

PANEL = 16
# compute attribute: the (rows, columns) register block a matmul asks for (matmul(block=)), in place of the target
# family's mm_rows x mm_cols
REGISTER_BLOCK = "register_block"
# Below this many rows of A the one-off packing pass costs more than it saves.
PACK_MIN_ROWS = 16


def should_pack(m: int, n: int) -> bool:
    """Whether an (M, K) @ (K, N) product packs its right-hand operand into panels."""
    return m >= PACK_MIN_ROWS and n >= PANEL


def _check_width(width: int) -> int:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"panel width must be a positive int, got {width!r}")
    return width


def pack_panels(b, n_axis: int, name: str, width: int = PANEL):
    """Pack a 2-D operand whose output-column axis is `n_axis` into [ceil(N/width), K, width] panels."""
    width = _check_width(width)
    shape = c.shape_of(b)
    n = shape[n_axis]
    k = shape[1 - n_axis]
    panels = -(-n // width)
    zero = c.const(0.0, b.dtype)

    def f(jo, kk, ji):
        j = jo * width + ji
        if n % width == 0:
            return b[kk, j] if n_axis == 1 else b[j, kk]
        jc = c.clamp_index(j, n)  # the select below evaluates the load even in the zero padding
        return te.if_then_else(j < n, b[kk, jc] if n_axis == 1 else b[jc, kk], zero)

    return c.compute((panels, k, width), f, name, c.MATMUL_PACK)


def pack_panels_array(w, width: int = PANEL):
    """numpy: the layout of pack_panels(w, n_axis=0, width=width) for a constant (N, K) operand, packed ahead of
    time."""
    import numpy as np

    width = _check_width(width)
    n, k = w.shape
    padded = np.zeros((-(-n // width) * width, k), w.dtype)
    padded[:n] = w
    return np.ascontiguousarray(padded.reshape(-1, width, k).transpose(0, 2, 1))


def unpack_panels_array(panels, n: int):
    """numpy: the (n, K) operand that pack_panels_array packed into `panels` (any width)."""
    import numpy as np

    count, k, width = panels.shape
    if not 0 < n <= count * width:
        raise ValueError(f"unpack_panels_array: {n} rows do not fit panels of shape {panels.shape}")
    return np.ascontiguousarray(panels.transpose(0, 2, 1).reshape(count * width, k)[:n])


# Row dot products (dense with few rows): partial sums over this many interleaved k lanes, vectorized.
ROWDOT_LANES = 16


def _rowdot(a, b, name: str):
    """C[i, j] = sum_k a[i, k] * b[j, k] for few rows i: both operands are read contiguously along k.

    A first stage keeps ROWDOT_LANES partial sums per output, P[i, j, l] = sum_ko a[i, ko*L + l] * b[j, ko*L + l]
    (vectorized over l), and a second adds them up together with the k tail that L does not divide."""
    m, k = c.shape_of(a)
    n = c.shape_of(b)[0]
    lanes = ROWDOT_LANES
    body = k - k % lanes
    ko = te.reduce_axis((0, body // lanes), name="ko")
    part = c.compute((m, n, lanes), lambda i, j, l: te.sum(a[i, ko * lanes + l] * b[j, ko * lanes + l], axis=ko),
                     f"{name}_partial", c.ROWDOT_PARTIAL)
    tail = k - body
    r = te.reduce_axis((0, lanes + tail), name="r")

    def final(i, j):
        if not tail:
            return te.sum(part[i, j, r], axis=r)
        # the select evaluates both sides, so both loads get in-bounds indices
        kt = body + te.max(r - lanes, 0)
        return te.sum(te.if_then_else(r < lanes, part[i, j, te.min(r, lanes - 1)], a[i, kt] * b[j, kt]), axis=r)

    return c.compute((m, n), final, name, c.ROWDOT_FINAL)


def _panel_product(a, p, n: int, name: str, attrs: dict | None = None):
    """C[i, j] = sum_k a[i, k] * W[j, k] with W's first n rows packed into panels p [ceil(n/width), K, width]."""
    m = c.shape_of(a)[0]
    _, k, width = c.shape_of(p)
    r = te.reduce_axis((0, k), name="k")
    npad = -(-n // width) * width
    if npad == n:
        return c.compute((m, n), lambda i, j: te.sum(a[i, r] * p[j // width, r, j % width], axis=r), name,
                         c.MATMUL, attrs=attrs)
    # A partial last panel would run its columns as a scalar tail: compute the zero-padded panel in full
    # (it is packed anyway) and copy the valid columns out, fused with any epilogue.
    full = c.compute((m, npad), lambda i, j: te.sum(a[i, r] * p[j // width, r, j % width], axis=r),
                     f"{name}_padded", c.MATMUL, attrs=dict(attrs or {}, padded_from=n))
    return c.compute((m, n), lambda i, j: full[i, j], name, c.INJECTIVE)


def dense_prepacked(x, panels, n: int, name: str = "dense", block: tuple | None = None):
    """x (M, K) @ W.T for a weight W (n, K) packed ahead of time into ``panels`` (pack_panels_array). ``block``:
    the (rows, columns) register block in place of the target family's (columns: a multiple of the panel
    width or a divisor of it, so a block's columns stay contiguous)."""
    _check_rank(x, 2, name, "x")
    _check_rank(panels, 3, name, "panels")
    count, k, width = c.shape_of(panels)
    if c.shape_of(x)[1] != k or not 0 < n <= count * width:
        raise ValueError(f"{name}: x {c.shape_of(x)} does not multiply {n} rows packed as {c.shape_of(panels)}")
    attrs = {"prepacked": True}
    if block is not None:
        rows, cols = (int(v) for v in block)
        if rows < 1 or cols < 1 or (width % cols and cols % width):
            raise ValueError(f"{name}: register block {block} does not tile panels of width {width}")
        attrs[REGISTER_BLOCK] = (rows, cols)
    return _panel_product(x, panels, n, name, attrs=attrs)


def _product(a, b, n_axis: int, name: str, block: tuple | None = None):
    """C[i, j] = sum_k a[i, k] * b'[k, j] with b' = b (n_axis=1) or b.T (n_axis=0). ``block``: (rows, columns)
    of the register block, read in place (never packed) -- see matmul."""
    m, k = c.shape_of(a)
    kb = c.shape_of(b)[1 - n_axis]
    n = c.shape_of(b)[n_axis]
    if k != kb:
        raise ValueError(f"{name}: inner dimensions differ: a is {c.shape_of(a)}, b is {c.shape_of(b)}"
                         f"{' (transposed)' if n_axis == 0 else ''}")
    r = te.reduce_axis((0, k), name="k")
    if block is not None:
        if n_axis != 1:
            raise ValueError(f"{name}: a register block is for b read in place along its rows (n_axis=1)")
        return c.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name, c.MATMUL,
                         attrs={REGISTER_BLOCK: tuple(int(v) for v in block)})
    if should_pack(m, n):
        return _panel_product(a, pack_panels(b, n_axis, f"{name}_packed"), n, name)
    if n_axis == 1:
        return c.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name, c.MATMUL)
    if k >= 2 * ROWDOT_LANES:
        return _rowdot(a, b, name)
    return c.compute((m, n), lambda i, j: te.sum(a[i, r] * b[j, r], axis=r), name, c.MATMUL)


def matmul(a, b, name: str = "matmul", block: tuple | None = None):
    """a (M, K) @ b (K, N) -> (M, N). ``block`` = (rows, columns): b is read in place, never packed, by a register
    block of that many rows of a (broadcast) by columns of b (whole vectors), whatever the target family's
    default; for a b whose rows are long and contiguous (a pointwise conv's input with few channels)."""
    _check_rank(a, 2, name, "a")
    _check_rank(b, 2, name, "b")
    return _product(a, b, 1, name, block)


def dense(x, w, bias=None, name: str = "dense"):
    """x (M, K) @ w (N, K).T [+ bias (N,)] -> (M, N), the fully connected layer."""
    _check_rank(x, 2, name, "x")
    _check_rank(w, 2, name, "w")
    out = _product(x, w, 0, name if bias is None else f"{name}_matmul")
    if bias is None:
        return out
    _check_rank(bias, 1, name, "bias")
    return c.compute(out.shape, lambda i, j: out[i, j] + bias[j], name, c.BROADCAST)


def batch_matmul(a, b, transpose_b: bool = False, name: str = "batch_matmul"):
    """a (B, M, K) @ b (B, K, N) (or b (B, N, K) transposed) -> (B, M, N); a batch of 1 broadcasts."""
    _check_rank(a, 3, name, "a")
    _check_rank(b, 3, name, "b")
    ba, m, k = c.shape_of(a)
    bb = c.shape_of(b)[0]
    n = c.shape_of(b)[1] if transpose_b else c.shape_of(b)[2]
    kb = c.shape_of(b)[2] if transpose_b else c.shape_of(b)[1]
    if k != kb or (ba != bb and 1 not in (ba, bb)):
        raise ValueError(f"{name}: shapes {c.shape_of(a)} and {c.shape_of(b)} do not multiply"
                         f"{' (b transposed)' if transpose_b else ''}")
    batch = max(ba, bb)
    r = te.reduce_axis((0, k), name="k")

    def ia(bi):
        return 0 if ba == 1 else bi

    def ib(bi):
        return 0 if bb == 1 else bi

    if transpose_b:
        return c.compute((batch, m, n), lambda bi, i, j: te.sum(a[ia(bi), i, r] * b[ib(bi), j, r], axis=r),
                         name, c.MATMUL)
    return c.compute((batch, m, n), lambda bi, i, j: te.sum(a[ia(bi), i, r] * b[ib(bi), r, j], axis=r),
                     name, c.MATMUL)


def _check_rank(t, rank: int, op: str, what: str) -> None:
    if len(c.shape_of(t)) != rank:
        raise ValueError(f"{op}: {what} must have rank {rank}, got shape {c.shape_of(t)}")
