"""The wasm32 target (docs/web.md): presets, the module contract (no imports; memory, __heap_base and the packed
functions exported; metadata in the custom section tether_meta), SIMD128 code in the hot kernels, and a small
model of every op family compiled for wasm32, run in node through the JS runtime (bindings/js) and compared with
onnxruntime. Also the clear errors: host functions, unknown features, a .wasm given to the Python runtime."""
import json
import re

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from wasm_cases import CASES, compare_case
from wasm_node import NodeToolError, run_kernel, run_model, wasm_imports_and_exports, wasm_metadata, wasm_sections

import tether
from tether import te
from tether.errors import CompileError, TetherError
from tether.frontend import from_onnx
from tether.target import Target, UnknownTargetError

ABSENT_KEYS = ("thread_pool", "parallel_tasks", "host_functions", "cpu_dispatch")
SIMD_OP = re.compile(r"^\s+((?:[fi]\d+x\d+|v128)\.[a-z_0-9]+)", re.M)


def _simd_ops(asm: str) -> dict:
    out: dict = {}
    for op in SIMD_OP.findall(asm):
        out[op] = out.get(op, 0) + 1
    return out


def _vadd(n: int = 1024):
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: te.exp(A[i]) + B[i] * 2.0, name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=16)
    s[C].vectorize(xi)
    s[C].parallel(xo)
    return s, [A, B, C]


# ---- the target ------------------------------------------------------------------------------------------------
def test_presets_are_listed():
    from tether.cli.main import cli

    result = CliRunner().invoke(cli, ["targets", "--plain", "--no-host"])
    assert result.exit_code == 0, result.output
    rows = {line.split("\t")[0]: line.split("\t") for line in result.output.splitlines() if "\t" in line}
    assert rows["wasm32"][1] == "wasm32-unknown-unknown" and "+simd128" in rows["wasm32"][3]
    assert rows["wasm32-nosimd"][1] == "wasm32-unknown-unknown" and "-simd128" in rows["wasm32-nosimd"][3]
    assert "i32x4.dot_i16x8_s" in rows["wasm32"][4]


def test_target_properties():
    t = Target("wasm32")
    assert (t.arch, t.triple, t.bits, t.vector_bits, t.vector_lanes(32)) == ("wasm32", "wasm32-unknown-unknown",
                                                                           32, 128, 4)
    assert t.feature_list == ("+simd128",) and t.cpu == "mvp"
    assert t.llvm_features == "+bulk-memory,+nontrapping-fptoint,+sign-ext,+mutable-globals,+simd128"
    assert Target("wasm32-unknown-unknown -mattr=+simd128") == t.__class__(t.triple, features="+simd128")
    assert t.requirements() == {"isa": "wasm32", "features": ["simd128"]}
    assert Target("wasm32-nosimd").requirements() == {"isa": "wasm32", "features": []}
    assert Target("wasm32-relaxed").requirements() == {"isa": "wasm32", "features": ["relaxed-simd", "simd128"]}
    assert "p:32:32" in t.data_layout
    flags = " ".join(t.link_flags)
    for flag in ("--no-entry", "--export=__heap_base", "--export-memory", "stack-size=1048576", "--strip-debug"):
        assert flag in flags
    assert "--allow-undefined" not in flags and "--shared-memory" not in flags
    assert t.library_suffix == ".wasm" and Target("x86_64").library_suffix == ".so"


def test_a_js_device_gets_the_wasm32_target():
    assert Target.from_device_info({"arch": "wasm32"}) == Target("wasm32")
    assert Target.from_device_info({"suggested_target": "wasm32-nosimd", "arch": "wasm32"}).preset == "wasm32-nosimd"


@pytest.mark.parametrize("spec, word", [("wasm32-unknown-unknown -mattr=+simd128,+bogus", "'+bogus'"),
                                        ("wasm32-unknown-unknown -mattr=+atomics", "single-threaded"),
                                        ("wasm32-unknown-unknown -mattr=simd128", "'simd128'")])
def test_unknown_feature_is_one_clear_line(spec, word):
    with pytest.raises(UnknownTargetError) as exc:
        Target(spec)
    text = str(exc.value)
    assert "\n" not in text and word in text and "unknown WebAssembly feature" in text and "simd128" in text


def test_cli_refuses_an_unknown_feature_without_a_traceback(tmp_path):
    from tether.cli.main import cli

    result = CliRunner().invoke(cli, ["compile", str(tmp_path / "none.onnx"), "--target",
                                      "wasm32-unknown-unknown -mattr=+nope", "-o", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "unknown WebAssembly feature '+nope'" in result.output and "Traceback" not in result.output


# ---- the module ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["wasm32", "wasm32-nosimd", "wasm32-relaxed"])
def test_module_contract(preset, tmp_path):
    lib = tether.build(*_vadd(), target=preset, name="vadd")
    path = lib.export_library(str(tmp_path / "vadd.wasm"))
    data = open(path, "rb").read()
    imports, exports = wasm_imports_and_exports(data)
    assert imports == []
    assert exports == {"memory": 2, "vadd": 0, "__heap_base": 3}
    meta = wasm_metadata(data)
    assert meta == json.loads(json.dumps(lib.metadata))
    assert meta["target"]["arch"] == "wasm32" and meta["target"]["triple"] == "wasm32-unknown-unknown"
    simd = {"wasm32": ["simd128"], "wasm32-nosimd": [], "wasm32-relaxed": ["relaxed-simd", "simd128"]}[preset]
    assert meta["requires"] == {"isa": "wasm32", "features": simd}
    assert not set(ABSENT_KEYS) & set(meta)
    assert meta["functions"][0]["parallel"] is False     # the parallel loop runs serially in the impl
    (used,) = [body for sid, name, body in wasm_sections(data) if name == "target_features"]
    used = set(re.findall(rb"(?s)\+.([a-z0-9-]+)", used))   # what LLVM compiled for: the contract's features only
    assert used == {b"bulk-memory", b"bulk-memory-opt", b"mutable-globals", b"nontrapping-fptoint", b"sign-ext"} | (
        {name.encode() for name in simd}), used
    custom = [name for sid, name, _ in wasm_sections(data) if sid == 0]
    assert custom.count("tether_meta") == 1 and set(custom) <= {"name", "target_features", "tether_meta"}, custom
    ops = _simd_ops(lib.get_source("asm"))
    if preset != "wasm32-nosimd":
        assert ops.get("f32x4.mul", 0) >= 4 and ops.get("f32x4.add", 0) >= 4, ops
    else:
        assert ops == {}


def test_host_functions_are_refused_at_build_time():
    n = 8
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * te.call_packed("scale", i, dtype="float32"), name="B")
    s = te.create_schedule(B.op)
    with pytest.raises(CompileError) as exc:
        tether.build(s, [A, B], target="wasm32", name="affine")
    assert "call_packed('scale')" in str(exc.value) and "wasm32" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_static_scratch_needs_no_atomics(tmp_path):
    """A buffer over the stack limit lives in the static arena; its lock is not emitted on wasm32 (single-threaded)
    and no atomic instruction (which needs the atomics feature) reaches the module."""
    n = 40000
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((n,), lambda i: B[n - 1 - i] + 1.0, name="C")
    s = te.create_schedule(C.op)
    lib = tether.build(s, [A, C], target="wasm32", name="rev")
    asm = lib.get_source("asm")
    assert "tether_scratch_arena" in asm and "atomic" not in asm and "scratch_lock" not in asm
    path = lib.export_library(str(tmp_path / "rev.wasm"))
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    _, out = run_kernel(path, "rev", [a, np.zeros(n, np.float32)])
    np.testing.assert_array_equal(out, (a * 2 + 1)[::-1])


def test_llvm_lowers_atomics_without_the_atomics_feature():
    """Were an atomic to reach wasm32 code (the ELF scratch lock is one), LLVM lowers it to plain memory accesses
    without the atomics feature: the module stays valid for every engine and needs no shared memory."""
    from tether.codegen.emit import compile_module

    ir_text = """
target triple = "wasm32-unknown-unknown"
@lock = internal global i32 0, align 4
define i32 @take() {
  %old = atomicrmw xchg ptr @lock, i32 1 acquire
  store atomic i32 0, ptr @lock release, align 4
  ret i32 %old
}
"""
    asm = compile_module(ir_text, "wasm32").asm
    assert "atomic" not in asm and "i32.store" in asm


def test_kernel_runs_in_node_and_reports_a_readable_error(tmp_path):
    lib = tether.build(*_vadd(), target="wasm32", name="vadd")
    path = lib.export_library(str(tmp_path / "vadd.wasm"))
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    c = np.zeros(1024, np.float32)
    _, _, got = run_kernel(path, "vadd", [a, b, c])
    np.testing.assert_allclose(got, np.exp(a) + b * 2, rtol=1e-6, atol=1e-6)
    with pytest.raises(NodeToolError) as exc:
        run_kernel(path, "vadd", [a, b[:1000], c])
    assert str(exc.value) == "vadd: argument 1 'B' has shape (1000,), expected (1024,) (dimension 0 differs)"


def test_build_in_parts_links_one_module(tmp_path):
    """Six or more kernels build in worker processes; the parts' objects merge with wasm-ld -r and the runtime part
    defines the one scratch arena the parts declare."""
    n = 20000
    items = []
    for k in range(6):
        A = te.placeholder((n,), name="A")
        B = te.compute((n,), lambda i: A[i] + float(k), name="B")
        C = te.compute((n,), lambda i: B[n - 1 - i] * 2.0, name="C")
        items.append((te.create_schedule(C.op), [A, C], "f%d" % k))
    lib = tether.build(items, target="wasm32", name="parts", jobs=2)
    assert lib.compiled.parts, "expected a build in parts"
    path = lib.export_library(str(tmp_path / "parts.wasm"))
    _, exports = wasm_imports_and_exports(open(path, "rb").read())
    assert {"f%d" % k for k in range(6)} <= set(exports)
    a = np.arange(n, dtype=np.float32)
    for k in range(6):
        _, out = run_kernel(path, "f%d" % k, [a, np.zeros(n, np.float32)])
        np.testing.assert_array_equal(out, ((a + k) * 2)[::-1])


# ---- invalid uses: a wasm32 module on the Python side -------------------------------------------------------
def test_python_runtime_refuses_a_wasm_module(tmp_path):
    from tether import runtime
    from tether.errors import InvalidInput
    from tether.model_folder import check_model_folder
    from tether_rpc.errors import ArchMismatch
    from tether_rpc.module import inspect_module

    lib = tether.build(*_vadd(), target="wasm32", name="vadd")
    path = lib.export_library(str(tmp_path / "vadd.wasm"))
    for load in (runtime.load_module, inspect_module):
        with pytest.raises(ArchMismatch) as exc:
            load(path)
        text = str(exc.value)
        assert "\n" not in text and "WebAssembly module (wasm32)" in text and "JS runtime" in text, text
    with pytest.raises(TetherError, match="JS runtime"):
        lib.load()
    folder = _compile_cli(tmp_path)
    check_model_folder(str(folder))     # a folder for a remote JS device is a valid folder
    with pytest.raises(InvalidInput, match=r"deploy\.wasm is a WebAssembly module \(wasm32\)"):
        check_model_folder(str(folder), local=True)


def test_rpc_client_uploads_a_wasm_module_and_a_python_device_refuses_it(rpc_server, tmp_path):
    """The client sends a .wasm like any module (a JS device server loads it); a Python device server answers the
    load with the same one-line refusal, and the session goes on."""
    from tether import rpc
    from tether_rpc.errors import ArchMismatch

    path = tether.build(*_vadd(), target="wasm32", name="vadd").export_library(str(tmp_path / "vadd.wasm"))
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=30) as remote:
        assert remote.upload(path) == "vadd.wasm"
        assert "vadd.wasm" in remote.listdir()
        assert remote.download("vadd.wasm") == open(path, "rb").read()
        with pytest.raises(ArchMismatch) as exc:
            remote.load_module("vadd.wasm")
        assert "WebAssembly module (wasm32)" in str(exc.value) and "JS runtime" in str(exc.value)
        assert remote.get_function("tether.echo")(3) == 3


def _compile_cli(tmp_path):
    from tether.cli.main import cli

    model, _ = CASES["conv_relu_pool_chain"]()
    src = tmp_path / "small.onnx"
    src.write_bytes(model.SerializeToString())
    out = tmp_path / "model"
    result = CliRunner().invoke(cli, ["compile", str(src), "--target", "wasm32", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_compile_cli_writes_deploy_wasm(tmp_path):
    folder = _compile_cli(tmp_path)
    graph = json.loads((folder / "deploy.json").read_text())
    assert graph["lib"] == "deploy.wasm" and graph["target"]["arch"] == "wasm32"
    assert sorted(p.name for p in folder.iterdir()) == ["deploy.json", "deploy.params", "deploy.wasm"]
    data = (folder / "deploy.wasm").read_bytes()
    assert wasm_imports_and_exports(data)[0] == []
    assert {n["func"] for n in graph["nodes"]} <= {f["name"] for f in wasm_metadata(data)["functions"]}


def test_aot_executor_is_refused_for_wasm32():
    model, _ = CASES["dense_gemm"]()
    graph, params = from_onnx(model)
    with pytest.raises(ValueError, match="JS runtime"):
        tether.build_graph(graph, params, target="wasm32", executor="aot")


# ---- every op family, in node ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_op_family_in_node_matches_onnxruntime(name, tmp_path):
    model, feeds = CASES[name]()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="wasm32").export(str(tmp_path))
    compare_case(name, run_model(str(tmp_path), feeds), ref)


@pytest.mark.parametrize("name", ["conv_regular", "matmul_batched", "softmax", "qlinear_ops"])
def test_op_family_without_simd_in_node(name, tmp_path):
    model, feeds = CASES[name]()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="wasm32-nosimd")
    assert _simd_ops(factory.lib.get_source("asm")) == {}
    factory.export(str(tmp_path))
    compare_case(name, run_model(str(tmp_path), feeds), ref)


@pytest.mark.parametrize("name, ops", [("conv_regular", ("f32x4.mul", "f32x4.add", "v128.load32_splat")),
                                       ("conv_depthwise", ("f32x4.mul", "f32x4.add")),
                                       ("conv_pointwise", ("f32x4.mul", "f32x4.add")),
                                       ("matmul_batched", ("f32x4.mul", "f32x4.add", "v128.load")),
                                       ("dense_gemm", ("f32x4.mul", "f32x4.add")),
                                       ("qlinear_ops", ("i32x4.dot_i16x8_s",))])
def test_hot_kernels_use_simd128(name, ops):
    model, _ = CASES[name]()
    graph, params = from_onnx(model)
    found = _simd_ops(tether.build_graph(graph, params, target="wasm32").lib.get_source("asm"))
    for op in ops:
        assert found.get(op, 0) >= 4, (op, found)
