"""The import state (`Importer`: values, constants, types, the emit-or-fold step), the converter registry and
the helpers every converter family shares."""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from tether.errors import UnsupportedOpError
from tether.graph import op_info
from tether.frontend.op_table import OpTable, merge_tables  # noqa: F401  (merge_tables: for converters.py)
from tether.graph.ir import Node, TensorType

ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}


class Importer:
    def __init__(self, opset: int, converters: Mapping[str, Converter]) -> None:
        self.opset = opset
        self.converters = converters            # converter_key -> converter: every op this import converts
        self.nodes: List[Node] = []
        self.types: Dict[str, TensorType] = {}
        self.consts: Dict[str, np.ndarray] = {}
        self.rename: Dict[str, str] = {}        # ONNX value name -> tether value name
        self.counter = 0
        self.reserved: set = set()              # every value name the ONNX graph uses, fresh names avoid them
        self.dynamic: set = set()               # values whose shape is known only at run time (numpy ops)

    # ---- values
    def name(self, onnx_name: str) -> str:
        return self.rename.get(onnx_name, onnx_name)

    def const(self, value: str) -> Optional[np.ndarray]:
        return self.consts.get(value)

    def type(self, value: str) -> TensorType:
        if value in self.dynamic:
            # its type is an upper bound: a converter that reads it (Shape, a kernel's shape) would be wrong
            raise UnsupportedOpError("value %r has a data-dependent shape (known only at run time); tether runs "
                                     "it only as a graph output or into the ops of frontend/onnx/dynamic_values.py"
                                     % value)
        return self.types[value]

    def fresh(self, hint: str) -> str:
        self.counter += 1
        name = "%s_%d" % (hint, self.counter)
        while name in self.types or name in self.reserved:
            self.counter += 1
            name = "%s_%d" % (hint, self.counter)
        return name

    def add_const(self, array: np.ndarray, hint: str = "const", name: Optional[str] = None) -> str:
        array = np.asarray(array, order="C")
        name = name or self.fresh(hint)
        self.consts[name] = array
        self.types[name] = TensorType(array.shape, array.dtype)
        return name

    def emit(self, op: str, inputs: Sequence[str], attrs: Optional[dict] = None, name: str = "",
             outputs: Optional[Sequence[str]] = None) -> str:
        """Add one graph op (or fold it if every input is constant); returns its (first) output name."""
        attrs = dict(attrs or {})
        inputs = _drop_empty_concat_inputs(self, op, list(inputs))
        in_types = [self.types[i] for i in inputs]
        out_types = op_info.infer(op, attrs, in_types)
        outs = list(outputs) if outputs else [self.fresh(op) for _ in out_types]
        if all(_empty(t) for t in out_types) and not any(i in self.dynamic for i in inputs):
            # an empty tensor is known from its type alone: a constant, never a kernel with a zero extent (unless
            # the type is a bound, whose other extents the real value may not reach)
            for o, t in zip(outs, out_types):
                self.add_const(np.zeros(t.shape, t.dtype), name=o)
            return outs[0]
        if all(i in self.consts for i in inputs):
            values = op_info.evaluate(op, attrs, [self.consts[i] for i in inputs])
            for o, v in zip(outs, values):
                self.add_const(v, name=o)
            return outs[0]
        for o, t in zip(outs, out_types):
            self.types[o] = t
        self.dynamic.update(outs[k] for k in op_info.dynamic_outputs(op, any(i in self.dynamic for i in inputs))
                            if k < len(outs))
        self.nodes.append(Node(op, name or self.fresh(op + "_node"), list(inputs), outs, attrs))
        return outs[0]

    def require_const(self, value: str, what: str, node_name: str) -> np.ndarray:
        c = self.consts.get(value)
        if c is None:
            raise UnsupportedOpError(
                "node %s: %s (%r) must be a constant once input shapes are fixed; it is computed at run time"
                % (node_name, what, value))
        return c


# ---------------------------------------------------------------- empty tensors
def _empty(t: TensorType) -> bool:
    return any(int(d) == 0 for d in t.shape)


def _drop_empty_concat_inputs(im: "Importer", op: str, inputs: List[str]) -> List[str]:
    # concatenating an empty piece adds nothing (onnx's RotaryEmbedding body concatenates an empty pass-through
    # part when the whole head rotates); keep one input if all are empty
    if op != "concat" or len(inputs) < 2:
        return inputs
    kept = [i for i in inputs if not _empty(im.types[i])]
    return kept or inputs[:1]


# ---------------------------------------------------------------- helpers
def node_attrs(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def norm_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def emit_reshape(im: Importer, x: str, shape: Sequence[int], name: str = "", out: Optional[str] = None) -> str:
    shape = tuple(int(d) for d in shape)
    if im.type(x).shape == shape and out is None:
        return x
    return im.emit("reshape", [x], {"shape": shape}, name, [out] if out else None)


def node_output(node, i: int = 0) -> Optional[List[str]]:
    return [node.output[i]] if len(node.output) > i and node.output[i] else None


# ---------------------------------------------------------------- converters
Converter = Callable[[Importer, object, List[str], dict], None]


class ConverterTable(OpTable):
    """ONNX op -> converter, keyed by ``converter_key`` ("OpType" for the default domain, "domain.OpType" for
    another). Each converter module fills its own table (``CONVERTERS``), and ``converters.py`` merges them in a
    stated order (``merge_tables``)."""

    KIND = "ONNX op"


FLOATS = ("float32", "float64")
INTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
NUMERIC = FLOATS + INTS


def require_dtype(im, node, value: str, allowed: Sequence[str]) -> str:
    dt = str(im.type(value).dtype)
    if dt not in allowed:
        raise UnsupportedOpError("node %s: %s on %s tensors is not supported (tether implements %s for %s)"
                                 % (node.name, node.op_type, dt, node.op_type, ", ".join(allowed)))
    return dt


def no_legacy_broadcast(node, a):
    # opset < 7 binary ops broadcast only with broadcast=1 and an explicit axis; numpy-style is what we implement
    if "axis" in a:
        raise UnsupportedOpError("node %s: %s with the legacy 'axis' attribute (opset < 7)" % (node.name, node.op_type))

# ---------------------------------------------------------------- run-time dtypes the kernels implement
KERNEL_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
                 "bfloat16", "float32", "float64")


def onnx_type_name(vi) -> str:
    import onnx
    elem = vi.type.tensor_type.elem_type
    try:
        return onnx.TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return "elem_type_%d" % elem

def str_attr(a: dict, key: str, default: str) -> str:
    v = a.get(key, default)
    return v.decode() if isinstance(v, bytes) else v

def reshape_alias(im, x, node):
    im.emit("reshape", [x], {"shape": im.type(x).shape}, node.name, node_output(node))


# ---------------------------------------------------------------- ops of other domains
# A converter of an op outside the default ONNX domain registers as "domain.OpType" (e.g. the onnxruntime contrib
# op "com.microsoft.QLinearAdd"); an op of the default domain by its type alone.
def converter_key(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else "%s.%s" % (node.domain, node.op_type)


# ---------------------------------------------------------------- sequences and optionals (frontend/onnx/sequence.py)
# A sequence or an optional is no tensor: the importer resolves it to the tensor values it holds, by name
# (``containers(im)[name]``), wherever its length and positions are known at import. Only the sequence ops
# (SEQUENCE_OPS: exactly the ops sequence.py converts) and the ops that pass values through (PASSES_CONTAINERS) take
# such values; any other op reading one is refused by name (check_no_container).
SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceLength", "SequenceAt", "SequenceInsert",
                          "SequenceErase", "SplitToSequence", "ConcatFromSequence", "SequenceMap",
                          "Optional", "OptionalHasElement", "OptionalGetElement"})
PASSES_CONTAINERS = frozenset({"Identity", "If", "Loop"})


class Container:
    """A sequence (``items``: its tensor values, in order) or an optional (``items``: none or its one value, a
    tensor or a sequence); ``elem`` is the element dtype an empty one was declared with, if known."""
    __slots__ = ("kind", "items", "elem")

    def __init__(self, kind: str, items: Sequence[str], elem: Optional[str] = None) -> None:
        self.kind, self.items, self.elem = kind, tuple(items), elem


def containers(im: Importer) -> Dict[str, Container]:
    if not hasattr(im, "container_values"):
        im.container_values = {}
    return im.container_values


def defined(im: Importer, value: str) -> bool:
    """A tensor value or a sequence/optional the import has produced."""
    return value in im.types or value in containers(im)


def check_no_container(im: Importer, node, ins: Sequence[str]) -> None:
    if node.op_type in SEQUENCE_OPS or node.op_type in PASSES_CONTAINERS:
        return
    for x in ins:
        c = containers(im).get(x) if x else None
        if c is not None:
            raise UnsupportedOpError("node %s: %s reads %r, a %s; tether takes sequences and optionals only in %s"
                                     % (node.name, node.op_type, x, c.kind,
                                        ", ".join(sorted(SEQUENCE_OPS | PASSES_CONTAINERS))))


def alias_container(im: Importer, value: str, out: str) -> bool:
    """Make ``out`` the same sequence/optional as ``value``; False if ``value`` is a tensor."""
    c = containers(im).get(value)
    if c is None:
        return False
    containers(im)[out] = c
    return True
