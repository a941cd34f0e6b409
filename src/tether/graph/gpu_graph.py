"""A model's kernels for a GPU target: the GPU tasks of the kernel plan scheduled for GPU threads, the others
compiled for the host's CPU, and the one module that carries both.

    func = lower_gpu_task(task, config, "deploy_k3_conv2d")   # a PrimFunc whose loops are bound to GPU threads
    lib = build_model_module(cpu_items, gpu_funcs, target, "deploy")

The module is a GPU module (``tether.gpu_build``: the host's shared library, metadata "device", the device code in
``__tether_device_code``) whose host library also has CPU functions: the kernels the plan runs on the host (loop-IR
kernels such as the recurrent ones, or a node the GPU schedules refused). The device runtime calls both kinds by
name (``tether_rpc.module``); the graph executor keeps activations in device memory and copies around the CPU
nodes (docs/gpu.md "Models on GPUs").
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

from tether.artifact import Module
from tether.codegen.emit import compile_module
from tether.codegen.function import emit_function
from tether.codegen.gpu_backends import backend
from tether.codegen.module import ModuleBuilder
from tether.errors import CompileError, ScheduleError
from tether.gpu_build import GpuModule, _check_limits, device_entry, split_functions
from tether.ops.gpu_schedules import gpu_limits, schedule_gpu
from tether.target import Target
from tether.te.lower import lower as te_lower

log = logging.getLogger(__name__)


def limits_of(target: Target) -> Dict[str, int]:
    """The work-group limits a GPU target's default schedules keep within."""
    gpu = target.gpu
    assert gpu is not None
    return {"max_threads_per_block": gpu.max_threads_per_block, "max_shared_bytes": gpu.max_shared_bytes}


def lower_gpu_task(task: Any, config: Optional[Dict[str, Any]], name: str) -> Any:
    """One GPU task of a kernel plan as a PrimFunc named `name`, scheduled by ``schedule_gpu`` (with `config`'s
    knobs) within the target's limits; its split into kernels is checked here, so a schedule the split refuses is
    known before the module is built (ScheduleError / CompileError)."""
    placeholders, out, shapes = task.lower(config)
    assert shapes is None    # (GPU kernels read the graph's own layouts)
    target = task.plan.target
    sch = schedule_gpu([out], limits=gpu_limits(limits_of(target)), config=config)
    func = te_lower(sch, placeholders + [out], name)
    split_functions([func], target)
    return func


def build_model_module(cpu_funcs: Sequence[Any], gpu_funcs: Sequence[Any], target: Target, name: str,
                       fast_math: bool = False, opt: int = 3) -> Module:
    """Lowered PrimFuncs -> one GPU module: `gpu_funcs` (their loops bound to GPU threads) as device code with
    launch sequences, `cpu_funcs` as the host library's own functions (compiled for ``target.host``)."""
    if target.gpu is None:
        raise CompileError("build_model_module: %s is not a GPU target" % target)
    host = target.host
    if not gpu_funcs:
        # every kernel runs on the host (an int8 model, say): a CPU module; no device program has no kernels
        mb = ModuleBuilder(host, name, fast_math=fast_math)
        for pf in cpu_funcs:
            mb.add_packed(pf, emit_function(mb, pf))
        ir_text = mb.finish()
        assert mb.metadata is not None
        log.info("GPU model module %s for %s: no device kernels, %d CPU functions", name, target, len(cpu_funcs))
        return Module(name, host, ir_text, compile_module(ir_text, host, opt=opt), mb.metadata)
    programs = split_functions(gpu_funcs, target)
    kernels = [k for p in programs for k in p.kernels]
    be = backend(target.gpu.api)
    code = be.emit(kernels, target.gpu)
    for k in kernels:
        _check_limits(k, target)
    mb = ModuleBuilder(host, name, fast_math=fast_math)
    for pf in cpu_funcs:
        mb.add_packed(pf, emit_function(mb, pf))
    mb.add_device(device_entry(programs, target, be.code_format, code), code)
    ir_text = mb.finish()
    compiled = compile_module(ir_text, host, opt=opt)
    assert mb.metadata is not None
    log.info("GPU model module %s for %s: %d device kernels, %d CPU functions", name, target, len(kernels),
             len(cpu_funcs))
    return GpuModule(name, host, ir_text, compiled, mb.metadata, code)


def placement_report(plan: Any, try_schedules: bool = True) -> List[Dict[str, str]]:
    """Where each node of a GPU target's kernel plan runs, without compiling: one row per node that does work
    ({"node", "ops", "device": "gpu" | "cpu", "why"}). With `try_schedules`, each GPU task is also scheduled and
    split (as the build does, short of code generation), so a kernel the GPU schedules refuse shows as "cpu" with
    the build's reason."""
    from tether.graph import numpy_nodes

    if try_schedules:
        for task in plan.tasks:
            if task.device != "gpu":
                continue
            try:
                lower_gpu_task(task, None, "check_%s" % task.key)
            except (ScheduleError, CompileError) as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                task.device, task.cpu_reason = "cpu", "no GPU schedule: %s" % first
    rows = []
    for node, k in zip(plan.graph.nodes, plan.task_of_node):
        if numpy_nodes.is_numpy(node):
            rows.append({"node": node.name, "ops": node.ops_label(), "device": "cpu",
                         "why": "numpy op (the host runs it between kernels)"})
        elif k is not None:
            task = plan.tasks[k]
            rows.append({"node": node.name, "ops": node.ops_label(), "device": task.device, "why": task.cpu_reason})
    return rows
