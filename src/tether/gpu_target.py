"""The GPU part of a target: which API runs the kernels (OpenCL, Vulkan, CUDA), on which family of device, and
the limits the build checks a kernel's launch against.

    Target("opencl")                          # any OpenCL 1.2 device, host code for this machine
    Target("opencl -device=mali", host="android-arm64")
    Target("cuda -arch=sm_87 -host=jetson-nano")
    Target("rasp5-vulkan")                    # a preset: VideoCore VII through Vulkan 1.2, host rasp5

A GPU target is a ``tether.target.Target`` whose ``gpu`` is a :class:`GpuTarget`: its triple, CPU and
features are the host's (the CPU that runs the module's shared library and launches the kernels), so everything
that builds and links host code works on it unchanged. This module knows only the GPU half and the GPU presets;
``tether.target`` joins the halves. A target string is the API, then options:

    opencl|vulkan|cuda [-device=NAME] [-arch=sm_XX] [-vulkan=1.X] [-max_threads_per_block=N]
                       [-max_shared_bytes=N] [-subgroup_size=N] [-fp16=0|1] [-host=CPU TARGET]

The limits default per device family (``DEVICE_LIMITS``): what every device of the family has, so a build that
passes the check runs on any of them; a device with more is still checked at load against what it reports.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any, Dict, List, Mapping, Optional, Tuple

from tether.errors import InvalidInput


class UnknownTargetError(InvalidInput):
    """A preset name or target string tether cannot interpret (re-exported by tether.target)."""


#: the GPU APIs a target may name, each with the code format its kernels are compiled to
GPU_APIS = ("opencl", "vulkan", "cuda")


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """What one work-group (CUDA block) may use on every device of a family."""

    max_threads_per_block: int
    max_shared_bytes: int
    subgroup_size: int     # threads that run in lockstep (warp, wavefront, subgroup); 0: varies within the family
    fp16: bool             # half-precision arithmetic in kernels (cl_khr_fp16, shaderFloat16, sm_53+)


# ---- per-device limits -----------------------------------------------------------------------------------
# Sources (the published limits of each family; a device reporting more is not held to these at load):
# - OpenCL, any device: the OpenCL 1.2 full profile guarantees CL_DEVICE_LOCAL_MEM_SIZE >= 32 KiB but only 1 for
#   CL_DEVICE_MAX_WORK_GROUP_SIZE; 256 is what every family below (and pocl, AMD, NVIDIA) reaches. fp16 is the
#   optional cl_khr_fp16 extension, so off.
# - Mali: the Arm Mali Midgard OpenCL Developer Guide gives a maximum work-group size of 256 (later families report
#   more); local memory is ordinary cached global memory, reported as 32 KiB. cl_khr_fp16 on every Mali with
#   OpenCL. Subgroup (warp) width differs between generations (4 on Bifrost, 16 on Valhall): 0.
# - Adreno: Qualcomm's Snapdragon OpenCL General Programming and Optimization guide (80-NB295-11) reports
#   CL_DEVICE_MAX_WORK_GROUP_SIZE 1024 and 32 KiB local memory on Adreno 5xx/6xx (a kernel using many registers
#   may get less: CL_KERNEL_WORK_GROUP_SIZE, checked by the driver at launch); cl_khr_fp16; waves of 64 or 128.
# - "mobile": what Mali and Adreno both have (android-arm64-opencl: one build for either).
# - Intel (Gen9 and later integrated GPUs): 256 work-items per work-group, 64 KiB shared local memory per
#   sub-slice, cl_khr_fp16; SIMD-8/16/32 subgroups (the compiler picks): 0.
# - Vulkan, any device: the Vulkan 1.1 specification's required minimums, maxComputeWorkGroupInvocations 128 and
#   maxComputeSharedMemorySize 16384; shaderFloat16 is optional.
# - VideoCore VII (Raspberry Pi 5, Mesa v3dv): maxComputeWorkGroupInvocations 256, maxComputeSharedMemorySize
#   16384, 16-wide QPU subgroups (Mesa's V3D_CHANNELS), no shaderFloat16.
# - CUDA, every sm_50+ GPU: 1024 threads per block, 48 KiB of static shared memory per block, 32-thread warps;
#   half arithmetic from sm_53 (CUDA C Programming Guide, "Compute Capabilities" tables).
DEVICE_LIMITS: Dict[Tuple[str, str], DeviceLimits] = {
    ("opencl", "generic"): DeviceLimits(256, 32768, 0, False),
    ("opencl", "mali"): DeviceLimits(256, 32768, 0, True),
    ("opencl", "adreno"): DeviceLimits(1024, 32768, 0, True),
    ("opencl", "mobile"): DeviceLimits(256, 32768, 0, True),
    ("opencl", "intel"): DeviceLimits(256, 65536, 0, True),
    ("vulkan", "generic"): DeviceLimits(128, 16384, 0, False),
    ("vulkan", "videocore7"): DeviceLimits(256, 16384, 16, False),
    ("cuda", "generic"): DeviceLimits(1024, 49152, 32, True),
}
DEVICE_NAMES: Dict[str, Tuple[str, ...]] = {api: tuple(d for a, d in DEVICE_LIMITS if a == api) for api in GPU_APIS}
DEVICE_DESCRIPTIONS = {"generic": "any device of the API", "mali": "Arm Mali (Midgard, Bifrost, Valhall)",
                       "adreno": "Qualcomm Adreno 5xx and later", "mobile": "Mali or Adreno (phones)",
                       "intel": "Intel integrated GPUs (Gen9 and later)",
                       "videocore7": "Broadcom VideoCore VII (Raspberry Pi 5)"}

CUDA_MIN_SM = 50
CUDA_DEFAULT_ARCH = "sm_50"   # PTX for sm_50 is JIT-compiled by the driver for every newer GPU
CUDA_FP16_MIN_SM = 53
VULKAN_VERSIONS = ("1.1", "1.2", "1.3")
VULKAN_DEFAULT_VERSION = "1.1"
_ARCH = re.compile(r"^sm_(\d{2,3})[a-z]?$")
_LIMIT_OPTIONS = ("max_threads_per_block", "max_shared_bytes", "subgroup_size")


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """The GPU half of a target: ``api`` ("opencl", "vulkan", "cuda"), ``device`` (family, "generic" if any),
    ``arch`` (CUDA's "sm_80"; "" elsewhere), ``version`` (the Vulkan version the SPIR-V targets; "" elsewhere)
    and the launch limits the build verifies. ``preset`` names the GPU preset it came from, if any."""

    api: str
    device: str = "generic"
    arch: str = ""
    version: str = ""
    max_threads_per_block: int = 256
    max_shared_bytes: int = 32768
    subgroup_size: int = 0
    fp16: bool = False
    preset: Optional[str] = dataclasses.field(default=None, compare=False)

    @property
    def sm(self) -> int:
        """The CUDA compute capability as a number (sm_87 -> 87); 0 for other APIs."""
        m = _ARCH.match(self.arch)
        return int(m.group(1)) if m else 0

    @property
    def code_format(self) -> str:
        """What the kernels are compiled to: "opencl-c", "spirv" or "ptx" (module metadata "device")."""
        return CODE_FORMATS[self.api]

    def limits(self) -> Dict[str, Any]:
        """The limits a kernel's launch is verified against at build time (and recorded in the metadata)."""
        return {"max_threads_per_block": self.max_threads_per_block, "max_shared_bytes": self.max_shared_bytes,
                "subgroup_size": self.subgroup_size, "fp16": self.fp16}

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"api": self.api, "device": self.device}
        if self.arch:
            d["arch"] = self.arch
        if self.version:
            d["version"] = self.version
        d.update(self.limits())
        return d

    def spec(self) -> str:
        """The target string of the GPU half (without -host): the API and every option that differs from the
        defaults of its device."""
        words = [self.api]
        if self.device != "generic":
            words.append("-device=" + self.device)
        if self.arch:
            words.append("-arch=" + self.arch)
        if self.version and self.version != VULKAN_DEFAULT_VERSION:
            words.append("-vulkan=" + self.version)
        base = _defaults(self.api, self.device, self.arch)
        for name in _LIMIT_OPTIONS:
            if getattr(self, name) != getattr(base, name):
                words.append("-%s=%d" % (name, getattr(self, name)))
        if self.fp16 != base.fp16:
            words.append("-fp16=%d" % int(self.fp16))
        return " ".join(words)

    def __str__(self) -> str:
        return self.spec()


CODE_FORMATS = {"opencl": "opencl-c", "vulkan": "spirv", "cuda": "ptx"}


def _defaults(api: str, device: str, arch: str) -> DeviceLimits:
    base = DEVICE_LIMITS[(api, device)]
    if api == "cuda":
        sm = int(_ARCH.match(arch).group(1)) if _ARCH.match(arch) else CUDA_MIN_SM
        base = dataclasses.replace(base, fp16=sm >= CUDA_FP16_MIN_SM)
    return base


# ---- presets -------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _GpuPreset:
    gpu: str           # the GPU half's target string
    host: str          # the host's CPU target (a preset name or a triple string)
    description: str


_GPU_PRESETS: Dict[str, _GpuPreset] = {
    "rasp5-vulkan": _GpuPreset("vulkan -device=videocore7 -vulkan=1.2", "rasp5",
                               "Raspberry Pi 5: VideoCore VII through Vulkan 1.2 (Mesa v3dv)"),
    "android-arm64-opencl": _GpuPreset("opencl -device=mobile", "android-arm64",
                                       "Android phones' Mali or Adreno GPU through OpenCL"),
    "jetson-orin-cuda": _GpuPreset("cuda -arch=sm_87", "aarch64-unknown-linux-gnu -mcpu=cortex-a78ae -mattr=+neon",
                                   "NVIDIA Jetson Orin (Ampere GPU, sm_87), Cortex-A78AE host"),
    "jetson-nano-cuda": _GpuPreset("cuda -arch=sm_53", "jetson-nano",
                                   "NVIDIA Jetson Nano (Maxwell GPU, sm_53), Cortex-A57 host"),
}
GPU_PRESET_NAMES: Tuple[str, ...] = tuple(_GPU_PRESETS)
GPU_SYNTAX = ("opencl|vulkan|cuda [-device=NAME] [-arch=sm_XX] [-vulkan=1.X] [-max_threads_per_block=N] "
              "[-max_shared_bytes=N] [-subgroup_size=N] [-fp16=0|1] [-host=CPU TARGET]")


def gpu_presets() -> Dict[str, Dict[str, str]]:
    """GPU preset table for `tether targets`: name -> gpu (its target string), host, description."""
    return {name: {"gpu": p.gpu, "host": p.host, "description": p.description} for name, p in _GPU_PRESETS.items()}


def is_gpu_spec(spec: Any) -> bool:
    """Whether a target string names a GPU target (its first word is a GPU API or a GPU preset); cheap, parses
    nothing else."""
    if not isinstance(spec, str):
        return False
    head = spec.strip().split(None, 1)[0] if spec.strip() else ""
    return head in GPU_APIS or head in _GPU_PRESETS


def parse_gpu(text: str) -> Tuple[GpuTarget, Optional[str]]:
    """Parse a GPU target string: (the GPU half, the host's target string or None for the default). Bad input
    raises UnknownTargetError in one line naming the word and what was expected."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise UnknownTargetError("target %r: %s" % (text, exc)) from None
    head, options = tokens[0], tokens[1:]
    user_keys = {tok.partition("=")[0].lstrip("-") for tok in options}
    preset: Optional[str] = None
    host: Optional[str] = None
    if head in _GPU_PRESETS:
        p = _GPU_PRESETS[head]
        preset, host = head, p.host
        preset_tokens = shlex.split(p.gpu)
        head, options = preset_tokens[0], preset_tokens[1:] + options
    if head not in GPU_APIS:
        raise UnknownTargetError("unknown GPU API %r in target %r; expected one of %s" % (head, text,
                                                                                        ", ".join(GPU_APIS)))
    api = head
    values: Dict[str, str] = {}
    for tok in options:
        name, eq, value = tok.partition("=")
        key = name[1:] if name.startswith("-") else ""
        if not eq or key not in ("device", "arch", "vulkan", "host", "fp16") + _LIMIT_OPTIONS:
            raise UnknownTargetError("unknown option %r in GPU target %r; expected %s" % (tok, text, GPU_SYNTAX))
        values[key] = value
    if "host" in values:
        host = values["host"]
        if not host.strip():
            raise UnknownTargetError("empty -host= in target %r; expected a CPU target such as rasp4b" % text)
    device = values.get("device", "generic")
    if device not in DEVICE_NAMES[api]:
        raise UnknownTargetError("unknown %s device %r in target %r; expected one of %s"
                                 % (api, device, text, ", ".join(DEVICE_NAMES[api])))
    arch = ""
    if api == "cuda":
        arch = values.get("arch", CUDA_DEFAULT_ARCH)
        m = _ARCH.match(arch)
        if not m or int(m.group(1)) < CUDA_MIN_SM:
            raise UnknownTargetError("bad -arch=%s in target %r; expected sm_XX with XX >= %d (sm_53, sm_80, "
                                     "sm_87...)" % (arch, text, CUDA_MIN_SM))
    elif "arch" in values:
        raise UnknownTargetError("-arch is for cuda targets, not %s (target %r)" % (api, text))
    version = ""
    if api == "vulkan":
        version = values.get("vulkan", VULKAN_DEFAULT_VERSION)
        if version not in VULKAN_VERSIONS:
            raise UnknownTargetError("bad -vulkan=%s in target %r; expected one of %s"
                                     % (version, text, ", ".join(VULKAN_VERSIONS)))
    elif "vulkan" in values:
        raise UnknownTargetError("-vulkan is for vulkan targets, not %s (target %r)" % (api, text))
    base = _defaults(api, device, arch)
    limits: Dict[str, Any] = {}
    for name in _LIMIT_OPTIONS:
        raw = values.get(name)
        if raw is None:
            limits[name] = getattr(base, name)
            continue
        if not raw.isdigit() or (int(raw) == 0 and name != "subgroup_size"):
            raise UnknownTargetError("bad -%s=%s in target %r; expected a positive integer" % (name, raw, text))
        limits[name] = int(raw)
    fp16 = base.fp16
    if "fp16" in values:
        if values["fp16"] not in ("0", "1"):
            raise UnknownTargetError("bad -fp16=%s in target %r; expected 0 or 1" % (values["fp16"], text))
        fp16 = values["fp16"] == "1"
    if fp16 and api == "cuda" and int(_ARCH.match(arch).group(1)) < CUDA_FP16_MIN_SM:
        raise UnknownTargetError("-fp16=1 in target %r: %s has no half arithmetic (sm_%d and later have)"
                                 % (text, arch, CUDA_FP16_MIN_SM))
    gpu = GpuTarget(api, device, arch, version, limits["max_threads_per_block"], limits["max_shared_bytes"],
                    limits["subgroup_size"], fp16, preset)
    if preset is not None and (user_keys - {"host"}):
        gpu = dataclasses.replace(gpu, preset=None)   # the preset's GPU was changed: print it spelled out
    return gpu, host


def gpu_from_dict(d: Mapping[str, Any]) -> GpuTarget:
    """Inverse of GpuTarget.to_dict()."""
    return GpuTarget(str(d["api"]), str(d.get("device") or "generic"), str(d.get("arch") or ""),
                     str(d.get("version") or ""), int(d["max_threads_per_block"]), int(d["max_shared_bytes"]),
                     int(d.get("subgroup_size") or 0), bool(d.get("fp16")))


def describe_devices() -> List[Tuple[str, str, str]]:
    """(api, device, limits in words) for every known device family (`tether targets`)."""
    rows = []
    for (api, device), lim in DEVICE_LIMITS.items():
        words = "%d threads/block, %d KiB shared, %s" % (lim.max_threads_per_block, lim.max_shared_bytes // 1024,
                                                        "fp16" if lim.fp16 else "no fp16")
        if api == "cuda":
            words = "%d threads/block, %d KiB shared, fp16 from sm_%d" % (
                lim.max_threads_per_block, lim.max_shared_bytes // 1024, CUDA_FP16_MIN_SM)
        rows.append((api, device, "%s: %s" % (DEVICE_DESCRIPTIONS[device], words)))
    return rows
