"""scripts/bench_arm.py end to end on the CI table's tiny conv net: tether, onnxruntime's aarch64 wheel and LiteRT's
aarch64 wheel counted on the emulated Cortex-A72 (qemu-user and the instruction-count plugin), fp32 and int8; the
table printed, the JSON rows written, every count positive and the runtimes' outputs in agreement. The wheels come
from PyPI on first use (then from the cache); unreachable, they are a skip here and a failure under CI."""
import os
import sys

import pytest

from fixtures.prereq import require_module, unavailable
from fixtures.scripts import run_bench_script

pytestmark = [pytest.mark.emulated]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIMES = ("tether_onnx", "tether_tflite", "ort", "litert")


def run_bench(tmp_path, *args, timeout=1800):
    return run_bench_script("bench_arm", tmp_path, *args, timeout=timeout)


@pytest.fixture(scope="module")
def wheels(emulated_devices):
    """The aarch64 userland, the host's converters, root and unshare, and the runtimes' wheels for the guest."""
    emulated_devices.userland("aarch64")
    require_module("tensorflow", "pip install tensorflow-cpu")
    require_module("onnxruntime")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import bench_arm

    problem = bench_arm.namespace_problem()
    if problem:
        unavailable("a private mount namespace for an ARM /proc/cpuinfo (%s)" % problem,
                    "util-linux's unshare; run the suite as root")

    try:
        return bench_arm.guest_site(log=lambda s: None)
    except bench_arm.BenchError as exc:
        unavailable("onnxruntime and ai-edge-litert aarch64 wheels (%s)" % exc, "pip and PyPI reachable")


def test_conv_net_on_all_three_runtimes(wheels, tmp_path):
    proc, rows = run_bench(tmp_path, "--models", "conv_net", "--precisions", "fp32,int8", "--max-seconds", "1500")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.split()[:4] == ["model", "prec", "tether(onnx)", "onnxruntime"] for ln in lines), proc.stdout
    assert sum(ln.startswith("conv_net ") for ln in lines) == 2, proc.stdout
    assert "geometric mean fp32: tether/ORT" in proc.stdout and "geometric mean int8: tether/ORT" in proc.stdout
    assert [(r["model"], r["precision"]) for r in rows] == [("conv_net", "fp32"), ("conv_net", "int8")]
    for row in rows:
        for key in RUNTIMES:
            per = row[key]
            assert per["total"] > 0 and all(per[c] >= 0 for c in ("vfma", "load", "store", "branch")), (key, per)
            assert per["total"] == pytest.approx(sum(v for c, v in per.items() if c != "total"))
            assert 0 <= row["vfma_share"][key] < 1
        for key in ("tether_onnx", "tether_tflite"):
            assert 0 < row[key + "_in_kernels"] < row[key]["total"], row
        assert row["ratio_ort"] == pytest.approx(row["tether_onnx"]["total"] / row["ort"]["total"])
        assert row["ratio_xnnpack"] == pytest.approx(row["tether_tflite"]["total"] / row["litert"]["total"])
    fp32, int8 = rows
    # the same network and weights in both files: every runtime computes the same logits to float rounding
    assert max(fp32["rel_diff"].values()) <= 1e-4, fp32["rel_diff"]
    # the float kernels use vector FMAs on the A72, in all three runtimes
    assert all(fp32["vfma_share"][key] > 0 for key in RUNTIMES), fp32["vfma_share"]
    # int8: tether against the runtime that read the same quantized file, to a few quantization steps; the QDQ
    # ONNX and the int8 TFLite are two quantizations of one network, so those two agree more loosely
    assert int8["rel_diff"]["tether_onnx~ort"] <= 0.05, int8["rel_diff"]
    assert int8["rel_diff"]["tether_tflite~litert"] <= 0.05, int8["rel_diff"]
    assert int8["rel_diff"]["ort~litert"] <= 0.25, int8["rel_diff"]


def test_unknown_model_is_one_line(tmp_path):
    proc, rows = run_bench(tmp_path, "--models", "nope", timeout=300)
    assert proc.returncode == 2 and rows is None
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("bench_arm: unknown model") and "nope" in line
