"""The kernels and passes behind the CRNN recognizer's latency, each against onnxruntime:
- softmax over the last axis as a direct per-row kernel (kernels/softmax_kernel.py), other axes through te;
- reshapes that keep their input's shape dropped before fusion, so MatMul -> Add is one dense+add kernel
  (graph/passes/identity_reshape.py);
- AVX-512 prepacked dense: 32-wide panels and a 12 x 32 register block (graph/dense_panels.py panel_block);
- conv2d_pixels' pixel block that divides the map's pixels (ops/schedules.py pixel_block);
- a bidirectional recurrent layer's two directions as two parallel tasks (kernels/recurrent_kernel.py),
  at 1 and 2 threads."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor, ops
from tether.frontend import from_onnx
from tether.graph.plan import prepare_graph
from tether.graph.dense_panels import WIDE_BLOCK, WIDE_PANEL, panel_block
from tether.graph.passes import drop_identity_reshapes
from tether.ops.schedules import Family, family_of, pixel_block
from tether.target import as_target
from tether.testing.model_kinds import relative_error
from tether_rpc import parallel


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds, tmp_path, threads=(1,), tol=1e-5):
    """Compile for the host, run at each thread count, compare every output with onnxruntime's; returns the
    factory (kernel count, graph)."""
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host", opt_level=3)
    factory.export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    try:
        for t in threads:
            parallel.set_num_threads(t)
            gm.run(**feeds)
            for i, r in enumerate(ref):
                got = gm.get_output(i)
                assert got.shape == r.shape, (t, i, got.shape, r.shape)
                assert relative_error(got, r) <= tol, (t, i, relative_error(got, r))
    finally:
        parallel.set_num_threads(1)
    return factory


def _funcs(factory):
    return factory.get_lib().function_names


# ---------------------------------------------------------------- softmax
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 16), (4, 63), (4, 64), (5, 65), (80, 6625), (2, 3, 129)])
def test_softmax_last_axis_matches_onnxruntime(shape, tmp_path):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", shape)], ["y"])
    _check(model, {"x": x}, tmp_path, threads=(1, 2), tol=1e-5)


def test_softmax_combines_its_partial_results_as_vectors():
    """A row's U vectors of partial maxima and sums are combined as vectors, then one vector's lanes one by one:
    not all U x lanes slots one by one (on rows of 256, MobileViT's attention, that took longer than the passes)."""
    from tether.graph.ir import Node, TensorType
    from tether.kernels.softmax_kernel import ACC_VECTORS, softmax_kernel
    from tether.ops.schedules import family_of
    from tether.target import Target
    t = TensorType((8, 256), "float32")
    text = str(softmax_kernel(Node("softmax", "s", ["x"], ["y"], {"axis": -1}), {"x": t, "y": t}, Target("host"), "k"))
    lanes = family_of(Target("host")).lanes
    assert "range(%d)" % (ACC_VECTORS * lanes - 1) not in text and "range(%d)" % (lanes - 1) in text, text


def test_softmax_flushes_terms_far_below_the_max(tmp_path):
    """Scores 1e4 apart (a masked row): exp underflows; the kernel flushes such terms to zero, never NaN."""
    x = np.zeros((3, 40), np.float32)
    x[:, ::3] = -1e4
    x[1, 7] = 50.0
    x[2] = -3e38
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", x.shape)], ["y"])
    _check(model, {"x": x}, tmp_path, tol=1e-6)


def test_softmax_other_axis_runs_through_te(tmp_path):
    x = np.random.default_rng(1).standard_normal((4, 33, 6)).astype(np.float32)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", x.shape)], ["y"])
    _check(model, {"x": x}, tmp_path, tol=1e-6)


# ---------------------------------------------------------------- identity reshapes, the dense head
def _head(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    model = _model(nodes, [("x", (m, k))], ["y"], [("w", w), ("b", b)])
    return model, {"x": rng.standard_normal((m, k)).astype(np.float32)}


def test_matmul_bias_is_one_kernel_after_the_identity_reshape_goes(tmp_path):
    model, feeds = _head(20, 24, 40)
    factory = _check(model, feeds, tmp_path, threads=(1, 2))
    labels = [n.ops_label() for n in factory.graph.nodes if n.op != "reshape"]
    assert labels == ["dense+add", "softmax"], labels


def test_identity_reshape_pass_keeps_graph_outputs_and_other_shapes():
    model, _ = _head(4, 8, 6)
    graph, params = from_onnx(model)
    before = [n.op for n in graph.nodes]
    assert "reshape" in before
    out, _ = drop_identity_reshapes(graph, params)
    assert "reshape" not in [n.op for n in out.nodes]
    out.validate(params)
    # a graph output keeps its reshape (it carries the output's name); a reshape that changes the shape stays
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Reshape", ["y", "s"], ["r"])]
    m2 = _model(nodes, [("x", (4, 8))], ["y", "r"], [("w", np.ones((8, 6))), ("s", np.array([24]))])
    m2.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([24], np.int64), "s"))
    g2, p2 = from_onnx(m2)
    o2, _ = drop_identity_reshapes(g2, p2)
    o2.validate(p2)
    assert set(o2.outputs) == set(g2.outputs)
    assert [n.op for n in o2.nodes].count("reshape") == [n.op for n in g2.nodes].count("reshape")


@pytest.mark.parametrize("m,k,n", [(16, 8, 31), (17, 40, 32), (80, 256, 1000), (100, 33, 65)])
def test_prepacked_dense_matches_onnxruntime(m, k, n, tmp_path):
    model, feeds = _head(m, k, n, seed=m + n)
    _check(model, feeds, tmp_path, threads=(1, 2))


def test_host_dense_panels_follow_the_family():
    tgt = as_target("host")
    fam = family_of(tgt)
    model, _ = _head(80, 64, 100)
    graph, params = from_onnx(model)
    g, p, _ = prepare_graph(graph, params, 3, tgt)
    (dense,) = [b for n in g.nodes for b in n.body() if b.op == "dense"]
    if fam.name == "x86" and fam.lanes >= 16:
        assert panel_block(tgt) == (WIDE_PANEL, WIDE_BLOCK)
        # 100 columns: 16-wide panels pad them to 112, 32-wide ones to 128; 8 columns: one 8-wide (ymm) panel;
        # fewer rows than the block's: the block takes them all
        assert panel_block(tgt, 100, 80) == (16, (12, 16)) and panel_block(tgt, 128, 80) == (WIDE_PANEL, WIDE_BLOCK)
        assert panel_block(tgt, 8, 4096) == (8, (12, 8)) and panel_block(tgt, 960, 9) == (WIDE_PANEL, (9, 32))
        assert dense.attrs["packed_block"] == (12, 16)
        assert p[dense.inputs[1]].shape == (-(-100 // 16), 64, 16)
    else:
        assert "packed_block" not in dense.attrs
    # without a target, and for ARM, the 16-wide panels of ops.linear
    assert panel_block(None) == (ops.linear.PANEL, None)
    assert panel_block(as_target("rasp4b")) == (ops.linear.PANEL, None)


def test_dense_prepacked_refuses_a_block_that_splits_panels():
    from tether import te
    x = te.placeholder((20, 8), "float32", name="x")
    p = te.placeholder((2, 8, 32), "float32", name="p")
    with pytest.raises(ValueError, match="register block"):
        ops.linear.dense_prepacked(x, p, 60, block=(12, 24))


# ---------------------------------------------------------------- conv2d_pixels' pixel block
def test_pixel_block_divides_the_map_when_a_near_block_does():
    avx512 = Family("x86", 16, mm_rows=6, acc_regs=24, max_col_vectors=2, conv_pixels=12)
    assert pixel_block(avx512, 320) == 10          # 4 x 80: 32 blocks of 10, not 26 of 12 and one of 8
    assert pixel_block(avx512, 11 * 5) == 11       # 55: 4 blocks of 12 and one of 7
    assert pixel_block(avx512, 200) == 10          # 8 x 25: a tail of 8
    assert pixel_block(avx512, 400) == 12          # 20 x 20: a tail of 4, not worth the smaller block
    assert pixel_block(avx512, 3136) == 12         # 56 x 56: no block of 10..11 divides it
    assert pixel_block(avx512, 1600) == 12         # 40 x 40: 10 divides, but 134 blocks: one tail is little
    assert pixel_block(avx512, 24) == 12
    avx2 = Family("x86", 8, mm_rows=6, acc_regs=12, max_col_vectors=2, conv_pixels=4)
    assert pixel_block(avx2, 10) == 4              # other families keep their block


@pytest.mark.parametrize("h,w,cin,cout", [(4, 80, 32, 64), (2, 25, 16, 32), (3, 11, 8, 32)])
def test_conv_on_odd_maps_matches_onnxruntime(h, w, cin, cout, tmp_path):
    rng = np.random.default_rng(h * w)
    wt = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = _model(nodes, [("x", (1, cin, h, w))], ["y"], [("w", wt), ("b", b)])
    _check(model, {"x": rng.standard_normal((1, cin, h, w)).astype(np.float32)}, tmp_path, threads=(1, 2))


# ---------------------------------------------------------------- bidirectional recurrences in parallel
@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_bidirectional_layer_large_enough_to_run_directions_in_parallel(cell, tmp_path):
    from tether.kernels.recurrent_kernel import PARALLEL_DIRECTIONS_MIN_MACS
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell]
    seq, batch, nin, hid = 40, 2, 24, 64
    assert seq * batch * gates * hid * hid >= PARALLEL_DIRECTIONS_MIN_MACS     # the parallel form is what runs
    rng = np.random.default_rng(3)
    s = 1 / np.sqrt(hid)
    W = rng.uniform(-s, s, (2, gates * hid, nin))
    R = rng.uniform(-s, s, (2, gates * hid, hid))
    B = rng.uniform(-s, s, (2, 2 * gates * hid))
    h0 = rng.uniform(-1, 1, (2, batch, hid))
    ins, inits = ["x", "W", "R", "B", "", "h0"], [("W", W), ("R", R), ("B", B), ("h0", h0)]
    outs = ["y", "yh"]
    if cell == "LSTM":
        ins.append("c0")
        inits.append(("c0", rng.uniform(-1, 1, (2, batch, hid))))
        outs.append("yc")
    node = helper.make_node(cell, ins, outs, hidden_size=hid, direction="bidirectional")
    model = _model([node], [("x", (seq, batch, nin))], outs, inits, opset=14)
    x = rng.standard_normal((seq, batch, nin)).astype(np.float32)
    _check(model, {"x": x}, tmp_path, threads=(1, 2), tol=1e-5)


# ---------------------------------------------------------------- the same kernels on emulated ARM devices
@pytest.mark.emulated
def test_crnn_head_and_bilstm_on_emulated_devices(emulated_device, tmp_path):
    """The direct softmax and recurrent kernels (written as loop IR, not te) cross-compile and match
    onnxruntime on aarch64 and armv7: a BiLSTM, its output into MatMul + Add + Softmax over a long last axis."""
    from tether import rpc
    from tether.rpc.graph_client import RemoteGraphExecutor

    rng = np.random.default_rng(5)
    seq, nin, hid, classes = 24, 16, 64, 301      # 24 x 256 x 64 MACs a direction: the parallel form
    s = 1 / np.sqrt(hid)
    inits = [("W", rng.uniform(-s, s, (2, 4 * hid, nin))), ("R", rng.uniform(-s, s, (2, 4 * hid, hid))),
             ("B", rng.uniform(-s, s, (2, 8 * hid))), ("shape", np.array([seq, 2 * hid])),
             ("w", rng.standard_normal((2 * hid, classes)) / np.sqrt(2 * hid)), ("b", rng.standard_normal(classes))]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=hid, direction="bidirectional"),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "shape"], ["seq"]),
             helper.make_node("MatMul", ["seq", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["z"]),
             helper.make_node("Softmax", ["z"], ["probs"], axis=-1)]
    model = _model(nodes, [("x", (seq, 1, nin))], ["probs"], inits, opset=14)
    model.graph.initializer[3].CopyFrom(numpy_helper.from_array(np.array([seq, 2 * hid], np.int64), "shape"))
    x = rng.standard_normal((seq, 1, nin)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target=emulated_device.preset).export(str(tmp_path))
    with rpc.connect(*emulated_device.address, timeout=300) as sess:
        with RemoteGraphExecutor(sess, str(tmp_path)) as gm:
            gm.run(x=x)
            assert relative_error(gm.get_output(0), ref) <= 1e-5


def test_tuning_tasks_leave_out_direct_kernels():
    """The softmax kernel is written as loop IR and takes no schedule config: tether tune gets no task for it
    (it would tune a te schedule the build never compiles), but keeps the dense+add."""
    from tether.tune.tasks import extract_tasks
    model, _ = _head(32, 16, 48)
    graph, params = from_onnx(model)
    labels = [t.name for t in extract_tasks(graph, params, "host")]
    assert labels == ["dense+add"], labels


def test_softmax_inside_a_compiled_loop(tmp_path):
    """A Loop body's softmax runs as the direct kernel inside the loop kernel (loop_kernel asks the op table
    for body nodes too): h <- softmax(h * 3 + w) for 20 steps, against onnxruntime."""
    vi = lambda n, s, t=TensorProto.FLOAT: helper.make_tensor_value_info(n, t, s)   # noqa: E731
    w = np.linspace(-2, 2, 40).astype(np.float32).reshape(2, 20)
    body = helper.make_graph(
        [helper.make_node("Mul", ["h_in", "three"], ["h1"]), helper.make_node("Add", ["h1", "w"], ["h2"]),
         helper.make_node("Softmax", ["h2"], ["h_out"], axis=-1),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("it", (), TensorProto.INT64), vi("cond_in", (), TensorProto.BOOL), vi("h_in", (2, 20))],
        [vi("cond_out", (), TensorProto.BOOL), vi("h_out", (2, 20))],
        [numpy_helper.from_array(np.array(3.0, np.float32), "three")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "h0"], ["h"], body=body)], "m", [vi("h0", (2, 20))], [vi("h", (2, 20))],
        [numpy_helper.from_array(np.array(20, np.int64), "M"), numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    factory = _check(model, {"h0": np.random.default_rng(2).standard_normal((2, 20)).astype(np.float32)}, tmp_path)
    assert factory.graph.ops_used().get("loop") == 1
