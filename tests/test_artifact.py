"""Module artifacts for every target preset: ELF checks, NEON in the assembly, the packed wrapper's error codes,
and the object / static archive / header exports linked into a real C program.

ELF files are read with the device runtime's reader (tether_rpc.elf)."""
from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess

import numpy as np
import pytest
from kernels import KERNEL_DIR
from fixtures.prereq import require_module, require_tool
from llvmlite import ir

from fixtures.backend import PackedCaller, math_kernel, vadd_kernel
from fixtures.schedules import elementwise
from tether.driver import build_ir
import tether
from tether import te
from tether.codegen import call_list, cpu_dispatch, threadpool
from tether.codegen.function import emit_function
from tether.codegen.module import ModuleBuilder
from tether.codegen.packed import error_code
from tether.errors import CompileError
from tether.target import PRESET_NAMES, Target
from tether_rpc import elf

ELF_PRESETS = [p for p in PRESET_NAMES if not Target(p).is_wasm]   # (wasm32: tests/test_wasm_target.py)
N = 1024
EXPECTED_EXPORTS = {"vadd", "vexp", "tether_set_parallel_launcher", "__tether_metadata"} | set(
    threadpool.EXPORTED_SYMBOLS) | set(call_list.EXPORTED_SYMBOLS)


def _kernel_module(preset: str, name: str = "kern"):
    mb = ModuleBuilder(preset, name)
    mb.add_packed(*reversed(vadd_kernel(mb, "vadd", N)))
    mb.add_packed(*reversed(math_kernel(mb, "vexp", "exp", N, ir.VectorType(ir.FloatType(), 4))))
    return build_ir(mb)


@pytest.fixture(scope="module")
def built(tmp_path_factory, host_linker):
    """preset -> (Module, path of the exported .so)."""
    out = {}
    d = tmp_path_factory.mktemp("presets")
    for preset in ELF_PRESETS:
        m = _kernel_module(preset)
        out[preset] = (m, m.export_library(str(d / ("kern_%s.so" % preset))))
    return out


@pytest.mark.parametrize("preset", ELF_PRESETS)
def test_elf_per_preset(built, preset):
    module, path = built[preset]
    target = Target(preset)
    with elf.read_elf(path) as f:
        assert f.is_shared_object
        assert f.machine == target.elf_machine and f.arch == target.arch
        assert f.bits == target.bits
        assert f.needed == [], "DT_NEEDED must be empty"
        assert f.undefined_symbols == []
        # (a preset with load-time CPU features exports the CPU-features word: docs/abi.md "CPU dispatch")
        word = {cpu_dispatch.WORD} if cpu_dispatch.features(target) else set()
        assert set(f.exported_symbols) == EXPECTED_EXPORTS | word
        assert f.soname == "kern_%s.so" % preset
        meta_raw = f.section_data(".tether_meta")
        if target.arch == "armv7":
            assert f.arm_float_abi == "hard"
            assert f.arm_attributes().get(elf.TAG_ABI_VFP_ARGS) == 1  # Tag_ABI_VFP_args: VFP registers
    assert meta_raw.endswith(b"\0")
    meta = json.loads(meta_raw.rstrip(b"\0").decode("utf-8"))
    assert meta == module.metadata
    assert meta["abi_version"] == 1 and meta["target"]["arch"] == target.arch
    assert meta["target"]["triple"] == target.triple and meta["target"]["preset"] == preset
    assert [f["name"] for f in meta["functions"]] == ["vadd", "vexp"]
    assert meta["functions"][0]["args"][0] == {"name": "in0", "shape": [N], "dtype": "float32"}
    assert meta["functions"][0]["parallel"] is False


def _assert_calls_are_internal(asm: str) -> None:
    callees = set(re.findall(r"\bbl\s+(\S+)", asm))
    defined = set(re.findall(r"^\"?([\w.$]+)\"?:", asm, re.M))
    assert callees and callees <= defined, sorted(callees - defined)


def test_neon_in_rasp4b_assembly(built):
    asm = built["rasp4b"][0].get_source("asm")
    assert re.search(r"\bfadd\s+v\d+\.4s", asm), "no 4 x f32 NEON add in the rasp4b vadd kernel"
    assert re.search(r"\bfmul\s+v\d+\.4s", asm) or re.search(r"\bfmla\s+v\d+\.4s", asm)
    assert "expf" not in asm
    # Every call stays inside the module (wrapper -> impl -> loop body, the pool): exp is inlined vector code,
    # not a libm call.
    _assert_calls_are_internal(asm)


def test_neon_in_rasp3b_assembly(built):
    asm = built["rasp3b"][0].get_source("asm")
    assert re.search(r"\bvadd\.f32\s+q\d+", asm), "no NEON q-register add in the rasp3b vadd kernel"
    assert re.search(r"\bvmul\.f32\s+q\d+", asm) or re.search(r"\bvfma\.f32\s+q\d+", asm)
    assert "expf" not in asm and not re.search(r"\bbl\s+__aeabi", asm)
    _assert_calls_are_internal(asm)


def test_host_module_runs_through_the_runtime(built):
    a = np.random.default_rng(0).normal(size=N).astype(np.float32)
    b = np.random.default_rng(1).normal(size=N).astype(np.float32)
    c = np.zeros(N, np.float32)
    m = built["host"][0].load()
    assert set(m.function_names) == {"vadd", "vexp"}
    m["vadd"](a, b, c)
    np.testing.assert_array_equal(c, a + b)
    m["vexp"](a, c)
    np.testing.assert_allclose(c, np.exp(a.astype(np.float64)), rtol=1e-6)


@pytest.fixture(scope="module")
def host_lib(built):
    return ctypes.CDLL(built["host"][1])


def test_packed_wrapper_error_codes(host_lib):
    vadd = PackedCaller(host_lib, "vadd")
    a, b = np.arange(N, dtype=np.float32), np.ones(N, np.float32)
    c = np.zeros(N, np.float32)
    assert vadd([a, b, c]) == 0
    np.testing.assert_array_equal(c, a + 1)
    assert vadd([a, b], num_args=2) == (1 << 24) | 2
    assert vadd([a, b, c], type_codes=[3, 3, 4]) == error_code(2, 2) == (2 << 24) | (2 << 8)
    assert vadd([a, b, c], num_args=5) == (1 << 24) | 5
    assert vadd([a, b, c], type_codes=[3, 0, 3]) == (2 << 24) | (1 << 8)
    assert vadd([a, b, c], ndims={2: 2}, shapes={2: (N, 1)}) == (3 << 24) | (2 << 8)
    assert vadd([a, b.astype(np.float64), c]) == (4 << 24) | (1 << 8)
    assert vadd([a, b, np.zeros(N, np.int32)]) == (4 << 24) | (2 << 8)
    assert vadd([a, b[:1000], c], shapes={1: (1000,)}) == (5 << 24) | (1 << 8) | 0
    assert vadd([a, b, c], strides={0: (2,)}) == (6 << 24) | (0 << 8) | 0
    assert vadd([a, b, c], strides={1: (1,)}) == 0  # explicit compact strides are fine
    assert vadd([a, b, c], null_data=[2]) == (7 << 24) | (2 << 8)


def test_byte_offset_is_applied(host_lib):
    vadd = PackedCaller(host_lib, "vadd")
    big = np.arange(N + 8, dtype=np.float32)
    b = np.ones(N, np.float32)
    c = np.zeros(N, np.float32)
    # Pass the whole buffer but tell the kernel its data starts 8 floats in.
    assert vadd([big[:N], b, c], byte_offsets={0: 32}) == 0
    np.testing.assert_array_equal(c, big[8:] + 1)


def test_multidim_shape_and_strides_checks(tmp_path, host_linker):
    mb = ModuleBuilder("host", "md")
    impl, kf = vadd_kernel(mb, "add2d", 4 * 8)
    for p in kf.params:
        p.shape = (4, 1, 8)
    mb.add_packed(kf, impl)
    lib = ctypes.CDLL(build_ir(mb).export_library(str(tmp_path / "md.so")))
    f = PackedCaller(lib, "add2d")
    a, b, c = (np.full((4, 1, 8), v, np.float32) for v in (1.0, 2.0, 0.0))
    assert f([a, b, c]) == 0 and (c == 3).all()
    assert f([a, b, c], strides={0: (8, 8, 1)}) == 0
    assert f([a, b, c], strides={0: (8, 12345, 1)}) == 0  # unit dimensions may carry any stride (numpy does)
    assert f([a, b, c], strides={0: (16, 8, 1)}) == (6 << 24) | 0 | 0
    assert f([a, b, c], strides={2: (8, 8, 2)}) == (6 << 24) | (2 << 8) | 2
    assert f([a, b, c], shapes={1: (4, 1, 7)}) == (5 << 24) | (1 << 8) | 2


def test_memcpy_from_intrinsics_is_self_contained(tmp_path, host_linker):
    """A kernel using llvm.memcpy/memset on a large block calls the module's own hidden memcpy/memset."""
    mb = ModuleBuilder("host", "mem")
    ptr, i64, i32 = ir.PointerType(), ir.IntType(64), ir.IntType(32)
    fn = ir.Function(mb.module, ir.FunctionType(i32, [ptr, ptr]), "copy__impl")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    memcpy = mb.module.declare_intrinsic("llvm.memcpy", [ptr, ptr, i64])
    memset = mb.module.declare_intrinsic("llvm.memset", [ptr, i64])
    half = ir.Constant(i64, 4 * 3000)
    b.call(memcpy, [fn.args[1], fn.args[0], half, ir.Constant(ir.IntType(1), 0)])
    hi = b.gep(fn.args[1], [ir.Constant(i64, 4 * 3000)], source_etype=ir.IntType(8))
    b.call(memset, [hi, ir.Constant(ir.IntType(8), 0), ir.Constant(i64, 4 * 1000), ir.Constant(ir.IntType(1), 0)])
    b.ret(ir.Constant(i32, 0))
    from fixtures.backend import KernelFunc, Param
    mb.add_packed(KernelFunc("copy", [Param("A", (4000,)), Param("B", (4000,))]), fn)
    module = build_ir(mb)
    path = module.export_library(str(tmp_path / "mem.so"))
    asm = module.get_source("asm")
    assert re.search(r"call\w*\s+memcpy", asm) or re.search(r"jmp\s+memcpy", asm), "expected a real memcpy call"
    with elf.read_elf(path) as f:
        assert f.undefined_symbols == [] and "memcpy" not in f.exported_symbols
    a = np.arange(4000, dtype=np.float32)
    out = np.full(4000, 7.0, np.float32)
    assert PackedCaller(ctypes.CDLL(path), "copy")([a, out]) == 0
    np.testing.assert_array_equal(out[:3000], a[:3000])
    assert (out[3000:] == 0).all()


def test_external_calls_are_refused_with_the_name():
    mb = ModuleBuilder("rasp4b", "bad")
    f32 = ir.FloatType()
    expf = ir.Function(mb.module, ir.FunctionType(f32, [f32]), "expf")
    from fixtures.backend import elementwise_kernel
    impl, kf = elementwise_kernel(mb, "k", 16, f32, lambda b, x: b.call(expf, [x]))
    mb.add_packed(kf, impl)
    with pytest.raises(CompileError, match="expf"):
        mb.finish()


def test_bad_function_names_are_refused():
    mb = ModuleBuilder("x86_64", "names")
    impl, kf = vadd_kernel(mb, "memcpy")
    with pytest.raises(CompileError, match="memcpy"):
        mb.add_packed(kf, impl)
    impl, kf = vadd_kernel(mb, "ok")
    mb.add_packed(kf, impl)
    with pytest.raises(CompileError, match="already has"):
        mb.add_packed(kf, impl)


def test_get_source_formats(built):
    m = built["rasp4b"][0]
    assert 'target triple = "aarch64-unknown-linux-gnu"' in m.get_source("ll")
    assert "tether.math.exp.v4f32" in m.get_source("ll")
    assert "tether.math.exp" not in m.get_source("ll-opt")
    assert json.loads(m.get_source("meta")) == m.metadata
    with pytest.raises(ValueError, match="unknown source format"):
        m.get_source("ptx")


def test_load_refuses_foreign_arch(built):
    with pytest.raises(Exception, match="aarch64"):
        built["rasp4b"][0].load()


@pytest.mark.parametrize("kind", ["static", "object"])
def test_c_program_links_the_exports(built, tmp_path, kind):
    """The static archive / object file plus the exported header link into a C program that calls vadd."""
    require_tool("gcc")
    m = built["host"][0]
    header = m.export_header(str(tmp_path / "kern.h"))
    lib = m.export_static(str(tmp_path / "libkern.a")) if kind == "static" else m.export_object(
        str(tmp_path / "kern.o"))
    src = tmp_path / "main.c"
    src.write_text(r'''
#include <stdio.h>
#include <string.h>
#include "kern.h"
int main(void) {
  static float a[1024], b[1024], c[1024];
  int64_t shape[1] = {1024};
  for (int i = 0; i < 1024; ++i) { a[i] = 0.5f * i; b[i] = 1.0f - i; }
  DLTensor ta = {a, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  DLTensor tb = ta, tc = ta; tb.data = b; tc.data = c;
  TetherValue args[3]; args[0].v_handle = &ta; args[1].v_handle = &tb; args[2].v_handle = &tc;
  int32_t codes[3] = {TETHER_DLTENSOR, TETHER_DLTENSOR, TETHER_DLTENSOR};
  int32_t rc = vadd(args, codes, 3);
  int32_t bad = vadd(args, codes, 2);
  printf("%d %d %d %s\n", rc, tether_error_kind(bad), strncmp(__tether_metadata, "{", 1) == 0,
         strstr(__tether_metadata, "\"vadd\"") ? "meta" : "nometa");
  for (int i = 0; i < 1024; i += 341) printf("%.6f\n", c[i]);
  return 0;
}
''')
    exe = tmp_path / "main"
    link_args = [lib] if kind == "object" else ["-L", str(tmp_path), "-lkern"]
    subprocess.run(["gcc", "-O1", "-I", str(tmp_path), "-o", str(exe), str(src)] + link_args, check=True,
                   timeout=60, capture_output=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert out[:4] == ["0", "1", "1", "meta"]
    idx = np.arange(0, 1024, 341)
    np.testing.assert_allclose([float(v) for v in out[4:]], 0.5 * idx + (1.0 - idx), rtol=1e-6)
    assert os.path.getsize(header) > 0


def test_static_archive_index(built, tmp_path):
    m = built["host"][0]
    data = open(m.export_static(str(tmp_path / "k.a")), "rb").read()
    assert data.startswith(b"!<arch>\n/               ")
    count = int.from_bytes(data[68:72], "big")
    names = data[72 + 4 * count:].split(b"\0")[:count]
    assert {n.decode() for n in names} >= EXPECTED_EXPORTS


# ---- armv7 run-time helpers (__aeabi_*) under qemu-arm -------------------------------------------------------
_RT_HARNESS = r"""
#include "kern.h"
#include "freestanding_io.h"
#define N %(n)d
static uint64_t buf[3][N];
static int64_t shape[1] = {N};
typedef int32_t (*fn_t)(const TetherValue*, const int32_t*, int32_t);
struct kernel { fn_t fn; int nin; uint8_t code[3], bits[3]; };
static const struct kernel ks[] = {%(table)s};
void _start(void) {
  int failures = 0;
  for (unsigned k = 0; k < sizeof(ks) / sizeof(ks[0]); ++k) {
    DLTensor t[3]; TetherValue args[3]; int32_t codes[3] = {TETHER_DLTENSOR, TETHER_DLTENSOR, TETHER_DLTENSOR};
    int nargs = ks[k].nin + 1;
    for (int i = 0; i < nargs; ++i) {
      int slot = i == nargs - 1 ? 2 : i;
      DLTensor ti = {buf[slot], {kDLCPU, 0}, 1, {ks[k].code[slot], ks[k].bits[slot], 1}, shape, 0, 0};
      t[i] = ti; args[i].v_handle = &t[i];
      if (i < ks[k].nin && fill((char*)buf[slot], N * ks[k].bits[slot] / 8)) sys3(NR_EXIT, 100, 0, 0);
    }
    if (ks[k].fn(args, codes, nargs) != 0) failures++;
    sys3(NR_WRITE, 1, (long)buf[2], N * ks[k].bits[2] / 8);
  }
  sys3(NR_EXIT, failures, 0, 0);
  for (;;) {}
}
"""

_IR_TY = {"int32": ir.IntType(32), "int64": ir.IntType(64), "uint32": ir.IntType(32), "uint64": ir.IntType(64),
          "float32": ir.FloatType(), "float64": ir.DoubleType()}
_DL = {"int32": (0, 32), "int64": (0, 64), "uint32": (1, 32), "uint64": (1, 64), "float32": (2, 32),
       "float64": (2, 64)}


def _scalar_kernel(mb, name, n, in_dtypes, out_dtype, body):
    from fixtures.backend import KernelFunc, Param

    i32, i64, ptr = ir.IntType(32), ir.IntType(64), ir.PointerType()
    fn = ir.Function(mb.module, ir.FunctionType(i32, [ptr] * (len(in_dtypes) + 1)), name + "__impl")
    entry, loop, done = (fn.append_basic_block(x) for x in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    vals = [b.load(b.gep(fn.args[k], [i], source_etype=_IR_TY[d]), typ=_IR_TY[d]) for k, d in enumerate(in_dtypes)]
    b.store(body(b, *vals), b.gep(fn.args[-1], [i], source_etype=_IR_TY[out_dtype]))
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, ir.Constant(i64, n)), loop, done)
    b.position_at_end(done)
    b.ret(ir.Constant(i32, 0))
    params = [Param("in%d" % k, (n,), d) for k, d in enumerate(in_dtypes)] + [Param("out", (n,), out_dtype)]
    mb.add_packed(KernelFunc(name, params), fn)


class _TeKernel:
    """A te elementwise kernel over 1-d inputs, compiled by tether's own code generator."""

    def __init__(self, fcompute, vector=0):
        self.fcompute, self.vector = fcompute, vector

    def add(self, mb, name, n, in_dtypes, out_dtype):
        ins = [te.placeholder((n,), d, name="in%d" % k) for k, d in enumerate(in_dtypes)]
        out = te.compute((n,), lambda i: self.fcompute(*[x[i] for x in ins]), name="out")
        s = te.create_schedule(out.op)
        if self.vector:
            _, xi = s[out].split(out.op.axis[0], factor=self.vector)
            s[out].vectorize(xi)
        pf = tether.lower(s, ins + [out], name)
        mb.add_packed(pf, emit_function(mb, pf))


def _trunc_divmod(a, b):
    """C's truncating division, in Python integers (np.abs(INT_MIN) would overflow)."""
    q = [(abs(x) // abs(y)) * (-1 if (x < 0) != (y < 0) else 1) for x, y in zip(a.tolist(), b.tolist())]
    r = [x - qq * y for x, y, qq in zip(a.tolist(), b.tolist(), q)]
    return np.array(q, dtype=a.dtype), np.array(r, dtype=a.dtype)


@pytest.mark.emulated
def test_armv7_runtime_helpers_on_qemu(tmp_path, host_linker):
    """Generic armv7 (no hardware divide): integer division and 64-bit int <-> float conversions call the
    module's own __aeabi_* helpers, which give the same answers as numpy when run under qemu-arm."""
    import sys

    require_tool("qemu-arm", "apt-get install qemu-user")
    require_module("ziglang")
    n = 512
    rng = np.random.default_rng(7)
    i32a = np.concatenate([rng.integers(-2**31, 2**31, n - 8),
                           [7, -7, 7, -7, 2**31 - 1, -2**31, 0, 5]]).astype(np.int32)
    i32b = np.concatenate([rng.integers(1, 2**31, n - 8) * rng.choice([-1, 1], n - 8),
                           [2, 2, -2, -2, 3, 7, 9, 1]]).astype(np.int32)
    i32b[np.abs(rng.normal(size=n)) > 1.5] = 3  # some small divisors too
    i64a = np.concatenate([rng.integers(-2**63, 2**63, n - 4, dtype=np.int64), [7, -7, -2**63, 2**62]])
    i64b = np.concatenate([rng.integers(1, 2**40, n - 4) * rng.choice([-1, 1], n - 4), [2, 2, 3, -5]]).astype(np.int64)
    u64a = rng.integers(0, 2**64, n, dtype=np.uint64)
    u64b = np.maximum(rng.integers(1, 2**64, n, dtype=np.uint64) >> rng.integers(0, 63, n).astype(np.uint64),
                      np.uint64(1))
    conv_i64 = np.concatenate([rng.integers(-2**63, 2**63, n - 6, dtype=np.int64),
                               [0, -1, 2**53 + 1, 2**62 + 2**39 + 1, -2**63, 16777217]]).astype(np.int64)
    conv_u64 = np.concatenate([rng.integers(0, 2**64, n - 3, dtype=np.uint64),
                               np.array([2**64 - 1, 2**63 + 2**40 + 1, 16777217], dtype=np.uint64)])
    conv_f64 = np.concatenate([rng.uniform(-9e18, 9e18, n // 2), rng.uniform(-1e6, 1e6, n // 2)])
    conv_f64[:4] = [0.0, -0.5, 1.5, -2.0 ** 62]
    conv_uf64 = np.abs(rng.uniform(0, 1.8e19, n))
    with np.errstate(all="ignore"):
        cases = [  # name, inputs, out dtype, llvm op, numpy reference
            ("sdiv32", [i32a, i32b], "int32", lambda b, x, y: b.sdiv(x, y), _trunc_divmod(i32a, i32b)[0]),
            ("srem32", [i32a, i32b], "int32", lambda b, x, y: b.srem(x, y), _trunc_divmod(i32a, i32b)[1]),
            ("udiv32", [i32a.view(np.uint32), i32b.view(np.uint32)], "uint32", lambda b, x, y: b.udiv(x, y),
             i32a.view(np.uint32) // i32b.view(np.uint32)),
            ("urem32", [i32a.view(np.uint32), i32b.view(np.uint32)], "uint32", lambda b, x, y: b.urem(x, y),
             i32a.view(np.uint32) % i32b.view(np.uint32)),
            ("sdiv64", [i64a, i64b], "int64", lambda b, x, y: b.sdiv(x, y), _trunc_divmod(i64a, i64b)[0]),
            ("srem64", [i64a, i64b], "int64", lambda b, x, y: b.srem(x, y), _trunc_divmod(i64a, i64b)[1]),
            ("udiv64", [u64a, u64b], "uint64", lambda b, x, y: b.udiv(x, y), u64a // u64b),
            ("urem64", [u64a, u64b], "uint64", lambda b, x, y: b.urem(x, y), u64a % u64b),
            ("l2f", [conv_i64], "float32", lambda b, x: b.sitofp(x, ir.FloatType()), conv_i64.astype(np.float32)),
            ("ul2f", [conv_u64], "float32", lambda b, x: b.uitofp(x, ir.FloatType()), conv_u64.astype(np.float32)),
            ("l2d", [conv_i64], "float64", lambda b, x: b.sitofp(x, ir.DoubleType()), conv_i64.astype(np.float64)),
            ("ul2d", [conv_u64], "float64", lambda b, x: b.uitofp(x, ir.DoubleType()),
             conv_u64.astype(np.float64)),
            ("d2lz", [conv_f64], "int64", lambda b, x: b.fptosi(x, ir.IntType(64)),
             np.trunc(conv_f64).astype(np.int64)),
            ("d2ulz", [conv_uf64], "uint64", lambda b, x: b.fptoui(x, ir.IntType(64)),
             np.trunc(conv_uf64).astype(np.uint64)),
            ("f2lz", [conv_f64.astype(np.float32)], "int64", lambda b, x: b.fptosi(x, ir.IntType(64)),
             np.trunc(conv_f64.astype(np.float32)).astype(np.int64)),
            ("f2ulz", [conv_uf64.astype(np.float32)], "uint64", lambda b, x: b.fptoui(x, ir.IntType(64)),
             np.trunc(conv_uf64.astype(np.float32).astype(np.float64)).astype(np.uint64)),
        ]
        # te kernels: codegen emits plain 64-bit IR (vectorized too), which LLVM lowers to the same helpers
        cases += [
            ("te_floordiv64", [i64a, i64b], "int64", _TeKernel(lambda x, y: te.floordiv(x, y), vector=4),
             i64a // i64b),
            ("te_floormod64", [i64a, i64b], "int64", _TeKernel(lambda x, y: te.floormod(x, y), vector=4),
             i64a % i64b),
            ("te_l2f", [conv_i64], "float32", _TeKernel(lambda x: x.astype("float32")), conv_i64.astype(np.float32)),
            ("te_f2l", [conv_f64.astype(np.float32)], "int64", _TeKernel(lambda x: x.astype("int64")),
             np.trunc(conv_f64.astype(np.float32)).astype(np.int64)),
        ]
    mb = ModuleBuilder("armv7a-linux-gnueabihf -mattr=+neon", "rt")
    table = []
    for name, ins, out_dtype, op, _ in cases:
        in_dtypes = [a.dtype.name for a in ins]
        if isinstance(op, _TeKernel):
            op.add(mb, name, n, in_dtypes, out_dtype)
        else:
            _scalar_kernel(mb, name, n, in_dtypes, out_dtype, op)
        dls = [_DL[d] for d in in_dtypes] + [(0, 8)] * (2 - len(ins)) + [_DL[out_dtype]]
        table.append("{%s, %d, {%s}, {%s}}" % (name, len(ins), ", ".join(str(c) for c, _ in dls),
                                               ", ".join(str(b) for _, b in dls)))
    module = build_ir(mb)
    asm = module.get_source("asm")
    for helper in ("__aeabi_idiv", "__aeabi_uidivmod", "__aeabi_ldivmod", "__aeabi_uldivmod", "__aeabi_l2f",
                   "__aeabi_d2lz"):
        assert re.search(r"\bbl\s+%s\b" % helper, asm), "expected a call to %s in the generic armv7 code" % helper
    module.export_object(str(tmp_path / "kern.o"))
    module.export_header(str(tmp_path / "kern.h"))
    (tmp_path / "h.c").write_text(_RT_HARNESS % {"n": n, "table": ", ".join(table)})
    exe = tmp_path / "rt"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", "arm-linux-musleabihf", "-mcpu=generic+v7a",
                    "-nostdlib", "-ffreestanding", "-static", "-O1", "-fno-stack-protector", "-I", str(tmp_path),
                    "-I", str(KERNEL_DIR), "-o", str(exe), str(tmp_path / "h.c"), str(tmp_path / "kern.o")],
                   check=True, timeout=300, capture_output=True)
    proc = subprocess.run(["qemu-arm", str(exe)], input=b"".join(a.tobytes() for c in cases for a in c[1]),
                          capture_output=True, timeout=120)
    assert proc.returncode == 0
    pos = 0
    for name, _, out_dtype, _, ref in cases:
        nbytes = n * np.dtype(out_dtype).itemsize
        got = np.frombuffer(proc.stdout[pos:pos + nbytes], out_dtype)
        pos += nbytes
        np.testing.assert_array_equal(got, ref.astype(out_dtype), err_msg=name)
    assert pos == len(proc.stdout)


# ---- the public surface: tether.build / tether.lower ----------------------------------------------------------
def test_import_tether_is_lazy_and_build_lower_are_callable():
    import sys

    code = ("import sys, tether\n"
            "assert 'llvmlite' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)\n"
            "assert callable(tether.build) and callable(tether.lower)\n"
            "import tether.te.lower, tether.driver\n"  # importing the modules must not shadow the functions
            "assert tether.build is tether.driver.build and tether.lower is tether.driver.lower\n"
            "assert callable(tether.build_graph)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_readme_vadd_end_to_end(tmp_path, host_linker):
    """The README's example: split/vectorize/parallel vadd, built for rasp4b and for the host."""
    import tether
    from tether import runtime

    n = 1024
    s, args = elementwise(n, lambda a, b: a + b, factor=8)
    assert "parallel" in str(tether.lower(s, args))
    lib = tether.build(s, args, target="rasp4b", name="vadd")
    path = lib.export_library(str(tmp_path / "vadd.so"))
    with elf.read_elf(path) as f:
        assert f.arch == "aarch64" and f.needed == [] and f.undefined_symbols == []
        assert set(f.exported_symbols) == {"vadd", "tether_set_parallel_launcher", "__tether_metadata"} | set(
            threadpool.EXPORTED_SYMBOLS) | set(call_list.EXPORTED_SYMBOLS)
    assert lib.metadata["functions"][0]["parallel"] is True
    assert re.search(r"\bfadd\s+v\d+\.4s", lib.get_source("asm"))
    host = tether.build(s, args, target="host", name="vadd").export_library(str(tmp_path / "vadd_host.so"))
    f = runtime.load_module(host)["vadd"]
    a, b = np.random.default_rng(3).random((2, n), dtype=np.float32)
    c = np.zeros(n, np.float32)
    f(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_several_functions_in_one_module(tmp_path, host_linker):
    """build() takes (schedule, args, name) triples and puts every function into one library."""
    import tether
    from tether import runtime, te

    n = 256
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: te.exp(A[i]), name="B")
    C = te.compute((n,), lambda i: A[i] * 2.0, name="C")
    sb, sc = te.create_schedule(B.op), te.create_schedule(C.op)
    lib = tether.build([(sb, [A, B], "vexp"), (sc, [A, C], "vdouble")], target="host", name="pair")
    assert lib.function_names == ["vexp", "vdouble"]
    m = runtime.load_module(lib.export_library(str(tmp_path / "pair.so")))
    a = np.linspace(-3, 3, n).astype(np.float32)
    b, c = np.zeros(n, np.float32), np.zeros(n, np.float32)
    m["vexp"](a, b)
    m["vdouble"](a, c)
    np.testing.assert_allclose(b, np.exp(a.astype(np.float64)), rtol=1e-6)
    np.testing.assert_array_equal(c, a * 2)
    with pytest.raises(Exception, match="shape"):
        m["vdouble"](a[:100], c)


def test_build_command_writes_artifacts(tmp_path, host_linker):
    from click.testing import CliRunner

    from tether.cli.main import cli

    src = tmp_path / "k.py"
    src.write_text("from tether import te\n"
                   "def make():\n"
                   "    A = te.placeholder((64,), 'float32', name='A')\n"
                   "    B = te.compute((64,), lambda i: te.tanh(A[i]), name='B')\n"
                   "    return [(te.create_schedule(B.op), [A, B], 'vtanh')]\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["build", "%s:make" % src, "-t", "rasp3b", "-n", "act", "-o", str(out),
                                      "--emit", "so,a,h,asm"])
    assert result.exit_code == 0, result.output
    with elf.read_elf(str(out / "act.so")) as f:
        assert f.arch == "armv7" and f.arm_float_abi == "hard" and "vtanh" in f.exported_symbols
    assert "int32_t vtanh(" in (out / "act.h").read_text()
    assert (out / "libact.a").read_bytes().startswith(b"!<arch>\n")
    assert "tanhf" not in (out / "act.s").read_text()
    bad = CliRunner().invoke(cli, ["build", "%s:nothing" % src, "-o", str(out)])
    assert bad.exit_code != 0 and "no function 'nothing'" in bad.output
