"""What ops.schedule does to the loop nest (read from the lowered IR): fusion, vectorization, parallel loops."""
import pytest

import tether
from tether import ops, te


def _ir(outs, ins, target="host"):
    return str(tether.lower(ops.schedule(outs, target=target), ins + outs, "k"))


def test_elementwise_chain_is_one_loop_nest():
    n = 1 << 16
    A, B, C = (te.placeholder((n,), "float32", name=nm) for nm in "ABC")
    ir = _ir([ops.relu(ops.add(ops.multiply(A, B), C))], [A, B, C])
    assert "allocate" not in ir            # the multiply and add are inlined, no intermediate buffers
    assert "vectorized" in ir and "parallel" in ir


def test_matmul_has_vector_micro_kernel_and_parallel_panels():
    X = te.placeholder((192, 256), "float32", name="X")  # big enough to be worth a parallel launch
    W = te.placeholder((256, 128), "float32", name="W")
    ir = _ir([ops.matmul(X, W)], [X, W])
    assert "parallel" in ir and "vectorized" in ir and "unrolled" in ir
    assert "matmul_packed" in ir


def test_epilogue_is_fused_into_the_conv_write_back():
    x = te.placeholder((1, 16, 28, 28), "float32", name="x")
    w = te.placeholder((32, 16, 1, 1), "float32", name="w")
    b = te.placeholder((32,), "float32", name="b")
    y = ops.relu6(ops.conv2d(x, w, bias=b))
    ir = _ir([y], [x, w, b])
    # the conv accumulates in a small local block; no full-size conv output buffer exists
    assert "conv2d_conv: float32[25088]" not in ir
    assert "vectorized" in ir


def test_an_epilogue_that_reads_the_conv_twice_is_fused_into_its_write_back():
    """SiLU, x * sigmoid(x), reads the conv's result through two inlined ops that meet again in the output: still
    one epilogue of the conv's register block, not a full-size conv buffer read back by a second pass."""
    x = te.placeholder((1, 16, 28, 28), "float32", name="x")
    w = te.placeholder((32, 16, 3, 3), "float32", name="w")
    b = te.placeholder((32,), "float32", name="b")
    conv = ops.conv2d(x, w, bias=b, padding=1)
    ir = _ir([ops.multiply(conv, ops.sigmoid(conv))], [x, w, b])
    assert "float32[25088]" not in ir, ir


@pytest.mark.parametrize("channels", [3, 96])
def test_a_costly_epilogue_of_a_conv_runs_as_vectors_along_the_channels(channels):
    """A conv with SiLU (a stem 3 -> 32 with its short reduction, a 96 -> 32 3x3): the write-back computes the
    sigmoid on whole vectors along the block's channels, not per scalar result (unrolled) nor on 12-lane vectors
    along the pixels read across the block (which LLVM legalized element by element)."""
    x = te.placeholder((channels, 32, 32), "float32", name="x")
    w = te.placeholder((32, channels * 9), "float32", name="w")
    conv = ops.conv2d_pixels(x, w, (3, 3), 1, 1)
    ir = _ir([ops.multiply(conv, ops.sigmoid(conv))], [x, w])
    assert "i0.inner in range(16) vectorized" in ir and "i1.inner in range(12) vectorized" not in ir, ir


def test_matmul_columns_not_a_multiple_of_the_block_stay_vectors():
    """An attention's A @ V with 24-wide heads: the last 16-column tile is shifted back to end at column 24
    (overlapping the first), not run as a scalar tail."""
    a = te.placeholder((16, 256, 256), "float32", name="a")
    v = te.placeholder((16, 256, 24), "float32", name="v")
    ir = _ir([ops.batch_matmul(a, v)], [a, v])
    assert "vectorized" in ir and "range(min(" not in ir, ir     # (a tail loop of min(16, 24 - j) columns)


@pytest.mark.parametrize("target", ["rasp4b", "x86_64-linux-gnu -mattr=+avx2,+fma"])
def test_strided_loads_are_left_scalar(target):
    """(On AVX-512 they are gathers: test_ops_shape.py test_strided_transposes_load_with_gathers_on_avx512.)"""
    x = te.placeholder((64, 48), "float32", name="x")
    ir = _ir([ops.transpose(x)], [x], target=target)
    assert "vectorized" not in ir


@pytest.mark.parametrize("preset", ["host", "rasp4b", "rasp3b"])
def test_family_vector_width(preset):
    from tether.target import Target
    fam = ops.family_of(Target(preset))
    assert fam.lanes == Target(preset).vector_lanes(32)
    assert fam.mm_rows * (16 // fam.lanes) <= fam.acc_regs  # the matmul block fits the accumulator budget
