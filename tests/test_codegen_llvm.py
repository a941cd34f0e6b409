"""LLVM code generation of loop IR: the emitted IR's shape (vector types, noalias, fast-math, no libm), the
parallel launcher protocol (NULL launcher -> serial, chunked tasks, failing tasks), and NEON for ARM targets.

Impl functions are JIT-compiled with llvmlite's MCJIT and called with ctypes pointers into numpy arrays, so the
launcher slot can be driven directly from the test.
"""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

import tether
from tether import te
from tether.codegen.function import emit_function
from tether.codegen.parallel import MAX_PARALLEL_TASKS, max_parallel_tasks
from tether.codegen.module import ModuleBuilder
from tether.codegen.emit import compile_module
from tether_rpc import elf

from fixtures.te_kernels import matmul, vadd_schedule

RNG = np.random.default_rng(3)
TASK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)


def emit(s, args, name, target="host", fast_math=False):
    pf = tether.lower(s, args, name)
    mb = ModuleBuilder(target, name, fast_math=fast_math)
    impl = emit_function(mb, pf)
    mb.add_packed(pf, impl)
    return mb, impl, mb.finish()


class Jit:
    """MCJIT-compiled module text; keeps the engine alive while functions are called."""

    def __init__(self, text):
        import llvmlite.binding as llvm
        self.mod = llvm.parse_assembly(text)
        self.mod.verify()
        tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
        self.ee = llvm.create_mcjit_compiler(self.mod, tm)
        self.ee.finalize_object()

    def impl(self, name, nargs):
        addr = self.ee.get_function_address(f"{name}__impl")
        assert addr
        return ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * nargs)(addr)

    def set_launcher(self, launcher):
        addr = self.ee.get_function_address("tether_set_parallel_launcher")
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr)(ctypes.cast(launcher, ctypes.c_void_p) if launcher else None)


def ptrs(*arrays):
    return [a.ctypes.data for a in arrays]


def test_impl_signature_noalias_vector_types_alignment():
    s, args = vadd_schedule(1024, parallel=False)
    _, impl, text = emit(s, args, "vadd")
    assert impl.name == "vadd__impl"
    assert re.search(r'define .*i32 @"vadd__impl"\(ptr noalias %"p_A", ptr noalias %"p_B", ptr noalias %"p_C"\)',
                     text)
    assert re.search(r"load <8 x float>, ptr %[^,]+, align 4", text)
    assert re.search(r"store <8 x float> %[^,]+, ptr %[^,]+, align 4", text)
    assert "fadd contract <8 x float>" in text


def test_fast_math_flags_only_on_request():
    s, args = vadd_schedule(64, parallel=False, fn=lambda a, b: a * b + te.exp(a))
    _, _, text = emit(s, args, "k", fast_math=True)
    assert "fmul fast <8 x float>" in text
    _, impl, _ = emit(s, args, "k", fast_math=False)
    body = str(impl)
    assert "fmul contract <8 x float>" in body
    assert " fast " not in body


def test_math_uses_module_mathlib_not_libm():
    s, args = vadd_schedule(40, parallel=False,
                            fn=lambda a, b: te.exp(a) + te.log(b) + te.tanh(a) + te.erf(b) + te.sigmoid(a)
                            + te.pow(b, a) + te.floor(a))
    _, _, text = emit(s, args, "k")
    declared = re.findall(r'^declare [^@]*@"?([\w.]+)"?', text, flags=re.M)
    assert all(d.startswith("llvm.") for d in declared), declared
    for libm in ("expf", "logf", "tanhf", "erff", "powf", "floorf"):
        assert f'@"{libm}"' not in text and f"@{libm}(" not in text


def test_serial_fallback_when_no_launcher_installed():
    n = 1003
    s, args = vadd_schedule(n)
    _, _, text = emit(s, args, "vadd")
    jit = Jit(text)
    f = jit.impl("vadd", 3)
    a, b = RNG.random(n, dtype=np.float32), RNG.random(n, dtype=np.float32)
    c = np.zeros(n, np.float32)
    assert f(*ptrs(a, b, c)) == 0
    np.testing.assert_allclose(c, a + b)


def test_launcher_gets_chunked_tasks_each_run_once():
    n = 1000                                  # 125 parallel iterations -> at most max_parallel_tasks tasks
    s, args = vadd_schedule(n)
    _, _, text = emit(s, args, "vadd")
    jit = Jit(text)
    calls = []

    @LAUNCHER
    def launcher(task, closure, num_tasks):
        calls.append(num_tasks)
        fn = TASK(task)
        order = list(range(num_tasks))[::-1]  # any order must work
        for t in order:
            rc = fn(t, num_tasks, closure)
            if rc:
                return rc
        return 0

    jit.set_launcher(launcher)
    try:
        a, b = RNG.random(n, dtype=np.float32), RNG.random(n, dtype=np.float32)
        c = np.zeros(n, np.float32)
        assert jit.impl("vadd", 3)(*ptrs(a, b, c)) == 0
        np.testing.assert_allclose(c, a + b)
        # 125 iterations: the host build's cap (two tasks per core here), a device preset's 16
        assert calls == [max_parallel_tasks(tether.Target("host"))]
        assert max_parallel_tasks(tether.Target("rasp4b")) == MAX_PARALLEL_TASKS
    finally:
        jit.set_launcher(None)


def test_launcher_failure_becomes_parallel_error_code():
    s, args = vadd_schedule(64)
    _, _, text = emit(s, args, "vadd")
    jit = Jit(text)

    @LAUNCHER
    def failing(task, closure, num_tasks):
        return 42

    jit.set_launcher(failing)
    try:
        a = np.zeros(64, np.float32)
        assert jit.impl("vadd", 3)(*ptrs(a, a.copy(), a.copy())) == (8 << 24) | 42
    finally:
        jit.set_launcher(None)


def test_parallel_closure_carries_outer_loop_values_and_buffers():
    # the parallel loop is inside a serial loop and reads a root-level intermediate buffer
    m, n = 5, 37
    a = te.placeholder((m, n), "float32", name="A")
    t = te.compute((m, n), lambda i, j: a[i, j] * 2.0, name="T")
    c = te.compute((m, n), lambda i, j: t[i, j] + a[i, n - 1 - j], name="C")
    s = te.create_schedule(c.op)
    jo, ji = s[c].split(c.op.axis[1], factor=4)
    s[c].parallel(jo)
    s[c].vectorize(ji)
    _, _, text = emit(s, [a, c], "k")
    assert "k__task0" in text
    jit = Jit(text)
    x = RNG.random((m, n), dtype=np.float32)
    out = np.zeros((m, n), np.float32)
    assert jit.impl("k", 2)(*ptrs(x, out)) == 0
    np.testing.assert_allclose(out, x * 2 + x[:, ::-1])


@pytest.mark.parametrize("target,patterns", [
    ("rasp4b", [r"\bfadd\s+v\d+\.4s", r"\bldr\s+q\d+|\bld1\s"]),
    ("rasp3b", [r"\bvadd\.f32\s+q\d+", r"\bvld1\.32\b"]),
])
def test_vectorized_kernel_uses_neon(target, patterns):
    s, args = vadd_schedule(1024, factor=4, parallel=False)
    _, _, text = emit(s, args, "vadd", target=target)
    asm = compile_module(text, target).asm
    for p in patterns:
        assert re.search(p, asm), (p, asm[:2000])


def test_matmul_micro_kernel_is_fma_loop_with_register_accumulators():
    a, b, c = matmul(64, 64, 64)
    s = te.create_schedule(c.op)
    cl = s.cache_write(c, "local")
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
    s[c].vectorize(ji)
    s[cl].compute_at(s[c], jo)
    ci, cj = s[cl].op.axis
    s[cl].reorder(s[cl].op.reduce_axis[0], ci, cj)
    s[cl].unroll(ci)
    s[cl].vectorize(cj)
    _, _, text = emit(s, [a, b, c], "mm", target="rasp4b")
    compiled = compile_module(text, "rasp4b")
    asm = compiled.asm
    # 4 rows x 2 float32x4 vectors: fused multiply-adds by lane or vector, accumulators never spilled to the tile
    assert len(re.findall(r"\bfmla\s+v\d+\.4s", asm)) >= 8
    opt = compiled.optimized_ir
    impl = opt[opt.index("mm__impl"):]
    assert "alloca" not in impl.split("\n}\n")[0]          # SROA promoted C.local to registers


def test_int_and_bool_vectors_compile_for_armv7():
    a = te.placeholder((35,), "int8", name="A")
    b = te.placeholder((35,), "int32", name="B")
    c = te.compute((35,), lambda i: te.if_then_else(a[i] > 0, b[i] // 3, b[i] % 5 + a[i].astype("int32")),
                   name="C")
    d = te.compute((35,), lambda i: (b[i] > 2) & (a[i] < 7), name="D")
    s = te.create_schedule([c.op, d.op])
    for t in (c, d):
        _, xi = s[t].split(t.op.axis[0], factor=8)
        s[t].vectorize(xi)
    _, _, text = emit(s, [a, b, c, d], "k", target="rasp3b")
    assert "<8 x i32>" in text and "<8 x i1>" in text
    compile_module(text, "rasp3b")
    jit = Jit(emit(s, [a, b, c, d], "k")[2])
    x = RNG.integers(-20, 20, 35).astype(np.int8)
    y = RNG.integers(-50, 50, 35).astype(np.int32)
    oc, od = np.zeros(35, np.int32), np.zeros(35, np.bool_)
    assert jit.impl("k", 4)(*ptrs(x, y, oc, od)) == 0
    np.testing.assert_array_equal(oc, np.where(x > 0, y // 3, y % 5 + x))
    np.testing.assert_array_equal(od, (y > 2) & (x < 7))


def test_int64_on_armv7_calls_the_modules_own_aeabi_helpers():
    """armv7 has no 64-bit divide or int64 <-> float instructions: codegen emits plain IR and LLVM calls the
    module's own __aeabi_* helpers (codegen/runtime.py; their results are checked under qemu in test_artifact)."""
    n = 24
    a = te.placeholder((n,), "int64", name="A")
    b = te.placeholder((n,), "int64", name="B")
    f = te.placeholder((n,), "float32", name="F")
    q = te.compute((n,), lambda i: a[i] // b[i] + a[i] % 7, name="Q")
    to_i = te.compute((n,), lambda i: f[i].astype("int64"), name="ToI")
    to_f = te.compute((n,), lambda i: a[i].astype("float32"), name="ToF")
    outs = [q, to_i, to_f]
    s = te.create_schedule([o.op for o in outs])
    _, xi = s[q].split(q.op.axis[0], factor=4)
    s[q].vectorize(xi)
    pf = tether.lower(s, [a, b, f] + outs, "k")
    mb = ModuleBuilder("armv7-a7", "k")
    mb.add_packed(pf, emit_function(mb, pf))
    text = mb.finish()
    assert re.search(r"\bsdiv <4 x i64>", text) and re.search(r"\bsitofp (<\d+ x )?i64", text)
    assert re.search(r"\bfptosi [^\n]* to (<\d+ x )?i64\b", text)
    for helper in ("__aeabi_ldivmod", "__aeabi_l2f", "__aeabi_f2lz"):
        assert re.search(r"^define weak hidden arm_aapcscc .*@%s\(" % helper, text, re.M), helper
    asm = compile_module(text, "armv7-a7").asm
    assert re.search(r"\bbl\s+__aeabi_ldivmod\b", asm)


_GUARD_PAGE_SCRIPT = r"""
import ctypes, mmap, sys
import numpy as np
import tether
from tether import te, runtime
H, W, vec = 16, 1024, int(sys.argv[2])
A = te.placeholder((H, W), name="A")
P = te.compute((H + 2, W + 2), lambda h, w: te.if_then_else(te.all(h >= 1, h < H + 1, w >= 1, w < W + 1),
                                                           A[h - 1, w - 1], 0.0), name="P")
D = te.placeholder((H + 2, W + 2), "int32", name="D")
Q = te.compute((H + 2, W + 2), lambda h, w: te.if_then_else(D[h, w] != 0, 100 // D[h, w], -1), name="Q")
s = te.create_schedule([P.op, Q.op])
if vec:
    for t in (P, Q):
        _, wi = s[t].split(t.op.axis[1], 8)
        s[t].vectorize(wi)
path = tether.build(s, [A, D, P, Q], name="pad").export_library(sys.argv[1])
f = runtime.load_module(path)["pad"]
page, nbytes = mmap.PAGESIZE, H * W * 4
m = mmap.mmap(-1, nbytes + page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + nbytes), page, 0) == 0   # A ends at a guard page
a = np.frombuffer(m, dtype=np.float32, count=H * W).reshape(H, W)
a[:] = np.random.rand(H, W)
d = np.random.randint(-2, 3, (H + 2, W + 2)).astype("int32")
p, q = np.zeros((H + 2, W + 2), "float32"), np.zeros((H + 2, W + 2), "int32")
f(a, d, p, q)
want_p = np.zeros_like(p)
want_p[1:-1, 1:-1] = a
assert np.array_equal(p, want_p)
assert np.array_equal(q, np.where(d != 0, 100 // np.where(d == 0, 1, d), -1))
print("ok")
"""


@pytest.mark.parametrize("vec", [0, 1])
def test_if_then_else_does_not_touch_memory_or_divide_where_condition_is_false(tmp_path, vec):
    """Padding reads A[h-1, w-1] only where in range (the row past A's end is a guard page), and 100 // D
    only where D != 0 (an eager integer division by zero traps)."""
    import subprocess
    import sys
    script = tmp_path / "pad.py"
    script.write_text(_GUARD_PAGE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "pad.so"), str(vec)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("n", [1000, 1003])
def test_in_bounds_conditional_loads_stay_plain_selects(n):
    # A[i] is provably in bounds, tail clamp included, so leaky-relu style selects need no guarded loads
    a = te.placeholder((n,), "float32", name="A")
    c = te.compute((n,), lambda i: te.if_then_else(a[i] > 0, a[i], a[i] * 0.1), name="C")
    s = te.create_schedule(c.op)
    _, xi = s[c].split(c.op.axis[0], factor=8)
    s[c].vectorize(xi)
    _, impl, _ = emit(s, [a, c], "lrelu")
    body = str(impl)
    assert "mload" not in body and "sel.then" not in body
    assert re.search(r"select\s+<8 x i1> %[^,]+, <8 x float>", body)


def test_sum_reduction_update_is_reassociable_but_other_math_is_not():
    a = te.placeholder((16, 64), "float32", name="A")
    k = te.reduce_axis((0, 64), name="k")
    s_t = te.compute((16,), lambda i: te.sum(a[i, k] * 2.0 + 1.0, axis=k), name="S")
    s = te.create_schedule(s_t.op)
    _, impl, text = emit(s, [a, s_t], "rowsum")
    body = str(impl)
    assert len(re.findall(r"fadd contract reassoc float", body)) == 1     # only the accumulation
    assert "fmul contract float" in body and "fadd contract float" in body
    jit = Jit(text)
    x = RNG.random((16, 64), dtype=np.float32)
    out = np.zeros(16, np.float32)
    assert jit.impl("rowsum", 2)(*ptrs(x, out)) == 0
    np.testing.assert_allclose(out, (x * 2 + 1).sum(axis=1), rtol=1e-5)


def test_static_scratch_kernel_is_safe_to_call_from_several_threads(tmp_path):
    import threading
    from tether import runtime
    n = 100_000
    a = te.placeholder((n,), "float32", name="A")
    t = te.compute((n,), lambda i: a[i] * 2.0, name="T")        # 400 KB: static scratch, not the stack
    c = te.compute((n,), lambda i: t[n - 1 - i] + a[i], name="C")
    s = te.create_schedule(c.op)
    lib = tether.build(s, [a, c], name="k")
    assert "scratch_lock" in lib.get_source("ll")
    f = runtime.load_module(lib.export_library(str(tmp_path / "k.so")))["k"]
    bad = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            x = rng.random(n, dtype=np.float32)
            out = np.zeros(n, np.float32)
            f(x, out)
            if not np.allclose(out, 2 * x[::-1] + x):
                bad.append(seed)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert bad == []


@pytest.mark.parametrize("target", ["rasp3b", "rasp4b"])
def test_every_expression_kind_links_self_contained_for_arm(tmp_path, target):
    """Math, float64, int8/int32/int64 division and conversions, bool and uint8: nothing may turn into a
    compiler-rt or libm call (the link uses --no-undefined)."""
    n = 37
    a, b = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    i8, i32 = te.placeholder((n,), "int8", name="I8"), te.placeholder((n,), "int32", name="I32")
    i64, f64 = te.placeholder((n,), "int64", name="I64"), te.placeholder((n,), "float64", name="F64")
    m = te.placeholder((n,), "bool", name="M")
    outs = [
        te.compute((n,), lambda i: te.exp(a[i]) + te.log(b[i]) + te.tanh(a[i]) + te.erf(b[i]) + te.sigmoid(a[i])
                   + te.pow(b[i], a[i]) + te.floor(a[i]) + te.ceil(b[i]) + te.sqrt(a[i]) + te.rsqrt(b[i])
                   + te.abs(a[i]), name="O1"),
        te.compute((n,), lambda i: te.exp(f64[i]) + te.log(f64[i]) + te.pow(f64[i], f64[i]), name="O2"),
        te.compute((n,), lambda i: i8[i] // 3 + i8[i] % 5 + i32[i].astype("int8") // i8[i], name="O3"),
        te.compute((n,), lambda i: i64[i] // i64[i] + i64[i] % 7 + a[i].astype("int64") + f64[i].astype("int64"),
                   name="O4"),
        te.compute((n,), lambda i: i64[i].astype("float32") + i64[i].astype("float64").astype("float32")
                   + a[i].astype("uint8").astype("float32"), name="O5"),
        te.compute((n,), lambda i: te.if_then_else(m[i] & (a[i] > 0), a[i], b[i]), name="O6"),
    ]
    s = te.create_schedule([o.op for o in outs])
    for o in outs:
        _, xi = s[o].split(o.op.axis[0], factor=8)
        s[o].vectorize(xi)
    lib = tether.build(s, [a, b, i8, i32, i64, f64, m] + outs, target=target, name="k")
    lib.export_library(str(tmp_path / "k.so"))   # raises if ld.lld finds an undefined symbol
    with elf.ElfFile(str(tmp_path / "k.so")) as so:  # and the library says so itself
        assert so.arch == tether.target.Target(target).arch
        assert so.needed == [] and so.undefined_symbols == [], (so.needed, so.undefined_symbols)
        assert "k" in so.exported_symbols
