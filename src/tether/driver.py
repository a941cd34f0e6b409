"""tether.build / tether.lower: schedule -> loop IR -> LLVM -> object code, wrapped in a Module artifact.

    tether.lower(s, [A, B, C])                                   # tir.PrimFunc, prints readable loop IR
    lib = tether.build(s, [A, B, C], target="rasp4b", name="vadd")
    lib = tether.build([(s1, [A, B], "f"), (s2, [X, Y], "g")], target="rasp4b", name="both")
"""
from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from typing import Any, List, Optional, Sequence, Tuple, Union

import msgpack

from tether.artifact import Module
from tether.codegen import scratch
from tether.codegen.emit import compile_module
from tether.codegen.module import ModuleBuilder
from tether.errors import CompileError
from tether.target import Target, as_target

log = logging.getLogger(__name__)


def lower(sch: Any, args: Sequence[Any], name: str = "default") -> Any:
    """Lower a schedule to a ``tether.tir.PrimFunc`` (``print()`` it to read the loop IR)."""
    from tether.te.lower import lower as _lower

    return _lower(sch, list(args), name)


def _is_primfunc(obj: Any) -> bool:
    return hasattr(obj, "params") and hasattr(obj, "name") and not isinstance(obj, (tuple, list))


def _work_items(sch_or_funcs: Any, args: Optional[Sequence[Any]], name: str) -> List[Any]:
    """Normalise build's first two arguments into PrimFuncs and (schedule, args, name) triples (lowered later,
    possibly in a build worker)."""
    if _is_primfunc(sch_or_funcs):
        return [sch_or_funcs]
    if isinstance(sch_or_funcs, (list, tuple)) and sch_or_funcs and args is None:
        for item in sch_or_funcs:
            if not (_is_primfunc(item) or (isinstance(item, (list, tuple)) and len(item) == 3)):
                raise CompileError("build() takes a schedule and its args, a PrimFunc, or a list of PrimFuncs / "
                                   "(schedule, args, name) triples; got an item %r" % (item,))
        return list(sch_or_funcs)
    if args is None:
        raise CompileError("build(schedule, args, ...): the tensors to pass (inputs then outputs) are missing")
    return [(sch_or_funcs, args, name)]


def _item_name(item: Any) -> str:
    return str(item.name) if _is_primfunc(item) else str(item[2])


def _lowered(item: Any) -> Any:
    return item if _is_primfunc(item) else lower(*item)


# Below this many kernels one process builds everything: a build worker costs a fork and a link step (~20 ms),
# a kernel 50-300 ms of lowering, IR generation and LLVM.
PARALLEL_BUILD_MIN_FUNCS = 6
BUILD_TIMEOUT_S = 1800.0


def build_jobs(requested: Optional[int], num_funcs: int) -> int:
    """Worker processes for a build: ``requested``, else TETHER_BUILD_JOBS, else the CPUs this process may use;
    1 for small builds and where there is no fork()."""
    if requested is None:
        env = os.environ.get("TETHER_BUILD_JOBS", "").strip()
        if env:
            try:
                requested = int(env)
            except ValueError:
                log.warning("ignoring TETHER_BUILD_JOBS=%r: expected a positive integer", env)
    if requested is None:
        try:
            requested = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            requested = os.cpu_count() or 1
    if num_funcs < PARALLEL_BUILD_MIN_FUNCS or not hasattr(os, "fork"):
        return 1
    return max(1, min(int(requested), num_funcs // 2, 16))


def build(sch_or_funcs: Any, args: Optional[Sequence[Any]] = None, target: Union[str, Target] = "host",
          name: str = "default", fast_math: bool = False, opt: int = 3, jobs: Optional[int] = None) -> Module:
    """Compile a schedule (or PrimFuncs) for ``target`` into a Module artifact; see ``Module.export_library``.

    For a GPU target ("opencl", "vulkan", "cuda -arch=sm_80", "rasp5-vulkan"...) the schedule binds its loops to
    GPU threads; the result is a tether.gpu_build.GpuModule: the host's library carrying the device code.

    A build of many kernels runs in ``jobs`` worker processes (default: one per CPU; TETHER_BUILD_JOBS), each
    compiling a share of the kernels into its own object; the objects and a runtime part are merged into one."""
    tgt = as_target(target)
    items = _work_items(sch_or_funcs, args, name)
    names = [_item_name(it) for it in items]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CompileError("module %r has more than one function named %s" % (name, ", ".join(dup)))
    if tgt.gpu is not None:   # a GPU target: the kernels run on the device (tether.gpu_build)
        from tether.gpu_build import build_gpu

        return build_gpu([_lowered(it) for it in items], tgt, name, opt=opt)
    n_jobs = build_jobs(jobs, len(items))
    if n_jobs > 1:
        return _build_in_parts(items, names, tgt, name, fast_math, opt, n_jobs)
    from tether.codegen.function import emit_function

    t0 = time.perf_counter()
    funcs = [_lowered(it) for it in items]
    t_lower = time.perf_counter() - t0
    mb = ModuleBuilder(tgt, name, fast_math=fast_math)
    for pf in funcs:
        impl = emit_function(mb, pf)
        mb.add_packed(pf, impl)
    ir_text = mb.finish()
    t_codegen = time.perf_counter() - t0 - t_lower
    compiled = compile_module(ir_text, tgt, opt=opt)
    log.info("built %s for %s: lower %.3fs, codegen %.3fs, llvm %.3fs", [f.name for f in funcs],
             tgt.preset or tgt.triple, t_lower, t_codegen, compiled.seconds)
    assert mb.metadata is not None
    return Module(name, tgt, ir_text, compiled, mb.metadata)


def _build_kernels_part(items: Sequence[Any], tgt: Target, name: str, fast_math: bool, opt: int) -> dict:
    """Lower, generate and compile some kernels as a "kernels" part (runs in a build worker)."""
    from tether.codegen.function import emit_function

    mb = ModuleBuilder(tgt, name, fast_math=fast_math, part="kernels")
    for item in items:
        pf = _lowered(item)
        mb.add_packed(pf, emit_function(mb, pf))
    ir_text = mb.finish()
    compiled = compile_module(ir_text, tgt, opt=opt)
    return {"ok": True, "obj": compiled.object_bytes, "ir": ir_text, "opt_ir": compiled.optimized_ir,
            "functions": mb.function_entries(), "seconds": compiled.seconds, "scratch": scratch.arena_bytes(mb)}


# A worker's exit status when writing its report failed (seen with a full /tmp on a shared machine).
REPORT_WRITE_FAILED = 3


def _run_worker(items: Sequence[Any], tgt: Target, name: str, fast_math: bool, opt: int, path: str) -> None:
    """The forked build worker: write the part (or the error) to ``path`` and leave without running the
    parent's exit handlers."""
    code = 0
    try:
        try:
            payload = _build_kernels_part(items, tgt, name, fast_math, opt)
        except BaseException as exc:   # reported to the parent, which raises it
            payload = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
        with open(path, "wb") as f:
            f.write(msgpack.packb(payload, use_bin_type=True))
    except OSError:
        code = REPORT_WRITE_FAILED
    except BaseException:
        code = 1
    finally:
        os._exit(code)


# A worker that has used no CPU for this long is blocked, not slow: fork() copies only the calling thread, so a
# lock another thread of the parent held at that moment (seen with onnxruntime's pool running beside a build) is
# never released in the child. Its share is then built here instead.
STALL_S = 20.0


def _cpu_ticks(pid: int) -> Optional[int]:
    """utime + stime of a child from /proc, or None where /proc does not tell."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _wait_workers(workers: List[Tuple[int, str]], deadline: float) -> List[int]:
    """Reap the workers; returns the indices of those killed because they stalled (no CPU time for STALL_S)."""
    stall_s = STALL_S
    pending = {pid: k for k, (pid, _) in enumerate(workers)}
    progress = {pid: (_cpu_ticks(pid), time.monotonic()) for pid in pending}
    stalled: List[int] = []
    # Reaping is checked every 5 ms (a build's end is latency); CPU progress, which costs /proc reads, once a second.
    next_check = time.monotonic() + 1.0
    while pending:
        for pid in list(pending):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                k = pending.pop(pid)
                if status != 0 and k not in stalled:
                    why = (" (it could not write its report: is the temporary directory's disk full?)"
                           if os.WIFEXITED(status) and os.WEXITSTATUS(status) == REPORT_WRITE_FAILED else "")
                    raise CompileError("build worker %d failed (wait status %d) without a report%s"
                                       % (pid, status, why))
                continue
            if pending[pid] in stalled:   # killed, not yet reaped
                continue
            now = time.monotonic()
            if now < next_check:
                continue
            ticks, since = progress[pid]
            now_ticks = _cpu_ticks(pid)
            if now_ticks is None or now_ticks != ticks:
                progress[pid] = (now_ticks, now)
            elif now - since > stall_s:
                log.warning("build worker %d used no CPU for %.0fs (blocked on a lock copied by fork?): killed; "
                            "its kernels are built in this process", pid, stall_s)
                stalled.append(pending[pid])
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + 1.0
        if pending:
            if time.monotonic() > deadline:
                raise CompileError("build workers did not finish within %.0fs" % BUILD_TIMEOUT_S)
            time.sleep(0.005)
    return stalled


def _raise_worker_error(payload: dict) -> None:
    from tether import errors

    cls = getattr(errors, str(payload.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = CompileError
    raise cls(payload.get("message", "a build worker failed"))


def _build_in_parts(items: Sequence[Any], names: List[str], tgt: Target, name: str, fast_math: bool, opt: int,
                    jobs: int) -> Module:
    """Build the kernels in ``jobs`` forked workers (dealt round-robin, so expensive and cheap kernels mix),
    then a runtime part here, and merge the objects into one (link.link_relocatable)."""
    from tether.codegen.emit import CompiledObject
    from tether.link import link_relocatable

    t0 = time.perf_counter()
    shares = [list(range(k, len(items), jobs)) for k in range(jobs)]
    workers: List[Tuple[int, str]] = []
    with tempfile.TemporaryDirectory(prefix="tether-build-") as tmp:
        try:
            for k, share in enumerate(shares):
                path = os.path.join(tmp, "part%d.msgpack" % k)
                pid = os.fork()
                if pid == 0:
                    _run_worker([items[i] for i in share], tgt, name, fast_math, opt, path)
                workers.append((pid, path))
            stalled = _wait_workers(workers, time.monotonic() + BUILD_TIMEOUT_S)
        except BaseException:
            for pid, _ in workers:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            raise
        parts = []
        for k, (_, path) in enumerate(workers):
            if k in stalled:
                parts.append(_build_kernels_part([items[i] for i in shares[k]], tgt, name, fast_math, opt))
                continue
            with open(path, "rb") as f:
                payload = msgpack.unpackb(f.read(), raw=False)
            if not payload.get("ok"):
                _raise_worker_error(payload)
            parts.append(payload)
    entries = {e["name"]: e for p in parts for e in p["functions"]}
    rt = ModuleBuilder(tgt, name, fast_math=fast_math, part="runtime")
    rt.add_metadata([entries[n] for n in names])
    if tgt.is_wasm:   # (elsewhere the parts' arenas are common symbols, merged by the linker)
        scratch.define_arena(rt, max(int(p.get("scratch", 0)) for p in parts))
    rt_text = rt.finish()
    rt_obj = compile_module(rt_text, tgt, opt=opt)
    part_objs = [CompiledObject(p["obj"], p["opt_ir"], tgt, opt, p["seconds"]) for p in parts]
    merged = link_relocatable([rt_obj.object_bytes] + [p.object_bytes for p in part_objs], tgt)
    wall = time.perf_counter() - t0
    compiled = CompiledObject(merged, "\n".join([rt_obj.optimized_ir] + [p.optimized_ir for p in part_objs]), tgt,
                              opt, wall, parts=tuple([rt_obj] + part_objs))
    log.info("built %d kernels for %s in %d workers: %.3fs (llvm per worker %s)", len(items),
             tgt.preset or tgt.triple, jobs, wall, ", ".join("%.2fs" % p["seconds"] for p in parts))
    assert rt.metadata is not None
    return Module(name, tgt, "\n".join([rt_text] + [p["ir"] for p in parts]), compiled, rt.metadata)


def build_ir(ir_builder: ModuleBuilder, opt: int = 3) -> Module:
    """Compile a ModuleBuilder whose impl functions were written by hand (tests, custom kernels)."""
    ir_text = ir_builder.finish()
    compiled = compile_module(ir_text, ir_builder.target, opt=opt)
    assert ir_builder.metadata is not None
    return Module(ir_builder.name, ir_builder.target, ir_text, compiled, ir_builder.metadata)
