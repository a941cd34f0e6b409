"""Ahead-of-time model modules (tether.graph.aot): real models built with ``executor="aot"``, the example callers
(examples/aot/run_model.c and run_model.cpp) compiled against them with zig cc, run on the host and, as static
musl executables under qemu-user, on the emulated aarch64 and armv7 boards; every output byte compared with the
Python graph executor of the same build on the same target (the device server's own executor in the emulated
userland for ARM). Plus the error codes a caller gets for bad inputs, workspaces and params files."""
from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tether
from tether import cc, emulate, graph_executor
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx
from tether.testing.model_kinds import KINDS
from tether_rpc.elf import ElfFile

from fixtures.emulated import unavailable
from fixtures.scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "aot"
DIGITS = ROOT / "tests" / "data" / "digits_cnn.onnx"
ERROR_CODES = {"NULL_ARGUMENT": 1, "WORKSPACE_UNINITIALIZED": 2, "WORKSPACE_TOO_SMALL": 3,
               "WORKSPACE_MISALIGNED": 4, "NO_WORKSPACE": 5, "PARAMS_MISSING": 6, "PARAMS_SIZE": 7,
               "PARAMS_CHECKSUM": 8, "INPUT_SIZE": 10, "INPUT_SHAPE": 11}


# ---------------------------------------------------------------------------------------------- models
def _mobilenet_v2(folder):
    return load_script("make_mobilenet_v2").build_mobilenet_v2(seed=1, size=32, width=0.35, classes=10)


def _resnet50(folder):
    # the whole network (16 bottleneck blocks, 23.5M weights) on a 32x32 image: every layer, a short run
    return load_script("make_resnet50").build_resnet50(seed=1, size=32, classes=10)


def _int8_mobilenet_v2(folder):
    fp32 = str(folder / "mnv2.onnx")
    onnx.save(_mobilenet_v2(folder), fp32)
    out = str(folder / "mnv2_int8.onnx")
    load_script("quantize_model").quantize(fp32, out, "qdq", per_channel=True)
    return onnx.load(out)


def _kind(name):
    return lambda folder: KINDS[name]("test")[0]


MODELS = {
    "mobilenet_v2": _mobilenet_v2,
    "resnet50": _resnet50,
    "yolov8_detector": _kind("yolov8_detector"),
    "crnn_recognizer": _kind("crnn_recognizer"),
    "transformer_encoder": _kind("transformer_encoder"),
    "int8_mobilenet_v2": _int8_mobilenet_v2,
}
TARGETS = ("host", "rasp4b", "rasp3b")


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return feeds


class Built:
    """One model built for one target: the AOT module (exported to ``aot``) and its graph build (``graph``)."""

    def __init__(self, folder, name, target, model, params_mode="embedded", workspace="static"):
        graph, params = from_onnx(model)
        self.aot = tether.build_graph(graph, params, target=target, executor="aot", name=name,
                                      aot_params=params_mode, aot_workspace=workspace)
        self.folder, self.name, self.target = folder, name, target
        self.paths = self.aot.export(str(folder / "aot"))
        self.aot.graph_factory.export(str(folder / "graph"))
        self.feeds = _feeds(model)
        self.input_files = []
        for k, (n, x) in enumerate(self.feeds.items()):
            path = folder / ("in%d.bin" % k)
            x.tofile(path)
            self.input_files.append(str(path))

    def executable(self, lang="c", linkage="static"):
        """The example caller for this model, as a static musl executable (or, linkage="shared", a glibc one
        against lib<name>.so)."""
        out = self.folder / ("run_%s_%s" % (lang, linkage))
        if not out.exists():
            aot = self.folder / "aot"
            flags = ["-DMODEL_PREFIX=%s" % self.name, '-DMODEL_HEADER="%s.h"' % self.name]
            if lang == "cpp":
                flags.append("-std=c++17")
            src = str(EXAMPLES / ("run_model.%s" % lang))
            if linkage == "static":
                cc.compile_c([src, self.paths["static"]], str(out), target=self.target, libc="musl",
                             include_dirs=[str(aot)], flags=flags, cxx=lang == "cpp")
            else:
                cc.compile_c([src], str(out), target=self.target, include_dirs=[str(aot)], cxx=lang == "cpp",
                             flags=flags + ["-L" + str(aot), "-l" + self.name, "-Wl,-rpath," + str(aot)])
        return str(out)

    def run(self, args, lang="c", linkage="static"):
        argv = [self.executable(lang, linkage)] + list(args)
        if self.target != "host":
            arch, cpu = emulate.preset_device(self.target)
            qemu = emulate.find_qemu(emulate.arch_spec(arch))
            if qemu is None:
                unavailable("qemu-user for %s is not installed" % arch)
            argv = [qemu, "-cpu", cpu] + argv
        return subprocess.run(argv, capture_output=True, text=True, timeout=600)

    def outputs(self, lang="c", linkage="static", extra=()):
        n = len(self.aot.graph_factory.graph_json["outputs"])
        outs = [str(self.folder / ("out_%s_%s_%d.bin" % (lang, linkage, k))) for k in range(n)]
        proc = self.run(list(extra) + self.input_files + ["-o"] + outs, lang, linkage)
        assert proc.returncode == 0, proc.stderr
        return [pathlib.Path(o).read_bytes() for o in outs]


def _executor_outputs(built, emulated_devices):
    """Every output of the Python graph executor (on the emulated board for ARM targets), as raw bytes."""
    folder = str(built.folder / "graph")
    if built.target == "host":
        gm = graph_executor.load(folder)
        gm.run(**built.feeds)
        return [np.ascontiguousarray(gm.get_output(k)).tobytes() for k in range(gm.num_outputs)]
    from tether import rpc
    from tether.rpc.graph_client import RemoteGraphExecutor

    device = emulated_devices.for_preset(built.target)
    with rpc.connect(*device.address, timeout=600) as sess:
        with RemoteGraphExecutor(sess, folder) as gm:
            gm.run(**built.feeds)
            return [np.ascontiguousarray(gm.get_output(k)).tobytes()
                    for k in range(len(built.aot.graph_factory.graph_json["outputs"]))]


@pytest.fixture(scope="module")
def built_models(tmp_path_factory):
    cache = {}

    def get(model, target):
        if (model, target) not in cache:
            folder = tmp_path_factory.mktemp("%s_%s" % (model, target))
            params_mode = "external" if model == "resnet50" else "embedded"   # 94 MB of weights: a file
            cache[model, target] = Built(folder, "model", target, MODELS[model](folder), params_mode=params_mode)
        return cache[model, target]
    return get


def _params(target):
    marks = [] if target == "host" else [pytest.mark.emulated]
    return [pytest.param(m, target, marks=marks, id="%s-%s" % (m, target)) for m in MODELS]


@pytest.mark.parametrize("model,target", [p for t in TARGETS for p in _params(t)])
def test_aot_module_matches_the_graph_executor_bit_for_bit(model, target, built_models, request):
    """The AOT library runs the same kernels on the same memory plan as the graph executor: from C and from C++
    (with two threads), on the host and on the emulated boards, every output byte is the executor's."""
    built = built_models(model, target)
    emulated_devices = request.getfixturevalue("emulated_devices") if target != "host" else None
    ref = _executor_outputs(built, emulated_devices)
    params = ["--params", built.paths["params"]] if "params" in built.paths else []
    assert built.outputs("c", extra=params) == ref
    assert built.outputs("cpp", extra=params + ["--threads", "2"]) == ref


# ---------------------------------------------------------------------------------------------- digits
@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    model = onnx.load(str(DIGITS))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    return model


def _digits(tmp_path_factory, digits, name="digits", **kw):
    return Built(tmp_path_factory.mktemp(name), name, "host", digits, **kw)


def test_shared_library_is_self_contained_and_exports_only_the_api(tmp_path_factory, digits):
    """lib<name>.so needs no library (no libc) and leaves nothing undefined; it exports its API, no kernel or
    runtime symbol that could clash with another model's; a glibc program linked against it gets the executor's
    outputs."""
    built = _digits(tmp_path_factory, digits)
    with ElfFile(built.paths["so"]) as elf:
        assert elf.needed == [] and elf.undefined_symbols == []
        exported = set(elf.exported_symbols)
    from tether.graph import aot
    assert exported == set(aot.api_symbols("digits"))
    assert built.outputs("c", "shared") == _executor_outputs(built, None)


def test_two_models_link_into_one_program(tmp_path):
    """Two AOT archives (each with its own kernels, thread pool and memcpy) link into one static program: every
    internal symbol carries its model's prefix."""
    built = {}
    model = onnx.load(str(DIGITS))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        built[name] = Built(tmp_path / name, name, "host", model,
                            params_mode="external" if name == "second" else "embedded")
    src = tmp_path / "both.c"
    src.write_text("""
#include <stdio.h>
#include <string.h>
#include "first.h"
#include "second.h"
extern unsigned char second_params[];
int main(int argc, char** argv) {
  static float x[64], a[10], b[10];
  FILE* f = fopen(argv[1], "rb"); if (!f || fread(x, 4, 64, f) != 64) return 100; fclose(f);
  static unsigned char params[SECOND_PARAMS_SIZE] __attribute__((aligned(64)));
  f = fopen(argv[2], "rb"); if (!f || fread(params, 1, sizeof params, f) != sizeof params) return 100; fclose(f);
  int rc = second_load_params(params, sizeof params);
  if (rc) return rc;
  first_inputs in1 = {x}; first_outputs out1 = {a};
  second_inputs in2 = {x}; second_outputs out2 = {b};
  if ((rc = first_run(&in1, &out1, NULL)) || (rc = second_run(&in2, &out2, NULL))) return rc;
  return memcmp(a, b, sizeof a) ? 1 : 0;
}
""")
    exe = cc.compile_c([str(src), built["first"].paths["static"], built["second"].paths["static"]],
                       str(tmp_path / "both"), libc="musl",
                       include_dirs=[str(tmp_path / "first" / "aot"), str(tmp_path / "second" / "aot")])
    proc = subprocess.run([exe, built["first"].input_files[0], built["second"].paths["params"]],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _error(proc, code):
    assert proc.returncode == ERROR_CODES[code], (proc.returncode, proc.stdout, proc.stderr)
    assert "error %d:" % ERROR_CODES[code] in proc.stderr
    return proc.stderr


def test_wrong_input_size_and_too_small_workspace_are_error_codes(tmp_path_factory, digits):
    built = _digits(tmp_path_factory, digits)
    short = built.folder / "short.bin"
    short.write_bytes(pathlib.Path(built.input_files[0]).read_bytes()[:-4])
    assert "wrong size" in _error(built.run([str(short)]), "INPUT_SIZE")
    assert "smaller than DIGITS_WORKSPACE_SIZE" in _error(built.run(["--workspace", "100"] + built.input_files),
                                                          "WORKSPACE_TOO_SMALL")
    # the caller's workspace of exactly the right size runs (and gives the static workspace's outputs)
    assert built.outputs("c", extra=["--workspace", "0"]) == built.outputs("c")


def test_external_params_are_checked_by_size_and_checksum(tmp_path_factory, digits):
    built = _digits(tmp_path_factory, digits, params_mode="external")
    params = pathlib.Path(built.paths["params"]).read_bytes()
    assert "no params loaded" in _error(built.run(built.input_files), "PARAMS_MISSING")
    truncated, flipped = built.folder / "truncated.params", built.folder / "flipped.params"
    truncated.write_bytes(params[:-64])
    flipped.write_bytes(params[:100] + bytes([params[100] ^ 1]) + params[101:])
    _error(built.run(["--params", str(truncated)] + built.input_files), "PARAMS_SIZE")
    _error(built.run(["--params", str(flipped)] + built.input_files), "PARAMS_CHECKSUM")
    assert built.outputs("c", extra=["--params", built.paths["params"]]) == _executor_outputs(built, None)
    # the library with external params holds no copy of them
    embedded = _digits(tmp_path_factory, digits, name="digits_embedded")
    assert os.path.getsize(embedded.paths["so"]) - os.path.getsize(built.paths["so"]) >= len(params)


def test_api_refuses_bad_pointers_workspaces_and_shapes(tmp_path_factory, digits):
    """Through the C API directly: NULL pointers, a misaligned or unprepared workspace, a caller-workspace build
    given none, input shapes that do not fit (size-1 dims aside, as the executor allows) -> codes, no crash."""
    built = _digits(tmp_path_factory, digits, workspace="caller")
    src = built.folder / "api.c"
    src.write_text("""
#include <stdio.h>
#include <stdlib.h>
#include "digits.h"
#define EXPECT(expr, code) do { int rc_ = (expr); if (rc_ != (code)) { \\
  printf("%s: got %d, expected %d\\n", #expr, rc_, (code)); return 1; } } while (0)
int main(void) {
  static float x[64], y[10];
  digits_inputs in = {x}; digits_outputs out = {y};
  unsigned char* mem = aligned_alloc(64, DIGITS_WORKSPACE_SIZE + 64);
  EXPECT(digits_run(&in, &out, NULL), TETHER_AOT_NO_WORKSPACE);
  EXPECT(digits_run(NULL, &out, mem), TETHER_AOT_NULL_ARGUMENT);
  EXPECT(digits_run(&in, &out, mem), TETHER_AOT_WORKSPACE_UNINITIALIZED);
  EXPECT(digits_workspace_init(NULL, DIGITS_WORKSPACE_SIZE), TETHER_AOT_NULL_ARGUMENT);
  EXPECT(digits_workspace_init(mem + 8, DIGITS_WORKSPACE_SIZE), TETHER_AOT_WORKSPACE_MISALIGNED);
  EXPECT(digits_workspace_init(mem, DIGITS_WORKSPACE_SIZE - 1), TETHER_AOT_WORKSPACE_TOO_SMALL);
  EXPECT(digits_workspace_init(mem, DIGITS_WORKSPACE_SIZE), TETHER_AOT_OK);
  EXPECT(digits_run(&in, &out, mem + 8), TETHER_AOT_WORKSPACE_MISALIGNED);
  digits_outputs none = {NULL};
  EXPECT(digits_run(&in, &none, mem), TETHER_AOT_NULL_ARGUMENT);
  EXPECT(digits_run(&in, &out, mem), TETHER_AOT_OK);
  int64_t good[4] = DIGITS_INPUT0_SHAPE, squeezed[2] = {8, 8}, wrong[4] = {1, 1, 8, 9}, flat[1] = {64};
  EXPECT(digits_check_input_shape(0, good, 4), TETHER_AOT_OK);
  EXPECT(digits_check_input_shape(0, squeezed, 2), TETHER_AOT_OK);
  EXPECT(digits_check_input_shape(0, wrong, 4), TETHER_AOT_INPUT_SHAPE);
  EXPECT(digits_check_input_shape(0, flat, 1), TETHER_AOT_INPUT_SHAPE);
  EXPECT(digits_check_input_shape(1, good, 4), TETHER_AOT_BAD_INDEX);
  EXPECT(digits_load_params(NULL, 0), TETHER_AOT_NULL_ARGUMENT);
  const void* ins[1] = {x}; void* outs[1] = {y};
  uint64_t bad[1] = {4 * 63}, right_out[1] = {40}, bad_out[1] = {36};
  EXPECT(digits_run_arrays(ins, bad, outs, right_out, mem), TETHER_AOT_INPUT_SIZE);
  EXPECT(digits_run_arrays(ins, NULL, outs, bad_out, mem), TETHER_AOT_OUTPUT_SIZE);
  if (!digits_error_message(-5) || !digits_error_message(TETHER_AOT_KERNEL)) return 1;
  printf("%s | %s\\n", digits_error_message(TETHER_AOT_WORKSPACE_MISALIGNED), digits_input_name(0));
  return 0;
}
""")
    exe = cc.compile_c([str(src), built.paths["static"]], str(built.folder / "api"), libc="musl",
                       include_dirs=[str(built.folder / "aot")])
    proc = subprocess.run([exe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not aligned to DIGITS_WORKSPACE_ALIGN (64) bytes | input" in proc.stdout


def test_numpy_nodes_are_refused_by_name():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("nz", TensorProto.INT64, None)
    model = helper.make_model(helper.make_graph([helper.make_node("NonZero", ["x"], ["nz"], name="find_them")],
                                                "nz", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    graph, params = from_onnx(model)
    with pytest.raises(UnsupportedOpError, match="node 'find_them' \\(nonzero\\).*executor=\"graph\""):
        tether.build_graph(graph, params, executor="aot", name="nz")


def test_compile_cli_writes_the_aot_files(tmp_path):
    from click.testing import CliRunner
    from tether.cli.main import cli

    res = CliRunner().invoke(cli, ["compile", str(DIGITS), "--input-shape", "input:1,1,8,8", "--aot",
                                   "--params", "external", "--name", "digits", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(tmp_path)) == ["digits.h", "digits.params", "libdigits.a", "libdigits.so"]
    assert "workspace" in res.output and "params external" in res.output
    header = (tmp_path / "digits.h").read_text()
    assert "int digits_run(const digits_inputs* inputs, digits_outputs* outputs, void* workspace);" in header
    assert "#define DIGITS_INPUT0_SHAPE {1, 1, 8, 8}" in header
