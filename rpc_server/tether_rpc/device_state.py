"""Benchmark support on the device: what state the board is in, and a measurement loop that records it.

Built-ins (registered through ``session.EXTENSIONS``; docs/bench.md describes the method)::

    tether.bench.state                      -> snapshot (see DeviceStateSampler.snapshot)
    tether.bench.cooldown  max_c, timeout_s -> {"waited_s", "temp_c", "reached"}
    tether.bench.run       target, args, options -> result (see bench_run)

``target`` is a function handle (a kernel, called on ``args``: array handles, ints, floats, str) or a graph
handle (a model: one run of the whole graph; ``args`` is ignored).

Every field comes from /proc and /sys, read with plain file I/O: the CPU temperature from the thermal zones,
current frequencies from cpufreq (one per policy, i.e. per cluster), the Raspberry Pi firmware's throttle flags
(``get_throttled`` in sysfs, no ``vcgencmd``), the battery temperature on Android, and the peak RSS (``VmHWM``).
A field a board does not have is *absent* from the records, never None or an exception. Files read for every
sample stay open and are re-read with ``pread`` at offset 0 (sysfs regenerates the value), a few microseconds
each, so state sampling fits in the per-sample overhead budget.

``TETHER_SYSFS_ROOT`` (environment) prefixes the /sys paths: tests use it to present a board's files.

stdlib + numpy only (device side).
"""
from __future__ import annotations

import glob
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

# Raspberry Pi firmware flags (bits 0-3: now, bits 16-19: since boot): under-voltage, ARM frequency capped,
# throttled, soft temperature limit.
PI_THROTTLE_NOW_MASK = 0xF
PI_THROTTLE_PATHS = ("/sys/devices/platform/soc/soc:firmware/get_throttled",
                     "/sys/devices/platform/soc*/*firmware*/get_throttled")
BATTERY_TEMP_PATHS = ("/sys/class/power_supply/battery/temp", "/sys/class/power_supply/*battery*/temp")
DEFAULT_HOT_C = 80.0          # used when no passive trip point is published
CPU_ZONE_HINTS = ("cpu", "soc", "x86_pkg", "cluster", "bigcore", "littlecore")

#: A sample is "disturbed" when the thread waited for a CPU for more than this share of it.
DISTURBED_FRACTION = 0.02
DISTURBED_RETRY_FACTOR = 10
#: Sample EVENTs go out at most this often (seconds): enough for a live display, and a sample of a fast kernel
#: does not pay for a frame (every sample is in the reply anyway).
EVENT_INTERVAL = 0.05
RUN_OPTIONS = {"min_sample_ms": 10.0, "samples": 20, "max_warmup": 10, "warmup_window": 5, "pin": None,
               "state": True, "hot_c": None, "max_seconds": 120.0, "max_number": 1 << 30,
               "retry_disturbed": True, "number": None}
MAX_SAMPLES = 20000           # keeps a reply far below the protocol's array and frame limits
_MAX_CALIBRATION_ROUNDS = 40


def _root() -> str:
    return os.environ.get("TETHER_SYSFS_ROOT", "").rstrip("/")


def _read(path: str, limit: int = 4096) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return None


def _read_int(path: str, base: int = 10) -> Optional[int]:
    text = _read(path, 64)
    try:
        return int(text, base) if text else None
    except ValueError:
        return None


class _Probe:
    """One sysfs value read again and again through an open descriptor."""

    __slots__ = ("path", "fd", "base")

    def __init__(self, path: str, base: int = 10):
        self.path = path
        self.base = base
        self.fd = os.open(path, os.O_RDONLY)

    def read(self) -> Optional[int]:
        try:
            raw = os.pread(self.fd, 64, 0)
            return int(raw.strip() or b"x", self.base)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _open_probe(path: Optional[str], base: int = 10) -> Optional[_Probe]:
    if not path:
        return None
    try:
        probe = _Probe(path, base)
    except OSError:
        return None
    return probe if probe.read() is not None else None


def _first_existing(patterns: Sequence[str]) -> Optional[str]:
    root = _root()
    for pattern in patterns:
        for path in sorted(glob.glob(root + pattern)):
            if os.path.isfile(path):
                return path
    return None


def thermal_zones() -> List[Dict[str, Any]]:
    """Every readable thermal zone: ``{"zone", "type", "temp_c", "passive_c"?}``."""
    out = []
    for zone in sorted(glob.glob(_root() + "/sys/class/thermal/thermal_zone*")):
        milli = _read_int(zone + "/temp")
        if milli is None or not -50000 < milli < 200000:
            continue
        rec: Dict[str, Any] = {"zone": os.path.basename(zone), "type": _read(zone + "/type", 256) or "",
                               "temp_c": milli / 1000.0}
        passive = []
        for trip in glob.glob(zone + "/trip_point_*_type"):
            if _read(trip, 64) in ("passive", "hot"):
                value = _read_int(trip[:-len("type")] + "temp")
                if value is not None and value > 0:
                    passive.append(value / 1000.0)
        if passive:
            rec["passive_c"] = min(passive)
        out.append(rec)
    return out


def _cpu_zone(zones: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    for z in zones:
        if any(h in z["type"].lower() for h in CPU_ZONE_HINTS):
            return z
    return zones[0] if zones else None


def cpufreq_policies() -> List[Dict[str, Any]]:
    """One record per cpufreq policy: ``{"policy", "cpus", "cur_khz", "min_khz", "max_khz", "governor"}``."""
    root = _root()
    dirs = sorted(glob.glob(root + "/sys/devices/system/cpu/cpufreq/policy*"),
                  key=lambda d: int("".join(c for c in os.path.basename(d) if c.isdigit()) or 0))
    if not dirs:  # older kernels: one cpufreq folder per CPU
        dirs = sorted(glob.glob(root + "/sys/devices/system/cpu/cpu[0-9]*/cpufreq"))
    out = []
    for d in dirs:
        cur = _read_int(d + "/scaling_cur_freq")
        if cur is None:
            cur = _read_int(d + "/cpuinfo_cur_freq")
        if cur is None:
            continue
        name = os.path.basename(d) if os.path.basename(d) != "cpufreq" else os.path.basename(os.path.dirname(d))
        rec: Dict[str, Any] = {"policy": name, "cur_khz": cur, "path": d}
        cpus = _read(d + "/affected_cpus", 256) or _read(d + "/related_cpus", 256)
        if cpus:
            try:
                rec["cpus"] = [int(c) for c in cpus.split()]
            except ValueError:
                pass
        for key, fname in (("min_khz", "scaling_min_freq"), ("max_khz", "cpuinfo_max_freq")):
            value = _read_int(d + "/" + fname)
            if value is not None:
                rec[key] = value
        governor = _read(d + "/scaling_governor", 64)
        if governor:
            rec["governor"] = governor
        out.append(rec)
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (``5`` to /proc/self/clear_refs, Linux >= 4.0), so that the peak read
    afterwards is the peak of what ran since. False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _status_kb(field: str) -> Optional[int]:
    """A ``Vm*`` field of /proc/self/status in bytes."""
    text = _read("/proc/self/status", 1 << 16)
    for line in (text or "").splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


class DeviceStateSampler:
    """Cheap per-sample state: CPU temperature, per-policy frequencies, Pi throttle flags, battery temperature.

    ``sample()`` returns only the fields this board has. Close it (or use ``with``) to release the descriptors.
    """

    def __init__(self, hot_c: Optional[float] = None):
        zones = thermal_zones()
        zone = _cpu_zone(zones)
        self.zone = zone
        self.temp = _open_probe(_root() + "/sys/class/thermal/%s/temp" % zone["zone"]) if zone else None
        self.hot_c = float(hot_c) if hot_c is not None else (zone or {}).get("passive_c", DEFAULT_HOT_C)
        self.policies = cpufreq_policies()
        self.freqs = [p for p in (_open_probe(rec["path"] + "/scaling_cur_freq") or
                                  _open_probe(rec["path"] + "/cpuinfo_cur_freq") for rec in self.policies) if p]
        self.throttle = _open_probe(_first_existing(PI_THROTTLE_PATHS), 16)
        self.battery = _open_probe(_first_existing(BATTERY_TEMP_PATHS))

    def sample(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.temp is not None:
            milli = self.temp.read()
            if milli is not None:
                out["temp_c"] = milli / 1000.0
                out["hot"] = milli / 1000.0 >= self.hot_c
        if self.freqs:
            out["freq_khz"] = [f.read() for f in self.freqs]
        if self.throttle is not None:
            flags = self.throttle.read()
            if flags is not None:
                out["throttle_flags"] = flags
                out["throttled"] = bool(flags & PI_THROTTLE_NOW_MASK)
        if self.battery is not None:
            tenths = self.battery.read()
            if tenths is not None:
                out["battery_c"] = tenths / 10.0
        return out

    def temperature_c(self) -> Optional[float]:
        milli = self.temp.read() if self.temp is not None else None
        return milli / 1000.0 if milli is not None else None

    def close(self) -> None:
        for probe in [self.temp, self.throttle, self.battery] + self.freqs:
            if probe is not None:
                probe.close()
        self.freqs = []
        self.temp = self.throttle = self.battery = None

    def __enter__(self) -> "DeviceStateSampler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def snapshot(hot_c: Optional[float] = None) -> Dict[str, Any]:
    """Everything about the board's state now (fields absent where unavailable)."""
    out: Dict[str, Any] = {"time": time.time()}
    zones = thermal_zones()
    if zones:
        out["thermal_zones"] = zones
        zone = _cpu_zone(zones)
        out["temp_c"] = zone["temp_c"]
        out["hot_c"] = float(hot_c) if hot_c is not None else zone.get("passive_c", DEFAULT_HOT_C)
    policies = cpufreq_policies()
    if policies:
        out["cpufreq"] = [{k: v for k, v in p.items() if k != "path"} for p in policies]
    flags_path = _first_existing(PI_THROTTLE_PATHS)
    flags = _read_int(flags_path, 16) if flags_path else None
    if flags is not None:
        out["throttle_flags"] = flags
        out["throttled"] = bool(flags & PI_THROTTLE_NOW_MASK)
    battery_path = _first_existing(BATTERY_TEMP_PATHS)
    battery = _read_int(battery_path) if battery_path else None
    if battery is not None:
        out["battery_c"] = battery / 10.0
    for key, field in (("rss_bytes", "VmRSS"), ("peak_rss_bytes", "VmHWM")):
        value = _status_kb(field)
        if value is not None:
            out[key] = value
    try:
        out["affinity"] = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        out["loadavg"] = list(os.getloadavg())
    except (AttributeError, OSError):
        pass
    return out


# -- warm-up detection ---------------------------------------------------------------------------------------

def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def warmup_fence(later: Sequence[float]) -> float:
    """Upper fence for a steady sample: median + max(3 robust sigmas, 1% of the median) of what follows it."""
    med = _median(later)
    mad = _median([abs(x - med) for x in later])
    return med + max(3.0 * 1.4826 * mad, 0.01 * med)


def detect_warmup(series: Sequence[float], window: int = 5, max_warmup: int = 10) -> Tuple[Optional[int], bool]:
    """How many leading samples are warm-up: ``(k, converged)``, or ``(None, False)`` while undecided.

    Sample ``k`` ends the warm-up when it is no slower than the fence of the ``2 * window`` samples after it;
    every earlier one was slower than its own look-ahead (caches, page faults, clocks ramping up). Past
    ``max_warmup`` leading samples, the warm-up is cut there and reported as not converged.
    """
    k, converged, _ = _scan_warmup(series, 2 * max(1, int(window)), int(max_warmup), 0)
    return k, converged


def _scan_warmup(series: Sequence[float], look: int, max_warmup: int, start: int) -> Tuple[Optional[int], bool, int]:
    """:func:`detect_warmup` from sample ``start`` on; also returns where to resume while undecided (a sample
    whose look-ahead was complete and slower stays warm-up, so the bench loop never judges it twice)."""
    for k in range(start, max_warmup + 1):
        later = series[k + 1:k + 1 + look]
        if len(later) < look:
            return None, False, k
        if series[k] <= warmup_fence(later):
            return k, True, k
    return max_warmup, False, max_warmup


# -- pinning ---------------------------------------------------------------------------------------------------

def _thread_ids() -> List[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def pin_threads(cpus: Optional[Sequence[int]]) -> Optional[Dict[int, Any]]:
    """Pin every thread of this process (the caller and the parallel pool's workers) to ``cpus``.

    Returns the previous affinities to give to :func:`unpin_threads`, or None when nothing was asked."""
    if not cpus:
        return None
    wanted = {int(c) for c in cpus}
    me = threading.get_native_id()
    previous: Dict[int, Any] = {}
    for tid in _thread_ids():
        try:
            mask = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, wanted)
            previous[tid] = mask
        except OSError as exc:
            if tid != me:
                continue  # a pool thread that has just exited
            unpin_threads(previous)
            raise ValueError("cannot pin to CPUs %s: %s (this device may use %s)"
                             % (sorted(wanted), exc, sorted(os.sched_getaffinity(0)))) from None
    return previous


def unpin_threads(previous: Optional[Dict[int, Any]]) -> None:
    for tid, mask in (previous or {}).items():
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            pass  # a thread that has exited


# -- the measurement loop ----------------------------------------------------------------------------------------

class _RunQueueWait:
    """Nanoseconds this thread has spent runnable but waiting for a CPU (``/proc/thread-self/schedstat``, field
    2): the time other programs took from the measurement. Absent on kernels without schedstat."""

    def __init__(self) -> None:
        try:
            self.fd: Optional[int] = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None
        if self.fd is not None and self.read() is None:
            self.close()

    def read(self) -> Optional[int]:
        if self.fd is None:
            return None
        try:
            return int(os.pread(self.fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _timed(call: Callable[[], Any], number: int, clock: Callable[[], float] = time.perf_counter) -> float:
    loop = range(number)
    t0 = clock()
    for _ in loop:
        call()
    return clock() - t0


DEVICE_MAX_NUMBER = 1 << 16


def calibrate(call: Callable[[], Any], min_seconds: float, max_number: int = 1 << 30,
              timed: Callable[..., float] = _timed) -> Tuple[int, float]:
    """Runs per sample so that one sample lasts at least ``min_seconds``: ``(number, seconds spent)``."""
    number = 1
    spent = 0.0
    if min_seconds <= 0:
        return number, spent
    for _ in range(_MAX_CALIBRATION_ROUNDS):
        elapsed = timed(call, number)
        spent += elapsed
        if elapsed >= min_seconds or number >= max_number:
            break
        # aim 20% past the target, so the samples do not fall just short of it
        guess = number * 1.2 * min_seconds / elapsed if elapsed > 0 else number * 10
        number = min(int(max_number), max(number * 2, int(guess + 1)))
    return number, spent


def _device_timed(timed_call: Callable[[], float]) -> Callable[[Callable[[], Any], int], float]:
    """``_timed`` on the device's clock: ``number`` calls, each returning its own device seconds."""
    def timed(_call: Callable[[], Any], number: int, clock: Callable[[], float] = time.perf_counter) -> float:
        total = 0.0
        for _ in range(number):
            total += timed_call()
        return total
    return timed


def bench_run(call: Callable[[], Any], options: Optional[Dict[str, Any]] = None,
              emit: Optional[Callable[..., None]] = None,
              device_call: Optional[Callable[[], float]] = None) -> Dict[str, Any]:
    """Measure ``call``: the first run, a calibration, then samples until ``samples`` steady ones follow the
    detected warm-up (or ``max_seconds`` run out). Device state is sampled after each sample.

    ``emit(record)`` is called with a sample's record at most every ``EVENT_INTERVAL`` seconds (live progress).
    Result: ``number``, ``first_run_s``, ``calibration_s``, ``samples`` (one record per sample: ``i``, ``t``
    seconds since the start, ``s`` seconds per run, and the state fields the board has), ``warmup`` (leading
    samples that are warm-up), ``warmup_converged``, ``budget_exhausted``, ``state_start``/``state_end``
    (snapshots), ``peak_rss_bytes`` (VmHWM, reset before the run where the kernel allows: ``peak_rss_scope``
    "run", else "session") and ``rss_start_bytes``, ``pinned`` (CPUs), ``wall_s``, ``clock``.

    ``device_call`` (a GPU function's ``bind_timed``: one call returning its kernels' device seconds): the first
    run, the calibration and the samples are measured on the device's clock (``clock`` "device"); the budget,
    ``t`` and the run-queue wait stay on the host's.
    """
    opts = dict(RUN_OPTIONS)
    unknown = set(options or {}) - set(RUN_OPTIONS)
    if unknown:
        raise TypeError("unknown bench options: %s (allowed: %s)" % (", ".join(sorted(unknown)),
                                                                    ", ".join(sorted(RUN_OPTIONS))))
    opts.update(options or {})
    wanted = int(opts["samples"])
    max_warmup = int(opts["max_warmup"])
    if not 1 <= wanted <= MAX_SAMPLES - max_warmup or max_warmup < 0:
        raise ValueError("bench: samples must be 1..%d and max_warmup >= 0 (got %r, %r)"
                         % (MAX_SAMPLES - max(max_warmup, 0), wanted, max_warmup))
    look = 2 * max(1, int(opts["warmup_window"]))
    clock = time.perf_counter
    timed = _timed if device_call is None else _device_timed(device_call)
    if device_call is not None:
        call = device_call
    hot_c = opts["hot_c"]
    state_start = snapshot(hot_c) if opts["state"] else {}
    peak_reset = reset_peak_rss() if opts["state"] else False
    previous = pin_threads(opts["pin"])
    sampler = DeviceStateSampler(hot_c) if opts["state"] else None
    waits = _RunQueueWait()
    try:
        t_start = clock()
        deadline = t_start + float(opts["max_seconds"])
        if device_call is not None:
            first = device_call()
        else:
            t0 = clock()
            call()
            first = clock() - t0
        if opts["number"]:  # fixed runs per sample: no calibration
            number, cal_s = int(opts["number"]), 0.0
            if number < 1:
                raise ValueError("bench: number must be >= 1, got %r" % number)
        else:
            max_number = int(opts["max_number"])
            if device_call is not None:   # every call is a launch and a wait: bound the calls per sample
                max_number = min(max_number, DEVICE_MAX_NUMBER)
            number, cal_s = calibrate(call, float(opts["min_sample_ms"]) / 1e3, max_number, timed)
        series: List[float] = []
        records: List[Dict[str, Any]] = []
        warm: Optional[int] = None
        scan_from = 0
        last_emit = -1.0
        disturbed_steady = 0
        converged = False
        exhausted = False
        sample = sampler.sample if sampler is not None else dict
        wait_ns = waits.read if waits.fd is not None else None
        while True:
            w0 = wait_ns() if wait_ns is not None else None
            h0 = clock()
            elapsed = timed(call, number, clock)
            w1 = wait_ns() if wait_ns is not None else None
            now = clock()
            host_elapsed = now - h0   # (the run-queue wait is the host's: compare it with the host's time)
            per_run = elapsed / number
            rec = sample()
            if w0 is not None and w1 is not None:
                rec["wait_s"] = (w1 - w0) * 1e-9
                rec["disturbed"] = (w1 - w0) * 1e-9 > DISTURBED_FRACTION * host_elapsed
            rec["i"] = len(series)
            rec["t"] = now - t_start
            rec["s"] = per_run
            series.append(per_run)
            records.append(rec)
            if emit is not None and now - last_emit >= EVENT_INTERVAL:
                last_emit = now
                emit(rec)
            if warm is None:
                warm, converged, scan_from = _scan_warmup(series, look, max_warmup, scan_from)
                if warm is not None:
                    disturbed_steady = sum(1 for r in records[warm:] if r.get("disturbed"))
            elif rec.get("disturbed"):
                disturbed_steady += 1
            if warm is not None:
                steady = len(series) - warm
                clean = steady - (disturbed_steady if opts["retry_disturbed"] else 0)
                # enough clean steady samples: a disturbed one is replaced, up to ten times the wanted count
                # (on a busy machine, most samples longer than a scheduler slice are disturbed)
                if clean >= wanted or steady >= DISTURBED_RETRY_FACTOR * wanted:
                    break
            if now > deadline or len(series) >= MAX_SAMPLES:
                exhausted = True
                if warm is None:  # undecided: keep everything, but say the warm-up was not detected
                    warm, converged = 0, False
                break
        wall = clock() - t_start
    finally:
        waits.close()
        if sampler is not None:
            sampler.close()
        unpin_threads(previous)
    result: Dict[str, Any] = {
        "number": number, "first_run_s": first, "calibration_s": cal_s, "samples": records, "warmup": warm,
        "warmup_converged": converged, "budget_exhausted": exhausted, "wall_s": wall,
        "pinned": sorted(int(c) for c in opts["pin"]) if opts["pin"] else None,
        "clock": "host" if device_call is None else "device",
        "options": {k: opts[k] for k in ("min_sample_ms", "samples", "max_warmup", "warmup_window", "max_seconds")},
    }
    if opts["state"]:
        result["state_start"] = state_start
        result["state_end"] = snapshot(hot_c)
        for key, src in (("peak_rss_bytes", "peak_rss_bytes"), ("rss_start_bytes", "rss_bytes")):
            value = (result["state_end"] if key == "peak_rss_bytes" else state_start).get(src)
            if value is not None:
                result[key] = value
        # the peak of this run when the kernel let us reset it, else of the whole session so far
        result["peak_rss_scope"] = "run" if peak_reset else "session"
    return result


def cooldown(max_c: float, timeout_s: float = 300.0, poll_s: float = 1.0) -> Dict[str, Any]:
    """Wait until the CPU temperature is at most ``max_c`` (bounded by ``timeout_s``)."""
    t0 = time.monotonic()
    with DeviceStateSampler() as sampler:
        temp = sampler.temperature_c()
        if temp is None:
            return {"waited_s": 0.0, "reached": True, "available": False}
        while temp is not None and temp > max_c:
            if time.monotonic() - t0 >= timeout_s:
                return {"waited_s": time.monotonic() - t0, "temp_c": temp, "reached": False, "available": True}
            time.sleep(max(0.01, min(poll_s, timeout_s - (time.monotonic() - t0))))
            temp = sampler.temperature_c()
    return {"waited_s": time.monotonic() - t0, "temp_c": temp, "reached": True, "available": True}


# -- RPC built-ins (``fn(session, ctx, *args)``, like graph_executor's) -------------------------------------------

def _target_call(session: Any, target: Any, args: Any) -> Callable[[], Any]:
    from .protocol import RemoteHandle

    try:
        func = session._get(target, "function")
    except TypeError:
        graph = session._get(target, "graph")
        return graph.run
    if not isinstance(args, list):
        raise TypeError("tether.bench.run: args must be a list")
    kargs = [session._get(a, "array") if isinstance(a, RemoteHandle) else a for a in args]
    bind = getattr(func, "bind", None)
    if bind is not None:
        return bind(*kargs)
    return lambda: func(*kargs)


def _device_call(session: Any, target: Any, args: Any) -> Optional[Callable[[], float]]:
    """A GPU function's call timed on the device's clock (None for CPU functions and graphs)."""
    from .protocol import RemoteHandle
    from .timing import device_timer

    try:
        func = session._get(target, "function")
    except TypeError:
        return None
    kargs = [session._get(a, "array") if isinstance(a, RemoteHandle) else a for a in args]
    return device_timer(func, kargs)


def _bench_run(session: Any, ctx: Any, target: Any, args: Any = None, options: Any = None) -> Dict[str, Any]:
    call = _target_call(session, target, list(args or []))
    device_call = _device_call(session, target, list(args or []))

    def emit(rec: Dict[str, Any]) -> None:
        fields = {k: v for k, v in rec.items() if k not in ("i", "s")}
        ctx.emit("sample", index=rec["i"], seconds=rec["s"], **fields)

    return bench_run(call, dict(options or {}), emit, device_call)


def _bench_state(session: Any, ctx: Any, hot_c: Any = None) -> Dict[str, Any]:
    return snapshot(hot_c)


def _bench_cooldown(session: Any, ctx: Any, max_c: Any, timeout_s: Any = 300.0, poll_s: Any = 1.0) -> Dict[str, Any]:
    return cooldown(float(max_c), float(timeout_s), float(poll_s))


BUILTINS: Dict[str, Callable[..., Any]] = {
    "tether.bench.run": _bench_run,
    "tether.bench.state": _bench_state,
    "tether.bench.cooldown": _bench_cooldown,
}


def register_builtins(session: Any, table: Optional[Dict[str, Callable[..., Any]]] = None) -> None:
    """Add the ``tether.bench.*`` built-ins to a SessionHandler (see graph_executor.register_builtins)."""
    if table is None:
        table = session._builtins
    for name, fn in BUILTINS.items():
        table[name] = (lambda f: lambda ctx, *args: f(session, ctx, *args))(fn)
