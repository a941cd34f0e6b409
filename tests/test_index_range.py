"""Indices are 32-bit in tether's loop IR: a buffer with more elements than an int32 reaches is refused when the
module is built (where the shapes are known), with a message, instead of wrapping around at run time."""
from __future__ import annotations

import numpy as np
import pytest

import tether
from tether import te
from tether.errors import CompileError


def _scale(shape):
    A = te.placeholder(shape, "float32", name="A")
    B = te.compute(shape, lambda i, j: A[i, j] * 2.0, name="B")
    return te.create_schedule(B.op), [A, B]


def test_a_parameter_past_2_31_elements_is_refused_at_build():
    s, args = _scale((1 << 16, (1 << 15) + 1))            # 2**31 + 2**16 elements
    with pytest.raises(CompileError, match=r"'A' has 2147549184 elements .*2\*\*31 - 1.*split the tensor"):
        tether.build(s, args, target="x86_64", name="too_big")


def test_an_intermediate_past_2_31_elements_is_refused_at_build():
    A = te.placeholder((1 << 16,), "int8", name="A")
    T = te.compute((1 << 16, (1 << 15) + 1), lambda i, j: A[i] + 1, name="T")
    B = te.compute((1 << 16,), lambda i: T[i, 1 << 15], name="B")
    s = te.create_schedule(B.op)
    with pytest.raises(CompileError, match="'T' has 2147549184 elements"):
        tether.build(s, [A, B], target="x86_64", name="too_big_inner")


def test_the_largest_allowed_shape_still_builds_and_a_small_one_runs(tmp_path):
    s, args = _scale((1 << 16, (1 << 15) - 1))            # just under the limit: builds
    tether.build(s, args, target="x86_64", name="big_ok")
    s, args = _scale((3, 5))
    lib = tether.build(s, args, target="host", name="small")
    lib.export_library(str(tmp_path / "small.so"))
    from tether_rpc.module import load_module
    x = np.arange(15, dtype="float32").reshape(3, 5)
    out = np.empty_like(x)
    load_module(str(tmp_path / "small.so"))["small"](x, out)
    np.testing.assert_array_equal(out, x * 2)
