"""``build_graph``: an imported graph -> one shared library + graph JSON + params.

    graph, params = tether.frontend.from_onnx(onnx.load("model.onnx"), shape={"input": (1, 3, 224, 224)})
    factory = tether.build_graph(graph, params, target="rasp4b", opt_level=3)
    factory.export("out/")        # out/deploy.so, out/deploy.json, out/deploy.params

Steps: the kernel plan (``graph/plan.py``: the graph passes, build-time weight packing, and one task per
distinct kernel, each with its strategy from the op table), then every task is compiled: te tasks are lowered
(``graph/to_te.py``) and scheduled with ``ops.schedule`` (with the task's tuned config, if ``configs`` has one),
loop-IR tasks written by their kernel. All kernels go into one ``tether.build`` call and one .so. Reshapes cost
nothing: their output is a view of their input's storage (see the memory planner), and so do concats whose inputs
can live inside their output (``graph/passes/concat_views.py``): no kernel, no copy.

opt_level: which graph passes run (the lists in ``graph/passes/__init__.py``, from 0, the few that every build
needs, to 3, the default, with fusion); at 3, single-image convolutions also run as GEMMs vectorized along output
channels, with their weights packed at build time (docs/graph.md), much faster on the 13..111-wide layers of real
CNNs. ``tether.build_graph`` (the package's facade) also reads a ``tuning_log`` into ``configs``.

For a GPU target the plan's GPU tasks are scheduled for GPU threads and the others compiled for the host's CPU,
all in one GPU module (``graph/gpu_graph.py``); every node of the graph JSON says where it runs ("device": "gpu" or
"cpu"), and the executor keeps activations in device memory (docs/gpu.md "Models on GPUs").
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from tether_rpc.graph_executor import GRAPH_FORMAT, GRAPH_VERSION
from tether_rpc.params import save_params

from tether import driver, ops, te
from tether.graph.conv_gemm import repack_conv_weight
from tether.graph.guards import node_guards
from tether.graph.ir import Graph
from tether.graph import numpy_nodes
from tether.graph.passes import plan_memory
from tether.graph.plan import KernelPlan, compile_body_node, plan_kernels, strategy_of
from tether.errors import CompileError, ScheduleError
from tether.kernels.registry import LoopKernel
from tether.target import as_target, check_precision

log = logging.getLogger(__name__)


@dataclass
class GraphFactory:
    """The result of build_graph: the optimised graph, its params, the compiled library and the graph JSON."""

    graph: Graph
    params: Dict[str, np.ndarray]
    lib: Any                       # tether.artifact.Module
    graph_json: Dict[str, Any]
    target: Any
    timings: Dict[str, float] = field(default_factory=dict)

    @property
    def kernel_count(self) -> int:
        return len(self.lib.function_names)

    def get_graph_json(self) -> str:
        return json.dumps(self.graph_json, indent=1)

    def get_params(self) -> Dict[str, np.ndarray]:
        return dict(self.params)

    def get_lib(self) -> Any:
        return self.lib

    def export(self, folder: str) -> Dict[str, str]:
        """Write deploy.so (deploy.wasm for wasm32), deploy.json and deploy.params into `folder` (created if
        needed)."""
        os.makedirs(folder, exist_ok=True)
        paths = {k: os.path.join(folder, "deploy." + k) for k in ("json", "params")}
        paths["so"] = os.path.join(folder, self.graph_json["lib"])
        self.lib.export_library(paths["so"])
        with open(paths["json"], "w", encoding="utf-8") as fh:
            fh.write(self.get_graph_json())
        with open(paths["params"], "wb") as fh:
            fh.write(save_params(self.params))
        return paths


# ---------------------------------------------------------------- build
def build_graph(graph: Graph, params: Dict[str, np.ndarray], target: Any = "host", opt_level: int = 3,
                fast_math: bool = False, name: str = "deploy",
                configs: Optional[Mapping[str, Dict[str, Any]]] = None, executor: str = "graph",
                aot_params: str = "embedded", aot_workspace: str = "static", precision: str = "fp32") -> Any:
    """Plan the kernels of `graph` for `target` at `opt_level`, compile them into one library, plan the memory and
    write the graph JSON; ``.export(folder)`` on the result writes the deploy.* files. ``configs``: task key ->
    schedule config (a tuning log's best, ``tether.tune.log.best_configs``); the other kernels get their
    default schedule.

    ``executor="aot"``: the same build, then its graph JSON as generated code (``graph/aot.py``): the result is an
    ``AotModule`` whose ``.export(folder)`` writes ``<name>.h``, ``lib<name>.so`` and ``lib<name>.a`` (`name` is
    the C prefix); ``aot_params`` "embedded" or "external" (a ``<name>.params`` file the caller loads),
    ``aot_workspace`` "static" (a static buffer when the caller gives none) or "caller".

    ``precision="fp16"``: the float32 convs, matmuls and elementwise ops compute in float16 on a target with half
    arithmetic (rasp5-fp16, android-arm64-fp16); inputs and outputs stay float32 (graph/passes/half_precision.py).
    ValueError, before any work, on a target without it."""
    check_precision(target, precision)
    if executor not in ("graph", "aot"):
        raise ValueError("executor must be 'graph' or 'aot', got %r" % (executor,))
    if executor == "aot":
        if as_target(target).gpu is not None:
            raise ValueError("executor='aot' writes a C program for a CPU; a model for GPU target %s runs with the "
                             "graph executor (tether_rpc.graph_executor)" % as_target(target))
        if as_target(target).is_wasm:
            raise ValueError("executor='aot' writes a C program's library; for wasm32 use the graph executor "
                             "(deploy.wasm with the JS runtime's GraphExecutor, bindings/js)")
        from tether.graph import aot
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError("an AOT model's name is its C prefix and must be a C identifier, got %r" % name)
        aot.check_aot_nodes(graph)       # before minutes of kernel compilation
        factory = build_graph(graph, params, target, opt_level, fast_math, name, configs, precision=precision)
        return aot.build_aot(factory, aot_params, aot_workspace)
    tgt = as_target(target)
    t0 = time.perf_counter()
    plan = plan_kernels(graph, params, tgt, opt_level, precision)
    t_passes = time.perf_counter() - t0
    triples, funcs, shapes_of_func = compile_plan(plan, dict(configs or {}), name)
    if not triples:
        # a model with no kernel (constants / identity only) still ships a loadable library
        a = te.placeholder((1,), "float32", name="a")
        b = te.compute((1,), lambda i: a[i], name="b")
        triples.append((te.create_schedule([b.op]), [a, b], "%s_noop" % name))
    t1 = time.perf_counter()
    if tgt.gpu is not None:
        from tether.graph.gpu_graph import build_model_module

        gpu_names = {f for task, f in zip(plan.tasks, funcs) if task.device == "gpu"}
        cpu = [driver._lowered(it) for it in triples if driver._item_name(it) not in gpu_names]
        gpu = [driver._lowered(it) for it in triples if driver._item_name(it) in gpu_names]
        lib = build_model_module(cpu, gpu, tgt, name, fast_math=fast_math)
    else:
        lib = driver.build(triples, target=tgt, name=name, fast_math=fast_math)
    t_build = time.perf_counter() - t1

    graph, params = plan.graph, plan.params
    node_funcs = [None if k is None else funcs[k] for k in plan.task_of_node]
    memory = plan_memory(graph, params)
    node_devices = [None if k is None else plan.tasks[k].device for k in plan.task_of_node]
    graph_json = _graph_json(graph, params, memory, node_funcs, tgt, name, shapes_of_func, plan.dynamic,
                             node_devices if tgt.gpu is not None else None)
    timings = {"passes": t_passes, "lower_codegen_llvm": t_build, "total": time.perf_counter() - t0}
    log.info("build_graph %s for %s: %d nodes, %d kernels, %.2fs (passes %.2fs, build %.2fs)", graph.name,
             tgt.preset or tgt.triple, len(graph.nodes), len(triples), timings["total"], t_passes, t_build)
    return GraphFactory(graph, params, lib, graph_json, tgt, timings)


def compile_plan(plan: KernelPlan, configs: Mapping[str, Dict[str, Any]], name: str) -> tuple:
    """(the (schedule or PrimFunc, args, function name) of every task, in order; the function names; the
    argument shapes each function views its arguments with, None where they are the graph's). A task's config
    (``configs[task.key]``) schedules it, and its ``conv_panel`` repacks the conv weight of every node that runs
    it (in ``plan.params`` and ``plan.graph.types``)."""
    graph, tgt = plan.graph, plan.target
    triples: List[tuple] = []
    funcs: List[str] = []
    shapes_of_func: Dict[str, Optional[list]] = {}
    for task in plan.tasks:
        config = configs.get(task.key)
        if config and config.get("conv_panel"):
            for k in task.nodes:
                repack_conv_weight(graph.nodes[k], graph, plan.params, plan.panel_weights, config["conv_panel"])
        fname = "%s_k%d_%s" % (name, len(funcs), re.sub(r"[^A-Za-z0-9]+", "_", task.name)[:48])
        funcs.append(fname)
        if task.device == "gpu":
            from tether.graph.gpu_graph import lower_gpu_task
            try:
                triples.append(lower_gpu_task(task, config, fname))
                shapes_of_func[fname] = None
                continue
            except (ScheduleError, CompileError) as exc:
                # the GPU schedules, the split or the target's features (fp16) refused this kernel: the host's
                # CPU runs it (tether compile --check lists it with this reason)
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                task.device, task.cpu_reason = "cpu", "the GPU build refused it: %s" % first
                task.strategy = strategy_of(task.node, "cpu")   # (softmax's CPU kernel is loop IR)
                log.warning("kernel %s (%s) runs on the host's CPU: %s", fname, task.name, task.cpu_reason)
        # a GPU target's CPU kernels are built for its host
        cpu_tgt = tgt.host if tgt.gpu is not None else tgt
        if isinstance(task.strategy, LoopKernel):
            triples.append(task.strategy.build(task.node, graph.types, cpu_tgt, fname, compile_body_node))
            shapes_of_func[fname] = None
            continue
        # (after the repack above, the task's weight already has the config's layout)
        placeholders, out, shapes_of_func[fname] = task.lower(config)
        sch = ops.schedule([out], cpu_tgt, config=config)
        triples.append((sch, placeholders + [out], fname))
    return triples, funcs, shapes_of_func


def _graph_json(graph: Graph, params: Dict[str, np.ndarray], plan, node_funcs: List[Optional[str]], tgt: Any,
                name: str, shapes_of_func: Dict[str, Optional[list]], dynamic: frozenset = frozenset(),
                node_devices: Optional[List[Optional[str]]] = None) -> Dict[str, Any]:
    entries: List[Dict[str, Any]] = []
    index: Dict[str, int] = {}

    def entry(v: str) -> int:
        if v not in index:
            t = graph.types[v] if v in graph.types else None
            shape = list(t.shape) if t is not None else list(params[v].shape)
            dtype = t.dtype if t is not None else str(params[v].dtype)
            index[v] = len(entries)
            rec = {"name": v, "shape": shape, "dtype": dtype, "storage": plan.storage_of[v]}
            if plan.offset_of.get(v, 0):
                rec["offset"] = int(plan.offset_of[v])
            if v in dynamic:
                rec["dynamic"] = True
            entries.append(rec)
        return index[v]

    inputs = [entry(v) for v in graph.inputs]
    param_ids = [entry(v) for v in sorted(params)]
    nodes = []
    guards = node_guards(graph, params)
    for k, (node, func) in enumerate(zip(graph.nodes, node_funcs)):
        if numpy_nodes.is_numpy(node):
            rec = numpy_nodes.node_json(node, entry)
            if node_devices is not None:
                rec["device"] = "cpu"
            if guards[k]:
                rec["when"] = [[entry(v), bool(t)] for v, t in sorted(guards[k])]
            nodes.append(rec)
            continue
        ids = [entry(v) for v in node.body_params() + list(node.outputs)]
        if func is None:
            continue
        rec = {"name": node.name, "func": func, "args": ids, "ops": node.ops_label()}
        if node_devices is not None:   # a GPU target's node: "gpu", or "cpu" (the host runs it)
            rec["device"] = node_devices[k]
            if len(node.outputs) > 1:   # (what the executor plans the copies of a node's results by)
                rec["num_outputs"] = len(node.outputs)
        # ---- run-time If: the node runs only when these flags hold (graph/guards.py; executors may ignore it)
        if guards[k]:
            rec["when"] = [[entry(v), bool(t)] for v, t in sorted(guards[k])]
        if shapes_of_func.get(func):
            # the kernel views some arguments with other (same-size) shapes, e.g. a conv run as a GEMM
            rec["shapes"] = shapes_of_func[func]
        nodes.append(rec)
    outputs = [entry(v) for v in graph.outputs]
    return {
        "format": GRAPH_FORMAT, "name": graph.name, "lib": name + tgt.library_suffix,
        "version": numpy_nodes.NUMPY_GRAPH_VERSION if any("numpy" in n for n in nodes) else GRAPH_VERSION,
        "target": dict({"arch": tgt.arch, "triple": tgt.triple, "preset": getattr(tgt, "preset", None)},
                       **({"gpu": str(tgt)} if tgt.gpu is not None else {})),
        "storages": [int(s) for s in plan.sizes],
        "entries": entries, "inputs": inputs, "outputs": outputs, "params": param_ids, "nodes": nodes,
    }
