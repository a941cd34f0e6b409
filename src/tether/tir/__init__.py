"""Loop IR produced by lowering and consumed by LLVM code generation."""
from tether.tir.nodes import (Buffer, Load, Stmt, For, Store, Allocate, IfThenElse, SeqStmt, PrimFunc,  # noqa: F401
                              seq, walk_stmts)
# The scalar expression nodes codegen reads (they move into tir on the tir branch; codegen imports them from here).
from tether.te.expr import (Binary, Call, Cast, Compare, Const, Expr, Not, Select, Var,  # noqa: F401
                            is_bool, is_float)
from tether.te.tensor import children, substitute, walk  # noqa: F401
