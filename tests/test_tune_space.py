"""Tuning configs: every op family's config space yields kernels that agree with numpy, the default
config is exactly the default schedule, and a config the schedules cannot take is refused by name."""
import random

import numpy as np
import pytest

import tether
from tether import ops, te
from tether.errors import ScheduleError
from tether.ops.schedules import family_of
from tether.target import Target
from tether.tune.space import config_key, space_for


def _conv_ref(x, w, stride, pad):
    c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((oc, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, ky: ky + (oh - 1) * stride + 1: stride, kx: kx + (ow - 1) * stride + 1: stride]
            out += np.einsum("chw,oc->ohw", patch, w[:, :, ky, kx])
    return out


def _case(kind, rng):
    """(placeholders, inputs, output tensor, numpy reference) of one kernel of the given family."""
    f = np.float32
    if kind == "matmul_packed":
        a, b = rng.standard_normal((37, 70)).astype(f), rng.standard_normal((70, 40)).astype(f)
        A, B = te.placeholder(a.shape, "float32", name="A"), te.placeholder(b.shape, "float32", name="B")
        return [A, B], [a, b], ops.relu(ops.matmul(A, B)), np.maximum(a @ b, 0)
    if kind == "matmul_plain":
        a, b = rng.standard_normal((9, 33)).astype(f), rng.standard_normal((33, 45)).astype(f)
        A, B = te.placeholder(a.shape, "float32", name="A"), te.placeholder(b.shape, "float32", name="B")
        return [A, B], [a, b], ops.matmul(A, B), a @ b
    if kind == "conv2d_pixels":
        x, w = rng.standard_normal((8, 15, 13)).astype(f), rng.standard_normal((20, 8, 3, 3)).astype(f)
        X = te.placeholder(x.shape, "float32", name="X")
        W = te.placeholder((20, 72), "float32", name="W")
        out = ops.conv2d_pixels(X, W, (3, 3), 2, 1)
        return [X, W], [x, w.reshape(20, 72)], out, _conv_ref(x, w, 2, 1).reshape(20, -1)
    if kind == "conv2d":
        x, w = rng.standard_normal((1, 6, 14, 19)).astype(f), rng.standard_normal((10, 6, 3, 3)).astype(f)
        X, W = te.placeholder(x.shape, "float32", name="X"), te.placeholder(w.shape, "float32", name="W")
        return [X, W], [x, w], ops.relu(ops.conv2d(X, W, padding=1)), np.maximum(_conv_ref(x[0], w, 1, 1), 0)[None]
    if kind == "depthwise":
        x, w = rng.standard_normal((1, 12, 17, 40)).astype(f), rng.standard_normal((12, 1, 3, 3)).astype(f)
        X, W = te.placeholder(x.shape, "float32", name="X"), te.placeholder(w.shape, "float32", name="W")
        ref = np.stack([_conv_ref(x[0, i:i + 1], w[i:i + 1], 1, 1)[0] for i in range(12)])[None]
        return [X, W], [x, w], ops.depthwise_conv2d(X, W, padding=1), ref
    if kind == "max_pool":
        x = rng.standard_normal((1, 16, 22, 22)).astype(f)
        X = te.placeholder(x.shape, "float32", name="X")
        ref = x.reshape(1, 16, 11, 2, 11, 2).max(axis=(3, 5))
        return [X], [x], ops.max_pool2d(X, (2, 2), 2), ref
    if kind == "elementwise":
        a, b = rng.standard_normal((3, 77, 101)).astype(f), rng.standard_normal((3, 77, 101)).astype(f)
        A, B = te.placeholder(a.shape, "float32", name="A"), te.placeholder(b.shape, "float32", name="B")
        return [A, B], [a, b], ops.relu(ops.add(ops.multiply(A, B), A)), np.maximum(a * b + a, 0)
    if kind == "reduce":
        a = rng.standard_normal((40, 33, 70)).astype(f)
        A = te.placeholder(a.shape, "float32", name="A")
        return [A], [a], ops.sum(A, (1,)), a.sum(axis=1)
    raise AssertionError(kind)


KINDS = ["matmul_packed", "matmul_plain", "conv2d_pixels", "conv2d", "depthwise", "max_pool", "elementwise",
         "reduce"]
EXPECTED_SPACE = {"matmul_packed": "matmul", "matmul_plain": "matmul", "conv2d_pixels": "conv2d_pixels",
                  "conv2d": "conv2d", "depthwise": "depthwise_conv2d", "max_pool": "pool", "elementwise": "elemwise",
                  "reduce": "reduce"}


@pytest.mark.parametrize("kind", KINDS)
def test_configs_compute_what_numpy_computes(kind, run_ops):
    rng = np.random.default_rng(0)
    ins, arrays, out, ref = _case(kind, rng)
    space = space_for(out, family_of(Target("host")))
    assert space.kind == EXPECTED_SPACE[kind]
    assert space.size > 4
    # the default point of the space is the default schedule, knob for knob
    args = ins + [out]
    assert str(tether.lower(ops.schedule([out], "host", config=space.default()), args, "k")) == \
        str(tether.lower(ops.schedule([out], "host"), args, "k"))
    pick = random.Random(kind)
    configs = [space.sample(pick) for _ in range(2)] + [{k: ch[i % len(ch)] for k, ch in space.knobs} for i in (1, -1)]
    irs = set()
    for cfg in configs:
        sch = ops.schedule([out], "host", config=cfg)
        irs.add(str(tether.lower(sch, args, "k")))
        (got,) = run_ops(list(zip(ins, arrays)), [out], schedule=sch)
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4, err_msg="config %s" % config_key(cfg))
    assert len(irs) > 1, "the knobs of %s change nothing in the loop nest" % space.kind


def test_unknown_or_invalid_knob_is_refused():
    A = te.placeholder((64, 64), "float32", name="A")
    out = ops.relu(A)
    with pytest.raises(ScheduleError, match="tile_size"):
        ops.schedule([out], "host", config={"tile_size": 4})
    with pytest.raises(ScheduleError, match="conv_order"):
        ops.schedule([out], "host", config={"conv_order": "diagonal"})
    with pytest.raises(ScheduleError, match="mm_rows"):
        ops.schedule([out], "host", config={"mm_rows": 0})


def test_neighbour_moves_one_knob_within_the_space():
    A = te.placeholder((37, 70), "float32", name="A")
    B = te.placeholder((70, 40), "float32", name="B")
    space = space_for(ops.matmul(A, B), family_of(Target("rasp4b")))
    pick = random.Random(1)
    cfg = space.default()
    choices = dict(space.knobs)
    for _ in range(50):
        nxt = space.neighbour(cfg, pick)
        assert sum(nxt[k] != cfg[k] for k in cfg) == 1
        assert all(nxt[k] in choices[k] for k in nxt)
        cfg = nxt


def test_docs_name_every_knob_and_option():
    import pathlib

    from tether.cli import tune_cmd
    from tether.ops.schedules import KNOBS

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "tune.md").read_text()
    missing = [k for k in KNOBS if "`%s`" % k not in doc]
    missing += [p.opts[0] for p in tune_cmd.command.params if p.opts[0].startswith("--") and p.opts[0] not in doc]
    assert not missing, "docs/tune.md does not mention: %s" % ", ".join(missing)


# ---------------------------------------------------------------------------------------------------------------
# conv2d_pixels' channel panel and the parallel axis: every value computes numpy's answer

def _pixels_conv(rng, width, groups=1, prepacked=True):
    """A conv2d_pixels kernel over weights in `width`-wide panels (packed ahead, or by the kernel)."""
    from tether.ops.linear import pack_panels_array

    ic, oc = 8, 20 if groups == 1 else 32
    x = rng.standard_normal((ic, 13, 13)).astype(np.float32)     # 49 pixels: a partial pixel block
    w = rng.standard_normal((oc, ic // groups, 3, 3)).astype(np.float32)
    flat = w.reshape(oc, -1)
    warr = pack_panels_array(flat, width) if prepacked else flat
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(warr.shape, "float32", name="W")
    out = ops.conv2d_pixels(X, W, (3, 3), 2, 1, out_channels=oc, groups=groups, panel=width)
    ig, og = ic // groups, oc // groups
    ref = np.concatenate([_conv_ref(x[g * ig:(g + 1) * ig], w[g * og:(g + 1) * og], 2, 1) for g in range(groups)])
    return [X, W], [x, warr], out, ref.reshape(oc, -1)


@pytest.mark.parametrize("width,axis,order,groups,prepacked", [
    (4, "rows", "panels", 1, True), (8, "cols", "pixels", 1, True), (32, "fused", "panels", 1, True),
    (8, "auto", "pixels", 1, False), (8, "cols", "panels", 4, True), (16, "rows", "pixels", 1, True),
    # the default fuses panels with pixel blocks when panels are few: a partial pixel block in every panel, which
    # loop partitioning once took for a tail at the end (wrong results, heap corruption)
    (16, "auto", "panels", 1, True)])
def test_conv_panel_and_parallel_axis_compute_what_numpy_computes(width, axis, order, groups, prepacked, run_ops):
    ins, arrays, out, ref = _pixels_conv(np.random.default_rng(width), width, groups, prepacked)
    space = dict(space_for(out, family_of(Target("host"))).knobs)
    assert space["conv_panel"][0] == width               # the kernel's own width is the space's default
    assert space["parallel_axis"][0] == "auto"
    # parallel_min 1: the small kernel runs its parallel loop (else the axis would not matter)
    cfg = {"conv_panel": width, "parallel_axis": axis, "conv_order": order, "parallel_min": 1}
    (got,) = run_ops(list(zip(ins, arrays)), [out], schedule=ops.schedule([out], "host", config=cfg))
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4, err_msg=config_key(cfg))


def test_conv_panel_choices_follow_the_packing():
    fam = family_of(Target("host"))
    _, _, packed_ahead, _ = _pixels_conv(np.random.default_rng(0), 16)
    assert dict(space_for(packed_ahead, fam).knobs)["conv_panel"] == \
        tuple(dict.fromkeys((16, fam.lanes, 2 * fam.lanes, 4 * fam.lanes)))
    # weights the kernel packs itself keep the kernel's width (the build cannot repack them)
    _, _, self_packed, _ = _pixels_conv(np.random.default_rng(0), 16, prepacked=False)
    assert dict(space_for(self_packed, fam).knobs)["conv_panel"] == (16,)
    # grouped: only widths dividing a group's 8 output channels
    _, _, grouped, _ = _pixels_conv(np.random.default_rng(0), 8, groups=4)
    assert all(8 % w == 0 for w in dict(space_for(grouped, fam).knobs)["conv_panel"])


@pytest.mark.parametrize("kind", ["matmul_packed", "matmul_plain", "batch_matmul"])
def test_matmul_parallel_axis_computes_what_numpy_computes(kind, run_ops):
    rng = np.random.default_rng(3)
    if kind == "batch_matmul":
        a, b = rng.standard_normal((3, 20, 24)).astype(np.float32), rng.standard_normal((3, 24, 40)).astype(np.float32)
        A, B = te.placeholder(a.shape, "float32", name="A"), te.placeholder(b.shape, "float32", name="B")
        ins, arrays, out, ref = [A, B], [a, b], ops.batch_matmul(A, B), a @ b
    else:
        ins, arrays, out, ref = _case(kind, rng)
    space = dict(space_for(out, family_of(Target("host"))).knobs)
    assert space["parallel_axis"] == ("auto", "rows", "fused")
    args = ins + [out]
    irs = set()
    for axis, direct in (("auto", True), ("rows", True), ("rows", False), ("cols", False), ("fused", True),
                         ("fused", False)):
        cfg = {"parallel_axis": axis, "direct_matmul": direct, "parallel_min": 1}
        sch = ops.schedule([out], "host", config=cfg)
        irs.add(str(tether.lower(ops.schedule([out], "host", config=cfg), args, "k")))   # (sch is consumed)
        (got,) = run_ops(list(zip(ins, arrays)), [out], schedule=sch)
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4, err_msg=config_key(cfg))
    assert len(irs) >= 3, "parallel_axis changes nothing in the loop nest"     # auto is cols


def test_invalid_panel_or_axis_is_refused():
    from tether.ops.linear import pack_panels_array

    _, _, out, _ = _pixels_conv(np.random.default_rng(0), 16)
    with pytest.raises(ScheduleError, match="conv_panel=8"):       # packed 16 wide: 8 would need a repacking
        ops.schedule([out], "host", config={"conv_panel": 8})
    for bad in ({"conv_panel": -1}, {"conv_panel": "wide"}, {"parallel_axis": "diagonal"}, {"parallel_axis": 1}):
        with pytest.raises(ScheduleError, match=next(iter(bad))):
            ops.schedule([out], "host", config=bad)
    with pytest.raises(ValueError, match="panel width"):
        pack_panels_array(np.zeros((4, 4), np.float32), 0)


def _two_conv_model():
    """x -> conv3x3(8->20) -> relu -> conv3x3(20->20) -> relu -> conv3x3(20->20) -> relu (the last two: one kernel)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    shapes = {"w1": (20, 8, 3, 3), "w2": (20, 20, 3, 3), "w3": (20, 20, 3, 3)}
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n) for n, s in shapes.items()]
    nodes = []
    prev = "x"
    for i in (1, 2, 3):
        nodes += [helper.make_node("Conv", [prev, "w%d" % i], ["c%d" % i], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["c%d" % i], ["r%d" % i])]
        prev = "r%d" % i
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 11, 11))],
                              [helper.make_tensor_value_info("r3", TensorProto.FLOAT, (1, 20, 11, 11))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def test_build_graph_packs_weights_with_the_tuned_panel_width(tmp_path):
    import onnxruntime as ort

    from tether import graph_executor, runtime
    from tether.frontend import from_onnx
    from tether.tune import log as tlog
    from tether.tune.tasks import KERNEL_NAME, extract_tasks

    model = _two_conv_model()
    graph, params = from_onnx(model)
    tasks = extract_tasks(graph, params, "host")
    convs = sorted((t for t in tasks if "conv2d_pixels" == t.space.kind), key=lambda t: t.weight)
    assert [t.weight for t in convs] == [1, 2]
    path = str(tmp_path / "tune.jsonl")
    chosen = {}
    with tlog.TuningLog(path) as out:
        for task, pick, axis in zip(convs, (1, -1), ("rows", "cols")):
            panels = dict(task.space.knobs)["conv_panel"]
            cfg = dict(task.space.default(), conv_panel=panels[pick], parallel_axis=axis, parallel_min=1)
            assert cfg["conv_panel"] != panels[0]
            chosen[task.key] = cfg
            out.write(task.record())
            out.write({"task": task.key, "target": tlog.target_id("host"), "config": cfg, "status": "ok",
                       "latency_s": 1e-3})
    # the tuner's path: the task lowered and fed in the config's layout gives the default layout's answer
    task = convs[0]
    got = {}
    for cfg in (task.space.default(), chosen[task.key]):
        so = str(tmp_path / ("k%d.so" % len(got)))
        task.build(cfg).export_library(so)
        arrays = task.inputs(config=cfg)
        res = np.zeros(task.args[-1][0], np.float32)
        runtime.load_module(so)[KERNEL_NAME](*arrays, res)
        got[len(got)] = res
    np.testing.assert_allclose(got[1], got[0], rtol=1e-4, atol=1e-4)

    tuned = tether.build_graph(graph, params, target="host", tuning_log=path)
    widths = sorted({int(tuned.params[w].shape[2]) for w in ("w1", "w2", "w3")})
    assert widths == sorted({chosen[t.key]["conv_panel"] for t in convs})
    assert int(tuned.params["w2"].shape[2]) == int(tuned.params["w3"].shape[2])   # one kernel, one layout
    x = np.random.default_rng(1).standard_normal((1, 8, 11, 11)).astype(np.float32)
    tuned.export(str(tmp_path / "tuned"))
    gm = graph_executor.load(str(tmp_path / "tuned"))
    gm.set_input("x", x)
    gm.run()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(gm.get_output(0), ref, rtol=1e-4, atol=1e-4)
