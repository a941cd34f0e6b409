"""Loop IR produced by lowering and consumed by LLVM code generation."""
from tether.tir.nodes import (Buffer, Load, Stmt, For, Store, Allocate, IfThenElse, SeqStmt, PrimFunc,  # noqa: F401
                              seq, walk_stmts)
