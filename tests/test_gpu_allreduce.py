"""Work-group tree reductions: a reduction axis bound to threadIdx (te/lower.py ``_allreduce``), and schedule_gpu
giving long reductions with few outputs (softmax rows, norm statistics, global pooling) one.

Hand schedules (sum, max, min, prod, an init value, int32, float16 storage, power-of-two and other block sizes,
strided and blocked splits, rows on threadIdx.y) run on pocl (OpenCL C), on lavapipe (SPIR-V, checked by
spirv-val first) and, as PTX's LLVM IR retargeted to this CPU, every thread a Python thread meeting at real
barriers; the PTX is assembled by ptxas. The op schedules run on pocl and lavapipe against numpy and their PTX
is assembled. Build-time refusals name the stage and the axis.
"""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

import tether
from tether import ops, te
from tether.codegen.opencl_c import opencl_source
from tether.codegen.ptx import ptx_module
from tether.codegen.spirv import spirv_module
from tether.errors import ScheduleError
from tether.ops.gpu_schedules import schedule_gpu
from tether.tir.device import Barrier
from tether.tir.device_split import split_host_device
from tether.tir.stmt import IfThenElse
from tether.tir.visit import walk
from tether.tune.space import gpu_space
from fixtures.gpu_kernels import open_opencl_device, open_vulkan_device, run_program
from fixtures.prereq import require_tool, unavailable
from fixtures.ptx import run_on_host

LIMITS = {"max_threads_per_block": 256, "max_shared_bytes": 16 * 1024}
RNG = np.random.default_rng(23)


@pytest.fixture(scope="module")
def cl():
    dev = open_opencl_device()
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def vk():
    dev = open_vulkan_device()
    yield dev
    dev.close()


def validate(code: bytes, tmp_path) -> None:
    spirv_val = require_tool("spirv-val", "apt-get install spirv-tools")
    path = tmp_path / "module.spv"
    path.write_bytes(code)
    done = subprocess.run([spirv_val, "--target-env", "vulkan1.1", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, "spirv-val refused the module:\n" + done.stdout + done.stderr


# ---- hand schedules ---------------------------------------------------------------------------------------------
def tree_reduce(kind: str, m: int, n: int, threads: int, dtype: str = "float32", out_dtype: str | None = None,
                blocked: bool = False, init=None):
    """C[i] = kind over k of A[i, k]: a work-group per row, ``threads`` threads each combining a strided part of
    the row (k = ko * threads + tx) or, ``blocked``, a contiguous one (k = tx * chunk + ki)."""
    a = te.placeholder((m, n), dtype, name="A")
    k = te.reduce_axis((0, n), name="k")
    fn = {"sum": te.sum, "max": te.max, "min": te.min, "prod": te.prod}[kind]
    src = (lambda i: a[i, k].astype(out_dtype)) if out_dtype else (lambda i: a[i, k])
    kw = {} if init is None else {"init": init}
    c = te.compute((m,), lambda i: fn(src(i), axis=k, **kw), name="C")
    s = te.create_schedule(c.op)
    if blocked:
        tx, _ = s[c].split(k, nparts=threads)
    else:
        ko, tx = s[c].split(k, factor=threads)
        s[c].reorder(c.op.axis[0], tx, ko)
    s[c].bind(c.op.axis[0], te.thread_axis("blockIdx.x"))
    s[c].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [a, c]


def reference(kind: str, a: np.ndarray, out_dtype: str | None = None, init=None) -> np.ndarray:
    x = a.astype(out_dtype) if out_dtype else a
    wide = x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64)
    r = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[kind](wide, axis=1)
    if init is not None:
        r = {"sum": r + init, "prod": r * init, "max": np.maximum(r, init), "min": np.minimum(r, init)}[kind]
    return r


def inputs(kind: str, m: int, n: int, dtype: str) -> np.ndarray:
    if dtype == "int32":
        return RNG.integers(-1000, 1000, (m, n)).astype(np.int32)
    if kind == "prod":      # near 1, so a product of hundreds stays finite
        return (1 + 0.01 * RNG.standard_normal((m, n))).astype(dtype)
    return RNG.standard_normal((m, n)).astype(dtype)


def check(got: np.ndarray, want: np.ndarray, exact: bool) -> None:
    if exact:
        np.testing.assert_array_equal(got, want.astype(got.dtype))
    else:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-5, atol=1e-4)


CASES = {   # name -> (kind, rows, length, threads, dtype, out dtype, blocked, init)
    "sum": ("sum", 3, 1000, 128, "float32", None, False, None),
    "sum_96_threads": ("sum", 3, 777, 96, "float32", None, False, None),     # neither a power of two
    "sum_blocked": ("sum", 2, 1000, 64, "float32", None, True, None),
    "sum_init": ("sum", 2, 300, 64, "float32", None, False, 5.0),
    "max": ("max", 3, 1000, 128, "float32", None, False, None),
    "min_odd": ("min", 2, 1001, 100, "float32", None, False, None),
    "prod": ("prod", 2, 300, 64, "float32", None, False, None),
    "max_init": ("max", 2, 200, 32, "float32", None, False, 3.0),
    "int32_sum": ("sum", 3, 999, 128, "int32", None, False, None),
    "int32_max": ("max", 2, 500, 60, "int32", None, False, None),
    "to_scalar": ("sum", 1, 5000, 256, "float32", None, False, None),
    "half_in_float_sum": ("sum", 2, 1000, 128, "float16", "float32", False, None),
}


def build(name: str):
    kind, m, n, threads, dtype, out_dtype, blocked, init = CASES[name]
    s, args = tree_reduce(kind, m, n, threads, dtype, out_dtype, blocked, init)
    prog = split_host_device(tether.lower(s, args, name), **LIMITS)
    a = inputs(kind, m, n, dtype)
    want = reference(kind, a, out_dtype, init)
    exact = dtype == "int32" or kind in ("max", "min")
    return prog, args, a, want, exact


def test_the_lowered_tree():
    """Partials in a register, one shared array of the block size, a halving tree whose every barrier sits
    outside the ``if tx < stride`` guards, and one thread storing the result."""
    s, args = tree_reduce("sum", 4, 1000, 96)
    func = tether.lower(s, args, "rs")
    text = str(func.body)
    assert "allocate C.red: float32[96]  # shared" in text and "allocate C.acc: float32[1]  # local" in text
    strides = [int(x) for x in re.findall(r"C\.red\[k\.inner \+ (\d+)\]", text)]
    assert strides == [48, 24, 12, 6, 3, 2, 1]          # 96 -> 48 -> 24 -> 12 -> 6 -> 3 -> 2 -> 1
    assert "if k.inner == 0:\n" in text and "C[i] = C.red[0]" in text
    for n in walk(func.body):
        if isinstance(n, IfThenElse):
            assert not any(isinstance(b, Barrier) for b in walk(n.then_case))
    prog = split_host_device(func)
    (kernel,) = prog.kernels
    assert kernel.grid == (4, 1, 1) and kernel.block == (96, 1, 1) and kernel.shared_bytes() == 96 * 4
    assert sum(isinstance(b, Barrier) for b in walk(kernel.body)) == 8


@pytest.mark.parametrize("name", list(CASES))
def test_opencl_on_pocl(name, cl):
    prog, args, a, want, exact = build(name)
    (got,) = run_program(cl, prog, opencl_source(prog.kernels).encode(), args, [a])
    check(got, want, exact)


@pytest.mark.parametrize("name", list(CASES))
def test_spirv_on_lavapipe(name, vk, tmp_path):
    prog, args, a, want, exact = build(name)
    code = spirv_module(prog.kernels)
    validate(code, tmp_path)
    (got,) = run_program(vk, prog, code, args, [a])
    check(got, want, exact)


@pytest.mark.parametrize("name", ["sum_96_threads", "min_odd", "int32_sum", "sum_init", "half_in_float_sum"])
def test_ptx_assembles_and_its_ir_runs_every_thread(name, ptxas):  # noqa: F811 -- the imported fixture
    prog, args, a, want, exact = build(name)
    ptxas(ptx_module(prog.kernels))
    (kernel,) = prog.kernels
    out = np.zeros(int(args[1].shape[0]), np.dtype(args[1].dtype))
    run_on_host(kernel, [np.ascontiguousarray(a).ravel(), out])
    check(out, want, exact)


def test_float16_tree_on_lavapipe(vk, tmp_path):
    """Half storage and half arithmetic (spirv_module fp16): the partials and the tree in float16. A max is exact
    in any order, so the result is numpy's bit for bit."""
    from tether_rpc.gpu.module import available_apis
    if not any(d.get("fp16") for d in available_apis()["vulkan"]):
        unavailable("a Vulkan device with shaderFloat16", "apt-get install mesa-vulkan-drivers (lavapipe has it)")
    s, args = tree_reduce("max", 3, 1000, 128, "float16")
    prog = split_host_device(tether.lower(s, args, "max16"), **LIMITS)
    assert prog.kernels[0].shared_bytes() == 128 * 2
    code = spirv_module(prog.kernels, fp16=True)
    validate(code, tmp_path)
    a = RNG.standard_normal((3, 1000)).astype(np.float16)
    (got,) = run_program(vk, prog, code, args, [a])
    np.testing.assert_array_equal(got, a.max(1))


def test_rows_on_threadidx_y(cl):
    """Four rows per work-group (threadIdx.y), each reduced by its own 64 threads in its own slice of the
    shared array."""
    m, n = 10, 300
    a_t = te.placeholder((m, n), name="A")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((m,), lambda i: te.sum(a_t[i, k], axis=k), name="C")
    s = te.create_schedule(c.op)
    bi, ti = s[c].split(c.op.axis[0], factor=4)
    ko, tx = s[c].split(k, factor=64)
    s[c].reorder(bi, ti, tx, ko)
    s[c].bind(bi, te.thread_axis("blockIdx.x"))
    s[c].bind(ti, te.thread_axis("threadIdx.y"))
    s[c].bind(tx, te.thread_axis("threadIdx.x"))
    prog = split_host_device(tether.lower(s, [a_t, c], "rows"), **LIMITS)
    assert prog.kernels[0].block == (64, 4, 1) and prog.kernels[0].shared_bytes() == 4 * 64 * 4
    a = RNG.standard_normal((m, n)).astype(np.float32)
    (got,) = run_program(cl, prog, opencl_source(prog.kernels).encode(), [a_t, c], [a])
    np.testing.assert_allclose(got, a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


# ---- refusals ---------------------------------------------------------------------------------------------------
def _rowsum(n=1000):
    a = te.placeholder((4, n), name="A")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((4,), lambda i: te.sum(a[i, k], axis=k), name="C")
    return te.create_schedule(c.op), a, c, k


def test_refusals_name_the_stage_and_the_axis():
    s, a, c, k = _rowsum()
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'k' is a reduction axis .*blockIdx\.x"):
        s[c].bind(k, te.thread_axis("blockIdx.x"))

    s, a, c, k = _rowsum()      # two reduction axes on threads: a two-level tree is not built
    ko, ki = s[c].split(k, factor=32)
    s[c].bind(ki, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'C': axis 'k\.outer' cannot be bound to threadIdx\.y, "
                                            r"reduction axis 'k\.inner' already is"):
        s[c].bind(ko, te.thread_axis("threadIdx.y"))

    s, a, c, k = _rowsum()      # the bound reduction loop inside a serial one
    ko, ki = s[c].split(k, factor=32)
    s[c].bind(c.op.axis[0], te.thread_axis("blockIdx.x"))
    s[c].bind(ki, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'C': reduction axis 'k\.inner' is bound to threadIdx\.x inside "
                                            r"loop 'k\.outer'"):
        tether.lower(s, [a, c], "bad")

    s, a, c, k = _rowsum(5000)  # more threads than a work-group may have
    ko, ki = s[c].split(k, factor=512)
    s[c].reorder(c.op.axis[0], ki, ko)
    s[c].bind(c.op.axis[0], te.thread_axis("blockIdx.x"))
    s[c].bind(ki, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'C': a work-group of 512 x 1 x 1 = 512 threads "
                                            r"\(k\.inner -> threadIdx\.x\) is over the limit of 256"):
        split_host_device(tether.lower(s, [a, c], "big"), **LIMITS)


def test_data_axis_inside_the_bound_reduction_is_refused():
    a = te.placeholder((4, 8, 300), name="A")
    k = te.reduce_axis((0, 300), name="k")
    c = te.compute((4, 8), lambda i, j: te.sum(a[i, j, k], axis=k), name="C")
    s = te.create_schedule(c.op)
    ko, ki = s[c].split(k, factor=64)
    s[c].reorder(c.op.axis[0], ki, ko, c.op.axis[1])
    s[c].bind(c.op.axis[0], te.thread_axis("blockIdx.x"))
    s[c].bind(ki, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match=r"stage 'C': data axis 'j' is inside the reduction axis 'k\.inner'"):
        tether.lower(s, [a, c], "bad")


# ---- schedule_gpu -------------------------------------------------------------------------------------------------
def P(shape, name):
    return te.placeholder(tuple(shape), "float32", name=name)


def _softmax_ref(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm_ref(a, g, b):
    a64 = a.astype(np.float64)
    return (a64 - a64.mean(1, keepdims=True)) / np.sqrt(a64.var(1, keepdims=True) + 1e-5) * g + b


def op_cases():
    """name -> (output, placeholders, inputs, numpy reference, how many kernels are trees)."""
    out = {}
    x = P((1, 4, 64, 128), "X")      # attention scores: 4 heads, 64 queries over 128 keys
    a = RNG.standard_normal((1, 4, 64, 128)).astype(np.float32) * 4
    out["softmax"] = (ops.softmax(x), [x], [a], _softmax_ref(a), 2)           # the row max and the row sum
    x, g, b = P((64, 768), "X"), P((768,), "G"), P((768,), "B")           # BERT-base tokens
    a, ga, ba = (RNG.standard_normal(s).astype(np.float32) for s in ((64, 768), (768,), (768,)))
    out["layer_norm"] = (ops.normalize(x, 1, 1e-5, g, b), [x, g, b], [a, ga, ba], _layer_norm_ref(a, ga, ba), 2)
    x = P((1, 120, 28, 28), "X")     # a mobilenet_v3 squeeze-excite's pool over a 28 x 28 map
    a = RNG.standard_normal((1, 120, 28, 28)).astype(np.float32)
    out["global_avg_pool"] = (ops.global_avg_pool2d(x), [x], [a], a.astype(np.float64).mean((2, 3), keepdims=True), 1)
    x = P((1, 1280, 7, 7), "X")      # mobilenet_v2's last pool: 49 elements per output, one thread each
    a = RNG.standard_normal((1, 1280, 7, 7)).astype(np.float32)
    out["global_avg_pool_7x7"] = (ops.global_avg_pool2d(x), [x], [a], a.astype(np.float64).mean((2, 3),
                                                                                               keepdims=True), 0)
    x = P((3, 2000), "X")            # a reduction to few elements
    a = RNG.standard_normal((3, 2000)).astype(np.float32)
    out["max_rows"] = (ops.max(x, (1,), True), [x], [a], a.max(1, keepdims=True), 1)
    return out


def op_program(name, config=None):
    outp, ins, arrays, want, trees = op_cases()[name]
    s = schedule_gpu([outp], limits=LIMITS, config=config)
    args = ins + [outp]
    prog = split_host_device(tether.lower(s, args, name), **LIMITS)
    return prog, args, arrays, want, trees


def _trees(prog) -> int:
    return sum(k.shared_bytes() > 0 for k in prog.kernels)


def _close(got, want):
    want = np.asarray(want, np.float64)
    err = np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= 1e-5, f"max relative error {err:.3g}"


OPS = ["softmax", "layer_norm", "global_avg_pool", "global_avg_pool_7x7", "max_rows"]


@pytest.mark.parametrize("name", OPS)
def test_ops_on_pocl(name, cl):
    prog, args, arrays, want, trees = op_program(name)
    assert _trees(prog) == trees
    (got,) = run_program(cl, prog, opencl_source(prog.kernels).encode(), args, arrays)
    _close(got, want)


@pytest.mark.parametrize("name", OPS)
def test_ops_on_lavapipe(name, vk, tmp_path):
    prog, args, arrays, want, trees = op_program(name)
    code = spirv_module(prog.kernels)
    validate(code, tmp_path)
    (got,) = run_program(vk, prog, code, args, arrays)
    _close(got, want)


@pytest.mark.parametrize("name", OPS)
def test_ops_ptx_assembles(name, ptxas):  # noqa: F811 -- the imported fixture
    prog, *_ = op_program(name)
    ptxas(ptx_module(prog.kernels))


def test_the_knob(cl):
    """reduce_threads is in gpu_space for kernels with a tree; 0 turns the tree off, 64 makes it narrower, and the
    results stay the same. An explicit value over the device's limit is refused."""
    outp, ins, arrays, want, _ = op_cases()["max_rows"]
    space = gpu_space(outp)
    assert dict(space.knobs)["reduce_threads"] == (256, 64, 128, 0)
    assert "reduce_threads" not in dict(gpu_space(op_cases()["global_avg_pool_7x7"][0]).knobs)
    for cfg, block in (({"reduce_threads": 0}, None), ({"reduce_threads": 64}, 64)):
        prog, args, arrays, want, _ = op_program("max_rows", cfg)
        assert _trees(prog) == (0 if block is None else 1)
        if block:
            assert prog.kernels[0].block == (block, 1, 1)
        (got,) = run_program(cl, prog, opencl_source(prog.kernels).encode(), args, arrays)
        _close(got, want)
    with pytest.raises(ScheduleError, match="reduce_threads=512 is over the device's 256 threads"):
        schedule_gpu([outp], limits=LIMITS, config={"reduce_threads": 512})
    with pytest.raises(ScheduleError, match="reduce_threads=-1 is not valid"):
        schedule_gpu([outp], limits=LIMITS, config={"reduce_threads": -1})


def test_int8_conv_with_few_outputs_is_a_tree_in_int32(cl, vk, tmp_path):
    """A 7 x 7 int8 convolution over a 7 x 7 map (a classifier head: 10 outputs of 64 x 49 products each),
    accumulated in int32 and requantized in the epilogue: one kernel, a tree per output, exact on both drivers."""
    from tether.ops import qnn
    from tether.ops.nary import elementwise
    rng = np.random.default_rng(4)
    x = te.placeholder((1, 64, 7, 7), "int8", name="X")
    w = te.placeholder((10, 64, 7, 7), "int8", name="W")
    mult = P((10, 1, 1), "M")
    zp = te.placeholder((1,), "int8", name="Z")
    xi = elementwise(lambda v: v.astype("int32"), [x], "xi")
    wi = elementwise(lambda v: v.astype("int32"), [w], "wi")
    out = qnn.requantize(ops.conv2d(xi, wi, 1, 0), mult, zp, "int8")
    ins = [x, w, mult, zp]
    arrays = [rng.integers(-128, 128, (1, 64, 7, 7)).astype(np.int8),
              rng.integers(-128, 128, (10, 64, 7, 7)).astype(np.int8), np.full((10, 1, 1), 2e-5, np.float32),
              np.array([3], np.int8)]
    args = ins + [out]
    prog = split_host_device(tether.lower(schedule_gpu([out], limits=LIMITS), args, "head"), **LIMITS)
    assert len(prog.kernels) == 1 and _trees(prog) == 1
    acc = np.einsum("chw,ochw->o", arrays[0][0].astype(np.int64), arrays[1].astype(np.int64)).reshape(1, 10, 1, 1)
    want = np.clip(np.round(acc.astype(np.float32) * np.float32(2e-5)) + 3, -128, 127).astype(np.int8)
    (got,) = run_program(cl, prog, opencl_source(prog.kernels).encode(), args, arrays)
    np.testing.assert_array_equal(got, want)
    code = spirv_module(prog.kernels)
    validate(code, tmp_path)
    (got,) = run_program(vk, prog, code, args, arrays)
    np.testing.assert_array_equal(got, want)
