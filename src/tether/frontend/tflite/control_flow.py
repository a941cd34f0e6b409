"""Control flow over subgraphs: WHILE as an ONNX Loop (the Keras RNN layers the TFLite converter writes, for one)
and IF as an ONNX If.

The condition subgraph runs once on the initial values in the parent graph, and again inside the loop body after
the body subgraph, on the values it produced; both subgraphs are translated by the same converter tables into
the Loop's body graph. A TFLite loop states no trip count, and tether runs a loop whose condition it can fold at
import (a counter against a bound): the Loop gets ``MAX_TRIPS`` as its trip count and tether unrolls it until the
condition folds to false. The final condition is carried out of the loop; should it still be true after
``MAX_TRIPS`` iterations, an op of that name makes the import fail, rather than a shortened loop run. A condition
computed from run-time values is refused by the ONNX importer.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.state import Context, onnx_dtype
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite control flow")

MAX_TRIPS = 256          # tether unrolls a loop with a run-time-free condition up to this many iterations


def translate_subgraph(ctx, index: int, inputs: Sequence[str]) -> Tuple[List[Any], List[Any], List[str]]:
    """Subgraph ``index`` with its inputs bound to the ONNX values ``inputs``: (nodes, initializers, output
    names). Names are drawn from the parent's, so the nodes can join its graph or a body graph."""
    model = getattr(ctx, "model", None)
    converter_for = ctx.converter_for
    if model is None or not 0 <= index < len(model.subgraphs):
        raise UnsupportedOpError("%s: names subgraph %d, which the model does not have" % (ctx.where(), index))
    g = model.subgraphs[index]
    if len(g.inputs) != len(inputs):
        raise UnsupportedOpError("%s: subgraph %d takes %d inputs, given %d"
                                 % (ctx.where(), index, len(g.inputs), len(inputs)))
    sub = Context(g)
    sub.model = model
    sub.converter_for = converter_for
    sub._names = ctx._names         # one name space with the parent: the nodes join its graph or a body of it
    for t, name in zip(g.inputs, inputs):
        sub.set_output(t, name)
    failures = []
    for op in g.operators:
        fn, why = converter_for(g, op)
        if fn is None:
            failures.append("%s v%d (subgraph %d node %d): %s" % (op.custom_code or op.op, op.version, index,
                                                                  op.index, why))
            continue
        sub.op = op
        try:
            fn(sub, op)
        except UnsupportedOpError as exc:
            failures.append("subgraph %d: %s" % (index, exc))
        finally:
            sub.op = None
        if failures:
            break
    if failures:
        raise UnsupportedOpError("%s: %s" % (ctx.where(), "; ".join(failures)))
    outputs = [sub.nhwc(t) for t in g.outputs]
    return sub.nodes, sub.initializers, outputs


def _value_info(ctx, name: str, t) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(name, onnx_dtype(t.dtype), list(t.shape))


@CONVERTERS.register("WHILE")
def _while(ctx, op) -> None:
    from onnx import TensorProto, helper

    cond_index = int(op.options["cond_subgraph_index"])
    body_index = int(op.options["body_subgraph_index"])
    initial = [ctx.nhwc(i) for i in op.inputs]
    # the condition on the initial values, in the parent graph
    nodes, inits, (first,) = translate_subgraph(ctx, cond_index, initial)
    ctx.nodes.extend(nodes)
    ctx.initializers.extend(inits)
    scalar = ctx.add_const(np.zeros((0,), np.int64), "scalar")
    first = ctx.emit1("Reshape", [first, scalar])

    formal = [ctx.fresh("while_in") for _ in op.inputs]
    it, cond_in, carried_cond = ctx.fresh("while_iter"), ctx.fresh("while_cond_in"), ctx.fresh("while_cond_carry")
    body_nodes, body_inits, produced = translate_subgraph(ctx, body_index, formal)
    cond_nodes, cond_inits, (again,) = translate_subgraph(ctx, cond_index, produced)
    cond_out = ctx.fresh("while_cond_out")
    tail = [helper.make_node("Reshape", [again, scalar], [cond_out], name=ctx.fresh("while_cond"))]
    outs = [cond_out]
    for v in produced + [cond_out]:        # each carried value an output of its own; the last: the condition
        outs.append(ctx.fresh("while_out"))
        tail.append(helper.make_node("Identity", [v], [outs[-1]], name=ctx.fresh("while_identity")))
    in_infos = [helper.make_tensor_value_info(it, TensorProto.INT64, []),
                helper.make_tensor_value_info(cond_in, TensorProto.BOOL, [])]
    in_infos += [_value_info(ctx, name, ctx.tensor(i)) for name, i in zip(formal, op.inputs)]
    in_infos.append(helper.make_tensor_value_info(carried_cond, TensorProto.BOOL, []))
    graph = helper.make_graph(body_nodes + cond_nodes + tail, ctx.fresh("while_body"), in_infos,
                              [helper.make_tensor_value_info(o, 0, None) for o in outs], body_inits + cond_inits)
    trips = ctx.add_const(np.array(MAX_TRIPS, np.int64), "max_trips")
    results = ctx.emit("Loop", [trips, first] + initial + [first], outputs=len(op.inputs) + 1, body=graph)
    # still true after MAX_TRIPS iterations: the loop needs more than tether unrolls
    never, done = ctx.fresh("never"), ctx.fresh("done")
    too_long = helper.make_graph([helper.make_node("WHILE_LOOP_OF_MORE_THAN_%d_ITERATIONS" % MAX_TRIPS, [], [never],
                                                   domain="tether")], ctx.fresh("too_long"), [],
                                 [helper.make_tensor_value_info(never, TensorProto.BOOL, [])])
    fine = helper.make_graph([helper.make_node("Identity", [results[-1]], [done])], ctx.fresh("finished"), [],
                             [helper.make_tensor_value_info(done, TensorProto.BOOL, [])])
    ctx.emit("If", [results[-1]], outputs=1, then_branch=too_long, else_branch=fine)
    for t, v in zip(op.outputs, results[:-1]):
        if t >= 0:
            ctx.set_output(t, v)


def _branch(ctx, op, index: int, operands: Sequence[str]) -> Any:
    """Subgraph ``index`` as an ONNX If branch: no inputs of its own, it reads the operands from the parent."""
    from onnx import helper

    nodes, inits, produced = translate_subgraph(ctx, index, operands)
    outs = []
    for v in produced:
        outs.append(ctx.fresh("branch_out"))
        nodes.append(helper.make_node("Identity", [v], [outs[-1]], name=ctx.fresh("branch_identity")))
    infos = [_value_info(ctx, name, ctx.tensor(t)) for name, t in zip(outs, op.outputs)]
    return helper.make_graph(nodes, ctx.fresh("branch"), [], infos, inits)


@CONVERTERS.register("IF")
def _if(ctx, op) -> None:
    """IF: one of two subgraphs on the operands. ONNX If as tether runs it: only the taken branch when the
    condition folds at import, else both, each output selected by the condition."""
    operands = [ctx.nhwc(i) for i in op.inputs[1:]]
    cond = ctx.emit1("Reshape", [ctx.nhwc(op.inputs[0]), ctx.add_const(np.zeros((0,), np.int64), "scalar")])
    if ctx.tensor(op.inputs[0]).dtype != "bool":
        cond = ctx.emit1("Cast", [cond], to=onnx_dtype("bool"))
    then_branch = _branch(ctx, op, int(op.options["then_subgraph_index"]), operands)
    else_branch = _branch(ctx, op, int(op.options["else_subgraph_index"]), operands)
    results = ctx.emit("If", [cond], outputs=len(op.outputs), then_branch=then_branch, else_branch=else_branch)
    for t, v in zip(op.outputs, results):
        if t >= 0:
            ctx.set_output(t, v)
