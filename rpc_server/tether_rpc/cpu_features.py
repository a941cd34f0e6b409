"""What this device's CPU can execute, and whether a module's code needs more (metadata "requires", docs/abi.md).

A module records the instruction set level and the CPU features its code may use, in the vocabulary Linux uses
for hardware capabilities (the names /proc/cpuinfo prints under "Features" or "flags")::

    "requires": {"isa": "armv8", "features": ["idiva", "neon", "vfpv4"]}

The device side reads its own capabilities from the auxiliary vector (``getauxval(AT_HWCAP/AT_HWCAP2/AT_PLATFORM)``
through ctypes, else /proc/self/auxv) on ARM, and from /proc/cpuinfo "flags" on x86_64. On ARM the auxiliary vector
comes first because qemu-user shows the *host's* /proc/cpuinfo to the guest but emulates the auxiliary vector,
and because a 32-bit kernel on an ARMv8 core may say "CPU architecture: 7". A module whose needs the CPU does not
meet is refused before dlopen (tether_rpc.module, with :func:`missing`), instead of dying of SIGILL mid-call.
"""
from __future__ import annotations

import ctypes
import logging
import struct
from typing import Any, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

AT_PLATFORM, AT_HWCAP, AT_HWCAP2 = 15, 16, 26

# Linux arch/arm/include/uapi/asm/hwcap.h and arch/arm64/include/uapi/asm/hwcap.h: bit -> name
_ARM_HWCAP = {1: "half", 2: "thumb", 4: "fastmult", 6: "vfp", 7: "edsp", 12: "neon", 13: "vfpv3", 14: "vfpv3d16",
              15: "tls", 16: "vfpv4", 17: "idiva", 18: "idivt", 19: "vfpd32", 20: "lpae", 21: "evtstrm"}
_ARM_HWCAP2 = {0: "aes", 1: "pmull", 2: "sha1", 3: "sha2", 4: "crc32"}
_ARM64_HWCAP = {0: "fp", 1: "asimd", 2: "evtstrm", 3: "aes", 4: "pmull", 5: "sha1", 6: "sha2", 7: "crc32",
                8: "atomics", 9: "fphp", 10: "asimdhp", 11: "cpuid", 12: "asimdrdm", 13: "jscvt", 14: "fcma",
                15: "lrcpc", 16: "dcpop", 17: "sha3", 18: "sm3", 19: "sm4", 20: "asimddp", 21: "sha512", 22: "sve",
                23: "asimdfhm", 24: "dit", 25: "uscat", 26: "ilrcpc", 27: "flagm", 28: "ssbs", 29: "sb",
                30: "paca", 31: "pacg"}
_ARM64_HWCAP2 = {0: "dcpodp", 1: "sve2", 13: "i8mm", 14: "bf16"}

ISA_LEVELS = {"armv7": 0, "armv8": 1}
# What each ISA level adds, for error messages.
ISA_WHAT = {"armv8": "ARMv8-A instructions (lda/stl acquire-release, vsel, vrint, vmaxnm)"}

_cache: Dict[str, Dict[str, Any]] = {}


def _bits(value: int, names: Dict[int, str]) -> List[str]:
    return [name for bit, name in names.items() if value >> bit & 1]


def read_auxv() -> Dict[int, Any]:
    """{AT_HWCAP: int, AT_HWCAP2: int, AT_PLATFORM: str} of this process ({} if neither source answers)."""
    try:
        libc = ctypes.CDLL(None)
        getauxval = libc.getauxval
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        platform_ptr = getauxval(AT_PLATFORM)
        platform = ctypes.cast(platform_ptr, ctypes.c_char_p).value if platform_ptr else None
        return {AT_HWCAP: int(getauxval(AT_HWCAP)), AT_HWCAP2: int(getauxval(AT_HWCAP2)),
                AT_PLATFORM: platform.decode("ascii", "replace") if platform else None}
    except (OSError, AttributeError, ValueError):
        pass
    try:
        with open("/proc/self/auxv", "rb") as fh:
            raw = fh.read(1 << 16)
    except OSError:
        return {}
    word = struct.calcsize("L")
    out: Dict[int, Any] = {}
    for i in range(0, len(raw) - 2 * word + 1, 2 * word):
        key, value = struct.unpack_from("LL", raw, i)
        if key == 0:
            break
        if key in (AT_HWCAP, AT_HWCAP2):
            out[key] = value
    return out


def _is_armv8_core(core: str) -> bool:
    if core.startswith(("cortex-x", "neoverse-")):
        return True
    digits = core[len("cortex-a"):] if core.startswith("cortex-a") else ""
    return digits.isdigit() and int(digits) >= 32


def capabilities(arch: str, cpuinfo: Optional[Dict[str, Any]] = None,
                 auxv: Optional[Dict[int, Any]] = None) -> Dict[str, Any]:
    """``{"isa", "features", "source"}`` of this CPU. ``cpuinfo``: tether_rpc.device_info.parse_cpuinfo's dict;
    ``auxv``: read_auxv()'s (read here when None). "source" is "auxv", "cpuinfo" or None (nothing known: then
    no module is refused for its features)."""
    cpuinfo = cpuinfo or {}
    words = [w.lower() for w in cpuinfo.get("features") or []]
    if arch == "x86_64":
        return {"isa": "x86_64", "features": sorted(set(words)), "source": "cpuinfo" if words else None}
    if arch not in ("aarch64", "armv7"):
        return {"isa": arch, "features": [], "source": None}
    aux = read_auxv() if auxv is None else auxv
    hwcap, hwcap2 = aux.get(AT_HWCAP), aux.get(AT_HWCAP2) or 0
    if hwcap:
        tables = (_ARM64_HWCAP, _ARM64_HWCAP2) if arch == "aarch64" else (_ARM_HWCAP, _ARM_HWCAP2)
        features, source = set(_bits(hwcap, tables[0]) + _bits(hwcap2, tables[1])), "auxv"
    elif cpuinfo.get("features_key") == "features":   # ARM's own cpuinfo, not an emulator host's x86 "flags"
        features, source = set(words), "cpuinfo"
    else:
        features, source = set(), None
    if arch == "aarch64":
        return {"isa": "armv8", "features": sorted(features), "source": source}
    platform = str(aux.get(AT_PLATFORM) or "")
    v8 = (platform.startswith("v8") or "crc32" in features or str(cpuinfo.get("architecture") or "") == "8"
          or any(_is_armv8_core(c) for c in cpuinfo.get("cores") or []))
    return {"isa": "armv8" if v8 else "armv7", "features": sorted(features), "source": source}


def missing(requires: Any, caps: Dict[str, Any]) -> List[str]:
    """What of a module's ``requires`` this CPU lacks ([] when it runs here or when either side is unknown)."""
    if not isinstance(requires, dict) or caps.get("source") is None:
        return []
    out = []
    isa = requires.get("isa")
    have_level, need_level = ISA_LEVELS.get(str(caps.get("isa"))), ISA_LEVELS.get(str(isa))
    if have_level is not None and need_level is not None and need_level > have_level:
        out.append(ISA_WHAT.get(str(isa), str(isa)))
    have = set(caps.get("features") or ())
    needed: Sequence[Any] = requires.get("features") or ()
    out.extend(str(f) for f in needed if isinstance(f, str) and f not in have)
    return out


def suggest_preset(arch: str, caps: Dict[str, Any], android: bool = False) -> Optional[str]:
    """A tether target preset whose code this CPU runs (None when no preset fits)."""
    have = set(caps.get("features") or ())
    if arch == "x86_64":
        return "host"
    if arch == "aarch64":
        if android:
            return "android-arm64"
        return "rasp5" if {"atomics", "lrcpc", "asimddp", "fphp", "asimdhp"} <= have else "rasp4b"
    if arch == "armv7":
        if caps.get("isa") == "armv8":
            return "rasp3b"
        if {"neon", "vfpv4", "idiva"} <= have:
            return "armv7-a7"
    return None


def this_cpu(arch: str, cpuinfo: Dict[str, Any]) -> Dict[str, Any]:
    """capabilities() of this process's CPU, computed once per process (a forked worker inherits it)."""
    if "cpu" not in _cache:
        _cache["cpu"] = capabilities(arch, cpuinfo)
        logger.debug("CPU capabilities: %s", _cache["cpu"])
    return _cache["cpu"]


# ---- CPU dispatch (metadata "cpu_dispatch", docs/abi.md) ------------------------------------------------------
DISPATCH_WORD = "tether_cpu_features"


def dispatch_word(names: Any, caps: Dict[str, Any]) -> int:
    """The module's CPU-features word: bit i set when this CPU reports ``names[i]`` (0 when unknown: every kernel
    then takes its base version, which runs on any CPU the module's "requires" admits)."""
    if not isinstance(names, list) or caps.get("source") is None:
        return 0
    have = set(caps.get("features") or ())
    return sum(1 << i for i, n in enumerate(names[:32]) if isinstance(n, str) and n in have)


def set_dispatch_word(lib: Any, names: Any, caps: Dict[str, Any], label: str) -> int:
    """Write :func:`dispatch_word` into the loaded library ``lib`` (a ctypes.CDLL) when its metadata names bits."""
    if not names:
        return 0
    word = dispatch_word(names, caps)
    try:
        ctypes.c_uint32.in_dll(lib, DISPATCH_WORD).value = word
    except ValueError:   # metadata names bits but the library has no word: every kernel stays on its base version
        logger.warning("%s: metadata cpu_dispatch %s but no %s symbol; using base kernels", label, names,
                       DISPATCH_WORD)
        return 0
    logger.debug("%s: CPU dispatch %s -> word %#x", label, names, word)
    return word
