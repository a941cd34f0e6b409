"""bfloat16 tensors end to end: a dtype of the one table (DLPack kDLBfloat, 16 bits), held by device
arrays as tagged uint16 bit patterns, carried by the protocol and the params file, taken by kernels, and used by
ONNX graphs as inputs, outputs, weights and Cast targets. Casts round as onnxruntime's do (to nearest even; a
float64 first to float32); nodes reading bfloat16 compute in float32 between casts (frontend/onnx/half.py).

onnxruntime's Python API cannot feed or fetch bfloat16 arrays, so each reference runs the same model wrapped in
float32 Casts at its bfloat16 inputs and outputs (exact both ways), on onnxruntime's own bfloat16 Cast kernels.
"""
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import tether
from tether import graph_executor, rpc, te
from tether.frontend import from_onnx
from tether.testing import ort_bfloat16
from tether_rpc import dtypes, ndarray, params, protocol as p
from tether_rpc.errors import KernelError

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(11)


def _float32_specials() -> np.ndarray:
    """float32 values at and a hair off every kind of bfloat16 rounding: ties (to even both ways), carries into
    the exponent, overflow to inf, subnormals, NaNs with payloads, signed zeros, random bit patterns."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                     0x00008000, 0x00018000, 0x807FFFFF, 0x7FC00001, 0xFFA00000, 0x7F800000, 0x80000000, 0],
                    np.uint32)
    rand = RNG.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits, rand]).view(np.float32)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit, except that a NaN may be any NaN."""
    g = np.asarray(got).view(np.uint16)
    w = np.asarray(want).view(np.uint16)
    nan = np.isnan(dtypes.bfloat16_to_float32(w))
    np.testing.assert_array_equal(np.where(nan, 0, g), np.where(nan, 0, w))
    assert np.isnan(dtypes.bfloat16_to_float32(g)[nan]).all()


# ---------------------------------------------------------------- the dtype table and device arrays
def test_bfloat16_is_one_row_of_every_dtype_set():
    row = dtypes.DTYPES["bfloat16"]
    assert (row.dl_code, row.bits, row.storage) == (4, 16, "uint16")
    assert "bfloat16" in dtypes.WIRE_DTYPES and "bfloat16" in dtypes.ARRAY_DTYPES and "bfloat16" in dtypes.PARAMS_DTYPES
    assert dtypes.name_of(dtypes.numpy_dtype("bfloat16")) == "bfloat16"
    assert dtypes.name_of(BF16) == "bfloat16" and dtypes.name_of(np.uint16) == "uint16"


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
def test_device_side_rounding_is_ml_dtypes_nearest_even():
    x = _float32_specials()
    _same_bits(dtypes.bfloat16_bits(x), x.astype(BF16))
    back = dtypes.bfloat16_to_float32(x.astype(BF16))
    np.testing.assert_array_equal(back, x.astype(BF16).astype(np.float32))


def test_device_array_holds_bfloat16_as_tagged_bits():
    x = RNG.standard_normal((3, 5)).astype(BF16)
    a = ndarray.from_numpy(x)
    assert a.dtype == "bfloat16" and a.nbytes == 30 and a.dltensor.dtype.code == 4 and a.dltensor.dtype.bits == 16
    out = a.numpy()
    assert dtypes.name_of(out.dtype) == "bfloat16"
    np.testing.assert_array_equal(out.view(np.uint16), x.view(np.uint16))
    b = ndarray.empty((3, 5), "bfloat16")
    b.copyfrom(x.view(np.uint16))                  # a uint16 view is taken as bit patterns
    np.testing.assert_array_equal(b.numpy().view(np.uint16), x.view(np.uint16))
    with pytest.raises(KernelError, match="dtype float32 does not match"):
        b.copyfrom(x.astype(np.float32))
    with pytest.raises(KernelError, match="dtype bfloat16 does not match"):
        ndarray.empty((3, 5), "uint16").copyfrom(out)


def test_protocol_and_params_carry_bfloat16_bits():
    x = np.array([[1.0, -2.5, np.inf], [3.140625, -0.0, 1e30]], BF16)
    buf = p.FrameBuffer()
    buf.feed(p.encode_frame(p.MsgType.RETURN, 1, {"ml": x, "tagged": dtypes.storage_of(x)}))
    payload = buf.next_frame()[2]
    for got in payload.values():   # this process has ml_dtypes loaded: the host's bfloat16
        assert got.dtype == BF16 and got.shape == x.shape
        np.testing.assert_array_equal(got.view(np.uint16), x.view(np.uint16))
    raw = p.encode_tensor(x).data
    assert raw[:9] == b"\x08bfloat16" and raw[-12:] == x.view(np.uint16).astype("<u2").tobytes()
    loaded = params.load_params(params.save_params({"w": x}))["w"]
    assert dtypes.name_of(loaded.dtype) == "bfloat16"
    np.testing.assert_array_equal(loaded.view(np.uint16), x.view(np.uint16))


# ---------------------------------------------------------------- kernels taking bfloat16 arguments
def _scale_kernel(n: int, target: str):
    """B[i] = bfloat16(A[i] * 3) for bfloat16 A and B, computed in float32."""
    a = te.placeholder((n,), name="A", dtype="bfloat16")
    b = te.compute((n,), lambda i: (a[i].astype("float32") * 3.0).astype("bfloat16"), name="B")
    s = te.create_schedule(b.op)
    return tether.build(s, [a, b], target=target, name="scale3")


def _scale_reference(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32) * np.float32(3)).astype(BF16)


def test_kernel_takes_bfloat16_arrays_and_refuses_other_dtypes(tmp_path):
    x = RNG.standard_normal(64).astype(BF16)
    lib = _scale_kernel(64, "host")
    path = tmp_path / "scale3.so"
    lib.export_library(str(path))
    f = tether.runtime.load_module(str(path))["scale3"]
    out = np.zeros(64, BF16)
    f(x, out)                                      # ml_dtypes arrays straight in
    _same_bits(out, _scale_reference(x))
    dev_out = ndarray.empty(64, "bfloat16")
    f(ndarray.from_numpy(x), dev_out)              # device arrays
    _same_bits(dev_out.numpy().view(BF16), _scale_reference(x))
    with pytest.raises(KernelError):
        f(x.view(np.uint16), out)                  # a plain uint16 array is not a bfloat16 argument


def test_kernel_over_rpc_with_bfloat16_tensors(rpc_server, tmp_path):
    x = RNG.standard_normal(64).astype(BF16)
    lib = _scale_kernel(64, "host")
    path = tmp_path / "scale3.so"
    lib.export_library(str(path))
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=30) as sess:
        sess.upload(str(path))
        f = sess.load_module("scale3.so")["scale3"]
        out = np.zeros(64, BF16)
        f(x, out)                                  # tensors inside the CALL, results back in place
        _same_bits(out, _scale_reference(x))
        a, b = sess.array(x), sess.empty(64, "bfloat16")
        assert a.dtype == b.dtype == "bfloat16"
        f(a, b)
        got = b.numpy()
        assert got.dtype == BF16
        _same_bits(got, _scale_reference(x))


# ---------------------------------------------------------------- ONNX graphs in bfloat16
def _ort_bf16(model: onnx.ModelProto, feeds: dict) -> list:
    return ort_bfloat16.Session(model).run(None, feeds)


def _movement_model():
    """bfloat16 in, weights and out: Transpose, Concat with a bfloat16 initializer, Gather, Slice, Reshape (the
    moves onnxruntime's CPU provider runs on bfloat16), plus a Cast out to float32 and float16 and from float64."""
    w = RNG.standard_normal((2, 4)).astype(BF16)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([2, 0, 1], np.int64), "idx"),
             numpy_helper.from_array(np.array([1], np.int64), "s0"),
             numpy_helper.from_array(np.array([4], np.int64), "s1"),
             numpy_helper.from_array(np.array([1], np.int64), "ax"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Concat", ["t", "w"], ["c"], axis=0),
             helper.make_node("Gather", ["c", "idx"], ["g"], axis=0),
             helper.make_node("Slice", ["g", "s0", "s1", "ax"], ["sl"]),
             helper.make_node("Reshape", ["sl", "flat"], ["y"]),
             helper.make_node("Cast", ["c"], ["c32"], to=T.FLOAT),
             helper.make_node("Cast", ["c"], ["c16"], to=T.FLOAT16),
             helper.make_node("Cast", ["d"], ["dbf"], to=T.BFLOAT16),
             helper.make_node("Identity", ["w"], ["wout"])]     # a bfloat16 weight as it is: a bfloat16 param
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", T.BFLOAT16, [4, 4]),
                                              helper.make_tensor_value_info("d", T.DOUBLE, [64])],
                              [helper.make_tensor_value_info("y", T.BFLOAT16, [9]),
                               helper.make_tensor_value_info("c32", T.FLOAT, [6, 4]),
                               helper.make_tensor_value_info("c16", T.FLOAT16, [6, 4]),
                               helper.make_tensor_value_info("dbf", T.BFLOAT16, [64]),
                               helper.make_tensor_value_info("wout", T.BFLOAT16, [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    # float64 values a hair off bfloat16 ties: onnxruntime rounds them to float32 first (onto the tie), then even
    ties = (np.arange(1, 33, dtype=np.float64) * 2 + 1) * 2.0 ** -8 + 1.0
    d = np.concatenate([ties + 1e-12, ties - 1e-12])
    return model, {"x": RNG.standard_normal((4, 4)).astype(BF16), "d": d}


def _compare(got: list, ref: list) -> None:
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        if g.dtype == BF16:
            _same_bits(g, r)
        else:
            np.testing.assert_array_equal(g, r)


def _build(model, target, folder):
    graph, params_ = from_onnx(model)
    assert graph.types["x"].dtype == "bfloat16" and graph.types["y"].dtype == "bfloat16"
    tether.build_graph(graph, params_, target=target).export(str(folder))


def test_bfloat16_graph_matches_onnxruntime_on_host(tmp_path):
    model, feeds = _movement_model()
    _build(model, "host", tmp_path)
    gm = graph_executor.load(str(tmp_path))
    gm.set_input("x", feeds["x"])
    gm.set_input("d", feeds["d"])
    gm.run()
    got = [gm.get_output(i) for i in range(gm.get_num_outputs())]
    _compare(got, _ort_bf16(model, feeds))
    # float32 values into a bfloat16 input are rounded to nearest even; uint16 views are bit patterns
    x32 = RNG.standard_normal((4, 4)).astype(np.float32)
    gm.set_input("x", x32)
    gm.run()
    ref = _ort_bf16(model, dict(feeds, x=x32.astype(BF16)))
    _compare([gm.get_output(0)], ref[:1])
    gm.set_input("x", feeds["x"].view(np.uint16))
    gm.run()
    _compare([gm.get_output(0)], _ort_bf16(model, feeds)[:1])


def test_bfloat16_compute_nodes_run_in_float32_and_round_once(tmp_path):
    """Add/MatMul/Relu on bfloat16 (onnxruntime's CPU provider has no bfloat16 kernels for them): float32 inside,
    one rounding where the model stores bfloat16, against numpy doing the same."""
    a = RNG.standard_normal((3, 8)).astype(BF16)
    w = RNG.standard_normal((8, 5)).astype(BF16)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("a", T.BFLOAT16, [3, 8])],
                              [helper.make_tensor_value_info("y", T.BFLOAT16, [3, 5])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    g, prm = from_onnx(model)
    tether.build_graph(g, prm, target="host").export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.run(a=a)
    got = gm.get_output(0)
    want = np.maximum(a.astype(np.float32) @ w.astype(np.float32), 0).astype(BF16)
    assert got.dtype == BF16
    # float32 accumulation in another order may land one bfloat16 step away
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2 ** -7, atol=1e-6)
    assert not np.array_equal(got, np.zeros_like(got))


@pytest.mark.emulated
def test_bfloat16_graph_on_emulated_aarch64(emulated_devices, tmp_path):
    from tether.rpc.graph_client import RemoteGraphExecutor

    model, feeds = _movement_model()
    _build(model, "rasp4b", tmp_path)
    device = emulated_devices.for_preset("rasp4b")
    with rpc.connect(*device.address, timeout=300) as sess:
        with RemoteGraphExecutor(sess, str(tmp_path)) as gm:
            gm.run(**feeds)
            got = [gm.get_output(i) for i in range(5)]
    _compare(got, _ort_bf16(model, feeds))


def test_go_graph_executor_runs_the_bfloat16_graph_bit_for_bit(tmp_path):
    """bindings/go reads bfloat16 entries, params and tensors (dtype.go, graph/params.go): the same outputs as the
    Python executor, bit for bit."""
    from fixtures.golang import GoCases, run_go_test

    model, feeds = _movement_model()
    folder = tmp_path / "bf16"
    _build(model, "host", folder)
    gm = graph_executor.load(str(folder))
    cases = GoCases(tmp_path / "cases")
    runs = []
    for x in (feeds["x"], RNG.standard_normal((4, 4)).astype(BF16)):
        gm.run(x=x, d=feeds["d"])
        outs = [gm.get_output(i) for i in range(gm.get_num_outputs())]
        assert outs[0].dtype == BF16
        runs.append({"inputs": {"x": cases.tensor(x), "d": cases.tensor(feeds["d"])},
                     "outputs": [cases.tensor(o) for o in outs]})
    cases.write(models=[{"name": "bfloat16", "folder": str(folder), "runs": runs}])
    out = run_go_test(["./graph"], tmp_path / "cases", run="^TestModelsMatchPython$")
    assert "--- PASS: TestModelsMatchPython" in out, out
