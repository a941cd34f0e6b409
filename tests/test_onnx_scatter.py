"""The ONNX ops that become constant index maps (frontend/onnx/indexmap.py) against onnxruntime: ScatterElements
and ScatterND with every reduction and duplicate targets, Scatter, TensorScatter, Col2Im with overlapping blocks,
MaxUnpool, ReverseSequence, CenterCropPad and Pad mode 'wrap'; and what they refuse. ScatterElements and ScatterND
whose indices are run-time inputs (the ``scatter_flat`` kernel), each model compiled once and run on several
index sets."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(5)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(onnx_compare, reduction, axis):
    x = _r(4, 5, 3)
    shape = list(x.shape)
    shape[axis] = 6                                      # more updates than positions: duplicates
    n = x.shape[axis]
    idx = RNG.integers(-n, n, shape).astype(np.int64)
    if reduction == "none":                              # onnxruntime leaves duplicate writes unordered
        idx = np.broadcast_to(np.arange(n).reshape([-1 if d == axis % 3 else 1 for d in range(3)]),
                              [n if d == axis % 3 else shape[d] for d in range(3)]).astype(np.int64)
    upd = _r(*idx.shape)
    model = make_model("ScatterElements", {"x": x, "u": upd}, {"axis": axis, "reduction": reduction}, opset=18,
                       initializers={"i": idx})
    model.graph.node[0].input[:] = ["x", "i", "u"]
    onnx_compare(model, {"x": x, "u": upd}, rtol=1e-5, atol=1e-6)


def test_scatter_elements_int_data(onnx_compare):
    x = RNG.integers(-9, 9, (3, 4)).astype(np.int32)
    idx = np.array([[0, 1, 1, 2], [2, 2, 0, 0]], np.int64)
    upd = RNG.integers(-9, 9, idx.shape).astype(np.int32)
    model = make_model("ScatterElements", {"x": x, "u": upd}, {"axis": 0, "reduction": "add"}, opset=18,
                       initializers={"i": idx})
    model.graph.node[0].input[:] = ["x", "i", "u"]
    onnx_compare(model, {"x": x, "u": upd})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("ishape", [(3, 1), (2, 2), (4, 3)])
def test_scatter_nd(onnx_compare, reduction, ishape):
    x = _r(4, 3, 5)
    k = ishape[-1]
    cols = [RNG.integers(0, x.shape[j], ishape[:-1]) for j in range(k)]
    idx = np.stack(cols, axis=-1).astype(np.int64)
    if reduction == "none":
        idx = np.unique(idx, axis=0)                     # unique targets: the result is defined
    upd = _r(*(idx.shape[:-1] + x.shape[k:]))
    model = make_model("ScatterND", {"x": x, "u": upd}, {"reduction": reduction}, opset=18, initializers={"i": idx})
    model.graph.node[0].input[:] = ["x", "i", "u"]
    onnx_compare(model, {"x": x, "u": upd}, rtol=1e-5, atol=1e-6)


def test_scatter_refuses_out_of_range_indices():
    x = _r(3, 3)
    model = make_model("ScatterElements", {"x": x, "u": _r(1, 3)}, {"axis": 0}, opset=18,
                       initializers={"i": np.array([[0, 3, 1]], np.int64)})
    model.graph.node[0].input[:] = ["x", "i", "u"]
    with pytest.raises(UnsupportedOpError, match="out of range"):
        from_onnx(model)


def test_scatter_refuses_reduction_on_bool():
    x = np.array([True, False, True])
    model = make_model("ScatterElements", {"x": x, "u": np.array([True])}, {"reduction": "add"}, opset=18,
                       initializers={"i": np.array([1], np.int64)})
    model.graph.node[0].input[:] = ["x", "i", "u"]
    with pytest.raises(UnsupportedOpError, match="bool"):
        from_onnx(model)


@pytest.mark.parametrize("mode,axis,write", [("linear", -2, [1, 4]), ("circular", -2, [5, 3]),
                                             ("circular", 3, [3, 1])])
def test_tensor_scatter(onnx_compare, mode, axis, write):
    cache = _r(2, 3, 6, 4)
    upd = _r(2, 3, 2, 4) if axis == -2 else _r(2, 3, 6, 3)
    model = make_model("TensorScatter", {"c": cache, "u": upd}, {"mode": mode, "axis": axis}, opset=24,
                       initializers={"w": np.array(write, np.int64)})
    onnx_compare(model, {"c": cache, "u": upd})


def test_tensor_scatter_refuses_linear_overflow():
    model = make_model("TensorScatter", {"c": _r(1, 4, 2), "u": _r(1, 2, 2)}, {"axis": 1}, opset=24,
                       initializers={"w": np.array([3], np.int64)})
    with pytest.raises(UnsupportedOpError, match="past the cache"):
        from_onnx(model)


@pytest.mark.parametrize("image,block,attrs", [((5, 5), (2, 2), {}), ((6, 7), (3, 2), {"strides": [2, 1]}),
                                               ((5, 6), (2, 3), {"pads": [1, 0, 1, 2], "dilations": [2, 1]}),
                                               ((4, 4, 4), (2, 2, 2), {})])
def test_col2im(onnx_compare, image, block, attrs):
    nd = len(image)
    dil = attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * 2 * nd)
    st = attrs.get("strides", [1] * nd)
    nb = [(image[d] + pads[d] + pads[d + nd] - dil[d] * (block[d] - 1) - 1) // st[d] + 1 for d in range(nd)]
    x = _r(2, 3 * int(np.prod(block)), int(np.prod(nb)))
    model = make_model("Col2Im", {"x": x}, attrs, opset=18,
                       initializers={"image": np.array(image, np.int64), "block": np.array(block, np.int64)})
    onnx_compare(model, {"x": x}, rtol=1e-5, atol=1e-5)


def test_max_unpool_after_max_pool(onnx_compare):
    from fixtures.onnx_struct_compare import make_graph_model
    from onnx import helper

    x = _r(1, 2, 4, 6)
    model = make_graph_model([helper.make_node("MaxUnpool", ["v", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                             {"v": _r(1, 2, 2, 3)}, ["y"],
                             {"i": np.array([[[[0, 3, 5], [13, 15, 22]], [[24, 27, 28], [36, 38, 47]]]], np.int64)},
                             opset=11)
    del x
    v = _r(1, 2, 2, 3)
    onnx_compare(model, {"v": v})


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(onnx_compare, batch_axis, time_axis):
    shape = (5, 4, 3) if batch_axis == 1 else (4, 5, 3)
    x = _r(*shape)
    lens = np.array([5, 1, 3, 0][:shape[batch_axis]], np.int64)
    lens[lens == 0] = 2
    model = make_model("ReverseSequence", {"x": x}, {"batch_axis": batch_axis, "time_axis": time_axis}, opset=10,
                       initializers={"lens": lens})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("target,axes", [((3, 8), None), ((7, 2), None), ((6, 6), None), ((2,), [-1]),
                                         ((9,), [0])])
def test_center_crop_pad(onnx_compare, target, axes):
    x = _r(5, 4)
    attrs = {"axes": axes} if axes is not None else {}
    model = make_model("CenterCropPad", {"x": x}, attrs, opset=18, initializers={"s": np.array(target, np.int64)})
    onnx_compare(model, {"x": x})


@pytest.mark.parametrize("pads", [[1, 2, 0, 3], [0, 5, 2, 0], [3, 0, 4, 9]])
def test_pad_wrap(onnx_compare, pads):
    x = _r(3, 4)
    model = make_model("Pad", {"x": x}, {"mode": "wrap"}, opset=19, initializers={"p": np.array(pads, np.int64)})
    onnx_compare(model, {"x": x})


# ---- indices computed at run time ---------------------------------------------------------------------------
def _compiled(model, tmp_path):
    import tether
    from tether import graph_executor

    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target="host").export(str(tmp_path / "m"))
    return graph_executor.load(str(tmp_path / "m"))


def _against_ort(model, gm, feeds, rtol=1e-5, atol=1e-6):
    import onnxruntime as ort

    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    gm.run(**feeds)
    got = gm.get_output(0)
    assert got.dtype == ref[0].dtype and got.shape == ref[0].shape
    np.testing.assert_allclose(got, ref[0], rtol=rtol, atol=atol)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_scatter_elements_with_run_time_indices(reduction, axis, itype, tmp_path):
    x = _r(4, 5, 3)
    shape = list(x.shape)
    shape[axis] = 2 if reduction == "none" else 6      # with a reduction, duplicates too
    n = x.shape[axis]
    upd = _r(*shape)
    model = make_model("ScatterElements", {"x": x, "i": np.zeros(shape, itype), "u": upd},
                       {"axis": axis, "reduction": reduction}, opset=18)
    gm = _compiled(model, tmp_path)
    for seed in range(3):                                 # one build, other indices every run
        rng = np.random.default_rng(seed)
        if reduction == "none":       # distinct targets along the axis (see above), negative ones on seed 1
            keys = rng.random([n if d == axis % 3 else shape[d] for d in range(3)])
            idx = np.take(np.argsort(keys, axis=axis), [0, 1], axis=axis) - (n if seed == 1 else 0)
        else:
            idx = rng.integers(-n, n, shape)
        _against_ort(model, gm, {"x": x, "i": idx.astype(itype), "u": upd})


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
@pytest.mark.parametrize("ishape", [(3, 1), (2, 2), (4, 3)])
def test_scatter_nd_with_run_time_indices(reduction, ishape, tmp_path):
    x = _r(4, 3, 5)
    k = ishape[-1]
    upd = _r(*(ishape[:-1] + x.shape[k:]))
    model = make_model("ScatterND", {"x": x, "i": np.zeros(ishape, np.int64), "u": upd}, {"reduction": reduction},
                       opset=18)
    gm = _compiled(model, tmp_path)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        while True:
            cols = [rng.integers(-x.shape[j], x.shape[j], ishape[:-1]) for j in range(k)]
            idx = np.stack(cols, axis=-1).astype(np.int64)
            flat = np.ravel_multi_index(tuple((idx % np.array(x.shape[:k])).T), x.shape[:k])
            if reduction != "none" or len(set(flat.tolist())) == len(flat):
                break
        _against_ort(model, gm, {"x": x, "i": idx, "u": upd})


def test_scatter_of_computed_indices(tmp_path):
    """A model that computes its scatter positions (each row's ArgMax) and writes a one there: the indices never
    exist before the run."""
    x = _r(5, 7)
    from onnx import helper

    nodes = [helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=1),
             helper.make_node("ScatterElements", ["z", "am", "one"], ["y"], axis=1)]
    model = make_graph_model(nodes, {"x": x}, ["y"], initializers={"z": np.zeros((5, 7), np.float32),
                                                                    "one": np.ones((5, 1), np.float32)})
    gm = _compiled(model, tmp_path)
    for seed in range(2):
        _against_ort(model, gm, {"x": np.random.default_rng(seed).standard_normal((5, 7)).astype(np.float32)})


def test_run_time_indices_out_of_range_write_nothing(tmp_path):
    """onnxruntime raises on an index outside its dimension; tether's kernel cannot raise mid-run, so it skips
    that update (never writing another row's element, nor outside the output) and writes the others."""
    x = _r(3, 4)
    model = make_model("ScatterElements", {"x": x, "i": np.zeros((3, 2), np.int64), "u": _r(3, 2)}, {"axis": 1},
                       opset=18)
    gm = _compiled(model, tmp_path)
    upd = _r(3, 2)
    idx = np.array([[0, 9], [-9, 2], [3, 1 << 40]], np.int64)
    gm.run(x=x, i=idx, u=upd)
    want = x.copy()
    want[0, 0], want[1, 2], want[2, 3] = upd[0, 0], upd[1, 1], upd[2, 0]
    np.testing.assert_array_equal(gm.get_output(0), want)


def test_scatter_nd_run_time_tuples_out_of_range_write_nothing(tmp_path):
    x = _r(3, 4, 2)
    model = make_model("ScatterND", {"x": x, "i": np.zeros((4, 2), np.int64), "u": _r(4, 2)}, opset=18)
    gm = _compiled(model, tmp_path)
    upd = _r(4, 2)
    idx = np.array([[0, 5], [1, -1], [3, 0], [-4, 1]], np.int64)     # only (1, -1) is inside
    gm.run(x=x, i=idx, u=upd)
    want = x.copy()
    want[1, 3] = upd[1]
    np.testing.assert_array_equal(gm.get_output(0), want)


@pytest.mark.parametrize("shape,kernel,strides,pads", [((1, 2, 6, 8), [2, 2], [2, 2], [0, 0, 0, 0]),
                                                      ((2, 3, 7, 5), [3, 3], [2, 2], [1, 1, 1, 1]),
                                                      ((1, 4, 9), [3], [3], [0, 0])])
def test_max_unpool_of_a_max_pool_at_run_time(shape, kernel, strides, pads, tmp_path):
    """SegNet's pattern: MaxPool's indices, computed from the input, feed MaxUnpool; one build, several inputs."""
    from onnx import helper

    nodes = [helper.make_node("MaxPool", ["x"], ["v", "i"], kernel_shape=kernel, strides=strides, pads=pads),
             helper.make_node("MaxUnpool", ["v", "i"], ["y"], kernel_shape=kernel, strides=strides, pads=pads)]
    model = make_graph_model(nodes, {"x": _r(*shape)}, ["y"], opset=12)
    gm = _compiled(model, tmp_path)
    for seed in range(2):
        _against_ort(model, gm, {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)})


def test_max_unpool_run_time_indices_outside_the_output_write_nothing(tmp_path):
    model = make_model("MaxUnpool", {"v": _r(1, 1, 2, 2), "i": np.zeros((1, 1, 2, 2), np.int64)},
                       {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11)
    gm = _compiled(model, tmp_path)
    v = _r(1, 1, 2, 2)
    gm.run(v=v, i=np.array([[[[0, 16], [-1, 15]]]], np.int64))
    want = np.zeros((1, 1, 4, 4), np.float32)
    want.reshape(-1)[[0, 15]] = v.reshape(-1)[[0, 3]]
    np.testing.assert_array_equal(gm.get_output(0), want)


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence_with_run_time_lengths(batch_axis, time_axis, tmp_path):
    """The lengths an RNN model computes: one build, several length sets against onnxruntime; a length outside
    [0, T] (onnxruntime raises) reads as if clamped, never outside the input."""
    shape = [5, 3, 2] if time_axis == 0 else [3, 5, 2]
    x = _r(*shape)
    model = make_model("ReverseSequence", {"x": x, "lens": np.zeros(3, np.int64)},
                       {"batch_axis": batch_axis, "time_axis": time_axis}, opset=10)
    gm = _compiled(model, tmp_path)
    for lens in ([5, 1, 3], [0, 2, 5], [4, 4, 4]):
        _against_ort(model, gm, {"x": x, "lens": np.array(lens, np.int64)})
    import onnxruntime as ort

    gm.run(x=x, lens=np.array([9, -3, 2], np.int64))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "lens": np.array([5, 0, 2], np.int64)})[0]
    np.testing.assert_array_equal(gm.get_output(0), ref)


@pytest.mark.parametrize("mode,axis,writes", [("linear", -2, ([1, 4], [0, 0], [4, 3])),
                                              ("circular", -2, ([5, 3], [0, 5], [2, 2])),
                                              ("circular", 3, ([3, 1], [0, 3], [2, 0]))])
def test_tensor_scatter_with_run_time_write_indices(mode, axis, writes, tmp_path):
    """A KV cache's write positions as a graph input: one build, several position sets against onnxruntime; in
    linear mode a position past the cache (onnxruntime raises) writes nothing."""
    cache = _r(2, 3, 6, 4)
    upd = _r(2, 3, 2, 4) if axis == -2 else _r(2, 3, 6, 3)
    model = make_model("TensorScatter", {"c": cache, "u": upd, "w": np.zeros(2, np.int64)},
                       {"mode": mode, "axis": axis}, opset=24)
    gm = _compiled(model, tmp_path)
    for w in writes:
        _against_ort(model, gm, {"c": cache, "u": upd, "w": np.array(w, np.int64)})
    if mode == "linear":
        gm.run(c=cache, u=upd, w=np.array([5, -1], np.int64))
        want = cache.copy()
        want[0, :, 5] = upd[0, :, 0]          # (5, 6 past the end: only 5 lands); batch 1 at -1, 0: only 0 lands
        want[1, :, 0] = upd[1, :, 1]
        np.testing.assert_array_equal(gm.get_output(0), want)
