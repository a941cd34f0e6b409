"""The kernel plan of a model for one target: which nodes become which kernel, and how.

    plan = plan_kernels(graph, params, target="host", opt_level=3)
    for task in plan.tasks: task.key, task.strategy.lowering, task.weight, task.space

``plan_kernels`` runs the graph passes of `opt_level` and the build-time weight packing (``prepare_graph``), then
asks the op table (``tether.kernels``) for each node's strategy on the target's kind: nodes that are views (a
reshape, a concat written in place) and numpy nodes get no kernel; every other node is one ``KernelTask`` per
distinct ``kernel_signature`` (ops, attributes, argument types), so a model's twenty identical 3x3 convs are one
task of weight 20. ``graph.build.build_graph`` compiles the plan's tasks, in order, into one library; ``tether
tune`` measures its tunable ones (``te`` tasks: loop-IR kernels take no schedule config). A task's ``key`` (a hash
of its signature and the target's full description) is what a tuning log records and a build looks configs up by.

On a GPU target (kind "opencl", "vulkan", "cuda") each task also has a ``device``: "gpu" for a node whose ops all
have a GPU strategy (te lowered with the plain layouts, scheduled by ``ops.gpu_schedules.schedule_gpu``), "cpu"
for the others (loop-IR kernels: loops, recurrent kernels), which run on the host's CPU with their CPU strategy
and ``cpu_reason`` saying why. ``prepare_graph`` neither packs weights into the CPU's GEMM panels nor makes concats
views for a GPU target: kernels there take whole buffers, so every value starts at its storage's start.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tether import ops
from tether.errors import UnsupportedOpError
from tether.graph import numpy_nodes
from tether.graph.conv_gemm import pack_conv_weights, panel_type, panel_weight
from tether.graph.dense_panels import pack_dense_weights
from tether.graph.ir import Graph, Node, TensorType
from tether.graph.passes import concat_views, float_channels_last, fuse_prologues, needs_kernel, optimize, pipeline
from tether.graph.to_te import lower_kernel
from tether.kernels.qconv_ops import for_target as qconv_for_target
from tether.kernels.registry import LoopKernel, Strategy, TeLowering, target_kind
from tether.kernels.table import OPS
from tether.ops.schedules import family_of
from tether.target import Target, as_target, check_precision
from tether.te.lower import lower as te_lower
from tether.tune.space import ConfigSpace, space_for

# the strategy of a fused node: one te kernel, its body's ops each lowered by their own TeLowering (lower_kernel)
FUSED = TeLowering(lower=None)


# ---------------------------------------------------------------- kernel signatures and task keys
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


def target_id(target: Any) -> str:
    """The target as a tuning log names it: preset (or triple) and a hash of its full description (triple, cpu,
    features: what codegen sees), so `host` on two different CPUs are two targets."""
    tgt = as_target(target)
    return "%s:%s" % (tgt.preset or tgt.triple, hashlib.sha1(str(tgt).encode()).hexdigest()[:10])


def task_key(signature: str, target: Any) -> str:
    """A kernel's identity on one target: what a tuning log records and a build looks its config up by."""
    return hashlib.sha1((target_id(target) + "\n" + signature).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the graph as the kernels see it
def prepare_graph(graph: Graph, params: Dict[str, np.ndarray], opt_level: int = 3, target: Any = None,
                  precision: str = "fp32") -> tuple:
    """(graph, params, panel_weights) as the kernels see them: the passes of `opt_level` (and `precision`), then
    (at 3) conv weights packed into panels once (conv_gemm.pack_conv_weights; which pointwise convs qualify
    depends on `target`), constant dense weights packed into the matmul's panels (dense_panels), and int8 convs set
    to `target`'s dot-product kind (kernels/qconv_ops.for_target)."""
    tgt = as_target(target) if target is not None else None
    if tgt is not None and tgt.gpu is not None:
        return _prepare_gpu_graph(graph, params, opt_level, tgt)
    graph, params = optimize(graph, params, opt_level, precision)
    panel_weights: Dict[str, tuple] = {}
    if opt_level >= 3:
        graph, params = graph.copy(), dict(params)
        panel_weights = pack_conv_weights(graph, params, as_target(target) if target else None)
        pack_dense_weights(graph, params, as_target(target) if target else None)
    if target is not None:
        graph, params = qconv_for_target(graph, params, as_target(target))
    return graph, params, panel_weights


# passes a GPU build leaves out: concat views (a GPU kernel binds whole buffers, never a view at an offset) and the
# prologue fusion made for the CPU's GEMM convs, and the CPU's channels-last depthwise-separable blocks
_CPU_ONLY_PASSES = (concat_views, fuse_prologues, float_channels_last)


def _prepare_gpu_graph(graph: Graph, params: Dict[str, np.ndarray], opt_level: int, tgt: Target) -> tuple:
    for p in pipeline(opt_level):
        if p not in _CPU_ONLY_PASSES:
            graph, params = p(graph, params)
    # (int8 convs run on the GPU in the plain dot4 kind, not in the host's dot-product kind: no qconv_ops.for_target)
    return graph, params, {}


def placement(node: Node, kind: str) -> Tuple[Strategy, str, str]:
    """(strategy, device, why) of a node that needs a kernel on targets of `kind`: on a GPU kind, device "gpu"
    where every op of the node has a GPU te strategy, else "cpu" (the host runs the node with its CPU strategy)
    and `why` names the op; on a CPU kind, ("cpu", "")."""
    if kind == "cpu":
        return strategy_of(node, kind), "cpu", ""
    ops_ = [b.op for b in node.body()] if node.op == "fused" else [node.op]
    for op in ops_:
        s = OPS.strategy(op, kind)
        if s is None or (node.op == "fused" and not isinstance(s, TeLowering)):
            cpu = OPS.strategy(op, "cpu")
            how = cpu.lowering if cpu is not None else "none"
            return strategy_of(node, "cpu"), "cpu", "op %s has no %s strategy (its CPU kernel is %s)" % (
                op, kind, how)
    return strategy_of(node, kind), "gpu", ""


def strategy_of(node: Node, kind: str) -> Strategy:
    """How `node` becomes code on targets of `kind` (a fused node: its body lowered to te as one kernel)."""
    if node.op == "fused":
        return FUSED
    strategy = OPS.strategy(node.op, kind)
    if strategy is None:
        raise UnsupportedOpError("graph op %r has no kernel strategy for %s targets" % (node.op, kind))
    return strategy


def compile_body_node(node: Node, types: Dict[str, TensorType], target: Target, name: str) -> Any:
    """One node of a body a kernel runs inside (a Loop's) as a PrimFunc named `name`, by its strategy (te
    scheduled with the defaults, no GEMM convs); None for a view (a reshape), which needs no kernel."""
    if OPS.is_alias(node):
        return None
    kind = target_kind(target)
    strategy = strategy_of(node, kind)
    if isinstance(strategy, LoopKernel):
        return strategy.build(node, types, target, name, compile_body_node)
    placeholders, out, _ = lower_kernel(node, types, conv_gemm=False, kind=kind)
    return te_lower(ops.schedule([out], target), placeholders + [out], name)


# ---------------------------------------------------------------- the plan
@dataclass
class KernelTask:
    """One distinct kernel of a model on one target, and the nodes that run it."""

    key: str
    signature: str
    name: str                       # the first node's ops label, e.g. "conv2d+add+clip"
    strategy: Strategy
    node: Node = field(repr=False)   # the first node that runs it: the kernel is lowered from this one
    nodes: List[int] = field(default_factory=list)     # indices into the plan's graph.nodes of all that run it
    plan: "KernelPlan" = field(default=None, repr=False)  # type: ignore[assignment]
    device: str = "cpu"            # where the kernel runs: "gpu", or "cpu" (every CPU target; a GPU target's host)
    cpu_reason: str = ""           # on a GPU target, why the kernel runs on the host's CPU

    @property
    def weight(self) -> int:
        """How many nodes of the model run this kernel."""
        return len(self.nodes)

    # ---- the conv weight layout a config's conv_panel asks for: the kernel's argument changes with it
    def panel_weight(self) -> Optional[str]:
        """The build-time packed conv weight this kernel reads (conv_gemm.pack_conv_weights), or None."""
        return panel_weight(self.node, self.plan.panel_weights)

    def layout(self, config: Optional[Dict[str, Any]]) -> Optional[int]:
        """The panel width `config` repacks this kernel's conv weight to, or None when it keeps the plan's layout
        (configs with the same layout share their input arrays)."""
        width = (config or {}).get("conv_panel")
        wname = self.panel_weight()
        if not width or wname is None or int(self.plan.graph.types[wname].shape[2]) == width:
            return None
        return int(width)

    def types_for(self, config: Optional[Dict[str, Any]]) -> Dict[str, TensorType]:
        """The value types this kernel is lowered with under `config` (its conv weight in the config's panels)."""
        types = self.plan.graph.types
        width = self.layout(config)
        if width is None:
            return types
        wname = self.panel_weight()
        types = dict(types)
        types[wname] = panel_type(self.plan.graph.types, wname, self.plan.panel_weights[wname][0], width)
        return types

    def lower(self, config: Optional[Dict[str, Any]] = None) -> tuple:
        """(placeholders, output te tensor, argument views) of a te task, fresh (te graphs are not shared between
        builds), with its weights laid out for `config`; the views are the shapes the kernel reads some arguments
        with (a conv run as a GEMM), None where they are the graph's."""
        if not isinstance(self.strategy, TeLowering):
            raise ValueError("kernel %s (%s) is %s, not lowered through te"
                             % (self.key, self.name, self.strategy.lowering))
        gpu_target = self.plan.target.gpu is not None
        kind = self.plan.kind if self.device == "gpu" else "cpu"
        return lower_kernel(self.node, self.types_for(config), conv_gemm=self.plan.opt_level >= 3 and not gpu_target,
                            panel_weights=self.plan.panel_weights, kind=kind)

    def interface(self) -> Tuple[List[Tuple[Tuple[int, ...], str]], ConfigSpace]:
        """((shape, dtype) of every argument, inputs then output; the config space) of a te task."""
        placeholders, out, _ = self.lower()
        args = [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in placeholders + [out]]
        return args, space_for(out, family_of(self.plan.target))


@dataclass
class KernelPlan:
    """The kernels of one model for one target: the prepared graph and params they read, and the tasks."""

    graph: Graph
    params: Dict[str, np.ndarray]
    panel_weights: Dict[str, tuple]
    target: Target
    opt_level: int
    kind: str
    tasks: List[KernelTask]
    task_of_node: List[Optional[int]]       # per node of graph: the index of its task, None for no kernel
    dynamic: frozenset = frozenset()        # the data-dependent values (numpy_nodes.check_dynamic)

    def tunable_tasks(self) -> List[KernelTask]:
        """The te tasks `tether tune` measures; none on a GPU target yet (its config space is the CPU schedules')."""
        if self.target.gpu is not None:
            return []
        return [t for t in self.tasks if t.strategy.tunable]


def plan_kernels(graph: Graph, params: Dict[str, np.ndarray], target: Any = "host", opt_level: int = 3,
                 precision: str = "fp32") -> KernelPlan:
    """The kernel plan of (graph, params) for `target` at `opt_level` (see the module's docstring); tasks are in
    the order of their first node. ``precision="fp16"``: float32 math in half (graph/passes/half_precision.py),
    for a target with half arithmetic (target.check_precision)."""
    tgt = as_target(target)
    check_precision(tgt, precision)
    kind = target_kind(tgt)
    graph, params, panel_weights = prepare_graph(graph, params, opt_level, tgt, precision)
    dynamic = numpy_nodes.check_dynamic(graph)
    plan = KernelPlan(graph, params, panel_weights, tgt, opt_level, kind, [], [], dynamic)
    index_of_sig: Dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        strategy, device, why = placement(node, kind) if needs_kernel(node) else (None, "cpu", "")
        if strategy is None or strategy.lowering == "numpy":
            plan.task_of_node.append(None)
            continue
        sig = kernel_signature(node, graph.types)
        index = index_of_sig.get(sig)
        if index is None:
            index = index_of_sig[sig] = len(plan.tasks)
            plan.tasks.append(KernelTask(task_key(sig, tgt), sig, node.ops_label(), strategy, node, [], plan,
                                         device, why))
        plan.tasks[index].nodes.append(k)
        plan.task_of_node.append(index)
    return plan
