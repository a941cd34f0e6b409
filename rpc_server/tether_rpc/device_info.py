"""What this device is: architecture, CPU cores and features, memory, OS, versions, clocks and temperature,
plus the tether target preset that most likely fits it.

Everything is read from /proc, /sys and the standard library; any field that cannot be read is None (or an
empty list) rather than an exception, because odd kernels, containers, Android and qemu-user all present
partial or unusual files.

Keys of :func:`device_info`::

    arch             tether's arch name ("x86_64", "aarch64", "armv7", else platform.machine())
    machine          platform.machine()
    pointer_bits     32 or 64 (this interpreter)
    cpu_model        model name / Hardware line from /proc/cpuinfo, or None
    board            device-tree model (e.g. "Raspberry Pi 4 Model B Rev 1.4"), or None
    cpu_cores        sorted unique core names from "CPU part" (e.g. ["cortex-a72"]); [] if unknown
    cpu_features     sorted CPU feature flags ("Features"/"flags"); [] if unknown
    cpu_capabilities {"isa", "features", "source"}: what modules may need of this CPU (tether_rpc.cpu_features)
    num_cores        os.cpu_count();   usable_cores: CPUs this process may run on
    parallel_threads threads the parallel launcher uses by default (TETHER_NUM_THREADS or usable_cores)
    memory_bytes / memory_available_bytes   from /proc/meminfo, or None
    os               {"system", "release", "version", "name", "id", "android", "android_version"}
    python, python_implementation, numpy, msgpack, tether_rpc   versions
    governor         cpufreq scaling governor of cpu0, or None
    cpu_max_khz / cpu_cur_khz   cpufreq of cpu0, or None
    temperature_c    CPU/SoC temperature, or None
    suggested_target a tether target preset name (see suggest_target)
    gpus             [{"api": "opencl", "index": k, "spec": "opencl:k", ...that device's info()}] for every GPU
                     API's devices (see gpu_devices; spec is what open_device takes); [] without a GPU driver
    gpu_errors       ["opencl: why it could not be listed"] for a driver that failed, crashed or hung; [] normally
"""
from __future__ import annotations

import glob
import json
import logging
import os
import platform
import select
import signal
import shutil
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from . import __version__, cpu_features
from .elf import host_arch

logger = logging.getLogger(__name__)

# /proc/cpuinfo's "CPU implementer" -> {"CPU part" -> core name}. Qualcomm's (0x51) Kryo parts map to the ARM
# core each is derived from, because that is what code generation cares about.
_PARTS_BY_IMPLEMENTER: Dict[int, Dict[int, str]] = {
    0x41: {  # ARM Ltd
        0xc05: "cortex-a5", 0xc07: "cortex-a7", 0xc08: "cortex-a8", 0xc09: "cortex-a9", 0xc0d: "cortex-a12",
        0xc0e: "cortex-a17", 0xc0f: "cortex-a15", 0xd02: "cortex-a34", 0xd03: "cortex-a53", 0xd04: "cortex-a35",
        0xd05: "cortex-a55", 0xd06: "cortex-a65", 0xd07: "cortex-a57", 0xd08: "cortex-a72", 0xd09: "cortex-a73",
        0xd0a: "cortex-a75", 0xd0b: "cortex-a76", 0xd0c: "neoverse-n1", 0xd0d: "cortex-a77", 0xd0e: "cortex-a76ae",
        0xd40: "neoverse-v1", 0xd41: "cortex-a78", 0xd44: "cortex-x1", 0xd46: "cortex-a510", 0xd47: "cortex-a710",
        0xd48: "cortex-x2", 0xd49: "neoverse-n2", 0xd4d: "cortex-a715", 0xd4e: "cortex-x3", 0xd4f: "neoverse-v2",
        0xd80: "cortex-a520", 0xd81: "cortex-a720", 0xd82: "cortex-x4",
    },
    0x51: {0x800: "cortex-a73", 0x801: "cortex-a53", 0x802: "cortex-a75", 0x803: "cortex-a55", 0x804: "cortex-a76",
           0x805: "cortex-a55"},  # Qualcomm
}
# (implementer, part) -> core name
CPU_PARTS: Dict[tuple, str] = {(implementer, part): core for implementer, parts in _PARTS_BY_IMPLEMENTER.items()
                               for part, core in parts.items()}

# First matching core wins, so list the more specific boards first.
_AARCH64_PRESETS = (("cortex-a76", "rasp5"), ("cortex-a72", "rasp4b"), ("cortex-a57", "jetson-nano"))
_ARMV7_PRESETS = (("cortex-a53", "rasp3b"), ("cortex-a7", "armv7-a7"))


def _read(path: str, limit: int = 1 << 20) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def _read_int(path: str) -> Optional[int]:
    text = _read(path, 64)
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def _parse_int(text: str) -> Optional[int]:
    try:
        return int(text.strip(), 0)
    except (ValueError, AttributeError):
        return None


def parse_cpuinfo(text: Optional[str]) -> Dict[str, Any]:
    """``{"model", "cores", "features", "hardware"}`` from /proc/cpuinfo text (any architecture)."""
    model = hardware = architecture = features_key = None
    features: set = set()
    cores: set = set()
    implementer = None
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "processor") and value and not value.isdigit() and model is None:
            model = value
        elif key == "hardware" and value:
            hardware = value
        elif key in ("features", "flags"):
            features.update(value.split())
            features_key = key
        elif key == "cpu architecture" and architecture is None:
            architecture = value
        elif key == "cpu implementer":
            implementer = _parse_int(value)
        elif key == "cpu part":
            part = _parse_int(value)
            name = CPU_PARTS.get((implementer, part)) if part is not None else None
            if name is None and part is not None:
                name = "unknown-0x%x-0x%03x" % (implementer or 0, part)
            if name:
                cores.add(name)
    return {"model": model or hardware, "hardware": hardware, "cores": sorted(cores), "features": sorted(features),
            "features_key": features_key, "architecture": architecture}


def parse_meminfo(text: Optional[str]) -> Dict[str, Optional[int]]:
    values: Dict[str, Optional[int]] = {"MemTotal": None, "MemAvailable": None}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key in values:
            parts = value.split()
            try:
                values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1)
            except (ValueError, IndexError):
                pass
    return {"total": values["MemTotal"], "available": values["MemAvailable"]}


def parse_os_release(text: Optional[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip().strip("\"'")
    return out


def _is_android() -> bool:
    return bool(os.environ.get("ANDROID_ROOT") or os.environ.get("ANDROID_DATA")) or \
        os.path.exists("/system/build.prop") or hasattr(sys, "getandroidapilevel")


def _android_version() -> Optional[str]:
    getprop = shutil.which("getprop")
    if getprop is None:
        return None
    try:
        out = subprocess.run([getprop, "ro.build.version.release"], capture_output=True, text=True, timeout=2)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _temperature_c() -> Optional[float]:
    zones = sorted(glob.glob("/sys/class/thermal/thermal_zone*"))
    preferred = [z for z in zones if any(k in (_read(z + "/type", 256) or "").lower()
                                         for k in ("cpu", "soc", "x86_pkg", "cluster"))]
    for zone in preferred + zones:
        milli = _read_int(zone + "/temp")
        if milli is not None and -50000 < milli < 200000:
            return milli / 1000.0
    return None


def suggest_target(arch: str, cores: List[str], android: bool) -> str:
    """The target preset most likely to fit: Android aarch64 -> android-arm64, known boards by core, x86_64;
    otherwise the bare arch name (generic code for that architecture)."""
    if arch == "aarch64":
        if android:
            return "android-arm64"
        for core, preset in _AARCH64_PRESETS:
            if core in cores:
                return preset
        return "aarch64"
    if arch == "armv7":
        for core, preset in _ARMV7_PRESETS:
            if core in cores:
                return preset
        return "armv7"
    return arch


_capabilities: List[Dict[str, Any]] = []


def cpu_capabilities() -> Dict[str, Any]:
    """What modules may need of this CPU: cpu_features.capabilities() plus "suggested_target", the preset whose
    code it runs (by its cores when a board is recognised, else by its features). Computed once per process."""
    if _capabilities:
        return _capabilities[0]
    try:
        arch = host_arch()
    except Exception:
        arch = platform.machine() or "unknown"
    cpu = parse_cpuinfo(_read("/proc/cpuinfo"))
    caps = dict(cpu_features.this_cpu(arch, cpu))
    android = _is_android()
    preset = suggest_target(arch, cpu["cores"], android)
    if preset in (arch, "aarch64", "armv7"):   # no board recognised: judge by what the CPU can do
        preset = cpu_features.suggest_preset(arch, caps, android)
    caps["suggested_target"] = preset
    _capabilities.append(caps)
    return caps


def _parallel_threads() -> Optional[int]:
    try:
        from .parallel import default_num_threads
        return default_num_threads()
    except Exception:
        return None


def _versions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {"python": platform.python_version(),
                                     "python_implementation": platform.python_implementation(),
                                     "tether_rpc": __version__}
    for mod in ("numpy", "msgpack"):
        try:
            m = __import__(mod)
            v = getattr(m, "__version__", None) or ".".join(str(x) for x in getattr(m, "version", ()))
            out[mod] = v or None
        except Exception:
            out[mod] = None
    return out


#: seconds a GPU driver may take to list its devices before device_info gives up on it
GPU_PROBE_TIMEOUT = 20.0
#: seconds a failed listing stands before device_info tries again (a hung driver would otherwise cost every
#: call the whole timeout, and in a threaded process one more stuck thread)
GPU_RETRY_AFTER = 300.0
# TETHER_OPENCL_LIBRARY -> (when listed, gpus, errors)
_gpu_listing: Dict[str, Tuple[float, List[Dict[str, Any]], List[str]]] = {}
_gpu_listing_lock = threading.Lock()
_probe_threads: List[threading.Thread] = []


def _gpu_apis() -> List[Tuple[str, Any]]:
    """(name, DeviceAPI class) of every GPU API this runtime has; one whose module fails to import is left out,
    so a broken driver binding never breaks device_info."""
    apis: List[Tuple[str, Any]] = []
    try:
        from .gpu.opencl import OpenCLDevice
        apis.append(("opencl", OpenCLDevice))
    except Exception as exc:
        logger.debug("tether_rpc.gpu.opencl not importable: %s", exc)
    try:
        from .gpu.vulkan import VulkanDevice
        apis.append(("vulkan", VulkanDevice))
    except Exception as exc:
        logger.debug("tether_rpc.gpu.vulkan not importable: %s", exc)
    try:
        from .gpu.cuda import CudaDevice
        apis.append(("cuda", CudaDevice))
    except Exception as exc:
        logger.debug("tether_rpc.gpu.cuda not importable: %s", exc)
    return apis


def _list_gpus(apis: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """Every API's devices, here and now: {"gpus": [...], "errors": [...]}."""
    gpus: List[Dict[str, Any]] = []
    errors: List[str] = []
    for name, cls in apis:
        try:
            listing = getattr(cls, "list_devices", cls.available)()
        except Exception as exc:
            errors.append("%s: %s: %s" % (name, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""))
            continue
        for k, info in enumerate(listing):
            index = info.get("index", k)
            gpus.append(dict(info, api=name, index=index, spec="%s:%d" % (name, index)))
    return {"gpus": gpus, "errors": errors}


def _drivers_loaded() -> bool:
    """Whether this process has a GPU driver library loaded already (then it may have driver threads: no fork)."""
    loaded = False
    try:
        from .gpu.opencl import library_loaded
        loaded = library_loaded()
    except Exception:
        pass
    try:
        from .gpu.vulkan import library_loaded as vulkan_loaded
        loaded = loaded or vulkan_loaded()
    except Exception:
        pass
    return loaded


def _list_gpus_in_thread(apis: List[Tuple[str, Any]], timeout: float) -> Dict[str, Any]:
    """_list_gpus in a daemon thread: a driver that hangs costs that thread, never the caller."""
    stuck = [t for t in _probe_threads if t.is_alive()]
    _probe_threads[:] = stuck
    if stuck:   # an earlier probe is still inside a driver: a second one would hang beside it
        return {"gpus": [], "errors": ["GPU drivers are still listing their devices (an earlier listing hung)"]}
    box: List[Dict[str, Any]] = []
    thread = threading.Thread(target=lambda: box.append(_list_gpus(apis)), name="tether-gpu-probe", daemon=True)
    _probe_threads.append(thread)
    thread.start()
    thread.join(timeout)
    if not box:
        return {"gpus": [], "errors": ["GPU drivers did not list their devices within %g s" % timeout]}
    return box[0]


def _list_gpus_in_child(apis: List[Tuple[str, Any]], timeout: float) -> Dict[str, Any]:
    """_list_gpus in a forked child that reports through a pipe and is killed past ``timeout``.

    The child keeps driver state out of this process: the device server forks a worker per session, and a
    driver initialised before fork (its threads gone in the child, its locks possibly held) can hang or crash
    the worker that then opens a GPU. The child also makes a driver that hangs or segfaults while listing a line
    in ``gpu_errors`` instead of a hung or dead caller; and it starts no thread here (the server loop forks).
    """
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return _list_gpus_in_thread(apis, timeout)
    if pid == 0:   # the child: list, write, leave without running the parent's atexit handlers or finalizers
        code = 0
        try:
            os.close(read_fd)
            data = json.dumps(_list_gpus(apis), default=str).encode()
            while data:
                data = data[os.write(write_fd, data):]
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write_fd)
    chunks: List[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:   # reaped by someone else (SIGCHLD ignored): its status is lost
            status = 0
    if timed_out:
        return {"gpus": [], "errors": ["GPU drivers did not list their devices within %g s" % timeout]}
    try:
        return json.loads(b"".join(chunks).decode())
    except ValueError:
        how = ("killed by signal %d" % os.WTERMSIG(status)) if os.WIFSIGNALED(status) else \
            "exit status %d" % os.WEXITSTATUS(status)
        return {"gpus": [], "errors": ["listing the GPU drivers' devices failed (%s)" % how]}


_LIST_GPUS_MAIN = ("import json, sys\n"
                   "from tether_rpc.device_info import _gpu_apis, _list_gpus\n"
                   "sys.stdout.write(json.dumps(_list_gpus(_gpu_apis()), default=str))\n")


def _list_gpus_in_subprocess(timeout: float) -> Dict[str, Any]:
    """_list_gpus in a new Python process (this one's interpreter and tether_rpc), killed past ``timeout``.

    For a process that has threads (so no fork) and no GPU driver loaded yet: a driver initialised here, in a
    thread beside the others, was seen to crash this process (pocl segfaulting in clGetPlatformIDs in a test
    process that had run hundreds of unrelated tests) and to corrupt its heap, so the drivers stay out of it.
    """
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # a zipapp's path works too
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run([sys.executable, "-c", _LIST_GPUS_MAIN], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"gpus": [], "errors": ["GPU drivers did not list their devices within %g s" % timeout]}
    except OSError as exc:
        return {"gpus": [], "errors": ["listing the GPU drivers' devices failed: %s" % exc]}
    try:
        return json.loads(proc.stdout.decode())
    except ValueError:
        how = ("killed by signal %d" % -proc.returncode) if proc.returncode < 0 else \
            "exit status %d" % proc.returncode
        last = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return {"gpus": [], "errors": ["listing the GPU drivers' devices failed (%s) %s" % (how, last[0])]}


def gpu_devices(timeout: Optional[float] = None) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(gpus, errors): every GPU API's devices as ``{"api", "index", "spec", ...info()}``, and why an API could not be
    listed. Bounded by ``timeout`` (default GPU_PROBE_TIMEOUT), computed once per process when it succeeds
    (drivers do not come and go while a server runs); a failed listing stands for GPU_RETRY_AFTER seconds.

    Where this process has not loaded a GPU driver, the listing runs in another process: a forked child where
    this one is single-threaded (the device server's loop; see _list_gpus_in_child), else a new Python process
    (see _list_gpus_in_subprocess). A process that uses a GPU already lists in a daemon thread of its own.
    """
    with _gpu_listing_lock:
        key = "\0".join(os.environ.get(v, "") for v in ("TETHER_OPENCL_LIBRARY", "TETHER_VULKAN_LIBRARY",
                                                          "TETHER_CUDA_LIBRARY"))
        if key in _gpu_listing:
            when, gpus, errors = _gpu_listing[key]
            if not errors or time.monotonic() - when < GPU_RETRY_AFTER:
                return [dict(g) for g in gpus], list(errors)
        timeout = GPU_PROBE_TIMEOUT if timeout is None else timeout
        apis = _gpu_apis()   # imported here, not in a forked child
        loaded = _drivers_loaded()
        if hasattr(os, "fork") and threading.active_count() == 1 and not loaded:
            result = _list_gpus_in_child(apis, timeout)
        elif not loaded and sys.executable:
            result = _list_gpus_in_subprocess(timeout)
        else:   # the drivers are in this process already (it uses a GPU): list them here
            result = _list_gpus_in_thread(apis, timeout)
        gpus, errors = list(result.get("gpus") or []), [str(e) for e in result.get("errors") or []]
        _gpu_listing[key] = (time.monotonic(), gpus, errors)
        return [dict(g) for g in gpus], errors


def device_info() -> Dict[str, Any]:
    """A JSON/msgpack-friendly description of this device (never raises on odd /proc or /sys contents)."""
    info: Dict[str, Any] = {}
    try:
        arch = host_arch()
    except Exception:
        arch = platform.machine() or "unknown"
    cpu = parse_cpuinfo(_read("/proc/cpuinfo"))
    mem = parse_meminfo(_read("/proc/meminfo"))
    osr = parse_os_release(_read("/etc/os-release") or _read("/usr/lib/os-release"))
    android = _is_android()
    uname = platform.uname()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    board = _read("/proc/device-tree/model", 256) or _read("/sys/firmware/devicetree/base/model", 256)
    cpufreq = "/sys/devices/system/cpu/cpu0/cpufreq/"
    governor = _read(cpufreq + "scaling_governor", 256)
    info.update({
        "arch": arch,
        "machine": platform.machine(),
        "pointer_bits": struct.calcsize("P") * 8,
        "cpu_model": cpu["model"],
        "board": board.strip("\0 \n") or None if board else None,
        "cpu_cores": cpu["cores"],
        "cpu_features": cpu["features"],
        "cpu_capabilities": cpu_features.this_cpu(arch, cpu),
        "num_cores": os.cpu_count(),
        "usable_cores": usable,
        "parallel_threads": _parallel_threads(),
        "memory_bytes": mem["total"],
        "memory_available_bytes": mem["available"],
        "os": {"system": uname.system, "release": uname.release, "version": uname.version,
               "name": osr.get("PRETTY_NAME") or osr.get("NAME"), "id": osr.get("ID"),
               "android": android, "android_version": _android_version() if android else None},
        "governor": governor.strip() or None if governor else None,
        "cpu_max_khz": _read_int(cpufreq + "cpuinfo_max_freq"),
        "cpu_cur_khz": _read_int(cpufreq + "scaling_cur_freq"),
        "temperature_c": _temperature_c(),
    })
    info.update(_versions())
    info["suggested_target"] = suggest_target(arch, cpu["cores"], android)
    try:
        info["gpus"], info["gpu_errors"] = gpu_devices()
    except Exception as exc:   # listing GPUs must never cost the rest of the description
        info["gpus"], info["gpu_errors"] = [], ["listing GPUs failed: %s" % exc]
    return info
