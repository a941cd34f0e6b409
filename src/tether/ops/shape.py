"""Shape ops: pad, transpose, reshape, concat (plus flatten/squeeze/expand_dims built on reshape)."""
from __future__ import annotations

from typing import Sequence

from tether import te

from . import common as c


def pad(x, pad_before: Sequence[int], pad_after: Sequence[int] | None = None, value: float = 0.0,
        name: str = "pad"):
    """Constant padding; `pad_before`/`pad_after` give one count per dimension (after defaults to before)."""
    shape = c.shape_of(x)
    before = tuple(int(p) for p in pad_before)
    after = before if pad_after is None else tuple(int(p) for p in pad_after)
    if len(before) != len(shape) or len(after) != len(shape):
        raise ValueError(f"{name}: need one pad count per dimension of {shape}, got {before} / {after}")
    if any(p < 0 for p in before + after):
        raise ValueError(f"{name}: negative padding {before} / {after} is not supported")
    out_shape = tuple(e + b + a for e, b, a in zip(shape, before, after))
    fill = c.const(value, x.dtype)

    def f(*idx):
        conds = []
        for i, e, b, a in zip(idx, shape, before, after):
            if b:
                conds.append(i >= b)
            if a:
                conds.append(i < b + e)
        src = x[tuple(c.clamp_index(i - b, e) if (b or a) else i for i, e, b, a in zip(idx, shape, before, after))]
        cond = c.all_of(conds)
        return src if cond is None else te.if_then_else(cond, src, fill)

    return c.compute(out_shape, f, name, c.PAD)


def transpose(x, axes: Sequence[int] | None = None, name: str = "transpose"):
    shape = c.shape_of(x)
    axes = tuple(reversed(range(len(shape)))) if axes is None else tuple(a % len(shape) for a in axes)
    if sorted(axes) != list(range(len(shape))):
        raise ValueError(f"{name}: axes {axes} are not a permutation of the {len(shape)} dimensions")
    inverse = [axes.index(d) for d in range(len(shape))]
    return c.compute(tuple(shape[a] for a in axes), lambda *idx: x[tuple(idx[inverse[d]] for d in range(len(shape)))],
                     name, c.INJECTIVE)


def _resolve_shape(shape: tuple, newshape: Sequence[int], name: str) -> tuple:
    size = 1
    for e in shape:
        size *= e
    new = [int(e) for e in newshape]
    if new.count(-1) > 1:
        raise ValueError(f"{name}: only one dimension of {tuple(new)} may be -1")
    known = 1
    for e in new:
        if e != -1:
            known *= e
    if -1 in new:
        if known == 0 or size % known:
            raise ValueError(f"{name}: cannot reshape {shape} into {tuple(new)}")
        new[new.index(-1)] = size // known
    elif known != size:
        raise ValueError(f"{name}: cannot reshape {shape} ({size} elements) into {tuple(new)} ({known} elements)")
    return tuple(new)


def reshape(x, newshape: Sequence[int], name: str = "reshape"):
    shape = c.shape_of(x)
    new = _resolve_shape(shape, newshape, name)
    if new == shape:
        return c.compute(shape, lambda *idx: x[idx], name, c.INJECTIVE)

    def f(*idx):
        flat = None
        for i, e in zip(idx, new):
            flat = i if flat is None else flat * e + i
        src = []
        for e in reversed(shape):
            src.append(flat % e)
            flat = flat // e
        return x[tuple(reversed(src))] if src else x[()]

    return c.compute(new, f, name, c.INJECTIVE)


def flatten(x, axis: int = 1, name: str = "flatten"):
    """ONNX Flatten: dims before `axis` form the first output dimension, the rest the second."""
    shape = c.shape_of(x)
    lead = 1
    for e in shape[:axis]:
        lead *= e
    return reshape(x, (lead, -1), name)


def squeeze(x, axis=None, name: str = "squeeze"):
    shape = c.shape_of(x)
    axes = [d for d, e in enumerate(shape) if e == 1] if axis is None else c.normalize_axes(axis, len(shape))
    for a in axes:
        if shape[a] != 1:
            raise ValueError(f"{name}: dimension {a} of {shape} has extent {shape[a]}, not 1")
    return reshape(x, tuple(e for d, e in enumerate(shape) if d not in axes), name)


def expand_dims(x, axis: int, name: str = "expand_dims"):
    shape = list(c.shape_of(x))
    axis = axis % (len(shape) + 1)
    shape.insert(axis, 1)
    return reshape(x, shape, name)


def concat(xs: Sequence, axis: int = 0, name: str = "concat"):
    xs = list(xs)
    if not xs:
        raise ValueError(f"{name}: nothing to concatenate")
    shapes = [c.shape_of(t) for t in xs]
    ndim = len(shapes[0])
    axis = c.normalize_axes(axis, ndim)[0]
    for s in shapes[1:]:
        if len(s) != ndim or any(s[d] != shapes[0][d] for d in range(ndim) if d != axis):
            raise ValueError(f"{name}: shapes {shapes} differ outside axis {axis}")
    offsets = [0]
    for s in shapes:
        offsets.append(offsets[-1] + s[axis])
    out_shape = tuple(offsets[-1] if d == axis else e for d, e in enumerate(shapes[0]))

    def f(*idx):
        i = idx[axis]

        def load(t, off):
            j = i - off if len(xs) == 1 else c.clamp_index(i - off, c.shape_of(t)[axis])
            return t[idx[:axis] + (j,) + idx[axis + 1:]]

        # innermost first: the last tensor is the fallback of the chain of selects
        expr = load(xs[-1], offsets[-2])
        for t, off, end in reversed(list(zip(xs[:-1], offsets[:-2], offsets[1:-1]))):
            expr = te.if_then_else(i < end, load(t, off), expr)
        return expr

    return c.compute(out_shape, f, name, c.INJECTIVE)
