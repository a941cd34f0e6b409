"""Building blocks shared by every op family: op tags, the tagged `compute` wrapper, constants, broadcasting.

Every te call the op library makes that is not a plain `te.compute`/`te.reduce_axis` goes through this module,
so the op families stay small and only one place depends on the details of the te surface.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from tether import te

# Tags tell `ops.schedule` what a compute op is.  Injective ops (elementwise, broadcast, shape) are inlined into
# their consumers; the others have a schedule of their own.
ELEMWISE = "elemwise"
BROADCAST = "broadcast"
INJECTIVE = "injective"
REDUCE = "reduce"
MATMUL = "matmul"
MATMUL_PACK = "matmul_pack"
ROWDOT_PARTIAL = "rowdot_partial"
ROWDOT_FINAL = "rowdot_final"
CONV2D = "conv2d"
CONV2D_PIXELS = "conv2d_pixels"
DEPTHWISE_CONV2D = "depthwise_conv2d"
POOL = "pool"
GLOBAL_POOL = "global_pool"
PAD = "pad"
SOFTMAX_STAGE = "softmax_stage"

INJECTIVE_TAGS = frozenset({ELEMWISE, BROADCAST, INJECTIVE, PAD})

_TAG_ATTR = "tag"


def compute(shape: Sequence[int], fcompute: Callable, name: str, tag: str, attrs: dict | None = None) -> "te.Tensor":
    """te.compute that records `tag` on the op (read back with `tag_of`); `attrs` are hints for the schedules
    (e.g. "vector_block": the split factor an aligned padding stage was laid out for)."""
    return te.compute(tuple(int(d) for d in shape), fcompute, name=name, tag=tag, attrs=attrs or {})


def tag_of(op) -> str:
    return getattr(op, _TAG_ATTR, "") or ""


def is_injective(op) -> bool:
    return tag_of(op) in INJECTIVE_TAGS


def const(value, dtype: str = "float32"):
    return te.const(value, dtype)


def dtype_of(*xs, default: str = "float32") -> str:
    for x in xs:
        if isinstance(x, te.Tensor):
            return x.dtype
    return default


def shape_of(x) -> tuple:
    return tuple(int(d) for d in x.shape) if isinstance(x, te.Tensor) else ()


def broadcast_shape(*shapes: Sequence[int]) -> tuple:
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        extents = {s[len(s) - ndim + d] for s in shapes if len(s) - ndim + d >= 0}
        extents.discard(1)
        if len(extents) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} cannot be broadcast together "
                             f"(dimension {d - ndim} has extents {sorted(extents)})")
        out.append(extents.pop() if extents else 1)
    return tuple(out)


def broadcast_index(x, out_idx: Sequence) -> tuple:
    """Index of tensor `x` that numpy broadcasting maps output index `out_idx` to."""
    shape = shape_of(x)
    lead = len(out_idx) - len(shape)
    return tuple(0 if ext == 1 else out_idx[lead + d] for d, ext in enumerate(shape))


def broadcast_load(x, out_idx: Sequence, dtype: str):
    if isinstance(x, te.Tensor):
        idx = broadcast_index(x, out_idx)
        return x[idx] if idx else x[()]
    return const(x, dtype)


def normalize_axes(axis, ndim: int) -> tuple:
    """None -> all axes; int or iterable -> sorted tuple of non-negative axes (checked)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis} repeats an axis")
    return tuple(sorted(out))


def all_of(conds: Iterable):
    """Logical AND of boolean expressions (None when there are none)."""
    result = None
    for c in conds:
        result = c if result is None else te.all(result, c)
    return result


def clamp_index(i, extent: int):
    """i clamped into [0, extent): te.if_then_else evaluates both branches (a select), so a load in the branch
    that is not taken must still be in bounds."""
    return te.max(te.min(i, extent - 1), 0)


def max2(a, b):
    return te.max(a, b)


def min2(a, b):
    return te.min(a, b)


def to_pair(v, what: str) -> tuple:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(x) for x in v)
    if len(v) != 2:
        raise ValueError(f"{what} must be an int or a pair, got {v}")
    return v


def to_padding4(padding, what: str = "padding") -> tuple:
    """int | (ph, pw) | (top, left, bottom, right) -> (top, left, bottom, right)."""
    if isinstance(padding, int):
        return (padding,) * 4
    p = tuple(int(x) for x in padding)
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    if len(p) == 4:
        return p
    raise ValueError(f"{what} must be an int, (ph, pw) or (top, left, bottom, right), got {padding}")
