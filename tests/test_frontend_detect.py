"""Model format detection from content: each registered format is recognised from bytes shaped as its files are
(real ONNX models from onnx.helper; the others by their documented signatures), names are not trusted, and
bytes that merely parse as some protobuf are not called ONNX."""
import os
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tether.errors import InvalidInput
from tether.frontend import detect
from tether.frontend.model_file import load_model_file

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits_cnn.onnx")


def _varint(n):
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _field(number, payload):
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _samples(d):
    """name -> path, each a file or folder of that format, named so that the name does not give it away."""
    paths = {}

    def put(name, data):
        paths[name] = d / ("sample_%d.bin" % len(paths))
        paths[name].write_bytes(data)

    put("TFLite", b"\x1c\x00\x00\x00TFL3" + bytes(64))
    node = _field(1, b"conv1") + _field(2, b"Conv2D")
    put("TensorFlow GraphDef", _field(1, node) + _field(4, b"\x08\x1b"))
    put("Caffe", _field(1, b"VGG16") + _field(100, _field(1, b"data") + _field(2, b"Input")))
    put("CoreML", b"\x08\x04" + _field(2, b"") + _field(500, b""))
    put("Keras HDF5", b"\x89HDF\r\n\x1a\n" + bytes(200) + b"model_config" + bytes(50))
    put("HDF5", b"\x89HDF\r\n\x1a\n" + bytes(200))
    put("Darknet", b"# yolo\n[net]\nbatch=1\n\n[convolutional]\nfilters=16\n")
    put("Caffe prototxt", b'name: "net"\nlayer {\n  name: "data"\n  type: "Input"\n}\n')
    put("ELF", b"\x7fELF\x02\x01\x01" + bytes(64))
    put("JSON", b'{"a": [1, 2, 3]}')
    for name, members in (("Keras", ("config.json", "metadata.json", "model.weights.h5")),
                          ("PyTorch", ("archive/data.pkl", "archive/version", "archive/data/0"))):
        paths[name] = d / ("sample_%d.bin" % len(paths))
        with zipfile.ZipFile(paths[name], "w") as zf:
            for member in members:
                zf.writestr(member, b"x")
    paths["NumPy"] = d / "sample_npy.bin"
    with open(paths["NumPy"], "wb") as fh:
        np.save(fh, np.zeros(3))
    for name, files in (("TensorFlow SavedModel", ("saved_model.pb", "variables/variables.index")),
                        ("CoreML package", ("Manifest.json", "Data/com.apple.CoreML/model.mlmodel")),
                        ("tether model folder", ("deploy.json", "deploy.so", "deploy.params"))):
        folder = d / ("folder_%d" % len(paths))
        for f in files:
            (folder / f).parent.mkdir(parents=True, exist_ok=True)
            (folder / f).write_bytes(b"")
        paths[name] = folder
    return paths


def test_every_registered_format_is_recognised_from_its_content(tmp_path):
    samples = _samples(tmp_path)
    paths = dict(samples, ONNX=DIGITS)
    assert set(paths) == set(detect.FORMATS), "a format without a sample here"
    for name, path in paths.items():
        found = detect.detect(str(path))
        assert found is not None and found.name == name, (name, found and found.name)
    # every format with a reader is supported (ONNX's is the importer itself)
    from tether.frontend import readers
    assert detect.supported_formats() == ["ONNX"] + [f for f in detect.FORMATS if f in readers.READERS]


def test_onnx_models_of_any_size_are_onnx(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    big = helper.make_tensor("w", TensorProto.FLOAT, [1, 1 << 16], np.ones(1 << 16, np.float32).tobytes(),
                             raw=True)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y], initializer=[big])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="p" * 70000)
    path = tmp_path / "big.anything"
    onnx.save(model, str(path))
    assert os.path.getsize(path) > detect.HEAD_BYTES * 2   # the graph starts beyond the head
    assert detect.detect(str(path)).name == "ONNX"
    proto, base = load_model_file(str(path))
    assert proto.graph.node[0].op_type == "Relu" and base == str(tmp_path)


def test_random_truncated_and_empty_bytes_are_no_model(tmp_path):
    data = open(DIGITS, "rb").read()
    rng = np.random.default_rng(1)
    cases = {"truncated.onnx": data[:len(data) // 2], "random.onnx": rng.bytes(4096), "empty.onnx": b"",
             # a valid protobuf of unknown fields: onnx parses it into a ModelProto with no graph
             "foreign.onnx": b"\x08\x07" + _field(9, b"xyz")}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(InvalidInput, match=name.replace(".", r"\.")):
            load_model_file(str(tmp_path / name))
    with pytest.raises(InvalidInput, match="it has no graph and no opset"):
        load_model_file(str(tmp_path / "foreign.onnx"))


def test_a_format_name_is_registered_once():
    with pytest.raises(ValueError, match="registered already"):
        detect.register_format(detect.FORMATS["TFLite"])
