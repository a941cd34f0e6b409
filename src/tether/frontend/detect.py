"""What kind of model a file or folder holds, read from its content (never from its name alone).

``detect(path)`` returns the :class:`ModelFormat` whose check matches, or None. Each format in the registry says
whether tether reads it today (``supported``) and how it is recognised; a later frontend flips ``supported`` and
adds its importer without touching the checks. A check claims only what the bytes show: a magic number, a
flatbuffer identifier, the member names of a zip, the field numbers of a protobuf's top level, the first section
of a text file. Formats with no reliable signature are not guessed at.

Besides model formats, the registry knows a few file kinds people pass by mistake (a compiled tether model
folder, a shared library, a numpy array, JSON), so an error can say what the file is instead of "corrupt".
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile
from typing import Callable, Dict, List, Optional, Tuple

HEAD_BYTES = 1 << 16     # what the checks look at: a model's signature is in its first bytes


@dataclasses.dataclass(frozen=True)
class ModelFormat:
    """One file or folder kind: ``name`` as users say it, ``what`` completes "X is ...", ``check`` reads it."""

    name: str
    what: str
    supported: bool
    is_model: bool
    check: Callable[["Probe"], bool]


@dataclasses.dataclass
class Probe:
    """The path being detected, with its head bytes read once (empty for a folder)."""

    path: str
    is_dir: bool
    head: bytes
    size: int

    def text_head(self) -> Optional[str]:
        """The head as text, or None when it is not UTF-8 text."""
        if b"\0" in self.head:
            return None
        try:
            return self.head.decode("utf-8")
        except UnicodeDecodeError as exc:     # a multi-byte character cut at the end of the head is still text
            if exc.start < len(self.head) - 4:
                return None
            return self.head[:exc.start].decode("utf-8")


FORMATS: Dict[str, ModelFormat] = {}


def register_format(fmt: ModelFormat) -> None:
    """Add ``fmt`` to the registry (checked in registration order); a second format of the same name is refused."""
    if fmt.name in FORMATS:
        raise ValueError("model format %r is registered already" % fmt.name)
    FORMATS[fmt.name] = fmt


def supported_formats() -> List[str]:
    return [f.name for f in FORMATS.values() if f.supported]


def detect(path: str) -> Optional[ModelFormat]:
    """The registered format ``path`` holds, or None when no check matches (also for an empty file)."""
    if os.path.isdir(path):
        probe = Probe(path, True, b"", 0)
    else:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
        probe = Probe(path, False, head, os.path.getsize(path))
    for fmt in FORMATS.values():
        if fmt.check(probe):
            return fmt
    return None


# -- the protobuf wire format, top level only ----------------------------------------------------------------

def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def proto_fields(data: bytes, limit: int = 1 << 20,
                 partial: bool = False) -> Optional[List[Tuple[int, int, bytes]]]:
    """The top-level ``(field number, wire type, payload)`` of a protobuf message (payload empty but for
    length-delimited fields, whose first 4 KiB it holds), or None when ``data`` is not valid wire format. At most
    ``limit`` fields are read. ``partial``: ``data`` is the head of a longer message, so a field cut by its end
    ends the list (a length-delimited one is kept, its payload cut) instead of making it invalid."""
    fields: List[Tuple[int, int, bytes]] = []
    pos = 0
    while pos < len(data) and len(fields) < limit:
        try:
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            payload = b""
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 2:
                length, pos = _varint(data, pos)
                payload = data[pos:pos + min(length, 4096)]
                pos += length
            elif wire == 5:
                pos += 4
            else:                   # groups (3, 4) are not written by any format here; 6, 7 do not exist
                return None
        except ValueError:          # a varint cut by the end
            return (fields or None) if partial else None
        if number == 0:
            return None
        if pos > len(data):
            if not partial:
                return None
            if wire == 2:
                fields.append((number, wire, payload))
            return fields or None
        fields.append((number, wire, payload))
    return fields or None


def _head_fields(p: Probe) -> Optional[List[Tuple[int, int, bytes]]]:
    """The protobuf fields that start in the head (None for a folder or bytes that are no protobuf)."""
    if p.is_dir or not p.head:
        return None
    return proto_fields(p.head, partial=p.size > len(p.head))


def _is_text(payload: bytes) -> bool:
    try:
        return payload.decode("utf-8").isprintable()
    except UnicodeDecodeError:
        return False


# -- the checks ----------------------------------------------------------------------------------------------

# onnx.proto's ModelProto: ir_version 1, producer_name 2, producer_version 3, domain 4, model_version 5,
# doc_string 6, graph 7, opset_import 8, metadata_props 14, training_info 20, functions 25, configuration 26
_ONNX_FIELDS = {1, 2, 3, 4, 5, 6, 7, 8, 14, 20, 25, 26}


def _onnx(p: Probe) -> bool:
    fields = _head_fields(p)
    # every exporter writes ir_version (field 1) first; the graph (7) may start beyond the head
    return (fields is not None and fields[0][:2] == (1, 0) and {n for n, _, _ in fields} <= _ONNX_FIELDS
            and (any(n == 7 and w == 2 for n, w, _ in fields) or p.size > len(p.head)))


def _tflite(p: Probe) -> bool:
    return not p.is_dir and p.head[4:8] == b"TFL3"      # the flatbuffer file identifier of schema.fbs


def _graphdef(p: Probe) -> bool:
    """A TensorFlow GraphDef: node (1) messages, each starting with its text name (1); library 2, versions 4."""
    fields = _head_fields(p)
    if fields is None or fields[0][:2] != (1, 2) or not {n for n, _, _ in fields} <= {1, 2, 3, 4}:
        return False
    node = proto_fields(fields[0][2], limit=1, partial=True)
    return bool(node) and node[0][:2] == (1, 2) and _is_text(node[0][2])


def _saved_model(p: Probe) -> bool:
    return p.is_dir and any(os.path.isfile(os.path.join(p.path, n)) for n in ("saved_model.pb", "saved_model.pbtxt"))


def _zip_names(p: Probe) -> Optional[List[str]]:
    if p.is_dir or not p.head.startswith(b"PK\x03\x04"):
        return None
    try:
        with zipfile.ZipFile(p.path) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return None


def _keras_zip(p: Probe) -> bool:
    names = _zip_names(p)
    return names is not None and "config.json" in names and ("metadata.json" in names
                                                              or "model.weights.h5" in names)


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _keras_hdf5(p: Probe) -> bool:
    # Keras writes its model as attributes of the root group, whose header follows the superblock
    return not p.is_dir and p.head.startswith(HDF5_SIGNATURE) and b"model_config" in p.head


def _hdf5(p: Probe) -> bool:
    return not p.is_dir and p.head.startswith(HDF5_SIGNATURE)


def _pytorch(p: Probe) -> bool:
    names = _zip_names(p)
    return names is not None and any(n == "data.pkl" or n.endswith("/data.pkl") for n in names)


_DARKNET = re.compile(r"^\s*\[(net|network)\]\s*$", re.M)


def _darknet(p: Probe) -> bool:
    text = None if p.is_dir else p.text_head()
    if text is None:
        return False
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    return bool(_DARKNET.match(first))


_CAFFE_TEXT = re.compile(r"^\s*layers?\s*\{", re.M)


def _caffe_prototxt(p: Probe) -> bool:
    text = None if p.is_dir else p.text_head()
    return text is not None and bool(_CAFFE_TEXT.search(text)) and re.search(r"^\s*type\s*:", text, re.M) is not None


def _caffemodel(p: Probe) -> bool:
    """A Caffe NetParameter: its text name (1) first, then layer (100) or V1 layers (2) messages."""
    fields = _head_fields(p)
    return (fields is not None and fields[0][:2] == (1, 2) and _is_text(fields[0][2])
            and any(n in (2, 100) and w == 2 for n, w, _ in fields))


def _coreml(p: Probe) -> bool:
    """A Core ML Model: specificationVersion (1, a varint) first, and its model type in a field numbered 200+."""
    fields = _head_fields(p)
    return fields is not None and fields[0][:2] == (1, 0) and any(n >= 200 and w == 2 for n, w, _ in fields)


def _mlpackage(p: Probe) -> bool:
    return p.is_dir and os.path.isfile(os.path.join(p.path, "Manifest.json")) and \
        os.path.isdir(os.path.join(p.path, "Data"))


def _tether_folder(p: Probe) -> bool:
    return p.is_dir and os.path.isfile(os.path.join(p.path, "deploy.json"))


def _elf(p: Probe) -> bool:
    return not p.is_dir and p.head.startswith(b"\x7fELF")


def _npy(p: Probe) -> bool:
    return not p.is_dir and p.head.startswith(b"\x93NUMPY")


def _json(p: Probe) -> bool:
    text = None if p.is_dir else p.text_head()
    if text is None or not text.lstrip().startswith(("{", "[")):
        return False
    if p.size > len(p.head):
        return True                                      # too big to parse for a message; starts like JSON
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


for _fmt in (
        ModelFormat("ONNX", "an ONNX model", True, True, _onnx),
        ModelFormat("TFLite", "a TFLite model", True, True, _tflite),
        ModelFormat("TensorFlow SavedModel", "a TensorFlow SavedModel folder", False, True, _saved_model),
        ModelFormat("TensorFlow GraphDef", "a TensorFlow GraphDef (.pb)", False, True, _graphdef),
        ModelFormat("Keras", "a Keras model (.keras zip)", False, True, _keras_zip),
        ModelFormat("Keras HDF5", "a Keras model (HDF5 .h5)", False, True, _keras_hdf5),
        ModelFormat("PyTorch", "a PyTorch checkpoint or TorchScript zip (torch.save)", False, True, _pytorch),
        ModelFormat("Darknet", "a Darknet network (.cfg)", False, True, _darknet),
        ModelFormat("Caffe prototxt", "a Caffe network description (.prototxt)", False, True, _caffe_prototxt),
        ModelFormat("Caffe", "a Caffe model (.caffemodel)", False, True, _caffemodel),
        ModelFormat("CoreML", "a Core ML model (.mlmodel)", False, True, _coreml),
        ModelFormat("CoreML package", "a Core ML package folder (.mlpackage)", False, True, _mlpackage),
        # not models: what people pass by mistake, named so the error says what the file is
        ModelFormat("tether model folder", "a compiled tether model folder (deploy.json)", False, False,
                    _tether_folder),
        ModelFormat("HDF5", "an HDF5 file (not a Keras model)", False, False, _hdf5),
        ModelFormat("ELF", "an ELF binary (a shared library or program)", False, False, _elf),
        ModelFormat("NumPy", "a NumPy array (.npy)", False, False, _npy),
        ModelFormat("JSON", "JSON text", False, False, _json),
):
    register_format(_fmt)
del _fmt
