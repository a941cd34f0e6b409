"""ONNX If, Loop and Scan through tether against onnxruntime: If on a compile-time condition (inlined branch) and
on a run-time one (both branches, a select), outer-scope reads, nesting; Loop unrolled with loop-carried values,
scan outputs and a body condition that ends it early; Scan over every input/output axis and direction; the
refusals; and a VAD-like model (1-D convs, ReduceMean, an LSTM with state inputs/outputs, a run-time If)."""
import functools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import tether
from tether import graph_executor, rpc
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx
from tether.frontend.onnx.control_flow import MAX_UNROLL
from tether.rpc.graph_client import RemoteGraphExecutor


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "cf", inputs, [helper.make_tensor_value_info(o, TP.FLOAT, None)
                                                    if isinstance(o, str) else o for o in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name))


def vi(name, shape, elem=TP.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def check(model, feeds, tmp_path, constants=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    expected = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds)
    graph, params = from_onnx(model, constants=constants)
    tether.build_graph(graph, params).export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.run(**{k: v for k, v in feeds.items() if k not in (constants or {})})
    for i, e in enumerate(expected):
        np.testing.assert_allclose(gm.get_output(i), e, rtol=1e-4, atol=1e-6)
    return graph


def branches(then_nodes, then_out, else_nodes, else_out):
    return (helper.make_graph(then_nodes, "then", [], [vi(then_out, None)]),
            helper.make_graph(else_nodes, "else", [], [vi(else_out, None)]))


def if_model(cond_node, nested=False):
    """y = If(cond) then x * 2 + w else sigmoid(x) - w, reading x and w from the outer scope."""
    then_nodes = [const("two", 2.0), helper.make_node("Mul", ["x", "two"], ["t1"]),
                  helper.make_node("Add", ["t1", "w"], ["t_out"])]
    if nested:      # the then-branch holds an If of its own on the same condition
        inner = branches([helper.make_node("Neg", ["t_out"], ["n_out"])], "n_out",
                         [helper.make_node("Abs", ["t_out"], ["a_out"])], "a_out")
        then_nodes.append(helper.make_node("If", ["c"], ["t_out2"], then_branch=inner[0], else_branch=inner[1]))
    then_g, else_g = branches(then_nodes, "t_out2" if nested else "t_out",
                              [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Sub", ["s", "w"],
                                                                                          ["e_out"])], "e_out")
    w = numpy_helper.from_array(np.linspace(-1, 1, 12).astype(np.float32).reshape(3, 4), "w")
    nodes = cond_node + [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    return model_of(nodes, [vi("x", (3, 4))], ["y"], [w])


X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


@pytest.mark.parametrize("value", [True, False])
def test_if_on_a_constant_inlines_one_branch(value, tmp_path):
    model = if_model([const("c", value, bool)])
    graph = check(model, {"x": X}, tmp_path)
    ops = graph.ops_used()
    assert "where" not in ops and ("sigmoid" in ops) != value


def test_if_on_a_shape_condition_folds(tmp_path):
    # c = Shape(x)[0] == 3: known once the input shape is fixed
    cond = [helper.make_node("Shape", ["x"], ["shp"]), const("zero", [0], np.int64),
            helper.make_node("Gather", ["shp", "zero"], ["d0"]), const("three", [3], np.int64),
            helper.make_node("Equal", ["d0", "three"], ["c1"]), helper.make_node("Squeeze", ["c1"], ["c"])]
    graph = check(if_model(cond), {"x": X}, tmp_path)
    assert "where" not in graph.ops_used() and "sigmoid" not in graph.ops_used()


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("value", [True, False])
def test_if_on_a_run_time_condition(value, nested, tmp_path):
    model = if_model([], nested=nested)
    model.graph.input.append(vi("c", (), TP.BOOL))
    feeds = {"x": X, "c": np.array(value)}
    graph = check(model, feeds, tmp_path)
    assert "where" in graph.ops_used()
    # the same compiled model follows the condition at run time
    gm = graph_executor.load(str(tmp_path))
    gm.run(x=X, c=np.array(not value))
    other = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": X, "c": np.array(not value)})
    np.testing.assert_allclose(gm.get_output(0), other[0], rtol=1e-4, atol=1e-6)


def test_if_branches_of_different_shapes_are_refused():
    then_g, else_g = branches([helper.make_node("Identity", ["x"], ["t"])], "t",
                              [helper.make_node("ReduceSum", ["x"], ["e"], keepdims=1)], "e")
    model = model_of([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                     [vi("x", (3, 4)), vi("c", (), TP.BOOL)], ["y"])
    with pytest.raises(UnsupportedOpError, match="If branches give output"):
        from_onnx(model)


def loop_body(early_exit=None):
    """carried (acc, k): acc = acc * 0.5 + x[iter] ; k = k + 1; scan output acc (and iter as float)."""
    nodes = [helper.make_node("Gather", ["xs", "it"], ["row"], axis=0),
             const("half", 0.5), helper.make_node("Mul", ["acc_in", "half"], ["scaled"]),
             helper.make_node("Add", ["scaled", "row"], ["acc_out"]),
             const("one", 1.0), helper.make_node("Add", ["k_in", "one"], ["k_out"]),
             helper.make_node("Cast", ["it"], ["itf"], to=TP.FLOAT),
             helper.make_node("Identity", ["acc_out"], ["scan1"])]
    if early_exit is None:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:   # stop after iteration `early_exit` (computed from the iteration number: folds each iteration)
        nodes += [const("stop", early_exit, np.int64), helper.make_node("Less", ["it", "stop"], ["cond_out"])]
    return helper.make_graph(nodes, "body", [vi("it", (), TP.INT64), vi("cond_in", (), TP.BOOL),
                                             vi("acc_in", (4,)), vi("k_in", ())],
                             [vi("cond_out", (), TP.BOOL), vi("acc_out", (4,)), vi("k_out", ()), vi("scan1", (4,)),
                              vi("itf", ())])


@pytest.mark.parametrize("trips,early_exit", [(1, None), (5, None), (6, 2)])
def test_loop_unrolls_with_carried_values_and_scan_outputs(trips, early_exit, tmp_path):
    xs = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    nodes = [const("M", trips, np.int64), const("cond", True, bool),
             helper.make_node("Loop", ["M", "cond", "acc0", "k0"], ["acc", "k", "accs", "its"],
                              body=loop_body(early_exit))]
    model = model_of(nodes, [vi("acc0", (4,)), vi("k0", ())], ["acc", "k", "accs", "its"],
                     [numpy_helper.from_array(xs, "xs")])
    check(model, {"acc0": np.ones(4, np.float32), "k0": np.array(3.0, np.float32)}, tmp_path)


def test_if_inside_a_loop_body_reads_the_body_scope(tmp_path):
    """acc = If(it < 2) then acc + x[it] else acc * x[it]: the If folds per iteration and its branches read the
    body's values (renamed per iteration) and the model's."""
    then_g = helper.make_graph([helper.make_node("Add", ["acc_in", "row"], ["t"])], "then", [], [vi("t", (4,))])
    else_g = helper.make_graph([helper.make_node("Mul", ["acc_in", "row"], ["e"])], "else", [], [vi("e", (4,))])
    body = helper.make_graph(
        [helper.make_node("Gather", ["xs", "it"], ["row"], axis=0), const("two", 2, np.int64),
         helper.make_node("Less", ["it", "two"], ["small"]),
         helper.make_node("If", ["small"], ["acc_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("it", (), TP.INT64), vi("cond_in", (), TP.BOOL), vi("acc_in", (4,))],
        [vi("cond_out", (), TP.BOOL), vi("acc_out", (4,))])
    xs = np.random.default_rng(4).standard_normal((5, 4)).astype(np.float32)
    model = model_of([const("M", 5, np.int64), helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)],
                     [vi("acc0", (4,))], ["acc"], [numpy_helper.from_array(xs, "xs")])
    graph = check(model, {"acc0": np.ones(4, np.float32)}, tmp_path)
    assert "where" not in graph.ops_used()


def test_loop_on_a_run_time_trip_count_is_refused():
    model = model_of([helper.make_node("Loop", ["M", "", "acc0", "k0"], ["acc", "k", "accs", "its"],
                                       body=loop_body())],
                     [vi("M", (), TP.INT64), vi("acc0", (4,)), vi("k0", ())], ["acc"],
                     [numpy_helper.from_array(np.zeros((6, 4), np.float32), "xs")])
    with pytest.raises(UnsupportedOpError, match="trip count M is computed at run time"):
        from_onnx(model)


def test_a_long_loop_exiting_on_a_run_time_condition_is_refused():
    """Past MAX_UNROLL iterations only the compiled loop is possible, and it runs every iteration."""
    model = model_of([const("M", MAX_UNROLL + 1, np.int64),
                      helper.make_node("Loop", ["M", "", "acc0", "k0"], ["acc", "k", "accs", "its"],
                                       body=loop_body(early_exit=3))],
                     [vi("acc0", (4,)), vi("k0", ())], ["acc"],
                     [numpy_helper.from_array(np.zeros((MAX_UNROLL + 1, 4), np.float32), "xs")])
    with pytest.raises(UnsupportedOpError, match="condition is computed at run time"):
        from_onnx(model)


def scan_model(steps, in_axis, in_dir, out_axis, out_dir, w_scale=1.0):
    """state s (2,): s = tanh(s + x_t @ w); scan output s * x_t[:2]. Returns (model, feeds)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "w"], ["xw"]), helper.make_node("Add", ["s_in", "xw"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["s_out"]),
         const("st", [0], np.int64), const("en", [2], np.int64),
         helper.make_node("Slice", ["x_t", "st", "en"], ["x2"]), helper.make_node("Mul", ["s_out", "x2"], ["y_t"])],
        "body", [vi("s_in", (2,)), vi("x_t", (3,))], [vi("s_out", (2,)), vi("y_t", (2,))])
    xshape = (steps, 3) if in_axis == 0 else (3, steps)
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                              scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                              scan_output_axes=[out_axis], scan_output_directions=[out_dir])]
    w = np.random.default_rng(2).standard_normal((3, 2)).astype(np.float32) * np.float32(w_scale)
    model = model_of(nodes, [vi("s0", (2,)), vi("xs", xshape)], ["s", "ys"], [numpy_helper.from_array(w, "w")])
    rng = np.random.default_rng(3)
    return model, {"s0": rng.standard_normal(2).astype(np.float32),
                   "xs": rng.standard_normal(xshape).astype(np.float32)}


@pytest.mark.parametrize("in_axis", [0, 1])
@pytest.mark.parametrize("in_dir", [0, 1])
@pytest.mark.parametrize("out_axis", [0, 1])
@pytest.mark.parametrize("out_dir", [0, 1])
def test_scan_axes_and_directions(in_axis, in_dir, out_axis, out_dir, tmp_path):
    check(*scan_model(5, in_axis, in_dir, out_axis, out_dir), tmp_path)


def vad_model(seed=0, hid=16, frames=12, feats=8):
    """Voice-activity detector: 1-D convs over frames -> LSTM (state in, state out) -> per-frame speech
    probability; an If on the run-time energy (ReduceMean of the input) returns the probabilities or zeros."""
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    ch = 12
    nodes = [
        helper.make_node("Conv", ["audio", "cw1", "cb1"], ["c1"], pads=[1, 1]),               # (1, ch, frames)
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "cw2", "cb2"], ["c2"], pads=[2, 2], kernel_shape=[5]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Transpose", ["r2"], ["seq"], perm=[2, 0, 1]),                      # (frames, 1, ch)
        helper.make_node("LSTM", ["seq", "W", "R", "B", "", "h0", "c0"], ["Y", "h1", "c1s"], hidden_size=hid),
        helper.make_node("Squeeze", ["Y", "ax12"], ["ys"]),                                   # (frames, hid)
        helper.make_node("MatMul", ["ys", "fc"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),                                     # (frames, 1)
        helper.make_node("Mul", ["audio", "audio"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["energy"], keepdims=0),
        const("thr", 0.5), helper.make_node("Greater", ["energy", "thr"], ["loud"]),
        helper.make_node("If", ["loud"], ["speech"],
                         then_branch=helper.make_graph([helper.make_node("Identity", ["prob"], ["p_out"])], "loud",
                                                       [], [vi("p_out", None)]),
                         else_branch=helper.make_graph([helper.make_node("Mul", ["prob", "zero"], ["z_out"])],
                                                       "quiet", [], [vi("z_out", None)])),
    ]
    inits = [w("cw1", ch, feats, 3), w("cb1", ch), w("cw2", ch, ch, 5), w("cb2", ch),
             w("W", 1, 4 * hid, ch), w("R", 1, 4 * hid, hid), w("B", 1, 8 * hid), w("fc", hid, 1),
             numpy_helper.from_array(np.array([1, 2], np.int64), "ax12"),
             numpy_helper.from_array(np.zeros((frames, 1), np.float32), "zero")]
    inputs = [vi("audio", (1, feats, frames)), vi("h0", (1, 1, hid)), vi("c0", (1, 1, hid))]
    model = model_of(nodes, inputs, ["speech", "h1", "c1s"], inits)
    feeds = {"audio": rng.standard_normal((1, feats, frames)).astype(np.float32),
             "h0": rng.standard_normal((1, 1, hid)).astype(np.float32) * 0.5,
             "c0": rng.standard_normal((1, 1, hid)).astype(np.float32) * 0.5}
    return model, feeds


@pytest.mark.parametrize("loud", [True, False])
def test_vad_like_model(loud, tmp_path):
    model, feeds = vad_model()
    feeds["audio"] = feeds["audio"] * (2.0 if loud else 0.3)
    check(model, feeds, tmp_path)


@pytest.mark.emulated
def test_vad_on_emulated_aarch64(emulated_devices, tmp_path):
    """The device's graph executor (over RPC) follows the run-time If both ways."""
    model, feeds = vad_model(seed=2)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    device = emulated_devices.for_preset("rasp4b")
    sess_ort = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with rpc.connect(*device.address, timeout=300) as sess:
        with RemoteGraphExecutor(sess, str(tmp_path)) as gm:
            for gain in (2.0, 0.3):
                run_feeds = dict(feeds, audio=feeds["audio"] * gain)
                expected = sess_ort.run(None, run_feeds)
                gm.run(**run_feeds)
                for i, e in enumerate(expected):
                    np.testing.assert_allclose(gm.get_output(i), e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("value", [True, False])
def test_run_time_if_runs_only_the_taken_branch(value, tmp_path):
    import json
    model = if_model([], nested=True)
    model.graph.input.append(vi("c", (), TP.BOOL))
    check(model, {"x": X, "c": np.array(value)}, tmp_path)
    with open(tmp_path / "deploy.json") as fh:
        nodes = json.load(fh)["nodes"]
    truths = {w[1] for n in nodes for w in n.get("when", [])}
    assert truths == {True, False}, "both branches' kernels carry their condition"
    gm = graph_executor.load(str(tmp_path))
    gm.set_input("x", X)
    gm.set_input("c", np.array(value))
    records = gm.profile(number=1)["nodes"]
    for rec, node in zip(records, nodes):
        taken = all(w[1] == value for w in node.get("when", []))
        assert rec.get("skipped", False) == (not taken), rec
    assert any(r.get("skipped") for r in records) and not all(r.get("skipped") for r in records)


def test_a_malformed_guard_is_refused_at_load(tmp_path):
    import json
    model = if_model([])
    model.graph.input.append(vi("c", (), TP.BOOL))
    graph, params = from_onnx(model)
    tether.build_graph(graph, params).export(str(tmp_path))
    path = tmp_path / "deploy.json"
    doc = json.loads(path.read_text())
    guarded = [n for n in doc["nodes"] if "when" in n]
    assert guarded
    guarded[0]["when"] = [[len(doc["entries"]) + 5, True]]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="malformed \"when\""):
        graph_executor.load(str(tmp_path))


def test_guards_keep_every_read_value_computed():
    """A reader without a guard keeps its producer unguarded; a fused group runs unless all members are guarded;
    only an unfused where may read a skipped choice."""
    from tether.graph.guards import GUARD_ATTR, node_guards
    from tether.graph.ir import Graph, Node, TensorType, fused_node
    t = TensorType((2,), "float32")
    g_then, g_else = [["f", True]], [["f", False]]
    a = Node("relu", "a", ["x"], ["va"], {GUARD_ATTR: g_then})
    b = Node("neg", "b", ["x"], ["vb"], {GUARD_ATTR: g_else})
    leak = Node("neg", "leak", ["x"], ["vl"], {GUARD_ATTR: g_then})
    w = Node("where", "w", ["f", "va", "vb"], ["y"])
    r = Node("add", "r", ["y", "vl"], ["z"])        # reads a guarded value without the guard
    graph = Graph(["x", "f"], ["z"], [a, b, leak, w, r], {v: t for v in ("x", "va", "vb", "vl", "y", "z")})
    graph.types["f"] = TensorType((), "bool")
    guards = node_guards(graph, {})
    assert guards[0] == {("f", True)} and guards[1] == {("f", False)}
    assert guards[2] == frozenset() and guards[3] == frozenset() and guards[4] == frozenset()
    mixed = fused_node("m", [Node("relu", "p", ["x"], ["vp"], {GUARD_ATTR: g_then}), Node("neg", "q", ["vp"], ["vq"])])
    g2 = Graph(["x", "f"], ["vq"], [mixed], {"x": t, "vp": t, "vq": t, "f": TensorType((), "bool")})
    assert node_guards(g2, {}) == [frozenset()]


# ---------------------------------------------------------------- ONNX's own node cases for these ops
# (scripts/onnx_conformance.py --include 'lstm|gru|rnn|^test_(if|loop|scan)'): every case passes except these,
# refused by design, each with the reason it must give
# (sequences and optionals: frontend/onnx/sequence.py; test_if_opt's branches give an empty and a full optional,
# which only the run-time condition tells apart)
REFUSED_NODE_CASES = {"test_if_opt": "one structure", "test_scan_sum": "Scan before opset 9"}

@functools.lru_cache(maxsize=None)
def _node_cases():
    from tether.testing import onnx_cases as oc
    return {c.name: c for c in oc.collect("lstm|gru|rnn|^test_(if|loop|scan)")}


@pytest.mark.parametrize("name", sorted(_node_cases()))
def test_onnx_node_case(name):
    from tether.testing import onnx_cases as oc
    status, message = oc.run_tether(_node_cases()[name])
    if name in REFUSED_NODE_CASES:
        assert status == oc.REFUSED and REFUSED_NODE_CASES[name] in message, (status, message)
    else:
        assert status == oc.PASS, (status, message)


@pytest.mark.parametrize("trips", [40, 1000])
def test_a_long_loop_compiles_to_one_looping_kernel(trips, tmp_path):
    """Past UNROLL_UP_TO iterations the body is converted once and runs inside one kernel's loop: loop-carried
    values, the iteration number (a run-time Gather index), outer values and scan outputs."""
    from tether.frontend.onnx.control_flow import UNROLL_UP_TO
    assert trips > UNROLL_UP_TO
    xs = np.random.default_rng(5).standard_normal((trips, 4)).astype(np.float32)
    nodes = [const("M", trips, np.int64),
             helper.make_node("Loop", ["M", "", "acc0", "k0"], ["acc", "k", "accs", "its"], body=loop_body())]
    model = model_of(nodes, [vi("acc0", (4,)), vi("k0", ())], ["acc", "k", "accs", "its"],
                     [numpy_helper.from_array(xs, "xs")])
    graph = check(model, {"acc0": np.ones(4, np.float32), "k0": np.array(3.0, np.float32)}, tmp_path)
    assert graph.ops_used().get("loop") == 1 and "concat" not in graph.ops_used()


def test_a_long_loop_with_an_lstm_in_its_body(tmp_path):
    """A recurrent layer inside a compiled loop: direct kernels nest."""
    hid = 8
    rng = np.random.default_rng(6)
    w = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
         for n, s in (("W", (1, 4 * hid, 4)), ("R", (1, 4 * hid, hid)))]
    body = helper.make_graph(
        [helper.make_node("Reshape", ["h_in", "shp"], ["x3"]),
         helper.make_node("LSTM", ["x3", "W", "R"], ["", "h_out3"], hidden_size=hid),
         helper.make_node("Slice", ["h_out3", "s0", "s1", "s2"], ["h4"]),
         helper.make_node("Reshape", ["h4", "flat"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("it", (), TP.INT64), vi("cond_in", (), TP.BOOL), vi("h_in", (4,))],
        [vi("cond_out", (), TP.BOOL), vi("h_out", (4,))], w + [
            numpy_helper.from_array(np.array([1, 1, 4], np.int64), "shp"),
            numpy_helper.from_array(np.array([0], np.int64), "s0"),
            numpy_helper.from_array(np.array([4], np.int64), "s1"),
            numpy_helper.from_array(np.array([2], np.int64), "s2"),
            numpy_helper.from_array(np.array([4], np.int64), "flat")])
    model = model_of([const("M", 20, np.int64), helper.make_node("Loop", ["M", "", "h0"], ["h"], body=body)],
                     [vi("h0", (4,))], ["h"])
    graph = check(model, {"h0": rng.standard_normal(4).astype(np.float32)}, tmp_path)
    assert graph.ops_used().get("loop") == 1


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (1, 1, 1, 0), (0, 1, -1, 1)])
def test_a_long_scan_compiles_to_one_looping_kernel(in_axis, in_dir, out_axis, out_dir, tmp_path):
    graph = check(*scan_model(50, in_axis, in_dir, out_axis, out_dir, w_scale=0.5), tmp_path)
    assert graph.ops_used().get("loop") == 1


def test_go_graph_executor_runs_these_models_bit_for_bit(tmp_path):
    """The Go graph executor follows "when" (the taken branch of a run-time If: tests/test_go_when.py) and runs
    compiled loops as the ordinary kernels they are: its outputs equal the Python executor's bit for bit, both
    branches taken."""
    from fixtures.golang import GoCases, compiled_model, run_go_test
    xs = np.random.default_rng(7).standard_normal((40, 4)).astype(np.float32)
    loop = model_of([const("M", 40, np.int64),
                     helper.make_node("Loop", ["M", "", "acc0", "k0"], ["acc", "k", "accs", "its"],
                                      body=loop_body())],
                    [vi("acc0", (4,)), vi("k0", ())], ["acc", "k", "accs", "its"],
                    [numpy_helper.from_array(xs, "xs")])
    vad, vad_feeds = vad_model(seed=3)
    rng = np.random.default_rng(8)
    runs_of = {"vad": [dict(vad_feeds, audio=vad_feeds["audio"] * g) for g in (2.0, 0.3)],
               "loop": [{"acc0": rng.standard_normal(4).astype(np.float32), "k0": np.array(1.5, np.float32)}]}
    cases = GoCases(tmp_path / "cases")
    records = []
    for name, model in (("vad", vad), ("loop", loop)):
        folder = tmp_path / name
        gm = compiled_model(model, folder)
        runs = []
        for feeds in runs_of[name]:
            gm.run(**feeds)
            runs.append(cases.graph_run(gm, feeds))
        records.append({"name": name, "folder": str(folder), "runs": runs, "nodes": gm.info()["nodes"]})
    cases.write(models=records)
    out = run_go_test(["./graph"], tmp_path / "cases", run="TestModelsMatchPython")
    assert "--- PASS: TestModelsMatchPython" in out, out
