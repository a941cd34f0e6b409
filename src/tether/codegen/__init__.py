"""LLVM code generation: loop IR -> llvmlite IR (llvm.py), math, module boilerplate, object emission."""
