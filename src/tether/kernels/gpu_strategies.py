"""The kernel strategies of GPU targets (every GPU API: opencl, vulkan, cuda), for ``tether.kernels.table``.

On a GPU every op with a te lowering is one te kernel, scheduled by ``ops.gpu_schedules.schedule_gpu`` with the
plain layouts (no CPU GEMM panels). The CPU's hand-written loop-IR softmax gets its te form here (the GPU
schedules run a row's reductions per thread). Numpy ops stay numpy ops (the host runs them between kernels).

Loop-IR kernels (loops carrying state, the recurrent kernels) have no GPU strategy: the kernel plan runs them on
the host's CPU, as part of the module's host library, with the copies between device and host memory planned
around them (graph/plan.py, docs/gpu.md "Models on GPUs").
"""
from __future__ import annotations

from typing import Dict

from tether import ops
from tether.kernels import core, core_te, detection_op
from tether.kernels.registry import DeviceNumpy, Strategy, TeLowering

#: the target kinds these strategies are registered for
GPU_KINDS = ("opencl", "vulkan", "cuda")


def _strategies() -> Dict[str, Strategy]:
    out: Dict[str, Strategy] = {op: TeLowering(fn) for op, fn in core_te.LOWERINGS.items()}
    out["softmax"] = TeLowering(lambda attrs, x: ops.softmax(x, attrs["axis"]))
    for name, d in core.DEFINITIONS.items():
        if d.pattern == "numpy":
            out[name] = DeviceNumpy()
    for name in detection_op.DEFINITIONS:
        out[name] = DeviceNumpy()
    return out


GPU_STRATEGIES: Dict[str, Strategy] = _strategies()
