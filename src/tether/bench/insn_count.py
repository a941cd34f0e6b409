"""Guest instruction counts per inference of a compiled model on an emulated ARM CPU (qemu-user + a TCG plugin).

Timings under qemu mean nothing; the instructions the guest executes are exact. The plugin
(``insn_count_plugin.c``, built here with ``zig cc`` at first use and cached by its source hash) counts them by
class, and per kernel by the library's function symbols. A model is run in two fresh guest processes with the same
input, one doing ``warm`` inferences and one ``warm + extra``. The count per inference is the second process's
window of ``extra`` inferences after the ``warm`` ones, marked for the plugin, over ``extra``: the interpreter's
start-up, the imports, loading the model and the first (cold) inference stay outside it, and so does the
process's exit, which moved by tens of thousands of instructions between processes that differ only in how
many inferences they ran. The per-kernel counts are the two processes' difference over ``extra`` (the plugin
attributes the whole process by symbol; a kernel's count repeats exactly whatever ran before it).

Determinism is what makes the numbers a regression line: one guest thread (``TETHER_NUM_THREADS=1``, OpenBLAS
serial), a fixed hash seed, the same input files, a clean environment, address-space randomisation off for the
qemu process (so the guest's heap and mapping addresses, and with them any address-dependent path, repeat), and a
preloaded guest library (``insn_count_determinism.c``) whose clock ticks per call and whose random bytes repeat.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import struct
import subprocess
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from tether.errors import TetherError

log = logging.getLogger(__name__)

#: The classes the plugin counts, in its order (docs/bench.md "Instruction counts").
CLASSES = ("vfma", "dot", "vload", "vstore", "load", "store", "branch", "simd", "other")
PLUGIN_SOURCE = pathlib.Path(__file__).with_name("insn_count_plugin.c")
GUEST_SCRIPT = pathlib.Path(__file__).with_name("insn_count_guest.py")
DETERMINISM_SOURCE = pathlib.Path(__file__).with_name("insn_count_determinism.c")
#: The emulated devices whose counts `tether bench --count-instructions` takes (target preset -> arch, qemu CPU
#: come from tether.emulate.PRESET_DEVICES).
COUNT_PRESETS = ("rasp4b", "rasp5", "armv7-a7")
BUILD_TIMEOUT_S = 300.0
# Inferences before the counted ones, and counted ones. The kernels' counts are the same for any window; the
# executor's Python is not steady before CPython 3.11's specializing interpreter has warmed up (functions are
# quickened after 8 calls), so the counted window starts after 10 inferences.
WARM_RUNS = 10
EXTRA_RUNS = 4
ADDR_NO_RANDOMIZE = 0x0040000


class InsnCountError(TetherError, RuntimeError):
    """Instructions could not be counted: the plugin did not build or load, or the guest run failed."""


def cache_dir() -> pathlib.Path:
    """Where built plugins are kept: beside the object cache ($TETHER_CACHE_DIR, else $XDG_CACHE_HOME/tether, else
    ~/.cache/tether), in ``qemu-plugins/``."""
    from tether.codegen import objcache

    return pathlib.Path(objcache.cache_dir()).parent / "qemu-plugins"


def _build_cached(source: pathlib.Path, name: str, target: Sequence[str], what: str) -> pathlib.Path:
    """``zig cc -shared`` of one C file for ``target``, cached by the hash of the source and the arguments (a
    changed source builds anew). InsnCountError with the compiler's output if the build fails."""
    from tether import cc

    text = source.read_bytes()
    flags = ["-shared", "-fPIC", "-O2", "-fno-sanitize=undefined", *target]
    digest = hashlib.sha256(text + b"\0" + " ".join(flags).encode()).hexdigest()[:16]
    out = cache_dir() / digest / name
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("%s.%d.tmp" % (name, os.getpid()))
    argv = [cc.find_zig(), "cc", *flags, "-o", str(tmp), str(source)]
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise InsnCountError("building %s (%s) did not finish within %.0f s" % (what, source, BUILD_TIMEOUT_S)) \
            from None
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise InsnCountError("building %s from %s with `zig cc` failed (exit %d): %s"
                             % (what, source, proc.returncode, proc.stdout.decode(errors="replace").strip()[-2000:]))
    os.replace(tmp, out)   # another builder's identical file may land first: same bytes either way
    log.info("built %s at %s", what, out)
    return out


def plugin_path() -> pathlib.Path:
    """The qemu plugin for this host (x86_64 Linux), built with the ziglang wheel's ``zig cc`` on first use."""
    return _build_cached(PLUGIN_SOURCE, "libinsncount.so", ["-target", "x86_64-linux-gnu"],
                         "the qemu instruction-count plugin")


#: zig cc targets of the guest library per emulated arch
GUEST_LIB_TARGETS = {"aarch64": ["-target", "aarch64-linux-gnu"],
                     "armv7": ["-target", "arm-linux-gnueabihf", "-mcpu=cortex_a7"]}


def determinism_lib_path(arch: str) -> pathlib.Path:
    """The guest library preloaded into counted runs (a call-driven clock, repeatable random bytes) for ``arch``."""
    return _build_cached(DETERMINISM_SOURCE, "libinsncount-determinism-%s.so" % arch, GUEST_LIB_TARGETS[arch],
                         "the guest's deterministic clock library")


# -- the library's functions ------------------------------------------------------------------------------------

def function_symbols(lib: str) -> List[tuple]:
    """``[(offset, size, name)]`` of the defined functions of an ELF shared library (its ``.symtab``, else its
    ``.dynsym``), offsets from its load address; ARM's Thumb bit cleared."""
    from tether_rpc import elf

    out: Dict[int, tuple] = {}
    with elf.read_elf(lib) as f:
        e = "<" if f.endian == "little" else ">"
        for secname in (".symtab", ".dynsym"):
            sec = f.section(secname)
            if sec is None:
                continue
            data = f.section_data(sec)
            strtab = f.section_data(f.sections[sec.link])
            step = 16 if f.bits == 32 else 24
            for off in range(step, len(data) - step + 1, step):
                if f.bits == 32:
                    st_name, value, size, info, _other, shndx = struct.unpack_from(e + "IIIBBH", data, off)
                else:
                    st_name, info, _other, shndx, value, size = struct.unpack_from(e + "IBBHQQ", data, off)
                if info & 0xF != 2 or shndx == 0 or size == 0:     # STT_FUNC, defined, sized
                    continue
                end = strtab.index(b"\0", st_name)
                name = strtab[st_name:end].decode("utf-8", "replace")
                out.setdefault(value & ~1, (value & ~1, size, name))
            if out:
                break
    return sorted(out.values())


def kernel_of(symbol: str, funcs: Sequence[str]) -> Optional[str]:
    """The graph function (kernel) a library symbol belongs to: the function itself, its ``__impl``, its parallel
    task bodies and other helpers named after it (longest matching name wins)."""
    best = None
    for f in funcs:
        if symbol == f or symbol.startswith(f + "_") or symbol.startswith(f + "."):
            if best is None or len(f) > len(best):
                best = f
    return best


# -- running the guest --------------------------------------------------------------------------------------------

def guest_env() -> Dict[str, str]:
    """The guest's whole environment: nothing of the host's leaks in, and everything that could make two runs
    differ is pinned (hash seed, thread counts)."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "PYTHONHASHSEED": "0",
            "TETHER_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1"}


def _no_aslr() -> None:
    """In the qemu child before exec: no address-space randomisation, so guest addresses repeat run to run."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.personality(ADDR_NO_RANDOMIZE)


# The guest program runs by `-c`, not as a script: a script's folder becomes sys.path[0], and the length of that
# absolute path (the host's temp folder) changed what the executor's Python executes per inference.
_GUEST_MAIN = ("import sys; sys.argv[0] = %r; exec(compile(open(%r).read(), %r, 'exec'))"
               % (GUEST_SCRIPT.name, GUEST_SCRIPT.name, GUEST_SCRIPT.name))


def _rel(path: str, work: str) -> str:
    rel = os.path.relpath(path, work)
    return path if rel.startswith("..") else rel


@dataclasses.dataclass
class GuestRun:
    """One guest process's counts: ``total`` and ``unattributed`` {class: n}, ``regions`` {symbol: {class: n}}."""
    runs: int
    counts: Dict[str, Any]
    output: str


def run_guest(userland: Any, cpu: str, folder: str, inputs_dir: str, runs: int, work: str,
              symbols: Optional[str] = None, timeout: float = 600.0, disas: Optional[str] = None,
              output: Optional[str] = None, warm: Optional[int] = None) -> GuestRun:
    """Run the model in ``folder`` ``runs`` times in a fresh guest process under the counting plugin, the runs
    after the first ``warm`` (default: all of them) in a marked window (:func:`window_per_inference`); ``output``:
    save the graph's first output there (.npy); ``disas``: the plugin's per-instruction listing there."""
    plugin = plugin_path()
    tag = "%06d" % runs   # one length for every run: the guest sees paths of the same size
    out = os.path.join(work, "counts-%s.json" % tag)
    ranges = os.path.join(work, "ranges-%s.txt" % tag) if symbols else "-"
    plugin_arg = "%s,out=%s" % (plugin, out) + (",ranges=%s" % ranges if symbols else "") + \
        (",disas=%s" % disas if disas else "")
    from tether.emulate import find_qemu

    qemu = find_qemu(userland.spec)
    if qemu is None:
        raise InsnCountError("no %s: install qemu-user" % userland.spec.qemu)
    preload = determinism_lib_path(userland.spec.name)
    if not os.path.isfile(os.path.join(work, GUEST_SCRIPT.name)):
        shutil.copyfile(GUEST_SCRIPT, os.path.join(work, GUEST_SCRIPT.name))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(out)
    # The guest gets paths relative to the work folder (its working directory), so what it allocates for them,
    # and with it where later objects land, is the same whichever folder the host's temp files are in.
    argv = [qemu, "-cpu", cpu, "-plugin", plugin_arg, "-E", "LD_PRELOAD=%s" % preload, "-L", str(userland.rootfs),
            str(userland.python),
            "-s", "-B", "-u", "-c", _GUEST_MAIN, "tether-rpc.pyz", _rel(folder, work), _rel(inputs_dir, work),
            str(int(runs)), str(int(runs if warm is None else warm)),
            _rel(symbols, work) if symbols else "-", _rel(ranges, work) if symbols else "-",
            _rel(output, work) if output else "-"]
    try:
        proc = subprocess.run(argv, env=guest_env(), cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, preexec_fn=_no_aslr)
    except subprocess.TimeoutExpired:
        raise InsnCountError("the counted guest run (%d inferences on %s) did not finish within %.0f s"
                             % (runs, cpu, timeout)) from None
    stdout = proc.stdout.decode(errors="replace")
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0 or not stdout.startswith("ok "):
        raise InsnCountError("the counted guest run on %s failed (exit %d): %s"
                             % (cpu, proc.returncode, (stderr.strip() or stdout.strip())[-2000:]))
    if not os.path.isfile(out):
        raise InsnCountError("qemu ran but the plugin wrote no counts (does %s load TCG plugins? %s)"
                             % (qemu, stderr.strip()[-500:]))
    with open(out) as fh:
        counts = json.load(fh)
    return GuestRun(runs, counts, stdout.strip())


def window_per_inference(marks: Sequence[Mapping[str, int]], inferences: int) -> Dict[str, float]:
    """{class: n} per inference of the ``inferences`` in a guest's marked window, from the plugin's four
    ``marks`` (mark, mark, mark, the inferences, mark): the last mark less the third, less what a mark costs (the
    third less the second, the same for every mark)."""
    if len(marks) != 4:
        raise InsnCountError("the plugin recorded %d marks of the guest's window, expected 4" % len(marks))
    cost = {c: int(marks[2].get(c, 0)) - int(marks[1].get(c, 0)) for c in CLASSES}
    start = {c: int(marks[2].get(c, 0)) + cost[c] for c in CLASSES}
    return _diff(start, marks[3], inferences)


def _diff(a: Mapping[str, int], b: Mapping[str, int], k: int) -> Dict[str, float]:
    out = {}
    for c in CLASSES:
        d = int(b.get(c, 0)) - int(a.get(c, 0))
        out[c] = d // k if d % k == 0 else d / k
    return out


def _with_total(counts: Dict[str, float]) -> Dict[str, float]:
    total = sum(counts.values())
    return {"total": int(total) if float(total).is_integer() else total, **counts}


def emulated_cpu(target: Any, arch: Optional[str] = None) -> tuple:
    """``(arch, qemu cpu, label)`` of the emulated CPU that counts code compiled for ``target``: a preset's board
    (rasp4b -> cortex-a72, rasp5 -> cortex-a76, armv7-a7 -> cortex-a7, ...), else the default CPU of the code's
    architecture ``arch`` (e.g. a generic aarch64 target). InsnCountError when neither is known."""
    from tether import emulate

    preset = target if isinstance(target, str) else getattr(target, "preset", None)
    if preset in emulate.PRESET_DEVICES:
        a, cpu = emulate.PRESET_DEVICES[preset]
        return a, cpu, preset
    if arch is not None:
        try:
            spec = emulate.arch_spec(arch)
        except emulate.EmulationError:
            spec = None
        if spec is not None:
            return spec.name, spec.default_cpu, str(preset or target or spec.name)
    raise InsnCountError("cannot count instructions of code built for %s: no emulated CPU for it (count code built "
                         "for one of the presets %s)" % (target, ", ".join(sorted(emulate.PRESET_DEVICES))))


def count_model(folder: str, preset: str, inputs: Sequence[np.ndarray], *, warm: int = WARM_RUNS,
                extra: int = EXTRA_RUNS, per_kernel: bool = True, userland: Any = None, timeout: float = 600.0,
                output: Optional[str] = None) -> Dict[str, Any]:
    """Instructions per inference of the compiled model in ``folder`` on the emulated CPU of target ``preset`` (or,
    for a target that is no preset, the default CPU of the model's architecture).

    ``inputs``: one array per graph input, in the graph's order. Returns the ``instruction_counts`` record of a
    bench result (docs/bench.md): ``per_inference`` {total, class: n}, ``kernels`` {func: {total, class: n}} (when
    ``per_kernel``, and their sum ``in_kernels``), the ``method`` and each guest run's totals. ``output``: the
    graph's first output of the counted run is saved there (.npy), to check that what was counted was right.
    """
    from tether import bundle as bundle_mod
    from tether import emulate

    if warm < 1 or extra < 1:
        raise ValueError("warm and extra must be at least 1 (got %d, %d)" % (warm, extra))
    with open(os.path.join(folder, "deploy.json"), "r", encoding="utf-8") as fh:
        graph = json.load(fh)
    target = graph.get("target") if isinstance(graph.get("target"), dict) else {}
    arch, cpu, preset = emulated_cpu(preset, target.get("arch"))
    if userland is None:
        userland = emulate.ensure_userland(arch)
    lib = os.path.join(folder, graph.get("lib", "deploy.so"))
    funcs = sorted({n["func"] for n in graph.get("nodes", []) if "func" in n})
    # Under /tmp where there is one: the guest's working directory is this folder, and the length of its path
    # shifts where the guest's later objects land, which moves the executor's (not the kernels') count a little.
    work = tempfile.mkdtemp(prefix="tether-insncount-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        bundle_mod.write_bundle(os.path.join(work, "tether-rpc.pyz"))
        # a copy, not a link: the guest's mapping of the library then has the same path whatever the model's folder
        folder_in_work = os.path.join(work, "model")
        shutil.copytree(folder, folder_in_work)
        inputs_dir = os.path.join(work, "inputs")
        os.mkdir(inputs_dir)
        for k, arr in enumerate(inputs):
            np.save(os.path.join(inputs_dir, "%d.npy" % k), np.ascontiguousarray(arr), allow_pickle=False)
        symbols = None
        if per_kernel:
            symbols = os.path.join(work, "symbols.txt")
            with open(symbols, "w") as fh:
                for off, size, name in function_symbols(lib):
                    fh.write("%x %x %s\n" % (off, size, name.replace(" ", "_")))
        # Both runs see the same folder, inputs and symbol file paths: their processes differ only in RUNS.
        # Both runs save the output to the same path, so they differ in nothing but RUNS.
        saved = os.path.join(work, "output.npy")
        a = run_guest(userland, cpu, folder_in_work, inputs_dir, warm, work, symbols, timeout, output=saved,
                      warm=warm)
        b = run_guest(userland, cpu, folder_in_work, inputs_dir, warm + extra, work, symbols, timeout, output=saved,
                      warm=warm)
        if output:
            shutil.copyfile(saved, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record: Dict[str, Any] = {
        "preset": preset, "arch": arch, "cpu": cpu, "classes": list(CLASSES),
        "per_inference": _with_total(window_per_inference(b.counts.get("marks") or [], extra)),
        "method": {"warm_runs": warm, "extra_runs": extra, "threads": 1,
                   "counting": "qemu TCG plugin, inline per-translation-block counters; per inference: a "
                               "marked window of one process, per kernel: two processes' difference",
                   "qemu": emulate.find_qemu(userland.spec)},
        "runs": [{"inferences": r.runs, "total": sum(int(v) for v in r.counts["total"].values())} for r in (a, b)],
    }
    if per_kernel:
        kernels: Dict[str, Dict[str, int]] = {}
        for counts_run, sign in ((a.counts, -1), (b.counts, 1)):
            for sym, cls_counts in counts_run.get("regions", {}).items():
                kern = kernel_of(sym, funcs) or "(other code of the library)"
                acc = kernels.setdefault(kern, {c: 0 for c in CLASSES})
                for c in CLASSES:
                    acc[c] += sign * int(cls_counts.get(c, 0))
        record["kernels"] = {k: _with_total({c: (v // extra if v % extra == 0 else v / extra)
                                             for c, v in acc.items()})
                             for k, acc in sorted(kernels.items()) if any(acc.values())}
        in_lib = {c: sum(v[c] for v in record["kernels"].values()) for c in CLASSES}
        record["in_kernels"] = _with_total(in_lib)
        record["outside_kernels"] = record["per_inference"]["total"] - record["in_kernels"]["total"]
    return record
