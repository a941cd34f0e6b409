"""OpenCL C source for device kernels: :class:`tether.tir.device.DeviceKernel` -> the text ``clBuildProgram`` takes.

Every tir node type, binary operator and math call is one row of a table below (a new node is one row); each
emitter returns C text for an expression or appends lines for a statement. The text means exactly what the CPU
backend (codegen/expr.py, codegen/mathlib.py) computes:

- integers: floordiv/floormod (and ``div`` on integers) floor on signed types, like the CPU's sdiv/srem fix-up;
  types narrower than 32 bits compute in 32 bits and wrap back to their width (C's promotion would otherwise
  change their overflow); left shifts are done unsigned (no C undefined behaviour on negative values).
- floats: ``#pragma OPENCL FP_CONTRACT OFF`` (OpenCL C contracts a*b+c into fma by default, the CPU never
  does); float min/max are ``a < b ? a : b`` (NaN and -0.0 behave as on the CPU, unlike fmin/fmax); ``!=`` is
  unordered and the other comparisons ordered, as C's operators are; float -> int casts truncate and are not
  saturating (out of range is undefined on both backends).
- float16 is a storage type as on the CPU: values are computed as float, loads widen with ``vload_half`` and
  stores round to nearest even with ``vstore_half_rte``; both are core OpenCL C (1.0 on), so float16 needs no
  ``cl_khr_fp16`` and adds nothing to a kernel's needs. Shared and private float16 arrays are declared as
  ``ushort`` (a ``half`` array needs the extension) and read through a ``half*`` cast.
- with ``fp16=True`` (the target promises half arithmetic: GpuTarget.fp16) float16 is computed as ``half``: the
  program enables ``cl_khr_fp16``, float16 buffers and arrays are ``half`` read and written directly, each
  operation rounds to half (as numpy's float16 does), and :func:`opencl_needs` adds ``"fp16"``. Math calls on
  float16 are computed in float and rounded to half once (more accurate than the ``half`` builtins, whose
  precision OpenCL leaves loose).
- float64 is ``double``: it needs ``cl_khr_fp64`` (absent on phone GPUs), so the program enables that extension
  and :func:`opencl_needs` adds ``"fp64"`` to the kernel's needs, which a device without it refuses at load.
- bool buffers are bytes (``uchar``: OpenCL forbids ``bool`` in memory), read as ``!= 0`` like the CPU's i8.

Kernel names are the launch's lookup key (``launch_info()["name"]``), so a name that is not a C identifier, is an
OpenCL C keyword, type or builtin function (a kernel ``fmod`` overloads the builtin and clCreateKernel cannot find
it), or is used twice in one program, is refused rather than renamed; buffer and variable names are sanitised to
C identifiers and made unique within their kernel.

Float division and sqrt are correctly rounded only when the program is built with
``-cl-fp32-correctly-rounded-divide-sqrt`` (pocl rounds them correctly anyway; OpenCL allows 2.5 and 3 ulp
otherwise): the runtime's build options decide that, not this source.
"""
from __future__ import annotations

import math
import re
import struct
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from tether.codegen.halfconv import half_value
from tether.errors import CompileError
from tether.tir.buffer import Buffer
from tether.tir.device import THREAD_TAGS, Barrier, DeviceKernel, tag_dim
from tether.tir.dtype import bits, is_float, is_int, is_unsigned
from tether.tir.expr import Binary, Call, Cast, Compare, Const, Expr, Load, Not, Select, Var
from tether.tir.int8 import dot4_kind
from tether.tir.simplify import Simplifier
from tether.tir.stmt import Allocate, For, IfThenElse, Prefetch, SeqStmt, Stmt, Store
from tether.tir.visit import by_class, walk

# dtype -> the C type its values are computed in
_VALUE_TYPE = {"bool": "bool", "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort",
               "int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong", "float16": "float",
               "float32": "float", "float64": "double"}
# dtype -> the C type of its elements in memory (half only as a pointer's target: see the module doc)
_STORAGE_TYPE = dict(_VALUE_TYPE, bool="uchar", float16="half")
# C integer literal suffix per dtype (narrow types are written as a cast of an int literal)
_INT_SUFFIX = {"int32": "", "uint32": "u", "int64": "L", "uint64": "UL"}

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_BITS = {"bitand": "&", "bitor": "|", "bitxor": "^", "shr": ">>"}

# The builtin functions of OpenCL C 1.2 (section 6.12): a kernel of one of these names overloads the builtin and
# clCreateKernel cannot find it (CL_INVALID_KERNEL_NAME), and a variable of one of them hides it.
_BUILTINS = frozenset("""
get_work_dim get_global_size get_global_id get_local_size get_local_id get_num_groups get_group_id
get_global_offset acos acosh acospi asin asinh asinpi atan atan2 atanh atanpi atan2pi cbrt ceil copysign cos cosh
cospi erfc erf exp exp2 exp10 expm1 fabs fdim floor fma fmax fmin fmod fract frexp hypot ilogb ldexp lgamma
lgamma_r log log2 log10 log1p logb mad maxmag minmag modf nan nextafter pow pown powr remainder remquo rint rootn
round rsqrt sin sincos sinh sinpi sqrt tan tanh tanpi tgamma trunc half_cos half_divide half_exp half_exp2
half_exp10 half_log half_log2 half_log10 half_powr half_recip half_rsqrt half_sin half_sqrt half_tan native_cos
native_divide native_exp native_exp2 native_exp10 native_log native_log2 native_log10 native_powr native_recip
native_rsqrt native_sin native_sqrt native_tan abs abs_diff add_sat hadd rhadd clamp clz ctz mad_hi mad_sat max min
mul_hi rotate sub_sat upsample popcount mad24 mul24 degrees mix radians step smoothstep sign cross dot distance
length normalize fast_distance fast_length fast_normalize isequal isnotequal isgreater isgreaterequal isless
islessequal islessgreater isfinite isinf isnan isnormal isordered isunordered signbit any all bitselect select
vload_half vstore_half vstore_half_rte vstore_half_rtz vstore_half_rtp vstore_half_rtn vloada_half vstorea_half
shuffle shuffle2 printf barrier mem_fence read_mem_fence write_mem_fence async_work_group_copy
async_work_group_strided_copy wait_group_events prefetch atomic_add atomic_sub atomic_xchg atomic_inc atomic_dec
atomic_cmpxchg atomic_min atomic_max atomic_and atomic_or atomic_xor vec_step
""".split())
# Names a variable must not take: OpenCL C keywords and types, the builtins and macros the emitted code uses
# (a local named ``exp`` would hide the function), and this module's own helper prefix.
_RESERVED = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline int long
register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
bool true false half uchar ushort uint ulong size_t ptrdiff_t intptr_t uintptr_t event_t image1d_t image2d_t
image3d_t sampler_t kernel global local constant private read_only write_only read_write
CLK_LOCAL_MEM_FENCE CLK_GLOBAL_MEM_FENCE INFINITY NAN MAXFLOAT HUGE_VALF
""".split()) | _BUILTINS
_HELPER_PREFIX = "tether_"
_VECTOR_TYPE = re.compile(r"(u?char|u?short|u?int|u?long|float|double|half|bool)(2|3|4|8|16)\Z")


def c_type(dtype: str, storage: bool = False) -> str:
    """The OpenCL C type of ``dtype``'s values (``storage``: of its elements in memory)."""
    table = _STORAGE_TYPE if storage else _VALUE_TYPE
    if dtype not in table:
        raise CompileError("OpenCL C: dtype %s is not supported on GPUs (supported: %s)"
                           % (dtype, ", ".join(table)))
    return table[dtype]


def _identifier(name: str) -> str:
    """``name`` made a C identifier that collides with no keyword, builtin or helper."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not s or s[0].isdigit():
        s = "v" + s
    if s.startswith("__"):              # reserved for the implementation (__global, __kernel, ...)
        s = "v" + s
    if s in _RESERVED or s.startswith(_HELPER_PREFIX) or _VECTOR_TYPE.match(s):
        s += "_"
    return s


class _Names:
    """Unique C identifiers for the Vars and Buffers of one kernel (by identity)."""

    def __init__(self) -> None:
        self.of: Dict[int, str] = {}
        self.taken: Set[str] = set()
        self.keep: List[object] = []       # keeps the named objects alive, so their ids stay theirs

    def add(self, obj: object, name: str) -> str:
        base = _identifier(name)
        s, k = base, 1
        while s in self.taken:
            s = "%s_%d" % (base, k)
            k += 1
        self.taken.add(s)
        self.of[id(obj)] = s
        self.keep.append(obj)
        return s

    def get(self, obj: object) -> Optional[str]:
        return self.of.get(id(obj))


# ---- helpers: small functions, written once per program when some kernel uses them ---------------------------
# Plain functions (no ``static inline``): OpenCL C 1.1 has no storage-class specifiers, and C99 ``inline`` alone
# would leave an external reference where the compiler chose not to inline; drivers inline them anyway.
def _minmax_helper(op: str, ct: str) -> str:
    sym = "<" if op == "min" else ">"
    return ("%s tether_%s_%s(%s a, %s b) { return a %s b ? a : b; }"
            % (ct, op, ct, ct, ct, sym))


def _floor_helper(op: str, ct: str) -> str:
    # the CPU's sdiv/srem fix-up: a remainder whose sign differs from the divisor's moves the quotient down
    body = ("%s q = a / b, r = a %% b; int adjust = r != 0 && (r ^ b) < 0; " % (ct, ))
    ret = "return r + (adjust ? b : 0);" if op == "floormod" else "return q - adjust;"
    return "%s tether_%s_%s(%s a, %s b) { %s%s }" % (ct, op, ct, ct, ct, body, ret)


def _abs_helper(ct: str) -> str:
    # 0 - a computed unsigned: the most negative value stays itself, as the CPU's wrapping sub does
    return ("%s tether_abs_%s(%s a) { return a < 0 ? (%s)(0u - (u%s)a) : a; }"
            % (ct, ct, ct, ct, ct))


def _sigmoid_helper(ct: str) -> str:
    # mathlib's formula: exp(-|x|) never overflows, e/(1+e) keeps the tiny results for very negative x
    one = "1.0" if ct == "double" else "1.0f"
    return ("%s tether_sigmoid_%s(%s x) { %s e = exp(-fabs(x)); %s inv = %s / (%s + e); "
            "return x < 0 ? e * inv : inv; }" % (ct, ct, ct, ct, ct, one, one))


def _dot4_helper(kind: str) -> str:
    ta = "uchar" if kind[0] == "u" else "char"
    tb = "uchar" if kind[2] == "u" else "char"
    terms = " + ".join("(int)(%s)(a >> %d) * (int)(%s)(b >> %d)" % (ta, 8 * t, tb, 8 * t) for t in range(4))
    return "int tether_dot4_%s(int a, int b) { return %s; }" % (kind, terms)


_ROUND_HALF = ("float tether_round_half(float x) { ushort h; vstore_half_rte(x, 0, (half*)&h); "
               "return vload_half(0, (half*)&h); }")
_ROUND_HALF_D = ("float tether_round_half_d(double x) { ushort h; vstore_half_rte(x, 0, (half*)&h); "
                 "return vload_half(0, (half*)&h); }")


# ---- the kernel writer ----------------------------------------------------------------------------------------
class _Writer:
    """Emits one kernel; ``helpers`` (name -> definition, each written once) are shared by the program."""

    def __init__(self, kernel: DeviceKernel, helpers: Dict[str, str], fp16: bool = False) -> None:
        self.kernel = kernel
        self.fp16 = fp16                         # float16 computed as half (cl_khr_fp16), not as float
        self.helpers = helpers
        self.names = _Names()
        self.scope: Dict[int, str] = {}          # id(Buffer) -> address space of the buffers in scope
        self.lines: List[str] = []
        self.shared_decls: List[str] = []
        # inclusive value ranges of the thread indices and loop variables in scope: index math on values proven
        # non-negative divides with C's / and % (floor and truncation agree there), as the CPU backend does
        self.ranges: Dict[Var, Tuple[int, int]] = {}

    def non_negative(self, e: Expr) -> bool:
        b = Simplifier(self.ranges).bound(e)
        return b is not None and b[0] >= 0

    def helper(self, name: str, definition: str) -> str:
        self.helpers.setdefault(name, definition)
        return name

    # expressions ----------------------------------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        emit = _EXPR.get(type(e)) or by_class(_EXPR, type(e))
        if emit is None:
            raise CompileError("OpenCL C: cannot generate code for %s (%s) in kernel %r"
                               % (type(e).__name__, e, self.kernel.name))
        return emit(self, e)

    def buffer_name(self, buf: Buffer) -> str:
        name = self.names.get(buf)
        if name is None or id(buf) not in self.scope:
            raise CompileError("OpenCL C: buffer %r is used outside its allocation in kernel %r"
                               % (buf.name, self.kernel.name))
        return name

    def ctype(self, dtype: str) -> str:
        """The C type ``dtype``'s values are computed in by this kernel (float16: half with fp16, else float)."""
        return "half" if dtype == "float16" and self.fp16 else c_type(dtype)

    def half_pointer(self, buf: Buffer) -> str:
        """A float16 buffer as the ``half*`` vload_half/vstore_half take (shared/private ones are ushort arrays)."""
        name = self.buffer_name(buf)
        space = self.scope[id(buf)]
        if space == "__global":
            return name
        return "(%shalf*)%s" % ("__local " if space == "__local" else "", name)

    # statements -----------------------------------------------------------------------------------------
    def stmt(self, s: Stmt, pad: str) -> None:
        emit = _STMT.get(type(s))
        if emit is None:
            raise CompileError("OpenCL C: cannot generate code for statement %s in kernel %r"
                               % (type(s).__name__, self.kernel.name))
        emit(self, s, pad)

    def kernel_text(self) -> str:
        k = self.kernel
        args = []
        for buf in k.params:
            if buf.scope != "param":
                raise CompileError("OpenCL C: parameter %r of kernel %r has scope %r, expected 'param'"
                                   % (buf.name, k.name, buf.scope))
            name = self.names.add(buf, buf.name)
            self.scope[id(buf)] = "__global"
            args.append("__global %s* restrict %s" % (c_type(buf.dtype, storage=True), name))
        for v in k.scalars:
            if v.dtype != "int32":
                raise CompileError("OpenCL C: scalar argument %r of kernel %r is %s; kernel scalars are int32"
                                   % (v.name, k.name, v.dtype))
            args.append("int %s" % self.names.add(v, v.name))
        top = []
        for v, tag in k.thread_of.items():
            if tag not in THREAD_TAGS:
                raise CompileError("OpenCL C: variable %r of kernel %r is bound to %r, not a thread index (%s)"
                                   % (v.name, k.name, tag, ", ".join(THREAD_TAGS)))
            fn = "get_group_id" if tag.startswith("blockIdx") else "get_local_id"
            extent = (k.grid if fn == "get_group_id" else k.block)[tag_dim(tag)]
            self.ranges[v] = (0, max(extent, 1) - 1)
            top.append("  const %s %s = (%s)%s(%d);" % (c_type(v.dtype), self.names.add(v, v.name),
                                                     c_type(v.dtype), fn, tag_dim(tag)))
        self.stmt(k.body, "  ")
        head = ("__kernel __attribute__((reqd_work_group_size(%d, %d, %d)))\nvoid %s(%s)"
                % (k.block[0], k.block[1], k.block[2], k.name, ", ".join(args) or "void"))
        return "\n".join([head + " {"] + self.shared_decls + top + self.lines + ["}"])


def _bare(text: str) -> str:
    """``text`` without the parentheses around all of it, where a statement or an index delimits it anyway."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for pos, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and pos < len(text) - 1:
            return text            # "(a) + (b)": the first parenthesis closes before the end
    return text[1:-1]


# ---- expression emitters ----------------------------------------------------------------------------------------
def _float32(value: float) -> float:
    """``value`` rounded to float32 (what an LLVM float constant holds); too large for float32 -> inf."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _float_literal(value: float, dtype: str) -> str:
    if dtype == "float16":
        value = half_value("float16", value)
    elif dtype == "float32":
        value = _float32(value)
    if math.isnan(value):
        text = "NAN"
    elif math.isinf(value):
        text = "INFINITY" if value > 0 else "(-INFINITY)"
    else:
        # 9 significant digits identify a float32 exactly, 17 a double
        text = "%.17g" % value if dtype == "float64" else "%.9g" % value
        if not re.search(r"[.e]", text):
            text += ".0"
        text += "" if dtype == "float64" else "f"
        return "(%s)" % text if text.startswith("-") else text
    return "((double)%s)" % text if dtype == "float64" else text


def _int_literal(value: int, dtype: str) -> str:
    if dtype in _INT_SUFFIX:
        suffix = _INT_SUFFIX[dtype]
        lo = -(1 << (bits(dtype) - 1))
        if value == lo and not is_unsigned(dtype):    # -2147483648 is unary minus on a literal too big for int
            return "(%d%s - 1%s)" % (value + 1, suffix, suffix)
        text = "%d%s" % (value, suffix)
        return "(%s)" % text if value < 0 else text
    return "((%s)%d)" % (c_type(dtype), value)


def _const(w: _Writer, e: Const) -> str:
    if e.dtype == "bool":
        return "true" if e.value else "false"
    if is_float(e.dtype):
        c_type(e.dtype)
        text = _float_literal(e.value, e.dtype)
        return "((half)%s)" % text if e.dtype == "float16" and w.fp16 else text    # (exact: a half value)
    c_type(e.dtype)
    return _int_literal(e.value, e.dtype)


def _var(w: _Writer, e: Var) -> str:
    name = w.names.get(e)
    if name is None:
        raise CompileError("OpenCL C: variable %r is used outside its loop in kernel %r" % (e.name, w.kernel.name))
    return name


def _load(w: _Writer, e: Load) -> str:
    buf, index = e.buffer, w.expr(e.index)
    if buf.dtype == "float16" and not w.fp16:
        return "vload_half(%s, %s)" % (index, w.half_pointer(buf))
    text = "%s[%s]" % (w.buffer_name(buf), _bare(index))
    return "(%s != 0)" % text if buf.dtype == "bool" else text


def _wrap(dtype: str, text: str) -> str:
    """``text`` (computed in a promoted 32-bit type) back at the width of ``dtype``: narrow types wrap."""
    return "((%s)%s)" % (c_type(dtype), text) if is_int(dtype) and bits(dtype) < 32 else text


def _promoted(dtype: str, text: str) -> str:
    """An operand of a narrow unsigned type as uint, so that C's promotion to int cannot overflow (65535*65535)."""
    return "(uint)%s" % text if is_unsigned(dtype) and bits(dtype) < 32 else text


def _binary(w: _Writer, e: Binary) -> str:
    emit = _BINARY.get(e.op)
    if emit is None:
        raise CompileError("OpenCL C: operator %r is not supported (kernel %r)" % (e.op, w.kernel.name))
    return emit(w, e, w.expr(e.a), w.expr(e.b))


def _arith(w: _Writer, e: Binary, a: str, b: str) -> str:
    dt = e.a.dtype
    if is_float(dt):
        return "(%s %s %s)" % (a, _ARITH.get(e.op, "/"), b)
    if e.op == "div":                                  # the CPU floors integer div like floordiv
        return _floordiv(w, e, a, b)
    if dt == "bool":
        raise CompileError("OpenCL C: %s of bools (kernel %r)" % (e.op, w.kernel.name))
    return _wrap(dt, "(%s %s %s)" % (_promoted(dt, a), _ARITH[e.op], _promoted(dt, b)))


def _floordiv(w: _Writer, e: Binary, a: str, b: str) -> str:
    dt = e.a.dtype
    if is_float(dt) or not is_int(dt):
        raise CompileError("OpenCL C: %s needs integer operands, got %s (kernel %r)" % (e.op, dt, w.kernel.name))
    op = "floormod" if e.op == "floormod" else "floordiv"
    if is_unsigned(dt) or (isinstance(e.b, Const) and e.b.value > 0 and w.non_negative(e.a)):
        return _wrap(dt, "(%s %s %s)" % (a, "%" if op == "floormod" else "/", b))
    ct = "long" if bits(dt) == 64 else "int"
    name = w.helper("tether_%s_%s" % (op, ct), _floor_helper(op, ct))
    return _wrap(dt, "%s(%s, %s)" % (name, a, b))


def _minmax(w: _Writer, e: Binary, a: str, b: str) -> str:
    ct = w.ctype(e.a.dtype)
    name = w.helper("tether_%s_%s" % (e.op, ct), _minmax_helper(e.op, ct))
    return "%s(%s, %s)" % (name, a, b)


def _logic(w: _Writer, e: Binary, a: str, b: str) -> str:
    return "(%s %s %s)" % (a, "&&" if e.op == "and" else "||", b)


def _bitop(w: _Writer, e: Binary, a: str, b: str) -> str:
    dt = e.a.dtype
    if not is_int(dt):
        raise CompileError("OpenCL C: %s needs integer operands, got %s (kernel %r)" % (e.op, dt, w.kernel.name))
    if e.op == "shl":   # shifted unsigned: C leaves a negative left operand undefined, LLVM's shl does not
        unsigned = "ulong" if bits(dt) == 64 else "uint"
        return "((%s)((%s)%s << %s))" % (c_type(dt), unsigned, a, b)
    return _wrap(dt, "(%s %s %s)" % (a, _BITS[e.op], b))


_BINARY: Dict[str, Callable[[_Writer, Binary, str, str], str]] = {
    "add": _arith, "sub": _arith, "mul": _arith, "div": _arith,
    "floordiv": _floordiv, "floormod": _floordiv,
    "min": _minmax, "max": _minmax,
    "and": _logic, "or": _logic,
    "bitand": _bitop, "bitor": _bitop, "bitxor": _bitop, "shl": _bitop, "shr": _bitop,
}


def _compare(w: _Writer, e: Compare) -> str:
    return "(%s %s %s)" % (w.expr(e.a), _CMP[e.op], w.expr(e.b))


def _not(w: _Writer, e: Not) -> str:
    return "(!%s)" % w.expr(e.a)


def _select(w: _Writer, e: Select) -> str:
    # ?: evaluates only the chosen arm, as the CPU does for an arm that might fault
    return "(%s ? %s : %s)" % (w.expr(e.cond), w.expr(e.t), w.expr(e.f))


def _cast(w: _Writer, e: Cast) -> str:
    src, dst = e.value.dtype, e.dtype
    v = w.expr(e.value)
    c_type(src)
    c_type(dst)
    if src == dst or (src, dst) == ("float16", "float32") and not w.fp16:
        return v
    if dst == "bool":
        return "(%s != 0)" % v
    if dst == "float16" and w.fp16:     # one rounding to nearest even (float64 -> half too: no double rounding)
        return "convert_half_rte(%s)" % v
    if dst == "float16":        # rounded to a float16 value, kept as float (the CPU's f32 -> f16 -> f32)
        if src == "float64":    # rounded once, directly: what the CPU's round-to-odd step achieves
            return "%s(%s)" % (w.helper("tether_round_half_d", _ROUND_HALF_D), v)
        name = w.helper("tether_round_half", _ROUND_HALF)
        return "%s(%s)" % (name, v if src == "float32" else "(float)%s" % v)
    return "((%s)%s)" % (w.ctype(dst), v)


def _call(w: _Writer, e: Call) -> str:
    kind = dot4_kind(e)
    if kind is not None:
        name = w.helper("tether_dot4_" + kind, _dot4_helper(kind))
        return "%s(%s, %s)" % (name, w.expr(e.args[0]), w.expr(e.args[1]))
    emit = _CALLS.get(e.name)
    if emit is None:
        raise CompileError("OpenCL C: no math function %r on GPUs (kernel %r); known: %s"
                           % (e.name, w.kernel.name, ", ".join(sorted(_CALLS))))
    arity = 2 if e.name == "pow" else 1
    if len(e.args) != arity:
        raise CompileError("OpenCL C: %s takes %d argument(s), got %d" % (e.name, arity, len(e.args)))
    if not is_float(e.dtype) and e.name != "abs":
        raise CompileError("OpenCL C: %s needs a float argument, got %s (kernel %r)"
                           % (e.name, e.dtype, w.kernel.name))
    if e.dtype == "float16" and w.fp16:
        # computed in float, rounded to half once: the CPU's float16 math, rounded at the call
        args = ["(float)%s" % w.expr(a) for a in e.args]
        return "convert_half_rte(%s)" % emit(w, Call(e.name, list(e.args), "float32"), args)
    return emit(w, e, [w.expr(a) for a in e.args])


def _builtin(fn: str) -> Callable[[_Writer, Call, List[str]], str]:
    """A call of the OpenCL builtin ``fn``, which has the CPU's meaning (IEEE special cases included)."""
    return lambda w, e, args: "%s(%s)" % (fn, ", ".join(args))


def _abs(w: _Writer, e: Call, args: List[str]) -> str:
    dt = e.dtype
    if is_float(dt):
        return "fabs(%s)" % args[0]
    if is_unsigned(dt) or dt == "bool":
        return args[0]
    ct = "long" if bits(dt) == 64 else "int"
    return _wrap(dt, "%s(%s)" % (w.helper("tether_abs_" + ct, _abs_helper(ct)), args[0]))


def _rsqrt(w: _Writer, e: Call, args: List[str]) -> str:
    # the CPU's 1 / sqrt(x), not the builtin rsqrt (2 ulp)
    return "(%s / sqrt(%s))" % ("1.0" if e.dtype == "float64" else "1.0f", args[0])


def _sigmoid(w: _Writer, e: Call, args: List[str]) -> str:
    ct = c_type(e.dtype)
    return "%s(%s)" % (w.helper("tether_sigmoid_" + ct, _sigmoid_helper(ct)), args[0])


# math call name -> emitter; every name codegen/mathlib.py implements (dot4_* are handled before the table)
_CALLS: Dict[str, Callable[[_Writer, Call, List[str]], str]] = {
    "exp": _builtin("exp"), "log": _builtin("log"), "sqrt": _builtin("sqrt"), "tanh": _builtin("tanh"),
    "erf": _builtin("erf"), "pow": _builtin("pow"), "floor": _builtin("floor"), "ceil": _builtin("ceil"),
    "round_even": _builtin("rint"),      # rint rounds half to even in the default rounding mode
    "sin": _builtin("sin"), "cos": _builtin("cos"), "tan": _builtin("tan"),
    "asin": _builtin("asin"), "acos": _builtin("acos"), "atan": _builtin("atan"),
    "abs": _abs, "fabs": _abs, "rsqrt": _rsqrt, "sigmoid": _sigmoid,
}

_EXPR: Dict[type, Callable[[_Writer, Expr], str]] = {
    Const: _const, Var: _var, Load: _load, Binary: _binary, Compare: _compare, Not: _not, Select: _select,
    Cast: _cast, Call: _call,
}


# ---- statement emitters -----------------------------------------------------------------------------------------
def _seq(w: _Writer, s: SeqStmt, pad: str) -> None:
    for x in s.stmts:
        w.stmt(x, pad)


def _for(w: _Writer, s: For, pad: str) -> None:
    if s.kind == "thread":
        raise CompileError("OpenCL C: kernel %r still has a thread loop over %r (device kernels take their thread "
                           "indices from thread_of)" % (w.kernel.name, s.var.name))
    if s.kind not in ("serial", "unrolled", "vectorized", "parallel"):
        raise CompileError("OpenCL C: loop kind %r is not supported (kernel %r)" % (s.kind, w.kernel.name))
    # vectorized: a plain loop the driver's compiler vectorises; parallel: one thread runs it in order
    lo = w.expr(s.min)
    ext = w.expr(s.extent)
    name = w.names.add(s.var, s.var.name)
    end = ext if isinstance(s.min, Const) and s.min.value == 0 else "%s + %s" % (lo, ext)
    if s.kind == "unrolled":
        w.lines.append(pad + "#pragma unroll")
    w.lines.append("%sfor (%s %s = %s; %s < %s; ++%s) {" % (pad, c_type(s.var.dtype), name, lo, name, end, name))
    simplifier = Simplifier(w.ranges)
    b_min, b_ext = simplifier.bound(s.min), simplifier.bound(s.extent)
    if b_min is not None and b_ext is not None:
        w.ranges[s.var] = (b_min[0], b_min[1] + max(b_ext[1], 1) - 1)
    w.stmt(s.body, pad + "  ")
    w.ranges.pop(s.var, None)
    w.lines.append(pad + "}")


def _store(w: _Writer, s: Store, pad: str) -> None:
    # a reduction's update is an ordinary store: one thread owns each element it combines into
    buf = s.buffer
    index, value = _bare(w.expr(s.index)), _bare(w.expr(s.value))
    if buf.dtype == "float16" and not w.fp16:    # (with fp16, a half array written as any other)
        w.lines.append("%svstore_half_rte(%s, %s, %s);" % (pad, value, index, w.half_pointer(buf)))
        return
    if buf.dtype == "bool":
        value = "(uchar)(%s)" % value
    w.lines.append("%s%s[%s] = %s;" % (pad, w.buffer_name(buf), index, value))


def _allocate(w: _Writer, s: Allocate, pad: str) -> None:
    buf = s.buffer
    if buf.scope not in ("shared", "local"):
        raise CompileError("OpenCL C: allocation %r in kernel %r has scope %r, expected 'shared' or 'local'"
                           % (buf.name, w.kernel.name, buf.scope))
    # float16 arrays are ushort (a half array needs cl_khr_fp16); accessed through a half* cast
    ct = "ushort" if buf.dtype == "float16" and not w.fp16 else c_type(buf.dtype, storage=True)
    name = w.names.add(buf, buf.name)
    decl = "%s %s[%d];" % (ct, name, max(buf.size, 1))
    if buf.scope == "shared":      # OpenCL only allows __local variables at the kernel's outermost scope
        w.shared_decls.append("  __local " + decl)
        w.scope[id(buf)] = "__local"
        w.stmt(s.body, pad)
        del w.scope[id(buf)]
        return
    w.lines.append(pad + "{")
    w.lines.append(pad + "  " + decl)
    w.scope[id(buf)] = "__private"
    w.stmt(s.body, pad + "  ")
    del w.scope[id(buf)]
    w.lines.append(pad + "}")


def _if(w: _Writer, s: IfThenElse, pad: str) -> None:
    w.lines.append("%sif (%s) {" % (pad, _bare(w.expr(s.cond))))
    w.stmt(s.then_case, pad + "  ")
    if s.else_case is not None:
        w.lines.append(pad + "} else {")
        w.stmt(s.else_case, pad + "  ")
    w.lines.append(pad + "}")


def _barrier(w: _Writer, s: Barrier, pad: str) -> None:
    w.lines.append(pad + "barrier(CLK_LOCAL_MEM_FENCE);")


_STMT: Dict[type, Callable[[_Writer, Stmt, str], None]] = {
    SeqStmt: _seq, For: _for, Store: _store, Allocate: _allocate, IfThenElse: _if, Barrier: _barrier,
    Prefetch: lambda w, s, pad: None,     # (a CPU cache hint)
}


# ---- programs ---------------------------------------------------------------------------------------------------
_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _dtypes(kernel: DeviceKernel) -> Set[str]:
    """Every dtype a kernel's buffers and expressions have."""
    out = {b.dtype for b in kernel.params} | {v.dtype for v in kernel.scalars}
    for s in walk(kernel.body):
        if isinstance(s, Allocate):
            out.add(s.buffer.dtype)
        for field in ("index", "value", "cond", "min", "extent"):
            e = getattr(s, field, None)
            if isinstance(e, Expr):
                out.update(n.dtype for n in walk(e))
    return out


def opencl_needs(kernel: DeviceKernel, fp16: bool = False) -> FrozenSet[str]:
    """The kernel's needs plus the optional device features its OpenCL C uses: ``"fp64"`` for float64, ``"fp16"``
    for float16 computed as half (``fp16``)."""
    dtypes = _dtypes(kernel)
    extra = {"fp64"} if "float64" in dtypes else set()
    if fp16 and "float16" in dtypes:
        extra.add("fp16")
    return frozenset(kernel.needs) | extra


def opencl_launch_info(kernel: DeviceKernel, fp16: bool = False) -> Dict[str, object]:
    """``kernel.launch_info()`` with the needs of its OpenCL C (:func:`opencl_needs`): what a module's metadata
    records for the runtime, which refuses a kernel whose needs the device lacks."""
    return dict(kernel.launch_info(), needs=sorted(opencl_needs(kernel, fp16)))


def opencl_source(kernels: Sequence[DeviceKernel], fp16: bool = False) -> str:
    """One OpenCL C program holding ``kernels`` (names must be distinct C identifiers: they are the launch's
    lookup key). The kernels are not changed: the device features the code needs are :func:`opencl_needs` of
    each kernel, recorded by :func:`opencl_launch_info`. ``fp16``: compute float16 as ``half`` (cl_khr_fp16; the
    target promises it), else as float like the CPU."""
    kernels = list(kernels)
    if not kernels:
        raise CompileError("OpenCL C: a program needs at least one kernel")
    seen: Set[str] = set()
    for k in kernels:
        if (not _KERNEL_NAME.match(k.name) or k.name in _RESERVED or _VECTOR_TYPE.match(k.name)
                or k.name.startswith((_HELPER_PREFIX, "__"))):
            raise CompileError("OpenCL C: kernel name %r is not usable as an OpenCL C function name (a C identifier, "
                               "not an OpenCL C keyword, type or builtin function, not starting with tether_ or __)"
                               % k.name)
        if k.name in seen:
            raise CompileError("OpenCL C: two kernels named %r in one program" % k.name)
        seen.add(k.name)
    helpers: Dict[str, str] = {}
    bodies = [_Writer(k, helpers, fp16).kernel_text() for k in kernels]
    head = ["// generated by tether.codegen.opencl_c", "#pragma OPENCL FP_CONTRACT OFF"]
    if any("fp64" in opencl_needs(k) for k in kernels):
        head.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if any("fp16" in opencl_needs(k, fp16) for k in kernels):
        head.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    if helpers:
        head += [""] + list(helpers.values())
    return "\n".join(head + ["", "\n\n".join(bodies), ""])


__all__ = ["c_type", "opencl_launch_info", "opencl_needs", "opencl_source"]
