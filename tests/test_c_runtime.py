"""The C runtime for model folders (libtether_runtime, src/tether/runtime_c/): built with `tether runtime` for the
host, aarch64 (rasp4b) and armv7 (armv7-a7), linked into the shipped examples (examples/c/run_model.c statically,
examples/cpp/run_model.cpp against the shared library), and run on mobilenet_v2, a YOLOv8 detector, a CRNN
recognizer with LSTMs, a transformer encoder and an int8 (QDQ) mobilenet_v2. The outputs must equal the Python
graph executor's bit for bit on the same target: on the host the executor runs here, on ARM it runs inside the
emulated device's userland (Debian's python3 under qemu-user), beside the C programs run under the same qemu.

Then the errors: every broken folder (missing files, broken JSON, truncated params, a deploy.so that is not ELF or
is for another architecture, numpy nodes, a kernel refusing its arguments, bytes flipped at random) ends in an
error code and a one-line message, never a crash."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import tether
from fixtures.emulated import unavailable
from fixtures.scripts import load_script
from tether import c_runtime, graph_executor
from tether.cc import compile_c
from tether.frontend import from_onnx

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIGITS = ROOT / "tests" / "data" / "digits_cnn.onnx"
# target -> emulated arch (None: the host)
TARGETS = {"host": None, "rasp4b": "aarch64", "armv7-a7": "armv7"}
MODELS = ("mobilenet_v2", "resnet50", "yolov8_detector", "crnn_recognizer", "transformer_encoder", "int8_mobilenet_v2")
THREADS = 2   # the C programs and the Python executors run with the same thread count
STATUS = {"io": 1, "format": 2, "module": 3, "arch": 4, "unsupported": 5, "argument": 6, "kernel": 7}

GUEST_EXECUTOR = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from tether_rpc.graph_executor import GraphExecutor
from tether_rpc.module import load_module
folder, out = sys.argv[2], sys.argv[3]
gm = GraphExecutor.from_folder(folder, load_module=load_module)
for k, path in enumerate(sys.argv[4:]):
    info = gm.info()["inputs"][k]
    gm.set_input(k, np.fromfile(path, dtype=info["dtype"]).reshape(info["shape"]))
gm.run()
for k in range(gm.num_outputs):
    np.ascontiguousarray(gm.get_output(k)).tofile(os.path.join(out, "output_%d.raw" % k))
print("GUEST-OK")
"""


class Builds:
    """Per target, once per module: the runtime, the two example programs and the model folders."""

    def __init__(self, root: pathlib.Path, int8_model):
        self.root = root
        self.int8_model = int8_model
        self._runtimes: dict = {}
        self._folders: dict = {}
        self._userlands: dict = {}

    def runtime(self, target: str) -> dict:
        if target not in self._runtimes:
            out = self.root / ("rt-" + target)
            built = c_runtime.build_runtime(target, str(out))
            inc, lib = built["include"], str(out / "lib")
            built["c"] = compile_c([str(ROOT / "examples" / "c" / "run_model.c"), built["static"]],
                                   str(out / "run_model_c"), target, include_dirs=[inc],
                                   flags=list(c_runtime.LINK_LIBS))
            built["cpp"] = compile_c([str(ROOT / "examples" / "cpp" / "run_model.cpp")], str(out / "run_model_cpp"),
                                     target, include_dirs=[inc], cxx=True,
                                     flags=["-std=c++17", "-L" + lib, "-ltether_runtime", "-Wl,-rpath," + lib])
            self._runtimes[target] = built
        return self._runtimes[target]

    def onnx_model(self, name: str):
        if name == "mobilenet_v2":   # 64x64 input, width 0.5, 100 classes: every block kind, a small run
            return load_script("make_mobilenet_v2").build_mobilenet_v2(1, 64, 0.5, 100), None
        if name == "resnet50":        # the whole network on a 32x32 image, 10 classes
            return load_script("make_resnet50").build_resnet50(seed=1, size=32, classes=10), None
        if name == "int8_mobilenet_v2":
            import onnx
            return onnx.load(self.int8_model("mobilenet_v2", "qdq", 64)), None
        from tether.testing.model_kinds import KINDS
        model, feeds = KINDS[name]("test")
        return model, {k: v.shape for k, v in feeds.items()}

    def folder(self, name: str, target: str) -> pathlib.Path:
        key = (name, target)
        if key not in self._folders:
            model, shape = self.onnx_model(name)
            graph, params = from_onnx(model, shape=shape)
            out = self.root / ("%s-%s" % (name, target))
            tether.build_graph(graph, params, target=target, opt_level=3).export(str(out))
            self._folders[key] = out
        return self._folders[key]

    def userland(self, arch: str):
        from tether import emulate
        if arch not in self._userlands:
            spec = emulate.arch_spec(arch)
            if emulate.find_qemu(spec) is None:
                unavailable("%s is not installed (%s)" % (spec.qemu, emulate.INSTALL_HINT))
            land = emulate.cached_userland(arch)
            if land is None:
                try:
                    land = emulate.ensure_userland(arch)
                except emulate.EmulatorUnavailable as exc:
                    unavailable(str(exc))
            self._userlands[arch] = land
        return self._userlands[arch]

    def command(self, target: str, argv: list) -> list:
        """argv run on `target`: directly on the host, under qemu-user with the userland as root elsewhere."""
        arch = TARGETS[target]
        if arch is None:
            return argv
        from tether import emulate
        land = self.userland(arch)
        _, cpu = emulate.preset_device(target)
        return [emulate.find_qemu(land.spec), "-cpu", cpu, "-L", str(land.rootfs)] + argv


def _env() -> dict:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TETHER_NUM_THREADS": str(THREADS)}


@pytest.fixture(scope="module")
def builds(tmp_path_factory, int8_model):
    return Builds(tmp_path_factory.mktemp("c_runtime"), int8_model)


def _inputs(folder: pathlib.Path, out: pathlib.Path, seed: int) -> list:
    graph = json.loads((folder / "deploy.json").read_text())   # (the folder may be for another arch)
    rng = np.random.default_rng(seed)
    paths = []
    for k, entry in enumerate(graph["entries"][i] for i in graph["inputs"]):
        x = rng.standard_normal(entry["shape"]).astype(entry["dtype"])
        path = out / ("input_%d.raw" % k)
        x.tofile(path)
        paths.append(str(path))
    return paths


def _reference(builds: Builds, folder: pathlib.Path, target: str, inputs: list, out: pathlib.Path) -> list:
    """The Python graph executor's outputs on `target` (raw bytes per output)."""
    out.mkdir()
    arch = TARGETS[target]
    if arch is None:
        from tether_rpc import parallel
        parallel.set_num_threads(THREADS)
        gm = graph_executor.load(str(folder))
        for k, path in enumerate(inputs):
            info = gm.info()["inputs"][k]
            gm.set_input(k, np.fromfile(path, dtype=info["dtype"]).reshape(info["shape"]))
        gm.run()
        return [np.ascontiguousarray(gm.get_output(k)).tobytes() for k in range(gm.num_outputs)]
    land = builds.userland(arch)
    script = out / "executor.py"
    script.write_text(GUEST_EXECUTOR)
    rpc_server = ROOT / "rpc_server"
    argv = builds.command(target, [str(land.python), str(script), str(rpc_server), str(folder), str(out)] + inputs)
    proc = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "GUEST-OK" in proc.stdout, proc.stderr[-3000:]
    return [p.read_bytes() for p in sorted(out.glob("output_*.raw"), key=lambda p: int(p.stem.split("_")[1]))]


def _run_program(builds: Builds, target: str, program: str, folder, inputs: list, out: pathlib.Path):
    argv = [program, str(folder)] + [a for path in inputs for a in ("-i", path)] + ["-o", str(out), "-t",
                                                                                    str(THREADS)]
    return subprocess.run(builds.command(target, argv), env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("target", [pytest.param(t, marks=[pytest.mark.emulated, pytest.mark.slow])
                                    if TARGETS[t] else t for t in TARGETS])
@pytest.mark.parametrize("model", MODELS)
def test_outputs_equal_the_python_executor(builds, model, target, tmp_path):
    if TARGETS[target]:
        builds.userland(TARGETS[target])   # skip (or fail under CI) before building anything
    folder = builds.folder(model, target)
    rt = builds.runtime(target)
    inputs = _inputs(folder, tmp_path, seed=len(model))
    ref = _reference(builds, folder, target, inputs, tmp_path / "python")
    assert ref and all(len(r) for r in ref)
    for lang in ("c", "cpp"):
        out = tmp_path / lang
        out.mkdir()
        proc = _run_program(builds, target, rt[lang], folder, inputs, out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = [(out / ("output_%d.raw" % k)).read_bytes() for k in range(len(ref))]
        for k, (g, r) in enumerate(zip(got, ref)):
            assert g == r, "%s on %s, %s program: output %d differs from the Python executor's" % (
                model, target, lang, k)


def _digits(root: pathlib.Path, target: str = "host") -> pathlib.Path:
    folder = root / ("digits-" + target)
    if not folder.exists():
        import onnx
        graph, params = from_onnx(onnx.load(str(DIGITS)), shape={"input": (2, 1, 8, 8)})
        tether.build_graph(graph, params, target=target, opt_level=3).export(str(folder))
    return folder


def test_api_binding_threads_and_argument_errors(builds, tmp_path):
    rt = builds.runtime("host")
    exe = compile_c([str(ROOT / "tests" / "c_runtime" / "api_check.c"), rt["static"]], str(tmp_path / "api_check"),
                    "host", include_dirs=[rt["include"]], flags=list(c_runtime.LINK_LIBS))
    proc = subprocess.run([exe, str(_digits(builds.root))], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "0 failure(s)" in proc.stdout, proc.stdout + proc.stderr


def test_the_cpp_wrapper_builds_without_exceptions(builds, tmp_path):
    src = tmp_path / "noexc.cpp"
    src.write_text('#include "tether_runtime.hpp"\n#include <cstdio>\n'
                   'int main(int argc, char** argv) { tether::Model m(argv[1]);\n'
                   '  if (!m.ok()) { std::printf("%s %s\\n", m.status().name(), tether::last_error().c_str()); '
                   'return 1; }\n  return m.run().ok() ? 0 : 1; }\n')
    rt = builds.runtime("host")
    exe = compile_c([str(src), rt["static"]], str(tmp_path / "noexc"), "host", include_dirs=[rt["include"]],
                    cxx=True, flags=["-std=c++11", "-fno-exceptions"] + list(c_runtime.LINK_LIBS))
    assert subprocess.run([exe, str(_digits(builds.root))], timeout=60).returncode == 0
    proc = subprocess.run([exe, str(tmp_path / "nothing")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout.startswith("TETHER_RT_ERR_IO "), proc.stdout


def _broken(root: pathlib.Path, name: str, good: pathlib.Path) -> pathlib.Path:
    folder = root / name
    shutil.copytree(good, folder)
    return folder


def _expect_error(builds: Builds, target: str, folder, status: str, words: str, inputs=()) -> str:
    proc = _run_program(builds, target, builds.runtime(target)["c"], folder, list(inputs),
                        builds.root)
    line = proc.stderr.strip()
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)   # an error, not a signal
    assert line.startswith("error TETHER_RT_ERR_%s:" % status.upper()) and words in line, line
    assert "\n" not in line, line
    return line


def test_broken_folders_are_refused_with_a_message(builds, tmp_path):
    good = _digits(builds.root)
    _expect_error(builds, "host", tmp_path / "missing", "io", "is not a folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    _expect_error(builds, "host", empty, "io", "has no deploy.json")

    f = _broken(tmp_path, "json", good)
    text = (f / "deploy.json").read_text()
    (f / "deploy.json").write_text(text[: len(text) // 2])
    _expect_error(builds, "host", f, "format", "not valid JSON")

    f = _broken(tmp_path, "params_truncated", good)
    raw = (f / "deploy.params").read_bytes()
    (f / "deploy.params").write_bytes(raw[: len(raw) - 100])
    _expect_error(builds, "host", f, "format", "truncated")

    f = _broken(tmp_path, "params_missing", good)
    (f / "deploy.params").unlink()
    _expect_error(builds, "host", f, "io", "deploy.params is missing")

    f = _broken(tmp_path, "not_elf", good)
    (f / "deploy.so").write_text("#!/bin/sh\necho not a library\n")
    _expect_error(builds, "host", f, "module", "not an ELF shared library")

    f = _broken(tmp_path, "other_arch", good)
    shutil.copyfile(_digits(builds.root, "rasp4b") / "deploy.so", f / "deploy.so")
    _expect_error(builds, "host", f, "arch", "was built for aarch64")

    f = _broken(tmp_path, "numpy_node", good)
    g = json.loads((f / "deploy.json").read_text())
    g["version"] = 3
    g["nodes"].append({"name": "nz", "numpy": "NonZero", "args": [g["outputs"][0]], "outputs": [g["outputs"][0]]})
    (f / "deploy.json").write_text(json.dumps(g))
    _expect_error(builds, "host", f, "unsupported", "node 'nz' runs numpy op 'NonZero'")

    f = _broken(tmp_path, "outside", good)
    g = json.loads((f / "deploy.json").read_text())
    g["lib"] = "../deploy.so"
    (f / "deploy.json").write_text(json.dumps(g))
    _expect_error(builds, "host", f, "format", "outside its folder")

    f = _broken(tmp_path, "storage_limit", good)
    g = json.loads((f / "deploy.json").read_text())
    g["storages"][0] = 1 << 62
    (f / "deploy.json").write_text(json.dumps(g))
    _expect_error(builds, "host", f, "limit", "the limit")

    # a kernel refusing a view the graph gives it: the module's return code decoded, naming node and argument
    f = _broken(tmp_path, "kernel_shape", good)
    g = json.loads((f / "deploy.json").read_text())
    node = g["nodes"][-1]
    entries = [g["entries"][i] for i in node["args"]]
    node["shapes"] = [[int(np.prod(e["shape"]))] for e in entries]
    (f / "deploy.json").write_text(json.dumps(g))
    _expect_error(builds, "host", f, "kernel", "node %d (%s)" % (len(g["nodes"]) - 1, node["name"]))

    wrong = tmp_path / "wrong_input.raw"
    np.zeros(2 * 64 - 3, np.float32).tofile(wrong)
    _expect_error(builds, "host", good, "argument", "the model expects 512", [str(wrong)])


def test_random_corruption_never_crashes(builds, tmp_path):
    """Bytes flipped in deploy.json and deploy.params: the program exits 0 or 1 with a message, never a signal."""
    good = _digits(builds.root)
    rng = np.random.default_rng(11)
    exe = builds.runtime("host")["c"]
    for trial in range(40):
        f = tmp_path / ("t%d" % trial)
        shutil.copytree(good, f)
        name = "deploy.json" if trial % 2 else "deploy.params"
        raw = bytearray((f / name).read_bytes())
        for _ in range(1 + trial % 4):
            at = int(rng.integers(0, 48 if name == "deploy.params" and trial % 4 == 0 else len(raw)))
            raw[at] = int(rng.integers(0, 256))
        (f / name).write_bytes(bytes(raw))
        proc = subprocess.run([exe, str(f)], capture_output=True, text=True, timeout=60)
        assert proc.returncode in (0, 1), (trial, proc.returncode, proc.stderr)
        assert proc.returncode == 0 or proc.stderr.startswith("error TETHER_RT_ERR_"), proc.stderr


@pytest.mark.emulated
@pytest.mark.parametrize("target", ["rasp4b", "armv7-a7"])
def test_emulated_device_refuses_a_host_module(builds, target, tmp_path):
    builds.userland(TARGETS[target])
    f = _broken(tmp_path, "host_module", _digits(builds.root, target))
    shutil.copyfile(_digits(builds.root) / "deploy.so", f / "deploy.so")
    _expect_error(builds, target, f, "arch", "was built for x86_64")


def test_tether_runtime_command(tmp_path):
    from click.testing import CliRunner
    from tether.cli.main import cli

    res = CliRunner().invoke(cli, ["runtime", "--target", "armv7-a7", "-o", str(tmp_path / "rt")])
    assert res.exit_code == 0, res.output
    lib = tmp_path / "rt" / "lib" / "libtether_runtime.so"
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and head[4] == 1 and int.from_bytes(head[18:20], "little") == 40   # 32-bit ARM
    assert sorted(p.name for p in (tmp_path / "rt" / "include").iterdir()) == [
        "tether_module.h", "tether_runtime.h", "tether_runtime.hpp"]
    assert os.path.getsize(lib) <= 300 * 1024
    for args, words in ((["--target", "nosuch"], "unknown target"), (["--target", "android-arm64"], "Android"),
                        (["-o", str(tmp_path / "no" / "such" / "dir")], "does not exist")):
        res = CliRunner().invoke(cli, ["runtime"] + (args if "-o" in args else args + ["-o", str(tmp_path / "x")]))
        assert res.exit_code == 2 and words in res.output and len(res.output.strip().splitlines()) == 1, res.output
