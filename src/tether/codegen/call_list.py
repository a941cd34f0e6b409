"""``tether_run_calls``: a module makes a list of packed-function calls in one native call.

A graph executor in Python pays an interpreter round and a ctypes call per kernel: thousands of instructions per
kernel on a board's core, more than the work of a small model's kernels. With this export the runtime packs the
calls once (function address, argument values, type codes, count: the arguments ``bind`` already converted) and
each run is one ctypes call that walks the list, as a C executor would (docs/abi.md "Call lists").

Export (C view)::

    typedef struct { TetherPackedFunc fn; const TetherValue* values; const int32_t* codes; int32_t num_args; }
        TetherCall;
    int32_t tether_run_calls(const TetherCall* calls, int32_t num_calls, int32_t* failed);

It returns 0 when every call returned 0; otherwise the first nonzero return code, with that call's index in
``*failed`` and no later call made.
"""
from __future__ import annotations

from tether.target import Target

# metadata "call_list": the version of the record layout above. A runtime uses the export only for versions it
# knows.
CALL_LIST_VERSION = 1
EXPORTED_SYMBOLS = ("tether_run_calls",)


def call_list_ir(target: Target) -> str:
    """The export's LLVM IR for ``target``: to be appended to a module's IR text (default-visible)."""
    rec = "{ ptr, ptr, ptr, i32 }"
    align = target.pointer_bytes
    return """
; ---- tether call list (src/tether/codegen/call_list.py) ----
define i32 @tether_run_calls(ptr %calls, i32 %n, ptr %failed) nounwind {{
entry:
  %none = icmp sle i32 %n, 0
  br i1 %none, label %done, label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %next, %ok ]
  %rec = getelementptr inbounds {rec}, ptr %calls, i32 %i
  %fn.p = getelementptr inbounds {rec}, ptr %rec, i32 0, i32 0
  %fn = load ptr, ptr %fn.p, align {align}
  %values.p = getelementptr inbounds {rec}, ptr %rec, i32 0, i32 1
  %values = load ptr, ptr %values.p, align {align}
  %codes.p = getelementptr inbounds {rec}, ptr %rec, i32 0, i32 2
  %codes = load ptr, ptr %codes.p, align {align}
  %nargs.p = getelementptr inbounds {rec}, ptr %rec, i32 0, i32 3
  %nargs = load i32, ptr %nargs.p, align 4
  %rc = call i32 %fn(ptr %values, ptr %codes, i32 %nargs)
  %bad = icmp ne i32 %rc, 0
  br i1 %bad, label %fail, label %ok
ok:
  %next = add nuw i32 %i, 1
  %more = icmp slt i32 %next, %n
  br i1 %more, label %loop, label %done
fail:
  store i32 %i, ptr %failed, align 4
  ret i32 %rc
done:
  ret i32 0
}}
""".format(rec=rec, align=align)
