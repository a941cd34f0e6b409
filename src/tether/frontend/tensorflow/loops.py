"""Functional loops (While, StatelessWhile) with a trip count known at translation time, unrolled, and the
TensorLists their bodies read and write (what a Keras RNN layer's loop is made of); functional conditionals
(If, StatelessIf) whose predicate is known at translation time.

Each iteration translates the condition function on the loop's values; it must fold to a constant (a counter
compared with a constant length), and while it is true the body function is translated on them, under a name
of its own. A TensorList is a list of values at translation time: reading or writing an item at a constant index
emits nothing; stacking it joins the items. So a recurrent layer becomes one straight graph of its time steps.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tensorflow.graph import TFNode
from tether.frontend.tensorflow.translate import Converter, Translator, Value, require_const

MAX_ITERATIONS = 4096


def run_loop(nodes: Any, node: TFNode, ins: List[Value]) -> Optional[List[Value]]:
    """The loop's final values; ``nodes`` translates the cond and body functions (model.NodeTranslator)."""
    cond, body = (nodes.library.get(node.attr(k)) for k in ("cond", "body"))
    if cond is None or body is None:
        raise UnsupportedOpError("node %s (%s): its cond or body function is not in the graph's library"
                                 % (node.name, node.op))
    values = list(ins)
    for i in range(MAX_ITERATIONS + 1):
        test = nodes.call(cond, values, "%s/cond%d" % (node.name, i))
        if test is None:
            return None
        if test[0].const is None:
            raise UnsupportedOpError("node %s (%s): its condition is computed at run time (tether unrolls loops "
                                     "whose trip count is known when translating)" % (node.name, node.op))
        if not bool(np.asarray(test[0].const).reshape(-1)[0]):
            return values
        if i == MAX_ITERATIONS:
            break
        out = nodes.call(body, values, "%s/iter%d" % (node.name, i))
        if out is None:
            return None
        values = out
    raise UnsupportedOpError("node %s (%s): more than %d iterations" % (node.name, node.op, MAX_ITERATIONS))


def run_if(nodes: Any, node: TFNode, ins: List[Value]) -> Optional[List[Value]]:
    """A functional conditional whose predicate folds to a constant: the branch it takes, translated."""
    pred = ins[0]
    if pred.const is None:
        raise UnsupportedOpError("node %s (%s): its predicate is computed at run time (tether translates "
                                 "conditionals whose predicate is known when translating)" % (node.name, node.op))
    taken = "then_branch" if bool(np.asarray(pred.const).reshape(-1)[0]) else "else_branch"
    branch = nodes.library.get(node.attr(taken))
    if branch is None:
        raise UnsupportedOpError("node %s (%s): its %s is not in the graph's library" % (node.name, node.op, taken))
    return nodes.call(branch, ins[1:], "%s/%s" % (node.name, taken))


# ops that run library functions: model.NodeTranslator calls these with itself
LOOP_OPS: Dict[str, Any] = {"While": run_loop, "StatelessWhile": run_loop, "If": run_if, "StatelessIf": run_if}


def _index(node: TFNode, v: Value) -> int:
    return int(np.asarray(require_const(node, v, "index")).reshape(-1)[0])


def _reserve(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    n = _index(node, ins[1])
    if n < 0:
        raise UnsupportedOpError("node %s (TensorListReserve): a list of unknown length" % node.name)
    return [Value(None, items=[None] * n, dtype=None)]


def _from_tensor(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    x = ins[0]
    if x.const is not None:
        return [Value(None, items=[t.constant(a) for a in x.const])]
    n = x.shape[0] if x.shape is not None and x.shape else None
    if n is None:
        raise UnsupportedOpError("node %s (TensorListFromTensor): the tensor's first dimension is unknown"
                                 % node.name)
    item_shape = tuple(x.shape[1:])
    items = []
    for k in range(n):
        part = t.emit1("Gather", [t.tf(x), t.name(t.constant(np.asarray(k, dtype=np.int64)))], axis=0)
        items.append(t.out(part, shape=item_shape, dtype=x.dtype))
    return [Value(None, items=items)]


def _get_item(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    lst, i = ins[0], _index(node, ins[1])
    if lst.items is None or not -len(lst.items) <= i < len(lst.items) or lst.items[i] is None:
        raise UnsupportedOpError("node %s (TensorListGetItem): item %d was never written" % (node.name, i))
    return [lst.items[i]]


def _set_item(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    lst, i, item = ins[0], _index(node, ins[1]), ins[2]
    if lst.items is None:
        raise UnsupportedOpError("node %s (TensorListSetItem): its list is no TensorList" % node.name)
    items = list(lst.items)
    if i == len(items) and node.attr("resize_if_index_out_of_bounds", False):
        items.append(None)
    items[i] = item
    return [Value(None, items=items)]


def _stack(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    lst = ins[0]
    if lst.items is None or any(v is None for v in lst.items) or not lst.items:
        raise UnsupportedOpError("node %s (TensorListStack): the list has items never written" % node.name)
    if all(v.const is not None for v in lst.items):
        return [t.constant(np.stack([v.const for v in lst.items]))]
    parts = [t.emit1("Unsqueeze", [t.tf(v), t.ints([0])]) for v in lst.items]
    out = parts[0] if len(parts) == 1 else t.emit1("Concat", parts, axis=0)
    first = lst.items[0]
    shape = None if first.shape is None else (len(parts),) + tuple(first.shape)
    return [t.out(out, shape=shape, dtype=first.dtype)]


def _length(t: Translator, node: TFNode, ins: List[Value]) -> List[Value]:
    if ins[0].items is None:
        raise UnsupportedOpError("node %s (TensorListLength): its list is no TensorList" % node.name)
    return [t.constant(np.asarray(len(ins[0].items), dtype=np.int32))]


CONVERTERS: Dict[str, Converter] = {
    "TensorListReserve": _reserve,
    "TensorListFromTensor": _from_tensor,
    "TensorListGetItem": _get_item,
    "TensorListSetItem": _set_item,
    "TensorListStack": _stack,
    "TensorListLength": _length,
}
