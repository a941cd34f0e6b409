"""uint16/uint32/uint64 kernels: division, remainder, comparison, min/max, right shift, widening and
float conversions are unsigned (udiv/urem/icmp u*/lshr/zext/uitofp/fptoui), checked against numpy with values at
and above 2^(bits-1), where a signed instruction would give another answer; on the host and on emulated aarch64
and armv7 (where 64-bit division and conversions are the module's own __aeabi_* helpers). Then ONNX models on
the wide unsigned types against onnx's reference implementation (onnxruntime lacks most of their kernels)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import tether
from tether import runtime, te

N = 512
UNSIGNED = ("uint16", "uint32", "uint64")
_ONNX = {"uint16": TensorProto.UINT16, "uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64}


def _values(dtype: str, seed: int, nonzero: bool = False) -> np.ndarray:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    hi = rng.integers(int(info.max) // 2 + 1, int(info.max), N // 2, dtype=dtype, endpoint=True)   # top bit set
    lo = rng.integers(1 if nonzero else 0, 1000, N // 2, dtype=dtype)
    v = np.concatenate([hi, lo])
    v[:3] = [info.max, info.max // 2 + 1, 1]
    return rng.permutation(v)


def _kernel(dtype: str):
    """Outputs: a // b, a % b, a > b, max(a, b), a >> s, widened a, a as float64, float back to dtype."""
    a = te.placeholder((N,), name="A", dtype=dtype)
    b = te.placeholder((N,), name="B", dtype=dtype)
    s = te.placeholder((N,), name="S", dtype=dtype)
    f = te.placeholder((N,), name="F", dtype="float64")
    wide = "uint64" if dtype != "uint64" else "float64"
    outs = [te.compute((N,), lambda i: a[i] // b[i], name="Q"),
            te.compute((N,), lambda i: a[i] % b[i], name="R"),
            te.compute((N,), lambda i: (a[i] > b[i]).astype("uint8"), name="G"),
            te.compute((N,), lambda i: te.max(a[i], b[i]), name="M"),
            te.compute((N,), lambda i: te.bitwise("shr", a[i], s[i]), name="H"),
            te.compute((N,), lambda i: a[i].astype(wide), name="W"),
            te.compute((N,), lambda i: a[i].astype("float64"), name="D"),
            te.compute((N,), lambda i: f[i].astype(dtype), name="T")]
    sched = te.create_schedule([o.op for o in outs])
    for o in outs:
        _, xi = sched[o].split(o.op.axis[0], factor=4)
        sched[o].vectorize(xi)
    return sched, [a, b, s, f] + outs


def _case(dtype: str):
    a, b = _values(dtype, 1), _values(dtype, 2, nonzero=True)
    shifts = np.random.default_rng(3).integers(0, np.iinfo(dtype).bits, N).astype(dtype)
    f = _values(dtype, 4).astype(np.float64)
    f = np.minimum(f, np.float64(np.iinfo(dtype).max) if dtype != "uint64" else 2.0 ** 63 * 1.5)
    wide = np.uint64 if dtype != "uint64" else np.float64
    want = [a // b, a % b, (a > b).astype(np.uint8), np.maximum(a, b), a >> shifts, a.astype(wide),
            a.astype(np.float64), np.trunc(f).astype(dtype)]
    return [a, b, shifts, f], want


def _build(dtype, target, tmp_path):
    s, args = _kernel(dtype)
    name = "unsigned_" + dtype
    lib = tether.build(s, args, target=target, name=name)
    path = tmp_path / ("%s_%s.so" % (name, target))
    lib.export_library(str(path))
    return name, path


def _check(dtype, outs, want, where):
    for k, (got, ref) in enumerate(zip(outs, want)):
        assert got.dtype == ref.dtype, (where, k, got.dtype, ref.dtype)
        np.testing.assert_array_equal(got, ref, err_msg="%s %s output %d" % (where, dtype, k))


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_unsigned_kernels_match_numpy_on_host(dtype, tmp_path):
    name, path = _build(dtype, "host", tmp_path)
    inputs, want = _case(dtype)
    outs = [np.zeros(N, r.dtype) for r in want]
    runtime.load_module(str(path))[name](*inputs, *outs)
    _check(dtype, outs, want, "host")


@pytest.mark.emulated
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7"])
def test_unsigned_kernels_match_numpy_on_emulated_device(emulated_devices, preset, tmp_path):
    from tether import rpc
    device = emulated_devices.for_preset(preset)
    with rpc.connect(*device.address, timeout=120.0) as remote:
        for dtype in UNSIGNED:
            name, path = _build(dtype, preset, tmp_path)
            inputs, want = _case(dtype)
            remote.upload(str(path))
            f = remote.load_module(path.name)[name]
            outs = [remote.empty((N,), str(r.dtype)) for r in want]
            f(*[remote.array(x) for x in inputs], *outs)
            _check(dtype, [o.numpy() for o in outs], want, preset)


# ---------------------------------------------------------------- ONNX models on wide unsigned types
def _onnx_model(dtype: str):
    t = _ONNX[dtype]
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]),
             helper.make_node("Mod", ["a", "b"], ["r"]),
             helper.make_node("Greater", ["a", "b"], ["g"]),
             helper.make_node("Max", ["a", "b"], ["m"]),
             helper.make_node("BitShift", ["a", "s"], ["h"], direction="RIGHT"),
             helper.make_node("Cast", ["a"], ["d"], to=TensorProto.DOUBLE),
             helper.make_node("Cast", ["a"], ["i"], to=TensorProto.INT64)]
    outputs = ["q", "r", "g", "m", "h", "d", "i"]
    ins = [helper.make_tensor_value_info(n, t, [4, N // 4]) for n in ("a", "b", "s")]
    outs = [helper.make_tensor_value_info(n, et, None) for n, et in
            (("q", t), ("r", t), ("g", TensorProto.BOOL), ("m", t), ("h", t), ("d", TensorProto.DOUBLE),
             ("i", TensorProto.INT64)) if n in outputs]
    return helper.make_model(helper.make_graph(nodes, "u", ins, outs), opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_unsigned_onnx_model_matches_onnxruntime(onnx_compare, dtype):
    a, b = _values(dtype, 5).reshape(4, -1), _values(dtype, 6, nonzero=True).reshape(4, -1)
    s = np.random.default_rng(7).integers(0, np.iinfo(dtype).bits, (4, N // 4)).astype(dtype)
    from onnx.reference import ReferenceEvaluator

    model, feeds = _onnx_model(dtype), {"a": a, "b": b, "s": s}
    # onnxruntime's CPU provider lacks Max/ReduceMax/... kernels for these types: onnx's numpy reference judges
    onnx_compare(model, feeds, rtol=0, atol=0, expected=ReferenceEvaluator(model).run(None, feeds))
