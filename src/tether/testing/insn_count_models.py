"""The CI table of instruction counts (tests/data/insn_counts.json, tests/test_insn_counts.py,
scripts/update_insn_counts.py): its small models, how a table is measured, and how two tables compare.

The models (a conv net, a transformer encoder, an int8 conv net) are built with onnx.helper from fixed seeds so the
same model comes out on every machine, and are small enough that an emulated run takes seconds. A table holds, per
model and preset, the instructions per inference by class (tether.bench.insn_count), the part inside the compiled
kernels (by class), and each kernel's total.

The gate: a count that rises by more than the tolerance (2%) fails; one that falls by more fails too, asking for the
table to be rewritten, so the table stays the truth. Kernel counts depend only on tether's code generation and the
emulated CPU and are always gated; the whole per-inference count also includes the executor's Python and numpy,
which move with the guest's versions and memory layout, so it is gated only when the guest environment is the one
the table was written in (same Python, numpy, qemu and userland folder).
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: (model, preset) pairs of the table: every model on a Cortex-A72 (rasp4b) and a Cortex-A7 (armv7-a7), and the
#: int8 model on a Cortex-A76 (rasp5), whose dot-product instructions the int8 kernels use
TABLE: Tuple[Tuple[str, str], ...] = (
    ("conv_net", "rasp4b"), ("conv_net", "armv7-a7"),
    ("transformer", "rasp4b"), ("transformer", "armv7-a7"),
    ("int8_conv_net", "rasp4b"), ("int8_conv_net", "armv7-a7"), ("int8_conv_net", "rasp5"),
)
TOLERANCE_PCT = 2.0
#: changes smaller than this many instructions per inference are not gated (2% of a class of 40 is one instruction)
MIN_GATED_CHANGE = 50


def _init(name: str, arr: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(arr, name)


def conv_net() -> Tuple[object, List[np.ndarray]]:
    """conv 3->8 (3x3) + relu, conv 8->16 (3x3, stride 2) + relu, global average pool, dense 16->10, softmax."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b1 = (rng.standard_normal(8) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    b2 = (rng.standard_normal(16) * 0.1).astype(np.float32)
    w3 = (rng.standard_normal((16, 10)) * 0.3).astype(np.float32)
    b3 = (rng.standard_normal(10) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["g"]),
        helper.make_node("Softmax", ["g"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "conv_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [_init(n, a) for n, a in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2), ("w3", w3),
                                                        ("b3", b3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, [rng.standard_normal((1, 3, 16, 16)).astype(np.float32)]


def transformer() -> Tuple[object, List[np.ndarray]]:
    """Two encoder layers (d_model 128, 4 heads, feed-forward 512, GELU, LayerNormalization) on 16 tokens: the
    "tiny" size of tether.testing.model_kinds.transformer_encoder."""
    from tether.testing.model_kinds import transformer_encoder

    model, feeds = transformer_encoder("tiny")
    return model, [feeds["x"]]


def int8_conv_net() -> Tuple[object, List[np.ndarray]]:
    """QuantizeLinear, QLinearConv 8->16 (3x3, uint8 activations, int8 weights), QLinearConv 16->16 (3x3),
    DequantizeLinear: the int8 convolution path (qconv2d) with its requantization."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(12)
    w1 = rng.integers(-60, 60, (16, 8, 3, 3)).astype(np.int8)
    w2 = rng.integers(-60, 60, (16, 16, 3, 3)).astype(np.int8)
    b1 = rng.integers(-500, 500, 16).astype(np.int32)
    b2 = rng.integers(-500, 500, 16).astype(np.int32)
    inits = [_init("xs", np.array(0.02, np.float32)), _init("xz", np.array(128, np.uint8)),
             _init("w1", w1), _init("w1s", np.array(0.01, np.float32)), _init("w1z", np.array(0, np.int8)),
             _init("b1", b1), _init("y1s", np.array(0.05, np.float32)), _init("y1z", np.array(120, np.uint8)),
             _init("w2", w2), _init("w2s", np.array(0.01, np.float32)), _init("w2z", np.array(0, np.int8)),
             _init("b2", b2), _init("y2s", np.array(0.1, np.float32)), _init("y2z", np.array(128, np.uint8))]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("QLinearConv", ["xq", "xs", "xz", "w1", "w1s", "w1z", "y1s", "y1z", "b1"], ["y1"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("QLinearConv", ["y1", "y1s", "y1z", "w2", "w2s", "w2z", "y2s", "y2z", "b2"], ["y2"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("DequantizeLinear", ["y2", "y2s", "y2z"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "int8_conv_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, [rng.standard_normal((1, 8, 12, 12)).astype(np.float32)]


#: table name -> builder
MODELS: Dict[str, Callable[[], Tuple[object, List[np.ndarray]]]] = {
    "conv_net": conv_net, "transformer": transformer, "int8_conv_net": int8_conv_net,
}


def compile_for(name: str, preset: str, out: str) -> Tuple[str, List[np.ndarray], object]:
    """Build table model ``name`` for ``preset`` into the folder ``out``: (folder, inputs, the ONNX model)."""
    import tether
    from tether.frontend import from_onnx

    model, inputs = MODELS[name]()
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target=preset).export(out)
    return out, inputs, model


# -- measuring and comparing tables --------------------------------------------------------------------------------

def environment(arches: Sequence[str]) -> Dict[str, Any]:
    """What the counts outside the kernels depend on: per arch the guest's Python and numpy, qemu, and where the
    userland is (the guest interpreter's own path shifts where its objects land, and with that its count)."""
    from tether import emulate

    env: Dict[str, Any] = {}
    for arch in arches:
        userland = emulate.ensure_userland(arch)
        qemu = emulate.find_qemu(userland.spec)
        version = subprocess.run([qemu, "--version"], stdout=subprocess.PIPE, text=True, timeout=60).stdout
        env[arch] = {"python": userland.stamp.get("python_version"), "numpy": userland.stamp.get("numpy_version"),
                     "qemu": version.splitlines()[0] if version else None, "userland": str(userland.path)}
    return env


def measure(pairs: Sequence[Tuple[str, str]] = TABLE, check_outputs: bool = True,
            log: Callable[[str], None] = lambda s: None) -> Dict[str, Any]:
    """A table: every (model, preset) of ``pairs`` compiled and counted. ``check_outputs``: the counted run's
    output is compared with onnxruntime's, so a table never records a model that computes the wrong thing."""
    from tether import emulate
    from tether.bench import insn_count

    counts: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tether-insn-table-") as work:
        for name, preset in pairs:
            folder, inputs, model = compile_for(name, preset, os.path.join(work, "%s-%s" % (name, preset)))
            out = os.path.join(work, "%s-%s.npy" % (name, preset))
            rec = insn_count.count_model(folder, preset, inputs, output=out)
            if check_outputs:
                _check_output(name, preset, model, inputs, np.load(out))
            per = rec["per_inference"]
            counts.setdefault(name, {})[preset] = {
                "cpu": rec["cpu"], "in_kernels": rec["in_kernels"],
                "kernels": {k: v["total"] for k, v in rec["kernels"].items()}, "per_inference": per}
            log("%s on %s (%s): %s per inference, %s in kernels"
                % (name, preset, rec["cpu"], per["total"], rec["in_kernels"]["total"]))
    arches = sorted({emulate.preset_device(p)[0] for _, p in pairs})
    return {"about": "guest instructions per inference on emulated CPUs (tether bench --count-instructions); "
                     "rewrite with python scripts/update_insn_counts.py",
            "tolerance_pct": TOLERANCE_PCT, "environment": environment(arches), "counts": counts}


def _check_output(name: str, preset: str, model: Any, inputs: List[np.ndarray], got: np.ndarray) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), inputs)})[0]
    # float models to float32 rounding; the int8 model to one quantization step (rounding ties may differ)
    tol = 0.11 if name.startswith("int8") else 1e-4 * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(got.astype(np.float64) - ref).max())
    if got.shape != ref.shape or err > tol:
        raise AssertionError("%s on %s computed the wrong output (max error %.3g > %.3g): its counts mean nothing"
                             % (name, preset, err, tol))


def _change(base: float, new: float) -> Optional[float]:
    """Relative change new/base - 1 when it is gated (beyond the tolerance and MIN_GATED_CHANGE), else None."""
    if abs(new - base) < MIN_GATED_CHANGE:
        return None
    rel = (new - base) / base if base else float("inf")
    return rel if abs(rel) * 100 > TOLERANCE_PCT else None


def compare(base: Dict[str, Any], new: Dict[str, Any]) -> Tuple[List[str], List[str], str]:
    """(rises, falls, the printed table): every gated count of ``new`` against ``base``, beyond the tolerance."""
    from tether.bench.insn_count import CLASSES

    rises: List[str] = []
    falls: List[str] = []
    lines = ["%-14s %-9s %-22s %12s %12s %8s" % ("model", "preset", "count", "table", "now", "change")]
    for name, by_preset in new["counts"].items():
        for preset, now in by_preset.items():
            was = base.get("counts", {}).get(name, {}).get(preset)
            if was is None or not isinstance(was.get("in_kernels"), dict):
                falls.append("%s on %s is not in the table (or in an older layout)" % (name, preset))
                continue
            items = [("kernels " + c, was["in_kernels"][c], now["in_kernels"][c], True) for c in ("total",) + CLASSES]
            items += [("kernel " + k, was["kernels"].get(k, 0), v, True) for k, v in now["kernels"].items()]
            # The whole inference (with the executor's Python) is shown, never gated: CPython's own count moves
            # with the paths it sees and what its allocator and caches met before (a clean clone elsewhere, a
            # loaded machine), while the kernels' code runs the same instructions in every run.
            items += [("total", was["per_inference"]["total"], now["per_inference"]["total"], False)]
            items += [(c, was["per_inference"][c], now["per_inference"][c], False) for c in CLASSES]
            for what, b, n, gated in items:
                rel = _change(b, n) if gated else None
                lines.append("%-14s %-9s %-22s %12s %12s %8s%s"
                             % (name, preset, what[:22], _fmt(b), _fmt(n),
                                "%+.2f%%" % (100 * (n - b) / b) if b else "new",
                                "  <--" if rel is not None else ("" if gated else "  (not gated)")))
                if rel is not None:
                    msg = "%s on %s: %s %s -> %s (%+.2f%%)" % (name, preset, what, _fmt(b), _fmt(n), 100 * rel)
                    (rises if rel > 0 else falls).append(msg)
    return rises, falls, "\n".join(lines)


def _fmt(n: float) -> str:
    return "%d" % n if float(n).is_integer() else "%.1f" % n
