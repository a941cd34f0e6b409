"""Scalar loads across an unrolled loop taken from one vector (codegen/lane_groups.py): a dense kernel's A elements
on Arm become lanes of one load, multiplied by element (aarch64 fmla v.4s, v.4s, v.s[lane]), the same products as
the scalar loads; x86 keeps its broadcasts (armv7's instruction counts: tests/data/insn_counts.json). Shapes with
reduction tails and row counts the register block does not divide, on the emulated A72 and A7."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tether
from tether import ops, te
from tether.codegen import lane_groups
from tether.tir import Const, For, Load, Select, Store, Var, seq
from tether.tir.expr import const
from tether.tir.buffer import Buffer

RNG = np.random.default_rng(3)
SHAPES = [(7, 37, 20), (10, 64, 48), (1, 9, 16)]     # (m, k, n)


def _dense_lib(target: str, m: int, k: int, n: int):
    """x (m, k) @ W.T with W (n, k) in 16-wide panels (ops.linear.pack_panels_array), as build_graph runs it."""
    x = te.placeholder((m, k), "float32", name="x")
    panels = te.placeholder((-(-n // 16), k, 16), "float32", name="w")
    out = ops.linear.dense_prepacked(x, panels, n)
    s = ops.schedule([out], target)
    return tether.build([tether.lower(s, [x, panels, out], name="dense_%d_%d_%d" % (m, k, n))], target=target,
                        name="lanes", jobs=1)


def test_aarch64_multiplies_by_lane_and_x86_does_not():
    asm = _dense_lib("rasp4b", 10, 64, 48).get_source("asm")
    assert re.search(r"\bfmla\s+v\d+\.4s, v\d+\.4s, v\d+\.s\[3\]", asm)
    assert lane_groups.plan(tether.target.as_target("x86_64"), _unrolled_loop()) is None


def _unrolled_loop(select: bool = False, store_to_source: bool = False):
    """for v in 0..3 unrolled: out[v] = a[v] (or a select of it, or a store into a itself)."""
    a, out = Buffer("a", (8,), "float32"), Buffer("out", (8,), "float32")
    v = Var("v", "int32")
    value = Load(a, v)
    if select:
        value = Select(v < const(2, "int32"), value, const(0.0, "float32"))
    body = seq(Store(out, v, value), Store(a, v + const(4, "int32"), value) if store_to_source else None)
    return For(v, Const(0, "int32"), Const(4, "int32"), "unrolled", body, max_extent=4)


def test_groups_only_where_every_copy_loads_unconditionally_and_nothing_writes_the_source():
    arm = tether.target.as_target("rasp4b")
    assert lane_groups.plan(arm, _unrolled_loop()) is not None
    assert lane_groups.plan(arm, _unrolled_loop(select=True)) is None
    assert lane_groups.plan(arm, _unrolled_loop(store_to_source=True)) is None


@pytest.mark.emulated
@pytest.mark.parametrize("preset", ["rasp4b", "armv7-a7"])
def test_dense_by_lane_matches_numpy_on_emulated_arm(emulated_devices, preset, tmp_path):
    from tether import rpc

    device = emulated_devices.for_preset(preset)
    with rpc.connect(*device.address, timeout=300) as remote:
        for m, k, n in SHAPES:
            path = tmp_path / ("dense_%d_%d_%d.so" % (m, k, n))
            _dense_lib(preset, m, k, n).export_library(str(path))
            remote.upload(str(path))
            mod = remote.load_module(path.name)
            x = RNG.standard_normal((m, k)).astype(np.float32)
            w = RNG.standard_normal((n, k)).astype(np.float32)
            out = remote.empty((m, n), "float32")
            panels = ops.linear.pack_panels_array(w, 16)
            mod["dense_%d_%d_%d" % (m, k, n)](remote.array(x), remote.array(panels), out)
            np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4,
                                       atol=1e-4, err_msg=str((m, k, n)))
