"""Every model kind users bring (tether.testing.model_kinds: a DB text detector, an SVTR and a CRNN recognizer,
YOLOv8, YOLOX and PicoDet detectors, a voice-activity detector, MobileNetV3, EfficientNet and MobileViT
classifiers, transformer and wav2vec2 encoders, a dynamically quantized CRNN, an R(2+1)D video classifier and
a 3-D U-Net), built with onnx.helper at a small input size, compiled for the host and compared with onnxruntime:
every output has onnxruntime's dtype and shape and a max relative error (max |tether - ort| / max |ort|) <= 1e-4
(float models; see TOLERANCE). scripts/bench_model_kinds.py times the same models at their real input sizes; a
test runs it here at the small ones, with tiny round counts, and reads its table."""
import re

import numpy as np
import onnxruntime as ort
import pytest

import tether
from tether import graph_executor
from tether.frontend import from_onnx
from tether.testing.model_kinds import KINDS, relative_error

from fixtures.scripts import run_bench_script


# The dynamically quantized CRNN quantizes each activation at run time: an activation that float rounding puts on
# the other side of a uint8 step moves by a whole step, and the step carries through the next layers. onnxruntime
# itself moves by 3.8e-3 on this model when its input is scaled by (1 + 1e-7); 1e-2 allows a few such steps, while
# a wrong scale, zero point or layout is off by far more (the int8 model is 7.7e-3 from the float one).
TOLERANCE = {"crnn_dynquant": 1e-2}


@pytest.mark.parametrize("kind", list(KINDS))
def test_kind_matches_onnxruntime(kind, tmp_path):
    model, feeds = KINDS[kind]("test")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.run(**feeds)
    assert gm.get_num_outputs() == len(ref)
    for i, r in enumerate(ref):
        got = gm.get_output(i)
        assert got.dtype == r.dtype and got.shape == r.shape, (i, got.dtype, got.shape, r.dtype, r.shape)
        assert np.isfinite(r).all() and np.abs(r).max() > 0, "degenerate reference output %d" % i
        assert relative_error(got, r) <= TOLERANCE.get(kind, 1e-4), (i, relative_error(got, r))


def test_relative_error_sees_a_wrong_value():
    ref = np.array([1.0, -2.0, 4.0], np.float32)
    assert relative_error(ref.copy(), ref) == 0.0
    assert relative_error(ref + np.array([0, 0, 0.01], np.float32), ref) == pytest.approx(0.0025, rel=1e-3)


def test_bench_model_kinds_times_each_runtime_alone(tmp_path):
    proc, rows = run_bench_script("bench_model_kinds", tmp_path, "--kinds", "vad", "--size", "test",
                                  "--min-rounds", "2", "--max-rounds", "2", "--profile", "2", timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["kind", "compile", "kern", "tether", "1t", "ort", "1t", "ratio", "tether", "2t",
                                "ort", "2t", "ratio", "max", "err", "rounds"]
    # ---- two rounds never settle: both ratios carry the mark and the note says what it means
    assert re.match(r"vad +\d+\.\d\ds +\d+ .*x\*.*x\* +\S+ +2$", lines[1]), lines[1]
    assert all(re.match(r" +\d+\.\d{3}ms  deploy_", ln) for ln in lines[2:4]), lines[2:4]
    assert lines[4].startswith("geometric mean ratio at 1 thread(s)") and lines[-1].startswith("* unstable")
    (row,) = rows
    assert row["kind"] == "vad" and row["size"] == "test" and row["rounds"] == 2
    assert row["max_rel_err"] <= 1e-4 and len(row["profile"]) == 2
    assert not row["stable_1t"] and not row["stable_2t"]
