"""Tuning configs (issue 15): every op family's config space yields kernels that agree with numpy, the default
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
