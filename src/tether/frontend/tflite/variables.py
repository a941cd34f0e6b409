"""Resource variables (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE) and CALL_ONCE, the state of a streaming model,
translated for one inference call: LiteRT's first invoke.

CALL_ONCE runs its init subgraph before anything else on the first invoke; converted, that subgraph may only
assign constants to variables, which then become the variables' values. Through the main subgraph, each variable
holds the value last assigned to it in op order, so a READ_VARIABLE after an ASSIGN_VARIABLE reads the new value,
as LiteRT does within one invoke. What the call leaves in its variables for the next one is not kept: the graph
computes one call from the initial state. A resource handle may only be read and assigned (not passed to another
op or returned), and a variable read before any value is assigned to it is refused.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite variables")

_ACCESS = ("READ_VARIABLE", "ASSIGN_VARIABLE")


def _key(op) -> Tuple[str, str]:
    return str(op.options.get("container") or ""), str(op.options.get("shared_name") or "")


def _variable(ctx, op) -> Tuple[str, str]:
    """The variable whose handle is the op's first input (a VAR_HANDLE's output in this subgraph)."""
    handle = op.inputs[0]
    producer = next((o for o in ctx.subgraph.operators if handle in o.outputs), None)
    if producer is None or producer.op != "VAR_HANDLE":
        raise UnsupportedOpError("%s: a resource from %s (expected a VAR_HANDLE of this subgraph)"
                                 % (ctx.where(), producer.op if producer else "outside the subgraph"))
    return _key(producer)


@CONVERTERS.register("CALL_ONCE")
def _call_once(ctx, op) -> None:
    index = int(op.options.get("init_subgraph_index", -1))
    if ctx.model is None or not 0 < index < len(ctx.model.subgraphs):
        raise UnsupportedOpError("%s: init subgraph %d (expected one of the model's other subgraphs)"
                                 % (ctx.where(), index))
    sub = ctx.model.subgraphs[index]
    handles = {}
    values = {}
    for init_op in sub.operators:
        if init_op.op == "VAR_HANDLE":
            handles[init_op.outputs[0]] = _key(init_op)
        elif init_op.op == "ASSIGN_VARIABLE" and init_op.inputs[0] in handles:
            value = sub.tensors[init_op.inputs[1]]
            if value.data is None or value.sparsity is not None:
                raise UnsupportedOpError("%s: its init subgraph assigns a computed value to %r (expected constants)"
                                         % (ctx.where(), handles[init_op.inputs[0]][1]))
            values[handles[init_op.inputs[0]]] = np.asarray(value.data).reshape(value.shape)
        else:
            raise UnsupportedOpError("%s: its init subgraph runs %s (expected VAR_HANDLE and ASSIGN_VARIABLE of "
                                     "constants)" % (ctx.where(), init_op.op))
    ctx.variables.update(values)


@CONVERTERS.register("VAR_HANDLE")
def _var_handle(ctx, op) -> None:
    out = op.outputs[0]
    if out in ctx.subgraph.outputs:
        raise UnsupportedOpError("%s: the resource handle is a graph output (expected it read and assigned only)"
                                 % ctx.where())
    for other in ctx.subgraph.operators:
        if out in other.inputs and (other.op not in _ACCESS or other.inputs[0] != out):
            raise UnsupportedOpError("%s: the resource handle goes to %s (node %d); expected %s only"
                                     % (ctx.where(), other.op, other.index, " and ".join(_ACCESS)))
    # the handle names the variable; its readers and writers find the VAR_HANDLE itself, not this value
    ctx.set_const(out, np.zeros((), np.int32))


@CONVERTERS.register("READ_VARIABLE")
def _read_variable(ctx, op) -> None:
    key = _variable(ctx, op)
    if key not in ctx.variables:
        raise UnsupportedOpError("%s: variable %r is read before a value is assigned to it" % (ctx.where(), key[1]))
    value = ctx.variables[key]
    if isinstance(value, np.ndarray):
        ctx.set_const(op.outputs[0], value)
    else:
        ctx.set_output(op.outputs[0], *value)


@CONVERTERS.register("ASSIGN_VARIABLE")
def _assign_variable(ctx, op) -> None:
    key = _variable(ctx, op)
    const = ctx.const(op.inputs[1])
    ctx.variables[key] = np.asarray(const) if const is not None else ctx.held(op.inputs[1])
