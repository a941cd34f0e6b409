"""The packed ABI of docs/abi.md around each impl function: ``i32 NAME(ptr args, ptr type_codes, i32 num_args)``.

Each wrapper validates every argument once at the call boundary (so the generated loops never need bounds
checks) through one argument checker shared by the module, then calls the impl with the data pointers.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

from llvmlite import ir
from tether_rpc.dlpack import TETHER_DLTENSOR

from tether.codegen.types import I32, I64, PTR, dtype_word

# abi.md return-code kinds (the checker's IR below spells them as ``kind << 24``).
ERR_NUM_ARGS, ERR_TYPE_CODE, ERR_NDIM, ERR_DTYPE, ERR_SHAPE, ERR_STRIDES, ERR_NULL_DATA, ERR_PARALLEL = range(1, 9)


def error_code(kind: int, arg: int = 0, dim: int = 0) -> int:
    """The abi.md return code for an argument error."""
    return (kind << 24) | ((arg & 0xFFFF) << 8) | (dim & 0xFF)


class WrapperWriter:
    """Emits one packed wrapper: a constant table describing the expected arguments, one call of the module's
    shared checker (ARG_CHECKER_IR) that validates them and fills in the data pointers, then the impl call.

    Why a table and a shared checker rather than inline checks: the inline form was ~250 lines of IR per kernel
    (a block per argument, dimension and stride), which cost about 40% of LLVM's time on elementwise kernels."""

    def __init__(self, fn: ir.Function) -> None:
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))

    def write(self, args_meta: Sequence[Dict[str, Any]], impl_fn: ir.Function) -> None:
        b = self.b
        module = self.fn.module
        args, codes, num = self.fn.args
        n = len(args_meta)
        words = [n]
        for meta in args_meta:
            shape = [int(x) for x in meta["shape"]]
            numel = 1
            for extent in shape:
                numel *= extent
            words += [len(shape), dtype_word(meta["dtype"]), 1 if numel else 0] + shape
        table_ty = ir.ArrayType(I64, len(words))
        table = ir.GlobalVariable(module, table_ty, "%s.argtable" % self.fn.name)
        table.linkage = "internal"
        table.global_constant = True
        table.initializer = ir.Constant(table_ty, words)
        checker = _arg_checker(module)
        ptrs_ty = ir.ArrayType(PTR, max(n, 1))
        ptrs = b.alloca(ptrs_ty, name="ptrs")
        ptrs.type = PTR     # opaque pointers (LLVM 17+): llvmlite would print a typed pointer
        rc0 = b.call(checker, [args, codes, num, table, ptrs], name="check")
        ok = self.fn.append_basic_block("args.ok")
        bad = self.fn.append_basic_block("args.bad")
        b.cbranch(b.icmp_signed("==", rc0, ir.Constant(I32, 0)), ok, bad)
        b.position_at_end(bad)
        b.ret(rc0)
        b.position_at_end(ok)
        data_ptrs = [b.load(b.gep(ptrs, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True,
                                  source_etype=ptrs_ty), typ=PTR, name="p%d" % i) for i in range(n)]
        rc = b.call(impl_fn, data_ptrs, name="rc")
        # The impl returns 0 or a launcher failure; make sure a bare task code still reads as "parallel task failed".
        is_plain = b.icmp_unsigned("<", rc, ir.Constant(I32, 1 << 24))
        is_err = b.icmp_unsigned("!=", rc, ir.Constant(I32, 0))
        wrapped = b.or_(b.and_(rc, ir.Constant(I32, 0xFFFFFF)), ir.Constant(I32, ERR_PARALLEL << 24))
        b.ret(b.select(b.and_(is_plain, is_err), wrapped, rc))


ARG_CHECKER = "tether.check_args"


def _arg_checker(module: ir.Module) -> ir.Function:
    """The declaration of the module's argument checker; finish() appends its definition (ARG_CHECKER_IR)."""
    try:
        return module.get_global(ARG_CHECKER)
    except KeyError:
        return ir.Function(module, ir.FunctionType(I32, [PTR, PTR, I32, PTR, PTR]), ARG_CHECKER)


# The DLTensor struct (DLPack 0.x): data, device{type,id}, ndim, dtype{code,bits,lanes}, shape, strides, byte_offset.
_DLTENSOR_IR = "{ ptr, { i32, i32 }, i32, { i8, i8, i16 }, ptr, ptr, i64 }"


def _field_check(check: str, field: int, value: str, short: str, err: str, next_block: str) -> str:
    """Blocks ``chk.<check>``/``bad.<check>``: the i32 DLTensor field ``field`` must equal ``%<value>_e``."""
    return """chk.{check}:
  %{short}p = getelementptr inbounds $DLTENSOR, ptr %h, i32 0, i32 {field}
  %{value} = load i32, ptr %{short}p, align 4
  %{short}ok = icmp eq i32 %{value}, %{value}_e
  br i1 %{short}ok, label %{next_block}, label %bad.{check}
bad.{check}:
  %rc_{short} = or i32 %argbits, ${err}
  ret i32 %rc_{short}
""".format(check=check, field=field, value=value, short=short, err=err, next_block=next_block)


def _fill(template: str) -> str:
    """The checker's IR with the ABI's constants (``$NAME``) spelled in: error kinds as ``kind << 24``."""
    template = template.replace("$CHECK_NDIM", _field_check("ndim", 2, "ndim", "nd", "ERR_NDIM", "chk.dtype"))
    template = template.replace("$CHECK_DTYPE", _field_check("dtype", 3, "dt", "d", "ERR_DTYPE", "chk.rank"))
    values = {"DLTENSOR": _DLTENSOR_IR, "TETHER_DLTENSOR": str(TETHER_DLTENSOR)}
    values.update((name, str(kind << 24)) for name, kind in (
        ("ERR_NUM_ARGS", ERR_NUM_ARGS), ("ERR_TYPE_CODE", ERR_TYPE_CODE), ("ERR_NDIM", ERR_NDIM),
        ("ERR_DTYPE", ERR_DTYPE), ("ERR_SHAPE", ERR_SHAPE), ("ERR_STRIDES", ERR_STRIDES),
        ("ERR_NULL_DATA", ERR_NULL_DATA)))
    # longest names first: $DLTENSOR must not eat the start of a longer name
    for name in sorted(values, key=len, reverse=True):
        template = template.replace("$" + name, values[name])
    return template


# i32 check(ptr args, ptr type_codes, i32 num_args, ptr table, ptr out_data_ptrs): 0, or the abi.md code of the first
# argument error, in the order the ABI documents (count, then per argument: type code, handle, ndim, dtype, each
# extent, strides, data). table (i64): num_args, then per argument ndim, dtype word, numel != 0, extents...
ARG_CHECKER_IR = _fill(r"""
define internal i32 @"tether.check_args"(ptr %args, ptr %codes, i32 %num, ptr %table, ptr %out) nounwind noinline {
entry:
  %n64 = load i64, ptr %table, align 8
  %n = trunc i64 %n64 to i32
  %countok = icmp eq i32 %num, %n
  br i1 %countok, label %arg.head, label %bad.count
bad.count:
  %nm = and i32 %num, 16777215
  %rcn = or i32 %nm, $ERR_NUM_ARGS
  ret i32 %rcn
arg.head:
  %i = phi i32 [ 0, %entry ], [ %i1, %arg.next ]
  %pos = phi i64 [ 1, %entry ], [ %posn, %arg.next ]
  %more = icmp slt i32 %i, %n
  br i1 %more, label %arg.body, label %done
done:
  ret i32 0
arg.body:
  %argbits = shl i32 %i, 8
  %tp = getelementptr inbounds i64, ptr %table, i64 %pos
  %ndim_e64 = load i64, ptr %tp, align 8
  %ndim_e = trunc i64 %ndim_e64 to i32
  %pos1 = add i64 %pos, 1
  %dtp = getelementptr inbounds i64, ptr %table, i64 %pos1
  %dt_e64 = load i64, ptr %dtp, align 8
  %dt_e = trunc i64 %dt_e64 to i32
  %pos2 = add i64 %pos, 2
  %nep = getelementptr inbounds i64, ptr %table, i64 %pos2
  %nonempty = load i64, ptr %nep, align 8
  %ext0 = add i64 %pos, 3
  %i64i = zext i32 %i to i64
  %cp = getelementptr inbounds i32, ptr %codes, i64 %i64i
  %code = load i32, ptr %cp, align 4
  %codeok = icmp eq i32 %code, $TETHER_DLTENSOR
  br i1 %codeok, label %chk.handle, label %bad.code
bad.code:
  %rc_code = or i32 %argbits, $ERR_TYPE_CODE
  ret i32 %rc_code
chk.handle:
  %off8 = mul i64 %i64i, 8
  %slot = getelementptr inbounds i8, ptr %args, i64 %off8
  %h = load ptr, ptr %slot, align 4
  %hnull = icmp eq ptr %h, null
  br i1 %hnull, label %bad.null, label %chk.ndim
bad.null:
  %rc_null = or i32 %argbits, $ERR_NULL_DATA
  ret i32 %rc_null
$CHECK_NDIM$CHECK_DTYPEchk.rank:
  %scalar = icmp eq i32 %ndim_e, 0
  br i1 %scalar, label %chk.data, label %shape.pre
shape.pre:
  %shpp = getelementptr inbounds $DLTENSOR, ptr %h, i32 0, i32 4
  %shp = load ptr, ptr %shpp, align 4
  br label %shape.head
shape.head:
  %d = phi i32 [ 0, %shape.pre ], [ %d1, %shape.ok ]
  %dmore = icmp slt i32 %d, %ndim_e
  br i1 %dmore, label %shape.body, label %strides.pre
shape.body:
  %d64 = zext i32 %d to i64
  %sp = getelementptr inbounds i64, ptr %shp, i64 %d64
  %e = load i64, ptr %sp, align 4
  %tpos = add i64 %ext0, %d64
  %tep = getelementptr inbounds i64, ptr %table, i64 %tpos
  %e_exp = load i64, ptr %tep, align 8
  %eok = icmp eq i64 %e, %e_exp
  br i1 %eok, label %shape.ok, label %bad.shape
shape.ok:
  %d1 = add i32 %d, 1
  br label %shape.head
bad.shape:
  %dbits = and i32 %d, 255
  %rc_s0 = or i32 %argbits, %dbits
  %rc_s = or i32 %rc_s0, $ERR_SHAPE
  ret i32 %rc_s
strides.pre:
  %stpp = getelementptr inbounds $DLTENSOR, ptr %h, i32 0, i32 5
  %stp = load ptr, ptr %stpp, align 4
  %stnull = icmp eq ptr %stp, null
  br i1 %stnull, label %chk.data, label %strides.first
strides.first:
  %dlast = sub i32 %ndim_e, 1
  br label %strides.head
strides.head:
  %sd = phi i32 [ %dlast, %strides.first ], [ %sd1, %strides.next ]
  %expect = phi i64 [ 1, %strides.first ], [ %expect1, %strides.next ]
  %sdmore = icmp sge i32 %sd, 0
  br i1 %sdmore, label %strides.body, label %chk.data
strides.body:
  %sd64 = zext i32 %sd to i64
  %stpos = add i64 %ext0, %sd64
  %step = getelementptr inbounds i64, ptr %table, i64 %stpos
  %sext = load i64, ptr %step, align 8
  %unit = icmp eq i64 %sext, 1
  br i1 %unit, label %strides.next, label %strides.cmp
strides.cmp:
  %stq = getelementptr inbounds i64, ptr %stp, i64 %sd64
  %stride = load i64, ptr %stq, align 4
  %stok = icmp eq i64 %stride, %expect
  br i1 %stok, label %strides.next, label %bad.stride
bad.stride:
  %sdbits = and i32 %sd, 255
  %rc_t0 = or i32 %argbits, %sdbits
  %rc_t = or i32 %rc_t0, $ERR_STRIDES
  ret i32 %rc_t
strides.next:
  %expect1 = mul i64 %expect, %sext
  %sd1 = sub i32 %sd, 1
  br label %strides.head
chk.data:
  %datap = getelementptr inbounds $DLTENSOR, ptr %h, i32 0, i32 0
  %data = load ptr, ptr %datap, align 4
  %dnull = icmp eq ptr %data, null
  %needdata = icmp ne i64 %nonempty, 0
  %baddata = and i1 %dnull, %needdata
  br i1 %baddata, label %bad.null, label %store
store:
  %offp = getelementptr inbounds $DLTENSOR, ptr %h, i32 0, i32 6
  %off = load i64, ptr %offp, align 4
  %pdata = getelementptr inbounds i8, ptr %data, i64 %off
  %outp = getelementptr inbounds ptr, ptr %out, i64 %i64i
  store ptr %pdata, ptr %outp, align 4
  br label %arg.next
arg.next:
  %i1 = add i32 %i, 1
  %ndim_e64b = zext i32 %ndim_e to i64
  %posn = add i64 %ext0, %ndim_e64b
  br label %arg.head
}
""")


