"""Kernels of the op library as benchmark targets: ``op:NAME:D0,D1,...`` built for a GPU target (the op's
``schedule_gpu`` schedule, optionally a tuned config) and for a CPU target (its ``ops.schedule``), so one kernel
can be measured on a device's GPU and on its CPU side by side (docs/gpu.md "Measuring GPUs").

| spec | computes | dims |
|---|---|---|
| ``op:add:N`` | ``C = A + B`` | N elements |
| ``op:matmul:M,K,N`` | ``C = A @ B`` | (M, K) x (K, N) |
| ``op:conv2d:N,C,H,W,O,K`` | 2-D convolution, stride 1, padding K // 2 | input NCHW, O output channels, K x K window |
| ``op:softmax:R,C`` | softmax over the last axis | R rows of C |

``OpKernel.outs_and_args()`` gives fresh te tensors each call (a schedule takes ownership of its stages).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

OP_PREFIX = "op:"


def _add(dims: Sequence[int]) -> Tuple[list, list]:
    from tether import ops, te

    (n,) = dims
    a = te.placeholder((n,), "float32", name="A")
    b = te.placeholder((n,), "float32", name="B")
    return [ops.add(a, b)], [a, b]


def _matmul(dims: Sequence[int]) -> Tuple[list, list]:
    from tether import ops, te

    m, k, n = dims
    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    return [ops.matmul(a, b)], [a, b]


def _conv2d(dims: Sequence[int]) -> Tuple[list, list]:
    from tether import ops, te

    n, c, h, w, o, k = dims
    x = te.placeholder((n, c, h, w), "float32", name="X")
    wt = te.placeholder((o, c, k, k), "float32", name="W")
    return [ops.conv2d(x, wt, 1, k // 2)], [x, wt]


def _softmax(dims: Sequence[int]) -> Tuple[list, list]:
    from tether import ops, te

    r, c = dims
    x = te.placeholder((r, c), "float32", name="X")
    return [ops.softmax(x, axis=-1)], [x]


#: op name -> (number of dims, builder of (outputs, inputs))
OPS: Dict[str, Tuple[int, Callable[[Sequence[int]], Tuple[list, list]]]] = {
    "add": (1, _add), "matmul": (3, _matmul), "conv2d": (6, _conv2d), "softmax": (2, _softmax)}


class OpSpecError(ValueError):
    """An ``op:`` spec that names no known op or has the wrong dims."""


@dataclasses.dataclass(frozen=True)
class OpKernel:
    """One op at fixed shapes: ``name`` (an OPS key) and ``dims``."""

    name: str
    dims: Tuple[int, ...]

    @property
    def spec(self) -> str:
        return "%s%s:%s" % (OP_PREFIX, self.name, ",".join(str(d) for d in self.dims))

    @property
    def func_name(self) -> str:
        return "op_" + self.name

    def outs_and_args(self) -> Tuple[list, list]:
        """(outputs, inputs) as fresh te tensors; the function's arguments are inputs then outputs."""
        return OPS[self.name][1](self.dims)

    def build(self, target: Any, config: Optional[Dict[str, Any]] = None) -> Any:
        """The op built for ``target``: a GPU module (schedule_gpu within the target's limits, ``config`` its
        knobs) for a GPU target, else a CPU library (ops.schedule with ``config`` as CPU knobs)."""
        import tether
        from tether import ops
        from tether.target import Target

        tgt = target if isinstance(target, Target) else Target(target)
        outs, ins = self.outs_and_args()
        if tgt.is_gpu:
            from tether.ops.gpu_schedules import schedule_gpu

            s = schedule_gpu(outs, limits=gpu_limits_of(tgt), config=config)
        else:
            s = ops.schedule(outs, tgt, config=config)
        return tether.build(s, list(ins) + list(outs), target=tgt, name=self.func_name)

    def export(self, target: Any, folder: str, config: Optional[Dict[str, Any]] = None, tag: str = "") -> str:
        """Build for ``target`` and write the library into ``folder``; its path."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "%s-%s%s.so" % (self.func_name, "x".join(str(d) for d in self.dims),
                                                    ("-" + tag) if tag else ""))
        self.build(target, config).export_library(path)
        return path

    def arg_specs(self) -> List[Tuple[Tuple[int, ...], str]]:
        outs, ins = self.outs_and_args()
        return [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in list(ins) + list(outs)]


def gpu_limits_of(target: Any) -> Dict[str, int]:
    """The work-group limits a GPU target promises (what schedule_gpu and the split check against)."""
    g = target.gpu
    return {"max_threads_per_block": int(g.max_threads_per_block), "max_shared_bytes": int(g.max_shared_bytes)}


def parse_op(spec: str) -> OpKernel:
    """``op:NAME:D0,D1,...`` -> OpKernel; OpSpecError naming what is wrong and what was expected."""
    if not spec.startswith(OP_PREFIX):
        raise OpSpecError("%r is not an op kernel (expected op:NAME:D0,D1,...)" % spec)
    name, _, dims_text = spec[len(OP_PREFIX):].partition(":")
    if name not in OPS:
        raise OpSpecError("unknown op %r in %r; expected one of %s" % (name, spec, ", ".join(sorted(OPS))))
    want = OPS[name][0]
    try:
        dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
    except ValueError:
        raise OpSpecError("%r: dims must be integers separated by commas" % spec) from None
    if len(dims) != want or any(d < 1 for d in dims):
        raise OpSpecError("op %s takes %d positive dims, got %r (%s)" % (name, want, dims_text, spec))
    return OpKernel(name, dims)


__all__ = ["OPS", "OP_PREFIX", "OpKernel", "OpSpecError", "parse_op", "gpu_limits_of"]
