#!/usr/bin/env python3
"""Instructions per inference on an emulated Cortex-A72 (rasp4b), one thread: tether against onnxruntime's
aarch64 wheel (MLAS) and LiteRT's aarch64 wheel (ai-edge-litert, XNNPACK), fp32 and int8.

    python scripts/bench_arm.py [--models mobilenet_v2,conv_net,mlp] [--precisions fp32,int8]
        [--warm 3] [--extra 2] [--max-seconds 3000] [--json out.json]

Every runtime runs in the Debian aarch64 userland (tether.emulate) under qemu-user with the instruction-count plugin
(tether.bench.insn_count), on the same input. tether is counted as ``tether bench --count-instructions`` counts (a
window of 4 inferences after 10, marked for the plugin, over 4); onnxruntime and LiteRT the same way: WARM
inferences, then EXTRA in a window marked for the plugin (its mark system call), over EXTRA. tether's model is
compiled for rasp4b and run by its device package; onnxruntime and LiteRT are their PyPI aarch64 wheels for the
guest's Python (3.11), downloaded once with ``pip download`` and unpacked under
``$XDG_CACHE_HOME/tether/arm-wheels/`` (the userland itself is not changed). Both read /proc/cpuinfo at start-up
through the cpuinfo library, which under qemu-user is the host's x86 text (onnxruntime then dies of SIGSEGV), so
their guest processes run in a private mount namespace (``unshare -m``: root, or a user namespace where the kernel
allows one) with a Cortex-A72's /proc/cpuinfo bind-mounted over the host's.

The models exist as ONNX (tether, onnxruntime) and as TFLite (LiteRT, and tether's TFLite frontend): the ONNX
network is rebuilt layer by layer in Keras with the same weights and converted with TensorFlow's TFLite converter.
int8: the ONNX model quantized to QDQ by onnxruntime's quantize_static (tether, onnxruntime), the Keras model
converted to a full-integer int8 TFLite (LiteRT, tether's TFLite frontend); both calibrated on the same random
inputs. Ratios: tether / onnxruntime on the ONNX file, tether / XNNPACK on the TFLite file (lower is better).
``vfma``: the share of vector FMA instructions in each runtime's count. Outputs are checked between runtimes
(max |a - b| / max |b|).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rows import add_json_option, geometric_mean, write_rows  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GUEST_PROGRAM = os.path.join(HERE, "_arm_runtime_guest.py")
PRESET = "rasp4b"
GUEST_PYTHON = "311"     # Debian bookworm's python3
#: the platform tags the guest's glibc (2.36) accepts, for pip download
PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_27_aarch64", "manylinux_2_28_aarch64",
             "manylinux_2_31_aarch64", "manylinux_2_34_aarch64", "manylinux_2_35_aarch64", "manylinux_2_36_aarch64")
# What the two runtimes import at inference time; the rest of their declared dependencies (protobuf, sympy,
# tqdm...) serve their converters and tools. flatbuffers: both read their model files' schema with it.
WHEELS = ("onnxruntime", "ai-edge-litert", "flatbuffers")
#: a Raspberry Pi 4's /proc/cpuinfo (Cortex-A72: implementer 0x41, part 0xd08), what cpuinfo expects on aarch64
A72_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

Hardware\t: BCM2835
Revision\t: c03111
Model\t\t: Raspberry Pi 4 Model B Rev 1.1
"""
DOWNLOAD_TIMEOUT_S = 600.0


class BenchError(RuntimeError):
    """One line saying what could not be done."""


# -- the runtimes' wheels for the guest ---------------------------------------------------------------------------

def wheels_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tether", "arm-wheels")


def _pinned(name: str) -> str:
    """The host's version of ``name`` when it has one, so both sides of an output check run the same release."""
    try:
        return "%s==%s" % (name, importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        return name


def guest_site(log: Callable[[str], None] = print) -> str:
    """A folder with onnxruntime, ai_edge_litert and flatbuffers for aarch64 CPython 3.11, for the guest's
    PYTHONPATH: pip-downloaded wheels unpacked once, cached by the requirement list."""
    import hashlib
    import zipfile

    reqs = [_pinned(n) for n in WHEELS]
    key = hashlib.sha256(" ".join(reqs + list(PLATFORMS)).encode()).hexdigest()[:12]
    folder = os.path.join(wheels_root(), "cp%s-%s" % (GUEST_PYTHON, key))
    site = os.path.join(folder, "site")
    if os.path.isfile(os.path.join(folder, "complete")):
        return site
    dl = os.path.join(folder, "wheels")
    os.makedirs(dl, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", GUEST_PYTHON, "--dest", dl]
    for p in PLATFORMS:
        argv += ["--platform", p]
    log("downloading %s (aarch64, CPython %s) into %s" % (", ".join(reqs), GUEST_PYTHON, dl))
    try:
        proc = subprocess.run(argv + reqs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError("pip download of the aarch64 wheels did not finish within %.0f s" % DOWNLOAD_TIMEOUT_S)
    if proc.returncode != 0:
        raise BenchError("pip download of the aarch64 wheels (%s) failed: %s"
                         % (", ".join(reqs), proc.stdout.strip()[-1500:]))
    shutil.rmtree(site, ignore_errors=True)
    tmp = site + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in sorted(os.listdir(dl)):
        if name.endswith(".whl"):
            with zipfile.ZipFile(os.path.join(dl, name)) as zf:
                zf.extractall(tmp)
    os.replace(tmp, site)
    with open(os.path.join(folder, "complete"), "w") as fh:
        fh.write("\n".join(reqs) + "\n")
    return site


# -- the models ----------------------------------------------------------------------------------------------------

def _mobilenet_v2():
    from make_mobilenet_v2 import build_mobilenet_v2

    return build_mobilenet_v2(seed=0, size=224)


def _conv_net():
    from tether.testing.insn_count_models import conv_net

    return conv_net()[0]


def _mlp():
    """Three dense layers with ReLU (Gemm, transB as exporters write it), 256 -> 512 -> 512 -> 10."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    sizes = [256, 512, 512, 10]
    nodes, inits, x = [], [], "x"
    for k, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((n_out, n_in)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        inits += [numpy_helper.from_array(w, "w%d" % k),
                  numpy_helper.from_array((rng.standard_normal(n_out) * 0.1).astype(np.float32), "b%d" % k)]
        nodes.append(helper.make_node("Gemm", [x, "w%d" % k, "b%d" % k], ["g%d" % k], transB=1))
        x = "g%d" % k
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [x], ["r%d" % k]))
            x = "r%d" % k
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


#: model name -> builder of its ONNX ModelProto (fp32, one input)
MODELS: Dict[str, Callable[[], object]] = {"mobilenet_v2": _mobilenet_v2, "conv_net": _conv_net, "mlp": _mlp}
DEFAULT_MODELS = ("mobilenet_v2", "conv_net", "mlp")


def _input_shape(model) -> List[int]:
    inits = {i.name for i in model.graph.initializer}
    vi = next(v for v in model.graph.input if v.name not in inits)
    return [d.dim_value for d in vi.type.tensor_type.shape.dim]


def to_nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if x.ndim == 4 else x


def keras_from_onnx(model):
    """The ONNX network rebuilt in Keras with the same weights (NHWC; the ops these models use: Conv, also
    depthwise, BatchNormalization, Relu, Clip, Add, GlobalAveragePool, Flatten, Gemm, Softmax)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from onnx import numpy_helper

    layers = tf.keras.layers
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    shape = _input_shape(model)
    inp = tf.keras.Input(shape=tuple(to_nhwc(np.zeros(shape)).shape[1:]), batch_size=shape[0])
    env = {model.graph.input[0].name: inp}
    weights = []   # (layer, arrays): set once the model is built
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        x = env[node.input[0]]
        op = node.op_type
        if op == "Conv":
            w = consts[node.input[1]]
            b = consts[node.input[2]] if len(node.input) > 2 and node.input[2] else None
            group = attrs["group"].i if "group" in attrs else 1
            strides = tuple(attrs["strides"].ints) if "strides" in attrs else (1, 1)
            pads = list(attrs["pads"].ints) if "pads" in attrs else [0, 0, 0, 0]
            if any(pads):
                x = layers.ZeroPadding2D(((pads[0], pads[2]), (pads[1], pads[3])))(x)
            if group == 1:
                layer = layers.Conv2D(w.shape[0], w.shape[2:], strides=strides, use_bias=b is not None)
                arrays = [w.transpose(2, 3, 1, 0)]
            elif group == w.shape[0] and w.shape[1] == 1:
                layer = layers.DepthwiseConv2D(w.shape[2:], strides=strides, use_bias=b is not None)
                arrays = [w.transpose(2, 3, 0, 1)]
            else:
                raise BenchError("Conv with group %d is not one the Keras rebuild knows" % group)
            y = layer(x)
            weights.append((layer, arrays + ([b] if b is not None else [])))
        elif op == "BatchNormalization":
            eps = attrs["epsilon"].f if "epsilon" in attrs else 1e-5
            layer = layers.BatchNormalization(epsilon=eps)
            y = layer(x)
            weights.append((layer, [consts[n] for n in node.input[1:5]]))
        elif op == "Relu":
            y = layers.ReLU()(x)
        elif op == "Clip":
            lo, hi = (float(consts[n]) for n in node.input[1:3])
            if lo != 0.0:
                raise BenchError("Clip(%g, %g) is not one the Keras rebuild knows" % (lo, hi))
            y = layers.ReLU(max_value=hi)(x)
        elif op == "Add":
            y = layers.Add()([x, env[node.input[1]]])
        elif op == "GlobalAveragePool":
            y = layers.GlobalAveragePooling2D()(x)    # (N, C): the Flatten after it has nothing left to do
        elif op == "Flatten":
            if len(x.shape) != 2:
                raise BenchError("Flatten of a %d-D tensor is not one the Keras rebuild knows" % len(x.shape))
            y = x
        elif op == "Gemm":
            w = consts[node.input[1]]
            if "transB" in attrs and attrs["transB"].i:
                w = w.T
            b = consts[node.input[2]] if len(node.input) > 2 else None
            layer = layers.Dense(w.shape[1], use_bias=b is not None)
            y = layer(x)
            weights.append((layer, [w] + ([b] if b is not None else [])))
        elif op == "Softmax":
            y = layers.Softmax()(x)
        else:
            raise BenchError("ONNX op %s is not one the Keras rebuild knows" % op)
        env[node.output[0]] = y
    keras_model = tf.keras.Model(inp, env[model.graph.output[0].name])
    for layer, arrays in weights:
        layer.set_weights([np.asarray(a, np.float32) for a in arrays])
    return keras_model


def tflite_bytes(keras_model, calibration_onnx: Optional[str] = None) -> bytes:
    """The Keras model as TFLite: float, or with ``calibration_onnx`` full-integer int8 calibrated on the inputs
    scripts/quantize_model.py gives onnxruntime's quantize_static for that ONNX file (the same arrays)."""
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    if calibration_onnx:
        from quantize_model import random_inputs

        samples = [next(iter(feeds.values())) for feeds in random_inputs(calibration_onnx, 8)]

        def calibration():
            for x in samples:
                yield [to_nhwc(x)]
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = calibration
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):   # the export's listing of endpoints
        return conv.convert()


def model_files(name: str, folder: str, precision: str) -> Tuple[str, str, np.ndarray]:
    """``(onnx path, tflite path, input NCHW)`` of model ``name`` at ``precision`` in ``folder``."""
    import onnx

    model = MODELS[name]()
    shape = _input_shape(model)
    onnx_fp32 = os.path.join(folder, "%s.onnx" % name)
    onnx.save(model, onnx_fp32)
    onnx_path, tfl_path = onnx_fp32, os.path.join(folder, "%s-%s.tflite" % (name, precision))
    if precision == "int8":
        from quantize_model import quantize

        onnx_path = quantize(onnx_fp32, os.path.join(folder, "%s-int8.onnx" % name), "qdq")
    with open(tfl_path, "wb") as fh:
        fh.write(tflite_bytes(keras_from_onnx(model), onnx_fp32 if precision == "int8" else None))
    x = np.random.default_rng(42).random(tuple(shape), dtype=np.float32)
    return onnx_path, tfl_path, x


# -- counting ------------------------------------------------------------------------------------------------------

def count_tether(path: str, x: np.ndarray, work: str, timeout: float) -> Tuple[dict, np.ndarray, float]:
    """tether's count as ``tether bench --count-instructions`` takes it (a marked window of 4 inferences after 10:
    the executor's Python is steady only after CPython has specialized it)."""
    import tether
    from tether.bench import insn_count
    from tether.frontend import from_onnx, from_tflite

    graph, params = from_tflite(path) if path.endswith(".tflite") else from_onnx(path)
    folder = tempfile.mkdtemp(prefix="tether-", dir=work)
    tether.build_graph(graph, params, target=PRESET).export(folder)
    out = os.path.join(work, "tether-out.npy")
    rec = insn_count.count_model(folder, PRESET, [x], timeout=timeout, output=out)
    return rec["per_inference"], np.load(out), rec["in_kernels"]["total"]


def namespace_prefix() -> List[str]:
    """The command that starts a process in a private mount namespace, where an A72's cpuinfo is bind-mounted over
    the host's x86 text, seen by that process tree only: ``unshare -m`` as root, else inside a user namespace
    that maps the caller to root (``-r``), where the kernel allows those."""
    return ["unshare", *([] if os.geteuid() == 0 else ["-r"]), "-m", "--propagation", "private"]


def namespace_problem() -> Optional[str]:
    """None when ``namespace_prefix()`` can bind-mount over /proc/cpuinfo here, else what went wrong."""
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    try:
        proc = subprocess.run([*namespace_prefix(), "sh", "-c", "mount --bind /proc/version /proc/cpuinfo"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "unshare did not finish within 60 s"
    if proc.returncode != 0:
        return ("cannot bind-mount over /proc/cpuinfo in a private mount namespace (%s): %s; run as root"
                % (" ".join(namespace_prefix()), proc.stdout.strip()[-300:]))
    return None


def _run_runtime(userland, site: str, cpuinfo: str, runtime: str, model: str, x_path: str, warm: int, extra: int,
                 work: str, timeout: float) -> List[Dict[str, int]]:
    """One guest process of ``runtime``: ``warm`` inferences, then ``extra`` in the marked window; the plugin's
    marks (totals by class at each mark)."""
    from tether.bench import insn_count
    from tether.emulate import find_qemu

    qemu = find_qemu(userland.spec)
    cpu = insn_count.emulated_cpu(PRESET)[1]
    counts = os.path.join(work, "counts-%s.json" % runtime)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(counts)
    guest = ["-s", "-B", "-u", "-c", "import sys; sys.argv[0] = 'guest'; exec(compile(open(%r).read(), 'guest', "
             "'exec'))" % os.path.basename(GUEST_PROGRAM), runtime, os.path.basename(model),
             os.path.basename(x_path), str(warm), str(extra), "out-%s.npy" % runtime]
    qemu_argv = [qemu, "-cpu", cpu, "-plugin", "%s,out=%s" % (insn_count.plugin_path(), counts),
                 "-E", "LD_PRELOAD=%s" % insn_count.determinism_lib_path("aarch64"), "-E", "PYTHONPATH=%s" % site,
                 "-L", str(userland.rootfs), str(userland.python), *guest]
    argv = [*namespace_prefix(), "sh", "-c", 'mount --bind "$0" /proc/cpuinfo && exec "$@"', cpuinfo, *qemu_argv]
    try:
        proc = subprocess.run(argv, env=insn_count.guest_env(), cwd=work, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              preexec_fn=insn_count._no_aslr)
    except subprocess.TimeoutExpired:
        raise BenchError("%s in the guest (%d inferences) did not finish within %.0f s"
                         % (runtime, warm + extra, timeout))
    stdout, stderr = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    if proc.returncode != 0 or not stdout.startswith("ok ") or not os.path.isfile(counts):
        raise BenchError("%s in the guest failed (exit %d): %s"
                         % (runtime, proc.returncode, " | ".join((stderr.strip() or stdout.strip())[-1500:]
                                                                .splitlines()[-8:])))
    with open(counts) as fh:
        marks = json.load(fh).get("marks") or []
    if len(marks) != 4:
        raise BenchError("the plugin recorded %d marks of %s's window, expected 4" % (len(marks), runtime))
    return marks


def count_runtime(userland, site: str, cpuinfo: str, runtime: str, model: str, x: np.ndarray, work: str,
                  warm: int, extra: int, timeout: float) -> Tuple[dict, np.ndarray]:
    """Instructions per inference of onnxruntime (``ort``) or LiteRT (``litert``) on ``model``: the marked
    window of one guest process, less what a mark costs, over ``extra``."""
    from tether.bench import insn_count

    shutil.copyfile(GUEST_PROGRAM, os.path.join(work, os.path.basename(GUEST_PROGRAM)))
    if os.path.dirname(os.path.abspath(model)) != os.path.abspath(work):
        shutil.copyfile(model, os.path.join(work, os.path.basename(model)))
    x_path = os.path.join(work, "input-%s.npy" % runtime)
    np.save(x_path, to_nhwc(x) if runtime == "litert" else x, allow_pickle=False)
    m = _run_runtime(userland, site, cpuinfo, runtime, model, x_path, warm, extra, work, timeout)
    per = insn_count._with_total(insn_count.window_per_inference(m, extra))
    return per, np.load(os.path.join(work, "out-%s.npy" % runtime))


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    if a.shape != b.shape:
        return float("inf")
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))


#: the largest relative output difference that still counts as agreement: fp32 to float rounding (orders of
#: summation differ); int8 between two runtimes reading one quantized file, to a few quantization steps
AGREEMENT = {"fp32": 1e-3, "int8": 0.05}


def disagreement(row: dict) -> Optional[str]:
    """What disagrees in ``row`` (tether against the runtime that read the same file; in fp32 also onnxruntime
    against LiteRT; the int8 files are two quantizations), or None."""
    tol = AGREEMENT[row["precision"]]
    pairs = row["rel_diff"] if row["precision"] == "fp32" else \
        {k: v for k, v in row["rel_diff"].items() if k != "ort~litert"}
    bad = ["%s %.3g > %g" % (k, v, tol) for k, v in pairs.items() if not v <= tol]
    return ", ".join(bad) or None


def vfma_share(per: dict) -> float:
    return per["vfma"] / per["total"] if per["total"] else 0.0


def bench_one(name: str, precision: str, userland, site: str, cpuinfo: str, args, deadline: float,
              log: Callable[[str], None]) -> dict:
    row: dict = {"model": name, "precision": precision}
    with tempfile.TemporaryDirectory(prefix="tether-armbench-", dir="/tmp") as work:
        onnx_path, tfl_path, x = model_files(name, work, precision)
        runs = (("tether_onnx", "tether", onnx_path), ("tether_tflite", "tether", tfl_path),
                ("ort", "ort", onnx_path), ("litert", "litert", tfl_path))
        outs = {}
        for key, runtime, path in runs:
            left = deadline - time.monotonic()
            if left < 30:
                raise BenchError("--max-seconds reached before %s %s %s" % (name, precision, key))
            timeout = max(30.0, left / 2)
            t0 = time.monotonic()
            if runtime == "tether":
                per, out, in_kernels = count_tether(path, to_nhwc(x) if path.endswith(".tflite") else x, work,
                                                    timeout)
                row[key + "_in_kernels"] = in_kernels     # the compiled code alone, without the executor's Python
            else:
                per, out = count_runtime(userland, site, cpuinfo, runtime, path, x, work, args.warm, args.extra,
                                         timeout)
            row[key] = per
            outs[key] = out
            kern = (", %.0f in tether's kernels" % row[key + "_in_kernels"]) if runtime == "tether" else ""
            log("  %s %s %-13s %14.1f instructions per inference (vfma %4.1f%%%s)  [%.0f s]"
                % (name, precision, key, per["total"], 100 * vfma_share(per), kern, time.monotonic() - t0))
    row["vfma_share"] = {key: vfma_share(row[key]) for key, _, _ in runs}
    row["ratio_ort"] = row["tether_onnx"]["total"] / row["ort"]["total"]
    row["ratio_xnnpack"] = row["tether_tflite"]["total"] / row["litert"]["total"]
    # outputs: tether on each file against the runtime that read the same file, and the two files' runtimes
    row["rel_diff"] = {"tether_onnx~ort": rel_diff(outs["tether_onnx"], outs["ort"]),
                       "tether_tflite~litert": rel_diff(outs["tether_tflite"], outs["litert"]),
                       "ort~litert": rel_diff(outs["ort"], outs["litert"])}
    return row


def print_table(rows: List[dict]) -> None:
    print("\ninstructions per inference, emulated Cortex-A72 (rasp4b), one thread; ratios: lower is better")
    print("%-13s %-5s %13s %13s %13s %13s %8s %8s %6s %6s %6s %6s %9s" % (
        "model", "prec", "tether(onnx)", "onnxruntime", "tether(tfl)", "litert", "t/ORT", "t/XNN",
        "vfma t", "ORT", "t(tfl)", "XNN", "max diff"))
    for r in rows:
        print("%-13s %-5s %13.0f %13.0f %13.0f %13.0f %8.3f %8.3f %5.1f%% %5.1f%% %5.1f%% %5.1f%% %9.2g" % (
            r["model"], r["precision"], r["tether_onnx"]["total"], r["ort"]["total"], r["tether_tflite"]["total"],
            r["litert"]["total"], r["ratio_ort"], r["ratio_xnnpack"], 100 * vfma_share(r["tether_onnx"]),
            100 * vfma_share(r["ort"]), 100 * vfma_share(r["tether_tflite"]), 100 * vfma_share(r["litert"]),
            max(r["rel_diff"].values())))
    for precision in ("fp32", "int8"):
        sel = [r for r in rows if r["precision"] == precision]
        if sel:
            print("geometric mean %s: tether/ORT %.3f, tether/XNNPACK %.3f (%d models)"
                  % (precision, geometric_mean(r["ratio_ort"] for r in sel),
                     geometric_mean(r["ratio_xnnpack"] for r in sel), len(sel)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated, from: " + ", ".join(MODELS))
    ap.add_argument("--precisions", default="fp32,int8", help="comma-separated, from: fp32, int8")
    ap.add_argument("--warm", type=int, default=3,
                    help="onnxruntime and LiteRT: inferences before the counted ones (default 3)")
    ap.add_argument("--extra", type=int, default=2, help="onnxruntime and LiteRT: counted inferences (default 2)")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="stop (with what is done) after this long")
    add_json_option(ap)
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [m for m in models if m not in MODELS] + [p for p in precisions if p not in ("fp32", "int8")]
    if bad or not models or not precisions:
        print("bench_arm: unknown model or precision %s (models: %s; precisions: fp32, int8)"
              % (", ".join(bad) or "(none given)", ", ".join(MODELS)), file=sys.stderr)
        return 2
    if args.warm < 1 or args.extra < 1:
        print("bench_arm: --warm and --extra must be at least 1", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.max_seconds
    log = lambda s: print(s, flush=True)   # noqa: E731
    from tether import emulate
    from tether.errors import TetherError

    try:
        problem = namespace_problem()
        if problem:
            raise BenchError("the runtimes run in a private mount namespace with an ARM /proc/cpuinfo: " + problem)
        # onnxruntime's and LiteRT's wheels need libstdc++, which the device's own userland has no use for
        userland = emulate.ensure_extra(emulate.ensure_userland("aarch64"), "cxx")
        site = guest_site(log)
    except (BenchError, emulate.EmulationError) as exc:
        print("bench_arm: %s" % exc, file=sys.stderr)
        return 1
    rows: List[dict] = []
    failed = False
    with tempfile.NamedTemporaryFile("w", prefix="tether-a72-cpuinfo-", suffix=".txt", dir="/tmp") as cpuinfo:
        cpuinfo.write(A72_CPUINFO)
        cpuinfo.flush()
        os.chmod(cpuinfo.name, 0o644)
        for precision in precisions:
            for name in models:
                try:
                    row = bench_one(name, precision, userland, site, cpuinfo.name, args, deadline, log)
                    rows.append(row)
                    wrong = disagreement(row)
                    if wrong:
                        print("bench_arm: %s %s: outputs disagree: %s" % (name, precision, wrong), file=sys.stderr)
                        failed = True
                except (BenchError, TetherError) as exc:
                    print("bench_arm: %s %s: %s" % (name, precision, exc), file=sys.stderr)
                    failed = True
                    if time.monotonic() > deadline - 30:
                        break
    if rows:
        print_table(rows)
    write_rows(args.json, rows)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
