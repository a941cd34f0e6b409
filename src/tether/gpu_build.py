"""Building for a GPU target: lower, split each function into device kernels, emit their code through the
backends table, and link the host's shared library carrying the code and the metadata to launch it.

    lib = tether.build(s, [A, B, C], target="opencl", name="vadd")     # driver.build calls build_gpu
    lib.export_library("vadd.so")      # the host CPU's library: metadata "device" + __tether_device_code

The result is an ordinary tether module for the host CPU (docs/abi.md): the device runtime reads the code and the
launch sequences from the file, loads the code on the device (``DeviceAPI.load``) and runs each function as its
kernels in order. The host library has no CPU functions of its own yet: a function's work is all on the device.
"""
from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Sequence

from tether.artifact import Module
from tether.codegen.emit import compile_module
from tether.codegen.gpu_backends import backend
from tether.codegen.module import ModuleBuilder
from tether.codegen.runtime import DEVICE_CODE_SYMBOL, EXPORTED_RUNTIME_SYMBOLS, MEMORY_FUNCTIONS
from tether.errors import CompileError
from tether.target import Target
from tether.tir.device_split import DeviceProgram, split_host_device
from tether.tir.stmt import Store
from tether.tir.visit import walk

# metadata "device" "version": the layout of the entry (docs/abi.md "GPU modules")
DEVICE_META_VERSION = 1


class GpuModule(Module):
    """A module built for a GPU target: its functions run on the device (metadata "device")."""

    def __init__(self, name: str, target: Target, ir_text: str, compiled: Any, metadata: Dict[str, Any],
                 device_code: bytes) -> None:
        super().__init__(name, target, ir_text, compiled, metadata)
        self._device_code = bytes(device_code)

    @property
    def device(self) -> Dict[str, Any]:
        return self.metadata["device"]

    @property
    def function_names(self) -> List[str]:
        return [f["name"] for f in self.metadata["functions"]] + [f["name"] for f in self.device["functions"]]

    @property
    def device_code(self) -> bytes:
        return self._device_code

    @property
    def defined_symbols(self) -> List[str]:
        return ([f["name"] for f in self.metadata["functions"]] + list(EXPORTED_RUNTIME_SYMBOLS)
                + list(MEMORY_FUNCTIONS) + [DEVICE_CODE_SYMBOL])

    def get_source(self, fmt: str = "ll") -> str:
        """Also "device": the device code as text (OpenCL C, PTX; SPIR-V as hex words)."""
        if fmt == "device":
            if self.device["format"] == "spirv":
                code = self._device_code
                return "\n".join(code[i:i + 4][::-1].hex() for i in range(0, len(code), 4))
            return self._device_code.decode("utf-8")
        return super().get_source(fmt)

    def __repr__(self) -> str:
        return "<tether.GpuModule %r for %s: %s>" % (self.name, self.device["target"], ", ".join(self.function_names))


def split_functions(funcs: Sequence[Any], target: Target) -> List[DeviceProgram]:
    """Each lowered PrimFunc as its device kernels, verified against the target's launch limits."""
    gpu = target.gpu
    if gpu is None:
        raise CompileError("split_functions: %s is not a GPU target" % target)
    return [split_host_device(pf, max_threads_per_block=gpu.max_threads_per_block,
                              max_shared_bytes=gpu.max_shared_bytes) for pf in funcs]


def build_gpu(funcs: Sequence[Any], target: Target, name: str = "default", opt: int = 3) -> GpuModule:
    """Lowered PrimFuncs (their loops bound to GPU threads) -> a GPU module for ``target``."""
    return build_programs(split_functions(funcs, target), target, name, opt=opt)


def build_programs(programs: Sequence[DeviceProgram], target: Target, name: str = "default",
                   opt: int = 3) -> GpuModule:
    """Device programs (split_host_device) -> the host's library with their code and launch sequences."""
    gpu = target.gpu
    if gpu is None:
        raise CompileError("module %r: %s is not a GPU target (opencl, vulkan, cuda ...)" % (name, target))
    kernels = [k for p in programs for k in p.kernels]
    seen: Dict[str, str] = {}
    for p in programs:
        if p.name in seen.values():
            raise CompileError("module %r has more than one function named %s" % (name, p.name))
        for k in p.kernels:
            if k.name in seen:
                raise CompileError("module %r: kernel %s of %s has the name of a kernel of %s"
                                   % (name, k.name, p.name, seen[k.name]))
            seen[k.name] = p.name
            if k.scalars:   # (every extent is static today: nothing to pass)
                raise CompileError("%s: kernel %s takes scalar arguments %s; a GPU module passes buffers only"
                                   % (p.name, k.name, ", ".join(v.name for v in k.scalars)))
    be = backend(gpu.api)
    code = be.emit(kernels, gpu)
    for k in kernels:
        _check_limits(k, target)
    entry = device_entry(programs, target, be.code_format, code)
    mb = ModuleBuilder(target.host, name)
    mb.add_device(entry, code)
    ir_text = mb.finish()
    compiled = compile_module(ir_text, target.host, opt=opt)
    assert mb.metadata is not None
    return GpuModule(name, target.host, ir_text, compiled, mb.metadata, code)


def _check_limits(k: Any, target: Target) -> None:
    """What the emitted code needs against what the target promises (split_host_device checked the launch)."""
    gpu = target.gpu
    assert gpu is not None
    if "fp16" in k.needs and not gpu.fp16:
        raise CompileError("kernel %s needs fp16 (half-precision values in its %s code), which target %r does not "
                           "promise (its devices may lack it); add -fp16=1 to the target if they have it"
                           % (k.name, gpu.code_format, str(target)))


def _outputs(p: DeviceProgram) -> List[int]:
    """The indices of the function's arguments some kernel stores to (what a call downloads into numpy
    arguments)."""
    written = {id(s.buffer) for k in p.kernels for s in walk(k.body) if isinstance(s, Store)}
    return [i for i, b in enumerate(p.params) if id(b) in written]


def device_entry(programs: Sequence[DeviceProgram], target: Target, code_format: str, code: bytes
                 ) -> Dict[str, Any]:
    """Metadata "device" of a GPU module (docs/abi.md "GPU modules")."""
    gpu = target.gpu
    assert gpu is not None
    functions = []
    for p in programs:
        info = p.launch_info()
        functions.append({
            "name": p.name,
            "args": [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype} for b in p.params],
            "outputs": _outputs(p),
            "temporaries": info["temporaries"],
            "launches": [{"kernel": k["name"], "args": k["args"]} for k in info["kernels"]],
        })
    kernels = [k.launch_info() for p in programs for k in p.kernels]
    return {"version": DEVICE_META_VERSION, "api": gpu.api, "target": str(target), "gpu": gpu.to_dict(),
            "format": code_format, "code_bytes": len(code), "code_sha256": hashlib.sha256(code).hexdigest(),
            "needs": sorted({n for k in kernels for n in k["needs"]}), "kernels": kernels, "functions": functions}
