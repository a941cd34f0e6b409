"""LLVM code generation: tir.PrimFunc -> llvmlite IR -> object code.

types (dtype -> LLVM type) · expr (expressions) · function (statements, loops; emit_function) · parallel
(outlined parallel loops) · packed (the packed-ABI wrappers and argument checker) · runtime (launcher slot,
metadata, memcpy/memset, armv7 __aeabi_* helpers) · mathlib (self-contained math) · threadpool (native pool IR)
· call_list (tether_run_calls: a graph's kernels in one native call) · module (ModuleBuilder: one module's
text) · emit (IR text -> optimised object code).
"""
