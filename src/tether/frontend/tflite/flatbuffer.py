"""A ``.tflite`` file read into plain Python objects with the generated schema (the ``tflite`` package).

``read_model(path)`` parses the whole flatbuffer eagerly (so a truncated or corrupt file fails here, as one
:class:`tether.errors.InvalidInput`, and nothing later touches the raw bytes): subgraphs with their tensors
(shape, shape_signature with -1 for dynamic dims, dtype, constant data, quantization, sparsity) and operators
(op name, version, builtin options as a dict keyed by schema.fbs's field names, custom code and options),
and the signature defs that name the inputs and outputs.

Constant data comes from the buffer's own vector or, in models over 2 GiB, from the ``offset``/``size`` pair
that points after the flatbuffer (relative to the start of the file).
"""
from __future__ import annotations

import dataclasses
import re
import struct
from typing import Any, Dict, List, Optional

import numpy as np

from tether.errors import InvalidInput

# TensorType (schema.fbs) -> numpy dtype name; "" for types that have no numpy equivalent here
TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string", 6: "bool",
                7: "int16", 8: "complex64", 9: "int8", 10: "float64", 11: "complex128", 12: "uint64",
                13: "resource", 14: "variant", 15: "uint32", 16: "uint16", 17: "int4", 18: "bfloat16"}


@dataclasses.dataclass
class Quantization:
    """Affine quantization: ``real = scale * (q - zero_point)``, per tensor or along ``axis``."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    min: Optional[np.ndarray] = None
    max: Optional[np.ndarray] = None

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1


@dataclasses.dataclass
class DimMetadata:
    """One level of a sparse tensor's storage: DENSE (``dense_size``) or SPARSE_CSR (segments, indices)."""

    dense: bool
    dense_size: int
    segments: Optional[np.ndarray]
    indices: Optional[np.ndarray]


@dataclasses.dataclass
class Sparsity:
    traversal_order: List[int]
    block_map: List[int]
    dim_metadata: List[DimMetadata]


@dataclasses.dataclass
class Tensor:
    index: int
    name: str
    shape: List[int]
    shape_signature: Optional[List[int]]
    dtype: str
    data: Optional[np.ndarray]           # the constant's values (raw for sparse tensors), or None
    quantization: Optional[Quantization]
    sparsity: Optional[Sparsity]
    is_variable: bool


@dataclasses.dataclass
class Operator:
    index: int
    op: str                              # the builtin op's name ("CONV_2D"), or "CUSTOM"
    version: int
    inputs: List[int]                    # tensor indices; -1 for an absent optional input
    outputs: List[int]
    options: Dict[str, Any]              # builtin options (and builtin_options_2), schema.fbs field names
    custom_code: str = ""
    custom_options: bytes = b""          # raw; a FlexBuffer map for the custom ops LiteRT ships

    def custom_options_map(self) -> Dict[str, Any]:
        """The custom options decoded as a FlexBuffer map (DETECTION_POSTPROCESS's options, e.g.); {} if none."""
        if not self.custom_options:
            return {}
        from flatbuffers import flexbuffers

        try:
            value = flexbuffers.Loads(self.custom_options)
        except Exception as exc:       # noqa: BLE001  (the decoder raises whatever its reads hit)
            raise ValueError("custom options of node %d (%s) are not a FlexBuffer: %s"
                             % (self.index, self.custom_code, exc)) from None
        if not isinstance(value, dict):
            raise ValueError("custom options of node %d (%s) are a FlexBuffer %s, not a map"
                             % (self.index, self.custom_code, type(value).__name__))
        return value


@dataclasses.dataclass
class Subgraph:
    name: str
    tensors: List[Tensor]
    inputs: List[int]
    outputs: List[int]
    operators: List[Operator]


@dataclasses.dataclass
class Signature:
    key: str
    subgraph: int
    inputs: Dict[str, int]               # signature name -> tensor index
    outputs: Dict[str, int]


@dataclasses.dataclass
class Model:
    path: str
    version: int
    description: str
    subgraphs: List[Subgraph]
    signatures: List[Signature]


def _enum_names(cls) -> Dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def _snake(name: str) -> str:
    """The generated getter's name back in schema.fbs's spelling: DilationHFactor -> dilation_h_factor."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


_SKIP_SUFFIXES = ("IsNone", "Length", "AsNumpy", "BufferHasIdentifier")


def _table_fields(obj) -> Dict[str, Any]:
    """Every scalar and vector field of a generated options table, keyed by its schema.fbs name."""
    out: Dict[str, Any] = {}
    for name in dir(type(obj)):
        if name.startswith("_") or name in ("Init",) or name.startswith("GetRootAs") or name.endswith(_SKIP_SUFFIXES):
            continue
        attr = getattr(obj, name)
        if not callable(attr):
            continue
        if hasattr(obj, name + "AsNumpy"):
            arr = getattr(obj, name + "AsNumpy")()
            out[_snake(name)] = [] if isinstance(arr, int) else arr.tolist()
            continue
        try:
            value = attr()
        except TypeError:       # takes an index: a vector of tables, which no builtin option needs here
            continue
        out[_snake(name)] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out


class _Reader:
    def __init__(self, path: str, data: bytes) -> None:
        import tflite

        self.tflite = tflite
        self.path = path
        self.data = data
        self.op_names = _enum_names(tflite.BuiltinOperator)
        self.option_classes = {k: getattr(tflite, n, None) for k, n in _enum_names(tflite.BuiltinOptions).items()}
        self.option2_classes = {k: getattr(tflite, n, None) for k, n in _enum_names(tflite.BuiltinOptions2).items()}

    def model(self) -> Model:
        tfl = self.tflite
        m = tfl.Model.GetRootAs(self.data, 0)
        buffers = [m.Buffers(i) for i in range(m.BuffersLength())]
        codes = []
        for i in range(m.OperatorCodesLength()):
            c = m.OperatorCodes(i)
            # old files set only the deprecated int8 field; new ones put 127 there and the code in builtin_code
            code = max(int(c.BuiltinCode()), int(c.DeprecatedBuiltinCode()))
            custom = (c.CustomCode() or b"").decode("utf-8", "replace")
            codes.append((self.op_names.get(code, "BUILTIN_%d" % code), max(1, int(c.Version())), custom))
        subgraphs = [self.subgraph(m.Subgraphs(i), i, buffers, codes) for i in range(m.SubgraphsLength())]
        if not subgraphs:
            raise ValueError("it has no subgraph")
        signatures = []
        for i in range(m.SignatureDefsLength()):
            s = m.SignatureDefs(i)
            ins = {(s.Inputs(j).Name() or b"").decode(): int(s.Inputs(j).TensorIndex())
                   for j in range(s.InputsLength())}
            outs = {(s.Outputs(j).Name() or b"").decode(): int(s.Outputs(j).TensorIndex())
                    for j in range(s.OutputsLength())}
            signatures.append(Signature((s.SignatureKey() or b"").decode(), int(s.SubgraphIndex()), ins, outs))
        return Model(self.path, int(m.Version()), (m.Description() or b"").decode("utf-8", "replace"), subgraphs,
                     signatures)

    def buffer_bytes(self, buf) -> Optional[bytes]:
        offset, size = int(buf.Offset()), int(buf.Size())
        if offset > 1:
            if offset + size > len(self.data):
                raise ValueError("a buffer at offset %d (%d bytes) lies beyond the end of the file" % (offset, size))
            return self.data[offset:offset + size]
        if buf.DataIsNone() or buf.DataLength() == 0:
            return None
        return buf.DataAsNumpy().tobytes()

    def tensor(self, t, index: int, buffers) -> Tensor:
        shape = [int(d) for d in t.ShapeAsNumpy()] if not t.ShapeIsNone() else []
        sig = [int(d) for d in t.ShapeSignatureAsNumpy()] if not t.ShapeSignatureIsNone() else None
        dtype = TENSOR_TYPES.get(int(t.Type()), "type_%d" % t.Type())
        b = int(t.Buffer())
        if b >= len(buffers):
            raise ValueError("tensor %d names buffer %d of %d" % (index, b, len(buffers)))
        raw = self.buffer_bytes(buffers[b]) if b > 0 else None
        sparsity = self.sparsity(t.Sparsity()) if t.Sparsity() is not None else None
        data = None
        if raw is not None:
            if dtype in ("string", "resource", "variant", "int4") or dtype.startswith("type_"):
                data = np.frombuffer(raw, dtype=np.uint8)
            elif dtype == "bfloat16":
                data = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                data = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
                if sparsity is None:
                    if data.size != int(np.prod(shape, dtype=np.int64)):
                        raise ValueError("tensor %d (%s) has %d values for shape %s"
                                         % (index, (t.Name() or b"").decode(), data.size, shape))
                    data = data.reshape(shape)
        return Tensor(index, (t.Name() or b"").decode("utf-8", "replace"), shape, sig, dtype, data,
                      self.quantization(t.Quantization()), sparsity, bool(t.IsVariable()))

    @staticmethod
    def quantization(q) -> Optional[Quantization]:
        if q is None or q.ScaleIsNone() or q.ScaleLength() == 0:
            return None
        zp = q.ZeroPointAsNumpy() if not q.ZeroPointIsNone() else np.zeros(q.ScaleLength(), np.int64)
        return Quantization(np.asarray(q.ScaleAsNumpy(), np.float32), np.asarray(zp, np.int64),
                            int(q.QuantizedDimension()),
                            None if q.MinIsNone() else np.asarray(q.MinAsNumpy()),
                            None if q.MaxIsNone() else np.asarray(q.MaxAsNumpy()))

    def sparsity(self, s) -> Sparsity:
        tfl = self.tflite

        def index_vector(kind: int, table) -> Optional[np.ndarray]:
            if table is None or kind == 0:
                return None
            cls = {1: tfl.Int32Vector, 2: tfl.Uint16Vector, 3: tfl.Uint8Vector}[int(kind)]
            vec = cls()
            vec.Init(table.Bytes, table.Pos)
            return np.asarray(vec.ValuesAsNumpy(), np.int64) if vec.ValuesLength() else np.zeros(0, np.int64)

        dims = []
        for i in range(s.DimMetadataLength()):
            d = s.DimMetadata(i)
            dense = int(d.Format()) == 0
            dims.append(DimMetadata(dense, int(d.DenseSize()),
                                    None if dense else index_vector(d.ArraySegmentsType(), d.ArraySegments()),
                                    None if dense else index_vector(d.ArrayIndicesType(), d.ArrayIndices())))
        return Sparsity([int(v) for v in s.TraversalOrderAsNumpy()] if not s.TraversalOrderIsNone() else [],
                        [int(v) for v in s.BlockMapAsNumpy()] if not s.BlockMapIsNone() else [], dims)

    def options(self, kind: int, table, classes) -> Dict[str, Any]:
        cls = classes.get(int(kind))
        if table is None or cls is None:
            return {}
        obj = cls()
        obj.Init(table.Bytes, table.Pos)
        return _table_fields(obj)

    def subgraph(self, g, gi: int, buffers, codes) -> Subgraph:
        tensors = [self.tensor(g.Tensors(i), i, buffers) for i in range(g.TensorsLength())]
        ops = []
        for i in range(g.OperatorsLength()):
            o = g.Operators(i)
            ci = int(o.OpcodeIndex())
            if ci >= len(codes):
                raise ValueError("operator %d of subgraph %d names operator code %d of %d" % (i, gi, ci, len(codes)))
            name, version, custom = codes[ci]
            ins = [int(v) for v in o.InputsAsNumpy()] if not o.InputsIsNone() else []
            outs = [int(v) for v in o.OutputsAsNumpy()] if not o.OutputsIsNone() else []
            for v in ins + outs:
                if not -1 <= v < len(tensors):
                    raise ValueError("operator %d of subgraph %d names tensor %d of %d" % (i, gi, v, len(tensors)))
            opts = self.options(o.BuiltinOptionsType(), o.BuiltinOptions(), self.option_classes)
            if int(o.BuiltinOptions2Type()):
                opts.update(self.options(o.BuiltinOptions2Type(), o.BuiltinOptions2(), self.option2_classes))
            if int(o.LargeCustomOptionsOffset()) > 1:
                start, size = int(o.LargeCustomOptionsOffset()), int(o.LargeCustomOptionsSize())
                custom_options = self.data[start:start + size]
            else:
                custom_options = o.CustomOptionsAsNumpy().tobytes() if not o.CustomOptionsIsNone() else b""
            ops.append(Operator(i, name, version, ins, outs, opts, custom, custom_options))
        inputs = [int(v) for v in g.InputsAsNumpy()] if not g.InputsIsNone() else []
        outputs = [int(v) for v in g.OutputsAsNumpy()] if not g.OutputsIsNone() else []
        for v in inputs + outputs:
            if not 0 <= v < len(tensors):
                raise ValueError("subgraph %d names tensor %d of %d as an input or output" % (gi, v, len(tensors)))
        return Subgraph((g.Name() or b"").decode("utf-8", "replace"), tensors, inputs, outputs, ops)


def read_model(path: str) -> Model:
    """The TFLite model at ``path``; a file that is not a whole, valid TFLite flatbuffer raises InvalidInput."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InvalidInput("%s cannot be read: %s" % (path, exc.strerror or exc)) from None
    try:
        import tflite  # noqa: F401  (the generated schema)
    except ImportError as exc:
        raise InvalidInput("%s needs the optional dependency %r: pip install 'tether[tflite]'"
                           % (path, exc.name or "tflite")) from None
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise InvalidInput("%s is not a TFLite model: expected the flatbuffer identifier 'TFL3' at byte 4" % path)
    try:
        (root,) = struct.unpack_from("<I", data, 0)
        if root + 4 > len(data):
            raise ValueError("its root table offset %d lies beyond the end of the file" % root)
        return _Reader(path, data).model()
    except InvalidInput:
        raise
    except (ValueError, IndexError, KeyError, struct.error, TypeError, UnicodeDecodeError, OverflowError,
            MemoryError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidInput("%s is not a valid TFLite model: its flatbuffer does not parse (%s), so it is truncated "
                           "or corrupt; expected a whole .tflite file" % (path, reason)) from None
