"""SPIR-V for Vulkan (tether/codegen/spirv.py): hand-built device kernels, every module checked by spirv-val for
Vulkan 1.1, then run on Mesa's lavapipe through the device runtime's Vulkan API and compared with numpy computed
the way the CPU backend computes (floor division, truncating casts, the CPU's float16 rounding).
"""
from __future__ import annotations

import math
import subprocess
from typing import Callable, Dict, List, Sequence

import numpy as np
import pytest

import tether
from tether import runtime, te
from fixtures.gpu_kernels import (matmul_gpu, open_vulkan_device, rowsum_gpu, run_program, scale2d_gpu,
                                  shifted_exp_gpu, softmax_gpu, stencil_gpu, vadd_gpu)
from fixtures.prereq import require_tool
from tether.codegen.spirv import spirv_module
from tether.errors import CompileError
from tether.tir.buffer import Buffer
from tether.tir.device import Barrier, DeviceKernel
from tether.tir.device_split import split_host_device
from tether.tir.expr import Binary, Call, Cast, Compare, Const, Expr, Load, Not, PackedCall, Select, Var
from tether.tir.stmt import Allocate, For, IfThenElse, Store, seq

N = 256          # elements of the elementwise kernels: 4 work-groups of 64
BLOCK = 64
RNG = np.random.default_rng(7)


# ---- spirv-val ----------------------------------------------------------------------------------------------
def validate(code: bytes, tmp_path) -> None:
    spirv_val = require_tool("spirv-val", "apt-get install spirv-tools")
    path = tmp_path / "module.spv"
    path.write_bytes(code)
    done = subprocess.run([spirv_val, "--target-env", "vulkan1.1", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, "spirv-val refused the module:\n" + done.stdout + done.stderr


# ---- kernels ------------------------------------------------------------------------------------------------
class Case:
    """A kernel, its input arrays (by buffer name), its scalars, and the expected outputs (by buffer name)."""

    def __init__(self, kernel: DeviceKernel, inputs: Dict[str, np.ndarray], expected: Dict[str, np.ndarray],
                 scalars: Sequence[int] = (), rtol: float = 0.0, atol: float = 0.0):
        self.kernel, self.inputs, self.expected = kernel, inputs, expected
        self.scalars, self.rtol, self.atol = list(scalars), rtol, atol


def _threads():
    bx, tx = Var("bx"), Var("tx")
    return bx, tx, {bx: "blockIdx.x", tx: "threadIdx.x"}, bx * BLOCK + tx


def elementwise(name: str, in_dtypes: Sequence[str], out_dtype: str, fn: Callable[..., Expr], n: int = N):
    """A kernel writing ``out[i] = fn(in0[i], in1[i], ...)`` for i < n, one thread per element."""
    ins = [Buffer(f"in{k}", (n,), dt) for k, dt in enumerate(in_dtypes)]
    out = Buffer("out", (n,), out_dtype)
    _, _, thread_of, i = _threads()
    body = Store(out, i, fn(*[Load(b, i) for b in ins]))
    grid = ((n + BLOCK - 1) // BLOCK, 1, 1)
    return DeviceKernel(name, ins + [out], body, thread_of, grid, (BLOCK, 1, 1))


def ints(lo: int, hi: int, n: int = N, dtype=np.int32, nonzero: bool = False) -> np.ndarray:
    a = RNG.integers(lo, hi, n).astype(dtype)
    if nonzero:
        a[a == 0] = 1
    return a


def floats(lo: float, hi: float, n: int = N) -> np.ndarray:
    return RNG.uniform(lo, hi, n).astype(np.float32)


_INT_OPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide, "floormod": np.mod,
    "div": np.floor_divide, "min": np.minimum, "max": np.maximum, "bitand": np.bitwise_and, "bitor": np.bitwise_or,
    "bitxor": np.bitwise_xor, "shl": np.left_shift, "shr": np.right_shift,
}
_FLOAT_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "min": np.minimum,
              "max": np.maximum}
_COMPARES = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
             "ne": np.not_equal}


def binary_cases() -> List[Case]:
    cases = []
    for op, ref in _INT_OPS.items():
        shift = op in ("shl", "shr")
        a = ints(-1000, 1000)
        b = ints(0, 31) if shift else ints(-37, 37, nonzero=True)
        if op in ("floordiv", "floormod", "div"):     # every sign combination, exact multiples too
            a[:8] = [-7, 7, -7, 7, -6, 6, 0, -1]
            b[:8] = [2, -2, -2, 2, 3, -3, -5, 5]
        k = elementwise(f"i32_{op}", ["int32", "int32"], "int32", lambda x, y, op=op: Binary(op, x, y))
        cases.append(Case(k, {"in0": a, "in1": b}, {"out": ref(a, b).astype(np.int32)}))
    for op, ref in _FLOAT_OPS.items():
        a, b = floats(-10, 10), floats(-10, 10)
        b[np.abs(b) < 0.1] = 0.5
        k = elementwise(f"f32_{op}", ["float32", "float32"], "float32", lambda x, y, op=op: Binary(op, x, y))
        cases.append(Case(k, {"in0": a, "in1": b}, {"out": ref(a, b).astype(np.float32)}, rtol=1e-6))
    for dt, make in (("int32", lambda: ints(-5, 5)), ("float32", lambda: np.round(floats(-3, 3)))):
        for op, ref in _COMPARES.items():
            a, b = make(), make()
            k = elementwise(f"{dt}_cmp_{op}", [dt, dt], "int32",
                            lambda x, y, op=op: Cast("int32", Compare(op, x, y)))
            cases.append(Case(k, {"in0": a, "in1": b}, {"out": ref(a, b).astype(np.int32)}))
    return cases


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


_MATH = {   # name -> (numpy reference in float64, input range)
    "exp": (np.exp, (-20, 20)), "log": (np.log, (0.01, 100)), "sqrt": (np.sqrt, (0, 100)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 100)), "tanh": (np.tanh, (-6, 6)), "sigmoid": (_sigmoid, (-20, 20)),
    "erf": (np.vectorize(math.erf), (-5, 5)), "floor": (np.floor, (-10, 10)), "ceil": (np.ceil, (-10, 10)),
    "round_even": (np.round, (-10, 10)), "abs": (np.abs, (-10, 10)), "sin": (np.sin, (-3, 3)),
    "cos": (np.cos, (-3, 3)), "tan": (np.tan, (-1.2, 1.2)), "asin": (np.arcsin, (-1, 1)),
    "acos": (np.arccos, (-1, 1)), "atan": (np.arctan, (-10, 10)),
}


def math_cases() -> List[Case]:
    cases = []
    for name, (ref, (lo, hi)) in _MATH.items():
        x = floats(lo, hi)
        if name == "round_even":
            x[:4] = [0.5, 1.5, 2.5, -2.5]       # ties go to even
        if name in ("tanh", "erf"):
            x[:4] = [1e-4, -3e-3, 0.0, 0.62]     # the small-argument branch keeps relative precision
        k = elementwise(f"math_{name}", ["float32"], "float32", lambda v, name=name: Call(name, [v], "float32"))
        want = ref(x.astype(np.float64)).astype(np.float32)
        cases.append(Case(k, {"in0": x}, {"out": want}, rtol=1e-5, atol=1e-6))
    # log near 1, where a log with absolute precision (GLSL's) loses the relative one
    x = floats(0.999, 1.001)
    k = elementwise("math_log_near_one", ["float32"], "float32", lambda v: Call("log", [v], "float32"))
    cases.append(Case(k, {"in0": x}, {"out": np.log(x.astype(np.float64)).astype(np.float32)}, rtol=1e-5))
    # pow: positive bases, and negative bases with integer exponents (sign from odd exponents)
    x, y = floats(0.1, 4), floats(-3, 3)
    x[:6], y[:6] = [-2, -2, -3, 0, 1, 5], [3, 2, -1, 2, 7.5, 0]
    k = elementwise("math_pow", ["float32", "float32"], "float32", lambda a, b: Call("pow", [a, b], "float32"))
    want = np.power(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)
    cases.append(Case(k, {"in0": x, "in1": y}, {"out": want}, rtol=1e-5, atol=1e-6))
    # dot4: four byte products of two int32s, bytes read unsigned or signed
    a, b = ints(-2**31, 2**31 - 1), ints(-2**31, 2**31 - 1)
    for kind in ("u8s8", "s8s8", "u8u8"):
        k = elementwise(f"dot4_{kind}", ["int32", "int32"], "int32",
                        lambda x, y, kind=kind: Call("dot4_" + kind, [x, y], "int32"))
        ab = a.view(np.uint8 if kind[0] == "u" else np.int8).reshape(N, 4).astype(np.int32)
        bb = b.view(np.uint8 if kind[2] == "u" else np.int8).reshape(N, 4).astype(np.int32)
        cases.append(Case(k, {"in0": a, "in1": b}, {"out": (ab * bb).sum(axis=1).astype(np.int32)}))
    # int abs
    a = ints(-100, 100)
    k = elementwise("math_iabs", ["int32"], "int32", lambda v: Call("abs", [v], "int32"))
    cases.append(Case(k, {"in0": a}, {"out": np.abs(a)}))
    return cases


def cast_cases() -> List[Case]:
    f = floats(-100, 100)
    i = ints(-300, 300)
    cases = [
        Case(elementwise("cast_f32_i32", ["float32"], "int32", lambda v: Cast("int32", v)),
             {"in0": f}, {"out": np.trunc(f).astype(np.int32)}),
        Case(elementwise("cast_i32_f32", ["int32"], "float32", lambda v: Cast("float32", v)),
             {"in0": i}, {"out": i.astype(np.float32)}),
        Case(elementwise("cast_i32_i8", ["int32"], "int8", lambda v: Cast("int8", v)),
             {"in0": i}, {"out": i.astype(np.int8)}),
        Case(elementwise("cast_u8_i32", ["uint8"], "int32", lambda v: Cast("int32", v) - 1),
             {"in0": ints(0, 256, dtype=np.uint8)}, {}),
        Case(elementwise("cast_i8_f32", ["int8"], "float32", lambda v: Cast("float32", v)),
             {"in0": ints(-128, 128, dtype=np.int8)}, {}),
        Case(elementwise("cast_f32_f16", ["float32"], "float16", lambda v: Cast("float16", v) * Const(3.0, "float16")),
             {"in0": f}, {}),
        Case(elementwise("cast_i32_bool", ["int32"], "bool", lambda v: Cast("bool", v)),
             {"in0": ints(-2, 3)}, {}),
        Case(elementwise("cast_bool_f32", ["bool"], "float32", lambda v: Cast("float32", v) + Const(0.5, "float32")),
             {"in0": ints(0, 2, dtype=np.uint8).astype(bool)}, {}),
        Case(elementwise("cast_f32_u32", ["float32"], "uint32", lambda v: Cast("uint32", v)),
             {"in0": floats(0, 1000)}, {}),
        Case(elementwise("cast_u32_i16", ["uint32"], "int16", lambda v: Cast("int16", v)),
             {"in0": ints(0, 70000, dtype=np.uint32)}, {}),
    ]
    refs = {"cast_u8_i32": lambda a: a.astype(np.int32) - 1, "cast_i8_f32": lambda a: a.astype(np.float32),
            # float16 is computed as float32, rounded to half where it is cast to or stored
            "cast_f32_f16": lambda a: (a.astype(np.float16).astype(np.float32) * 3).astype(np.float16),
            "cast_i32_bool": lambda a: a != 0, "cast_bool_f32": lambda a: a.astype(np.float32) + 0.5,
            "cast_f32_u32": lambda a: np.trunc(a).astype(np.uint32), "cast_u32_i16": lambda a: a.astype(np.int16)}
    for c in cases:
        if not c.expected:
            c.expected = {"out": refs[c.kernel.name](c.inputs["in0"])}
    return cases


def matmul_case() -> Case:
    """Nested serial loops with a local accumulator: C[i, j] = sum_k A[i, k] * B[k, j] over rows i, per column
    thread j; an unrolled loop with a nonzero start inside a serial one."""
    m, kk, n = 8, 12, 64
    A, B, C = Buffer("A", (m, kk), "float32"), Buffer("B", (kk, n), "float32"), Buffer("C", (m, n), "float32")
    acc = Buffer("acc", (1,), "float32", scope="local")
    tx = Var("tx")
    i, k = Var("i"), Var("k")
    zero = Const(0, "int32")
    inner = seq(Store(acc, zero, Const(0.0, "float32")),
                For(k, Const(1, "int32"), Const(kk - 1, "int32"), "unrolled",
                    Store(acc, zero, Load(acc, zero) + Load(A, i * kk + k) * Load(B, k * n + tx))),
                Store(C, i * n + tx, Load(acc, zero) + Load(A, i * kk) * Load(B, tx)))
    body = Allocate(acc, For(i, zero, Const(m, "int32"), "serial", inner))
    kern = DeviceKernel("matmul", [A, B, C], body, {tx: "threadIdx.x"}, (1, 1, 1), (n, 1, 1))
    a, b = floats(-1, 1, m * kk), floats(-1, 1, kk * n)
    want = (a.reshape(m, kk).astype(np.float64) @ b.reshape(kk, n)).astype(np.float32).ravel()
    return Case(kern, {"A": a, "B": b}, {"C": want}, rtol=1e-5, atol=1e-6)


def reduction_case() -> Case:
    """Each work-group sums its 64 elements in shared memory: a tree of halving steps, a barrier after each."""
    groups = 8
    X, S = Buffer("X", (groups * BLOCK,), "float32"), Buffer("S", (groups,), "int32")
    sh = Buffer("sh", (BLOCK,), "float32", scope="shared")
    bx, tx, thread_of, i = _threads()
    step = Var("step")
    stride = Binary("shr", Const(BLOCK // 2, "int32"), step)
    tree = For(step, Const(0, "int32"), Const(6, "int32"), "serial", seq(
        IfThenElse(tx < stride, Store(sh, tx, Load(sh, tx) + Load(sh, tx + stride))),
        Barrier()))
    body = Allocate(sh, seq(Store(sh, tx, Load(X, i)), Barrier(), tree,
                            IfThenElse(Compare("eq", tx, Const(0, "int32")),
                                       Store(S, bx, Cast("int32", Load(sh, Const(0, "int32")))))))
    kern = DeviceKernel("shared_sum", [X, S], body, thread_of, (groups, 1, 1), (BLOCK, 1, 1))
    x = ints(-50, 50, groups * BLOCK).astype(np.float32)     # integral values: the sum is exact in any order
    return Case(kern, {"X": x}, {"S": x.reshape(groups, BLOCK).sum(axis=1).astype(np.int32)})


def scalars_case() -> Case:
    """Push constants: out[i] = a[i] * alpha + beta for i < n (n below the launch, so the guard matters)."""
    A, OUT = Buffer("A", (N,), "int32"), Buffer("OUT", (N,), "int32")
    n, alpha, beta = Var("n"), Var("alpha"), Var("beta")
    _, _, thread_of, i = _threads()
    body = IfThenElse(i < n, Store(OUT, i, Load(A, i) * alpha + beta), Store(OUT, i, Const(-1, "int32")))
    kern = DeviceKernel("axpb", [A, OUT], body, thread_of, (N // BLOCK, 1, 1), (BLOCK, 1, 1), scalars=[n, alpha, beta])
    a = ints(-1000, 1000)
    want = a * 3 - 17
    want[200:] = -1
    return Case(kern, {"A": a}, {"OUT": want.astype(np.int32)}, scalars=[200, 3, -17])


def select_case() -> Case:
    """A select whose arm reads out of bounds where it is not chosen (evaluated lazily), and logic ops."""
    A, OUT = Buffer("A", (N,), "float32"), Buffer("OUT", (N,), "float32")
    _, _, thread_of, i = _threads()
    zero = Const(0, "int32")
    cond = Binary("and", Compare("gt", i, zero), Not(Compare("eq", Binary("floormod", i, Const(7, "int32")), zero)),
                  "bool")
    body = Store(OUT, i, Select(cond, Load(A, i - 1), Select(Compare("lt", Load(A, i), Const(0.0, "float32")),
                                                              Const(-1.0, "float32"), Const(1.0, "float32"))))
    kern = DeviceKernel("shift_select", [A, OUT], body, thread_of, (N // BLOCK, 1, 1), (BLOCK, 1, 1))
    a = floats(-5, 5)
    idx = np.arange(N)
    prev = np.concatenate([[0], a[:-1]]).astype(np.float32)
    want = np.where((idx > 0) & (idx % 7 != 0), prev, np.where(a < 0, -1.0, 1.0)).astype(np.float32)
    return Case(kern, {"A": a}, {"OUT": want})


def half_int8_case() -> Case:
    """float16 and int8 buffers: a kernel that needs "fp16" and "int8" from the device."""
    H, Q, OUT = Buffer("H", (N,), "float16"), Buffer("Q", (N,), "int8"), Buffer("OUT", (N,), "float16")
    _, _, thread_of, i = _threads()
    body = Store(OUT, i, Load(H, i) * Cast("float16", Load(Q, i)) + Const(0.1, "float16"))
    kern = DeviceKernel("half_int8", [H, Q, OUT], body, thread_of, (N // BLOCK, 1, 1), (BLOCK, 1, 1))
    h, q = floats(-4, 4).astype(np.float16), ints(-100, 100, dtype=np.int8)
    want = (h.astype(np.float32) * q.astype(np.float32) + np.float32(np.float16(0.1))).astype(np.float16)
    return Case(kern, {"H": h, "Q": q}, {"OUT": want}, rtol=1e-3)


def special_value_cases() -> List[Case]:
    """NaN, infinities, zeros and negatives where GLSL leaves results undefined: the CPU's answers."""
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0, 1e-30, 100.0, -100.0], np.float32)
    a = np.resize(specials, N)
    b = np.resize(specials[::-1], N)
    with np.errstate(all="ignore"):
        refs = {    # min/max: the CPU's select(a < b, a, b), so a NaN in a gives b
            "min": (lambda x, y: Binary("min", x, y), np.where(a < b, a, b)),
            "max": (lambda x, y: Binary("max", x, y), np.where(a > b, a, b)),
            "ne": (lambda x, y: Cast("float32", Compare("ne", x, y)), (a != b).astype(np.float32)),
            "eq": (lambda x, y: Cast("float32", Compare("eq", x, y)), (a == b).astype(np.float32)),
            "lt": (lambda x, y: Cast("float32", Compare("lt", x, y)), (a < b).astype(np.float32)),
            "log": (lambda x, y: Call("log", [x], "float32"), np.log(a)),
            "sqrt": (lambda x, y: Call("sqrt", [x], "float32"), np.sqrt(a)),
            "exp": (lambda x, y: Call("exp", [x], "float32"), np.exp(a)),
            "tanh": (lambda x, y: Call("tanh", [x], "float32"), np.tanh(a)),
            "sigmoid": (lambda x, y: Call("sigmoid", [x], "float32"), _sigmoid(a).astype(np.float32)),
            "erf": (lambda x, y: Call("erf", [x], "float32"),
                    np.array([math.erf(v) for v in a.astype(np.float64)], np.float32)),
        }
    cases = []
    for name, (fn, want) in refs.items():
        k = elementwise(f"special_{name}", ["float32", "float32"], "float32", fn)
        # atol: below float32's normal range, since Vulkan lets a device flush subnormal results to zero
        cases.append(Case(k, {"in0": a, "in1": b}, {"out": want.astype(np.float32)}, rtol=1e-6, atol=1.2e-38))
    return cases


def narrow_and_wide_int_cases() -> List[Case]:
    """int8 arithmetic wraps at 8 bits; uint32 divides, shifts and compares without sign; int64 and float64."""
    a8, b8 = ints(-128, 128, dtype=np.int8), ints(-128, 128, dtype=np.int8)
    au, bu = ints(0, 2**32, dtype=np.uint32), ints(1, 2**16, dtype=np.uint32)
    a64 = ints(-2**40, 2**40, dtype=np.int64)
    f64 = RNG.uniform(0, 100, N)
    return [
        Case(elementwise("i8_add_mul", ["int8", "int8"], "int8", lambda x, y: x * y + x),
             {"in0": a8, "in1": b8}, {"out": (a8 * b8 + a8).astype(np.int8)}),
        Case(elementwise("u32_floordiv", ["uint32", "uint32"], "uint32", lambda x, y: Binary("floordiv", x, y)),
             {"in0": au, "in1": bu}, {"out": au // bu}),
        Case(elementwise("u32_floormod", ["uint32", "uint32"], "uint32", lambda x, y: Binary("floormod", x, y)),
             {"in0": au, "in1": bu}, {"out": au % bu}),
        Case(elementwise("u32_shr", ["uint32", "uint32"], "uint32", lambda x, y: Binary("shr", x, y % 32)),
             {"in0": au, "in1": bu}, {"out": au >> (bu % 32)}),
        Case(elementwise("u32_lt", ["uint32", "uint32"], "int32", lambda x, y: Cast("int32", x < y)),
             {"in0": au, "in1": bu * 40000}, {"out": (au < bu * 40000).astype(np.int32)}),
        Case(elementwise("i64_mul_add", ["int64"], "int64", lambda x: x * Const(3, "int64") + Const(2**40, "int64")),
             {"in0": a64}, {"out": a64 * 3 + 2**40}),
        Case(elementwise("f64_sqrt_div", ["float64"], "float64",
                         lambda x: Call("sqrt", [x], "float64") / Const(3.0, "float64")),
             {"in0": f64}, {"out": np.sqrt(f64) / 3.0}, rtol=1e-15),
    ]


def transpose_case() -> Case:
    """Two launch dimensions: blockIdx.x/y and threadIdx.x/y (a 16 x 16 transpose in 8 x 8 tiles)."""
    n = 16
    X, Y = Buffer("X", (n, n), "float32"), Buffer("Y", (n, n), "float32")
    bx, by, tx, ty = Var("bx"), Var("by"), Var("tx"), Var("ty")
    row, col = by * 8 + ty, bx * 8 + tx
    body = Store(Y, col * n + row, Load(X, row * n + col))
    kern = DeviceKernel("transpose", [X, Y], body, {bx: "blockIdx.x", by: "blockIdx.y", tx: "threadIdx.x",
                                                    ty: "threadIdx.y"}, (2, 2, 1), (8, 8, 1))
    x = floats(-1, 1, n * n)
    return Case(kern, {"X": x}, {"Y": x.reshape(n, n).T.ravel()})


def scratch_types_case() -> Case:
    """bool, int8 and float16 in shared and local arrays: each thread writes its own element, reads its neighbour's
    after a barrier (float16 rounds on store there too)."""
    X, OUT = Buffer("X", (N,), "float32"), Buffer("OUT", (N,), "float32")
    flags, bytes_, halves = (Buffer(n, (BLOCK,), dt, scope="shared") for n, dt in
                             (("flags", "bool"), ("bytes", "int8"), ("halves", "float16")))
    mine = Buffer("mine", (2,), "float16", scope="local")
    _, tx, thread_of, i = _threads()
    x = Load(X, i)
    zero, one = Const(0, "int32"), Const(1, "int32")
    nb = Binary("floormod", tx + 1, Const(BLOCK, "int32"))
    body = Allocate(flags, Allocate(bytes_, Allocate(halves, Allocate(mine, seq(
        Store(flags, tx, Compare("gt", x, Const(0.0, "float32"))),
        Store(bytes_, tx, Cast("int8", Cast("int32", x * Const(20.0, "float32")))),
        Store(mine, zero, Cast("float16", x)),
        Store(mine, one, Load(mine, zero) * Const(3.0, "float16")),
        Store(halves, tx, Load(mine, one)),
        Barrier(),
        Store(OUT, i, Select(Load(flags, nb), Cast("float32", Load(halves, nb)),
                             Cast("float32", Load(bytes_, nb)))))))))
    kern = DeviceKernel("scratch_types", [X, OUT], body, thread_of, (N // BLOCK, 1, 1), (BLOCK, 1, 1))
    x = floats(-3, 3)
    nbr = (np.arange(N) // BLOCK) * BLOCK + (np.arange(N) % BLOCK + 1) % BLOCK
    xs = x[nbr]
    half = (xs.astype(np.float16).astype(np.float32) * 3).astype(np.float16).astype(np.float32)
    byte = np.trunc(xs * 20).astype(np.int32).astype(np.int8).astype(np.float32)
    return Case(kern, {"X": x}, {"OUT": np.where(xs > 0, half, byte).astype(np.float32)})


def all_cases() -> List[Case]:
    return (binary_cases() + math_cases() + cast_cases()
            + special_value_cases() + narrow_and_wide_int_cases()
            + [matmul_case(), reduction_case(), scalars_case(), select_case(), half_int8_case(), transpose_case(),
               scratch_types_case()])


CASES = all_cases()
IDS = [c.kernel.name for c in CASES]


# ---- validation -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_each_kernel_validates(case: Case, tmp_path):
    validate(spirv_module([case.kernel]), tmp_path)


def test_one_module_holds_every_kernel(tmp_path):
    kernels = [c.kernel for c in all_cases()]
    code = spirv_module(kernels)
    assert code[:4] == b"\x03\x02\x23\x07"          # the magic number, little-endian
    validate(code, tmp_path)
    dis = subprocess.run([require_tool("spirv-dis", "apt-get install spirv-tools"), "-"], input=code,
                         capture_output=True, timeout=120)
    text = dis.stdout.decode()
    for k in kernels:
        assert f'OpEntryPoint GLCompute %{k.name} "{k.name}"' in text or f'"{k.name}"' in text


def test_needs_name_the_narrow_types():
    plain = elementwise("plain", ["float32"], "float32", lambda v: v + Const(1.0, "float32"))
    half = half_int8_case().kernel
    code = spirv_module([plain])
    assert plain.needs == frozenset()
    assert b"SPV_KHR_8bit_storage" not in code
    code = spirv_module([half])
    assert {"fp16", "int8"} <= half.needs
    assert b"SPV_KHR_8bit_storage" in code


@pytest.mark.parametrize("build, words", [
    (lambda: elementwise("k", ["float32"], "float32", lambda v: Call("lgamma", [v], "float32")), "lgamma"),
    (lambda: elementwise("k", ["float32"], "float32", lambda v: PackedCall("host_fn", [v], "float32")),
     "PackedCall"),
    (lambda: elementwise("k", ["float64"], "float64", lambda v: Call("exp", [v], "float64")), "float64"),
    (lambda: elementwise("k", ["bfloat16"], "float32", lambda v: Cast("float32", v)), "bfloat16"),
])
def test_untranslatable_code_is_refused_by_name(build, words):
    with pytest.raises(CompileError, match=words):
        spirv_module([build()])


def test_refusals_for_bad_kernels():
    k = elementwise("same", ["float32"], "float32", lambda v: v)
    k2 = elementwise("same", ["float32"], "float32", lambda v: v)
    with pytest.raises(CompileError, match="two kernels are named 'same'"):
        spirv_module([k, k2])
    X = Buffer("X", (4,), "int32")
    t = Var("t")
    loop = For(t, Const(0, "int32"), Const(4, "int32"), "thread", Store(X, t, t))
    loop.thread_tag = "threadIdx.x"
    with pytest.raises(CompileError, match="thread loop"):
        spirv_module([DeviceKernel("th", [X], loop, {}, (1, 1, 1), (4, 1, 1))])


# ---- running on lavapipe --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vulkan():
    dev = open_vulkan_device()
    yield dev
    dev.close()


def run_case(dev, case: Case) -> Dict[str, np.ndarray]:
    k = case.kernel
    code = spirv_module([k])
    program = dev.load(code, [k.launch_info()])
    args, outs = [], {}
    for b in k.params:
        dtype = np.dtype(b.dtype)
        host = case.inputs.get(b.name)
        if host is None:        # an output: pre-filled with a pattern the kernel must overwrite
            host = np.full(b.size, 99, dtype=dtype)
            outs[b.name] = host
        assert host.dtype == dtype and host.size == b.size, b.name
        buf = dev.alloc(host.nbytes)
        dev.upload(buf, np.ascontiguousarray(host))
        args.append(buf)
    try:
        dev.launch(program, k.name, args + list(case.scalars), k.grid, k.block)
        dev.synchronize()
        got = {}
        for b, buf in zip(k.params, args):
            if b.name in outs:
                out = np.empty(b.size, dtype=np.dtype(b.dtype))
                dev.download(buf, out)
                got[b.name] = out
        return got
    finally:
        for buf in args:
            dev.free(buf)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernel_runs_on_lavapipe(case: Case, vulkan):
    got = run_case(vulkan, case)
    for name, want in case.expected.items():
        have = got[name]
        if case.rtol or case.atol:
            np.testing.assert_allclose(have.astype(np.float64), want.astype(np.float64), rtol=case.rtol,
                                       atol=case.atol, err_msg=f"{case.kernel.name}: {name}")
        else:
            np.testing.assert_array_equal(have, want, err_msg=f"{case.kernel.name}: {name}")


# ---- lowered schedules end to end: te -> lower -> split_host_device -> SPIR-V -> lavapipe ----------------------
def _schedules():
    def softmax_ref(a):
        e = np.exp(a - a.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    a70, b70 = RNG.standard_normal((50, 70)).astype(np.float32), RNG.standard_normal((70, 40)).astype(np.float32)
    v1, v2 = RNG.standard_normal(1000).astype(np.float32), RNG.standard_normal(1000).astype(np.float32)
    s2 = RNG.standard_normal((40, 70)).astype(np.float32)
    st = RNG.standard_normal(257).astype(np.float32)
    r = RNG.standard_normal((100, 37)).astype(np.float32)
    return {   # name -> (schedule builder, inputs, numpy reference, atol)
        "vadd": (lambda: vadd_gpu(1000, block=64), [v1, v2], v1 + v2, 0),
        "scale2d": (lambda: scale2d_gpu(40, 70, th=8, tw=16), [s2], s2 * 2 + 1, 0),
        "matmul": (lambda: matmul_gpu(50, 40, 70), [a70, b70], a70 @ b70, 1e-4),
        "matmul_local": (lambda: matmul_gpu(50, 40, 70, ktile=8, cache_local=True), [a70, b70], a70 @ b70, 1e-4),
        "stencil": (lambda: stencil_gpu(256), [st], st[:-1] + st[1:], 0),
        "rowsum": (lambda: rowsum_gpu(100, 37), [r], r.sum(1), 1e-5),
        "shexp": (lambda: shifted_exp_gpu(100, 37), [r], np.exp(r - r.max(1, keepdims=True)), 0),
        "softmax": (lambda: softmax_gpu(100, 37), [r * 4], softmax_ref(r * 4), 1e-7),
    }


@pytest.mark.parametrize("name", ["vadd", "scale2d", "matmul", "matmul_local", "stencil", "rowsum", "shexp",
                                  "softmax"])
def test_lowered_schedule_validates_and_runs(name, vulkan, tmp_path):
    build, inputs, want, atol = _schedules()[name]
    sch, args = build()
    prog = split_host_device(tether.lower(sch, args, name))
    code = spirv_module(prog.kernels)
    validate(code, tmp_path)
    (got,) = run_program(vulkan, prog, code, args, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)


# ---- the CPU backend as the reference: one te expression compiled for the host and for Vulkan -------------------
def _cpu_and_gpu_schedules(fn, in_dtypes: Sequence[str], n: int):
    """(schedule, args) twice for ``out[i] = fn(*inputs[i])``: plain for the host, bound to threads for the GPU."""
    def make():
        ins = [te.placeholder((n,), dt, name=f"I{k}") for k, dt in enumerate(in_dtypes)]
        out = te.compute((n,), lambda i: fn(*[x[i] for x in ins]), name="O")
        return ins + [out], te.create_schedule(out.op), out

    cpu_args, cpu_s, _ = make()
    gpu_args, gpu_s, out = make()
    bx, tx = gpu_s[out].split(out.op.axis[0], factor=BLOCK)
    gpu_s[out].bind(bx, te.thread_axis("blockIdx.x"))
    gpu_s[out].bind(tx, te.thread_axis("threadIdx.x"))
    return (cpu_s, cpu_args), (gpu_s, gpu_args)


def _te_expressions():
    return {   # name -> (fn, input dtypes[, rtol])
        "float_mix": (lambda a, b: te.exp(a * 0.5) - te.log(te.abs(b) + 1.0) * te.tanh(a - b), ["float32"] * 2),
        "float_more": (lambda a, b: te.sigmoid(a) + te.erf(b) + te.sqrt(te.abs(a)) / (te.rsqrt(b * b + 1.0)),
                       ["float32"] * 2),
        "float_round": (lambda a, b: te.floor(a * 3.0) + te.ceil(b) * te.round_even(a + b) + te.pow(te.abs(a), b),
                        ["float32"] * 2),
        "float_minmax_select": (lambda a, b: te.if_then_else(a > b, te.max(a, b * 2.0), te.min(a - 1.0, b)),
                                ["float32"] * 2),
        "int_floor_ops": (lambda x, y: (x // (y % 13 + 1)) * 7 - x % (te.abs(y) + 1) + te.max(x, y) * te.min(x, y),
                          ["int32"] * 2),
        "int_bits": (lambda x, y: te.bitwise("bitxor", te.bitwise("shl", x, te.abs(y) % 8), te.bitwise("shr", y, 3))
                     + te.bitwise("bitand", x, y) - te.bitwise("bitor", x, 5), ["int32"] * 2),
        "casts": (lambda a, x: (a * 100.0).astype("int32") + x.astype("int8").astype("int32")
                  + te.if_then_else(te.all(a > 0.0, x < 0), 1, 0), ["float32", "int32"]),
        # exp differs in the last bits, so a result next to a float16 rounding boundary may round the other way
        "half_math": (lambda a, b: (te.exp(a) * b).astype("float16").astype("float32") + 0.25, ["float32"] * 2,
                      2.0 ** -10),
    }


def _te_inputs(dtypes: Sequence[str], n: int) -> List[np.ndarray]:
    out = []
    for dt in dtypes:
        out.append(RNG.uniform(-3, 3, n).astype(np.float32) if dt == "float32" else
                   RNG.integers(-5000, 5000, n).astype(np.int32))
    return out


@pytest.mark.parametrize("name", list(_te_expressions()))
def test_matches_the_cpu_backend(name, vulkan, tmp_path):
    """One te expression lowered for the host (the CPU backend, through the linker and the device runtime) and for
    Vulkan (split, SPIR-V, lavapipe): the same values, bit for bit for integers."""
    fn, dtypes, *tolerance = _te_expressions()[name]
    n = 1000     # not a multiple of the work-group: the GPU's bounds guard is exercised
    (cpu_s, cpu_args), (gpu_s, gpu_args) = _cpu_and_gpu_schedules(fn, dtypes, n)
    inputs = _te_inputs(dtypes, n)
    lib = tether.build(cpu_s, cpu_args, target="host", name=name)
    f = runtime.load_module(lib.export_library(str(tmp_path / f"{name}.so")))[name]
    want = np.zeros(n, np.dtype(cpu_args[-1].dtype))
    f(*inputs, want)
    prog = split_host_device(tether.lower(gpu_s, gpu_args, name))
    code = spirv_module(prog.kernels)
    validate(code, tmp_path)
    (got,) = run_program(vulkan, prog, code, gpu_args, inputs)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=tolerance[0] if tolerance else 1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def test_inputs_are_marked_read_only():
    k = elementwise("add2", ["float32", "float32"], "float32", lambda x, y: x + y)
    dis = subprocess.run([require_tool("spirv-dis", "apt-get install spirv-tools"), "-"], input=spirv_module([k]),
                         capture_output=True, timeout=120).stdout.decode()
    assert dis.count("0 NonWritable") == 2          # in0 and in1; out is written
    assert "LocalSize 64 1 1" in dis and "DescriptorSet 0" in dis and "Binding 2" in dis
