"""The loop IR: scalar expressions (expr), buffers and statements (stmt) forming a PrimFunc, generic traversal
(visit), arithmetic simplification (simplify) and passes (transform). te lowers to it; codegen reads it."""
from tether.tir.buffer import Buffer  # noqa: F401
from tether.tir.dtype import DTYPES, bits, check_dtype, is_bool, is_float, is_int, is_unsigned, rank  # noqa: F401
from tether.tir.expr import (Binary, Call, Cast, Compare, Const, Expr, Load, Not, PackedCall, Reduce,  # noqa: F401
                             Select, TensorLoad, Var, call_packed)
from tether.tir.stmt import Allocate, For, IfThenElse, Prefetch, PrimFunc, SeqStmt, Stmt, Store, seq  # noqa: F401
from tether.tir.visit import children, map_children, rebuild, replace, substitute, walk  # noqa: F401
from tether.tir.int8 import (DOT4_KINDS, byte_of, byte_of_parts, dot4, dot4_kind, is_pair_dot, is_quad_sum,  # noqa: F401
                             pair_dot, quad_sum)
