"""Models whose weights live in an external data file beside the model (``model.onnx`` + ``model.onnx.data``, as
torch.onnx.export writes large models): from_onnx reads them relative to the model file, compiles, and matches
onnxruntime; a data location from the model file that leaves its folder, or bytes that do not fit, are refused."""
import os

import numpy as np
import onnx
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx

RNG = np.random.default_rng(3)


def _conv_model():
    inits = {"w1": RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "b1": RNG.standard_normal(8).astype(np.float32),
             "w2": RNG.standard_normal((8 * 4 * 4, 10)).astype(np.float32),
             "shape": np.array([1, -1], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "w2"], ["y"])]
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    return make_graph_model(nodes, {"x": x}, ["y"], inits, opset=18), x


def _save_external(model, folder, location="model.onnx.data"):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
              size_threshold=64)   # like torch: the small shape tensor stays inline (onnxruntime needs it)
    return path


def _run(graph, params, x, folder):
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.set_input("x", x)
    gm.run()
    return gm.get_output(0)


def test_external_data_model_from_its_path(tmp_path):
    import onnxruntime as ort

    model, x = _conv_model()
    path = _save_external(model, str(tmp_path / "model"))
    stored = onnx.load(path, load_external_data=False)
    external = {t.name for t in stored.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert external == {"w1", "b1", "w2"}
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cwd = os.getcwd()
    os.chdir(str(tmp_path))   # the data file is found beside the model, not in the working directory
    try:
        graph, params = from_onnx(os.path.join("model", "model.onnx"))
    finally:
        os.chdir(cwd)
    got = _run(graph, params, x, tmp_path / "out")
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_external_data_proto_needs_its_folder(tmp_path):
    model, x = _conv_model()
    path = _save_external(model, str(tmp_path))
    proto = onnx.load(path, load_external_data=False)
    with pytest.raises(ValueError, match="external data file .*model.onnx.data.* not loaded.*base_dir"):
        from_onnx(proto)
    graph, params = from_onnx(proto, base_dir=str(tmp_path))
    loaded_graph, loaded_params = from_onnx(onnx.load(path))     # onnx.load resolved the data itself
    assert sorted(params) == sorted(loaded_params)
    for k in params:
        np.testing.assert_array_equal(params[k], loaded_params[k])


def _tamper(path, **fields):
    model = onnx.load(path, load_external_data=False)
    for t in model.graph.initializer:
        if t.name == "w1":
            for e in t.external_data:
                if e.key in fields:
                    e.value = str(fields[e.key])
    onnx.save(model, path)


@pytest.mark.parametrize("fields, error", [
    ({"location": "../outside.data"}, "leaves the model's folder"),
    ({"location": "/etc/passwd"}, "is absolute"),
    ({"location": "missing.data"}, "does not exist"),
    ({"length": 12}, "does not hold its float32"),
    ({"offset": 10 ** 9}, "does not hold its float32"),
])
def test_external_data_location_is_untrusted(tmp_path, fields, error):
    model, _ = _conv_model()
    folder = tmp_path / "m"
    path = _save_external(model, str(folder))
    (tmp_path / "outside.data").write_bytes(b"\0" * 4096)
    _tamper(path, **fields)
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        from_onnx(path)
