"""Emulated ARM devices: a Debian arm64/armhf userland run by qemu-user, with the real device server inside.

A userland is ``mmdebstrap --variant=extract`` of python3 + python3-numpy + python3-msgpack (Debian bookworm),
fixed up by hand because the extract variant runs no maintainer scripts, and cached once per user under
``$XDG_CACHE_HOME/tether/userlands/<arch>`` (or ``~/.cache/...``). No binfmt_misc is needed: qemu is started
explicitly with ``-L <rootfs>`` so the guest's absolute paths resolve inside the userland first.

The device server reaches the userland the way it reaches a board: the single-file zipapp from
``tether.bundle`` is copied in and run by Debian's own python3; the host package never enters the guest.

Facts that shape this module (measured, see docs/emulation.md):
- ``-L`` falls back to host paths for anything missing in the rootfs, writes included. We delete the rootfs
  ``/tmp`` so session folders land in the host's ``/tmp``, and ``/proc`` is the host's (qemu fakes ``uname``).
- The guest python cannot exec guest binaries, so everything inside uses fork, never spawn/subprocess.
- ``-cpu max`` (qemu's default) enables SVE, which upsets OpenBLAS; we always pass a real board CPU.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import fcntl
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import shlex
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from typing import Callable, Iterator, Optional, Sequence, Union

from tether.errors import TetherError

log = logging.getLogger(__name__)

SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy", "python3-msgpack")
#: Package sets: every userland has "base" (what the device server needs); another set is a separate userland,
#: cached in its own folder (``<arch>-<set>``) and built on first use by whoever asks for it, so a large optional
#: toolchain never enters the default userland nor slows the builds of those who do not need it. "opencl": pocl
#: (OpenCL on the CPU; libpocl2 pulls in clang-15 and libllvm15, about 470 MB) and the ICD loader, for GPU modules.
PACKAGE_SETS: dict[str, tuple] = {
    "base": PACKAGES,
    "opencl": PACKAGES + ("ocl-icd-libopencl1", "pocl-opencl-icd"),
}
# Bump when the recipe changes, so cached userlands built by an older recipe are rebuilt.
RECIPE_VERSION = 1
STAMP_NAME = "userland.json"
INSTALL_HINT = "apt-get install --no-install-recommends qemu-user mmdebstrap"
BUILD_TIMEOUT_S = 1200.0
MMDEBSTRAP_ATTEMPTS = 3
GUEST_BUNDLE_DIR = "/opt/tether"


class EmulationError(TetherError, RuntimeError):
    """An emulated device could not be built or started; the message says what failed and what to do."""


class EmulatorUnavailable(EmulationError):
    """A tool (qemu-user, mmdebstrap) or a privilege (root) that emulation needs is missing."""


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """One emulated architecture: tether's name, Debian's, qemu's, and the board it stands for."""
    name: str          # tether arch name, as in module metadata
    debian_arch: str
    qemu: str          # qemu-user binary
    default_cpu: str   # the CPU of the board the preset targets
    multiarch: str     # Debian multiarch library folder
    preset: str        # tether target preset compiled for this device
    uname_machine: str


ARCHES: dict[str, ArchSpec] = {
    "aarch64": ArchSpec("aarch64", "arm64", "qemu-aarch64", "cortex-a72", "aarch64-linux-gnu", "rasp4b", "aarch64"),
    "armv7": ArchSpec("armv7", "armhf", "qemu-arm", "cortex-a7", "arm-linux-gnueabihf", "armv7-a7", "armv7l"),
}
_ALIASES = {"arm64": "aarch64", "armhf": "armv7", "arm": "armv7", "armv7l": "armv7", "armv7a": "armv7"}

# Which emulated CPU stands for each target preset's board. rasp3b is a Cortex-A53 running a 32-bit OS: its code
# is ARMv8-A AArch32 (vsel, vrint, vmaxnm...), which a Cortex-A7 lacks (SIGILL), and qemu-arm has no cortex-a53,
# so its closest stand-in is qemu-arm's "max" (an ARMv8-A AArch32 CPU). Never qemu-aarch64's "max": it enables SVE.
PRESET_DEVICES: dict[str, tuple[str, str]] = {
    "rasp4b": ("aarch64", "cortex-a72"),
    "rasp5": ("aarch64", "cortex-a76"),
    "rasp5-fp16": ("aarch64", "cortex-a76"),
    "jetson-nano": ("aarch64", "cortex-a57"),
    "android-arm64": ("aarch64", "cortex-a53"),
    # the phones' Cortex-A55/A75 are not qemu CPUs: the A76 is the nearest with half-precision arithmetic
    "android-arm64-fp16": ("aarch64", "cortex-a76"),
    "rasp3b": ("armv7", "max"),
    "armv7-a7": ("armv7", "cortex-a7"),
}


def preset_device(preset: str) -> tuple[str, str]:
    """(arch, qemu cpu) of the emulated device that runs code built for target ``preset``."""
    if preset not in PRESET_DEVICES:
        raise EmulationError("no emulated device for target preset %r: choose one of %s"
                             % (preset, ", ".join(sorted(PRESET_DEVICES))))
    return PRESET_DEVICES[preset]


def arch_spec(arch: str) -> ArchSpec:
    name = _ALIASES.get(arch, arch)
    if name not in ARCHES:
        raise EmulationError("unknown emulated arch %r: choose one of %s" % (arch, ", ".join(sorted(ARCHES))))
    return ARCHES[name]


def cache_root() -> pathlib.Path:
    """Where userlands are cached: $TETHER_USERLAND_CACHE, else $XDG_CACHE_HOME/tether/userlands, else ~/.cache/..."""
    explicit = os.environ.get("TETHER_USERLAND_CACHE")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "tether" / "userlands"


def find_qemu(spec: ArchSpec) -> Optional[str]:
    """The qemu-user binary for ``spec``: Debian's qemu-user, or qemu-user-static's ``-static`` name."""
    return shutil.which(spec.qemu) or shutil.which(spec.qemu + "-static")


def missing_tools(spec: ArchSpec, *, building: bool) -> list[str]:
    """Human-readable list of what this machine lacks to build (``building``) or run a userland."""
    missing = []
    if find_qemu(spec) is None:
        missing.append("%s (package qemu-user)" % spec.qemu)
    if building:
        if shutil.which("mmdebstrap") is None:
            missing.append("mmdebstrap (package mmdebstrap)")
        if os.geteuid() != 0:
            missing.append("root privileges (mmdebstrap --mode=root)")
    return missing


def _require_tools(spec: ArchSpec, *, building: bool) -> None:
    missing = missing_tools(spec, building=building)
    if missing:
        what = "build" if building else "run"
        raise EmulatorUnavailable(
            "cannot %s the emulated %s device: missing %s. Install the tools with `%s` (as root); a userland is "
            "built once as root (e.g. `sudo scripts/setup_emulated_device.sh --arch %s --cache-dir DIR`) and then "
            "runs as any user via TETHER_USERLAND_CACHE=DIR."
            % (what, spec.name, ", ".join(missing), INSTALL_HINT, spec.name))


@dataclasses.dataclass
class Userland:
    """A built, cached userland."""
    spec: ArchSpec
    path: pathlib.Path          # the folder holding rootfs/ and the stamp
    stamp: dict
    package_set: str = "base"   # a key of PACKAGE_SETS

    @property
    def rootfs(self) -> pathlib.Path:
        return self.path / "rootfs"

    @property
    def python(self) -> pathlib.Path:
        return self.rootfs / "usr" / "bin" / "python3"

    def command(self, args: Sequence[str], *, cpu: Optional[str] = None) -> list[str]:
        """The host argv that runs ``python3 *args`` inside the userland under qemu-user."""
        qemu = find_qemu(self.spec)
        if qemu is None:
            _require_tools(self.spec, building=False)
        return [qemu, "-cpu", cpu or self.spec.default_cpu, "-L", str(self.rootfs), str(self.python), *args]

    def guest_path(self, guest_abs: str) -> pathlib.Path:
        """The host path of an absolute guest path inside the rootfs."""
        return self.rootfs / guest_abs.lstrip("/")

    def run_python(self, args: Sequence[str], *, cpu: Optional[str] = None, timeout: float = 120.0,
                   check: bool = True, env: Optional[dict] = None) -> subprocess.CompletedProcess:
        """Run the guest python to completion (used for checks, not for servers); ``env`` adds variables."""
        argv = self.command(args, cpu=cpu)
        proc = subprocess.run(argv, env=dict(guest_env(), **(env or {})), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, text=True)
        if check and proc.returncode != 0:
            raise EmulationError("guest python %s failed (exit %d): %s"
                                 % (" ".join(args), proc.returncode, proc.stderr.strip()[-2000:]))
        return proc


def guest_env() -> dict:
    """A clean environment for the guest: no host PYTHON*/QEMU_* variables leak into the emulated device."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}


def _package_set(name: str) -> tuple:
    if name not in PACKAGE_SETS:
        raise EmulationError("unknown userland package set %r: choose one of %s" % (name, ", ".join(PACKAGE_SETS)))
    return PACKAGE_SETS[name]


def _userland_dir(spec: ArchSpec, cache: Optional[pathlib.Path], packages: str = "base") -> pathlib.Path:
    # The package set is part of the cache key: its own folder, and the stamp's package list must match it.
    _package_set(packages)
    return (cache or cache_root()) / (spec.name if packages == "base" else "%s-%s" % (spec.name, packages))


def _read_stamp(path: pathlib.Path, packages: str = "base") -> Optional[dict]:
    try:
        stamp = json.loads((path / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("recipe") != RECIPE_VERSION or not (path / "rootfs" / "usr" / "bin" / "python3").exists():
        return None
    if list(stamp.get("packages") or ()) != list(_package_set(packages)):
        return None
    return stamp


def cached_userland(arch: str, *, cache: Optional[pathlib.Path] = None, packages: str = "base") -> Optional[Userland]:
    """The cached userland for ``arch`` and package set ``packages`` if a complete one exists (no tools needed)."""
    spec = arch_spec(arch)
    path = _userland_dir(spec, cache, packages)
    stamp = _read_stamp(path, packages)
    return Userland(spec, path, stamp, packages) if stamp is not None else None


@contextlib.contextmanager
def _build_lock(path: pathlib.Path, timeout: float) -> Iterator[None]:
    """One builder per userland across processes (parallel test workers, a CLI and a test run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / (".%s.lock" % path.name), "w") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EmulationError("timed out after %.0f s waiting for another build of %s" % (timeout, path))
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_userland(arch: str, *, cache: Optional[pathlib.Path] = None, suite: str = SUITE,
                    mirrors: Sequence[str] = (), force: bool = False,
                    progress: Optional[Callable[[str], None]] = None, packages: str = "base") -> Userland:
    """Return the cached userland for ``arch`` with package set ``packages`` (PACKAGE_SETS), building it first if
    needed (idempotent; stamp-checked).

    Raises EmulatorUnavailable (naming what to install) when qemu-user, mmdebstrap or root is missing.
    """
    spec = arch_spec(arch)
    path = _userland_dir(spec, cache, packages)
    if not force:
        stamp = _read_stamp(path, packages)
        if stamp is not None:
            _require_tools(spec, building=False)
            _drop_stray_tmp(path / "rootfs")
            return Userland(spec, path, stamp, packages)
    _require_tools(spec, building=True)
    with _build_lock(path, timeout=BUILD_TIMEOUT_S):
        stamp = None if force else _read_stamp(path, packages)   # another process may have finished it meanwhile
        if stamp is None:
            stamp = _build(spec, path, suite=suite, mirrors=mirrors, progress=progress or (lambda s: None),
                           packages=packages)
    return Userland(spec, path, stamp, packages)


def _drop_stray_tmp(rootfs: pathlib.Path) -> None:
    """A ``/tmp`` made in a built rootfs (by hand, or a tool run against it) would take the guest's /tmp away from
    the host's (qemu -L prefers a path that exists under the prefix): an empty one is removed, a full one named."""
    stray = rootfs / "tmp"
    if stray.is_dir() and not stray.is_symlink():
        try:
            stray.rmdir()
            log.warning("removed a stray empty %s: the guest's /tmp is the host's", stray)
        except OSError:
            log.warning("%s exists and is not empty: guest programs will see it as /tmp instead of the host's; "
                        "remove it", stray)


def default_sources(suite: str = SUITE) -> list[str]:
    """Debian's archive, updates and security sources for ``suite`` (mmdebstrap's own defaults, made explicit)."""
    return ["deb http://deb.debian.org/debian %s main" % suite,
            "deb http://deb.debian.org/debian %s-updates main" % suite,
            "deb http://deb.debian.org/debian-security %s-security main" % suite]


def _build(spec: ArchSpec, path: pathlib.Path, *, suite: str, mirrors: Sequence[str],
           progress: Callable[[str], None], packages: str = "base") -> dict:
    package_list = _package_set(packages)
    t0 = time.monotonic()
    path.mkdir(parents=True, exist_ok=True)
    (path / STAMP_NAME).unlink(missing_ok=True)
    for stale in path.glob("rootfs.partial-*"):   # left by a builder that was killed; we hold the lock
        _rmtree(stale)
    staging = path / ("rootfs.partial-%d" % os.getpid())
    logfile = path / "build.log"
    sources = list(mirrors) if mirrors else default_sources(suite)
    progress("mmdebstrap %s (%s) -> %s" % (suite, spec.debian_arch, path))
    try:
        for attempt in range(1, MMDEBSTRAP_ATTEMPTS + 1):
            argv = ["mmdebstrap", "--variant=extract", "--mode=root", "--arch=" + spec.debian_arch,
                    "--include=" + ",".join(package_list), suite, str(staging), *sources]
            with open(logfile, "w") as logfh:
                proc = subprocess.run(argv, stdout=logfh, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
            if proc.returncode == 0:
                break
            text = logfile.read_text(errors="replace")
            tail = text.strip().splitlines()[-15:]
            _rmtree(staging)
            if attempt == MMDEBSTRAP_ATTEMPTS:
                raise EmulationError("mmdebstrap failed for %s (exit %d, %d attempts; full log %s):\n%s"
                                     % (spec.debian_arch, proc.returncode, attempt, logfile, "\n".join(tail)))
            if not mirrors and re.search(r"Failed to fetch \S*-security/", text):
                # A security mirror caught mid-sync fails every retry for hours; the point release still
                # carries the packages we need, so drop it rather than fail the whole set-up.
                sources = [src for src in sources if "-security" not in src]
                log.warning("the %s-security index could not be fetched; building the %s userland without "
                            "security updates", suite, spec.name)
            log.warning("mmdebstrap attempt %d for %s failed (%s); retrying", attempt, spec.debian_arch,
                        tail[-3:] if tail else "no output")
            progress("mmdebstrap failed (attempt %d), retrying in %d s" % (attempt, 3 * attempt))
            time.sleep(3 * attempt)
        t_fetch = time.monotonic() - t0
        progress("fixing up the extracted userland")
        linked = _link_blas(staging, spec)
        _rmtree(staging / "tmp")      # the guest then uses the host /tmp (-L falls back to host paths)
        ship_dir = staging / GUEST_BUNDLE_DIR.lstrip("/")
        ship_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(ship_dir, 0o1777)    # any user may ship a device zipapp into a root-built userland, like /tmp
        _rmtree(path / "rootfs")
        os.replace(staging, path / "rootfs")
    except BaseException:
        _rmtree(staging)
        raise
    userland = Userland(spec, path, {}, packages)
    progress("byte-compiling the guest python")
    compiled_by = _byte_compile(userland)
    progress("checking python3 + numpy + msgpack under qemu")
    versions = _probe_versions(userland)
    if packages == "opencl":
        progress("checking that pocl lists its OpenCL device under qemu")
        versions["opencl_devices"] = _probe_opencl(userland)
    stamp = {
        "recipe": RECIPE_VERSION, "arch": spec.name, "debian_arch": spec.debian_arch, "suite": suite,
        "package_set": packages,
        "packages": list(package_list), "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "build_seconds": round(time.monotonic() - t0, 2), "mmdebstrap_seconds": round(t_fetch, 2),
        "sources": sources, "blas_links": linked, "byte_compiled_by": compiled_by,
        "size_bytes": _du(path / "rootfs"), **versions,
    }
    tmp = path / (STAMP_NAME + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1))
    os.replace(tmp, path / STAMP_NAME)   # the stamp appears last: its presence means "complete"
    log.info("built %s userland in %.1f s at %s", spec.name, stamp["build_seconds"], path)
    return stamp


def _link_blas(rootfs: pathlib.Path, spec: ArchSpec) -> list[str]:
    """Create libblas.so.3/liblapack.so.3 (normally made by update-alternatives, which extract skips).

    Relative links: an absolute target would resolve against the host's /usr/lib under qemu -L.
    """
    libdir = rootfs / "usr" / "lib" / spec.multiarch
    made = []
    for soname, candidates in (("libblas.so.3", ("openblas-pthread", "openblas-openmp", "openblas-serial",
                                                 "blis-pthread", "blis-openmp", "blis-serial", "atlas", "blas")),
                               ("liblapack.so.3", ("openblas-pthread", "openblas-openmp", "openblas-serial",
                                                   "atlas", "lapack"))):
        link = libdir / soname
        if link.exists():
            continue
        for sub in candidates:
            if (libdir / sub / soname).exists():
                if link.is_symlink():
                    link.unlink()      # a dangling alternatives link pointing at the host
                link.symlink_to(sub + "/" + soname)
                made.append("%s -> %s/%s" % (soname, sub, soname))
                break
        else:
            raise EmulationError("no %s provider found under %s; numpy will not import" % (soname, libdir))
    return made


_MAGIC_RE = re.compile(r"MAGIC_NUMBER\s*=\s*\((\d+)\)\.to_bytes\(2,\s*'little'\)")


def _guest_python_dirs(rootfs: pathlib.Path) -> tuple[str, list[pathlib.Path]]:
    target = os.readlink(rootfs / "usr" / "bin" / "python3")      # python3 -> python3.11
    version = target.rsplit("python", 1)[-1]
    dirs = [rootfs / "usr" / "lib" / ("python" + version), rootfs / "usr" / "lib" / "python3" / "dist-packages"]
    return version, [d for d in dirs if d.is_dir()]


def _guest_magic(rootfs: pathlib.Path, version: str) -> Optional[int]:
    src = rootfs / "usr" / "lib" / ("python" + version) / "importlib" / "_bootstrap_external.py"
    try:
        m = _MAGIC_RE.search(src.read_text())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _byte_compile(userland: Userland) -> str:
    """Byte-compile the guest's stdlib and dist-packages (numpy import: 3.7 s -> 1.5 s under qemu).

    The host python does it in seconds when its bytecode magic equals the guest's; otherwise the guest python
    does it under qemu (slower, same result).
    """
    import importlib.util
    version, dirs = _guest_python_dirs(userland.rootfs)
    host_magic = int.from_bytes(importlib.util.MAGIC_NUMBER[:2], "little")
    guest_magic = _guest_magic(userland.rootfs, version)
    if guest_magic == host_magic:
        argv = [sys.executable, "-m", "compileall", "-q", "-j0", *map(str, dirs)]
        who = "host python %d.%d (magic %d)" % (sys.version_info[0], sys.version_info[1], host_magic)
        env = dict(os.environ)
        env.pop("SOURCE_DATE_EPOCH", None)   # keep timestamp-based pycs, which need no source hashing at import
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, env=env)
    else:
        who = "guest python %s under qemu (host magic %d != guest %s)" % (version, host_magic, guest_magic)
        proc = subprocess.run(userland.command(["-m", "compileall", "-q", *map(str, dirs)]), env=guest_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    if proc.returncode != 0:
        # A few files failing (e.g. deliberately broken test data) does not spoil the rest of the cache.
        log.warning("byte-compile by %s reported errors:\n%s", who, proc.stdout.decode(errors="replace")[-2000:])
    return who


def _probe_versions(userland: Userland) -> dict:
    code = ("import json, platform, sys, numpy, msgpack; print(json.dumps({'python_version': platform."
            "python_version(), 'numpy_version': numpy.__version__, 'msgpack_version': '.'.join(map(str, "
            "msgpack.version)), 'machine': platform.machine()}))")
    proc = userland.run_python(["-c", code], timeout=300)
    versions = json.loads(proc.stdout.strip().splitlines()[-1])
    if versions["machine"] != userland.spec.uname_machine:
        raise EmulationError("the %s userland reports machine %r, expected %r"
                             % (userland.spec.name, versions["machine"], userland.spec.uname_machine))
    return versions


def _probe_opencl(userland: Userland) -> list:
    """The OpenCL devices the guest's ICD loader lists under qemu (a clinfo -l of the userland, through ctypes)."""
    code = textwrap.dedent("""
        import ctypes, json
        cl = ctypes.CDLL("libOpenCL.so.1")
        n = ctypes.c_uint32()
        assert cl.clGetPlatformIDs(0, None, ctypes.byref(n)) == 0 and n.value, "no OpenCL platform"
        platforms = (ctypes.c_void_p * n.value)()
        cl.clGetPlatformIDs(n.value, platforms, None)
        names = []
        for p in platforms:
            m = ctypes.c_uint32()
            cl.clGetDeviceIDs(ctypes.c_void_p(p), ctypes.c_uint64(0xFFFFFFFF), 0, None, ctypes.byref(m))
            devices = (ctypes.c_void_p * m.value)()
            cl.clGetDeviceIDs(ctypes.c_void_p(p), ctypes.c_uint64(0xFFFFFFFF), m.value, devices, None)
            for d in devices:
                buf = ctypes.create_string_buffer(256)
                cl.clGetDeviceInfo(ctypes.c_void_p(d), 0x102B, 256, buf, None)   # CL_DEVICE_NAME
                names.append(buf.value.decode())
        print(json.dumps(names))
        """)
    with tempfile.TemporaryDirectory(prefix="tether-opencl-probe-") as folder:
        proc = userland.run_python(["-c", code], timeout=300, env=opencl_env(userland, pathlib.Path(folder)))
    devices = json.loads(proc.stdout.strip().splitlines()[-1])
    if not devices:
        raise EmulationError("pocl lists no OpenCL device in the %s userland: %s" % (userland.spec.name,
                                                                                  proc.stderr.strip()[-2000:]))
    return devices


# ---------------------------------------------------------------------------------------------------------------
# pocl under qemu-user. Two things break with the userland as Debian ships it (measured with pocl 3.1, qemu 7.2):
# - pocl finds its kernel library and headers relative to where libpocl was loaded (dladdr), then checks them with
#   access(). qemu's -L translates open() and stat() but not faccessat(), so a guest path such as /usr/share/pocl
#   is looked up on the host and "Kernel library file ... doesn't exist" aborts the first build. Loading libpocl by
#   its *host* path (an ICD file naming it, through OCL_ICD_VENDORS) makes every path pocl derives a host path of a
#   file inside the rootfs, which both the translated and the untranslated calls resolve.
# - pocl links each compiled kernel into a .so by running the clang driver's linker, /usr/bin/ld. A guest program
#   cannot exec a guest binary (no binfmt_misc), and exec does not go through -L: the host's ld runs, which knows no
#   aarch64. COMPILER_PATH (the clang driver's program search path) names a folder whose ``ld`` runs tether's own
#   ld.lld with the rootfs as sysroot (its -L folders moved inside the rootfs), which links aarch64 like Debian's ld.
# Compiled kernels are cached by pocl in POCL_CACHE_DIR, kept per user across runs (pocl_cache_dir()).

POCL_CACHE_ENV = "TETHER_POCL_CACHE"


def pocl_cache_dir(userland: Userland) -> pathlib.Path:
    """Where pocl keeps the kernels it compiled in this userland: $TETHER_POCL_CACHE, else
    $XDG_CACHE_HOME/tether/pocl/<arch> (~/.cache/...): per user and kept, so a rerun compiles nothing again."""
    explicit = os.environ.get(POCL_CACHE_ENV)
    if explicit:
        return pathlib.Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "tether" / "pocl" / userland.spec.name


def opencl_env(userland: Userland, folder: pathlib.Path, *,
               pocl_cache: Optional[pathlib.Path] = None) -> dict:
    """The guest environment that makes pocl work under qemu-user (see above); writes its ICD file and ``ld`` into
    ``folder`` (a host folder that lives as long as the guest process)."""
    from tether.link import find_linker
    libdir = userland.rootfs / "usr" / "lib" / userland.spec.multiarch
    libpocl = sorted(libdir.glob("libpocl.so.*"), key=lambda p: len(p.name))
    if not libpocl:
        raise EmulationError("the %s userland at %s has no libpocl: build it with packages=\"opencl\""
                             % (userland.spec.name, userland.path))
    vendors = folder / "vendors"
    vendors.mkdir(parents=True, exist_ok=True)
    (vendors / "pocl.icd").write_text(str(libpocl[-1]) + "\n")   # the full soname: the real file
    bindir = folder / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    linker = " ".join(shlex.quote(a) for a in find_linker())
    script = textwrap.dedent("""\
        #!/bin/sh
        # ld for pocl inside the emulated %s device (written by tether.emulate): links with ld.lld on the host,
        # the userland as sysroot, its -L folders moved inside the rootfs.
        R=%s
        for a do
          case $a in
            -L/*) set -- "$@" "-L$R${a#-L}" ;;
            *) set -- "$@" "$a" ;;
          esac
          shift
        done
        exec %s --sysroot="$R" "$@"
        """) % (userland.spec.name, shlex.quote(str(userland.rootfs)), linker)
    (bindir / "ld").write_text(script)
    os.chmod(bindir / "ld", 0o755)
    cache = pocl_cache or pocl_cache_dir(userland)
    cache.mkdir(parents=True, exist_ok=True)
    return {"OCL_ICD_VENDORS": str(vendors), "COMPILER_PATH": str(bindir), "POCL_CACHE_DIR": str(cache)}


def _du(path: pathlib.Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _rmtree(path: pathlib.Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def list_userlands(*, cache: Optional[pathlib.Path] = None) -> list[dict]:
    """One row per known arch: its status ('ready', 'incomplete', 'absent'), folder and stamp fields."""
    rows = []
    for spec in ARCHES.values():
        for packages in PACKAGE_SETS:
            path = _userland_dir(spec, cache, packages)
            stamp = _read_stamp(path, packages)
            if packages != "base" and stamp is None and not path.exists():
                continue   # optional sets are listed once someone built one
            status = "ready" if stamp is not None else ("incomplete" if path.exists() else "absent")
            rows.append({"arch": spec.name, "status": status, "path": str(path), **(stamp or {}),
                         "package_set": packages})
    return rows


def clean_userlands(arch: Optional[str] = None, *, cache: Optional[pathlib.Path] = None) -> list[pathlib.Path]:
    """Delete the cached userland of ``arch`` (all of them if None); returns the folders removed."""
    specs = [arch_spec(arch)] if arch else list(ARCHES.values())
    removed = []
    for path in (_userland_dir(spec, cache, packages) for spec in specs for packages in PACKAGE_SETS):
        if path.exists():
            with _build_lock(path, timeout=60.0):
                shutil.rmtree(path)
            removed.append(path)
    return removed


def _remove_stale_shipments(folder: pathlib.Path) -> None:
    """Delete zipapps shipped by processes that no longer exist (a host process killed before its close())."""
    for entry in folder.glob("run-*-*"):
        try:
            pid = int(entry.name.split("-")[1])
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            pass   # alive, someone else's


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies, so a killed CLI or test run leaves no server."""
    import ctypes
    pr_set_pdeathsig = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


_LISTENING_RE = re.compile(r"listening on \[?([0-9A-Za-z.:%-]*?)\]?:(\d+)\b")


class EmulatedDevice:
    """The tether device server running inside a userland under qemu-user, as a context manager.

    The device zipapp is copied into the rootfs (``/opt/tether/<id>/tether-rpc.pyz``) and started by the guest
    python, as on a board (``python3 tether-rpc.pyz --port ...``). ``start()`` returns once the server logs where
    it listens; ``close()`` stops it by PID (SIGTERM, wait, SIGKILL) and removes the shipped zipapp.
    """

    def __init__(self, userland: Userland, *, cpu: Optional[str] = None, host: str = "127.0.0.1",
                 port: Optional[int] = None, port_end: Optional[int] = None, tracker: Optional[str] = None,
                 key: Optional[str] = None, token: Optional[str] = None, extra_args: Sequence[str] = (),
                 bundle: Union[str, os.PathLike, None] = None, startup_timeout: float = 120.0,
                 on_line: Optional[Callable[[str], None]] = None, preset: Optional[str] = None,
                 pocl_cache: Union[str, os.PathLike, None] = None):
        self.userland = userland
        # An "opencl" userland's pocl keeps compiled kernels here (default: pocl_cache_dir(userland)).
        self.pocl_cache = pathlib.Path(pocl_cache) if pocl_cache else None
        self.cpu = cpu or userland.spec.default_cpu
        # The target preset this device stands for (informational: tests and the CLI report it).
        self.preset = preset or next((p for p, (a, c) in PRESET_DEVICES.items()
                                      if a == userland.spec.name and c == self.cpu), None)
        self.host = host
        self._port_arg = port
        self._port_end = port_end
        self._server_args = list(extra_args)
        if tracker:
            self._server_args += ["--tracker", tracker]
        if key:
            self._server_args += ["--key", key]
        if token:
            self._server_args += ["--token", token]
        self._bundle = pathlib.Path(bundle) if bundle else None
        self.startup_timeout = startup_timeout
        self._on_line = on_line
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self._lines: collections.deque = collections.deque(maxlen=400)
        self._listening = threading.Event()
        self._ship_dir: Optional[pathlib.Path] = None
        self.port: Optional[int] = None
        self.startup_seconds: Optional[float] = None

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedDevice":
        return self if self._proc is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    @property
    def address(self) -> tuple[str, int]:
        if self.port is None:
            raise EmulationError("the emulated device is not listening (call start() first)")
        return (self.host, self.port)

    @property
    def output(self) -> str:
        """The server's recent output (stdout and stderr interleaved)."""
        return "\n".join(self._lines)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ship(self) -> str:
        """Copy the device zipapp into the rootfs (``/opt/tether/<id>/``); returns the path the guest runs.

        That path is the file's *host* path: qemu 7.2 does not apply ``-L`` to ``statx``, which 32-bit guests'
        glibc uses for every stat, so on armv7 ``/opt/tether/...`` is invisible to ``os.stat``/zipimport while
        the host path resolves identically through both the translated and the untranslated syscalls.
        """
        from tether import bundle as bundle_mod
        _remove_stale_shipments(self.userland.guest_path(GUEST_BUNDLE_DIR))
        ship_id = "run-%d-%s" % (os.getpid(), uuid.uuid4().hex[:8])
        host_path = self.userland.guest_path("%s/%s/%s" % (GUEST_BUNDLE_DIR, ship_id, bundle_mod.DEFAULT_NAME))
        try:
            host_path.parent.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            raise EmulationError("cannot ship the device zipapp into %s: rebuild the userland with this tether "
                                 "(it makes /opt/tether world-writable) or run as its owner" % host_path.parent)
        self._ship_dir = host_path.parent
        if self._bundle is not None:
            shutil.copyfile(self._bundle, host_path)
        else:
            bundle_mod.write_bundle(host_path)
        return str(host_path)

    def start(self) -> "EmulatedDevice":
        if self._proc is not None:
            raise EmulationError("this emulated device was already started")
        t0 = time.monotonic()
        bundle_path = self.ship()
        # Port 0 lets the server pick a free port, which it then logs; no race with other test sessions.
        port = self._port_arg if self._port_arg is not None else 0
        args = ["-E", "-s", "-u", "-B", bundle_path, "--host", self.host, "--port", str(port)]
        if self._port_end is not None:
            args += ["--port-end", str(self._port_end)]
        args += self._server_args
        argv = self.userland.command(args, cpu=self.cpu)
        env = guest_env()
        if self.userland.package_set == "opencl":
            assert self._ship_dir is not None
            env.update(opencl_env(self.userland, self._ship_dir / "opencl", pocl_cache=self.pocl_cache))
        log.info("starting emulated %s device: %s", self.userland.spec.name, " ".join(argv))
        # Own session: the server's forked workers share its process group, so close() can reap strays.
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        self._reader = threading.Thread(target=self._read_output, name="emulated-%s-output" % self.pid,
                                        daemon=True)
        self._reader.start()
        deadline = t0 + self.startup_timeout
        while not self._listening.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                why = ("exited with code %s" % self._proc.returncode if self._proc.poll() is not None
                       else "did not report listening within %.0f s" % self.startup_timeout)
                self._reader.join(timeout=2.0)   # collect the last lines for the message
                output = self.output
                self.close()
                raise EmulationError("emulated %s device server %s; its output:\n%s"
                                     % (self.userland.spec.name, why, output[-3000:]))
        self.startup_seconds = time.monotonic() - t0
        log.info("emulated %s device listening on %s:%d after %.2f s", self.userland.spec.name, self.host,
                 self.port, self.startup_seconds)
        return self

    def _read_output(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in iter(self._proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self._lines.append(line)
            if not self._listening.is_set():
                m = _LISTENING_RE.search(line)
                if m:
                    self.port = int(m.group(2))
                    self._listening.set()
            if self._on_line is not None:
                self._on_line(line)
            else:
                log.debug("[emulated %s] %s", self.userland.spec.name, line)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Wait for the server to exit by itself (the CLI's foreground mode); returns its exit code."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server by PID (SIGTERM, wait, SIGKILL), reap its workers, remove the shipped zipapp."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log.warning("emulated device pid %d ignored SIGTERM for %.0f s; killing it", proc.pid, timeout)
                    proc.kill()
                    proc.wait(timeout=timeout)
            # Workers the server forked live in the process group we created for it (pgid == its pid).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if self._reader is not None:
                self._reader.join(timeout=2.0)
            if proc.stdout is not None:
                proc.stdout.close()
        if self._ship_dir is not None:
            shutil.rmtree(self._ship_dir, ignore_errors=True)
            self._ship_dir = None


# ---------------------------------------------------------------------------------------------------------------
# Extras: packages added on demand to a cached userland, recorded in its stamp ("extras"), so the userlands of
# everyone who needs only python stay as they are, and one that lacks an extra is extended, never rebuilt.

#: extra name -> Debian packages. "java": the JRE that runs the Java device server (android_app/run_device.sh
#: --userland) under qemu-user. "cxx": the C++ runtime that the aarch64 wheels of other runtimes (onnxruntime,
#: LiteRT) link against, for comparisons in the guest (scripts/bench_arm.py).
EXTRAS: dict[str, tuple] = {"java": ("openjdk-17-jre-headless",), "cxx": ("libstdc++6",)}


def ensure_extra(userland: Userland, extra: str, *, progress: Optional[Callable[[str], None]] = None) -> Userland:
    """Return ``userland`` with the packages of ``extra`` (EXTRAS) in its rootfs, adding them first if needed.

    The packages are extracted by mmdebstrap into a staging folder and every file the rootfs lacks is moved in
    (the base packages they share are the same suite's, already there). Needs what a build needs (root).
    """
    if extra not in EXTRAS:
        raise ValueError("unknown userland extra %r (known: %s)" % (extra, ", ".join(sorted(EXTRAS))))
    if extra in (userland.stamp.get("extras") or {}):
        return userland
    progress = progress or (lambda s: None)
    _require_tools(userland.spec, building=True)
    with _build_lock(userland.path, timeout=BUILD_TIMEOUT_S):
        # another process may have added it meanwhile
        stamp = _read_stamp(userland.path, userland.package_set) or userland.stamp
        if extra not in (stamp.get("extras") or {}):
            t0 = time.monotonic()
            staging = userland.path / ("extra-%s.partial-%d" % (extra, os.getpid()))
            _rmtree(staging)
            argv = ["mmdebstrap", "--variant=extract", "--mode=root", "--arch=" + userland.spec.debian_arch,
                    "--include=" + ",".join(EXTRAS[extra]), stamp.get("suite", SUITE), str(staging),
                    *(stamp.get("sources") or default_sources())]
            progress("mmdebstrap %s for the %s userland" % (", ".join(EXTRAS[extra]), userland.spec.name))
            try:
                with open(userland.path / ("extra-%s.log" % extra), "w") as logfh:
                    proc = subprocess.run(argv, stdout=logfh, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
                if proc.returncode != 0:
                    raise EmulationError("mmdebstrap failed adding %s to the %s userland (exit %d; log %s)"
                                         % (extra, userland.spec.name, proc.returncode,
                                            userland.path / ("extra-%s.log" % extra)))
                moved = _merge_tree(staging, userland.rootfs)
            finally:
                _rmtree(staging)
            stamp = dict(stamp, extras=dict(stamp.get("extras") or {},
                                            **{extra: {"packages": list(EXTRAS[extra]), "files": moved,
                                                       "seconds": round(time.monotonic() - t0, 2)}}))
            tmp = userland.path / (STAMP_NAME + ".tmp")
            tmp.write_text(json.dumps(stamp, indent=1))
            os.replace(tmp, userland.path / STAMP_NAME)
            log.info("added %s to the %s userland in %.1f s", extra, userland.spec.name, time.monotonic() - t0)
    return Userland(userland.spec, userland.path, stamp)


def _merge_tree(src: pathlib.Path, dst: pathlib.Path) -> int:
    """Move every file and symlink of ``src`` that ``dst`` lacks into ``dst`` (folders are created); returns how
    many. /tmp, /proc, /dev and /sys stay out (the guest uses the host's, see the module docstring)."""
    moved = 0
    for root, dirs, files in os.walk(src):
        rel = pathlib.Path(root).relative_to(src)
        if rel.parts[:1] in (("tmp",), ("proc",), ("dev",), ("sys",)):
            dirs[:] = []
            continue
        target_dir = dst / rel
        for name in list(dirs):
            if (pathlib.Path(root) / name).is_symlink():   # os.walk lists symlinked folders as folders
                dirs.remove(name)
                files.append(name)
        if not os.path.lexists(target_dir):
            target_dir.mkdir(parents=True, exist_ok=True)
        for name in files:
            target = target_dir / name
            if not os.path.lexists(target):
                os.rename(pathlib.Path(root) / name, target)
                moved += 1
    return moved
