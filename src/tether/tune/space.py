"""Config spaces: which schedule knobs (``ops.schedules.KNOBS``) a kernel exposes, and the values each may take.

A kernel's space follows its main op (the stage whose schedule matters most): conv2d_pixels (pixels per block,
loop order, the cache threshold that picks the order, the channel panel width its weights are packed with, the
parallel axis), matmul (micro-kernel rows x columns, k unroll, direct accumulation, the parallel axis), direct
conv2d (accumulator budget, columns), depthwise/pooling (columns, window unroll),
elementwise/reductions (vector width); every space also has the parallel grain (``parallel_min``: below this
many elements no parallel launch; ``parallel_tasks``: tasks of a split loop). The first value of every knob is
the family's default, so ``space.default()`` is exactly the untuned schedule.

GPU kernels have their own knobs (``ops.gpu_schedules.GPU_KNOBS``: work-group size, outputs per thread, matmul
tiles, padding inlined or materialized): ``gpu_space``.

A config is a plain ``{knob: value}`` dict; ``config_text`` (also ``config_key``) is its canonical text.
"""
from __future__ import annotations

import math
import random
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from tether.ops import common as c
from tether.ops.gpu_schedules import GpuKnobs, wants_tree_reduction
from tether.ops.linear import PANEL
from tether.ops.schedules import Family

Config = Dict[str, Any]

# main op, most specific first: the first tag found among a kernel's stages names its space
_MAIN_TAGS = (c.CONV2D_PIXELS, c.MATMUL, c.CONV2D, c.DEPTHWISE_CONV2D, c.POOL, c.REDUCE, c.GLOBAL_POOL)
NEVER_PARALLEL = 1 << 40       # a parallel_min no kernel reaches: the kernel runs on one thread


def config_text(config: Dict[str, Any]) -> str:
    """A config's canonical text: its identity in the tuning log."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


config_key = config_text


def _uniq(values: Sequence[Any]) -> Tuple[Any, ...]:
    out: List[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return tuple(out)


@dataclass(frozen=True)
class ConfigSpace:
    """The knobs of one kernel and their choices (each tuple starts with the default)."""

    kind: str                              # the main op's tag ("elemwise" when none)
    knobs: Tuple[Tuple[str, Tuple[Any, ...]], ...]

    @property
    def size(self) -> int:
        return math.prod(len(ch) for _, ch in self.knobs)

    def default(self) -> Config:
        return {k: ch[0] for k, ch in self.knobs}

    def sample(self, rng: random.Random) -> Config:
        return {k: rng.choice(ch) for k, ch in self.knobs}

    def neighbour(self, config: Config, rng: random.Random) -> Config:
        """`config` with one knob moved to another of its values (an adjacent one, mostly)."""
        movable = [(k, ch) for k, ch in self.knobs if len(ch) > 1]
        if not movable:
            return dict(config)
        k, ch = rng.choice(movable)
        i = ch.index(config[k]) if config.get(k) in ch else 0
        if rng.random() < 0.7:
            j = min(len(ch) - 1, max(0, i + rng.choice((-1, 1))))
            j = j if j != i else (i + 1) % len(ch)
        else:
            j = rng.choice([x for x in range(len(ch)) if x != i])
        out = dict(config)
        out[k] = ch[j]
        return out

    def features(self, config: Config) -> List[float]:
        """Numbers for the cost model: log2 of numeric knobs, the index of the others."""
        out = []
        for k, ch in self.knobs:
            v = config.get(k, ch[0])
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                out.append(float(ch.index(v)) if v in ch else -1.0)
            else:
                out.append(math.log2(v) if v > 0 else -1.0)
        return out

    def all_configs(self, limit: int) -> List[Config]:
        """Every config, in a fixed order, when there are at most `limit` (else an empty list)."""
        if self.size > limit:
            return []
        configs: List[Config] = [{}]
        for k, ch in self.knobs:
            configs = [dict(cfg, **{k: v}) for cfg in configs for v in ch]
        return configs


def main_tag(out) -> str:
    """The tag of the stage whose schedule dominates the kernel computing te tensor `out`."""
    tags = set()
    seen = set()
    stack = [out.op]
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        tags.add(c.tag_of(op))
        stack.extend(t.op for t in op.input_tensors)
    return next((t for t in _MAIN_TAGS if t in tags), c.ELEMWISE)


def _first_op(out, pred):
    """The first op (depth first from `out`) of the stages computing `out` for which ``pred`` holds, else None."""
    stack, seen = [out.op], set()
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if pred(op):
            return op
        stack.extend(t.op for t in op.input_tensors)
    return None


def _find_op(out, tag: str):
    """The first op tagged `tag` among the stages computing `out` (None if there is none)."""
    return _first_op(out, lambda op: c.tag_of(op) == tag)


def _packed(out) -> bool:
    return _find_op(out, c.MATMUL_PACK) is not None


def _conv_panels(out, fam: Family) -> Tuple[int, ...]:
    """Channel panel widths: the kernel's own first, then 1, 2 and 4 vectors when its weights arrive packed (the
    build repacks them for a config; a kernel packing them itself keeps its width); grouped: dividing a group."""
    conv = _find_op(out, c.CONV2D_PIXELS)
    own = fam.conv_panel or int(conv.attrs.get("panel", PANEL))
    if _packed(out):
        return (own,)
    per_group = int(conv.attrs.get("group_channels", 0))
    return tuple(w for w in _uniq([own, fam.lanes, 2 * fam.lanes, 4 * fam.lanes])
                 if w == own or not per_group or per_group % w == 0)


def space_for(out, fam: Family) -> ConfigSpace:
    """The config space of the kernel computing te tensor `out` for target family `fam`."""
    kind = main_tag(out)
    grain = ("parallel_min", _uniq([fam.parallel_min, fam.parallel_min >> 2, fam.parallel_min << 2,
                                    NEVER_PARALLEL]))
    tasks = ("parallel_tasks", _uniq([fam.parallel_tasks, 4, 16, 32]))
    knobs: List[Tuple[str, Tuple[Any, ...]]]
    if kind == c.CONV2D_PIXELS:
        knobs = [("conv_pixels", _uniq([fam.conv_pixels or fam.mm_rows, 1, 2, 3, 4, 5, 6, 8])),
                 ("conv_order", ("auto", "pixels", "panels")),
                 ("cache_bytes", _uniq([fam.cache_bytes, 64 << 10, 1 << 20, 4 << 20])), grain, tasks,
                 ("conv_panel", _conv_panels(out, fam)),
                 ("parallel_axis", _uniq([fam.parallel_axis, "auto", "rows", "cols", "fused"]))]
    elif kind == c.MATMUL:
        cols = [fam.mm_cols] if _packed(out) else [fam.mm_cols, fam.lanes, 2 * fam.lanes, 32]
        # a product of one row unrolls its reduction by its own knob (schedules._k_steps)
        mm = _find_op(out, c.MATMUL)
        one_row = mm is not None and int(mm.output(0).shape[-2]) == 1
        unroll = (("k_unroll_one_row", _uniq([fam.k_unroll_one_row, 4, 8, 32])) if one_row
                  else ("k_unroll", _uniq([fam.k_unroll, 1, 2, 8])))
        knobs = [("mm_rows", _uniq([fam.mm_rows, 1, 2, 3, 4, 5, 6, 8])), ("mm_cols", _uniq(cols)), unroll,
                 ("direct_matmul", _uniq([fam.direct_matmul, not fam.direct_matmul])), grain,
                 ("parallel_axis", _uniq([fam.parallel_axis, "auto", "rows", "fused"]))]
    elif kind == c.CONV2D:
        knobs = [("acc_regs", _uniq([fam.acc_regs, 4, 8, 16, 24])),
                 ("max_col_vectors", _uniq([fam.max_col_vectors, 1, 2, 4])), grain, tasks]
    elif kind in (c.DEPTHWISE_CONV2D, c.POOL):
        knobs = [("max_col_vectors", _uniq([fam.max_col_vectors, 1, 2, 4])),
                 ("window_unroll", _uniq([fam.window_unroll, 1, 3, 11])), grain]
    else:   # elementwise, reductions, global pooling: vector width and the grain
        knobs = [("lanes", _uniq([fam.lanes, max(1, fam.lanes // 2), 2 * fam.lanes, 4 * fam.lanes])), grain, tasks]
    return ConfigSpace(kind, tuple(knobs))


# ---------------------------------------------------------------------------------------------------------------
# GPU kernels: the knobs of ops.gpu_schedules (GPU_KNOBS). Every combination of the choices below fits the default
# limits (256 threads, 16 KiB of shared memory): matmul tiles of at most 16 x 8 = 128 rows and columns with 16 k
# steps take (128 + 128) * 16 * 4 bytes = 16 KiB.

def gpu_space(out) -> ConfigSpace:
    """The config space of the GPU kernel computing te tensor ``out`` (scheduled by ops.gpu_schedules.schedule_gpu);
    each knob's first choice is the default, so ``gpu_space(out).default()`` is the untuned GPU schedule."""
    d = GpuKnobs()
    kind = main_tag(out)
    block = ("block", _uniq([d.block, 64, 128]))
    knobs: List[Tuple[str, Tuple[Any, ...]]]
    if kind == c.MATMUL:
        knobs = [("mm_threads_y", _uniq([d.mm_threads_y, 4, 16])), ("mm_threads_x", _uniq([d.mm_threads_x, 4, 16])),
                 ("mm_block_y", _uniq([d.mm_block_y, 1, 2, 8])), ("mm_block_x", _uniq([d.mm_block_x, 1, 2, 8])),
                 ("mm_ktile", _uniq([d.mm_ktile, 4, 16]))]
    elif kind in (c.CONV2D, c.CONV2D_PIXELS, c.DEPTHWISE_CONV2D, c.POOL, c.REDUCE, c.GLOBAL_POOL):
        knobs = [block, ("outputs_per_thread", _uniq([d.outputs_per_thread, 2, 4]))]
        if _find_op(out, c.PAD) is not None:
            knobs.append(("pad", _uniq([d.pad, "inline", "materialize"])))
    else:   # elementwise chains, layout transforms, multi-stage ops of injective and reduction stages
        knobs = [block]
    if kind != c.MATMUL and _any_op(out, wants_tree_reduction):
        knobs.append(("reduce_threads", _uniq([d.reduce_threads, 64, 128, 0])))
    return ConfigSpace(kind, tuple(knobs))


def _any_op(out, pred) -> bool:
    """Whether ``pred`` holds for one of the ops computing `out`."""
    return _first_op(out, pred) is not None
