"""Ops that read a data-dependent value (NonZero's, Compress's, ...) run as numpy nodes (frontend/onnx/
dynamic_values.py, tether_rpc/dynamic_ops.py): the post-processing patterns of exported models against
onnxruntime, at sizes from 0 to the full bound, one build run at several sizes, through a real forked server; the
bounds are sound; an op outside the set is refused naming it."""
import itertools

import numpy as np
import onnxruntime as ort
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import TensorProto, helper

import tether
from tether import graph_executor, rpc
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(11)


def _build(model, folder):
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host")
    assert factory.graph_json["version"] == 3
    factory.export(str(folder))
    return graph_executor.load(str(folder))


def _run_sizes(model, tmp_path, feeds_list, rtol=1e-6, atol=1e-6):
    """One build, run on every feed dict, each output against onnxruntime's (dtype and shape exactly)."""
    gm = _build(model, tmp_path / "m")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = set()
    for feeds in feeds_list:
        want = sess.run(None, feeds)
        for k, v in feeds.items():
            gm.set_input(k, v)
        gm.run()
        for j, w in enumerate(want):
            have = gm.get_output(j)
            assert have.dtype == w.dtype and have.shape == w.shape, (j, have.dtype, have.shape, w.dtype, w.shape)
            np.testing.assert_allclose(have.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
        shapes.add(tuple(w.shape for w in want))
    return shapes


def _scores(n, above):
    """n scores of which ``above`` exceed 0.5."""
    s = RNG.uniform(0, 0.4, n).astype(np.float32)
    s[RNG.permutation(n)[:above]] = RNG.uniform(0.6, 1, above)
    return s


def _boxes(n):
    xy = RNG.uniform(0, 50, (n, 2))
    return np.concatenate([xy, xy + RNG.uniform(1, 20, (n, 2))], 1).astype(np.float32)


N = 12
THRESH = {"t": np.array(0.5, np.float32)}


def test_boolean_indexing_gather_nd(tmp_path):
    """boxes[scores > t] * scale + offset as PyTorch exports it: Greater, NonZero, Transpose, GatherND."""
    nodes = [helper.make_node("Greater", ["scores", "t"], ["m"]),
             helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["boxes", "idx"], ["sel"]),
             helper.make_node("Mul", ["sel", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "offset"], ["y"]),
             helper.make_node("GatherND", ["scores", "idx"], ["s"])]
    inits = dict(THRESH, scale=np.array([2.0, 0.5, 2.0, 0.5], np.float32), offset=np.array(1.5, np.float32))
    feeds = [{"boxes": _boxes(N), "scores": _scores(N, k)} for k in (5, 0, N, 1)]
    model = make_graph_model(nodes, feeds[0], ["y", "s"], inits, opset=13)
    shapes = _run_sizes(model, tmp_path, feeds)
    assert {s[0] for s in shapes} == {(5, 4), (0, 4), (N, 4), (1, 4)}


@pytest.mark.parametrize("opset", [11, 13])
def test_boolean_indexing_squeeze_gather(tmp_path, opset):
    """The 1-D mask form: NonZero, Squeeze (attribute axes before opset 13, an input from 13), Gather."""
    axes = {"axes": np.array([0], np.int64)} if opset >= 13 else {}
    squeeze = helper.make_node("Squeeze", ["nz", "axes"] if axes else ["nz"], ["idx"],
                               **({} if axes else {"axes": [0]}))
    nodes = [helper.make_node("Greater", ["scores", "t"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             squeeze, helper.make_node("Gather", ["boxes", "idx"], ["y"], axis=0),
             helper.make_node("Gather", ["scores", "idx"], ["s"], axis=0),
             helper.make_node("Cast", ["idx"], ["idx32"], to=TensorProto.INT32)]
    feeds = [{"boxes": _boxes(N), "scores": _scores(N, k)} for k in (3, N, 0)]
    model = make_graph_model(nodes, feeds[0], ["y", "s", "idx32"], dict(THRESH, **axes), opset=opset)
    _run_sizes(model, tmp_path, feeds)


def test_post_processing_chain(tmp_path):
    """Slice, Sub, Concat, Unsqueeze, Reshape, Cast, Div (integer, truncating), Where, comparisons and logic,
    unary ops and reductions on the selected boxes."""
    c = lambda name, v: helper.make_node("Constant", [], [name], value=helper.make_tensor(  # noqa: E731
        name, TensorProto.INT64, [len(v)], v))
    nodes = [helper.make_node("Greater", ["scores", "t"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]), helper.make_node("GatherND", ["boxes", "idx"], ["b"]),
             c("s0", [0]), c("s2", [2]), c("e2", [2]), c("e4", [4]), c("ax1", [1]), c("shape", [-1, 2]),
             c("rev_s", [-1]), c("rev_e", [-1000]), c("m1", [-1]),
             helper.make_node("Slice", ["b", "s0", "e2", "ax1"], ["lo"]),
             helper.make_node("Slice", ["b", "s2", "e4", "ax1"], ["hi"]),
             helper.make_node("Sub", ["hi", "lo"], ["wh"]),
             helper.make_node("Concat", ["lo", "wh"], ["xywh"], axis=1),
             helper.make_node("Slice", ["xywh", "rev_s", "rev_e", "ax1", "m1"], ["rev"]),
             helper.make_node("Reshape", ["rev", "shape"], ["pairs"]),
             helper.make_node("Cast", ["pairs"], ["ipairs"], to=TensorProto.INT64),
             helper.make_node("Div", ["ipairs", "three"], ["q"]),
             helper.make_node("Neg", ["q"], ["nq"]), helper.make_node("Div", ["nq", "three"], ["nq3"]),
             helper.make_node("Max", ["ipairs", "ten"], ["big"]),
             helper.make_node("Min", ["ipairs", "ten"], ["small"]),
             helper.make_node("Sqrt", ["pairs"], ["sq"]), helper.make_node("Log", ["sq"], ["lg"]),
             helper.make_node("Neg", ["pairs"], ["neg"]), helper.make_node("Exp", ["neg"], ["ex"]),
             helper.make_node("Sigmoid", ["lg"], ["sg"]), helper.make_node("Floor", ["lg"], ["fl"]),
             helper.make_node("Ceil", ["lg"], ["ce"]), helper.make_node("Abs", ["nq3"], ["ab"]),
             helper.make_node("Relu", ["fl"], ["re"]),
             helper.make_node("GreaterOrEqual", ["pairs", "twenty"], ["ge"]),
             helper.make_node("Less", ["pairs", "forty"], ["lt"]),
             helper.make_node("LessOrEqual", ["pairs", "forty"], ["le"]),
             helper.make_node("Equal", ["fl", "ce"], ["eq"]),
             helper.make_node("And", ["ge", "lt"], ["band"]), helper.make_node("Or", ["ge", "eq"], ["bor"]),
             helper.make_node("Xor", ["ge", "le"], ["bxor"]), helper.make_node("Not", ["band"], ["bnot"]),
             helper.make_node("Where", ["bnot", "pairs", "zero"], ["w"]),
             helper.make_node("Unsqueeze", ["w", "s0"], ["w3"]), helper.make_node("Flatten", ["w3"], ["flat"],
                                                                                   axis=2),
             helper.make_node("ReduceSum", ["pairs", "ax1"], ["rsum"], keepdims=0),
             helper.make_node("ReduceMax", ["pairs"], ["rmax"], axes=[0], keepdims=1),
             helper.make_node("ReduceMin", ["pairs"], ["rmin"], axes=[1], keepdims=0),
             helper.make_node("ReduceMean", ["pairs"], ["rmean"], axes=[0, 1], keepdims=0),
             helper.make_node("Identity", ["bxor"], ["bx"])]
    outs = ["xywh", "rev", "q", "nq3", "big", "small", "ex", "sg", "re", "ab", "bor", "bx", "flat", "rsum", "rmin"]
    inits = dict(THRESH, three=np.array(3, np.int64), ten=np.array([10, 30], np.int64),
                 twenty=np.array(20, np.float32), forty=np.array(40, np.float32), zero=np.array(0, np.float32))
    feeds = [{"boxes": _boxes(N), "scores": _scores(N, k)} for k in (7, 1, N)]
    model = make_graph_model(nodes, feeds[0], outs, inits, opset=13)
    _run_sizes(model, tmp_path, feeds, rtol=1e-6, atol=1e-7)
    # the max and the mean of an empty selection are no number: run them where something is selected
    model = make_graph_model(nodes, feeds[0], ["rmax", "rmean"], inits, opset=13)
    _run_sizes(model, tmp_path / "r", feeds, rtol=1e-6, atol=1e-6)


def test_float16_and_bfloat16_after_compress(tmp_path):
    """Casts to the half types and arithmetic in float16 on a data-dependent value."""
    nodes = [helper.make_node("Compress", ["x", "c"], ["sel"]),
             helper.make_node("Cast", ["sel"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Mul", ["h", "h"], ["hh"]),
             helper.make_node("Cast", ["sel"], ["bf"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["bf"], ["y"], to=TensorProto.FLOAT)]
    x = (RNG.standard_normal(20) * 100).astype(np.float32)
    feeds = [{"x": x, "c": RNG.standard_normal(20) > 0}, {"x": x, "c": np.zeros(20, bool)}]
    _run_sizes(make_graph_model(nodes, feeds[0], ["y"], opset=13), tmp_path / "bf", feeds, rtol=0, atol=0)
    # onnxruntime multiplies the float32 values the casts came from and rounds once, tether rounds the casts too
    _run_sizes(make_graph_model(nodes, feeds[0], ["hh"], opset=13), tmp_path / "h", feeds, rtol=2 ** -9, atol=0)


def test_gather_from_a_dynamic_value_wraps_negative_indices_and_refuses_out_of_range(tmp_path):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Squeeze", ["nz", "ax"], ["i"]),
             helper.make_node("Gather", ["i", "last"], ["y"])]
    x = np.array([0, 3, 0, 1, 2, 0], np.float32)
    model = make_graph_model(nodes, {"x": x}, ["y"], {"ax": np.array([0], np.int64),
                                                     "last": np.array([-1, 0], np.int64)}, opset=13)
    _run_sizes(model, tmp_path, [{"x": x}, {"x": np.eye(1, 6, 2).reshape(6).astype(np.float32)}])
    gm = graph_executor.load(str(tmp_path / "m"))
    gm.set_input("x", np.zeros(6, np.float32))
    with pytest.raises(ValueError, match="Gather index -1 is out of range for an axis of 0"):
        gm.run()


def test_op_outside_the_set_is_refused_naming_it():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    model = make_graph_model([helper.make_node("Compress", ["x", "c"], ["sel"], axis=0),
                              helper.make_node("Softmax", ["sel"], ["y"])], {"x": x, "c": np.ones(3, bool)}, ["y"],
                             opset=13)
    with pytest.raises(UnsupportedOpError, match=r"\(Softmax\) reads 'sel', whose shape is data-dependent"):
        from_onnx(model)


def test_through_a_real_server(rpc_server, tmp_path):
    nodes = [helper.make_node("Greater", ["scores", "t"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]), helper.make_node("GatherND", ["boxes", "idx"], ["y"])]
    feeds = [{"boxes": _boxes(N), "scores": _scores(N, k)} for k in (4, 0)]
    model = make_graph_model(nodes, feeds[0], ["y"], THRESH, opset=13)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host").export(str(tmp_path))
    sess_ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=60) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            for f in feeds:
                gm.set_input("boxes", f["boxes"])
                gm.set_input("scores", f["scores"])
                gm.run()
                np.testing.assert_array_equal(gm.get_output(0), sess_ref.run(None, f)[0])
    assert rpc_server.alive


def test_slice_bounds_are_sound():
    """The bound of a slice of an axis of any extent up to b is the largest count any such extent gives."""
    from tether.kernels.dynamic_op import slice_bound
    from tether_rpc.dynamic_ops import slice_range

    for s, e, st, b in itertools.product(range(-7, 8), range(-8, 9), (-3, -1, 1, 2), (0, 1, 3, 6)):
        counts = [slice_range(s, e, st, d)[1] for d in range(b + 1)]
        assert slice_bound(s, e, st, b) == max(counts), (s, e, st, b)


@pytest.mark.parametrize("target", [[0, -1], [-1], [2, 0, -1], [-1, 3], [0, 0, 1]])
def test_reshape_bounds_are_sound(target):
    """Every input within the bound (6, 3, 4) reshapes to a shape within the op's bound."""
    from tether.graph.ir import TensorType
    from tether.kernels.dynamic_op import DEFINITIONS
    from tether_rpc.dynamic_ops import reshape_target

    bound = DEFINITIONS["dyn_reshape"].infer({"mode": "reshape", "shape": target},
                                             TensorType((6, 3, 4), "float32"))[0].shape
    fits = 0
    for shape in itertools.product(range(7), range(4), range(5)):
        try:
            out = reshape_target("reshape", {"shape": target}, shape)
        except ValueError:
            continue
        if int(np.prod(out)) != int(np.prod(shape)):
            continue
        fits += 1
        assert len(out) == len(bound) and all(d <= b for d, b in zip(out, bound)), (shape, out, bound)
    assert fits


def test_half_inputs_to_data_dependent_ops(tmp_path):
    """Compress of float16 (converted through float32, half.py) gives a data-dependent float16 value, which a
    Concat then reads."""
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
             helper.make_node("Compress", ["xh", "c"], ["sel"], axis=0),
             helper.make_node("Concat", ["sel", "sel"], ["y"], axis=0)]
    x = RNG.standard_normal((6, 2)).astype(np.float32)
    feeds = [{"x": x, "c": RNG.standard_normal(6) > 0}, {"x": x, "c": np.ones(6, bool)}]
    model = make_graph_model(nodes, feeds[0], ["sel", "y"], opset=13)
    _run_sizes(model, tmp_path, feeds, rtol=0, atol=0)


def test_empty_bound_keeps_the_real_extents(tmp_path):
    """A slice whose bound is empty on one axis: the value is still data-dependent on the others (not a constant
    of the bound's shape)."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Slice", ["nz", "five", "nine", "zero"], ["y"])]
    x = np.array([[0, 2, 0], [1, 0, 3]], np.float32)
    model = make_graph_model(nodes, {"x": x}, ["y"], {"five": np.array([5], np.int64),
                                                      "nine": np.array([9], np.int64),
                                                      "zero": np.array([0], np.int64)}, opset=13)
    shapes = _run_sizes(model, tmp_path, [{"x": x}, {"x": np.ones_like(x)}])
    assert shapes == {((0, 3),), ((0, 6),)}


@pytest.mark.parametrize("opset", [9, 11])
def test_topk_of_a_data_dependent_value(tmp_path, opset):
    """TopK with a constant k (an attribute before opset 10) of Compress's output; a k beyond the real axis fails
    at run time, as in onnxruntime."""
    topk = helper.make_node("TopK", ["sel"] if opset < 10 else ["sel", "k"], ["v", "i"], axis=0,
                            **({"k": 3} if opset < 10 else {}))
    nodes = [helper.make_node("Compress", ["x", "c"], ["sel"], axis=0), topk]
    x = RNG.integers(-3, 3, (8, 2)).astype(np.float32)             # ties: the lower index first
    feeds = [{"x": x, "c": RNG.standard_normal(8) > -0.5}, {"x": x, "c": np.ones(8, bool)}]
    feeds[0]["c"][:4] = True
    inits = {} if opset < 10 else {"k": np.array([3], np.int64)}
    model = make_graph_model(nodes, feeds[0], ["v", "i"], inits, opset=opset)
    _run_sizes(model, tmp_path, feeds)
    gm = graph_executor.load(str(tmp_path / "m"))
    gm.set_input("x", x)
    gm.set_input("c", np.eye(1, 8, 5, dtype=bool).reshape(8))
    with pytest.raises(ValueError, match="TopK k=3 for an axis of 1"):
        gm.run()


def test_topk_of_at_most_k_as_torchvision_exports_it(tmp_path):
    """scores.topk(min(k, len(scores))): Shape of the data-dependent value, Min with k, a run-time k; and Size."""
    nodes = [helper.make_node("Compress", ["x", "c"], ["sel"]),
             helper.make_node("Shape", ["sel"], ["n"], start=0, end=1),
             helper.make_node("Min", ["n", "k"], ["kk"]),
             helper.make_node("TopK", ["sel", "kk"], ["v", "i"]),
             helper.make_node("Size", ["sel"], ["size"]),
             helper.make_node("Cast", ["size"], ["fsize"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["v", "fsize"], ["y"])]
    x = RNG.standard_normal(10).astype(np.float32)
    feeds = [{"x": x, "c": np.arange(10) < m} for m in (8, 2, 0, 10)]
    model = make_graph_model(nodes, feeds[0], ["y", "i", "n", "size"], {"k": np.array([3], np.int64)}, opset=15)
    shapes = _run_sizes(model, tmp_path, feeds)
    assert {s[0] for s in shapes} == {(3,), (2,), (0,)}
