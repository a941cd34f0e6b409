"""A native thread pool inside every tether module, as LLVM IR with no libc (docs/parallel.md "The native pool").

The runtime's Python launcher pays a Python wake-up and a GIL hand-over per task. This pool removes Python from
a launch: ``tether_pool_launch`` has the launcher signature of docs/abi.md, so the runtime installs it (from one
"provider" module) into every loaded module through ``tether_set_parallel_launcher``. The threads still belong
to the runtime: it starts ordinary Python threads (pthreads, so libc- and qemu-user-safe) that call
``tether_pool_worker`` through ctypes, which releases the GIL, and the worker never returns until
``tether_pool_shutdown``. The module itself only needs atomics and two raw system calls, futex and sched_yield,
emitted as inline assembly per architecture.

Exports (C view)::

    int32_t tether_pool_launch(TetherTask task, void* closure, int32_t num_tasks);
    void    tether_pool_worker(void);           /* serve launches until tether_pool_shutdown() */
    void    tether_pool_shutdown(void);         /* the workers inside now return after their current task */
    void    tether_pool_reset(void);            /* zero the state: only with no thread inside (a fork child) */
    void    tether_pool_set_spin(int32_t n);    /* idle spin iterations before a futex sleep; 0 = sleep at once */
    int32_t tether_pool_num_workers(void);      /* threads currently inside tether_pool_worker */

Protocol (all state is one internal global, hot fields on separate 128-byte lines):

- ``gen`` is both the wake-up word and a sequence lock over the job (``n``, ``base``, ``fn``, ``closure``): the
  launcher makes it odd, writes the job, makes it even again (seq_cst), and futex-wakes if ``sleepers > 0``.
  A worker takes a snapshot of the job under the sequence lock whenever it sees a new even ``gen``.
- Task ids are claimed from ``next`` by compare-and-swap, and only while ``next - base < n``. ``next`` is never
  reset: a launch starts at ``base = next``, so a worker holding a stale snapshot of an earlier launch finds
  ``next`` past its range and can never claim (let alone run) anything of a later launch. (Only a worker stalled
  for 2**32 claimed tasks could be fooled by wrap-around.)
- The launcher joins the claim loop itself, then waits for ``done == n``: it spins first, then sleeps on a futex
  over ``done``, which the worker finishing the last task wakes when ``waiting`` is set. It never waits for the
  workers themselves, only for the tasks.
- Sleeping is Dekker-style: a worker does ``sleepers += 1`` then futex_wait(&gen, seen); the launcher does
  ``gen += 1`` then reads ``sleepers``; with both seq_cst one of them must see the other, so no wake-up is lost.
  The futex waits still time out after 1 s, as a safety net.
- ``shutdown`` is an epoch counter, not a flag: a worker serves until it differs from the value it saw on entry.
  Workers started after a shutdown serve normally, so restarting the pool needs no reset, which could corrupt a
  launch still running in another thread. ``tether_pool_reset`` is for a fork child, whose only thread is the
  caller and which inherits the parent's counters but none of its workers.
- ``busy`` admits one launch at a time: a nested launch (a task that launches) or a concurrent one (a second
  Python thread) runs its tasks serially in its own thread, as does every launch while no worker is present.
"""
from __future__ import annotations

from typing import Dict, List

from tether.target import Target

# metadata "thread_pool": the protocol version above. A runtime uses the pool only for versions it knows.
POOL_VERSION = 1
EXPORTED_SYMBOLS = ("tether_pool_launch", "tether_pool_worker", "tether_pool_shutdown", "tether_pool_reset",
                    "tether_pool_set_spin", "tether_pool_num_workers")

# Idle iterations (one load and one pause hint each) before a worker sleeps, and before a waiting launcher
# sleeps: about 300 us on the 2-vCPU x86_64 development VM (30 ns per iteration). Back-to-back kernels of a
# model then find the worker awake.
DEFAULT_SPIN = 10000
# Every this many idle iterations the spinner also calls sched_yield, so a spinning worker gives its core away
# when the machine is oversubscribed.
_YIELD_EVERY = 256
_SLEEP_SECONDS = 1
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129
_INT_MAX = 0x7FFFFFFF

# The state: [128 x i32], 512 bytes, fields by i32 index. Lines of 128 bytes (32 words) keep what every thread
# writes per task (next, done) away from what spinning workers read (gen) and from the launcher's own words.
_WORDS = 128
_FIELDS: Dict[str, int] = {
    # line 0: published once per launch, polled by idle workers
    "gen": 0, "sleepers": 1, "n": 2, "base": 3, "fn": 4, "closure": 6,
    # line 1: the claim counter
    "next": 32,
    # line 2: completion
    "done": 64, "waiting": 65, "result": 66,
    # line 3: control
    "busy": 96, "workers": 97, "shutdown": 98, "spin": 99,
}
_ZEROED_BY_RESET = ("gen", "sleepers", "n", "base", "next", "done", "waiting", "result", "busy", "workers",
                    "shutdown")


class _Arch:
    """What differs per architecture: the system-call stub's machine code, the call numbers, the pause hint."""

    def __init__(self, stub: bytes, futex: int, sched_yield: int, pause: str) -> None:
        self.stub, self.futex, self.sched_yield, self.pause = stub, futex, sched_yield, pause


def _words(*insns: int) -> bytes:
    return b"".join(i.to_bytes(4, "little") for i in insns)


# System calls go through a tiny hand-assembled stub, ``long sys(long nr, long a, long b, long c, long d)``,
# placed as bytes in a .text.* section (both ld.lld and GNU ld put .text.* into the executable .text). Inline
# assembly would read better, but LLVM needs the target's assembly parser to put inline assembly into an object
# file, and llvmlite 0.50 registers only the host's: cross builds (x86_64 -> aarch64/armv7) could not contain it.
_ARCHES = {
    # mov rax,rdi; mov rdi,rsi; mov rsi,rdx; mov rdx,rcx; mov r10,r8; syscall; ret (clobbers rcx, r11: scratch)
    "x86_64": _Arch(bytes.fromhex("4889f8" "4889f7" "4889d6" "4889ca" "4d89c2" "0f05" "c3"), 202, 24,
                    "call void @llvm.x86.sse2.pause()"),
    # mov x8,x0; mov x0,x1; mov x1,x2; mov x2,x3; mov x3,x4; svc #0; ret
    "aarch64": _Arch(_words(0xAA0003E8, 0xAA0103E0, 0xAA0203E1, 0xAA0303E2, 0xAA0403E3, 0xD4000001, 0xD65F03C0),
                     98, 124,
                     # isb rather than yield: yield is a no-op on most cores, isb stalls for a few dozen cycles,
                     # so a spin count means roughly the same time as on x86
                     "call void @llvm.aarch64.isb(i32 15)"),
    # ARM state, EABI (number in r7, which must be preserved; the 5th argument is on the stack):
    # push {r7}; mov r7,r0; mov r0,r1; mov r1,r2; mov r2,r3; ldr r3,[sp,#4]; svc #0; pop {r7}; bx lr
    "armv7": _Arch(_words(0xE52D7004, 0xE1A07000, 0xE1A00001, 0xE1A01002, 0xE1A02003, 0xE59D3004, 0xEF000000,
                          0xE49D7004, 0xE12FFF1E), 240, 158,
                   "call void @llvm.arm.hint(i32 1)"),  # yield
}
_INTRINSIC_DECLS = {
    "x86_64": "declare void @llvm.x86.sse2.pause()\n",
    "aarch64": "declare void @llvm.aarch64.isb(i32)\n",
    "armv7": "declare void @llvm.arm.hint(i32)\n",
}


def _field_ptrs(names: List[str]) -> str:
    return "".join("  %%p.%s = getelementptr inbounds [%d x i32], ptr @tether.pool, i32 0, i32 %d\n"
                   % (name, _WORDS, _FIELDS[name]) for name in names)


def thread_pool_ir(target: Target) -> str:
    """The pool's LLVM IR for ``target``: to be appended to a module's IR text (exports are default-visible)."""
    arch = _ARCHES.get(target.arch)
    if arch is None:  # Target already refuses other architectures; this guards new ones
        raise ValueError("no thread-pool system calls for architecture %r" % target.arch)
    word = "i%d" % target.bits           # a register: system-call numbers, arguments and results
    long = word                          # C long: the fields of struct timespec
    palign = target.pointer_bytes
    init = ["i32 0"] * _WORDS
    init[_FIELDS["spin"]] = "i32 %d" % DEFAULT_SPIN
    stub = "".join("\\%02X" % byte for byte in arch.stub)
    widen = "zext i32 %s to " + word if target.bits == 64 else "add i32 %s, 0"  # 32-bit: already a register
    f = dict(word=word, long=long, palign=palign, futex=arch.futex, sched_yield=arch.sched_yield,
             pause=arch.pause, attrs="nounwind", wait_op=_FUTEX_WAIT_PRIVATE, wake_op=_FUTEX_WAKE_PRIVATE,
             int_max=_INT_MAX, sleep_s=_SLEEP_SECONDS, yield_mask=_YIELD_EVERY - 1,
             widen_expected=widen % "%expected", widen_count=widen % "%count")
    out = ["\n; ---- tether native thread pool (src/tether/codegen/threadpool.py) ----\n",
           "@tether.pool = internal global [%d x i32] [%s], align 128\n" % (_WORDS, ", ".join(init)),
           '@tether.pool.syscall = internal constant [%d x i8] c"%s", section ".text.tether_pool_syscall", '
           'align 16\n' % (len(arch.stub), stub),
           _INTRINSIC_DECLS[target.arch]]

    out.append("""
define internal void @tether.pool.futex_wait(ptr %addr, i32 %expected) {attrs} {{
entry:
  %ts = alloca {{ {long}, {long} }}, align 8
  %sec = getelementptr inbounds {{ {long}, {long} }}, ptr %ts, i32 0, i32 0
  store {long} {sleep_s}, ptr %sec, align {palign}
  %nsec = getelementptr inbounds {{ {long}, {long} }}, ptr %ts, i32 0, i32 1
  store {long} 0, ptr %nsec, align {palign}
  %a = ptrtoint ptr %addr to {word}
  %e = {widen_expected}
  %t = ptrtoint ptr %ts to {word}
  %r = call {word} @tether.pool.syscall({word} {futex}, {word} %a, {word} {wait_op}, {word} %e, {word} %t)
  ret void
}}

define internal void @tether.pool.futex_wake(ptr %addr, i32 %count) {attrs} {{
entry:
  %a = ptrtoint ptr %addr to {word}
  %c = {widen_count}
  %r = call {word} @tether.pool.syscall({word} {futex}, {word} %a, {word} {wake_op}, {word} %c, {word} 0)
  ret void
}}

define internal void @tether.pool.sched_yield() {attrs} {{
entry:
  %r = call {word} @tether.pool.syscall({word} {sched_yield}, {word} 0, {word} 0, {word} 0, {word} 0)
  ret void
}}

; one idle iteration: a pause hint, and every {yield_mask}+1 iterations a sched_yield
define internal void @tether.pool.relax(i32 %i) {attrs} {{
entry:
  {pause}
  %m = and i32 %i, {yield_mask}
  %y = icmp eq i32 %m, {yield_mask}
  br i1 %y, label %yield, label %done
yield:
  call void @tether.pool.sched_yield()
  br label %done
done:
  ret void
}}
""".format(**f))

    # Claim task ids of one launch (a consistent snapshot: fn, closure, n, base) and run them until none is left.
    out.append("""
define internal void @tether.pool.claim(ptr %fn, ptr %closure, i32 %n, i32 %base) {attrs} {{
entry:
{ptrs}  br label %load
load:
  %v0 = load atomic i32, ptr %p.next monotonic, align 4
  br label %try
try:
  %v = phi i32 [ %v0, %load ], [ %cur, %lost ]
  %id = sub i32 %v, %base
  %in = icmp ult i32 %id, %n
  br i1 %in, label %cas, label %out
cas:
  %v1 = add i32 %v, 1
  %pair = cmpxchg ptr %p.next, i32 %v, i32 %v1 monotonic monotonic, align 4
  %cur = extractvalue {{ i32, i1 }} %pair, 0
  %won = extractvalue {{ i32, i1 }} %pair, 1
  br i1 %won, label %work, label %lost
lost:
  br label %try
work:
  %r = call i32 %fn(i32 %id, i32 %n, ptr %closure)
  %failed = icmp ne i32 %r, 0
  br i1 %failed, label %fail, label %count
fail:
  %first = cmpxchg ptr %p.result, i32 0, i32 %r monotonic monotonic, align 4
  br label %count
count:
  %d = atomicrmw add ptr %p.done, i32 1 seq_cst, align 4
  %d1 = add i32 %d, 1
  %last = icmp eq i32 %d1, %n
  br i1 %last, label %last_done, label %load
last_done:
  %w = load atomic i32, ptr %p.waiting seq_cst, align 4
  %sleeping = icmp ne i32 %w, 0
  br i1 %sleeping, label %wake, label %load
wake:
  call void @tether.pool.futex_wake(ptr %p.done, i32 1)
  br label %load
out:
  ret void
}}
""".format(ptrs=_field_ptrs(["next", "result", "done", "waiting"]), **f))

    out.append("""
define i32 @tether_pool_launch(ptr %fn, ptr %closure, i32 %n) {attrs} {{
entry:
{ptrs}  %few = icmp slt i32 %n, 2
  br i1 %few, label %serial, label %check_workers
check_workers:
  %nw = load atomic i32, ptr %p.workers monotonic, align 4
  %none = icmp eq i32 %nw, 0
  br i1 %none, label %serial, label %acquire
acquire:
  %got = cmpxchg ptr %p.busy, i32 0, i32 1 acquire monotonic, align 4
  %mine = extractvalue {{ i32, i1 }} %got, 1
  br i1 %mine, label %publish, label %serial
publish:
  %base = load atomic i32, ptr %p.next monotonic, align 4
  %odd = atomicrmw add ptr %p.gen, i32 1 monotonic, align 4
  fence release
  store atomic i32 %n, ptr %p.n monotonic, align 4
  store atomic i32 %base, ptr %p.base monotonic, align 4
  store atomic ptr %fn, ptr %p.fn monotonic, align {palign}
  store atomic ptr %closure, ptr %p.closure monotonic, align {palign}
  store atomic i32 0, ptr %p.done monotonic, align 4
  store atomic i32 0, ptr %p.result monotonic, align 4
  %even = atomicrmw add ptr %p.gen, i32 1 seq_cst, align 4
  %sl = load atomic i32, ptr %p.sleepers seq_cst, align 4
  %anyone = icmp sgt i32 %sl, 0
  br i1 %anyone, label %wake, label %participate
wake:
  call void @tether.pool.futex_wake(ptr %p.gen, i32 {int_max})
  br label %participate
participate:
  call void @tether.pool.claim(ptr %fn, ptr %closure, i32 %n, i32 %base)
  %spin = load atomic i32, ptr %p.spin monotonic, align 4
  br label %wait
wait:
  %i = phi i32 [ 0, %participate ], [ %i1, %relax ], [ %i, %slept ]
  %d = load atomic i32, ptr %p.done acquire, align 4
  %all = icmp eq i32 %d, %n
  br i1 %all, label %finish, label %more
more:
  %spinning = icmp ult i32 %i, %spin
  br i1 %spinning, label %relax, label %sleep
relax:
  call void @tether.pool.relax(i32 %i)
  %i1 = add i32 %i, 1
  br label %wait
sleep:
  store atomic i32 1, ptr %p.waiting seq_cst, align 4
  %d2 = load atomic i32, ptr %p.done seq_cst, align 4
  %still = icmp ne i32 %d2, %n
  br i1 %still, label %futex, label %slept
futex:
  call void @tether.pool.futex_wait(ptr %p.done, i32 %d2)
  br label %slept
slept:
  store atomic i32 0, ptr %p.waiting monotonic, align 4
  br label %wait
finish:
  %res = load atomic i32, ptr %p.result monotonic, align 4
  store atomic i32 0, ptr %p.busy release, align 4
  ret i32 %res
serial:
  %has = icmp sgt i32 %n, 0
  br i1 %has, label %serial_loop, label %serial_done
serial_loop:
  %k = phi i32 [ 0, %serial ], [ %k1, %serial_loop ]
  %acc = phi i32 [ 0, %serial ], [ %acc1, %serial_loop ]
  %rk = call i32 %fn(i32 %k, i32 %n, ptr %closure)
  %keep = icmp ne i32 %acc, 0
  %acc1 = select i1 %keep, i32 %acc, i32 %rk
  %k1 = add i32 %k, 1
  %again = icmp slt i32 %k1, %n
  br i1 %again, label %serial_loop, label %serial_done
serial_done:
  %sres = phi i32 [ 0, %serial ], [ %acc1, %serial_loop ]
  ret i32 %sres
}}
""".format(ptrs=_field_ptrs(["workers", "busy", "next", "gen", "n", "base", "fn", "closure", "done", "result",
                             "sleepers", "spin", "waiting"]), **f))

    out.append("""
define void @tether_pool_worker() {attrs} {{
entry:
{ptrs}  %epoch = load atomic i32, ptr %p.shutdown seq_cst, align 4
  %joined = atomicrmw add ptr %p.workers, i32 1 seq_cst, align 4
  br label %loop
loop:
  %seen = phi i32 [ 1, %entry ], [ %seen, %relax ], [ %g, %ran ], [ %seen, %unsleep ], [ %seen, %fresh_retry ]
  %idle = phi i32 [ 0, %entry ], [ %idle1, %relax ], [ 0, %ran ], [ %idle, %unsleep ], [ %idle, %fresh_retry ]
  %g = load atomic i32, ptr %p.gen acquire, align 4
  %gbit = and i32 %g, 1
  %even = icmp eq i32 %gbit, 0
  %new = icmp ne i32 %g, %seen
  %fresh = and i1 %even, %new
  br i1 %fresh, label %fresh_bb, label %idle_bb
fresh_bb:
  %sd = load atomic i32, ptr %p.shutdown monotonic, align 4
  %stop = icmp ne i32 %sd, %epoch
  br i1 %stop, label %exit, label %snapshot
snapshot:
  %n = load atomic i32, ptr %p.n monotonic, align 4
  %base = load atomic i32, ptr %p.base monotonic, align 4
  %fn = load atomic ptr, ptr %p.fn monotonic, align {palign}
  %closure = load atomic ptr, ptr %p.closure monotonic, align {palign}
  fence acquire
  %g2 = load atomic i32, ptr %p.gen monotonic, align 4
  %same = icmp eq i32 %g2, %g
  br i1 %same, label %run, label %fresh_retry
fresh_retry:
  br label %loop
run:
  call void @tether.pool.claim(ptr %fn, ptr %closure, i32 %n, i32 %base)
  br label %ran
ran:
  br label %loop
idle_bb:
  %spin = load atomic i32, ptr %p.spin monotonic, align 4
  %spinning = icmp ult i32 %idle, %spin
  br i1 %spinning, label %relax, label %sleep
relax:
  call void @tether.pool.relax(i32 %idle)
  %idle1 = add i32 %idle, 1
  br label %loop
sleep:
  %s0 = atomicrmw add ptr %p.sleepers, i32 1 seq_cst, align 4
  %sd2 = load atomic i32, ptr %p.shutdown seq_cst, align 4
  %stop2 = icmp ne i32 %sd2, %epoch
  br i1 %stop2, label %unsleep_exit, label %futex
futex:
  call void @tether.pool.futex_wait(ptr %p.gen, i32 %g)
  br label %unsleep
unsleep:
  %s1 = atomicrmw sub ptr %p.sleepers, i32 1 seq_cst, align 4
  br label %loop
unsleep_exit:
  %s2 = atomicrmw sub ptr %p.sleepers, i32 1 seq_cst, align 4
  br label %exit
exit:
  %left = atomicrmw sub ptr %p.workers, i32 1 seq_cst, align 4
  ret void
}}
""".format(ptrs=_field_ptrs(["workers", "gen", "shutdown", "n", "base", "fn", "closure", "spin", "sleepers"]),
           **f))

    reset = "".join("  store atomic i32 0, ptr %%p.%s monotonic, align 4\n" % name for name in _ZEROED_BY_RESET)
    out.append("""
define void @tether_pool_shutdown() {attrs} {{
entry:
{ptrs}  %e = atomicrmw add ptr %p.shutdown, i32 1 seq_cst, align 4
  ; +2 keeps gen even (a published job), so every worker sees a new generation and checks shutdown
  %g = atomicrmw add ptr %p.gen, i32 2 seq_cst, align 4
  call void @tether.pool.futex_wake(ptr %p.gen, i32 {int_max})
  ret void
}}

define void @tether_pool_reset() {attrs} {{
entry:
{ptrs_all}{reset}  fence seq_cst
  ret void
}}

define void @tether_pool_set_spin(i32 %n) {attrs} {{
entry:
{ptr_spin}  %neg = icmp slt i32 %n, 0
  %v = select i1 %neg, i32 0, i32 %n
  store atomic i32 %v, ptr %p.spin monotonic, align 4
  ret void
}}

define i32 @tether_pool_num_workers() {attrs} {{
entry:
{ptr_workers}  %v = load atomic i32, ptr %p.workers seq_cst, align 4
  ret i32 %v
}}
""".format(ptrs=_field_ptrs(["shutdown", "gen"]), ptrs_all=_field_ptrs(list(_ZEROED_BY_RESET)), reset=reset,
           ptr_spin=_field_ptrs(["spin"]), ptr_workers=_field_ptrs(["workers"]), **f))
    return "".join(out)
