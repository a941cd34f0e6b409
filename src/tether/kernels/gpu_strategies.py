"""The kernel strategies of GPU targets (every GPU API: opencl, vulkan, cuda), for ``tether.kernels.table``.

On a GPU every op with a te lowering is one te kernel, scheduled by ``ops.gpu_schedules.schedule_gpu`` with the
plain layouts (no CPU GEMM panels): the float ops, and the int8 ones of ``quantize_ops`` and ``qconv_ops`` (the
int8 convolution in its plain dot4 kind) but ``qadd``: its rounding matches onnxruntime's only with both
multiply-adds fused (MLAS's FMAs, which the CPU backend emits), and the GPU emitters leave contraction to the
driver (pocl and lavapipe do not fuse), one step off on ties. The channels-last int8 layout ops (``qlayout_ops``,
``qpool_ops``) have no GPU strategy yet. The CPU's hand-written loop-IR softmax gets its te form here (the GPU
schedules run a row's reductions per thread). Numpy ops stay numpy ops (the host runs them between kernels).

Loop-IR kernels (loops carrying state, the recurrent kernels) have no GPU strategy: the kernel plan runs them on
the host's CPU, as part of the module's host library, with the copies between device and host memory planned
around them (graph/plan.py, docs/gpu.md "Models on GPUs").
"""
from __future__ import annotations

from typing import Dict

from tether import ops
from tether.kernels import core, core_te, detection_op, dynamic_op, qconv_ops, quantize_ops
from tether.kernels.registry import DeviceNumpy, Strategy, TeLowering

#: the target kinds these strategies are registered for
GPU_KINDS = ("opencl", "vulkan", "cuda")


def _strategies() -> Dict[str, Strategy]:
    out: Dict[str, Strategy] = {op: TeLowering(fn) for op, fn in core_te.LOWERINGS.items()}
    out["softmax"] = TeLowering(lambda attrs, x: ops.softmax(x, attrs["axis"]))
    for name, d in core.DEFINITIONS.items():
        if d.pattern == "numpy":
            out[name] = DeviceNumpy()
    out.update({op: s for op, s in quantize_ops.CPU_STRATEGIES.items() if op != "qadd"})
    out.update(qconv_ops.GPU_STRATEGIES)
    for name in list(detection_op.DEFINITIONS) + list(dynamic_op.DEFINITIONS):
        out[name] = DeviceNumpy()
    return out


GPU_STRATEGIES: Dict[str, Strategy] = _strategies()
