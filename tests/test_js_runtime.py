"""The JavaScript runtime (bindings/js) against the Python one: its node unit tests, params files crossing between
the two, real wasm32 modules built by tether.build called through tools/run_kernel.js and compared with numpy,
the graph executor's numpy nodes against tether_rpc.numpy_ops on random inputs, a whole model folder against the
Python executor, and bad input (truncated params, a wrong magic, a module for another arch, a wrong argument
shape) with the same messages as the Python runtime."""
from __future__ import annotations

import json
import re
import pathlib
import subprocess
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest

from fixtures.prereq import require_tool
from tether_rpc.dtypes import name_of, numpy_dtype, storage_of
from tether_rpc.graph_executor import GraphExecutor
from tether_rpc.params import ParamsFormatError, load_params, save_params

ROOT = pathlib.Path(__file__).resolve().parent.parent
JS = ROOT / "bindings" / "js"
FIXTURES = JS / "test" / "fixtures"
TIMEOUT_S = 300


def _node() -> str:
    return require_tool("node", "apt-get install nodejs (node >= 18)")


def _run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([_node(), *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=str(cwd))


def _js(source: str, *args: str) -> subprocess.CompletedProcess:
    """Run an ES-module snippet with the runtime's modules importable from ``src``."""
    src = (JS / "src").as_uri()
    return _run("--input-type=module", "-e", source.replace("SRC", src), "--", *args)


def _run_kernel(wasm: pathlib.Path, func: str, args: Sequence[np.ndarray], tmp: pathlib.Path):
    (tmp / "args.params").write_bytes(save_params({str(i): a for i, a in enumerate(args)}))
    out = tmp / "out.params"
    if out.exists():
        out.unlink()
    proc = _run(str(JS / "tools" / "run_kernel.js"), str(wasm), func, str(tmp / "args.params"), str(out))
    return proc, (load_params(str(out)) if proc.returncode == 0 else None)


# ---------------------------------------------------------------------------------------------------- unit tests
def test_node_unit_tests_pass():
    proc = _run("--test", "test/", cwd=JS)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = [line for line in proc.stdout.splitlines() if line.startswith("# pass ")]
    assert passed and int(passed[0].split()[-1]) >= 10, proc.stdout[-2000:]
    assert "# fail 0" in proc.stdout


def test_src_is_browser_safe():
    """src/ runs in browsers: no node built-ins, no Buffer, no process."""
    for path in (JS / "src").glob("*.js"):
        text = path.read_text()
        for banned in (r"from ['\"]node:", r"\brequire\(", r"\bBuffer\b", r"\bprocess\.", r"from ['\"](fs|path)['\"]"):
            assert not re.search(banned, text), "%s uses %s" % (path.name, banned)
    pkg = json.loads((JS / "package.json").read_text())
    assert pkg["type"] == "module" and pkg["engines"]["node"] == ">=18" and not pkg.get("dependencies")


# -------------------------------------------------------------------------------------------------------- params
def _every_dtype(rng: np.random.Generator) -> Dict[str, np.ndarray]:
    out: Dict[str, np.ndarray] = {}
    for name in ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64"):
        out["t_" + name] = (rng.standard_normal((3, 5)) * 100).astype(name)
    out["t_bool"] = rng.standard_normal(7) > 0
    out["t_bfloat16"] = rng.integers(0, 1 << 16, size=(2, 2), dtype=np.uint16).view(numpy_dtype("bfloat16"))
    out["scalar"] = np.array(2.5, np.float64)
    out["empty"] = np.zeros((0, 4), np.int32)
    out["ünïcode/name"] = np.arange(3, dtype=np.int64) - (1 << 62)
    return out


def test_params_written_by_python_read_by_js_and_back(tmp_path):
    params = _every_dtype(np.random.default_rng(0))
    src = tmp_path / "py.params"
    src.write_bytes(save_params(params))
    proc = _js("""
        import { readFileSync, writeFileSync } from "node:fs";
        import { loadParams, saveParams } from "SRC/params.js";
        const m = loadParams(new Uint8Array(readFileSync(process.argv[1])));
        writeFileSync(process.argv[2], saveParams(m));
        console.log(JSON.stringify([...m].map(([n, a]) => [n, a.dtype, a.shape])));
    """, str(src), str(tmp_path / "js.params"))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen == [[n, name_of(a.dtype), list(a.shape)] for n, a in params.items()]
    assert (tmp_path / "js.params").read_bytes() == src.read_bytes()
    back = load_params(str(tmp_path / "js.params"))
    for name, a in params.items():
        assert name_of(back[name].dtype) == name_of(a.dtype) and np.array_equal(back[name], a), name


def _corruptions(good: bytes) -> List[bytes]:
    one = save_params({"x": np.arange(2, dtype=np.float32)})
    nb = 16 + 2 + 1 + 1 + 7 + 1 + 8
    cases = [good[:10], b"QTHRPRM\x00" + good[8:], good[:8] + b"\x09" + good[9:], good[:-3], good[:20],
             good[:400]]
    cases.append(one[:20] + b"float99" + one[27:])
    cases.append(one[:nb] + (12).to_bytes(8, "little") + one[nb + 8:])
    cases.append(one[:nb - 8] + (-2).to_bytes(8, "little", signed=True) + one[nb:])
    cases.append(one[:nb - 9] + bytes([40]) + one[nb - 8:])
    return cases


def test_bad_params_refused_with_python_messages(tmp_path):
    good = save_params(_every_dtype(np.random.default_rng(1)))
    expected = []
    for k, data in enumerate(_corruptions(good)):
        (tmp_path / ("bad%d.params" % k)).write_bytes(data)
        with pytest.raises(ParamsFormatError) as info:
            load_params(data)
        expected.append(str(info.value))
    proc = _js("""
        import { readFileSync } from "node:fs";
        import { loadParams } from "SRC/params.js";
        const out = [];
        for (const path of process.argv.slice(1)) {
          try { loadParams(new Uint8Array(readFileSync(path))); out.push("loaded"); }
          catch (e) { out.push(e.name + ": " + e.message); }
        }
        console.log(JSON.stringify(out));
    """, *[str(tmp_path / ("bad%d.params" % k)) for k in range(len(expected))])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["ParamsFormatError: " + m for m in expected]


# ---------------------------------------------------------------------------------------- real wasm32 modules
def _build(target: str, path: pathlib.Path, kind: str = "vadd") -> pathlib.Path:
    import tether
    from tether import te
    if kind == "vadd":
        A = te.placeholder((1024,), "float32", name="A")
        B = te.placeholder((1024,), "float32", name="B")
        C = te.compute((1024,), lambda i: A[i] + B[i], name="C")
        s = te.create_schedule(C.op)
        lib = tether.build(s, [A, B, C], target=target, name="vadd")
    else:   # a reduction over an int32 and a float64 operand: a matmul with a cast
        A = te.placeholder((16, 24), "float64", name="A")
        B = te.placeholder((24, 8), "int32", name="B")
        k = te.reduce_axis((0, 24), name="k")
        C = te.compute((16, 8), lambda i, j: te.sum(A[i, k] * B[k, j].astype("float64"), axis=k), name="C")
        s = te.create_schedule(C.op)
        lib = tether.build(s, [A, B, C], target=target, name="mm")
    lib.export_library(str(path))
    return path


@pytest.mark.parametrize("target", ["wasm32", "wasm32-nosimd"])
def test_run_kernel_on_compiled_wasm_matches_numpy(tmp_path, target):
    rng = np.random.default_rng(2)
    wasm = _build(target, tmp_path / "vadd.wasm")
    a, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    proc, out = _run_kernel(wasm, "vadd", [a, b, np.zeros(1024, np.float32)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(out["0"], a) and np.array_equal(out["2"], a + b)
    wasm = _build(target, tmp_path / "mm.wasm", "mm")
    x, y = rng.standard_normal((16, 24)), rng.integers(-9, 9, size=(24, 8), dtype=np.int32)
    proc, out = _run_kernel(wasm, "mm", [x, y, np.zeros((16, 8))], tmp_path)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(out["2"], x @ y.astype(np.float64), rtol=1e-12, atol=1e-12)


def test_wrong_argument_shape_same_message_as_python(tmp_path):
    from tether_rpc.errors import KernelError
    from tether_rpc.module import load_module
    a = np.ones(1024, np.float32)
    proc, _ = _run_kernel(_build("wasm32", tmp_path / "vadd.wasm"), "vadd", [a, a[:1000], a.copy()], tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    with load_module(str(_build("host", tmp_path / "vadd.so"))) as host:
        with pytest.raises(KernelError) as info:
            host["vadd"](a, a[:1000].copy(), a.copy())
    assert proc.stderr.strip() == str(info.value) == \
        "vadd: argument 1 'B' has shape (1000,), expected (1024,) (dimension 0 differs)"


def test_bad_modules_and_arguments_are_one_line_exit_2(tmp_path):
    from tether_rpc.elf import host_arch
    a = np.ones(1024, np.float32)
    cases = [
        (_build("host", tmp_path / "vadd.so"), "vadd", "was built for %s" % host_arch()),
        (FIXTURES / "abi_kernels_aarch64.wasm", "vadd", "abi_kernels_aarch64.wasm was built for aarch64"),
        (FIXTURES / "abi_kernels.wasm", "nope", "has no function 'nope'"),
    ]
    for wasm, func, text in cases:
        proc, _ = _run_kernel(wasm, func, [a, a, a], tmp_path)
        assert proc.returncode == 2 and text in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    good = save_params({"0": a})
    for data, text in ((good[:100], "runs past the end of the file"),
                       (b"NOTPARAM" + good[8:], "not a tether params file")):
        (tmp_path / "args.params").write_bytes(data)
        proc = _run(str(JS / "tools" / "run_kernel.js"), str(FIXTURES / "abi_kernels.wasm"), "vadd",
                    str(tmp_path / "args.params"), str(tmp_path / "o.params"))
        assert proc.returncode == 2 and text in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert not (tmp_path / "o.params").exists()


# -------------------------------------------------------------------------------------- graph: numpy nodes
def _numpy_graph(op: str, attrs: Dict[str, Any], inputs: Sequence[np.ndarray],
                 outputs: Sequence[Tuple[Tuple[int, ...], str, bool]]) -> Dict[str, Any]:
    entries, storages = [], []

    def add(name: str, shape: Tuple[int, ...], dtype: str, dynamic: bool = False) -> int:
        storages.append(int(np.prod(shape, dtype=np.int64)) * numpy_dtype(dtype).itemsize)
        entries.append(dict({"name": name, "shape": list(shape), "dtype": dtype, "storage": len(storages) - 1},
                            **({"dynamic": True} if dynamic else {})))
        return len(entries) - 1

    ins = [add("in%d" % k, a.shape, name_of(a.dtype)) for k, a in enumerate(inputs)]
    outs = [add("out%d" % k, s, d, dyn) for k, (s, d, dyn) in enumerate(outputs)]
    return {"format": "tether-graph", "version": 3, "name": op, "lib": None, "storages": storages,
            "entries": entries, "inputs": ins, "outputs": outs, "params": [],
            "nodes": [{"name": "n_" + op, "numpy": op, "attrs": attrs, "inputs": ins, "outputs": outs, "ops": op}]}


def _numpy_cases(seed: int) -> List[Tuple[str, Dict[str, Any], List[np.ndarray], List[Tuple[tuple, str, bool]]]]:
    rng = np.random.default_rng(seed)
    ties = lambda *shape: (rng.integers(0, 6, size=shape) / 2).astype(np.float32)  # noqa: E731 -- many ties
    x = ties(3, 4, 5)
    x[0, 0, :2] = [np.nan, -0.0]
    cases = [
        ("nonzero", {}, [x], [((3, 60), "int64", True)]),
        ("nonzero", {}, [rng.integers(-1, 2, size=(4, 6)).astype(np.int64)], [((2, 24), "int64", True)]),
        ("nonzero", {}, [np.array(3, np.int32)], [((1, 1), "int64", True)]),
        ("compress", {}, [x, rng.standard_normal(50) > 0], [((60,), "float32", True)]),
        ("compress", {"axis": 1}, [x, np.array([1, 0, 1], bool)], [((3, 4, 5), "float32", True)]),
        ("compress", {"axis": -1}, [x, rng.standard_normal(9) > 0], [((3, 4, 5), "float32", True)]),
    ]
    h = ties(5, 6).astype(np.float16)
    h[0, :3] = [0.0, -0.0, np.nan]
    bf = (ties(5, 6) - 1).view(np.uint32)
    bf = (bf >> 16).astype(np.uint16)
    bf[0, :2] = [0x8000, 0x7FC0]    # -0.0 and NaN
    bf = bf.view(numpy_dtype("bfloat16"))   # exact bfloat16 values with ties
    cases += [
        ("nonzero", {}, [h], [((2, 30), "int64", True)]),
        ("nonzero", {}, [bf], [((2, 30), "int64", True)]),
        ("compress", {"axis": 0}, [rng.integers(-9, 9, size=(5, 2)), rng.integers(0, 2, size=5).astype(np.uint8)],
         [((5, 2), "int64", True)]),
        ("unique", {"sorted": 1}, [h], [((30,), "float16", True)] + [((30,), "int64", True)] * 3),
        ("unique", {"sorted": 0}, [rng.standard_normal(12) > 0],
         [((12,), "bool", True)] + [((12,), "int64", True)] * 3),
        ("topk", {"axis": 1, "largest": 1}, [h, np.array([4], np.int64)], [((5, 6), "float16", True),
                                                                           ((5, 6), "int64", True)]),
        ("topk", {"axis": 0, "largest": 0}, [bf, np.array([2], np.int64)], [((5, 6), "bfloat16", True),
                                                                            ((5, 6), "int64", True)]),
        ("topk", {"axis": 1, "largest": 1}, [rng.integers(-(1 << 40), 1 << 40, size=(3, 7)), np.array([7], np.int64)],
         [((3, 7), "int64", True), ((3, 7), "int64", True)]),
    ]
    u = ties(40)
    u[[3, 17]] = np.nan
    ui = rng.integers(0, 3, size=(6, 3)).astype(np.int32)
    for sort in (0, 1):
        cases.append(("unique", {"sorted": sort}, [u], [((40,), "float32", True)] + [((40,), "int64", True)] * 3))
        for axis, n in ((0, 6), (1, 3)):
            cases.append(("unique", {"axis": axis, "sorted": sort}, [ui],
                          [((6, 3), "int32", True), ((n,), "int64", True), ((n,), "int64", True),
                           ((n,), "int64", True)]))
    boxes = rng.uniform(0, 10, size=(2, 20, 4)).astype(np.float32)
    scores = ties(2, 3, 20) / 3
    for center in (0, 1):
        for has_score in (0, 1):
            cases.append(("non_max_suppression", {"center_point_box": center, "has_score_threshold": has_score},
                          [boxes, scores, np.array([4], np.int64), np.array([0.3], np.float32),
                           np.array([0.2], np.float32)], [((120, 3), "int64", True)]))
    t = ties(4, 10)
    ti = rng.integers(-5, 5, size=(4, 10)).astype(np.int32)
    for axis, largest in ((1, 1), (1, 0), (0, 1), (-1, 0)):
        shape = list(t.shape)
        cases.append(("topk", {"axis": axis, "largest": largest}, [t, np.array([3], np.int64)],
                      [(tuple(shape), "float32", True), (tuple(shape), "int64", True)]))
        cases.append(("topk", {"axis": axis, "largest": largest}, [ti, np.array([2], np.int64)],
                      [(tuple(shape), "int32", True), (tuple(shape), "int64", True)]))
    cases.append(("det", {}, [rng.standard_normal((3, 4, 4)).astype(np.float32)], [((3,), "float32", False)]))
    cases.append(("det", {}, [rng.standard_normal((5, 5))], [((), "float64", False)]))
    enc = rng.standard_normal((1, 30, 4)).astype(np.float32)
    cls = rng.uniform(0, 1, size=(1, 30, 4)).astype(np.float32)
    anchors = np.concatenate([rng.uniform(0.2, 0.8, size=(30, 2)), rng.uniform(0.1, 0.3, size=(30, 2))],
                             axis=1).astype(np.float32)
    for regular in (0, 1):
        attrs = {"max_detections": 5, "max_classes_per_detection": 2, "num_classes": 3, "nms_score_threshold": 0.3,
                 "nms_iou_threshold": 0.4, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0,
                 "use_regular_nms": regular, "detections_per_class": 4}
        cases.append(("detection_postprocess", attrs, [enc, cls, anchors],
                      [((1, 10, 4), "float32", False), ((1, 10), "float32", False), ((1, 10), "float32", False),
                       ((1,), "float32", False)]))
    nb = rng.uniform(0, 10, size=(25, 4)).astype(np.float32)
    ns = ties(25) / 3
    for sigma in (0.0, 0.5):
        cases.append(("nms_padded", {"max_output_size": 8, "soft_nms_sigma": sigma},
                      [nb, ns, np.array(0.4, np.float32), np.array(0.1, np.float32)],
                      [((8,), "int32", False), ((8,), "float32", False), ((), "int32", False)]))
    return cases + _dynamic_cases(rng, ties, x, h, bf)


def _dynamic_cases(rng, ties, x, h, bf) -> List[Tuple[str, Dict[str, Any], List[np.ndarray], list]]:
    """The ops on data-dependent values (tether_rpc/dynamic_ops.py), each output bound by its Python result's shape;
    floats with ties, NaN and -0.0, integers that wrap, bfloat16 as its bit patterns."""
    from tether_rpc.dynamic_ops import BINARY, OPS, UNARY

    cases = []

    def case(op: str, attrs: Dict[str, Any], inputs: List[np.ndarray], dtype: str = "") -> None:
        r = OPS[op](attrs, *inputs)[0]
        cases.append((op, attrs, inputs, [(tuple(r.shape), dtype or name_of(r.dtype), True)]))

    plain = ties(3, 4, 5) - 1                   # no NaN: casts of NaN to integers differ between platforms
    big = rng.integers(-300, 300, size=(4, 6)).astype(np.int32)
    i64 = rng.integers(-(1 << 40), 1 << 40, size=(4, 6))
    for src, to in ((x, "float16"), (x, "bfloat16"), (x, "bool"), (plain, "int64"), (plain, "uint8"),
                    (bf, "float32"), (h, "float64"), (big, "int8"), (i64, "float32"), (big > 0, "float32"),
                    (x, "float32")):
        case("dyn_cast", {"from": name_of(src.dtype), "to": to}, [src])
    case("dyn_transpose", {"perm": [2, 0, 1]}, [x])
    case("dyn_transpose", {"perm": [1, 0]}, [bf], "bfloat16")
    case("dyn_reshape", {"mode": "reshape", "shape": [0, -1]}, [x])
    case("dyn_reshape", {"mode": "flatten", "axis": 2}, [x])
    case("dyn_reshape", {"mode": "squeeze", "axes": [1]}, [x[:, :1]])
    case("dyn_reshape", {"mode": "unsqueeze", "axes": [0, 3]}, [i64])
    case("dyn_slice", {"starts": [1, -1], "ends": [3, -1000], "axes": [0, 2], "steps": [1, -2]}, [x])
    case("dyn_slice", {"starts": [-9, 5], "ends": [2, 0], "axes": [1, 0], "steps": [3, -1]}, [h])
    case("dyn_slice", {"starts": [4], "ends": [9], "axes": [1], "steps": [1]}, [x])
    case("dyn_concat", {"axis": 1}, [x, ties(3, 2, 5)])
    case("dyn_concat", {"axis": 0}, [i64, i64[:1]])
    case("dyn_shape", {"start": 1, "end": 3}, [x])
    case("dyn_shape", {"size": 1}, [bf])
    case("dyn_gather", {"axis": 1}, [x, np.array([[-1, 0], [2, 1]], np.int64)])
    case("dyn_gather", {"axis": 0}, [bf, np.array([4, -5, 0], np.int32)], "bfloat16")
    case("dyn_gather_nd", {}, [x, np.array([[0, -1], [2, 3], [-3, 0]], np.int64)])
    case("dyn_gather_nd", {}, [big, np.array([[1, 2], [-1, -6]], np.int64)])
    case("dyn_where", {}, [rng.standard_normal((4, 1)) > 0, h[:1, :5], h[1:5, 5:]])
    case("dyn_where", {}, [rng.standard_normal(6) > 0, i64, np.array(7, np.int64)])
    f = ties(4, 5) - 1.5
    f[0, :3] = [np.nan, -0.0, 0.0]
    g = ties(4, 1) - 1
    for op in BINARY:
        if op in ("and", "or", "xor"):
            case("dyn_binary", {"op": op, "dtype": "bool"}, [rng.standard_normal((3, 4)) > 0,
                                                             rng.standard_normal(4) > 0])
            continue
        case("dyn_binary", {"op": op, "dtype": "float32"}, [f, g])
        divisor = np.where(big[:1] == 0, 7, big[:1]).astype(np.int32)
        case("dyn_binary", {"op": op, "dtype": "int32"}, [big * 1000, divisor])
        case("dyn_binary", {"op": op, "dtype": "int64"}, [i64, np.array([3, -3, 5, -7, 1 << 20, -1], np.int64)])
    case("dyn_binary", {"op": "add", "dtype": "float16"}, [h, h[::-1]])
    case("dyn_binary", {"op": "mul", "dtype": "bfloat16"}, [bf, bf[:, ::-1]], "bfloat16")
    case("dyn_binary", {"op": "div", "dtype": "float64"}, [f.astype(np.float64), g.astype(np.float64) + 0.3])
    case("dyn_binary", {"op": "sub", "dtype": "uint8"}, [big.astype(np.uint8), np.array(200, np.uint8)])
    for op in UNARY:
        if op == "not":
            case("dyn_unary", {"op": op, "dtype": "bool"}, [rng.standard_normal((2, 3)) > 0])
            continue
        case("dyn_unary", {"op": op, "dtype": "float32"}, [f * 3.7])
        if op in ("neg", "abs", "relu"):
            case("dyn_unary", {"op": op, "dtype": "int32"}, [big])
            case("dyn_unary", {"op": op, "dtype": "int8"}, [np.array([-128, -1, 0, 5, 127], np.int8)])
    case("dyn_unary", {"op": "exp", "dtype": "float16"}, [h])
    case("dyn_unary", {"op": "sigmoid", "dtype": "bfloat16"}, [bf], "bfloat16")
    for op in ("sum", "mean", "max", "min"):
        for axes, keep in (([0, 2], 0), ([1], 1), (None, 0)):
            case("dyn_reduce", {"op": op, "axes": axes, "keepdims": keep, "dtype": "float32"},
                 [ties(3, 4, 5) * 1.1])
    case("dyn_reduce", {"op": "max", "axes": [1], "keepdims": 0, "dtype": "float32"}, [f])
    case("dyn_reduce", {"op": "sum", "axes": [0], "keepdims": 1, "dtype": "int32"}, [big * 10000000])
    case("dyn_reduce", {"op": "sum", "axes": [1], "keepdims": 0, "dtype": "float16"}, [h])
    case("dyn_reduce", {"op": "min", "axes": None, "keepdims": 1, "dtype": "int64"}, [i64])
    return cases


def test_numpy_nodes_match_python(tmp_path):
    """Every numpy op of tether_rpc.numpy_ops, as one-node graphs run by the Python executor and by
    tools/run_model.js on the same random inputs (ties, NaN, -0.0 included): the same outputs, bit for bit
    (det: LU in another order, and soft-NMS scores through a float32 exp: within an ulp or so)."""
    ran = set()
    for seed in (3, 4):
        for k, (op, attrs, inputs, outputs) in enumerate(_numpy_cases(seed)):
            graph = _numpy_graph(op, attrs, inputs, outputs)
            folder = tmp_path / ("g%d_%d" % (seed, k))
            folder.mkdir()
            (folder / "deploy.json").write_text(json.dumps(graph))
            gm = GraphExecutor(graph, None)
            feeds = {"in%d" % j: a for j, a in enumerate(inputs)}
            gm.set_input(**feeds)
            gm.run()
            expected = [gm.get_output(j) for j in range(gm.num_outputs)]
            (folder / "in.params").write_bytes(save_params(feeds))
            proc = _run(str(JS / "tools" / "run_model.js"), str(folder), str(folder / "in.params"),
                        str(folder / "out.params"))
            assert proc.returncode == 0, (op, attrs, proc.stderr)
            got = load_params(str(folder / "out.params"))
            for j, want in enumerate(expected):
                have = got[str(j)]
                what = (op, attrs, seed, j)
                assert have.shape == want.shape and name_of(have.dtype) == name_of(want.dtype), (what, have, want)
                if op == "det":
                    np.testing.assert_allclose(have, want, rtol=1e-5 if want.dtype == np.float32 else 1e-10)
                elif op == "nms_padded" and attrs["soft_nms_sigma"] and j == 1:
                    # soft-NMS decays scores by a float32 exp: numpy's SIMD expf is not correctly rounded (and
                    # differs between CPUs), JS rounds the double exp once, so scores may be one ulp apart
                    np.testing.assert_allclose(have, want, rtol=2 ** -22, atol=0)
                else:
                    np.testing.assert_array_equal(storage_of(have), storage_of(want), err_msg=str(what))
            ran.add(op)
    from tether_rpc.numpy_ops import OPS
    assert ran == set(OPS)


def test_numpy_node_errors_are_python_messages(tmp_path):
    graph = _numpy_graph("topk", {"axis": 0}, [np.zeros(4, np.float32), np.array([9], np.int64)],
                         [((4,), "float32", True), ((4,), "int64", True)])
    (tmp_path / "deploy.json").write_text(json.dumps(graph))
    (tmp_path / "in.params").write_bytes(save_params({"in0": np.zeros(4, np.float32), "in1": np.array([9])}))
    proc = _run(str(JS / "tools" / "run_model.js"), str(tmp_path), str(tmp_path / "in.params"),
                str(tmp_path / "out.params"))
    assert proc.returncode == 1 and proc.stderr.strip() == "TopK k=9 for an axis of 4", proc.stderr
    graph["nodes"][0]["numpy"] = "eval"
    (tmp_path / "deploy.json").write_text(json.dumps(graph))
    with pytest.raises(ValueError) as info:
        GraphExecutor(graph, None)
    proc = _run(str(JS / "tools" / "run_model.js"), str(tmp_path), str(tmp_path / "in.params"),
                str(tmp_path / "out.params"))
    assert proc.returncode == 2 and proc.stderr.strip() == str(info.value), proc.stderr


# ------------------------------------------------------------------------------------------ graph: a model
def test_model_folder_matches_python_executor(tmp_path):
    """The digits CNN built for wasm32, run by tools/run_model.js, against the host build run by tether_rpc."""
    import onnx
    import tether
    from tether.frontend import from_onnx
    graph, params = from_onnx(onnx.load(str(ROOT / "tests" / "data" / "digits_cnn.onnx")),
                              shape={"input": (8, 1, 8, 8)})
    tether.build_graph(graph, params, target="wasm32", opt_level=3).export(str(tmp_path / "wasm"))
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(tmp_path / "host"))
    gm = GraphExecutor.from_folder(str(tmp_path / "host"))
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal((8, 1, 8, 8)).astype(np.float32)
        gm.set_input("input", x)
        gm.run()
        (tmp_path / "in.params").write_bytes(save_params({"input": x}))
        proc = _run(str(JS / "tools" / "run_model.js"), str(tmp_path / "wasm"), str(tmp_path / "in.params"),
                    str(tmp_path / "out.params"), "--repeat", "3")
        assert proc.returncode == 0, proc.stderr
        timing = json.loads(proc.stdout)
        assert len(timing["samples"]) == 3 and timing["skipped"] == []
        np.testing.assert_allclose(load_params(str(tmp_path / "out.params"))["0"], gm.get_output(0),
                                   rtol=1e-5, atol=1e-5)
    (tmp_path / "in.params").write_bytes(save_params({"image": x}))
    proc = _run(str(JS / "tools" / "run_model.js"), str(tmp_path / "wasm"), str(tmp_path / "in.params"),
                str(tmp_path / "out.params"))
    assert proc.returncode == 2 and proc.stderr.strip() == "the model has no input 'image' (inputs: input)"


def test_data_dependent_chain_matches_python_executor(tmp_path):
    """Boolean indexing and its post-processing (numpy nodes feeding numpy nodes, data-dependent entries between
    them) after a wasm32 kernel, run by tools/run_model.js, against the host build run by tether_rpc: the same
    shapes and bits at 5, 0 and all 12 selected."""
    import tether
    from fixtures.onnx_struct_compare import make_graph_model
    from onnx import TensorProto, helper
    from tether.frontend import from_onnx

    nodes = [helper.make_node("Greater", ["scores", "t"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]), helper.make_node("GatherND", ["boxes", "idx"], ["b"]),
             helper.make_node("Mul", ["b", "scale"], ["bs"]), helper.make_node("ReduceSum", ["bs", "one"], ["area"],
                                                                             keepdims=0),
             helper.make_node("Greater", ["area", "t"], ["big"]),
             helper.make_node("Squeeze", ["idx", "one"], ["i"]),
             helper.make_node("Where", ["big", "i", "minus"], ["y"]),
             helper.make_node("Cast", ["area"], ["ah"], to=TensorProto.FLOAT16)]
    rng = np.random.default_rng(5)
    boxes = rng.uniform(-1, 1, (12, 4)).astype(np.float32)
    inits = {"t": np.array(0.5, np.float32), "scale": np.array([1.5, -2, 0.25, 3], np.float32),
             "one": np.array([1], np.int64), "minus": np.array(-1, np.int64)}
    model = make_graph_model(nodes, {"boxes": boxes, "scores": np.zeros(12, np.float32)}, ["bs", "y", "ah"], inits,
                             opset=13)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="wasm32").export(str(tmp_path / "wasm"))
    tether.build_graph(graph, params, target="host").export(str(tmp_path / "host"))
    gm = GraphExecutor.from_folder(str(tmp_path / "host"))
    for above in (5, 0, 12):
        scores = rng.uniform(0, 0.4, 12).astype(np.float32)
        scores[rng.permutation(12)[:above]] = 0.9
        feeds = {"boxes": boxes, "scores": scores}
        gm.set_input(**feeds)
        gm.run()
        (tmp_path / "in.params").write_bytes(save_params(feeds))
        proc = _run(str(JS / "tools" / "run_model.js"), str(tmp_path / "wasm"), str(tmp_path / "in.params"),
                    str(tmp_path / "out.params"))
        assert proc.returncode == 0, proc.stderr
        got = load_params(str(tmp_path / "out.params"))
        for j in range(3):
            want = gm.get_output(j)
            assert want.shape[0] == above
            np.testing.assert_array_equal(storage_of(got[str(j)]), storage_of(want), err_msg=str((above, j)))
            assert got[str(j)].shape == want.shape


# ------------------------------------------------------------------------------------------------ a browser
_PAGE = """<!doctype html><html><body><script type="module">
import { loadModule, fromTypedArray, empty, loadParams, saveParams, loadGraph } from "/js/src/index.js";
const bytes = async (path) => new Uint8Array(await (await fetch(path)).arrayBuffer());
let result;
try {
  const m = await loadModule(await bytes("/data/vadd.wasm"), { name: "vadd.wasm" });
  const a = fromTypedArray(Float32Array.from({ length: 1024 }, (_, i) => i / 4));
  const c = empty([1024]);
  m.getFunction("vadd")(a, a, c);
  let error = "";
  try { m.getFunction("vadd")(a, empty([7]), c); } catch (e) { error = e.message; }
  const gm = await loadGraph(await (await fetch("/data/model/deploy.json")).text(),
                             await bytes("/data/model/deploy.wasm"), await bytes("/data/model/deploy.params"));
  for (const [name, x] of loadParams(await bytes("/data/in.params"))) gm.setInput(name, x);
  gm.run();
  const out = saveParams(new Map([["0", gm.getOutput(0)], ["vadd", c]]));
  result = { ok: true, error, home: a.home, out: btoa(String.fromCharCode(...out)) };
} catch (e) {
  result = { ok: false, error: String(e && e.stack || e) };
}
await fetch("/result", { method: "POST", body: JSON.stringify(result) });
</script></body></html>"""


def _chromium() -> str:
    import shutil
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        require_tool("chromium", "apt-get install chromium")
    return path


def test_runtime_in_headless_chromium(tmp_path):
    """src/ as ES modules served over loopback HTTP to a real browser: a compiled kernel and the digits model
    through loadGraph, outputs compared with the Python executor's."""
    import base64
    import http.server
    import threading

    import onnx
    import tether
    from tether.frontend import from_onnx
    exe = _chromium()
    data = tmp_path / "data"
    data.mkdir()
    _build("wasm32", data / "vadd.wasm")
    graph, params = from_onnx(onnx.load(str(ROOT / "tests" / "data" / "digits_cnn.onnx")),
                              shape={"input": (8, 1, 8, 8)})
    tether.build_graph(graph, params, target="wasm32", opt_level=3).export(str(data / "model"))
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(tmp_path / "host"))
    x = np.random.default_rng(5).standard_normal((8, 1, 8, 8)).astype(np.float32)
    (data / "in.params").write_bytes(save_params({"input": x}))
    roots = {"/js/": JS, "/data/": data}
    posted: Dict[str, Any] = {}
    done = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = dict(http.server.SimpleHTTPRequestHandler.extensions_map,
                              **{".js": "text/javascript", ".wasm": "application/wasm"})

        def translate_path(self, path: str) -> str:
            for prefix, root in roots.items():
                if path.startswith(prefix):
                    target = (root / path[len(prefix):].split("?")[0]).resolve()
                    if root.resolve() in target.parents:
                        return str(target)
            return str(tmp_path / "missing")

        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            if self.path == "/":
                body = _PAGE.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def do_POST(self) -> None:  # noqa: N802
            n = min(int(self.headers.get("Content-Length", 0)), 1 << 24)
            posted.update(json.loads(self.rfile.read(n)))
            self.send_response(204)
            self.end_headers()
            done.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    browser = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                                "--user-data-dir=%s" % (tmp_path / "profile"),
                                "http://127.0.0.1:%d/" % server.server_address[1]],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        finished = done.wait(timeout=180)
    finally:
        browser.terminate()
        try:
            browser.wait(timeout=30)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait(timeout=30)
        server.shutdown()
        server.server_close()
    assert finished, "the page posted no result: %s" % browser.stderr.read().decode(errors="replace")[-3000:]
    assert posted["ok"], posted["error"]
    assert posted["error"] == "vadd: argument 1 'B' has shape (7,), expected (1024,) (dimension 0 differs)"
    assert posted["home"] == "vadd.wasm"
    out = load_params(base64.b64decode(posted["out"]))
    a = np.arange(1024, dtype=np.float32) / 4
    assert np.array_equal(out["vadd"], a + a)
    gm = GraphExecutor.from_folder(str(tmp_path / "host"))
    gm.set_input("input", x)
    gm.run()
    np.testing.assert_allclose(out["0"], gm.get_output(0), rtol=1e-5, atol=1e-5)


def test_when_guards_run_only_the_taken_branch(tmp_path):
    """Models whose If condition is a run-time input, built for wasm32 and run by tools/run_model.js on inputs that
    take each branch: the outputs of the host build in tether_rpc, and exactly the nodes its profile skips."""
    import tether
    from onnx import TensorProto
    from tether.frontend import from_onnx
    from test_onnx_control_flow import X, if_model, vad_model, vi

    nested = if_model([], nested=True)
    nested.graph.input.append(vi("c", (), TensorProto.BOOL))
    vad, vad_feeds = vad_model(seed=4)
    runs_of = {"nested_if": [{"x": X, "c": np.array(v)} for v in (True, False)],
               "vad": [dict(vad_feeds, audio=vad_feeds["audio"] * g) for g in (2.0, 0.3)]}
    for name, model in (("nested_if", nested), ("vad", vad)):
        graph, params = from_onnx(model)
        tether.build_graph(graph, params, target="wasm32").export(str(tmp_path / name / "wasm"))
        tether.build_graph(graph, params, target="host").export(str(tmp_path / name / "host"))
        gm = GraphExecutor.from_folder(str(tmp_path / name / "host"))
        skipped_sets = []
        for feeds in runs_of[name]:
            gm.set_input(**feeds)
            skipped = [n["name"] for n in gm.profile(number=1)["nodes"] if n.get("skipped")]
            (tmp_path / "in.params").write_bytes(save_params(feeds))
            proc = _run(str(JS / "tools" / "run_model.js"), str(tmp_path / name / "wasm"), str(tmp_path / "in.params"),
                        str(tmp_path / "out.params"), "--repeat", "1")
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["skipped"] == skipped, name
            got = load_params(str(tmp_path / "out.params"))
            for j in range(gm.num_outputs):
                np.testing.assert_allclose(got[str(j)], gm.get_output(j), rtol=1e-5, atol=1e-6)
            skipped_sets.append(frozenset(skipped))
        assert any(skipped_sets) and skipped_sets[0] != skipped_sets[1], (name, skipped_sets)


def test_relaxed_simd_module_needs_an_engine_with_it(tmp_path):
    """A module built with +relaxed-simd lists it in "requires": node without relaxed SIMD refuses it at load,
    naming the feature; node with it (22, or the flag) runs it."""
    wasm = _build("wasm32-unknown-unknown -mattr=+simd128,+relaxed-simd", tmp_path / "vadd.wasm")
    a = np.arange(1024, dtype=np.float32)
    probe = _js('import { hasRelaxedSimd } from "SRC/runtime.js"; console.log(hasRelaxedSimd());')
    proc, out = _run_kernel(wasm, "vadd", [a, a, np.zeros_like(a)], tmp_path)
    if probe.stdout.strip() == "true":
        assert proc.returncode == 0 and np.array_equal(out["2"], a + a), proc.stderr
        return
    assert proc.returncode == 2 and "needs relaxed-simd, which this WebAssembly engine lacks" in proc.stderr
    (tmp_path / "args.params").write_bytes(save_params({"0": a, "1": a, "2": np.zeros_like(a)}))
    flagged = _run("--experimental-wasm-relaxed-simd", str(JS / "tools" / "run_kernel.js"), str(wasm), "vadd",
                   str(tmp_path / "args.params"), str(tmp_path / "out.params"))
    assert flagged.returncode == 0, flagged.stderr
    assert np.array_equal(load_params(str(tmp_path / "out.params"))["2"], a + a)
