"""ONNX sequences and optionals, resolved at import into plain tensor values.

A sequence is the list of its tensor values' names, an optional none or one value (importer.Container). Exported
models build and take apart sequences whose length and positions are known once input shapes are fixed (a split
into a list, a loop appending one tensor per iteration, a concatenation at the end), so every sequence op here is
bookkeeping on those lists: no sequence reaches the graph, only the tensor ops that make and consume its elements.

Where a length or position is only known at run time (a position computed from data, an If on a run-time
condition giving sequences, a loop compiled as one kernel carrying one) the op is refused with an
``UnsupportedOpError`` naming the node, the op and why; the conversion never guesses.

Graph edges: a sequence the model outputs becomes one graph output per element, named ``NAME.0``, ``NAME.1``, ...
(``element_names``); an optional output is its element under its own name. A sequence input likewise becomes one
tensor input per element, ``NAME.0``, ...: its length and element shapes are fixed at compile time like any input
shape (``from_onnx(model, shape={"NAME": [(2, 3), (4, 3)]})``). An optional input is a plain tensor input when it
holds a value, and no input at all when ``shape={"NAME": None}`` says it is empty.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.control_flow import inline_subgraph
from tether.frontend.onnx.importer import (ONNX_DTYPES, Container, ConverterTable, Importer, containers, emit_reshape,
                                           norm_axis)

CONVERTERS = ConverterTable(__name__)

SEQUENCE, OPTIONAL = "sequence", "optional"


def _container(im: Importer, node, value: str, kind: str) -> Container:
    c = containers(im).get(value)
    if c is None or c.kind != kind:
        raise UnsupportedOpError("node %s: %s expects a %s as %r" % (node.name, node.op_type, kind, value))
    return c


def _put(im: Importer, name: str, kind: str, items, elem: Optional[str] = None) -> None:
    if name:
        containers(im)[name] = Container(kind, items, elem)


def _alias(im: Importer, value: str, out: str, name: str = "") -> None:
    """``out`` becomes ``value`` (a tensor view, a constant, or the same sequence/optional)."""
    c = containers(im).get(value)
    if c is not None:
        containers(im)[out] = c
    elif value in im.consts:
        im.add_const(im.consts[value], name=out)
    else:
        im.emit("reshape", [value], {"shape": im.type(value).shape}, name, [out])


def _position(im: Importer, node, value: str, length: int, inserting: bool = False) -> int:
    """A position input as an index into a sequence of ``length`` (negative counts from the back). Inserting, the
    position may be ``length`` (append)."""
    c = im.const(value)
    if c is None:
        raise UnsupportedOpError("node %s: %s position %r is computed at run time; tether resolves sequences at "
                                 "compile time" % (node.name, node.op_type, value))
    pos = int(np.asarray(c).reshape(-1)[0])
    limit = length + 1 if inserting else length
    if not -length <= pos < limit:
        raise UnsupportedOpError("node %s: %s position %d is out of range for a sequence of %d"
                                 % (node.name, node.op_type, pos, length))
    return pos + length if pos < 0 else pos


def _elem_dtype(im: Importer, items) -> Optional[str]:
    return str(im.type(items[0]).dtype) if items and items[0] in im.types else None


# ---------------------------------------------------------------- sequences
@CONVERTERS.register("SequenceEmpty")
def _sequence_empty(im, node, ins, a):
    elem = ONNX_DTYPES.get(int(a.get("dtype", 1)), "elem_type_%d" % int(a.get("dtype", 1)))
    _put(im, node.output[0], SEQUENCE, (), elem)


@CONVERTERS.register("SequenceConstruct")
def _sequence_construct(im, node, ins, a):
    for x in ins:
        if x in containers(im):
            raise UnsupportedOpError("node %s: SequenceConstruct of a %s (%r); elements are tensors"
                                     % (node.name, containers(im)[x].kind, x))
    dtypes = {str(im.type(x).dtype) for x in ins}
    if len(dtypes) > 1:
        raise UnsupportedOpError("node %s: SequenceConstruct of mixed element types %s" % (node.name, sorted(dtypes)))
    _put(im, node.output[0], SEQUENCE, ins)


@CONVERTERS.register("SequenceLength")
def _sequence_length(im, node, ins, a):
    im.add_const(np.array(len(_container(im, node, ins[0], SEQUENCE).items), np.int64), name=node.output[0])


@CONVERTERS.register("SequenceAt")
def _sequence_at(im, node, ins, a):
    seq = _container(im, node, ins[0], SEQUENCE)
    pos = _position(im, node, ins[1], len(seq.items))
    _alias(im, seq.items[pos], node.output[0], node.name)


@CONVERTERS.register("SequenceInsert")
def _sequence_insert(im, node, ins, a):
    seq = _container(im, node, ins[0], SEQUENCE)
    x = ins[1]
    if x in containers(im):
        raise UnsupportedOpError("node %s: SequenceInsert of a %s (%r)" % (node.name, containers(im)[x].kind, x))
    dt = str(im.type(x).dtype)
    have = _elem_dtype(im, seq.items) or seq.elem
    if have is not None and have != dt:
        raise UnsupportedOpError("node %s: SequenceInsert of a %s tensor into a sequence of %s"
                                 % (node.name, dt, have))
    items = list(seq.items)
    pos = _position(im, node, ins[2], len(items), inserting=True) if len(ins) > 2 and ins[2] else len(items)
    items.insert(pos, x)
    _put(im, node.output[0], SEQUENCE, items, dt)


@CONVERTERS.register("SequenceErase")
def _sequence_erase(im, node, ins, a):
    seq = _container(im, node, ins[0], SEQUENCE)
    items = list(seq.items)
    if not items:
        raise UnsupportedOpError("node %s: SequenceErase from an empty sequence" % node.name)
    pos = _position(im, node, ins[1], len(items)) if len(ins) > 1 and ins[1] else len(items) - 1
    del items[pos]
    _put(im, node.output[0], SEQUENCE, items, seq.elem or _elem_dtype(im, seq.items))


@CONVERTERS.register("SplitToSequence")
def _split_to_sequence(im, node, ins, a):
    x = ins[0]
    t = im.type(x)
    nd = len(t.shape)
    axis = norm_axis(int(a.get("axis", 0)), nd)
    dim = t.shape[axis]
    split = im.require_const(ins[1], "SplitToSequence split", node.name) if len(ins) > 1 and ins[1] else None
    if split is None:
        sizes = [1] * dim
    elif np.ndim(split) == 0:
        step = int(split)
        if step <= 0:
            raise UnsupportedOpError("node %s: SplitToSequence split %d (positive expected)" % (node.name, step))
        sizes = [step] * (dim // step) + ([dim % step] if dim % step else [])
    else:
        sizes = [int(v) for v in np.asarray(split).reshape(-1)]
        if sum(sizes) != dim or any(v < 0 for v in sizes):
            raise UnsupportedOpError("node %s: SplitToSequence sizes %s do not cover extent %d"
                                     % (node.name, sizes, dim))
    squeeze = split is None and not int(a.get("keepdims", 1))
    items: List[str] = []
    start = 0
    for k, size in enumerate(sizes):
        begin, end = [0] * nd, list(t.shape)
        begin[axis], end[axis] = start, start + size
        start += size
        part = im.emit("strided_slice", [x], {"begin": begin, "end": end, "step": [1] * nd}, "%s_%d" % (node.name, k))
        if squeeze:
            part = emit_reshape(im, part, t.shape[:axis] + t.shape[axis + 1:], "%s_squeeze_%d" % (node.name, k))
        items.append(part)
    _put(im, node.output[0], SEQUENCE, items, str(t.dtype))


@CONVERTERS.register("ConcatFromSequence")
def _concat_from_sequence(im, node, ins, a):
    seq = _container(im, node, ins[0], SEQUENCE)
    if not seq.items:
        raise UnsupportedOpError("node %s: ConcatFromSequence of an empty sequence (its shape is unknown)" % node.name)
    new_axis = int(a.get("new_axis", 0))
    rank = len(im.type(seq.items[0]).shape) + (1 if new_axis else 0)
    axis = norm_axis(int(a["axis"]), rank)
    parts = []
    for v in seq.items:
        if new_axis:
            shape = list(im.type(v).shape)
            shape.insert(axis, 1)
            v = emit_reshape(im, v, shape)
        parts.append(v)
    if len(parts) == 1:
        _alias(im, parts[0], node.output[0], node.name)
    else:
        im.emit("concat", parts, {"axis": axis}, node.name, [node.output[0]])


@CONVERTERS.register("SequenceMap")
def _sequence_map(im, node, ins, a):
    """The body once per element, inlined: element i of every sequence input and each tensor input as it is."""
    body = a["body"]
    first = _container(im, node, ins[0], SEQUENCE)
    n = len(first.items)
    per: List[List[str]] = []
    for x in ins:
        c = containers(im).get(x)
        if c is not None and c.kind != SEQUENCE:
            raise UnsupportedOpError("node %s: SequenceMap input %r is an optional" % (node.name, x))
        if c is not None and len(c.items) != n:
            raise UnsupportedOpError("node %s: SequenceMap sequences of lengths %d and %d"
                                     % (node.name, n, len(c.items)))
        per.append(list(c.items) if c is not None else [x] * n)
    formal = [vi.name for vi in body.input]
    outs: List[List[str]] = [[] for _ in node.output]
    for i in range(n):
        results = inline_subgraph(im, body, {f: vals[i] for f, vals in zip(formal, per)}, "%s_%d" % (node.name, i))
        for k, r in enumerate(results[:len(outs)]):
            outs[k].append(r)
    for o, items in zip(node.output, outs):
        elem = None
        if not items and len(body.output):
            elem = ONNX_DTYPES.get(body.output[0].type.sequence_type.elem_type.tensor_type.elem_type or
                                   body.output[0].type.tensor_type.elem_type)
        _put(im, o, SEQUENCE, items, elem)


# ---------------------------------------------------------------- optionals
@CONVERTERS.register("Optional")
def _optional(im, node, ins, a):
    _put(im, node.output[0], OPTIONAL, [ins[0]] if ins and ins[0] else [])


@CONVERTERS.register("OptionalHasElement")
def _optional_has_element(im, node, ins, a):
    if not ins or not ins[0]:
        has = False
    else:
        c = containers(im).get(ins[0])
        has = True if c is None or c.kind == SEQUENCE else bool(c.items)   # a tensor or sequence is a full optional
    im.add_const(np.array(has), name=node.output[0])


@CONVERTERS.register("OptionalGetElement")
def _optional_get_element(im, node, ins, a):
    c = containers(im).get(ins[0])
    if c is None or c.kind == SEQUENCE:     # a plain tensor or sequence is returned as it is (opset 18)
        _alias(im, ins[0], node.output[0], node.name)
        return
    if not c.items:
        raise UnsupportedOpError("node %s: OptionalGetElement of an empty optional (%r)" % (node.name, ins[0]))
    _alias(im, c.items[0], node.output[0], node.name)


# ---------------------------------------------------------------- graph edges
def element_names(name: str, count: int) -> List[str]:
    """The graph inputs/outputs that stand for the elements of sequence ``name``."""
    return ["%s.%d" % (name, i) for i in range(count)]


def bind_graph_outputs(im: Importer, outputs: List[str]) -> List[str]:
    """The model's outputs as graph outputs (tensor names): a sequence becomes one output per element
    (``element_names``), an optional its element."""
    flat: List[str] = []
    for o in outputs:
        c = containers(im).get(o)
        if c is None:
            flat.append(o)
            continue
        items = list(c.items)
        if c.kind == OPTIONAL:
            if not items:
                raise UnsupportedOpError("graph output %r is an empty optional; tether's graphs return tensors" % o)
            inner = containers(im).get(items[0])
            if inner is None:
                _alias(im, items[0], o)
                flat.append(o)
                continue
            items = list(inner.items)
        for item, name in zip(items, element_names(o, len(items))):
            if item in containers(im):
                raise UnsupportedOpError("graph output %r holds a %s; tether's graphs return tensors"
                                         % (o, containers(im)[item].kind))
            _alias(im, item, name)
            flat.append(name)
    return flat


def is_container_input(vi) -> bool:
    return vi.type.WhichOneof("value") in ("sequence_type", "optional_type")


def bind_graph_input(im: Importer, vi, shapes, given: bool) -> List[Tuple[str, Tuple[int, ...], str]]:
    """The tensor inputs (name, shape, dtype) that stand for sequence or optional input ``vi``, whose element
    shapes are ``shapes`` (a list of shapes for a sequence; one shape, or None for an empty optional); the
    container is registered in ``im``. ``given``: whether the caller gave ``shapes`` at all."""
    kind = vi.type.WhichOneof("value")
    if kind == "optional_type":
        elem = vi.type.optional_type.elem_type
        if given and shapes is None:
            _put(im, vi.name, OPTIONAL, ())
            return []
        if elem.WhichOneof("value") == "sequence_type":
            return _sequence_input(im, vi.name, elem.sequence_type.elem_type, shapes, given)
        dt = ONNX_DTYPES.get(elem.tensor_type.elem_type, "elem_type_%d" % elem.tensor_type.elem_type)
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in elem.tensor_type.shape.dim)
        dims = tuple(int(d) for d in shapes) if given else dims
        if any(d is None for d in dims):
            raise ValueError("optional input %r has a symbolic shape %s: fix it with from_onnx(..., shape={%r: "
                             "(...)}), or shape={%r: None} for an empty one" % (vi.name, dims, vi.name, vi.name))
        return [(vi.name, dims, dt)]    # a full optional tensor is that tensor
    return _sequence_input(im, vi.name, vi.type.sequence_type.elem_type, shapes, given)


def _sequence_input(im: Importer, name: str, elem, shapes, given: bool) -> List[Tuple[str, Tuple[int, ...], str]]:
    if elem.WhichOneof("value") != "tensor_type":
        raise UnsupportedOpError("input %r is a sequence of %s; tether takes sequences of tensors"
                                 % (name, elem.WhichOneof("value")))
    if not given or shapes is None:
        raise ValueError("input %r is a sequence: fix its length and element shapes with from_onnx(..., shape={%r: "
                         "[(D0, ...), ...]}); its elements are then graph inputs %r, %r, ..."
                         % (name, name, name + ".0", name + ".1"))
    dt = ONNX_DTYPES.get(elem.tensor_type.elem_type, "elem_type_%d" % elem.tensor_type.elem_type)
    names = element_names(name, len(shapes))
    _put(im, name, SEQUENCE, names, dt)
    return [(n, tuple(int(d) for d in s), dt) for n, s in zip(names, shapes)]


__all__ = ["bind_graph_input", "bind_graph_outputs", "element_names", "is_container_input"]
