"""The op table: every graph op's definition and kernel strategies, filled here, in one place, from the modules
that define them (each exposes ``DEFINITIONS`` and, per target kind, its strategies; none fills this table
itself). A second definition of an op, or a second strategy for the same op and target kind, raises ValueError.

A new kind of target (``registry.TARGET_KINDS``) adds its strategy modules and one ``add_strategies`` line per
module below; the CPU lines stay as they are.
"""
from __future__ import annotations

from tether.kernels import (core, core_te, detection_op, dynamic_op, gpu_strategies, layout_ops, loop_op, qconv_ops,
                            qlayout_ops, qpool_ops, quantize_ops, recurrent_kernel, recurrent_op, scatter_kernel,
                            softmax_kernel)
from tether.kernels.registry import DeviceNumpy, OpTable, TeLowering


def _build() -> OpTable:
    table = OpTable()
    for definitions in (core.DEFINITIONS, detection_op.DEFINITIONS, dynamic_op.DEFINITIONS, quantize_ops.DEFINITIONS,
                        layout_ops.DEFINITIONS, qconv_ops.DEFINITIONS, qlayout_ops.DEFINITIONS, qpool_ops.DEFINITIONS,
                        recurrent_op.DEFINITIONS, scatter_kernel.DEFINITIONS, loop_op.definitions(table)):
        table.define_all(definitions.values())

    # ---- cpu: every LLVM target
    table.add_strategies("cpu", {op: TeLowering(fn) for op, fn in core_te.LOWERINGS.items()})
    # ops of pattern "numpy" have no kernel: the device runs them between kernels
    table.add_strategies("cpu", {name: DeviceNumpy() for name, d in core.DEFINITIONS.items() if d.pattern == "numpy"})
    for module in (detection_op, dynamic_op, layout_ops, quantize_ops, qconv_ops, qlayout_ops, qpool_ops,
                   softmax_kernel, recurrent_kernel, scatter_kernel, loop_op):
        table.add_strategies("cpu", module.CPU_STRATEGIES)

    # ---- GPUs (every API): te ops scheduled for GPU threads, numpy ops as on the CPU; an op with no GPU strategy
    # (a loop-IR kernel) runs on the host's CPU (graph/plan.py)
    for kind in gpu_strategies.GPU_KINDS:
        table.add_strategies(kind, gpu_strategies.GPU_STRATEGIES)
    return table


OPS = _build()
