"""The Vulkan device API (tether_rpc.gpu.vulkan) on Mesa's lavapipe: real driver, real SPIR-V.

The compute shaders are SPIR-V assembly, assembled here by spirv-as (spirv-tools) and checked by spirv-val;
results are compared with numpy. Lavapipe is a CPU device, which VulkanDevice lists after the GPUs.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.prereq import require_tool, unavailable

from tether_rpc.gpu import vulkan
from tether_rpc.gpu.api import GpuBuildError, GpuError, GpuUnavailable
from tether_rpc.gpu.devices import open_device

ROOT = Path(__file__).resolve().parent.parent

DRIVER_PACKAGES = "apt-get install libvulkan1 mesa-vulkan-drivers"

# ---------------------------------------------------------------------------------------------------------------
# shaders
_HEADER = """
               OpCapability Shader
               OpMemoryModel Logical GLSL450
"""
_TYPES = """
       %void = OpTypeVoid
         %fn = OpTypeFunction %void
       %bool = OpTypeBool
       %uint = OpTypeInt 32 0
        %int = OpTypeInt 32 1
      %float = OpTypeFloat 32
        %v3u = OpTypeVector %uint 3
      %p_v3u = OpTypePointer Input %v3u
      %int_0 = OpConstant %int 0
"""

#: C[i] = A[i] + B[i] for i < n (float32); three storage buffers and one push constant
VADD = _HEADER + """
               OpEntryPoint GLCompute %main "vadd" %gid
               OpExecutionMode %main LocalSize 64 1 1
               OpDecorate %gid BuiltIn GlobalInvocationId
               OpDecorate %arr ArrayStride 4
               OpMemberDecorate %sbuf 0 Offset 0
               OpDecorate %sbuf Block
               OpDecorate %A DescriptorSet 0
               OpDecorate %A Binding 0
               OpDecorate %B DescriptorSet 0
               OpDecorate %B Binding 1
               OpDecorate %C DescriptorSet 0
               OpDecorate %C Binding 2
               OpMemberDecorate %pc 0 Offset 0
               OpDecorate %pc Block
""" + _TYPES + """
        %gid = OpVariable %p_v3u Input
        %arr = OpTypeRuntimeArray %float
       %sbuf = OpTypeStruct %arr
     %p_sbuf = OpTypePointer StorageBuffer %sbuf
          %A = OpVariable %p_sbuf StorageBuffer
          %B = OpVariable %p_sbuf StorageBuffer
          %C = OpVariable %p_sbuf StorageBuffer
         %pc = OpTypeStruct %int
       %p_pc = OpTypePointer PushConstant %pc
         %PC = OpVariable %p_pc PushConstant
      %p_int = OpTypePointer PushConstant %int
    %p_float = OpTypePointer StorageBuffer %float
       %main = OpFunction %void None %fn
      %entry = OpLabel
         %g3 = OpLoad %v3u %gid
          %i = OpCompositeExtract %uint %g3 0
         %ii = OpBitcast %int %i
         %pn = OpAccessChain %p_int %PC %int_0
          %n = OpLoad %int %pn
         %ok = OpSLessThan %bool %ii %n
               OpSelectionMerge %end None
               OpBranchConditional %ok %body %end
       %body = OpLabel
         %pa = OpAccessChain %p_float %A %int_0 %i
         %pb = OpAccessChain %p_float %B %int_0 %i
        %pcc = OpAccessChain %p_float %C %int_0 %i
          %a = OpLoad %float %pa
          %b = OpLoad %float %pb
          %s = OpFAdd %float %a %b
               OpStore %pcc %s
               OpBranch %end
        %end = OpLabel
               OpReturn
               OpFunctionEnd
"""

#: OUT[i] = f^n(i) with f(x) = 3x + 1 (uint32): a loop as long as the push constant n says
SPIN = _HEADER + """
               OpEntryPoint GLCompute %main "spin" %gid
               OpExecutionMode %main LocalSize 64 1 1
               OpDecorate %gid BuiltIn GlobalInvocationId
               OpDecorate %arr ArrayStride 4
               OpMemberDecorate %sbuf 0 Offset 0
               OpDecorate %sbuf Block
               OpDecorate %OUT DescriptorSet 0
               OpDecorate %OUT Binding 0
               OpMemberDecorate %pc 0 Offset 0
               OpDecorate %pc Block
""" + _TYPES + """
     %uint_0 = OpConstant %uint 0
     %uint_1 = OpConstant %uint 1
     %uint_3 = OpConstant %uint 3
        %gid = OpVariable %p_v3u Input
        %arr = OpTypeRuntimeArray %uint
       %sbuf = OpTypeStruct %arr
     %p_sbuf = OpTypePointer StorageBuffer %sbuf
        %OUT = OpVariable %p_sbuf StorageBuffer
         %pc = OpTypeStruct %uint
       %p_pc = OpTypePointer PushConstant %pc
         %PC = OpVariable %p_pc PushConstant
     %p_uint = OpTypePointer PushConstant %uint
   %p_s_uint = OpTypePointer StorageBuffer %uint
       %main = OpFunction %void None %fn
      %entry = OpLabel
         %g3 = OpLoad %v3u %gid
          %i = OpCompositeExtract %uint %g3 0
         %pn = OpAccessChain %p_uint %PC %int_0
          %n = OpLoad %uint %pn
               OpBranch %header
     %header = OpLabel
          %k = OpPhi %uint %uint_0 %entry %k1 %cont
        %acc = OpPhi %uint %i %entry %acc1 %cont
       %more = OpULessThan %bool %k %n
               OpLoopMerge %merge %cont None
               OpBranchConditional %more %body %merge
       %body = OpLabel
          %t = OpIMul %uint %acc %uint_3
       %acc1 = OpIAdd %uint %t %uint_1
               OpBranch %cont
       %cont = OpLabel
         %k1 = OpIAdd %uint %k %uint_1
               OpBranch %header
      %merge = OpLabel
          %p = OpAccessChain %p_s_uint %OUT %int_0 %i
               OpStore %p %acc
               OpReturn
               OpFunctionEnd
"""


def reduction_shader(local: int = 64) -> str:
    """OUT[workgroup] = sum of IN over the work-group's ``local`` elements (int32): a tree in work-group shared
    memory, one OpControlBarrier (Workgroup scope, acquire-release of workgroup memory) after every step."""
    steps = []
    s = local // 2
    while s:
        steps.append(s)
        s //= 2
    consts = sorted({0, 1, 2, 264, local, *steps})
    body = []
    barrier = "               OpControlBarrier %uint_2 %uint_2 %uint_264"
    for s in steps:
        body.append(f"""
        %c_{s} = OpULessThan %bool %l %uint_{s}
               OpSelectionMerge %m_{s} None
               OpBranchConditional %c_{s} %b_{s} %m_{s}
        %b_{s} = OpLabel
        %j_{s} = OpIAdd %uint %l %uint_{s}
       %pa_{s} = OpAccessChain %p_sh_int %shared %l
       %pb_{s} = OpAccessChain %p_sh_int %shared %j_{s}
       %va_{s} = OpLoad %int %pa_{s}
       %vb_{s} = OpLoad %int %pb_{s}
       %vs_{s} = OpIAdd %int %va_{s} %vb_{s}
               OpStore %pa_{s} %vs_{s}
               OpBranch %m_{s}
        %m_{s} = OpLabel
{barrier}""")
    return _HEADER + f"""
               OpEntryPoint GLCompute %main "reduce" %gid %lid %wid
               OpExecutionMode %main LocalSize {local} 1 1
               OpDecorate %gid BuiltIn GlobalInvocationId
               OpDecorate %lid BuiltIn LocalInvocationId
               OpDecorate %wid BuiltIn WorkgroupId
               OpDecorate %arr ArrayStride 4
               OpMemberDecorate %sbuf 0 Offset 0
               OpDecorate %sbuf Block
               OpDecorate %IN DescriptorSet 0
               OpDecorate %IN Binding 0
               OpDecorate %OUT DescriptorSet 0
               OpDecorate %OUT Binding 1
""" + _TYPES + "\n".join(f"     %uint_{c} = OpConstant %uint {c}" for c in consts) + f"""
        %gid = OpVariable %p_v3u Input
        %lid = OpVariable %p_v3u Input
        %wid = OpVariable %p_v3u Input
        %arr = OpTypeRuntimeArray %int
       %sbuf = OpTypeStruct %arr
     %p_sbuf = OpTypePointer StorageBuffer %sbuf
         %IN = OpVariable %p_sbuf StorageBuffer
        %OUT = OpVariable %p_sbuf StorageBuffer
    %p_s_int = OpTypePointer StorageBuffer %int
     %sh_arr = OpTypeArray %int %uint_{local}
       %p_sh = OpTypePointer Workgroup %sh_arr
     %shared = OpVariable %p_sh Workgroup
   %p_sh_int = OpTypePointer Workgroup %int
       %main = OpFunction %void None %fn
      %entry = OpLabel
         %g3 = OpLoad %v3u %gid
          %g = OpCompositeExtract %uint %g3 0
         %l3 = OpLoad %v3u %lid
          %l = OpCompositeExtract %uint %l3 0
         %w3 = OpLoad %v3u %wid
          %w = OpCompositeExtract %uint %w3 0
        %pin = OpAccessChain %p_s_int %IN %int_0 %g
          %v = OpLoad %int %pin
        %psh = OpAccessChain %p_sh_int %shared %l
               OpStore %psh %v
{barrier}
""" + "".join(body) + """
      %first = OpIEqual %bool %l %uint_0
               OpSelectionMerge %done None
               OpBranchConditional %first %write %done
      %write = OpLabel
       %psum = OpAccessChain %p_sh_int %shared %uint_0
        %sum = OpLoad %int %psum
       %pout = OpAccessChain %p_s_int %OUT %int_0 %w
               OpStore %pout %sum
               OpBranch %done
       %done = OpLabel
               OpReturn
               OpFunctionEnd
"""


@pytest.fixture(scope="module")
def assemble(tmp_path_factory):
    spirv_as = require_tool("spirv-as", "apt-get install spirv-tools")
    spirv_val = require_tool("spirv-val", "apt-get install spirv-tools")
    folder = tmp_path_factory.mktemp("spirv")
    cache = {}

    def run(text: str) -> bytes:
        if text not in cache:
            src, out = folder / ("s%d.spvasm" % len(cache)), folder / ("s%d.spv" % len(cache))
            src.write_text(text)
            subprocess.run([spirv_as, "--target-env", "vulkan1.1", str(src), "-o", str(out)], check=True,
                           timeout=60)
            subprocess.run([spirv_val, "--target-env", "vulkan1.1", str(out)], check=True, timeout=60)
            cache[text] = out.read_bytes()
        return cache[text]
    return run


def _lavapipe_index() -> int:
    devices = vulkan.VulkanDevice.available()
    for info in devices:
        if info["device_type"] == "cpu" and "llvmpipe" in info["name"]:
            return info["index"]
    unavailable("Vulkan with Mesa's lavapipe (devices found: %s)" % [d["name"] for d in devices], DRIVER_PACKAGES)


@pytest.fixture(scope="module")
def lavapipe_index() -> int:
    return _lavapipe_index()


@pytest.fixture(params=["mapped", "staging"])
def dev(request, lavapipe_index):
    d = vulkan.VulkanDevice(lavapipe_index, memory=request.param)
    yield d
    d.close()


@pytest.fixture
def mapped(lavapipe_index):
    d = vulkan.VulkanDevice(lavapipe_index)
    yield d
    d.close()


def kernel_info(name, n_params, n_scalars, block=(64, 1, 1), grid=(1, 1, 1), shared_bytes=0, needs=()):
    return {"name": name, "grid": list(grid), "block": list(block),
            "params": [{"name": "p%d" % i, "dtype": "float32", "size": 0} for i in range(n_params)],
            "scalars": ["s%d" % i for i in range(n_scalars)], "shared_bytes": shared_bytes, "needs": list(needs)}


# ---------------------------------------------------------------------------------------------------------------
# layouts: sizes of the structs in vulkan_core.h on 64-bit targets (gcc, Vulkan 1.3.239 headers)
HEADER_SIZES_LP64 = {
    "VkApplicationInfo": 48, "VkBufferCopy": 24, "VkBufferCreateInfo": 56, "VkCommandBufferAllocateInfo": 32,
    "VkCommandBufferBeginInfo": 32, "VkCommandPoolCreateInfo": 24, "VkComputePipelineCreateInfo": 96,
    "VkConformanceVersion": 4, "VkDescriptorBufferInfo": 24, "VkDescriptorPoolCreateInfo": 40,
    "VkDescriptorPoolSize": 8, "VkDescriptorSetAllocateInfo": 40, "VkDescriptorSetLayoutBinding": 24,
    "VkDescriptorSetLayoutCreateInfo": 32, "VkDeviceCreateInfo": 72, "VkDeviceQueueCreateInfo": 40,
    "VkExtensionProperties": 260, "VkExtent3D": 12, "VkFenceCreateInfo": 24, "VkInstanceCreateInfo": 64,
    "VkMemoryAllocateInfo": 32, "VkMemoryBarrier": 24, "VkMemoryHeap": 16, "VkMemoryRequirements": 24,
    "VkMemoryType": 8, "VkPhysicalDevice16BitStorageFeatures": 32, "VkPhysicalDevice8BitStorageFeatures": 32,
    "VkPhysicalDeviceDriverProperties": 536, "VkPhysicalDeviceFeatures": 220, "VkPhysicalDeviceFeatures2": 240,
    "VkPhysicalDeviceLimits": 504, "VkPhysicalDeviceMemoryProperties": 520, "VkPhysicalDeviceProperties": 824,
    "VkPhysicalDeviceProperties2": 840, "VkPhysicalDeviceShaderFloat16Int8Features": 24,
    "VkPhysicalDeviceShaderIntegerDotProductFeatures": 24, "VkPhysicalDeviceSparseProperties": 20,
    "VkPhysicalDeviceSubgroupProperties": 32, "VkPipelineLayoutCreateInfo": 48,
    "VkPipelineShaderStageCreateInfo": 48, "VkPushConstantRange": 12, "VkQueryPoolCreateInfo": 32,
    "VkQueueFamilyProperties": 24, "VkShaderModuleCreateInfo": 40, "VkSubmitInfo": 72, "VkWriteDescriptorSet": 64,
}


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="the sizes are those of 64-bit targets")
def test_struct_layouts_match_the_header():
    sizes = {name: ctypes.sizeof(getattr(vulkan, name)) for name in HEADER_SIZES_LP64}
    assert sizes == HEADER_SIZES_LP64
    limits = vulkan.VkPhysicalDeviceLimits
    # the fields read most, at their offsets in the header
    assert (limits.maxComputeSharedMemorySize.offset, limits.maxComputeWorkGroupInvocations.offset,
            limits.minStorageBufferOffsetAlignment.offset, limits.timestampPeriod.offset) == (216, 232, 328, 424)


# ---------------------------------------------------------------------------------------------------------------
def test_info_fields_are_sane(mapped, lavapipe_index):
    info = mapped.info()
    assert "llvmpipe" in info["name"] and info["device_type"] == "cpu" and info["vendor"] == "Mesa"
    assert re.fullmatch(r"1\.\d+\.\d+", info["api_version"]) and re.fullmatch(r"\d+(\.\d+)+", info["driver"])
    assert info["compute_units"] is None
    # the minimums the Vulkan spec guarantees
    assert info["max_threads_per_block"] >= 128 and info["shared_memory_bytes"] >= 16384
    assert all(b >= 64 for b in info["max_block"][:2]) and all(g >= 65535 for g in info["max_grid"])
    assert info["memory_bytes"] > 0 and info["max_push_constants_bytes"] >= 128
    assert info["min_storage_buffer_offset_alignment"] in (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert all(isinstance(e, str) for e in info["extensions"]) and "VK_KHR_shader_float16_int8" in info["extensions"]
    assert isinstance(info["fp16"], bool) and isinstance(info["int8_dot"], bool)
    # lavapipe (Mesa 22+) has both; reporting False would mean the features2 chain is read wrong
    assert info["fp16"] and info["int8_dot"] and info["int8"] and info["int16"]
    assert info["subgroup_size"] and info["subgroup_size"] & (info["subgroup_size"] - 1) == 0
    assert info["memory"] == "mapped" and info["timestamps"]
    listed = vulkan.VulkanDevice.available()[lavapipe_index]
    assert listed["name"] == info["name"] and listed["max_block"] == info["max_block"]


def test_cpu_devices_come_after_gpus():
    types = [d["device_type"] for d in vulkan.VulkanDevice.available()]
    assert types == sorted(types, key=lambda t: t == "cpu")


def test_open_device_by_name(lavapipe_index):
    d = open_device("vulkan:%d" % lavapipe_index)
    try:
        assert isinstance(d, vulkan.VulkanDevice) and "llvmpipe" in d.info()["name"]
    finally:
        d.close()
    with pytest.raises(GpuUnavailable, match=r"vulkan:99: this device has \d+ Vulkan device"):
        vulkan.VulkanDevice(99)


def test_vector_add(dev, assemble):
    n = 1000  # not a multiple of the work-group: the kernel's bound check matters
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    prog = dev.load(assemble(VADD), [kernel_info("vadd", 3, 1, grid=(16, 1, 1))])
    A, B, C = dev.alloc(a.nbytes), dev.alloc(b.nbytes), dev.alloc(a.nbytes)
    dev.upload(A, a)
    dev.upload(B, b)
    dev.launch(prog, "vadd", [A, B, C, n], (16, 1, 1), (64, 1, 1))
    dev.synchronize()
    out = np.zeros(n, np.float32)
    dev.download(C, out)
    np.testing.assert_array_equal(out, a + b)
    # a second launch on other buffers, without a synchronize between: queue order holds
    D = dev.alloc(a.nbytes)
    dev.launch(prog, "vadd", [C, A, D, n], (16, 1, 1), (64, 1, 1))
    dev.launch(prog, "vadd", [D, D, C, n], (16, 1, 1), (64, 1, 1))
    dev.download(C, out)
    np.testing.assert_array_equal(out, 2 * ((a + b) + a))
    assert dev.load(assemble(VADD), [kernel_info("vadd", 3, 1, grid=(16, 1, 1))]) is prog  # cached


def test_shared_memory_reduction_with_barriers(dev, assemble):
    groups = 37
    x = np.random.default_rng(1).integers(-1000, 1000, size=groups * 64, dtype=np.int32)
    prog = dev.load(assemble(reduction_shader(64)), [kernel_info("reduce", 2, 0, grid=(groups, 1, 1),
                                                                  shared_bytes=256)])
    IN, OUT = dev.alloc(x.nbytes), dev.alloc(groups * 4)
    dev.upload(IN, x)
    dev.launch(prog, "reduce", [IN, OUT], (groups, 1, 1), (64, 1, 1))
    out = np.zeros(groups, np.int32)
    dev.download(OUT, out)
    np.testing.assert_array_equal(out, x.reshape(groups, 64).sum(axis=1))


def test_upload_download_round_trip_at_offsets(dev, monkeypatch):
    monkeypatch.setattr(vulkan, "_STAGING_BYTES", 4096)  # several staging chunks per transfer
    dev._staging = None
    data = np.random.default_rng(2).integers(0, 255, size=10001, dtype=np.uint8)
    buf = dev.alloc(20003)
    dev.upload(buf, data)
    dev.upload(buf, data[:777], offset=10001 + 3)  # an odd byte offset
    whole = np.zeros(20003, np.uint8)
    dev.download(buf, whole)
    np.testing.assert_array_equal(whole[:10001], data)
    np.testing.assert_array_equal(whole[10004:10004 + 777], data[:777])
    part = np.zeros(100, np.uint8)
    dev.download(buf, part, offset=4999)
    np.testing.assert_array_equal(part, data[4999:5099])
    f = np.arange(12, dtype=np.float64).reshape(3, 4)
    dev.upload(buf, f, offset=8)
    back = np.zeros_like(f)
    dev.download(buf, back, offset=8)
    np.testing.assert_array_equal(back, f)
    with pytest.raises(ValueError, match="outside the 20003-byte buffer"):
        dev.upload(buf, data, offset=20003 - 10000)
    with pytest.raises(ValueError, match="C-contiguous"):
        dev.download(buf, whole[::2])


def test_copy(dev):
    src_data = np.arange(256, dtype=np.int32)
    src, dst = dev.alloc(src_data.nbytes), dev.alloc(src_data.nbytes)
    dev.upload(src, src_data)
    dev.upload(dst, np.full(256, -1, np.int32))
    dev.copy(dst, src, 100 * 4, dst_offset=10 * 4, src_offset=50 * 4)
    out = np.zeros(256, np.int32)
    dev.download(dst, out)
    expected = np.full(256, -1, np.int32)
    expected[10:110] = src_data[50:150]
    np.testing.assert_array_equal(out, expected)
    dev.copy(src, src, 16, dst_offset=0, src_offset=512)  # same buffer, disjoint ranges
    dev.download(src, out)
    assert list(out[:4]) == [128, 129, 130, 131]
    with pytest.raises(ValueError, match="overlap"):
        dev.copy(src, src, 16, dst_offset=0, src_offset=8)
    with pytest.raises(ValueError, match="outside"):
        dev.copy(dst, src, 2000)


def test_timed_returns_device_seconds(mapped, assemble):
    prog = mapped.load(assemble(SPIN), [kernel_info("spin", 1, 1)])
    out = mapped.alloc(64 * 4)
    seconds = mapped.timed(prog, "spin", [out, 10000], (1, 1, 1), (64, 1, 1))
    assert isinstance(seconds, float) and seconds > 0


def _spin_reference(n: int, threads: int = 64) -> np.ndarray:
    # f^n(x) = 3^n x + (3^n - 1) / 2 (mod 2^32)
    p = pow(3, n, 1 << 33)
    return np.array([(p * x + (p - 1) // 2) % (1 << 32) for x in range(threads)], dtype=np.uint32)


def test_synchronize_times_out_then_finishes(mapped, assemble):
    prog = mapped.load(assemble(SPIN), [kernel_info("spin", 1, 1)])
    groups = 64
    out = mapped.alloc(groups * 64 * 4)
    # 4096 threads of 60000 steps each: far beyond the 1 ms allowed below. (lavapipe ends any loop after 65535
    # iterations, so a longer kernel takes more threads, not more steps.)
    n = 60000
    mapped.launch(prog, "spin", [out, n], (groups, 1, 1), (64, 1, 1))
    mapped.timeout_s = 0.001
    with pytest.raises(GpuError, match=r"the kernel did not finish within 0.001 s"):
        mapped.synchronize()
    mapped.timeout_s = 600.0
    result = np.zeros(groups * 64, np.uint32)
    mapped.download(out, result)
    np.testing.assert_array_equal(result, _spin_reference(n, groups * 64))


def test_local_size_mismatch_is_refused_at_load(mapped, assemble):
    with pytest.raises(GpuBuildError, match=r"'vadd': the SPIR-V's work-group size \(LocalSize\) is \(64, 1, 1\) "
                                            r"but the launch's block is \(32, 1, 1\)"):
        mapped.load(assemble(VADD), [kernel_info("vadd", 3, 1, block=(32, 1, 1))])


def test_launch_checks_its_arguments(mapped, assemble):
    prog = mapped.load(assemble(VADD), [kernel_info("vadd", 3, 1)])
    bufs = [mapped.alloc(256) for _ in range(3)]
    with pytest.raises(ValueError, match="takes 3 buffers and 1 int32 scalars, got 3 arguments"):
        mapped.launch(prog, "vadd", bufs, (1, 1, 1), (64, 1, 1))
    with pytest.raises(ValueError, match="argument 3: expected an int32 scalar, got 1.5"):
        mapped.launch(prog, "vadd", bufs + [1.5], (1, 1, 1), (64, 1, 1))
    with pytest.raises(ValueError, match="argument 3: expected an int32 scalar"):
        mapped.launch(prog, "vadd", bufs + [1 << 31], (1, 1, 1), (64, 1, 1))
    with pytest.raises(GpuError, match=r"block \(32, 2, 1\) differs from the work-group size \(64, 1, 1\)"):
        mapped.launch(prog, "vadd", bufs + [64], (1, 1, 1), (32, 2, 1))
    with pytest.raises(ValueError, match="has no kernel 'nope'"):
        mapped.launch(prog, "nope", bufs + [64], (1, 1, 1), (64, 1, 1))
    mapped.free(bufs[0])
    with pytest.raises(ValueError, match="argument 0: expected a live buffer"):
        mapped.launch(prog, "vadd", bufs + [64], (1, 1, 1), (64, 1, 1))


def test_bad_spirv_is_a_build_error(mapped, assemble):
    good = assemble(VADD)
    info = [kernel_info("vadd", 3, 1)]
    with pytest.raises(GpuBuildError, match="bad magic number"):
        mapped.load(b"\x00" * 64, info)
    with pytest.raises(GpuBuildError, match="whole 32-bit words"):
        mapped.load(good[:-2], info)
    with pytest.raises(GpuBuildError, match="past the end of the"):
        mapped.load(good + (5 << 16 | 1).to_bytes(4, "little"), info)  # a 5-word instruction, 1 word left
    with pytest.raises(GpuBuildError, match="no GLCompute entry point of that name .it has: vadd."):
        mapped.load(good, [kernel_info("vsub", 3, 1)])
    newer = bytearray(good)
    newer[4:8] = (0x00010700).to_bytes(4, "little")  # SPIR-V 1.7: no Vulkan version takes it
    with pytest.raises(GpuBuildError, match="SPIR-V 1.7 is newer than vulkan:"):
        mapped.load(bytes(newer), info)
    with pytest.raises(GpuBuildError, match="needs fp64x"):
        mapped.load(good, [kernel_info("vadd", 3, 1, needs=["fp64x"])])


def test_vkresult_errors_name_the_call(mapped):
    with pytest.raises(GpuError, match=r"vk(CreateBuffer|AllocateMemory) failed: VK_ERROR_OUT_OF_(DEVICE|HOST)_MEMORY"):
        mapped.alloc(1 << 62)


def test_close_is_idempotent_and_final(lavapipe_index, assemble):
    d = vulkan.VulkanDevice(lavapipe_index)
    prog = d.load(assemble(VADD), [kernel_info("vadd", 3, 1)])
    bufs = [d.alloc(256) for _ in range(3)]
    d.launch(prog, "vadd", bufs + [64], (1, 1, 1), (64, 1, 1))
    d.close()  # with a launch in flight
    d.close()
    with pytest.raises(GpuError, match="is closed"):
        d.alloc(16)
    d.free(bufs[0])  # a no-op after close


def _child(code: str, env: dict, drop: tuple = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in dict(os.environ, PYTHONPATH=str(ROOT / "rpc_server"), **env).items() if k not in drop}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_missing_library_is_gpu_unavailable():
    code = ("import json\nfrom tether_rpc.gpu.vulkan import VulkanDevice\nfrom tether_rpc.gpu.api import "
            "GpuUnavailable\nprint(json.dumps(VulkanDevice.available()))\n"
            "try:\n    VulkanDevice(0)\nexcept GpuUnavailable as e:\n    print(e)\n")
    proc = _child(code, {vulkan.LIBRARY_ENV: "/nonexistent/libvulkan.so.1"})
    assert proc.returncode == 0, proc.stderr
    listed, message = proc.stdout.splitlines()
    assert json.loads(listed) == []
    assert message.startswith("this device has no Vulkan: tried /nonexistent/libvulkan.so.1")
    assert "TETHER_VULKAN_LIBRARY" in message and "mesa-vulkan-drivers" in message


def test_driver_output_stays_off_stdout_and_stderr(lavapipe_index):
    # lavapipe's non-conformance warning (and any loader chatter) must not reach a CLI's output
    code = ("import json\nfrom tether_rpc.gpu.vulkan import VulkanDevice\n"
            "d = VulkanDevice(%d)\nprint(json.dumps(d.info()['name']))\nd.close()\n" % lavapipe_index)
    proc = _child(code, {}, drop=("MESA_VK_IGNORE_CONFORMANCE_WARNING",))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and "llvmpipe" in json.loads(proc.stdout)


def test_close_returns_while_a_kernel_still_runs(lavapipe_index, assemble):
    d = vulkan.VulkanDevice(lavapipe_index, timeout_s=0.001)
    prog = d.load(assemble(SPIN), [kernel_info("spin", 1, 1)])
    out = d.alloc(64 * 64 * 4)
    d.launch(prog, "spin", [out, 60000], (64, 1, 1), (64, 1, 1))
    d.close()  # waits 1 ms, then leaves the device to the process's end instead of destroying what runs
    with pytest.raises(GpuError, match="is closed"):
        d.synchronize()


def test_descriptor_pools_grow_and_reset(mapped, assemble, monkeypatch):
    # tiny pools and cache: every pool holds one set, and the cache is reset every 8 sets
    monkeypatch.setattr(vulkan, "_POOL_SETS", 2)
    monkeypatch.setattr(vulkan, "_POOL_DESCRIPTORS", 3)
    monkeypatch.setattr(vulkan, "_MAX_DESCRIPTOR_SETS", 8)
    prog = mapped.load(assemble(VADD), [kernel_info("vadd", 3, 1)])
    bufs = [mapped.alloc(256) for _ in range(6)]
    out = np.zeros(64, np.float32)
    launches = 0
    for _ in range(2):  # the second round finds some sets cached, others reallocated after a reset
        for i in range(6):
            for j in range(6):
                k = (i + j + 1) % 6
                if len({i, j, k}) < 3:
                    continue
                for b, v in ((i, i), (j, 10 * j)):
                    mapped.upload(bufs[b], np.full(64, v, np.float32))
                mapped.launch(prog, "vadd", [bufs[i], bufs[j], bufs[k], 64], (1, 1, 1), (64, 1, 1))
                mapped.download(bufs[k], out)
                assert (out == i + 10 * j).all(), (i, j, k)
                launches += 1
    assert launches > 2 * 8 and len(mapped._pools) >= 4
