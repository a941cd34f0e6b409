"""Generic traversal of the IR: expressions and statements alike.

Every node class names the attributes that hold its child nodes in ``_fields`` (an attribute may hold a list of
children, or None); these functions read and rebuild nodes through them, so a new node kind needs no change
here.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Dict, Iterator, List, Optional

from tether.tir.expr import Var


def children(node: Any) -> List[Any]:
    """The child nodes of ``node``, in field order."""
    out: List[Any] = []
    for field in node._fields:
        value = getattr(node, field)
        if type(value) is list:
            out.extend(value)
        elif value is not None:
            out.append(value)
    return out


def walk(node: Any) -> Iterator[Any]:
    """Pre-order traversal of an expression or a statement tree (statements yield only statements)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


@lru_cache(maxsize=None)
def _slots(cls: type) -> tuple:
    return tuple(name for klass in cls.__mro__ for name in klass.__dict__.get("__slots__", ()))


def replace(node: Any, **changes: Any) -> Any:
    """A copy of ``node`` (every attribute, not just its children) with ``changes`` applied."""
    cls = type(node)
    new = cls.__new__(cls)
    state = getattr(node, "__dict__", None)
    if state is not None:
        new.__dict__.update(state)
    for name in _slots(cls):
        setattr(new, name, getattr(node, name))
    for name, value in changes.items():
        setattr(new, name, value)
    return new


def map_children(node: Any, fn: Callable[[Any], Any]) -> Any:
    """``node`` with ``fn`` applied to each child; ``node`` itself when ``fn`` changed none of them."""
    changes: Dict[str, Any] = {}
    for field in node._fields:
        value = getattr(node, field)
        if type(value) is list:
            new = [fn(x) for x in value]
            if any(x is not y for x, y in zip(new, value)):
                changes[field] = new
        elif value is not None:
            new = fn(value)
            if new is not value:
                changes[field] = new
    return replace(node, **changes) if changes else node


def rebuild(node: Any, fn: Callable[[Any], Optional[Any]]) -> Any:
    """Post-order rewrite: ``fn(n)`` returns a replacement for ``n`` or None to keep ``n`` (with its children
    rewritten)."""
    out = fn(node)
    if out is not None:
        return out
    return map_children(node, lambda child: rebuild(child, fn)) if node._fields else node


def substitute(e: Any, mapping: Dict[Var, Any]) -> Any:
    """Replace Vars (by identity) with expressions."""
    if not mapping:
        return e
    return rebuild(e, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def uses_var(e: Any, variables: Any) -> bool:
    """Whether expression ``e`` mentions any of ``variables`` (by identity)."""
    ids = {id(v) for v in variables}
    return any(isinstance(n, Var) and id(n) in ids for n in walk(e))


def var_ids(e: Any) -> set:
    """The ids of the Vars expression ``e`` mentions."""
    return {id(n) for n in walk(e) if isinstance(n, Var)}


def by_class(table: dict, cls: type):
    """The row of a node-type table for ``cls`` or its nearest base class (an IterVar is a Var), remembered."""
    for base in cls.__mro__:
        if base in table:
            table[cls] = table[base]
            return table[base]
    return None
