"""``tether.build_graph``: an imported graph -> one shared library + graph JSON + params.

    graph, params = tether.frontend.from_onnx(onnx.load("model.onnx"), shape={"input": (1, 3, 224, 224)})
    factory = tether.build_graph(graph, params, target="rasp4b", opt_level=3)
    factory.export("out/")        # out/deploy.so, out/deploy.json, out/deploy.params

Steps: the graph passes (``tether.graph.passes.optimize``), then every node that needs a kernel (a fused group or
a single op) becomes one: it is lowered to te by ``tether.graph.to_te`` and scheduled with ``ops.schedule``. Nodes with the same signature (ops, attributes, argument types) share one kernel, so a
model's twenty identical 3x3 convs compile once. All kernels go into one ``tether.build`` call and one .so.
Reshapes cost nothing: their output is a view of their input's storage (see the memory planner), and so do
concats whose inputs can live inside their output (``graph/passes/concat_views.py``): no kernel, no copy.

opt_level: 0 folds constants only; 1 adds batch-norm folding and DCE; 2 adds operator fusion; 3 (default) also
runs single-image convolutions as GEMMs vectorized along output channels (docs/graph.md), much faster on the
13..111-wide layers of real CNNs.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from tether_rpc.graph_executor import GRAPH_FORMAT, GRAPH_VERSION
from tether_rpc.params import save_params

from tether import driver, ops, te
from tether.graph.ir import Graph, Node
from tether.graph.passes import needs_kernel, optimize, plan_memory
from tether.graph.conv_gemm import pack_conv_weights, repack_conv_weight
from tether.graph.dense_panels import pack_dense_weights
from tether.graph.guards import node_guards
from tether.graph.loop_kernel import DIRECT_KERNELS
from tether.graph import numpy_nodes
from tether.graph.to_te import lower_kernel
from tether.target import as_target
from tether.tune.log import best_configs, task_key
from tether.graph import qnn as _qnn  # noqa: F401  (registers the quantized graph ops, issue 12)
from tether.graph.qconv import for_target as qconv_for_target

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
        """Write deploy.so, deploy.json and deploy.params into `folder` (created if needed)."""
        os.makedirs(folder, exist_ok=True)
        paths = {k: os.path.join(folder, "deploy." + k) for k in ("json", "params")}
        paths["so"] = os.path.join(folder, self.graph_json["lib"])
        self.lib.export_library(paths["so"])
        with open(paths["json"], "w", encoding="utf-8") as fh:
            fh.write(self.get_graph_json())
        with open(paths["params"], "wb") as fh:
            fh.write(save_params(self.params))
        return paths


# ---------------------------------------------------------------- kernel signatures
def _jsonable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def kernel_signature(node: Node, types: Dict[str, Any]) -> str:
    """Identical strings <=> the same kernel: ops, attributes and argument types, value names abstracted."""
    params = node.body_params()
    local = {p: "in%d" % k for k, p in enumerate(params)}
    parts = [[str(types[p]) for p in params]]
    for j, b in enumerate(node.body()):
        for o in b.outputs:
            local[o] = "t%d" % j
        # attributes named "_..." do not change the kernel (a branch guard) or are summarised by another
        # attribute (a loop body, by "body_sig")
        parts.append([b.op, sorted((k, _jsonable(v)) for k, v in b.attrs.items() if not k.startswith("_")),
                      [local[i] for i in b.inputs], [str(types[o]) for o in b.outputs]])
    return json.dumps(parts, sort_keys=True)


# ---------------------------------------------------------------- build
def prepare_graph(graph: Graph, params: Dict[str, np.ndarray], opt_level: int = 3, target: Any = None) -> tuple:
    """(graph, params, panel_weights) as the kernels see them: the passes of `opt_level`, then (at 3) conv weights
    packed into panels once (conv_gemm.pack_conv_weights; which pointwise convs qualify depends on `target`), and
    int8 convs set to `target`'s dot-product kind."""
    graph, params = optimize(graph, params, opt_level)
    panel_weights: Dict[str, tuple] = {}
    if opt_level >= 3:
        graph, params = graph.copy(), dict(params)
        panel_weights = pack_conv_weights(graph, params, as_target(target) if target else None)
        # ---- constant dense weights packed into the matmul's panels once (issue 11)
        pack_dense_weights(graph, params, as_target(target) if target else None)
    # ---- int8 convs (issue 12): each uses the target's dot-product instruction (graph/qconv.py); here, not in
    # build_graph, so that the tuner's tasks (tune/tasks.py) are the kernels the build compiles
    if target is not None:
        graph, params = qconv_for_target(graph, params, as_target(target))
    return graph, params, panel_weights


def build_graph(graph: Graph, params: Dict[str, np.ndarray], target: Any = "host", opt_level: int = 3,
                fast_math: bool = False, name: str = "deploy", tuning_log: Optional[str] = None) -> GraphFactory:
    """Optimise `graph` for `opt_level`, compile one kernel per distinct node into one library for `target`, plan
    the memory and write the graph JSON; ``.export(folder)`` on the result writes the deploy.* files.
    ``tuning_log``: a `tether tune` log; each kernel it has results for (on this target) gets its best config,
    the others their default schedule."""
    tgt = as_target(target)
    t0 = time.perf_counter()
    graph, params, panel_weights = prepare_graph(graph, params, opt_level, tgt)
    configs = tuned_configs(tuning_log, tgt)
    t_passes = time.perf_counter() - t0

    # one kernel per distinct signature
    func_of_sig: Dict[str, str] = {}
    triples = []
    node_funcs: List[Optional[str]] = []
    shapes_of_func: Dict[str, Optional[list]] = {}
    dynamic = numpy_nodes.check_dynamic(graph)
    for node in graph.nodes:
        if not needs_kernel(node) or numpy_nodes.is_numpy(node):     # numpy nodes run on the device as numpy
            node_funcs.append(None)
            continue
        sig = kernel_signature(node, graph.types)
        # ---- a tuned channel panel (issue 15): this node's conv weights are packed with the config's width
        config = configs.get(task_key(sig, tgt))
        if config and config.get("conv_panel"):
            repack_conv_weight(node, graph, params, panel_weights, config["conv_panel"])
        fname = func_of_sig.get(sig)
        if fname is None:
            fname = "%s_k%d_%s" % (name, len(func_of_sig), re.sub(r"[^A-Za-z0-9]+", "_", node.ops_label())[:48])
            func_of_sig[sig] = fname
            # ---- kernels written directly as loop IR (recurrent cells, compiled Loop/Scan: loops carrying state)
            if node.op in DIRECT_KERNELS:
                triples.append(DIRECT_KERNELS[node.op](node, graph.types, tgt, fname))
                shapes_of_func[fname] = None
                node_funcs.append(fname)
                continue
            placeholders, out, shapes_of_func[fname] = lower_kernel(node, graph.types, conv_gemm=opt_level >= 3,
                                                                    panel_weights=panel_weights)
            sch = ops.schedule([out], tgt, config=configs.get(task_key(sig, tgt)))
            triples.append((sch, placeholders + [out], fname))
        node_funcs.append(fname)
    if not triples:
        # a model with no kernel (constants / identity only) still ships a loadable library
        a = te.placeholder((1,), "float32", name="a")
        b = te.compute((1,), lambda i: a[i], name="b")
        triples.append((te.create_schedule([b.op]), [a, b], "%s_noop" % name))
    t1 = time.perf_counter()
    lib = driver.build(triples, target=tgt, name=name, fast_math=fast_math)
    t_build = time.perf_counter() - t1

    plan = plan_memory(graph, params)
    graph_json = _graph_json(graph, params, plan, node_funcs, tgt, name, shapes_of_func, dynamic)
    timings = {"passes": t_passes, "lower_codegen_llvm": t_build, "total": time.perf_counter() - t0}
    log.info("build_graph %s for %s: %d nodes, %d kernels, %.2fs (passes %.2fs, build %.2fs)", graph.name,
             tgt.preset or tgt.triple, len(graph.nodes), len(triples), timings["total"], t_passes, t_build)
    return GraphFactory(graph, params, lib, graph_json, tgt, timings)


# ---------------------------------------------------------------- tuning logs (issue 15)
def tuned_configs(tuning_log: Optional[str], tgt: Any) -> Dict[str, Dict[str, Any]]:
    """task key -> best config for `tgt` in `tuning_log` ({} without a log)."""
    if not tuning_log:
        return {}
    configs = best_configs(tuning_log, tgt)
    log.info("tuning log %s: best configs for %d kernels on this target", tuning_log, len(configs))
    return configs


def _graph_json(graph: Graph, params: Dict[str, np.ndarray], plan, node_funcs: List[Optional[str]], tgt: Any,
                name: str, shapes_of_func: Dict[str, Optional[list]], dynamic: frozenset = frozenset()
                ) -> Dict[str, Any]:
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
            if guards[k]:
                rec["when"] = [[entry(v), bool(t)] for v, t in sorted(guards[k])]
            nodes.append(rec)
            continue
        ids = [entry(v) for v in node.body_params() + list(node.outputs)]
        if func is None:
            continue
        rec = {"name": node.name, "func": func, "args": ids, "ops": node.ops_label()}
        # ---- run-time If: the node runs only when these flags hold (graph/guards.py; executors may ignore it)
        if guards[k]:
            rec["when"] = [[entry(v), bool(t)] for v, t in sorted(guards[k])]
        if shapes_of_func.get(func):
            # the kernel views some arguments with other (same-size) shapes, e.g. a conv run as a GEMM
            rec["shapes"] = shapes_of_func[func]
        nodes.append(rec)
    outputs = [entry(v) for v in graph.outputs]
    return {
        "format": GRAPH_FORMAT, "name": graph.name, "lib": "%s.so" % name,
        "version": numpy_nodes.NUMPY_GRAPH_VERSION if any("numpy" in n for n in nodes) else GRAPH_VERSION,
        "target": {"arch": tgt.arch, "triple": tgt.triple, "preset": getattr(tgt, "preset", None)},
        "storages": [int(s) for s in plan.sizes],
        "entries": entries, "inputs": inputs, "outputs": outputs, "params": param_ids, "nodes": nodes,
    }
