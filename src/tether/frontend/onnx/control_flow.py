"""ONNX control flow: If, Loop and Scan, converted by inlining their subgraphs into the parent graph.

A subgraph is converted in the parent's import state (``inline_subgraph``): it reads outer-scope values by name,
its formal inputs are bound to actual values, and every value it defines gets a fresh name, so a body inlined
once per iteration never collides with itself. Names are resolved through ``Importer.rename``, scoped per
inlining, which is what lets nested subgraphs (an If inside a Loop body) see the right values.

- ``If`` with a condition known at import (a constant, or folded from shapes) inlines the taken branch only.
  On a run-time condition both branches are inlined and each output is ``where(cond, then, else)``: ONNX
  subgraphs are side-effect free, so running both computes exactly the taken branch's values. Each branch's
  nodes are marked with their condition (graph/guards.py), so the graph executor runs only the taken branch's
  kernels. Branch outputs must have the same shape and dtype.
- ``Loop`` with a trip count and initial condition known at import: up to ``UNROLL_UP_TO`` iterations it is
  unrolled (the body once per iteration, loop-carried values threaded through, scan outputs stacked along a new
  axis 0; a condition the body computes may end it early if it folds each iteration). Longer loops compile to
  one ``loop`` op whose kernel loops inside (kernels/loop_op.py): the body converted once, with the iteration
  number and the carried values as run-time inputs; its condition must then fold to true. A loop that can
  only be unrolled is refused past ``MAX_UNROLL`` iterations.
- ``Scan`` (opset 9+) likewise: unrolled up to ``UNROLL_UP_TO`` steps, one looping kernel beyond, with
  per-input axes and directions and per-output axes and directions.
Identical kernels of unrolled iterations compile once (build_graph shares kernels by signature).
"""
from __future__ import annotations

import hashlib
import logging
from typing import Dict, List, Sequence

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import (Container, ConverterTable, Importer, alias_container, check_no_container,
                                           containers, converter_key, defined, emit_reshape, node_attrs, norm_axis)
from tether.graph.guards import GUARD_ATTR
from tether.graph.ir import TensorType

CONVERTERS = ConverterTable(__name__)

log = logging.getLogger(__name__)

# iterations a Loop or Scan may unroll to: the graph grows by a body per iteration
MAX_UNROLL = 256
# a Loop of more iterations compiles to one kernel looping inside when it can (kernels/loop_op.py)
UNROLL_UP_TO = 16


def inline_subgraph(im: Importer, graph, bindings: Dict[str, str], scope: str) -> List[str]:
    """Convert ``graph`` (a GraphProto) into ``im`` with its inputs bound to ``bindings`` (formal name -> value);
    returns the tether value names of its outputs."""
    import onnx

    saved = dict(im.rename)
    try:
        for vi in graph.input:
            if vi.name not in bindings:
                raise UnsupportedOpError("subgraph %s: input %r is not bound" % (graph.name, vi.name))
        im.rename.update(bindings)
        for init in graph.initializer:
            im.rename[init.name] = im.add_const(onnx.numpy_helper.to_array(init), hint=scope + "_init")
        for i, node in enumerate(graph.node):
            if node.domain not in ("", "ai.onnx") or node.op_type not in im.converters:
                raise UnsupportedOpError("subgraph %s: op %s (node %s) is not supported"
                                         % (graph.name, node.op_type, node.name or "#%d" % i))
            local = onnx.NodeProto()
            local.CopyFrom(node)
            local.name = "%s/%s" % (scope, node.name or "%s_%d" % (node.op_type, i))
            ins = [im.name(x) if x else "" for x in node.input]
            for x in ins:
                if x and not defined(im, x):
                    raise ValueError("node %s (%s) reads %r, which nothing defines" % (local.name, node.op_type, x))
            check_no_container(im, local, ins)
            del local.input[:]
            local.input.extend(ins)
            outs = []
            for o in node.output:
                if o:
                    im.rename[o] = im.fresh(scope + "_" + o)
                outs.append(im.rename[o] if o else "")
            del local.output[:]
            local.output.extend(outs)
            convert = im.converters.get(converter_key(node))
            if convert is None:
                raise UnsupportedOpError("node %s: op type %s (domain %r) inside a subgraph has no converter"
                                         % (local.name, node.op_type, node.domain or "ai.onnx"))
            convert(im, local, ins, node_attrs(local))
            for o in outs:
                if o and not defined(im, o):
                    raise UnsupportedOpError("node %s (%s): output %r was not produced" % (local.name, node.op_type, o))
        return [im.name(o.name) for o in graph.output]
    finally:
        im.rename.clear()
        im.rename.update(saved)


def _bind_output(im: Importer, value: str, out: str) -> None:
    """Make ONNX output ``out`` the value ``value`` (a view: no kernel, no copy)."""
    if alias_container(im, value, out):     # a sequence or optional: the same values
        return
    if value in im.consts:
        im.add_const(im.consts[value], name=out)
    else:
        im.emit("reshape", [value], {"shape": im.type(value).shape}, outputs=[out])


def _scalar_const(im: Importer, value: str, what: str, node) -> np.ndarray:
    c = im.const(value)
    if c is None:
        raise UnsupportedOpError("node %s: %s %s is computed at run time; tether needs it at compile time"
                                 % (node.name, node.op_type, what))
    return np.asarray(c).reshape(-1)


# ---------------------------------------------------------------- If
def _guarded_branch(im: Importer, branch, scope: str, flag: str, taken: bool) -> List[str]:
    """Inline a branch of a run-time If, marking its nodes to run only when ``flag`` is ``taken``
    (``GUARD_ATTR``, read by graph/guards.py)."""
    start = len(im.nodes)
    values = inline_subgraph(im, branch, {}, scope)
    # each output reaches the select through a view, so no kernel of the branch fuses with the select (which
    # runs always) and the branch's kernels keep their guard
    values = [_branch_view(im, v) for v in values]
    for n in im.nodes[start:]:
        n.attrs[GUARD_ATTR] = [[flag, taken]] + list(n.attrs.get(GUARD_ATTR, []))
    return values


def _branch_view(im: Importer, v: str) -> str:
    """A view of branch output ``v``; a sequence or optional becomes one of views of its elements."""
    c = containers(im).get(v)
    if c is None:
        return v if v in im.consts else im.emit("reshape", [v], {"shape": im.type(v).shape})
    name = im.fresh("branch_" + c.kind)
    containers(im)[name] = Container(c.kind, [_branch_view(im, x) for x in c.items], c.elem)
    return name


def _select(im: Importer, node, flag: str, tv: str, ev: str, out: str) -> str:
    """``out`` = the taken branch's value: ``where`` per tensor; sequences and optionals element by element when
    both branches give the same structure (length, element types), refused otherwise (it would depend on data)."""
    ct, ce = containers(im).get(tv), containers(im).get(ev)
    if ct is None and ce is None:
        tt, et = im.type(tv), im.type(ev)
        if tt != et:
            raise UnsupportedOpError("node %s: If branches give output %r as %s and %s; tether selects between "
                                     "branches of one type" % (node.name, out, tt, et))
        return im.emit("where", [flag, tv, ev], outputs=[out] if out else None)
    if ct is None or ce is None or ct.kind != ce.kind or len(ct.items) != len(ce.items):
        def describe(c, v):
            return "a tensor" if c is None else "%s of %d" % ("an optional" if c.kind == "optional" else "a sequence",
                                                              len(c.items))
        raise UnsupportedOpError("node %s: an If on a run-time condition gives %r as %s or %s; tether selects "
                                 "between values of one structure only" % (node.name, out or tv, describe(ct, tv),
                                                                          describe(ce, ev)))
    items = [_select(im, node, flag, t, e, "") for t, e in zip(ct.items, ce.items)]
    name = out or im.fresh("selected_" + ct.kind)
    containers(im)[name] = Container(ct.kind, items, ct.elem or ce.elem)
    return name


@CONVERTERS.register("If")
def _if(im: Importer, node, ins: List[str], a: dict) -> None:
    cond = ins[0]
    c = im.const(cond)
    if c is not None:
        branch = a["then_branch"] if bool(np.asarray(c).reshape(-1)[0]) else a["else_branch"]
        results = inline_subgraph(im, branch, {}, node.name)
        for out, value in zip(node.output, results):
            if out:
                _bind_output(im, value, out)
        return
    if im.type(cond).size != 1:
        raise UnsupportedOpError("node %s: If condition of shape %s (one element expected)"
                                 % (node.name, im.type(cond).shape))
    if im.type(cond).dtype != "bool":
        cond = im.emit("cast", [cond], {"to": "bool"})
    # an explicit view (not fusable), so the flag keeps its own bytes for the executor to read
    flag = im.emit("reshape", [cond], {"shape": ()}, node.name + "_flag")
    then_vals = _guarded_branch(im, a["then_branch"], node.name + "_then", flag, True)
    else_vals = _guarded_branch(im, a["else_branch"], node.name + "_else", flag, False)
    for out, tv, ev in zip(node.output, then_vals, else_vals):
        if out:
            _select(im, node, flag, tv, ev, out)


# ---------------------------------------------------------------- Loop
def _stack(im: Importer, values: Sequence[str], axis: int, out: str) -> None:
    """values (each of one shape) stacked along a new ``axis`` into ``out``."""
    parts = []
    for v in values:
        shape = list(im.type(v).shape)
        shape.insert(axis, 1)
        parts.append(emit_reshape(im, v, shape))
    if len(parts) == 1:
        _bind_output(im, parts[0], out)
    else:
        im.emit("concat", parts, {"axis": axis}, outputs=[out])


@CONVERTERS.register("Loop")
def _loop(im: Importer, node, ins: List[str], a: dict) -> None:
    body = a["body"]
    m_name = ins[0] if ins and ins[0] else None
    c_name = ins[1] if len(ins) > 1 and ins[1] else None
    carried = list(ins[2:])
    trips = int(_scalar_const(im, m_name, "trip count M", node)[0]) if m_name else None
    cond = bool(_scalar_const(im, c_name, "condition", node)[0]) if c_name else True
    if trips is None:
        raise UnsupportedOpError("node %s: Loop without a trip count (a loop until a run-time condition)"
                                 % node.name)
    if _compiled(node, "Loop", trips if cond else 0, lambda: _compiled_loop(im, node, a["body"], trips, ins[2:])):
        return
    n_carried = len(carried)
    n_scan = len(body.output) - 1 - n_carried
    formal = [vi.name for vi in body.input]
    values = list(carried)
    scans: List[List[str]] = [[] for _ in range(n_scan)]
    it_dtype = "int64"
    i = 0
    while i < trips and cond:
        bindings = {formal[0]: im.add_const(np.array(i, dtype=it_dtype), hint="iter"),
                    formal[1]: im.add_const(np.array(cond), hint="cond")}
        bindings.update(dict(zip(formal[2:], values)))
        results = inline_subgraph(im, body, bindings, "%s_it%d" % (node.name, i))
        cond = bool(_scalar_const(im, results[0], "body condition output", node)[0])
        values = results[1:1 + n_carried]
        for k in range(n_scan):
            scans[k].append(results[1 + n_carried + k])
        i += 1
    for out, v in zip(node.output[:n_carried], values):
        if out:
            _bind_output(im, v, out)
    for out, vs in zip(node.output[n_carried:], scans):
        if not out:
            continue
        if not vs:
            raise UnsupportedOpError("node %s: Loop scan output %r of zero iterations (its shape is unknown)"
                                     % (node.name, out))
        if any(v in containers(im) for v in vs):
            raise UnsupportedOpError("node %s: Loop scan output %r stacks sequences or optionals" % (node.name, out))
        _stack(im, vs, 0, out)


def _compiled(node, what: str, count: int, compile_body) -> bool:
    """Past UNROLL_UP_TO iterations try ``compile_body()`` (one looping kernel): True if it did. False means
    unroll, which is refused past MAX_UNROLL."""
    if count > UNROLL_UP_TO:
        try:
            compile_body()
            return True
        except UnsupportedOpError as exc:
            if count > MAX_UNROLL:
                raise
            log.info("node %s: %s unrolled (%s)", node.name, what, exc)
    if count > MAX_UNROLL:
        raise UnsupportedOpError("node %s: %s of %d iterations; tether unrolls at most %d"
                                 % (node.name, what, count, MAX_UNROLL))
    return False


def _compiled_loop(im: Importer, node, body, trips: int, carried: List[str]) -> None:
    """The Loop as one ``loop`` op whose kernel loops inside (kernels/loop_op.py): the body is converted once,
    with the iteration number and the carried values as free inputs. Its condition must fold to true."""
    formal = [vi.name for vi in body.input]

    def bind(sub: Importer, it: str, cins: List[str], slices: List[str]) -> Dict[str, str]:
        bindings = {formal[0]: it, formal[1]: sub.add_const(np.array(True), hint="cond")}
        bindings.update(zip(formal[2:], cins))
        return bindings
    _loop_op(im, node, body, trips, carried, [], bind, has_cond=True)


def _loop_op(im: Importer, node, body, trips: int, carried: List[str], scan_in: List[tuple], bind,
             has_cond: bool, out_axes: Sequence[int] = (), out_dirs: Sequence[int] = ()) -> None:
    """Convert ``body`` once into its own node list and emit one ``loop`` op over it. ``scan_in``: per scan
    input (outer value, axis, reverse); ``bind(sub, it, carried_in, slices)`` maps the body's inputs."""
    for v in carried:
        if v in containers(im):
            raise UnsupportedOpError("node %s: a %s (%r) carried through a loop compiled as one kernel; tether "
                                     "carries tensors only (loops of up to %d iterations are unrolled)"
                                     % (node.name, containers(im)[v].kind, v, MAX_UNROLL))
    sub = Importer(im.opset, im.converters)
    sub.types, sub.consts = dict(im.types), dict(im.consts)
    sub.counter, sub.reserved = im.counter, set(im.reserved) | set(im.types)
    it = sub.fresh("iter")
    sub.types[it] = TensorType((), "int64")
    cins = []
    for v in carried:
        c = sub.fresh("carry")
        sub.types[c] = im.type(v)
        cins.append(c)
    slices = []
    for v, axis, _ in scan_in:
        c = sub.fresh("slice")
        shape = im.type(v).shape
        sub.types[c] = TensorType(shape[:axis] + shape[axis + 1:], im.type(v).dtype)
        slices.append(c)
    results = inline_subgraph(sub, body, bind(sub, it, cins, slices), node.name + "_body")
    im.counter = sub.counter
    if has_cond:
        c = sub.const(results[0])
        if c is None or not bool(np.asarray(c).reshape(-1)[0]):
            raise UnsupportedOpError("node %s: the Loop body's condition is computed at run time or false"
                                     % node.name)
        results = results[1:]
    n = len(carried)
    couts, scans = results[:n], results[n:]
    for ci, co in zip(cins, couts):
        if sub.type(ci) != sub.type(co):
            raise UnsupportedOpError("node %s: loop-carried value changes type %s -> %s"
                                     % (node.name, sub.type(ci), sub.type(co)))
    inside = {it, *cins, *slices} | {o for nd in sub.nodes for o in nd.outputs}
    ext: List[str] = []
    for v in [i for nd in sub.nodes for i in nd.inputs] + list(couts) + list(scans):
        if v not in inside and v not in ext:
            ext.append(v)
    for v in ext:
        if v in sub.consts and v not in im.consts:
            im.add_const(sub.consts[v], name=v)
    inputs = list(carried) + ext + [v for v, _, _ in scan_in]
    first_scan = n + len(ext)
    body_rec = {"nodes": sub.nodes, "types": {v: sub.types[v] for v in set(ext) | inside}, "it": it,
                "carried_in": cins, "carried_out": list(couts), "scans": list(scans), "ext": ext,
                "scan_in": [[s, first_scan + k, axis, int(rev)] for k, (s, (_, axis, rev)) in
                            enumerate(zip(slices, scan_in))],
                "scan_out_axes": [norm_axis(int(x), len(sub.type(v).shape) + 1) for x, v in zip(out_axes, scans)]
                if out_axes else [0] * len(scans),
                "scan_out_dirs": [int(d) for d in out_dirs] or [0] * len(scans)}
    text = "\n".join(str(nd) for nd in sub.nodes) + "|%r" % {k: v for k, v in body_rec.items()
                                                              if k not in ("nodes", "types")}
    # the body's fingerprint stands for it in kernel signatures (build.py skips "_" attributes)
    attrs = {"trips": trips, "n_carried": n, "body_sig": hashlib.sha256(text.encode()).hexdigest()[:20],
             "_body": body_rec}
    n_out = n + len(scans)
    outs = [o if o else im.fresh(node.name + "_unused") for o in (list(node.output) + [""] * n_out)[:n_out]]
    im.emit("loop", inputs, attrs, node.name, outs)


# ---------------------------------------------------------------- Scan
@CONVERTERS.register("Scan")
def _scan(im: Importer, node, ins: List[str], a: dict) -> None:
    if im.opset < 9:
        raise UnsupportedOpError("node %s: Scan before opset 9 (batched form with sequence_lens)" % node.name)
    body = a["body"]
    n_in = int(a["num_scan_inputs"])
    states, xs = list(ins[:len(ins) - n_in]), list(ins[len(ins) - n_in:])
    n_state = len(states)
    n_out = len(body.output) - n_state
    in_axes = [norm_axis(int(x), len(im.type(v).shape)) for x, v in zip(a.get("scan_input_axes", [0] * n_in), xs)]
    in_dirs = list(a.get("scan_input_directions", [0] * n_in))
    out_dirs = list(a.get("scan_output_directions", [0] * n_out))
    lengths = {im.type(v).shape[ax] for v, ax in zip(xs, in_axes)}
    if len(lengths) != 1:
        raise UnsupportedOpError("node %s: Scan inputs of different lengths %s" % (node.name, sorted(lengths)))
    steps = lengths.pop()
    formal = [vi.name for vi in body.input]
    out_axes = [int(x) for x in a.get("scan_output_axes", [0] * n_out)]
    def bind(sub: Importer, it: str, cins: List[str], slices: List[str]) -> Dict[str, str]:
        return dict(zip(formal, cins + slices))
    if _compiled(node, "Scan", steps, lambda: _loop_op(im, node, body, steps, states, list(zip(xs, in_axes, in_dirs)),
                                                       bind, has_cond=False, out_axes=out_axes, out_dirs=out_dirs)):
        return
    values = list(states)
    outs: List[List[str]] = [[] for _ in range(n_out)]
    for t in range(steps):
        bindings = dict(zip(formal[:n_state], values))
        for k, (x, ax, rev) in enumerate(zip(xs, in_axes, in_dirs)):
            pos = steps - 1 - t if rev else t
            shape = im.type(x).shape
            begin = [0] * len(shape)
            end = list(shape)
            begin[ax], end[ax] = pos, pos + 1
            sl = im.emit("strided_slice", [x], {"begin": begin, "end": end, "step": [1] * len(shape)})
            bindings[formal[n_state + k]] = emit_reshape(im, sl, shape[:ax] + shape[ax + 1:])
        results = inline_subgraph(im, body, bindings, "%s_t%d" % (node.name, t))
        values = results[:n_state]
        for k in range(n_out):
            outs[k].append(results[n_state + k])
    for out, v in zip(node.output[:n_state], values):
        if out:
            _bind_output(im, v, out)
    for k, (out, vs) in enumerate(zip(node.output[n_state:], outs)):
        if not out:
            continue
        if not vs:
            raise UnsupportedOpError("node %s: Scan output %r over zero steps" % (node.name, out))
        rank = len(im.type(vs[0]).shape) + 1
        axes = a.get("scan_output_axes", [0] * n_out)
        ax = norm_axis(int(axes[k]), rank)
        _stack(im, list(reversed(vs)) if out_dirs[k] else vs, ax, out)

