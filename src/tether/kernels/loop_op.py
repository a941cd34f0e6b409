"""The ``loop`` graph op: an ONNX Loop with a static trip count, compiled into one kernel that loops inside.

The frontend converts the body once, into its own node list (``attrs["_body"]``), with a run-time iteration
number and the loop-carried values as free inputs. The kernel (``loop_kernel``) lowers every body node to loop IR
as its strategy says (te + the op library's schedules, or a direct kernel: the ``compile_body`` callback the
build passes in), points each one's buffers at the loop's buffers, and wraps them all in one serial loop:

    carry = init
    for it in range(trips):
        <body kernels>              # read it, carry and the values from outside; write body values
        stage = carried outputs; carry = stage      # (two steps: an output may be another input)
        out_scan[k][it] = scan value k
    final outputs = carry
(a Scan is the same loop with per-iteration slices of its scan inputs, ``scan_in``, and scan outputs placed at
any axis, either direction.)

Body values live in the kernel's scratch memory. Parallel loops inside body kernels run serially (one kernel,
one thread). Inputs: the initial carried values, then every value from outside the body (``ext``: outer graph
values and constants). Outputs: the final carried values, then each scan output stacked along a new axis 0.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from tether import te
from tether.graph.ir import Node, TensorType
from tether.kernels.registry import BodyCompiler, LoopKernel, OpDef, OpTable, Strategy, kernel_shape
from tether.tir import (Allocate, Buffer, Cast, Const, For, IfThenElse, Load, PrimFunc, Store, Var, rebuild,
                        replace, seq)


def _scan_out_shape(attrs, k: int, shape) -> tuple:
    shape = list(shape)
    shape.insert(attrs["_body"].get("scan_out_axes", [0] * (k + 1))[k], attrs["trips"])
    return tuple(shape)


def _infer(attrs, *in_types):
    b = attrs["_body"]
    n = attrs["n_carried"]
    outs = [TensorType(t.shape, t.dtype) for t in in_types[:n]]
    for k, s in enumerate(b["scans"]):
        t = b["types"][s]
        outs.append(TensorType(_scan_out_shape(attrs, k, t.shape), t.dtype))
    return outs


def _ref(table: OpTable, attrs, *arrays):
    b = attrs["_body"]
    n = attrs["n_carried"]
    carry = [np.asarray(a) for a in arrays[:n]]
    ext = dict(zip(b["ext"], arrays[n:]))
    scans: List[List[np.ndarray]] = [[] for _ in b["scans"]]
    trips = attrs["trips"]
    for i in range(trips):
        env: Dict[str, np.ndarray] = dict(ext)
        env[b["it"]] = np.array(i, dtype=np.int64)
        env.update(zip(b["carried_in"], carry))
        for name, pos, axis, rev in b.get("scan_in", []):
            env[name] = np.take(arrays[pos], trips - 1 - i if rev else i, axis=axis)
        table.run_nodes(b["nodes"], env)
        carry = [np.asarray(env[o]).astype(a.dtype) for o, a in zip(b["carried_out"], carry)]
        for k, s in enumerate(b["scans"]):
            scans[k].append(np.asarray(env[s]))
    outs = list(carry)
    dirs = b.get("scan_out_dirs", [0] * len(b["scans"]))
    for k, s in enumerate(b["scans"]):
        t = b["types"][s]
        if not scans[k]:
            outs.append(np.zeros(_scan_out_shape(attrs, k, t.shape), t.dtype))
            continue
        vals = scans[k][::-1] if dirs[k] else scans[k]
        outs.append(np.stack(vals, axis=b.get("scan_out_axes", [0] * len(b["scans"]))[k]))
    return outs


def definitions(table: OpTable) -> Dict[str, OpDef]:
    """The ``loop`` op, whose numpy reference runs its body with the definitions in `table` (the table it goes
    into: a body holds any op)."""
    return {"loop": OpDef("loop", "opaque", _infer, lambda attrs, *arrays: _ref(table, attrs, *arrays))}


# ---------------------------------------------------------------- the kernel
def _remap(stmt, mapping: Dict[Buffer, Buffer]):
    """``stmt`` reading and writing ``mapping``'s buffers instead, with parallel loops made serial."""
    def fn(n):
        if isinstance(n, Load) and n.buffer in mapping:
            return Load(mapping[n.buffer], rebuild(n.index, fn))
        if isinstance(n, Store):
            return Store(mapping.get(n.buffer, n.buffer), rebuild(n.index, fn), rebuild(n.value, fn), n.reduction)
        if isinstance(n, IfThenElse):
            return IfThenElse(rebuild(n.cond, fn), rebuild(n.then_case, fn),
                              None if n.else_case is None else rebuild(n.else_case, fn))
        if isinstance(n, For):
            return replace(n, min=rebuild(n.min, fn), extent=rebuild(n.extent, fn), body=rebuild(n.body, fn),
                           kind="serial" if n.kind == "parallel" else n.kind)
        return None
    return rebuild(stmt, fn)


def _copy(dst: Buffer, src: Buffer, size: int, offset=0):
    i = Var("c")
    return For(i, Const(0, "int32"), Const(size, "int32"), "serial", Store(dst, i + offset, Load(src, i)))


def _slice_copy(whole: Buffer, part: Buffer, shape, axis: int, pos, to_whole: bool):
    """Copy between ``part`` (``shape`` without ``axis``) and position ``pos`` of ``whole`` along ``axis``."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    length = int(shape[axis])
    o, i = Var("o"), Var("i")
    w_idx = o * (length * inner) + pos * inner + i
    p_idx = o * inner + i
    body = Store(whole, w_idx, Load(part, p_idx)) if to_whole else Store(part, p_idx, Load(whole, w_idx))
    return For(o, Const(0, "int32"), Const(outer, "int32"), "serial",
               For(i, Const(0, "int32"), Const(inner, "int32"), "serial", body))


def loop_kernel(node: Node, types: Dict[str, TensorType], target, name: str, compile_body: BodyCompiler) -> PrimFunc:
    a = node.attrs
    b = a["_body"]
    btypes = b["types"]
    n = a["n_carried"]
    args = list(node.inputs) + list(node.outputs)
    params = [te.placeholder(kernel_shape(types[v].shape), types[v].dtype, name="a%d" % k)
              for k, v in enumerate(args)]
    pbuf = [Buffer(p.name, p.shape, p.dtype, "param") for p in params]
    locals_: List[Buffer] = []

    def local(v: str) -> Buffer:
        t = btypes[v]
        buf = Buffer("v%d" % len(locals_), (max(t.size, 1),), t.dtype, "local")
        locals_.append(buf)
        return buf
    buf_of: Dict[str, Buffer] = {v: pbuf[n + k] for k, v in enumerate(b["ext"])}
    buf_of[b["it"]] = local(b["it"])
    for v in b["carried_in"]:
        buf_of[v] = local(v)
    for v, _, _, _ in b.get("scan_in", []):
        buf_of[v] = local(v)
    steps = []
    for k, bn in enumerate(b["nodes"]):
        pf = compile_body(bn, btypes, target, "%s_b%d" % (name, k))
        if pf is None:      # a view of its input (a reshape): no kernel, the same buffer
            buf_of[bn.outputs[0]] = buf_of[bn.inputs[0]]
            continue
        for o in bn.outputs:
            if o not in buf_of:
                buf_of[o] = local(o)
        vals = bn.body_params() + list(bn.outputs)
        steps.append(_remap(pf.body, {pb: buf_of[v] for pb, v in zip(pf.param_buffers, vals)}))
    it = Var("it")
    trips = a["trips"]
    body = [Store(buf_of[b["it"]], Const(0, "int32"), Cast("int64", it))]
    for v, p, axis, rev in b.get("scan_in", []):
        body.append(_slice_copy(pbuf[p], buf_of[v], types[node.inputs[p]].shape, axis,
                                (trips - 1) - it if rev else it, to_whole=False))
    body += steps
    stages = [local(v) for v in b["carried_out"]]
    body += [_copy(st, buf_of[v], st.size) for st, v in zip(stages, b["carried_out"])]
    body += [_copy(buf_of[c], st, st.size) for st, c in zip(stages, b["carried_in"])]
    n_in = len(node.inputs)
    axes = b.get("scan_out_axes", [0] * len(b["scans"]))
    dirs = b.get("scan_out_dirs", [0] * len(b["scans"]))
    for k, s in enumerate(b["scans"]):
        body.append(_slice_copy(pbuf[n_in + n + k], buf_of[s], types[node.outputs[n + k]].shape, axes[k],
                                (trips - 1) - it if dirs[k] else it, to_whole=True))
    stmt = seq(*[_copy(buf_of[c], pbuf[j], buf_of[c].size) for j, c in enumerate(b["carried_in"])],
               For(it, Const(0, "int32"), Const(trips, "int32"), "serial", seq(*body)),
               *[_copy(pbuf[n_in + j], buf_of[c], buf_of[c].size) for j, c in enumerate(b["carried_in"])])
    for buf in reversed(locals_):
        stmt = Allocate(buf, stmt)
    return PrimFunc(name, params, pbuf, stmt)


CPU_STRATEGIES: Dict[str, Strategy] = {"loop": LoopKernel(loop_kernel)}
