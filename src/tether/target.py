"""Compilation targets: an LLVM triple plus CPU and features, named by a preset or spelled out.

    Target("rasp4b")
    Target("aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon")
    Target.from_device_info(session.device_info())
    Target("opencl -device=mali", host="android-arm64")        # a GPU target (tether.gpu_target)

A Target is a frozen record; everything that depends on the machine (the data layout, vector width, whether a
rounding instruction exists) is derived here so codegen never re-parses triples.
"""
from __future__ import annotations

import dataclasses
import functools
import shlex
import threading
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from tether.gpu_target import (GPU_PRESET_NAMES, GpuTarget, UnknownTargetError, gpu_presets, is_gpu_spec,
                               parse_gpu)


# ELF e_machine per architecture (abi.md: metadata "arch" must agree with it).
ELF_MACHINE = {"x86_64": 62, "aarch64": 183, "armv7": 40}
ELF_CLASS = {"x86_64": 64, "aarch64": 64, "armv7": 32, "wasm32": 32}

# WebAssembly (docs/web.md "The wasm32 target"): the features every current engine has are always on (LLVM gets them
# before the target's own -mattr, which may turn one off again); simd128 is the preset's feature, which
# wasm32-nosimd turns off. The CPU is LLVM's "mvp", so exactly these features are on and no others (LLVM's
# "generic" wasm CPU adds some of its own choosing, e.g. reference-types, that change with LLVM releases).
WASM_TRIPLE = "wasm32-unknown-unknown"
WASM_CPU = "mvp"
WASM_BASE_FEATURES = ("+bulk-memory", "+nontrapping-fptoint", "+sign-ext", "+mutable-globals")
# LLVM's WebAssembly features a wasm32 target string may name. "atomics" and "shared-memory" are not among them:
# modules are single-threaded (a shared memory needs cross-origin isolation in a browser).
WASM_FEATURES = ("simd128", "relaxed-simd", "bulk-memory", "bulk-memory-opt", "nontrapping-fptoint", "sign-ext",
                 "mutable-globals", "multivalue", "reference-types", "extended-const", "tail-call",
                 "call-indirect-overlong", "fp16", "multimemory")


@dataclasses.dataclass(frozen=True)
class _Preset:
    triple: str
    cpu: str
    features: str
    description: str


# Hardware notes: rasp3b runs a 32-bit OS on its Cortex-A53 (AArch32), so it is an armv7 hard-float target.
_PRESETS: Dict[str, _Preset] = {
    "x86_64": _Preset("x86_64-unknown-linux-gnu", "x86-64", "", "generic x86-64 (SSE2)"),
    "rasp4b": _Preset("aarch64-unknown-linux-gnu", "cortex-a72", "+neon", "Raspberry Pi 4 B, 64-bit OS"),
    "rasp5": _Preset("aarch64-unknown-linux-gnu", "cortex-a76", "+neon", "Raspberry Pi 5, 64-bit OS"),
    # opt-in: float16 computed in half (--precision fp16, fmla .8h); other float16 kernels use it too
    "rasp5-fp16": _Preset("aarch64-unknown-linux-gnu", "cortex-a76", "+neon,+fullfp16",
                          "Raspberry Pi 5, 64-bit OS, half-precision arithmetic (--precision fp16)"),
    "rasp3b": _Preset("armv7a-unknown-linux-gnueabihf", "cortex-a53", "+neon,+vfp4",
                      "Raspberry Pi 3 B, 32-bit OS, hard float"),
    "armv7-a7": _Preset("armv7a-unknown-linux-gnueabihf", "cortex-a7", "+neon,+vfp4",
                        "Cortex-A7 boards (Pi 2, Allwinner H3), hard float"),
    "jetson-nano": _Preset("aarch64-unknown-linux-gnu", "cortex-a57", "+neon", "NVIDIA Jetson Nano CPU"),
    "android-arm64": _Preset("aarch64-unknown-linux-android24", "generic", "+neon", "Android 7+ phones, arm64-v8a"),
    "android-arm64-fp16": _Preset("aarch64-unknown-linux-android24", "generic", "+neon,+fullfp16",
                                  "Android phones with Armv8.2-A half-precision arithmetic (Cortex-A55/A75 and "
                                  "later), arm64-v8a (--precision fp16)"),
    "wasm32": _Preset(WASM_TRIPLE, WASM_CPU, "+simd128",
                      "WebAssembly with 128-bit SIMD (browsers, node >= 16), single-threaded; bulk-memory, "
                      "nontrapping-fptoint, sign-ext, mutable-globals always on"),
    "wasm32-nosimd": _Preset(WASM_TRIPLE, WASM_CPU, "-simd128",
                             "WebAssembly without SIMD (old engines), single-threaded"),
    # opt-in: fused multiply-adds (f32x4.relaxed_madd) whose last bits may differ between engines and machines
    "wasm32-relaxed": _Preset(WASM_TRIPLE, WASM_CPU, "+simd128,+relaxed-simd",
                              "WebAssembly with relaxed SIMD (Chrome 114+, node 22+): fused multiply-add"),
}
PRESET_NAMES: Tuple[str, ...] = ("host",) + tuple(_PRESETS)


def _arch_of_triple(triple: str) -> str:
    head = triple.split("-", 1)[0].lower()
    if head in ("x86_64", "amd64"):
        return "x86_64"
    if head in ("aarch64", "arm64"):
        return "aarch64"
    if head.startswith("armv7") or head.startswith("armv8") or head.startswith("thumbv7") or head == "arm":
        return "armv7"
    if head == "wasm32":
        return "wasm32"
    raise UnknownTargetError("unsupported architecture %r in triple %r: tether targets x86_64, aarch64, armv7 and "
                             "wasm32" % (head, triple))

# wasm-ld (docs/web.md "The module"): no entry point; memory and __heap_base exported (the JS runtime allocates
# from __heap_base up); an undefined symbol is an error (wasm-ld's default; --allow-undefined would import it);
# the stack first, so an overflow runs below address 0 and traps instead of overwriting data. 1 MiB of stack, not
# the 8 MiB a Linux thread gives an ELF module: kernels keep buffers over 64 KiB in the static scratch arena
# (codegen/function.py), a wasm32 module has no parallel tasks with stacks of their own, and one kernel frame is on
# the stack at a time (wrapper -> impl -> math/memcpy). The largest frame of the test models, full-size
# mobilenet_v2 among them, is 68,000 bytes; 1 MiB is 15 times that and keeps each module's initial memory small.
WASM_STACK_BYTES = 1 << 20
WASM_LINK_FLAGS: Tuple[str, ...] = ("--no-entry", "--export-memory", "--export=__heap_base", "--stack-first",
                                    "-z", "stack-size=%d" % WASM_STACK_BYTES, "--strip-debug", "--gc-sections")


def _check_wasm_features(features: Iterable[str], spec: str) -> None:
    """A wasm32 target names only WebAssembly features LLVM knows (LLVM itself would only warn and ignore)."""
    for f in features:
        name = f[1:] if f[:1] in "+-" else f
        if f[:1] not in ("+", "-") or name not in WASM_FEATURES:
            why = (" (modules for wasm32 are single-threaded: no shared memory)"
                   if name in ("atomics", "shared-memory") else "")
            raise UnknownTargetError("unknown WebAssembly feature %r in target %r%s; expected +NAME or -NAME "
                                     "with NAME one of %s" % (f, spec, why, ", ".join(WASM_FEATURES)))


def _normalize_triple(triple: str) -> str:
    """Spell triples with an explicit vendor ("aarch64-linux-gnu" -> "aarch64-unknown-linux-gnu")."""
    parts = triple.strip().split("-")
    if len(parts) == 3 and parts[1] in ("linux", "none"):
        parts.insert(1, "unknown")
    return "-".join(parts)


def _host_cpu() -> Tuple[str, str, str]:
    import llvmlite.binding as llvm  # lazily: `import tether` must stay cheap

    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name()
    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM cannot list features on some hosts; the CPU name still implies them
        features = ""
    return triple, cpu, features


# ---- what a module's code needs from the CPU (metadata "requires", checked by the device runtime) -----------
# Names are the device's own: Linux hwcap names as /proc/cpuinfo "Features"/"flags" print them. Only features
# LLVM may emit for tether's code are listed (never aes/sha/crc32: no tether kernel uses those instructions).
_ARMV7_CORES_VFP4 = {"cortex-a5", "cortex-a7", "cortex-a12", "cortex-a15", "cortex-a17"}
_ARMV7_CORES_IDIV = {"cortex-a7", "cortex-a12", "cortex-a15", "cortex-a17"}
_ARMV7_CORES_NEON = {"cortex-a7", "cortex-a8", "cortex-a9", "cortex-a12", "cortex-a15", "cortex-a17"}
# ARMv8.2+ cores: LSE atomics, RCpc loads, dot product, fp16 arithmetic (LLVM uses them for atomics and vectors)
_ARM_V82_CORES = {"cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a76ae", "cortex-a77", "cortex-a78",
                  "cortex-a78ae", "cortex-a78c", "cortex-x1", "cortex-x2", "cortex-x3", "cortex-x4", "cortex-a510",
                  "cortex-a520", "cortex-a710", "cortex-a715", "cortex-a720", "neoverse-n1", "neoverse-n2",
                  "neoverse-v1", "neoverse-v2", "apple-m1", "apple-m2"}
_ARM_V82_FEATURES = ("atomics", "lrcpc", "asimddp", "fphp", "asimdhp")
# LLVM -mattr name -> hwcap name, per architecture
_ARM64_ATTRS = {"lse": ("atomics",), "rcpc": ("lrcpc",), "dotprod": ("asimddp",), "fullfp16": ("fphp", "asimdhp"),
                "i8mm": ("i8mm",), "bf16": ("bf16",), "sve": ("sve",), "sve2": ("sve2",)}
_X86_ATTRS = {"ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "popcnt": "popcnt", "avx": "avx",
              "avx2": "avx2", "fma": "fma", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2", "avx512f": "avx512f",
              "avx512bw": "avx512bw", "avx512cd": "avx512cd", "avx512dq": "avx512dq", "avx512vl": "avx512vl",
              "avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni"}
# What an x86 -mcpu implies (LLVM's X86.td), in LLVM's feature names, of the features above. Every CPU LLVM gives
# VNNI is here, checked against LLVM's CPU table by tests/test_x86_cpu_features.py.
_X86_V2 = ("ssse3", "sse4.1", "sse4.2", "popcnt")
_X86_V3 = _X86_V2 + ("avx", "avx2", "fma", "f16c", "bmi", "bmi2")
_X86_V4 = _X86_V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_X86_AVX_VNNI = _X86_V3 + ("avxvnni",)             # VEX-encoded VNNI without AVX-512 (hybrid and E-core chips)
_X86_V4_VNNI = _X86_V4 + ("avx512vnni",)
_X86_V4_BOTH_VNNI = _X86_V4_VNNI + ("avxvnni",)
_X86_CPUS = {"x86-64-v2": _X86_V2, "nehalem": _X86_V2, "x86-64-v3": _X86_V3, "haswell": _X86_V3,
             "skylake": _X86_V3, "znver1": _X86_V3, "znver2": _X86_V3, "znver3": _X86_V3, "x86-64-v4": _X86_V4,
             "skylake-avx512": _X86_V4}
_X86_CPUS.update(dict.fromkeys(("cascadelake", "cooperlake", "icelake-client", "icelake-server", "tigerlake",
                                "rocketlake", "znver4"), _X86_V4_VNNI))
_X86_CPUS.update(dict.fromkeys(("sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "znver5"),
                               _X86_V4_BOTH_VNNI))
# (diamondrapids and novalake have AVX10 too, which LLVM spells otherwise: only their AVX-VNNI is claimed)
_X86_CPUS.update(dict.fromkeys(("alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s", "lunarlake",
                                "pantherlake", "wildcatlake", "novalake", "gracemont", "sierraforest", "grandridge",
                                "clearwaterforest", "diamondrapids"), _X86_AVX_VNNI))
# LLVM x86 feature -> the features it needs: -mattr=+X turns those on too, -mattr=-Y turns off what needs Y
_X86_NEEDS = {"sse4.1": ("ssse3",), "sse4.2": ("sse4.1",), "avx": ("sse4.2",), "avx2": ("avx",), "fma": ("avx",),
              "f16c": ("avx",), "avx512f": ("avx2", "fma", "f16c"), "avx512bw": ("avx512f",),
              "avx512cd": ("avx512f",), "avx512dq": ("avx512f",), "avx512vl": ("avx512f",),
              "avx512vnni": ("avx512bw",), "avxvnni": ("avx2",)}


def x86_features(cpu: str, features: Iterable[str]) -> frozenset:
    """The LLVM features x86 code for ``cpu`` and these -mattr ``features`` may use (of those tether asks about):
    what the CPU implies, then each +X (with what X needs) and -X (with what needs X), in order, as LLVM does."""
    return _x86_features(cpu, tuple(features))


@functools.lru_cache(maxsize=64)   # (asked for every vector width a schedule needs: hundreds of times a build)
def _x86_features(cpu: str, features: Tuple[str, ...]) -> frozenset:
    have = set(_X86_CPUS.get(cpu, ()))
    for f in features:
        todo = [f[1:]]
        while todo:
            x = todo.pop()
            if f.startswith("+") and x not in have:
                have.add(x)
                todo.extend(_X86_NEEDS.get(x, ()))
            elif f.startswith("-") and x in have:
                have.discard(x)
                todo.extend(y for y, needs in _X86_NEEDS.items() if x in needs)
    return frozenset(have)


def _is_armv8_core(cpu: str) -> bool:
    if cpu.startswith(("cortex-x", "neoverse-", "apple-")):
        return True
    digits = cpu[len("cortex-a"):] if cpu.startswith("cortex-a") else ""
    return digits.isdigit() and int(digits) >= 32 and int(digits) not in (5, 7, 8, 9, 12, 15, 17)


def cpu_requirements(arch: str, triple: str, cpu: str, features: Iterable[str]) -> Dict[str, Any]:
    """``{"isa": "armv7"|"armv8"|"x86_64", "features": [...]}``: what code built for this CPU and these -mattr
    features (in their order) may execute, in the device's hwcap vocabulary (docs/abi.md, metadata "requires")."""
    on = {f[1:] for f in features if f.startswith("+")}
    off = {f[1:] for f in features if f.startswith("-")}
    need: set = set()
    if arch == "x86_64":
        have = x86_features(cpu, features)
        return {"isa": "x86_64", "features": sorted(name for attr, name in _X86_ATTRS.items() if attr in have)}
    if arch == "wasm32":
        # what a JS runtime checks with WebAssembly.validate before instantiating (docs/web.md)
        return {"isa": "wasm32", "features": sorted(f for f in ("simd128", "relaxed-simd")
                                                    if f in on and f not in off)}
    v8 = _is_armv8_core(cpu) or triple.startswith(("armv8", "thumbv8")) or bool(
        on & {"v8", "armv8-a", "fp-armv8", "v8.1a", "v8.2a", "crypto", "crc"})
    if arch == "aarch64":
        if "neon" not in off:
            need.update(("fp", "asimd"))
        if cpu in _ARM_V82_CORES or on & {"v8.2a", "v8.3a", "v8.4a", "v8.5a", "v9a"}:
            need.update(_ARM_V82_FEATURES)
        for attr, names in _ARM64_ATTRS.items():
            if attr in on:
                need.update(names)
            elif attr in off:
                need.difference_update(names)
        return {"isa": "armv8", "features": sorted(need)}
    # armv7 triples (32-bit ARM, also ARMv8 cores in AArch32 state)
    if ("neon" in on or cpu in _ARMV7_CORES_NEON or v8) and "neon" not in off:
        need.add("neon")
    if ("vfp4" in on or cpu in _ARMV7_CORES_VFP4 or v8) and "vfp4" not in off:
        need.add("vfpv4")
    if ("hwdiv-arm" in on or cpu in _ARMV7_CORES_IDIV or v8) and "hwdiv-arm" not in off:
        need.add("idiva")
    return {"isa": "armv8" if v8 else "armv7", "features": sorted(need)}


@dataclasses.dataclass(frozen=True)
class Target:
    """Where code runs: triple, CPU, features and what follows from them.

    A GPU target (``gpu`` set, a tether.gpu_target.GpuTarget) keeps its host's triple, CPU and features here: the
    host runs the module's shared library and launches the kernels, so host code builds and links as for that
    CPU target (``.host`` is it without the GPU)."""

    triple: str
    cpu: str = "generic"
    features: str = ""
    preset: Optional[str] = None
    gpu: Optional[GpuTarget] = None

    def __init__(self, spec: Union[str, "Target", None] = "host", cpu: Optional[str] = None,
                 features: Optional[str] = None, preset: Optional[str] = None,
                 host: Union[str, "Target", None] = None) -> None:
        """Build from a preset name ("rasp4b"), a target string ("aarch64-linux-gnu -mcpu=... -mattr=..."), or an
        explicit triple with cpu/features keywords; a GPU target string ("opencl -device=mali", "rasp5-vulkan")
        with ``host`` its CPU target (default: the preset's host, else "host")."""
        triple, tcpu, tfeat, tpreset, gpu = _parse_spec(spec if spec is not None else "host")
        if host is not None:
            if gpu is None:
                raise UnknownTargetError("host=%r is for GPU targets (opencl, vulkan, cuda), not %r" % (
                    str(host), str(spec)))
            triple, tcpu, tfeat, tpreset = _parse_host(host, str(spec))
        object.__setattr__(self, "triple", triple)
        object.__setattr__(self, "cpu", cpu if cpu is not None else tcpu)
        object.__setattr__(self, "features", features if features is not None else tfeat)
        object.__setattr__(self, "preset", preset if preset is not None else tpreset)
        object.__setattr__(self, "gpu", gpu)
        if _arch_of_triple(self.triple) == "wasm32":  # validate early
            if gpu is not None:
                raise UnknownTargetError("a GPU target's host cannot be wasm32 (target %r)" % str(spec))
            _check_wasm_features(self.feature_list, str(self))

    # ---- the GPU half ---------------------------------------------------------------------------------------
    @property
    def is_gpu(self) -> bool:
        return self.gpu is not None

    @property
    def host(self) -> "Target":
        """The CPU target host code is built for: this target itself, without its GPU."""
        if self.gpu is None:
            return self
        return Target(self.triple, cpu=self.cpu, features=self.features, preset=self.preset)

    # ---- derived properties -------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        """"x86_64", "aarch64", "armv7" or "wasm32" (the metadata and ELF vocabulary)."""
        return _arch_of_triple(self.triple)

    @property
    def bits(self) -> int:
        return ELF_CLASS[self.arch]

    @property
    def pointer_bytes(self) -> int:
        return self.bits // 8

    @property
    def elf_machine(self) -> int:
        if self.is_wasm:
            raise ValueError("a wasm32 module is a WebAssembly binary, not ELF")
        return ELF_MACHINE[self.arch]

    @property
    def is_wasm(self) -> bool:
        """A WebAssembly target: the module is a .wasm for a JS runtime (docs/web.md), single-threaded."""
        return self.arch == "wasm32"

    @property
    def library_suffix(self) -> str:
        """The file name ending of an exported library: ".wasm" for wasm32, ".so" elsewhere."""
        return ".wasm" if self.is_wasm else ".so"

    @property
    def feature_set(self) -> frozenset:
        return frozenset(f.strip() for f in self.features.split(",") if f.strip())

    @property
    def feature_list(self) -> Tuple[str, ...]:
        """The -mattr features in the order given (LLVM applies them in order: "+avx2,-avx2" is off)."""
        return tuple(f.strip() for f in self.features.split(",") if f.strip())

    @property
    def llvm_features(self) -> str:
        """The -mattr string LLVM gets: the target's features, after the always-on ones on wasm32."""
        if self.is_wasm:
            return ",".join(WASM_BASE_FEATURES + self.feature_list)
        return self.features

    def has_feature(self, name: str) -> bool:
        """Whether code for this target may use LLVM feature ``name``: given by -mattr, or on x86 also implied by
        the -mcpu (``-mcpu=icelake-server`` has avx512vnni) and not turned off (x86_features)."""
        if self.arch == "x86_64":
            return name in x86_features(self.cpu, self.feature_list)
        return ("+" + name) in self.feature_set

    @property
    def abi(self) -> str:
        """The environment part of the triple: gnu, gnueabihf, android24 ..."""
        parts = self.triple.split("-")
        return parts[3] if len(parts) > 3 else ""

    @property
    def float_abi(self) -> str:
        """"hard" or "soft" for armv7 (from the triple's environment); "native" elsewhere."""
        if self.arch != "armv7":
            return "native"
        return "hard" if self.abi.endswith("hf") else "soft"

    @property
    def is_android(self) -> bool:
        return "android" in self.abi

    @property
    def vector_bits(self) -> int:
        """Width of the widest float SIMD register the target is sure to have."""
        if self.arch == "x86_64":   # (what -mattr gives or the -mcpu implies: has_feature)
            if self.has_feature("avx512f"):
                return 512
            if self.has_feature("avx") or self.has_feature("avx2"):
                return 256
            return 128
        if self.arch == "armv7":
            return 128 if "-neon" not in self.feature_set else 64
        if self.arch == "wasm32":   # v128 with simd128; without it, 64 as armv7 without NEON (LLVM scalarizes)
            return 128 if self.has_feature("simd128") else 64
        return 128

    def vector_lanes(self, dtype_bits: int = 32) -> int:
        return max(1, self.vector_bits // dtype_bits)

    @property
    def native_rounding(self) -> bool:
        """Whether llvm.floor/ceil lower to an instruction (not a libm call) for float vectors and scalars."""
        if self.arch in ("aarch64", "wasm32"):   # (wasm: f32.floor/f32x4.floor...)
            return True
        if self.arch == "x86_64":
            return self.has_feature("sse4.1")
        return False  # armv7: VFPv4/NEON have no vrint (that is ARMv8), so LLVM would call floorf

    @property
    def link_flags(self) -> Tuple[str, ...]:
        if self.is_wasm:
            return WASM_LINK_FLAGS
        flags = ["-shared", "--no-undefined", "--hash-style=both", "-z", "noexecstack", "-z", "relro", "-z", "now",
                 "--build-id=sha1", "--gc-sections"]
        if self.arch == "aarch64":
            # 16 KiB page-size devices (Android 15+, Pi 5 kernels) need segments aligned to at least that.
            flags += ["-z", "max-page-size=65536"]
        return tuple(flags)

    def requirements(self) -> Dict[str, Any]:
        """What this target's code needs from the device's CPU: ``{"isa", "features"}`` (module metadata
        "requires"; the device runtime refuses a module whose needs its CPU does not meet)."""
        return cpu_requirements(self.arch, self.triple, self.cpu, self.feature_list)

    @property
    def available_features(self) -> frozenset:
        """The CPU features code for this target may use: the hwcap names its CPU guarantees (``requirements``)
        and the LLVM features switched on in its spec (``+name``)."""
        return frozenset(self.requirements()["features"]) | {f[1:] for f in self.feature_set if f.startswith("+")}

    # ---- llvmlite -----------------------------------------------------------------------------------------
    def target_machine(self, opt: int = 3) -> Any:
        """An llvmlite TargetMachine for this target (PIC, because every output is a shared object; static code on
        wasm32, where PIC means imports of __memory_base and a GOT from the embedder); cached."""
        return _target_machine(self.triple, self.cpu, self.llvm_features, int(opt))

    @property
    def data_layout(self) -> str:
        return str(self.target_machine().target_data)

    # ---- description -------------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """The "target" block of module metadata (abi.md)."""
        return {"triple": self.triple, "cpu": self.cpu, "features": self.features, "arch": self.arch,
                "preset": self.preset}

    def __str__(self) -> str:
        if self.gpu is not None:
            return _gpu_string(self)
        s = self.triple
        if self.cpu and self.cpu != "generic":
            s += " -mcpu=" + self.cpu
        if self.features:
            s += " -mattr=" + self.features
        return s

    def __repr__(self) -> str:
        return "Target(%r%s)" % (str(self), ", preset=%r" % self.preset if self.preset else "")

    # ---- constructors ------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Target":
        """Inverse of to_dict() (e.g. the "target" block of a module's metadata)."""
        return cls(d["triple"], cpu=d.get("cpu") or "generic", features=d.get("features") or "",
                   preset=d.get("preset"))

    @classmethod
    def from_device_info(cls, info: Mapping[str, Any]) -> "Target":
        """The best Target for a device, from tether_rpc.device_info.device_info() output.

        Uses the device's suggested preset when it is one of ours; otherwise the architecture plus the fastest
        CPU core the device reports ("cpu_cores", LLVM names such as "cortex-a55")."""
        suggested = info.get("suggested_target")
        if isinstance(suggested, str) and suggested in _PRESETS:
            return cls(suggested)
        arch = str(info.get("arch") or info.get("machine") or suggested or "").lower()
        cores = [str(c) for c in (info.get("cpu_cores") or []) if str(c).startswith(("cortex-", "neoverse-"))]
        cpu = max(cores, key=_core_rank) if cores else None
        os_info = info.get("os") if isinstance(info.get("os"), Mapping) else {}
        android = bool(os_info.get("android") or info.get("android"))
        if arch in ("aarch64", "arm64", "armv8"):
            triple = "aarch64-unknown-linux-android24" if android else "aarch64-unknown-linux-gnu"
            return cls(triple, cpu=cpu or "generic", features="+neon")
        if arch.startswith(("armv7", "armv8l", "armhf", "arm")):
            return cls("armv7a-unknown-linux-gnueabihf", cpu=cpu or "generic", features="+neon" if not cpu else
                       "+neon,+vfp4")
        if arch in ("x86_64", "amd64"):
            return cls("x86_64")
        if arch == "wasm32":   # a JS device server (docs/web.md)
            return cls("wasm32")
        raise UnknownTargetError("cannot derive a target from device_info arch=%r; pass a preset explicitly (%s)"
                                 % (arch, ", ".join(PRESET_NAMES)))


def _core_rank(core: str) -> Tuple[int, str]:
    """Bigger Cortex numbers are (roughly) the big cores of a big.LITTLE system."""
    digits = "".join(ch for ch in core if ch.isdigit())
    return (int(digits) if digits else 0, core)


def _parse_spec(spec: Union[str, Target]) -> Tuple[str, str, str, Optional[str], Optional[GpuTarget]]:
    if isinstance(spec, Target):
        return spec.triple, spec.cpu, spec.features, spec.preset, spec.gpu
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownTargetError("a target is a preset name or a triple string, got %r; presets: %s"
                                 % (spec, ", ".join(PRESET_NAMES)))
    text = spec.strip()
    if is_gpu_spec(text):
        gpu, host = parse_gpu(text)
        return _parse_host(host or "host", text) + (gpu,)
    return _parse_cpu_spec(text) + (None,)


def _parse_host(host: Union[str, Target], spec: str) -> Tuple[str, str, str, Optional[str]]:
    """The CPU target of a GPU target's host."""
    if isinstance(host, Target):
        if host.gpu is not None:
            raise UnknownTargetError("the host of GPU target %r must be a CPU target, not %s" % (spec, host))
        return host.triple, host.cpu, host.features, host.preset
    if is_gpu_spec(host):
        raise UnknownTargetError("the host of GPU target %r must be a CPU target, not %r" % (spec, host))
    return _parse_cpu_spec(str(host).strip())


def _gpu_string(t: Target) -> str:
    """A GPU target's string: its GPU half (or GPU preset), then -host= unless the host is the default one."""
    assert t.gpu is not None
    if t.gpu.preset is not None:
        default_host: str = gpu_presets()[t.gpu.preset]["host"]
        head = t.gpu.preset
    else:
        default_host, head = "host", t.gpu.spec()
    host = t.preset if t.preset and Target(t.preset) == t.host else str(t.host)
    if host == default_host or (default_host != "host" and Target(default_host) == t.host):
        return head
    return "%s -host=%s" % (head, shlex.quote(host))


def _parse_cpu_spec(text: str) -> Tuple[str, str, str, Optional[str]]:
    if text == "host":
        triple, cpu, features = _host_cpu()
        return _normalize_triple(triple), cpu, features, "host"
    if text in _PRESETS:
        p = _PRESETS[text]
        return p.triple, p.cpu, p.features, text
    tokens = shlex.split(text)
    triple, cpu, features = tokens[0], "generic", ""
    if "-" not in triple:
        raise UnknownTargetError("unknown target preset %r; presets: %s (or a triple such as "
                                 "\"aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon\"; GPUs: opencl, vulkan, "
                                 "cuda -arch=sm_XX, %s)" % (text, ", ".join(PRESET_NAMES),
                                                            ", ".join(GPU_PRESET_NAMES)))
    for tok in tokens[1:]:
        if tok.startswith("-mcpu="):
            cpu = tok[len("-mcpu="):]
        elif tok.startswith("-mattr="):
            features = tok[len("-mattr="):]
        else:
            raise UnknownTargetError("unknown option %r in target %r (use -mcpu=NAME and -mattr=+f1,+f2)"
                                     % (tok, text))
    if triple.startswith("wasm32") and not any(tok.startswith("-mcpu=") for tok in tokens[1:]):
        cpu = WASM_CPU   # (see WASM_CPU)
    return _normalize_triple(triple), cpu, features, None


def presets() -> Dict[str, Dict[str, str]]:
    """Preset table for `tether targets`: name -> triple, cpu, features, description ("host" is detected)."""
    table = {"host": {"triple": "(detected)", "cpu": "(detected)", "features": "(detected)",
                      "description": "this machine's CPU and all of its features"}}
    for name, p in _PRESETS.items():
        table[name] = {"triple": p.triple, "cpu": p.cpu, "features": p.features, "description": p.description}
    return table


_LLVM_READY = False


_TM_CACHE = threading.local()  # LLVM target machines are not meant to be shared across threads


def _target_machine(triple: str, cpu: str, features: str, opt: int) -> Any:
    cache = getattr(_TM_CACHE, "machines", None)
    if cache is None:
        cache = _TM_CACHE.machines = {}
    key = (triple, cpu, features, opt)
    if key not in cache:
        cache[key] = _create_target_machine(*key)
    return cache[key]


def _create_target_machine(triple: str, cpu: str, features: str, opt: int) -> Any:
    import llvmlite.binding as llvm

    _init_llvm()
    try:
        llvm_target = llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise UnknownTargetError("LLVM has no backend for %r: %s" % (triple, exc)) from None
    reloc = "static" if _arch_of_triple(triple) == "wasm32" else "pic"
    return llvm_target.create_target_machine(cpu=cpu, features=features, opt=opt, reloc=reloc, codemodel="default")


def _init_llvm() -> None:
    global _LLVM_READY
    if _LLVM_READY:
        return
    import llvmlite.binding as llvm

    # llvmlite >= 0.45 initialises the native target itself; the cross targets still need registering.
    for fn in ("initialize_all_targets", "initialize_all_asmprinters"):
        if hasattr(llvm, fn):
            try:
                getattr(llvm, fn)()
            except RuntimeError:
                pass
    _LLVM_READY = True


def as_target(target: Union[str, Target, None]) -> Target:
    return target if isinstance(target, Target) else Target(target or "host")


# ---- half-precision arithmetic ------------------------------------------------------------------------------
#: ``precision=`` of a graph build: what its float32 math is computed in (graph/passes/half_precision.py)
PRECISIONS = ("fp32", "fp16")


def has_half_arithmetic(target: Union[str, "Target", None]) -> bool:
    """Whether code for ``target`` computes float16 as half (LLVM ``half``, fmla .8h) rather than as float32:
    aarch64 with +fullfp16 given explicitly (the -fp16 presets). Not implied by an Armv8.2 -mcpu, so that a
    float16 model built for rasp5 keeps its float32 arithmetic; not on x86 (F16C converts, it does not compute)."""
    t = as_target(target)
    return t.gpu is None and t.arch == "aarch64" and t.has_feature("fullfp16")


def check_precision(target: Union[str, "Target", None], precision: str) -> None:
    """ValueError (one line) for a ``precision`` that is not one of PRECISIONS or that ``target`` cannot run."""
    if precision not in PRECISIONS:
        raise ValueError("precision must be one of %s, got %r" % (", ".join(PRECISIONS), precision))
    if precision == "fp16" and not has_half_arithmetic(target):
        t = as_target(target)
        raise ValueError("--precision fp16 needs half-precision arithmetic (aarch64 +fullfp16), which target %s "
                         "lacks; use rasp5-fp16, android-arm64-fp16 or -mattr=+neon,+fullfp16"
                         % (t.preset or str(t)))


#: the presets whose -fp16 twin is the same board with half arithmetic turned on
_HALF_PRESETS = {"rasp5": "rasp5-fp16", "android-arm64": "android-arm64-fp16"}


def for_precision(target: Union[str, "Target", None], precision: str,
                  device_features: Optional[Sequence[str]] = None) -> "Target":
    """The target a ``precision`` build for a device compiles for: ``target`` itself for fp32 or where it has half
    arithmetic already; for fp16, an aarch64 target turned into its -fp16 preset (or given +fullfp16) when the
    device reports ``fphp`` and ``asimdhp`` among ``device_features`` (hwcap names). ValueError (one line)
    otherwise, naming what is missing."""
    t = as_target(target)
    if precision not in PRECISIONS:
        raise ValueError("precision must be one of %s, got %r" % (", ".join(PRECISIONS), precision))
    if precision == "fp32" or has_half_arithmetic(t):
        return t
    label = t.preset or str(t)
    if t.gpu is not None or t.arch != "aarch64":
        raise ValueError("--precision fp16 needs half-precision arithmetic (aarch64 +fullfp16), which this device's "
                         "target %s has not" % label)
    have = set(device_features or ())
    missing = [f for f in ("fphp", "asimdhp") if f not in have]
    if missing:
        raise ValueError("--precision fp16 needs half-precision arithmetic, and this device (target %s) does not "
                         "report %s" % (label, " or ".join(missing)))
    if t.preset in _HALF_PRESETS:
        return Target(_HALF_PRESETS[t.preset])
    return Target(t.triple, cpu=t.cpu, features=",".join(f for f in (t.features, "+fullfp16") if f))


# ---- int8 instructions ---------------------------------------------------------------------------
# What an int8 dot product may be built from on a target: the widest integer multiply-accumulate its features
# allow, best first. A preset that covers CPUs with and without an extension (android-arm64: phones with and
# without the Armv8.2 dot product) lists the extension's instructions as chosen at load time, from what the
# device reports (tether_rpc.cpu_features), never assumed at build time.
_INT8_LOAD_TIME: Dict[str, Tuple[str, ...]] = {"android-arm64": ("asimddp",)}
_INT8_BY_FEATURE = (   # (architecture, hwcap/flag name, instructions): what codegen/int8dot.py emits for dot4
    ("x86_64", "avx512_vnni", "vpdpbusd (AVX512-VNNI)"),
    ("x86_64", "avx_vnni", "vpdpbusd (AVX-VNNI)"),
    ("x86_64", "avx512bw", "vpmaddwd (AVX512BW)"),
    ("x86_64", "avx2", "vpmaddwd (AVX2)"),
    ("aarch64", "asimddp", "sdot/udot (dotprod)"),
    ("aarch64", "asimd", "smull/umull+saddlp/uaddlp (NEON)"),
    ("armv7", "neon", "vmull+vpaddl (NEON)"),
    ("wasm32", "simd128", "i16x8.extend+i32x4.dot_i16x8_s (SIMD128)"),
)
_INT8_NEON_BESIDE_DOT = "ushll/sshll+mul+saddlp (NEON, u8 x s8)"
_INT8_NEON_WIDENED = "smlal by element (NEON; dot4: smull/umull+saddlp/uaddlp)"   # int8_widened targets
_INT8_BASELINE = {"x86_64": "pmaddwd (SSE2)", "aarch64": "mul/add (scalar)", "armv7": "mul/add (scalar)",
                  "wasm32": "mul/add (scalar)"}


def int8_instructions(target: Union[str, "Target", None]) -> list:
    """``[(instructions, when)]`` an int8 kernel may use on ``target``, best first; ``when`` is "always" or
    "if the device reports FEATURE" (a load-time choice)."""
    t = as_target(target)
    have = set(t.requirements()["features"])
    optional = set(_INT8_LOAD_TIME.get(t.preset or "", ()))
    out = []
    for arch, flag, insns in _INT8_BY_FEATURE:
        if arch != t.arch:
            continue
        if flag == "avx_vnni" and {"avx512_vnni", "avx512vl"} <= have:
            continue   # AVX512-VNNI with AVX512VL gives the narrow widths too (EVEX-encoded)
        if flag == "asimd" and "asimddp" in have:
            insns = _INT8_NEON_BESIDE_DOT   # s8s8/u8u8 take sdot/udot: only u8s8 widens
        elif flag == "asimd" and int8_widened(t):
            insns = _INT8_NEON_WIDENED
        if flag in have:
            out.append((insns, "always"))
        elif flag in optional:
            out.append((insns, "if the device reports %s" % flag))
    out.append((_INT8_BASELINE[t.arch], "always"))
    return out


# ---- int8 dot4 (tether.te.dot4) computed natively -----------------------------------------------------------
# Which dot4 kinds one instruction computes for a whole lane group on this target (codegen/int8dot.py emits it
# for ``acc + dot4(a, b)`` in vectorized loops). Kernel writers pick their kind from this: on Arm, u8 activations
# xor 0x80 become s8 and the +128*sum(w) correction folds into the bias.
def int8_dot_native(target: Union[str, "Target", None]) -> Tuple[str, ...]:
    """``("u8s8",)`` on x86 with AVX512-VNNI or AVX-VNNI (vpdpbusd), ``("s8s8", "u8u8")`` on aarch64 with the
    dot product (sdot/udot), ``()`` elsewhere."""
    t = as_target(target)
    if t.arch == "x86_64":
        return ("u8s8",) if t.has_feature("avx512vnni") or t.has_feature("avxvnni") else ()
    if t.arch == "aarch64" and "asimddp" in t.requirements()["features"]:
        return ("s8s8", "u8u8")
    return ()


def int8_widened(target: Union[str, "Target", None]) -> bool:
    """Whether int8 convs multiply widened 16-bit operands (ops/qconv.py's widened form: smlal by element) on
    ``target``: aarch64 NEON without a dot product, none chosen at load time either. armv7 keeps dot4's widening
    sequence: with 16 q registers its 16-lane panel leaves room for too few pixels, and LLVM emitted vmla.i32 on
    widened copies there, not vmlal by scalar."""
    t = as_target(target)
    return (t.arch == "aarch64" and "asimd" in t.available_features and not int8_dot_native(t)
            and not int8_load_time_features(t))


def int8_load_time_features(target: Union[str, "Target", None]) -> Tuple[str, ...]:
    """The hwcap names whose int8 instructions a build for ``target`` uses only where the device reports them
    (chosen at load time: android-arm64 -> ("asimddp",)); none the target's own features already guarantee."""
    t = as_target(target)
    have = set(t.requirements()["features"])
    return tuple(f for f in _INT8_LOAD_TIME.get(t.preset or "", ()) if f not in have)
