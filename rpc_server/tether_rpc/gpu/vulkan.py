"""The Vulkan device API through ctypes on the system's Vulkan loader (``libvulkan.so.1``): compute only.

The kernel ABI (``tether.tir.device``): a kernel's ``params`` buffers are storage buffers at bindings 0..n-1 of
descriptor set 0, in order; its int32 scalars are push constants, 4 bytes each in order from offset 0; the entry
point is the kernel's name; the work-group size is in the SPIR-V (``LocalSize``), so it is checked against the
launch's ``block`` when the code is loaded and again at every launch; a launch is ``vkCmdDispatch(grid)``.

Memory: where the device shares memory with the host (integrated GPUs, phones, CPU devices such as lavapipe) a
buffer lives in a HOST_VISIBLE|HOST_COHERENT memory type and stays mapped, so upload and download are memmoves;
elsewhere (discrete GPUs) it lives in DEVICE_LOCAL memory and crosses through a mapped staging buffer with
``vkCmdCopyBuffer``. Launches and copies are asynchronous, each a command buffer with a fence; every command
buffer starts with a full memory barrier, which makes the queue behave in order like an OpenCL queue, and ends
with one that makes device writes visible to the host. ``synchronize`` waits the fences, with a timeout.

Only the standard library, numpy and ctypes: this runs on the device.
"""
from __future__ import annotations

import collections
import ctypes
import hashlib
import os
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .api import DeviceAPI, DeviceBuffer, GpuBuildError, GpuError, GpuUnavailable, KDL_VULKAN, KernelArg

#: overrides where the Vulkan loader is looked for (a path or a library name)
LIBRARY_ENV = "TETHER_VULKAN_LIBRARY"
#: how long ``synchronize`` waits for the device before giving up (seconds)
DEFAULT_TIMEOUT_S = 60.0

# ---------------------------------------------------------------------------------------------------------------
# C types and structs (layouts of vulkan_core.h; tests compare their sizes and offsets with the header's)
_u32, _i32, _u64, _f32, _p = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_float, ctypes.c_void_p
_H = ctypes.c_uint64  # a non-dispatchable handle (VkBuffer, VkPipeline...): 64 bits on every platform
_TYPES: Dict[str, Any] = {"u32": _u32, "i32": _i32, "u64": _u64, "f32": _f32, "p": _p, "h": _H,
                          "size": ctypes.c_size_t, "u8": ctypes.c_uint8, "char": ctypes.c_char}


def _struct(name: str, spec: str) -> type:
    """A ctypes Structure from ``"field[:type[*count]] ..."`` in declaration order; the type defaults to u32
    (uint32_t, VkBool32, VkFlags, enums) and may name a struct declared before."""
    fields = []
    for item in spec.split():
        field, _, typ = item.partition(":")
        typ, _, count = (typ or "u32").partition("*")
        ctype = _TYPES[typ]
        fields.append((field, ctype * int(count) if count else ctype))
    cls = type(name, (ctypes.Structure,), {"_fields_": fields})
    _TYPES[name] = cls
    return cls


_HEAD = "sType:i32 pNext:p "  # every extensible struct starts so

VkApplicationInfo = _struct("VkApplicationInfo", _HEAD + "pApplicationName:p applicationVersion pEngineName:p "
                            "engineVersion apiVersion")
VkInstanceCreateInfo = _struct("VkInstanceCreateInfo", _HEAD + "flags pApplicationInfo:p enabledLayerCount "
                               "ppEnabledLayerNames:p enabledExtensionCount ppEnabledExtensionNames:p")
VkExtensionProperties = _struct("VkExtensionProperties", "extensionName:char*256 specVersion")
VkPhysicalDeviceLimits = _struct("VkPhysicalDeviceLimits", """
    maxImageDimension1D maxImageDimension2D maxImageDimension3D maxImageDimensionCube maxImageArrayLayers
    maxTexelBufferElements maxUniformBufferRange maxStorageBufferRange maxPushConstantsSize maxMemoryAllocationCount
    maxSamplerAllocationCount bufferImageGranularity:u64 sparseAddressSpaceSize:u64 maxBoundDescriptorSets
    maxPerStageDescriptorSamplers maxPerStageDescriptorUniformBuffers maxPerStageDescriptorStorageBuffers
    maxPerStageDescriptorSampledImages maxPerStageDescriptorStorageImages maxPerStageDescriptorInputAttachments
    maxPerStageResources maxDescriptorSetSamplers maxDescriptorSetUniformBuffers
    maxDescriptorSetUniformBuffersDynamic maxDescriptorSetStorageBuffers maxDescriptorSetStorageBuffersDynamic
    maxDescriptorSetSampledImages maxDescriptorSetStorageImages maxDescriptorSetInputAttachments
    maxVertexInputAttributes maxVertexInputBindings maxVertexInputAttributeOffset maxVertexInputBindingStride
    maxVertexOutputComponents maxTessellationGenerationLevel maxTessellationPatchSize
    maxTessellationControlPerVertexInputComponents maxTessellationControlPerVertexOutputComponents
    maxTessellationControlPerPatchOutputComponents maxTessellationControlTotalOutputComponents
    maxTessellationEvaluationInputComponents maxTessellationEvaluationOutputComponents maxGeometryShaderInvocations
    maxGeometryInputComponents maxGeometryOutputComponents maxGeometryOutputVertices
    maxGeometryTotalOutputComponents maxFragmentInputComponents maxFragmentOutputAttachments
    maxFragmentDualSrcAttachments maxFragmentCombinedOutputResources maxComputeSharedMemorySize
    maxComputeWorkGroupCount:u32*3 maxComputeWorkGroupInvocations maxComputeWorkGroupSize:u32*3
    subPixelPrecisionBits subTexelPrecisionBits mipmapPrecisionBits maxDrawIndexedIndexValue maxDrawIndirectCount
    maxSamplerLodBias:f32 maxSamplerAnisotropy:f32 maxViewports maxViewportDimensions:u32*2
    viewportBoundsRange:f32*2 viewportSubPixelBits minMemoryMapAlignment:size minTexelBufferOffsetAlignment:u64
    minUniformBufferOffsetAlignment:u64 minStorageBufferOffsetAlignment:u64 minTexelOffset:i32 maxTexelOffset
    minTexelGatherOffset:i32 maxTexelGatherOffset minInterpolationOffset:f32 maxInterpolationOffset:f32
    subPixelInterpolationOffsetBits maxFramebufferWidth maxFramebufferHeight maxFramebufferLayers
    framebufferColorSampleCounts framebufferDepthSampleCounts framebufferStencilSampleCounts
    framebufferNoAttachmentsSampleCounts maxColorAttachments sampledImageColorSampleCounts
    sampledImageIntegerSampleCounts sampledImageDepthSampleCounts sampledImageStencilSampleCounts
    storageImageSampleCounts maxSampleMaskWords timestampComputeAndGraphics timestampPeriod:f32 maxClipDistances
    maxCullDistances maxCombinedClipAndCullDistances discreteQueuePriorities pointSizeRange:f32*2
    lineWidthRange:f32*2 pointSizeGranularity:f32 lineWidthGranularity:f32 strictLines standardSampleLocations
    optimalBufferCopyOffsetAlignment:u64 optimalBufferCopyRowPitchAlignment:u64 nonCoherentAtomSize:u64""")
VkPhysicalDeviceSparseProperties = _struct("VkPhysicalDeviceSparseProperties", "residencyStandard2DBlockShape "
                                           "residencyStandard2DMultisampleBlockShape residencyStandard3DBlockShape "
                                           "residencyAlignedMipSize residencyNonResidentStrict")
VkPhysicalDeviceProperties = _struct("VkPhysicalDeviceProperties", "apiVersion driverVersion vendorID deviceID "
                                     "deviceType deviceName:char*256 pipelineCacheUUID:u8*16 "
                                     "limits:VkPhysicalDeviceLimits sparseProperties:VkPhysicalDeviceSparseProperties")
VkPhysicalDeviceProperties2 = _struct("VkPhysicalDeviceProperties2", _HEAD + "properties:VkPhysicalDeviceProperties")
VkPhysicalDeviceSubgroupProperties = _struct("VkPhysicalDeviceSubgroupProperties", _HEAD + "subgroupSize "
                                             "supportedStages supportedOperations quadOperationsInAllStages")
VkConformanceVersion = _struct("VkConformanceVersion", "major:u8 minor:u8 subminor:u8 patch:u8")
VkPhysicalDeviceDriverProperties = _struct("VkPhysicalDeviceDriverProperties", _HEAD + "driverID "
                                           "driverName:char*256 driverInfo:char*256 "
                                           "conformanceVersion:VkConformanceVersion")
VkPhysicalDeviceFeatures = _struct("VkPhysicalDeviceFeatures", """
    robustBufferAccess fullDrawIndexUint32 imageCubeArray independentBlend geometryShader tessellationShader
    sampleRateShading dualSrcBlend logicOp multiDrawIndirect drawIndirectFirstInstance depthClamp depthBiasClamp
    fillModeNonSolid depthBounds wideLines largePoints alphaToOne multiViewport samplerAnisotropy
    textureCompressionETC2 textureCompressionASTC_LDR textureCompressionBC occlusionQueryPrecise
    pipelineStatisticsQuery vertexPipelineStoresAndAtomics fragmentStoresAndAtomics
    shaderTessellationAndGeometryPointSize shaderImageGatherExtended shaderStorageImageExtendedFormats
    shaderStorageImageMultisample shaderStorageImageReadWithoutFormat shaderStorageImageWriteWithoutFormat
    shaderUniformBufferArrayDynamicIndexing shaderSampledImageArrayDynamicIndexing
    shaderStorageBufferArrayDynamicIndexing shaderStorageImageArrayDynamicIndexing shaderClipDistance
    shaderCullDistance shaderFloat64 shaderInt64 shaderInt16 shaderResourceResidency shaderResourceMinLod
    sparseBinding sparseResidencyBuffer sparseResidencyImage2D sparseResidencyImage3D sparseResidency2Samples
    sparseResidency4Samples sparseResidency8Samples sparseResidency16Samples sparseResidencyAliased
    variableMultisampleRate inheritedQueries""")
VkPhysicalDeviceFeatures2 = _struct("VkPhysicalDeviceFeatures2", _HEAD + "features:VkPhysicalDeviceFeatures")
VkPhysicalDeviceShaderFloat16Int8Features = _struct("VkPhysicalDeviceShaderFloat16Int8Features",
                                                    _HEAD + "shaderFloat16 shaderInt8")
VkPhysicalDevice16BitStorageFeatures = _struct("VkPhysicalDevice16BitStorageFeatures", _HEAD +
                                               "storageBuffer16BitAccess uniformAndStorageBuffer16BitAccess "
                                               "storagePushConstant16 storageInputOutput16")
VkPhysicalDevice8BitStorageFeatures = _struct("VkPhysicalDevice8BitStorageFeatures", _HEAD + "storageBuffer8BitAccess "
                                              "uniformAndStorageBuffer8BitAccess storagePushConstant8")
VkPhysicalDeviceShaderIntegerDotProductFeatures = _struct("VkPhysicalDeviceShaderIntegerDotProductFeatures",
                                                          _HEAD + "shaderIntegerDotProduct")
VkMemoryType = _struct("VkMemoryType", "propertyFlags heapIndex")
VkMemoryHeap = _struct("VkMemoryHeap", "size:u64 flags")
VkPhysicalDeviceMemoryProperties = _struct("VkPhysicalDeviceMemoryProperties", "memoryTypeCount "
                                           "memoryTypes:VkMemoryType*32 memoryHeapCount memoryHeaps:VkMemoryHeap*16")
VkExtent3D = _struct("VkExtent3D", "width height depth")
VkQueueFamilyProperties = _struct("VkQueueFamilyProperties", "queueFlags queueCount timestampValidBits "
                                  "minImageTransferGranularity:VkExtent3D")
VkDeviceQueueCreateInfo = _struct("VkDeviceQueueCreateInfo", _HEAD + "flags queueFamilyIndex queueCount "
                                  "pQueuePriorities:p")
VkDeviceCreateInfo = _struct("VkDeviceCreateInfo", _HEAD + "flags queueCreateInfoCount pQueueCreateInfos:p "
                             "enabledLayerCount ppEnabledLayerNames:p enabledExtensionCount "
                             "ppEnabledExtensionNames:p pEnabledFeatures:p")
VkBufferCreateInfo = _struct("VkBufferCreateInfo", _HEAD + "flags size:u64 usage sharingMode queueFamilyIndexCount "
                             "pQueueFamilyIndices:p")
VkMemoryRequirements = _struct("VkMemoryRequirements", "size:u64 alignment:u64 memoryTypeBits")
VkMemoryAllocateInfo = _struct("VkMemoryAllocateInfo", _HEAD + "allocationSize:u64 memoryTypeIndex")
VkShaderModuleCreateInfo = _struct("VkShaderModuleCreateInfo", _HEAD + "flags codeSize:size pCode:p")
VkDescriptorSetLayoutBinding = _struct("VkDescriptorSetLayoutBinding", "binding descriptorType descriptorCount "
                                       "stageFlags pImmutableSamplers:p")
VkDescriptorSetLayoutCreateInfo = _struct("VkDescriptorSetLayoutCreateInfo", _HEAD + "flags bindingCount pBindings:p")
VkPushConstantRange = _struct("VkPushConstantRange", "stageFlags offset size")
VkPipelineLayoutCreateInfo = _struct("VkPipelineLayoutCreateInfo", _HEAD + "flags setLayoutCount pSetLayouts:p "
                                     "pushConstantRangeCount pPushConstantRanges:p")
VkPipelineShaderStageCreateInfo = _struct("VkPipelineShaderStageCreateInfo", _HEAD + "flags stage module:h pName:p "
                                          "pSpecializationInfo:p")
VkComputePipelineCreateInfo = _struct("VkComputePipelineCreateInfo", _HEAD + "flags "
                                      "stage:VkPipelineShaderStageCreateInfo layout:h basePipelineHandle:h "
                                      "basePipelineIndex:i32")
VkDescriptorPoolSize = _struct("VkDescriptorPoolSize", "type descriptorCount")
VkDescriptorPoolCreateInfo = _struct("VkDescriptorPoolCreateInfo", _HEAD + "flags maxSets poolSizeCount pPoolSizes:p")
VkDescriptorSetAllocateInfo = _struct("VkDescriptorSetAllocateInfo", _HEAD + "descriptorPool:h descriptorSetCount "
                                      "pSetLayouts:p")
VkDescriptorBufferInfo = _struct("VkDescriptorBufferInfo", "buffer:h offset:u64 range:u64")
VkWriteDescriptorSet = _struct("VkWriteDescriptorSet", _HEAD + "dstSet:h dstBinding dstArrayElement descriptorCount "
                               "descriptorType pImageInfo:p pBufferInfo:p pTexelBufferView:p")
VkCommandPoolCreateInfo = _struct("VkCommandPoolCreateInfo", _HEAD + "flags queueFamilyIndex")
VkCommandBufferAllocateInfo = _struct("VkCommandBufferAllocateInfo", _HEAD + "commandPool:h level commandBufferCount")
VkCommandBufferBeginInfo = _struct("VkCommandBufferBeginInfo", _HEAD + "flags pInheritanceInfo:p")
VkSubmitInfo = _struct("VkSubmitInfo", _HEAD + "waitSemaphoreCount pWaitSemaphores:p pWaitDstStageMask:p "
                       "commandBufferCount pCommandBuffers:p signalSemaphoreCount pSignalSemaphores:p")
VkFenceCreateInfo = _struct("VkFenceCreateInfo", _HEAD + "flags")
VkQueryPoolCreateInfo = _struct("VkQueryPoolCreateInfo", _HEAD + "flags queryType queryCount pipelineStatistics")
VkBufferCopy = _struct("VkBufferCopy", "srcOffset:u64 dstOffset:u64 size:u64")
VkMemoryBarrier = _struct("VkMemoryBarrier", _HEAD + "srcAccessMask dstAccessMask")

# sType values (VkStructureType)
_ST_APPLICATION_INFO, _ST_INSTANCE_CREATE_INFO, _ST_DEVICE_QUEUE_CREATE_INFO, _ST_DEVICE_CREATE_INFO = 0, 1, 2, 3
_ST_SUBMIT_INFO, _ST_MEMORY_ALLOCATE_INFO, _ST_FENCE_CREATE_INFO, _ST_QUERY_POOL_CREATE_INFO = 4, 5, 8, 11
_ST_BUFFER_CREATE_INFO, _ST_SHADER_MODULE_CREATE_INFO, _ST_PIPELINE_SHADER_STAGE_CREATE_INFO = 12, 16, 18
_ST_COMPUTE_PIPELINE_CREATE_INFO, _ST_PIPELINE_LAYOUT_CREATE_INFO = 29, 30
_ST_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, _ST_DESCRIPTOR_POOL_CREATE_INFO = 32, 33
_ST_DESCRIPTOR_SET_ALLOCATE_INFO, _ST_WRITE_DESCRIPTOR_SET = 34, 35
_ST_COMMAND_POOL_CREATE_INFO, _ST_COMMAND_BUFFER_ALLOCATE_INFO, _ST_COMMAND_BUFFER_BEGIN_INFO = 39, 40, 42
_ST_MEMORY_BARRIER = 46
_ST_PHYSICAL_DEVICE_FEATURES_2, _ST_PHYSICAL_DEVICE_PROPERTIES_2 = 1000059000, 1000059001
_ST_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES = 1000094000
_ST_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES = 1000083000
_ST_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES = 1000177000
_ST_PHYSICAL_DEVICE_DRIVER_PROPERTIES = 1000196000
_ST_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES = 1000082000
_ST_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES = 1000280000

# enums and flags
_SUCCESS, _NOT_READY, _TIMEOUT, _INCOMPLETE = 0, 1, 2, 5
_ERROR_OUT_OF_POOL_MEMORY, _ERROR_FRAGMENTED_POOL = -1000069000, -12
_ERROR_INCOMPATIBLE_DRIVER = -9
_RESULT_NAMES = {
    0: "VK_SUCCESS", 1: "VK_NOT_READY", 2: "VK_TIMEOUT", 3: "VK_EVENT_SET", 4: "VK_EVENT_RESET", 5: "VK_INCOMPLETE",
    -1: "VK_ERROR_OUT_OF_HOST_MEMORY", -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY", -3: "VK_ERROR_INITIALIZATION_FAILED",
    -4: "VK_ERROR_DEVICE_LOST", -5: "VK_ERROR_MEMORY_MAP_FAILED", -6: "VK_ERROR_LAYER_NOT_PRESENT",
    -7: "VK_ERROR_EXTENSION_NOT_PRESENT", -8: "VK_ERROR_FEATURE_NOT_PRESENT", -9: "VK_ERROR_INCOMPATIBLE_DRIVER",
    -10: "VK_ERROR_TOO_MANY_OBJECTS", -11: "VK_ERROR_FORMAT_NOT_SUPPORTED", -12: "VK_ERROR_FRAGMENTED_POOL",
    -13: "VK_ERROR_UNKNOWN", -1000069000: "VK_ERROR_OUT_OF_POOL_MEMORY",
    -1000072003: "VK_ERROR_INVALID_EXTERNAL_HANDLE", -1000161000: "VK_ERROR_FRAGMENTATION",
    -1000257000: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS", 1000297000: "VK_PIPELINE_COMPILE_REQUIRED",
    -1000011001: "VK_ERROR_VALIDATION_FAILED_EXT", -1000012000: "VK_ERROR_INVALID_SHADER_NV",
}
_DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}
#: the order of the device index: GPUs first, CPU devices (lavapipe, SwiftShader) last
_TYPE_ORDER = {2: 0, 1: 1, 3: 2, 0: 3, 4: 4}
_VENDORS = {0x1002: "AMD", 0x1010: "Imagination", 0x10DE: "NVIDIA", 0x13B5: "ARM", 0x14E4: "Broadcom",
            0x5143: "Qualcomm", 0x8086: "Intel", 0x106B: "Apple", 0x1AE0: "Google", 0x19E5: "Huawei",
            0x10001: "Vivante", 0x10002: "VeriSilicon", 0x10003: "Kazan", 0x10004: "Codeplay", 0x10005: "Mesa",
            0x10006: "PoCL", 0x10007: "MoltenVK"}
_MEM_DEVICE_LOCAL, _MEM_HOST_VISIBLE, _MEM_HOST_COHERENT = 1, 2, 4
_HEAP_DEVICE_LOCAL = 1
_QUEUE_COMPUTE = 2
_BUFFER_USAGE = 0x1 | 0x2 | 0x20  # TRANSFER_SRC | TRANSFER_DST | STORAGE_BUFFER
_DESCRIPTOR_STORAGE_BUFFER = 7
_STAGE_COMPUTE = 0x20
_BIND_POINT_COMPUTE = 1
_COMMAND_POOL_RESET_BUFFER = 2
_ONE_TIME_SUBMIT = 1
_QUERY_TIMESTAMP = 2
_QUERY_RESULT_64_WAIT = 1 | 2
_PIPE_TOP, _PIPE_COMPUTE, _PIPE_TRANSFER, _PIPE_BOTTOM = 0x1, 0x800, 0x1000, 0x2000
_PIPE_HOST, _PIPE_ALL = 0x4000, 0x10000
_ACCESS_SHADER_RW, _ACCESS_TRANSFER_RW, _ACCESS_HOST_READ = 0x20 | 0x40, 0x800 | 0x1000, 0x2000
_ACCESS_MEMORY_RW = 0x8000 | 0x10000
_ENUMERATE_PORTABILITY = 1
_WHOLE_SIZE = (1 << 64) - 1


def _version(v: int) -> Tuple[int, int, int]:
    return (v >> 22) & 0x7F, (v >> 12) & 0x3FF, v & 0xFFF


def _make_version(major: int, minor: int, patch: int = 0) -> int:
    return (major << 22) | (minor << 12) | patch


_V1_1, _V1_2, _V1_3 = _make_version(1, 1), _make_version(1, 2), _make_version(1, 3)

# the functions used: name -> (restype, argtypes); pointers and dispatchable handles are c_void_p
_I = _i32
_PROTOTYPES: Dict[str, Tuple[Any, List[Any]]] = {
    # global
    "vkEnumerateInstanceVersion": (_I, [_p]),
    "vkEnumerateInstanceExtensionProperties": (_I, [ctypes.c_char_p, _p, _p]),
    "vkCreateInstance": (_I, [_p, _p, _p]),
    # instance
    "vkDestroyInstance": (None, [_p, _p]),
    "vkEnumeratePhysicalDevices": (_I, [_p, _p, _p]),
    "vkGetPhysicalDeviceProperties": (None, [_p, _p]),
    "vkGetPhysicalDeviceProperties2": (None, [_p, _p]),
    "vkGetPhysicalDeviceFeatures": (None, [_p, _p]),
    "vkGetPhysicalDeviceFeatures2": (None, [_p, _p]),
    "vkGetPhysicalDeviceMemoryProperties": (None, [_p, _p]),
    "vkGetPhysicalDeviceQueueFamilyProperties": (None, [_p, _p, _p]),
    "vkEnumerateDeviceExtensionProperties": (_I, [_p, ctypes.c_char_p, _p, _p]),
    "vkCreateDevice": (_I, [_p, _p, _p, _p]),
    "vkGetDeviceProcAddr": (_p, [_p, ctypes.c_char_p]),
    # device
    "vkDestroyDevice": (None, [_p, _p]),
    "vkGetDeviceQueue": (None, [_p, _u32, _u32, _p]),
    "vkDeviceWaitIdle": (_I, [_p]),
    "vkCreateBuffer": (_I, [_p, _p, _p, _p]),
    "vkDestroyBuffer": (None, [_p, _H, _p]),
    "vkGetBufferMemoryRequirements": (None, [_p, _H, _p]),
    "vkAllocateMemory": (_I, [_p, _p, _p, _p]),
    "vkFreeMemory": (None, [_p, _H, _p]),
    "vkBindBufferMemory": (_I, [_p, _H, _H, _u64]),
    "vkMapMemory": (_I, [_p, _H, _u64, _u64, _u32, _p]),
    "vkUnmapMemory": (None, [_p, _H]),
    "vkCreateShaderModule": (_I, [_p, _p, _p, _p]),
    "vkDestroyShaderModule": (None, [_p, _H, _p]),
    "vkCreateDescriptorSetLayout": (_I, [_p, _p, _p, _p]),
    "vkDestroyDescriptorSetLayout": (None, [_p, _H, _p]),
    "vkCreatePipelineLayout": (_I, [_p, _p, _p, _p]),
    "vkDestroyPipelineLayout": (None, [_p, _H, _p]),
    "vkCreateComputePipelines": (_I, [_p, _H, _u32, _p, _p, _p]),
    "vkDestroyPipeline": (None, [_p, _H, _p]),
    "vkCreateDescriptorPool": (_I, [_p, _p, _p, _p]),
    "vkDestroyDescriptorPool": (None, [_p, _H, _p]),
    "vkResetDescriptorPool": (_I, [_p, _H, _u32]),
    "vkAllocateDescriptorSets": (_I, [_p, _p, _p]),
    "vkUpdateDescriptorSets": (None, [_p, _u32, _p, _u32, _p]),
    "vkCreateCommandPool": (_I, [_p, _p, _p, _p]),
    "vkDestroyCommandPool": (None, [_p, _H, _p]),
    "vkAllocateCommandBuffers": (_I, [_p, _p, _p]),
    "vkBeginCommandBuffer": (_I, [_p, _p]),
    "vkEndCommandBuffer": (_I, [_p]),
    "vkCmdBindPipeline": (None, [_p, _u32, _H]),
    "vkCmdBindDescriptorSets": (None, [_p, _u32, _H, _u32, _u32, _p, _u32, _p]),
    "vkCmdPushConstants": (None, [_p, _H, _u32, _u32, _u32, _p]),
    "vkCmdDispatch": (None, [_p, _u32, _u32, _u32]),
    "vkCmdCopyBuffer": (None, [_p, _H, _H, _u32, _p]),
    "vkCmdPipelineBarrier": (None, [_p, _u32, _u32, _u32, _u32, _p, _u32, _p, _u32, _p]),
    "vkCmdResetQueryPool": (None, [_p, _H, _u32, _u32]),
    "vkCmdWriteTimestamp": (None, [_p, _u32, _H, _u32]),
    "vkQueueSubmit": (_I, [_p, _u32, _p, _H]),
    "vkCreateFence": (_I, [_p, _p, _p, _p]),
    "vkDestroyFence": (None, [_p, _H, _p]),
    "vkWaitForFences": (_I, [_p, _u32, _p, _u32, _u64]),
    "vkResetFences": (_I, [_p, _u32, _p]),
    "vkCreateQueryPool": (_I, [_p, _p, _p, _p]),
    "vkDestroyQueryPool": (None, [_p, _H, _p]),
    "vkGetQueryPoolResults": (_I, [_p, _H, _u32, _u32, ctypes.c_size_t, _p, _u64, _u32]),
}
_GLOBAL_FUNCTIONS = ("vkEnumerateInstanceVersion", "vkEnumerateInstanceExtensionProperties", "vkCreateInstance")
_INSTANCE_FUNCTIONS = ("vkDestroyInstance", "vkEnumeratePhysicalDevices", "vkGetPhysicalDeviceProperties",
                       "vkGetPhysicalDeviceProperties2", "vkGetPhysicalDeviceFeatures", "vkGetPhysicalDeviceFeatures2",
                       "vkGetPhysicalDeviceMemoryProperties", "vkGetPhysicalDeviceQueueFamilyProperties",
                       "vkEnumerateDeviceExtensionProperties", "vkCreateDevice", "vkGetDeviceProcAddr")
_FUNCTYPE = ctypes.WINFUNCTYPE if sys.platform == "win32" else ctypes.CFUNCTYPE  # VKAPI_CALL: stdcall on Windows


def _result_name(code: int) -> str:
    return _RESULT_NAMES.get(code, "VkResult %d" % code)


def _check(call: str, code: int, what: str = "") -> None:
    if code < 0:
        raise GpuError("%s failed: %s%s" % (call, _result_name(code), (" (%s)" % what) if what else ""))


# ---------------------------------------------------------------------------------------------------------------
# the loader
def _library_candidates() -> List[str]:
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return [override]
    if sys.platform == "win32":
        return ["vulkan-1.dll"]
    if sys.platform == "darwin":
        return ["libvulkan.1.dylib", "libvulkan.dylib", "libMoltenVK.dylib"]
    return ["libvulkan.so.1", "libvulkan.so"]  # Android ships libvulkan.so only


_loader_lock = threading.Lock()
_loaded: Dict[str, Any] = {}


def _load_library() -> Tuple[Any, str]:
    """The loader library and its name; GpuUnavailable naming every name tried."""
    candidates = _library_candidates()
    with _loader_lock:
        for name in candidates:
            if name in _loaded:
                return _loaded[name], name
        errors = []
        for name in candidates:
            try:
                lib = ctypes.CDLL(name)
                lib.vkGetInstanceProcAddr  # noqa: B018 (a loader exports it; anything else is not a loader)
            except (OSError, AttributeError) as e:
                errors.append("%s (%s)" % (name, e))
                continue
            _loaded[name] = lib
            return lib, name
    via = " (from %s)" % LIBRARY_ENV if os.environ.get(LIBRARY_ENV) else ""
    raise GpuUnavailable("this device has no Vulkan: tried %s%s; install the loader and a driver (e.g. apt-get "
                         "install libvulkan1 mesa-vulkan-drivers)" % ("; ".join(errors), via))


def library_loaded() -> bool:
    """Whether this process has loaded a Vulkan loader (and so may hold driver state and threads)."""
    return bool(_loaded)


def _quiet_mesa() -> None:
    # lavapipe prints a non-conformance warning to stderr when enumerated: it would land in CLI output and JSON
    # pipelines. The user's own setting wins.
    os.environ.setdefault("MESA_VK_IGNORE_CONFORMANCE_WARNING", "1")


class _Instance:
    """One VkInstance and the instance-level functions; enumerates the physical devices in index order."""

    def __init__(self) -> None:
        self.lib, self.library = _load_library()
        gipa = self.lib.vkGetInstanceProcAddr
        gipa.restype, gipa.argtypes = _p, [_p, ctypes.c_char_p]
        self._gipa = gipa
        self.handle = _p()
        self.fn: Dict[str, Any] = {}
        for name in _GLOBAL_FUNCTIONS:
            self._bind(name, None, required=name != "vkEnumerateInstanceVersion")
        version = _u32(_make_version(1, 0))
        if "vkEnumerateInstanceVersion" in self.fn:
            self.fn["vkEnumerateInstanceVersion"](ctypes.byref(version))
        self.api_version = min(version.value, _V1_3)
        extensions = _extension_names(lambda n, p: self.fn["vkEnumerateInstanceExtensionProperties"](None, n, p))
        _quiet_mesa()
        app_name = ctypes.create_string_buffer(b"tether_rpc")
        app = VkApplicationInfo(sType=_ST_APPLICATION_INFO, pApplicationName=ctypes.addressof(app_name),
                                pEngineName=ctypes.addressof(app_name), apiVersion=self.api_version)
        enable = [b"VK_KHR_portability_enumeration"] if "VK_KHR_portability_enumeration" in extensions else []
        names = (ctypes.c_char_p * max(len(enable), 1))(*enable)
        info = VkInstanceCreateInfo(sType=_ST_INSTANCE_CREATE_INFO, pApplicationInfo=ctypes.addressof(app),
                                    flags=_ENUMERATE_PORTABILITY if enable else 0, enabledExtensionCount=len(enable),
                                    ppEnabledExtensionNames=ctypes.cast(names, _p))
        code = self.fn["vkCreateInstance"](ctypes.byref(info), None, ctypes.byref(self.handle))
        if code in (_ERROR_INCOMPATIBLE_DRIVER, -3):
            raise GpuUnavailable("this device has no Vulkan driver: %s found no driver (vkCreateInstance: %s); "
                                 "install one (e.g. apt-get install mesa-vulkan-drivers)"
                                 % (self.library, _result_name(code)))
        _check("vkCreateInstance", code)
        for name in _INSTANCE_FUNCTIONS:
            self._bind(name, self.handle, required=not name.endswith("2"))

    def _bind(self, name: str, instance: Any, required: bool = True) -> None:
        address = self._gipa(instance, name.encode())
        if not address:
            if required:
                raise GpuUnavailable("%s: the Vulkan loader has no %s" % (self.library, name))
            return
        restype, argtypes = _PROTOTYPES[name]
        self.fn[name] = _FUNCTYPE(restype, *argtypes)(address)

    def physical_devices(self) -> List[Any]:
        """The physical devices in index order: discrete and integrated GPUs first, CPU devices last."""
        count = _u32()
        _check("vkEnumeratePhysicalDevices", self.fn["vkEnumeratePhysicalDevices"](self.handle, ctypes.byref(count),
                                                                                   None))
        handles = (_p * max(count.value, 1))()
        code = self.fn["vkEnumeratePhysicalDevices"](self.handle, ctypes.byref(count), handles)
        if code != _INCOMPLETE:
            _check("vkEnumeratePhysicalDevices", code)
        devices = [_PhysicalDevice(self, handles[i]) for i in range(count.value)]
        return sorted(devices, key=lambda d: _TYPE_ORDER.get(d.props.deviceType, 3))  # stable: the loader's order

    def destroy(self) -> None:
        if self.handle:
            self.fn["vkDestroyInstance"](self.handle, None)
            self.handle = _p()


def _extension_names(enumerate_fn: Callable[[Any, Any], int]) -> List[str]:
    count = _u32()
    _check("vkEnumerate*ExtensionProperties", enumerate_fn(ctypes.byref(count), None))
    props = (VkExtensionProperties * max(count.value, 1))()
    code = enumerate_fn(ctypes.byref(count), props)
    if code != _INCOMPLETE:
        _check("vkEnumerate*ExtensionProperties", code)
    return [props[i].extensionName.decode("utf-8", "replace") for i in range(count.value)]


class _PhysicalDevice:
    """What one physical device offers: properties, limits, memory types, queue families, extensions, features."""

    def __init__(self, instance: _Instance, handle: Any):
        fn = instance.fn
        self.handle = handle
        self.props = VkPhysicalDeviceProperties()
        fn["vkGetPhysicalDeviceProperties"](handle, ctypes.byref(self.props))
        self.limits = self.props.limits
        # the version both the instance and the device speak: what decides which core functions and structs exist
        self.api_version = min(self.props.apiVersion, instance.api_version)
        self.memory = VkPhysicalDeviceMemoryProperties()
        fn["vkGetPhysicalDeviceMemoryProperties"](handle, ctypes.byref(self.memory))
        count = _u32()
        fn["vkGetPhysicalDeviceQueueFamilyProperties"](handle, ctypes.byref(count), None)
        families = (VkQueueFamilyProperties * max(count.value, 1))()
        fn["vkGetPhysicalDeviceQueueFamilyProperties"](handle, ctypes.byref(count), families)
        self.queue_families = [families[i] for i in range(count.value)]
        self.extensions = _extension_names(
            lambda n, p: fn["vkEnumerateDeviceExtensionProperties"](handle, None, n, p))
        self.core = VkPhysicalDeviceFeatures()
        fn["vkGetPhysicalDeviceFeatures"](handle, ctypes.byref(self.core))
        # optional feature structs: chained only when the device knows them (core version or extension)
        self.chain: Dict[str, Any] = {}
        self.enable_extensions: List[str] = []
        has2 = self.api_version >= _V1_1 and "vkGetPhysicalDeviceFeatures2" in fn
        if has2:
            for key, cls, stype, core, ext in (
                    ("fp16", VkPhysicalDeviceShaderFloat16Int8Features,
                     _ST_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, _V1_2, "VK_KHR_shader_float16_int8"),
                    ("storage16", VkPhysicalDevice16BitStorageFeatures, _ST_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
                     _V1_1, "VK_KHR_16bit_storage"),
                    ("storage8", VkPhysicalDevice8BitStorageFeatures, _ST_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES,
                     _V1_2, "VK_KHR_8bit_storage"),
                    ("dot", VkPhysicalDeviceShaderIntegerDotProductFeatures,
                     _ST_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES, _V1_3,
                     "VK_KHR_shader_integer_dot_product")):
                if self.api_version >= core or ext in self.extensions:
                    self.chain[key] = cls(sType=stype)
                    if self.api_version < core:
                        self.enable_extensions.append(ext)
            self.features2 = VkPhysicalDeviceFeatures2(sType=_ST_PHYSICAL_DEVICE_FEATURES_2)
            _link(self.features2, list(self.chain.values()))
            fn["vkGetPhysicalDeviceFeatures2"](handle, ctypes.byref(self.features2))
        if self.api_version < _V1_1 and "VK_KHR_storage_buffer_storage_class" in self.extensions:
            self.enable_extensions.append("VK_KHR_storage_buffer_storage_class")  # SPIR-V's StorageBuffer class
        self.subgroup_size: Optional[int] = None
        self.driver_info = ""
        if has2 and "vkGetPhysicalDeviceProperties2" in fn:
            subgroup = VkPhysicalDeviceSubgroupProperties(sType=_ST_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
            driver = VkPhysicalDeviceDriverProperties(sType=_ST_PHYSICAL_DEVICE_DRIVER_PROPERTIES)
            chained = [subgroup] + ([driver] if self.api_version >= _V1_2 or "VK_KHR_driver_properties"
                                    in self.extensions else [])
            props2 = VkPhysicalDeviceProperties2(sType=_ST_PHYSICAL_DEVICE_PROPERTIES_2)
            _link(props2, chained)
            fn["vkGetPhysicalDeviceProperties2"](handle, ctypes.byref(props2))
            self.subgroup_size = int(subgroup.subgroupSize) or None
            if len(chained) > 1:
                self.driver_info = ("%s %s" % (driver.driverName.decode("utf-8", "replace"),
                                               driver.driverInfo.decode("utf-8", "replace"))).strip()

    def feature(self, key: str, field: str) -> bool:
        return key in self.chain and bool(getattr(self.chain[key], field))

    @property
    def fp16(self) -> bool:
        return self.feature("fp16", "shaderFloat16") and self.feature("storage16", "storageBuffer16BitAccess")

    @property
    def int8(self) -> bool:
        return self.feature("fp16", "shaderInt8") and self.feature("storage8", "storageBuffer8BitAccess")

    @property
    def int16(self) -> bool:
        return bool(self.core.shaderInt16) and self.feature("storage16", "storageBuffer16BitAccess")

    @property
    def int8_dot(self) -> bool:
        return self.feature("dot", "shaderIntegerDotProduct")

    def timestamp_bits(self, family: int) -> int:
        return int(self.queue_families[family].timestampValidBits)

    def compute_family(self) -> int:
        """A queue family with compute, preferring one whose queues have timestamps."""
        compute = [i for i, f in enumerate(self.queue_families) if f.queueFlags & _QUEUE_COMPUTE and f.queueCount]
        if not compute:
            raise GpuUnavailable("Vulkan device %s has no compute queue" % self.name)
        timed = [i for i in compute if self.queue_families[i].timestampValidBits]
        return (timed or compute)[0]

    @property
    def name(self) -> str:
        return self.props.deviceName.decode("utf-8", "replace")

    def device_local_bytes(self) -> int:
        heaps = [self.memory.memoryHeaps[i] for i in range(self.memory.memoryHeapCount)]
        local = [h.size for h in heaps if h.flags & _HEAP_DEVICE_LOCAL]
        return int(max(local or [h.size for h in heaps] or [0]))

    def unified_memory(self) -> bool:
        """Whether buffers can live in mapped memory without costing the kernels: the GPU shares the host's memory
        (integrated, CPU, virtual) or has no device-local memory at all."""
        flags = [self.memory.memoryTypes[i].propertyFlags for i in range(self.memory.memoryTypeCount)]
        mappable = any(f & (_MEM_HOST_VISIBLE | _MEM_HOST_COHERENT) == _MEM_HOST_VISIBLE | _MEM_HOST_COHERENT
                       for f in flags)
        no_local = not any(f & _MEM_DEVICE_LOCAL for f in flags)
        return mappable and (self.props.deviceType in (1, 3, 4) or no_local)

    def info(self, index: int) -> Dict[str, Any]:
        p, lim = self.props, self.limits
        vendor = _VENDORS.get(p.vendorID, "0x%04x" % p.vendorID)
        if p.vendorID == 0x10DE:  # NVIDIA packs its driver version 10.8.8.6
            d = p.driverVersion
            driver = "%d.%d.%d.%d" % (d >> 22, (d >> 14) & 0xFF, (d >> 6) & 0xFF, d & 0x3F)
        else:
            driver = "%d.%d.%d" % _version(p.driverVersion)
        return {
            "api": "vulkan", "index": index, "name": self.name, "vendor": vendor, "vendor_id": int(p.vendorID),
            "device_id": int(p.deviceID), "device_type": _DEVICE_TYPES.get(p.deviceType, str(p.deviceType)),
            "driver": driver, "driver_info": self.driver_info, "api_version": "%d.%d.%d" % _version(p.apiVersion),
            "compute_units": None,  # Vulkan does not say
            "memory_bytes": self.device_local_bytes(),
            "max_threads_per_block": int(lim.maxComputeWorkGroupInvocations),
            "max_block": [int(x) for x in lim.maxComputeWorkGroupSize],
            "max_grid": [int(x) for x in lim.maxComputeWorkGroupCount],
            "shared_memory_bytes": int(lim.maxComputeSharedMemorySize),
            "max_push_constants_bytes": int(lim.maxPushConstantsSize),
            "max_storage_buffers": int(lim.maxPerStageDescriptorStorageBuffers),
            "max_storage_buffer_bytes": int(lim.maxStorageBufferRange),
            "min_storage_buffer_offset_alignment": int(lim.minStorageBufferOffsetAlignment),
            "timestamp_period_ns": float(lim.timestampPeriod),
            "extensions": sorted(self.extensions),
            "fp16": self.fp16, "int8": self.int8, "int16": self.int16, "int8_dot": self.int8_dot,
            "fp64": bool(self.core.shaderFloat64), "int64": bool(self.core.shaderInt64),
            "subgroup_size": self.subgroup_size,
            "unified_memory": self.unified_memory(),
        }


def _link(head: Any, chain: Sequence[Any]) -> None:
    """Chain ``chain`` behind ``head`` through pNext (the objects must outlive the call)."""
    prev = head
    for item in chain:
        prev.pNext = ctypes.addressof(item)
        prev = item
    prev.pNext = None


# ---------------------------------------------------------------------------------------------------------------
# SPIR-V: the entry points and work-group sizes, read before the driver sees the code
_SPIRV_MAGIC = 0x07230203
_OP_ENTRY_POINT, _OP_EXECUTION_MODE, _OP_EXECUTION_MODE_ID = 15, 16, 331
_OP_CONSTANT, _OP_SPEC_CONSTANT, _OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE, _OP_DECORATE = 43, 50, 44, 51, 71
_MODEL_GLCOMPUTE, _MODE_LOCAL_SIZE, _MODE_LOCAL_SIZE_ID = 5, 17, 38
_DECORATION_BUILTIN, _BUILTIN_WORKGROUP_SIZE = 11, 25
#: the newest SPIR-V each Vulkan version takes
_SPIRV_VERSIONS = {(1, 0): (1, 0), (1, 1): (1, 3), (1, 2): (1, 5), (1, 3): (1, 6)}


def _spirv_string(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(4, "little") for w in words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_spirv(code: bytes) -> Tuple[np.ndarray, Tuple[int, int], Dict[str, Tuple[int, int, int]]]:
    """The module's words (host order, as vkCreateShaderModule takes them), its SPIR-V version and its GLCompute
    entry points with their work-group sizes; GpuBuildError naming the defect for anything that is not a
    well-formed module (drivers need not check: lavapipe, for one, takes anything)."""
    if not isinstance(code, (bytes, bytearray, memoryview)):
        raise GpuBuildError("SPIR-V code: expected bytes, got %s" % type(code).__name__)
    code = bytes(code)
    if len(code) < 20 or len(code) % 4:
        raise GpuBuildError("SPIR-V code: %d bytes is not a module (a 5-word header and whole 32-bit words)"
                            % len(code))
    words = np.frombuffer(code, dtype="<u4")
    if int(words[0]) != _SPIRV_MAGIC:
        words = np.frombuffer(code, dtype=">u4")
        if int(words[0]) != _SPIRV_MAGIC:
            raise GpuBuildError("SPIR-V code: bad magic number 0x%08x (expected 0x%08x)"
                                % (int(np.frombuffer(code[:4], "<u4")[0]), _SPIRV_MAGIC))
    words = words.astype(np.uint32)  # host order: what the driver reads
    w = words.tolist()
    entries: Dict[int, str] = {}
    sizes: Dict[int, Tuple[int, int, int]] = {}
    size_ids: Dict[int, Tuple[int, int, int]] = {}
    constants: Dict[int, int] = {}
    composites: Dict[int, List[int]] = {}
    workgroup_size_id = None
    i, n = 5, len(w)
    while i < n:
        count, op = w[i] >> 16, w[i] & 0xFFFF
        if count == 0 or i + count > n:
            raise GpuBuildError("SPIR-V code: the instruction at word %d (opcode %d) has word count %d, past the "
                                "end of the %d-word module" % (i, op, count, n))
        ins = w[i:i + count]
        if op == _OP_ENTRY_POINT and count >= 4 and ins[1] == _MODEL_GLCOMPUTE:
            entries[ins[2]] = _spirv_string(ins[3:])
        elif op == _OP_EXECUTION_MODE and count >= 6 and ins[2] == _MODE_LOCAL_SIZE:
            sizes[ins[1]] = (ins[3], ins[4], ins[5])
        elif op in (_OP_EXECUTION_MODE, _OP_EXECUTION_MODE_ID) and count >= 6 and ins[2] == _MODE_LOCAL_SIZE_ID:
            size_ids[ins[1]] = (ins[3], ins[4], ins[5])
        elif op in (_OP_CONSTANT, _OP_SPEC_CONSTANT) and count >= 4:
            constants[ins[2]] = ins[3]
        elif op in (_OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE) and count >= 3:
            composites[ins[2]] = ins[3:]
        elif (op == _OP_DECORATE and count >= 4 and ins[2] == _DECORATION_BUILTIN
              and ins[3] == _BUILTIN_WORKGROUP_SIZE):
            workgroup_size_id = ins[1]
        i += count
    for fid, ids in size_ids.items():
        if all(x in constants for x in ids):
            sizes[fid] = tuple(constants[x] for x in ids)  # type: ignore[assignment]
    if workgroup_size_id is not None:  # the WorkgroupSize built-in overrides every LocalSize
        parts = composites.get(workgroup_size_id, [])
        if len(parts) == 3 and all(x in constants for x in parts):
            sizes = {fid: tuple(constants[x] for x in parts) for fid in entries}  # type: ignore[misc]
    version = ((w[1] >> 16) & 0xFF, (w[1] >> 8) & 0xFF)
    return words, version, {name: sizes.get(fid, (0, 0, 0)) for fid, name in entries.items()}


# ---------------------------------------------------------------------------------------------------------------
class _Kernel:
    __slots__ = ("name", "pipeline", "layout", "set_layout", "n_buffers", "n_scalars", "local_size", "shared_bytes")

    def __init__(self, name: str, pipeline: int, layout: int, set_layout: int, n_buffers: int, n_scalars: int,
                 local_size: Tuple[int, int, int], shared_bytes: int):
        self.name, self.pipeline, self.layout, self.set_layout = name, pipeline, layout, set_layout
        self.n_buffers, self.n_scalars, self.local_size, self.shared_bytes = n_buffers, n_scalars, local_size, \
            shared_bytes


class VulkanProgram:
    """The kernels of one loaded SPIR-V module, by name."""

    def __init__(self, owner: "VulkanDevice", digest: str, kernels: Dict[str, _Kernel]):
        self.owner, self.digest, self.kernels = owner, digest, kernels

    def __repr__(self) -> str:
        return "VulkanProgram(%s, kernels=%s)" % (self.digest[:12], sorted(self.kernels))


class _Memory:
    """A buffer's Vulkan objects: VkBuffer, VkDeviceMemory and, when host visible, the mapped address."""
    __slots__ = ("buffer", "memory", "mapped", "size")

    def __init__(self, buffer: int, memory: int, mapped: Optional[int], size: int):
        self.buffer, self.memory, self.mapped, self.size = buffer, memory, mapped, size


_MAX_PENDING = 64  # submissions in flight before a launch waits for the oldest
_MAX_DESCRIPTOR_SETS = 512  # cached descriptor sets before the pools are reset
_POOL_SETS, _POOL_DESCRIPTORS = 128, 1024
_STAGING_BYTES = 16 << 20


class VulkanDevice(DeviceAPI):
    """One Vulkan device (``vulkan:INDEX``, GPUs first, CPU devices last) with one compute queue.

    ``memory``: ``"auto"`` (mapped buffers on unified-memory devices, device-local plus staging elsewhere),
    ``"mapped"`` or ``"staging"`` to force one; ``timeout_s``: how long ``synchronize`` waits.
    """

    name = "vulkan"
    dlpack_type = KDL_VULKAN

    @classmethod
    def available(cls) -> List[Dict[str, Any]]:
        try:
            inst = _Instance()
        except GpuUnavailable:
            return []
        try:
            return [pd.info(i) for i, pd in enumerate(inst.physical_devices())]
        finally:
            inst.destroy()

    def __init__(self, index: int = 0, memory: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(index)
        if memory not in ("auto", "mapped", "staging"):
            raise ValueError("memory=%r: expected auto, mapped or staging" % (memory,))
        self.timeout_s = float(timeout_s)
        self._lock = threading.RLock()
        self._closed = False
        self._device = _p()
        self._instance = _Instance()
        self._buffers: Dict[int, DeviceBuffer] = {}
        self._modules: Dict[str, int] = {}
        self._programs: Dict[Any, VulkanProgram] = {}
        self._pools: List[int] = []
        self._capacity: List[Tuple[int, int]] = []  # per pool: sets, storage-buffer descriptors
        self._room: List[List[int]] = []  # per pool: what is left of its capacity
        self._pool_index = 0
        self._sets: "collections.OrderedDict[Any, int]" = collections.OrderedDict()
        self._sets_allocated = 0
        self._pending: "collections.deque[Tuple[Any, int]]" = collections.deque()
        self._free_cmds: List[Any] = []
        self._free_fences: List[int] = []
        self._all_fences: List[int] = []
        self._command_pool = 0
        self._query_pool = 0
        self._staging: Optional[_Memory] = None
        self.fn: Dict[str, Any] = {}
        try:
            devices = self._instance.physical_devices()
            if not devices:
                raise GpuUnavailable("this device has no Vulkan device: %s lists none (install a driver, e.g. "
                                     "apt-get install mesa-vulkan-drivers)" % self._instance.library)
            if not 0 <= index < len(devices):
                raise GpuUnavailable("vulkan:%d: this device has %d Vulkan device(s): %s" % (
                    index, len(devices), ", ".join("vulkan:%d %s" % (i, d.name) for i, d in enumerate(devices))))
            self._pd = devices[index]
            self._mapped = self._pd.unified_memory() if memory == "auto" else memory == "mapped"
            self._create_device()
        except BaseException:
            self.close()
            raise

    # setup ----------------------------------------------------------------------------------------------------
    def _create_device(self) -> None:
        pd, inst = self._pd, self._instance
        self._family = pd.compute_family()
        priority = _f32(1.0)
        queue_info = VkDeviceQueueCreateInfo(sType=_ST_DEVICE_QUEUE_CREATE_INFO, queueFamilyIndex=self._family,
                                             queueCount=1, pQueuePriorities=ctypes.addressof(priority))
        ext_names = (ctypes.c_char_p * max(len(pd.enable_extensions), 1))(*[e.encode() for e in pd.enable_extensions])
        info = VkDeviceCreateInfo(sType=_ST_DEVICE_CREATE_INFO, queueCreateInfoCount=1,
                                  pQueueCreateInfos=ctypes.addressof(queue_info),
                                  enabledExtensionCount=len(pd.enable_extensions),
                                  ppEnabledExtensionNames=ctypes.cast(ext_names, _p))
        # enable what kernels may use (64-bit and 16-bit arithmetic, fp16/int8 storage, dot products) and leave
        # the rest off: robustBufferAccess, for one, costs every load a bounds check
        core = VkPhysicalDeviceFeatures(shaderInt64=pd.core.shaderInt64, shaderFloat64=pd.core.shaderFloat64,
                                        shaderInt16=pd.core.shaderInt16)
        if hasattr(pd, "features2"):
            features2 = VkPhysicalDeviceFeatures2(sType=_ST_PHYSICAL_DEVICE_FEATURES_2, features=core)
            chain = list(pd.chain.values())  # as queried: every bit the device supports
            _link(features2, chain)
            info.pNext = ctypes.addressof(features2)
        else:
            info.pEnabledFeatures = ctypes.addressof(core)
        _check("vkCreateDevice", inst.fn["vkCreateDevice"](pd.handle, ctypes.byref(info), None,
                                                           ctypes.byref(self._device)))
        gdpa = inst.fn["vkGetDeviceProcAddr"]
        fn = dict(inst.fn)
        missing = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            if name in _GLOBAL_FUNCTIONS or name in _INSTANCE_FUNCTIONS:
                continue
            address = gdpa(self._device, name.encode())
            if address:
                fn[name] = _FUNCTYPE(restype, *argtypes)(address)
            else:
                missing.append(name)
        self.fn = fn
        if missing:
            raise GpuUnavailable("Vulkan device %s lacks %s" % (pd.name, ", ".join(missing)))
        queue = _p()
        self.fn["vkGetDeviceQueue"](self._device, self._family, 0, ctypes.byref(queue))
        self._queue = queue
        pool_info = VkCommandPoolCreateInfo(sType=_ST_COMMAND_POOL_CREATE_INFO, flags=_COMMAND_POOL_RESET_BUFFER,
                                            queueFamilyIndex=self._family)
        self._command_pool = self._create("vkCreateCommandPool", pool_info)
        self._info = pd.info(self.index)
        self._info["memory"] = "mapped" if self._mapped else "staging"
        self._info["timestamps"] = bool(pd.timestamp_bits(self._family))

    def _create(self, call: str, info: Any, what: str = "") -> int:
        handle = _H()
        _check(call, self.fn[call](self._device, ctypes.byref(info), None, ctypes.byref(handle)), what)
        return int(handle.value)

    def _alive(self) -> None:
        if self._closed:
            raise GpuError("vulkan:%d is closed" % self.index)

    def info(self) -> Dict[str, Any]:
        self._alive()
        return dict(self._info, max_block=list(self._info["max_block"]), max_grid=list(self._info["max_grid"]),
                    extensions=list(self._info["extensions"]))

    # memory ---------------------------------------------------------------------------------------------------
    def _memory_type(self, type_bits: int, mapped: bool) -> List[int]:
        """Memory type indices for a buffer, best first."""
        mem = self._pd.memory
        want = (_MEM_HOST_VISIBLE | _MEM_HOST_COHERENT) if mapped else _MEM_DEVICE_LOCAL
        candidates = [i for i in range(mem.memoryTypeCount)
                      if type_bits & (1 << i) and mem.memoryTypes[i].propertyFlags & want == want]
        # a mapped buffer prefers device-local memory too (unified memory says so), a device-local one prefers
        # memory the host cannot see (the fast VRAM, not the small BAR window)
        if mapped:
            candidates.sort(key=lambda i: not mem.memoryTypes[i].propertyFlags & _MEM_DEVICE_LOCAL)
        else:
            candidates.sort(key=lambda i: bool(mem.memoryTypes[i].propertyFlags & _MEM_HOST_VISIBLE))
        return candidates

    def _create_memory(self, nbytes: int, mapped: bool) -> _Memory:
        size = max(4, (nbytes + 3) // 4 * 4)  # storage buffers are read in 32-bit words; Vulkan refuses size 0
        info = VkBufferCreateInfo(sType=_ST_BUFFER_CREATE_INFO, size=size, usage=_BUFFER_USAGE)
        buffer = self._create("vkCreateBuffer", info, "%d bytes" % size)
        memory = 0
        try:
            req = VkMemoryRequirements()
            self.fn["vkGetBufferMemoryRequirements"](self._device, buffer, ctypes.byref(req))
            types = self._memory_type(req.memoryTypeBits, mapped)
            if not types:
                raise GpuError("vulkan:%d has no %s memory type for a buffer" % (
                    self.index, "HOST_VISIBLE|HOST_COHERENT" if mapped else "DEVICE_LOCAL"))
            code = _SUCCESS
            for t in types:  # a full heap falls through to the next type
                handle = _H()
                alloc = VkMemoryAllocateInfo(sType=_ST_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                                             memoryTypeIndex=t)
                code = self.fn["vkAllocateMemory"](self._device, ctypes.byref(alloc), None, ctypes.byref(handle))
                if code == _SUCCESS:
                    memory = int(handle.value)
                    break
            _check("vkAllocateMemory", code, "%d bytes" % req.size)
            _check("vkBindBufferMemory", self.fn["vkBindBufferMemory"](self._device, buffer, memory, 0))
            address = None
            if mapped:
                ptr = _p()
                _check("vkMapMemory", self.fn["vkMapMemory"](self._device, memory, 0, _WHOLE_SIZE, 0,
                                                             ctypes.byref(ptr)))
                address = ptr.value
            return _Memory(buffer, memory, address, size)
        except BaseException:
            self.fn["vkDestroyBuffer"](self._device, buffer, None)
            if memory:
                self.fn["vkFreeMemory"](self._device, memory, None)
            raise

    def _destroy_memory(self, mem: _Memory) -> None:
        if mem.mapped is not None:
            self.fn["vkUnmapMemory"](self._device, mem.memory)
        self.fn["vkDestroyBuffer"](self._device, mem.buffer, None)
        self.fn["vkFreeMemory"](self._device, mem.memory, None)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError("alloc: nbytes must be >= 0, got %d" % nbytes)
        with self._lock:
            self._alive()
            mem = self._create_memory(nbytes, self._mapped)
            buf = DeviceBuffer(self, mem.buffer, nbytes, mem)
            self._buffers[mem.buffer] = buf
            return buf

    def _own(self, buf: Any, what: str) -> _Memory:
        if not isinstance(buf, DeviceBuffer) or buf.api is not self or self._buffers.get(buf.handle) is not buf:
            raise ValueError("%s: expected a live buffer of vulkan:%d, got %r" % (what, self.index, buf))
        return buf.extra

    def free(self, buf: DeviceBuffer) -> None:
        with self._lock:
            if self._closed:
                return
            mem = self._own(buf, "free")
            self.synchronize()  # a pending launch may still use it
            del self._buffers[buf.handle]
            for key in [k for k in self._sets if mem.buffer in k[1]]:
                del self._sets[key]  # its descriptor sets stay in the pool until the next reset
            self._destroy_memory(mem)

    @staticmethod
    def _range(buf: DeviceBuffer, offset: int, nbytes: int, what: str) -> None:
        if offset < 0 or offset + nbytes > buf.nbytes:
            raise ValueError("%s: bytes [%d, %d) are outside the %d-byte buffer" % (what, offset, offset + nbytes,
                                                                                   buf.nbytes))

    @staticmethod
    def _host(array: np.ndarray, what: str, writable: bool = False) -> np.ndarray:
        if not isinstance(array, np.ndarray) or not array.flags["C_CONTIGUOUS"]:
            raise ValueError("%s: expected a C-contiguous numpy array" % what)
        if writable and not array.flags["WRITEABLE"]:
            raise ValueError("%s: the numpy array is read-only" % what)
        return array

    def upload(self, buf: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None:
        array = self._host(array, "upload")
        with self._lock:
            self._alive()
            mem = self._own(buf, "upload")
            self._range(buf, int(offset), array.nbytes, "upload")
            if not array.nbytes:
                return
            self.synchronize()  # in queue order: after the launches that read or write it
            if mem.mapped is not None:
                ctypes.memmove(mem.mapped + int(offset), array.ctypes.data, array.nbytes)
                return
            src = array.reshape(-1).view(np.uint8)
            staging = self._staging_memory()
            for start in range(0, array.nbytes, staging.size):
                chunk = src[start:start + staging.size]
                ctypes.memmove(staging.mapped, chunk.ctypes.data, chunk.nbytes)
                self._copy_now(staging.buffer, 0, mem.buffer, int(offset) + start, chunk.nbytes)

    def download(self, buf: DeviceBuffer, out: np.ndarray, offset: int = 0) -> None:
        out = self._host(out, "download", writable=True)
        with self._lock:
            self._alive()
            mem = self._own(buf, "download")
            self._range(buf, int(offset), out.nbytes, "download")
            if not out.nbytes:
                return
            self.synchronize()
            if mem.mapped is not None:
                ctypes.memmove(out.ctypes.data, mem.mapped + int(offset), out.nbytes)
                return
            dst = out.reshape(-1).view(np.uint8)
            staging = self._staging_memory()
            for start in range(0, out.nbytes, staging.size):
                chunk = dst[start:start + staging.size]
                self._copy_now(mem.buffer, int(offset) + start, staging.buffer, 0, chunk.nbytes)
                ctypes.memmove(chunk.ctypes.data, staging.mapped, chunk.nbytes)

    def _staging_memory(self) -> _Memory:
        if self._staging is None:
            self._staging = self._create_memory(_STAGING_BYTES, True)
        return self._staging

    def _copy_now(self, src: int, src_offset: int, dst: int, dst_offset: int, nbytes: int) -> None:
        region = VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)
        self._submit(lambda cmd: self.fn["vkCmdCopyBuffer"](cmd, src, dst, 1, ctypes.byref(region)), "copy")
        self.synchronize()

    def copy(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0) -> None:
        nbytes, dst_offset, src_offset = int(nbytes), int(dst_offset), int(src_offset)
        with self._lock:
            self._alive()
            dmem, smem = self._own(dst, "copy (dst)"), self._own(src, "copy (src)")
            self._range(dst, dst_offset, nbytes, "copy (dst)")
            self._range(src, src_offset, nbytes, "copy (src)")
            if nbytes <= 0:
                return
            if dmem is smem and src_offset < dst_offset + nbytes and dst_offset < src_offset + nbytes:
                raise ValueError("copy: source bytes [%d, %d) overlap destination bytes [%d, %d) of one buffer"
                                 % (src_offset, src_offset + nbytes, dst_offset, dst_offset + nbytes))
            region = VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)
            self._submit(lambda cmd: self.fn["vkCmdCopyBuffer"](cmd, smem.buffer, dmem.buffer, 1,
                                                                ctypes.byref(region)), "copy")

    # code -----------------------------------------------------------------------------------------------------
    def load(self, code: bytes, kernels: Sequence[Dict[str, Any]]) -> VulkanProgram:
        words, version, entries = parse_spirv(code)
        digest = hashlib.sha256(words.tobytes()).hexdigest()
        infos = [dict(k) for k in kernels]
        key = (digest, tuple((k.get("name"), len(k.get("params", ())), len(k.get("scalars", ())),
                              tuple(k.get("block", ())), int(k.get("shared_bytes", 0))) for k in infos))
        with self._lock:
            self._alive()
            if key in self._programs:
                return self._programs[key]
            accepted = _SPIRV_VERSIONS.get(_version(self._pd.api_version)[:2], (1, 6))
            if version > accepted:
                raise GpuBuildError("SPIR-V %d.%d is newer than vulkan:%d (Vulkan %d.%d) accepts: SPIR-V %d.%d at most"
                                    % (version + (self.index,) + _version(self._pd.api_version)[:2] + accepted))
            for k in infos:
                self._check_kernel(k, entries)
            module = self._modules.get(digest)
            if module is None:
                mod_info = VkShaderModuleCreateInfo(sType=_ST_SHADER_MODULE_CREATE_INFO, codeSize=words.nbytes,
                                                    pCode=words.ctypes.data)
                try:
                    module = self._create("vkCreateShaderModule", mod_info, "%d-byte SPIR-V module" % words.nbytes)
                except GpuError as e:
                    raise GpuBuildError(str(e)) from None
                self._modules[digest] = module
            built: Dict[str, _Kernel] = {}
            try:
                for k in infos:
                    built[k["name"]] = self._build_kernel(module, k, entries[k["name"]])
            except BaseException:
                for kern in built.values():
                    self._destroy_kernel(kern)
                raise
            program = VulkanProgram(self, digest, built)
            self._programs[key] = program
            return program

    def _check_kernel(self, k: Dict[str, Any], entries: Dict[str, Tuple[int, int, int]]) -> None:
        name = k.get("name")
        if not isinstance(name, str) or not name:
            raise GpuBuildError("kernel launch info %r has no name" % (k,))
        if name not in entries:
            raise GpuBuildError("kernel %r: the SPIR-V module has no GLCompute entry point of that name (it has: %s)"
                                % (name, ", ".join(sorted(entries)) or "none"))
        block = tuple(int(b) for b in k.get("block", (1, 1, 1)))
        local = entries[name]
        if block != tuple(local):
            raise GpuBuildError("kernel %r: the SPIR-V's work-group size (LocalSize) is %s but the launch's block is "
                                "%s" % (name, tuple(local), block))
        lim = self._pd.limits
        threads = block[0] * block[1] * block[2]
        if threads > lim.maxComputeWorkGroupInvocations or any(
                b > m for b, m in zip(block, lim.maxComputeWorkGroupSize)):
            raise GpuBuildError("kernel %r: block %s (%d threads) exceeds vulkan:%d's work-group limits %s, %d threads"
                                % (name, block, threads, self.index, tuple(lim.maxComputeWorkGroupSize),
                                   lim.maxComputeWorkGroupInvocations))
        shared = int(k.get("shared_bytes", 0))
        if shared > lim.maxComputeSharedMemorySize:
            raise GpuBuildError("kernel %r: %d bytes of shared memory exceed vulkan:%d's %d" % (
                name, shared, self.index, lim.maxComputeSharedMemorySize))
        n_buffers, n_scalars = len(k.get("params", ())), len(k.get("scalars", ()))
        if n_buffers > lim.maxPerStageDescriptorStorageBuffers:
            raise GpuBuildError("kernel %r: %d buffers exceed vulkan:%d's %d storage buffers per stage" % (
                name, n_buffers, self.index, lim.maxPerStageDescriptorStorageBuffers))
        if 4 * n_scalars > lim.maxPushConstantsSize:
            raise GpuBuildError("kernel %r: %d scalars (%d bytes) exceed vulkan:%d's %d bytes of push constants" % (
                name, n_scalars, 4 * n_scalars, self.index, lim.maxPushConstantsSize))
        pd = self._pd
        # what each need takes (the capabilities tether.codegen.spirv declares for it): fp16 = Float16 and 16-bit
        # storage buffers, int8 = Int8 and 8-bit storage buffers, int16 = Int16 and 16-bit storage buffers
        have = {"fp16": pd.fp16, "int8": pd.int8, "int16": pd.int16, "int8_dot": pd.int8_dot,
                "subgroups": bool(pd.subgroup_size), "fp64": bool(pd.core.shaderFloat64),
                "int64": bool(pd.core.shaderInt64)}
        missing = [need for need in k.get("needs", ()) if not have.get(need, False)]
        if missing:
            raise GpuBuildError("kernel %r needs %s, which vulkan:%d (%s) lacks" % (
                name, ", ".join(missing), self.index, pd.name))

    def _build_kernel(self, module: int, k: Dict[str, Any], local: Tuple[int, int, int]) -> _Kernel:
        name = k["name"]
        n_buffers, n_scalars = len(k.get("params", ())), len(k.get("scalars", ()))
        bindings = (VkDescriptorSetLayoutBinding * max(n_buffers, 1))()
        for i in range(n_buffers):
            bindings[i] = VkDescriptorSetLayoutBinding(binding=i, descriptorType=_DESCRIPTOR_STORAGE_BUFFER,
                                                       descriptorCount=1, stageFlags=_STAGE_COMPUTE)
        set_info = VkDescriptorSetLayoutCreateInfo(sType=_ST_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                                   bindingCount=n_buffers, pBindings=ctypes.addressof(bindings))
        set_layout = self._create("vkCreateDescriptorSetLayout", set_info, "kernel %r" % name)
        layout = pipeline = 0
        try:
            set_layouts = (_H * 1)(set_layout)
            push = VkPushConstantRange(stageFlags=_STAGE_COMPUTE, offset=0, size=4 * n_scalars)
            layout_info = VkPipelineLayoutCreateInfo(sType=_ST_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1,
                                                     pSetLayouts=ctypes.addressof(set_layouts),
                                                     pushConstantRangeCount=1 if n_scalars else 0,
                                                     pPushConstantRanges=ctypes.addressof(push))
            layout = self._create("vkCreatePipelineLayout", layout_info, "kernel %r" % name)
            entry = ctypes.create_string_buffer(name.encode())
            stage = VkPipelineShaderStageCreateInfo(sType=_ST_PIPELINE_SHADER_STAGE_CREATE_INFO, stage=_STAGE_COMPUTE,
                                                    module=module, pName=ctypes.addressof(entry))
            pipe_info = VkComputePipelineCreateInfo(sType=_ST_COMPUTE_PIPELINE_CREATE_INFO, stage=stage,
                                                    layout=layout, basePipelineIndex=-1)
            handle = _H()
            code = self.fn["vkCreateComputePipelines"](self._device, 0, 1, ctypes.byref(pipe_info), None,
                                                       ctypes.byref(handle))
            if code != _SUCCESS:
                raise GpuBuildError("vkCreateComputePipelines failed for kernel %r: %s (the driver refused the "
                                    "SPIR-V)" % (name, _result_name(code)))
            pipeline = int(handle.value)
        except BaseException:
            if layout:
                self.fn["vkDestroyPipelineLayout"](self._device, layout, None)
            self.fn["vkDestroyDescriptorSetLayout"](self._device, set_layout, None)
            raise
        return _Kernel(name, pipeline, layout, set_layout, n_buffers, n_scalars, tuple(local),
                       int(k.get("shared_bytes", 0)))

    def _destroy_kernel(self, kern: _Kernel) -> None:
        self.fn["vkDestroyPipeline"](self._device, kern.pipeline, None)
        self.fn["vkDestroyPipelineLayout"](self._device, kern.layout, None)
        self.fn["vkDestroyDescriptorSetLayout"](self._device, kern.set_layout, None)

    # launches -------------------------------------------------------------------------------------------------
    def _kernel(self, program: Any, kernel: str) -> _Kernel:
        if not isinstance(program, VulkanProgram) or program.owner is not self:
            raise ValueError("launch: expected a program loaded on vulkan:%d, got %r" % (self.index, program))
        kern = program.kernels.get(kernel)
        if kern is None:
            raise ValueError("launch: the program has no kernel %r (it has: %s)" % (kernel,
                                                                                   ", ".join(sorted(program.kernels))))
        return kern

    def _record_launch(self, kern: _Kernel, args: Sequence[KernelArg], grid: Tuple[int, int, int],
                       block: Tuple[int, int, int]) -> Callable[[Any], None]:
        """Checks a launch's arguments and returns what records it into a command buffer."""
        if len(args) != kern.n_buffers + kern.n_scalars:
            raise ValueError("kernel %r takes %d buffers and %d int32 scalars, got %d arguments" % (
                kern.name, kern.n_buffers, kern.n_scalars, len(args)))
        grid, block = tuple(int(g) for g in grid), tuple(int(b) for b in block)
        if len(grid) != 3 or len(block) != 3:
            raise ValueError("kernel %r: grid and block are (x, y, z), got %s and %s" % (kern.name, grid, block))
        if block != kern.local_size:
            raise GpuError("kernel %r: block %s differs from the work-group size %s compiled into its SPIR-V" % (
                kern.name, block, kern.local_size))
        limit = tuple(self._pd.limits.maxComputeWorkGroupCount)
        if any(g < 0 or g > m for g, m in zip(grid, limit)):
            raise GpuError("kernel %r: grid %s is outside vulkan:%d's limit %s" % (kern.name, grid, self.index, limit))
        mems = [self._own(a, "kernel %r argument %d" % (kern.name, i)) for i, a in enumerate(args[:kern.n_buffers])]
        scalars = []
        for i, a in enumerate(args[kern.n_buffers:]):
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) or not \
                    -(1 << 31) <= int(a) < (1 << 31):
                raise ValueError("kernel %r argument %d: expected an int32 scalar, got %r" % (
                    kern.name, kern.n_buffers + i, a))
            scalars.append(int(a))
        dset = self._descriptor_set(kern, mems) if mems else None
        push = (_i32 * max(len(scalars), 1))(*scalars)
        fn = self.fn

        def record(cmd: Any) -> None:
            fn["vkCmdBindPipeline"](cmd, _BIND_POINT_COMPUTE, kern.pipeline)
            if dset is not None:
                sets = (_H * 1)(dset)
                fn["vkCmdBindDescriptorSets"](cmd, _BIND_POINT_COMPUTE, kern.layout, 0, 1, sets, 0, None)
            if scalars:
                fn["vkCmdPushConstants"](cmd, kern.layout, _STAGE_COMPUTE, 0, 4 * len(scalars), push)
            fn["vkCmdDispatch"](cmd, *grid)
        return record

    def launch(self, program: Any, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
               block: Tuple[int, int, int]) -> None:
        with self._lock:
            self._alive()
            record = self._record_launch(self._kernel(program, kernel), args, grid, block)
            self._submit(record, "kernel %r" % kernel)

    def timed(self, program: Any, kernel: str, args: Sequence[KernelArg], grid: Tuple[int, int, int],
              block: Tuple[int, int, int]) -> float:
        with self._lock:
            self._alive()
            record = self._record_launch(self._kernel(program, kernel), args, grid, block)
            bits = self._pd.timestamp_bits(self._family)
            if not bits:
                raise GpuError("vulkan:%d (%s) has no timestamps on its compute queue" % (self.index, self._pd.name))
            if not self._query_pool:
                info = VkQueryPoolCreateInfo(sType=_ST_QUERY_POOL_CREATE_INFO, queryType=_QUERY_TIMESTAMP,
                                             queryCount=2)
                self._query_pool = self._create("vkCreateQueryPool", info)
            self.synchronize()  # nothing else in flight: the first timestamp marks this launch's start
            pool, fn = self._query_pool, self.fn

            def timed_record(cmd: Any) -> None:
                fn["vkCmdResetQueryPool"](cmd, pool, 0, 2)
                fn["vkCmdWriteTimestamp"](cmd, _PIPE_TOP, pool, 0)
                record(cmd)
                fn["vkCmdWriteTimestamp"](cmd, _PIPE_BOTTOM, pool, 1)

            self._submit(timed_record, "kernel %r" % kernel)
            self.synchronize()
            stamps = (_u64 * 2)()
            _check("vkGetQueryPoolResults", fn["vkGetQueryPoolResults"](
                self._device, pool, 0, 2, ctypes.sizeof(stamps), stamps, 8, _QUERY_RESULT_64_WAIT))
            mask = (1 << bits) - 1 if bits < 64 else (1 << 64) - 1
            ticks = (int(stamps[1]) - int(stamps[0])) & mask
            return ticks * float(self._pd.limits.timestampPeriod) * 1e-9

    def _descriptor_set(self, kern: _Kernel, mems: List[_Memory]) -> int:
        key = (kern.set_layout, tuple(m.buffer for m in mems))
        dset = self._sets.get(key)
        if dset is not None:
            self._sets.move_to_end(key)
            return dset
        if self._sets_allocated >= _MAX_DESCRIPTOR_SETS:
            # bounded: wait until no command buffer uses a set, then start the pools afresh
            self.synchronize()
            for pool in self._pools:
                _check("vkResetDescriptorPool", self.fn["vkResetDescriptorPool"](self._device, pool, 0))
            self._sets.clear()
            self._sets_allocated, self._pool_index = 0, 0
            self._room = [list(c) for c in self._capacity]
        dset = self._allocate_set(kern.set_layout, len(mems))
        self._sets_allocated += 1
        infos = (VkDescriptorBufferInfo * len(mems))()
        writes = (VkWriteDescriptorSet * len(mems))()
        for i, m in enumerate(mems):
            infos[i] = VkDescriptorBufferInfo(buffer=m.buffer, offset=0, range=_WHOLE_SIZE)
            writes[i] = VkWriteDescriptorSet(sType=_ST_WRITE_DESCRIPTOR_SET, dstSet=dset, dstBinding=i,
                                             descriptorCount=1, descriptorType=_DESCRIPTOR_STORAGE_BUFFER,
                                             pBufferInfo=ctypes.addressof(infos[i]))
        self.fn["vkUpdateDescriptorSets"](self._device, len(mems), writes, 0, None)
        self._sets[key] = dset
        return dset

    def _allocate_set(self, set_layout: int, n_buffers: int) -> int:
        layouts = (_H * 1)(set_layout)
        while True:
            # the first pool with room, counted here: a Vulkan 1.0 driver need not report a full pool
            index = next((i for i in range(self._pool_index, len(self._pools))
                          if self._room[i][0] >= 1 and self._room[i][1] >= n_buffers), None)
            fresh = index is None
            if index is None:
                capacity = (_POOL_SETS, max(_POOL_DESCRIPTORS, n_buffers))
                sizes = VkDescriptorPoolSize(type=_DESCRIPTOR_STORAGE_BUFFER, descriptorCount=capacity[1])
                info = VkDescriptorPoolCreateInfo(sType=_ST_DESCRIPTOR_POOL_CREATE_INFO, maxSets=capacity[0],
                                                  poolSizeCount=1, pPoolSizes=ctypes.addressof(sizes))
                self._pools.append(self._create("vkCreateDescriptorPool", info))
                self._capacity.append(capacity)
                self._room.append(list(capacity))
                index = len(self._pools) - 1
            self._pool_index = index
            alloc = VkDescriptorSetAllocateInfo(sType=_ST_DESCRIPTOR_SET_ALLOCATE_INFO,
                                                descriptorPool=self._pools[index], descriptorSetCount=1,
                                                pSetLayouts=ctypes.addressof(layouts))
            handle = _H()
            code = self.fn["vkAllocateDescriptorSets"](self._device, ctypes.byref(alloc), ctypes.byref(handle))
            if code in (_ERROR_OUT_OF_POOL_MEMORY, _ERROR_FRAGMENTED_POOL) and not fresh:
                self._room[index] = [0, 0]  # full after all: the next pool, or a new one
                continue
            _check("vkAllocateDescriptorSets", code)
            self._room[index][0] -= 1
            self._room[index][1] -= n_buffers
            return int(handle.value)

    # submission -----------------------------------------------------------------------------------------------
    def _barrier(self, cmd: Any, src_stage: int, dst_stage: int, src_access: int, dst_access: int) -> None:
        barrier = VkMemoryBarrier(sType=_ST_MEMORY_BARRIER, srcAccessMask=src_access, dstAccessMask=dst_access)
        self.fn["vkCmdPipelineBarrier"](cmd, src_stage, dst_stage, 0, 1, ctypes.byref(barrier), 0, None, 0, None)

    def _submit(self, record: Callable[[Any], None], what: str) -> None:
        """Records one command buffer (after everything submitted before it, visible to the host when done) and
        submits it with a fence."""
        while len(self._pending) >= _MAX_PENDING:
            self._wait(1)
        if self._free_cmds:
            cmd = self._free_cmds.pop()
        else:
            cmd = _p()
            info = VkCommandBufferAllocateInfo(sType=_ST_COMMAND_BUFFER_ALLOCATE_INFO,
                                               commandPool=self._command_pool, commandBufferCount=1)
            _check("vkAllocateCommandBuffers", self.fn["vkAllocateCommandBuffers"](self._device, ctypes.byref(info),
                                                                                   ctypes.byref(cmd)))
        if self._free_fences:
            fence = self._free_fences.pop()
        else:
            fence = self._create("vkCreateFence", VkFenceCreateInfo(sType=_ST_FENCE_CREATE_INFO))
            self._all_fences.append(fence)
        try:
            begin = VkCommandBufferBeginInfo(sType=_ST_COMMAND_BUFFER_BEGIN_INFO, flags=_ONE_TIME_SUBMIT)
            _check("vkBeginCommandBuffer", self.fn["vkBeginCommandBuffer"](cmd, ctypes.byref(begin)), what)
            rw = _ACCESS_SHADER_RW | _ACCESS_TRANSFER_RW | _ACCESS_MEMORY_RW
            self._barrier(cmd, _PIPE_ALL, _PIPE_ALL, rw, rw)
            record(cmd)
            self._barrier(cmd, _PIPE_COMPUTE | _PIPE_TRANSFER, _PIPE_HOST, rw, _ACCESS_HOST_READ)
            _check("vkEndCommandBuffer", self.fn["vkEndCommandBuffer"](cmd), what)
            cmds = (_p * 1)(cmd)
            submit = VkSubmitInfo(sType=_ST_SUBMIT_INFO, commandBufferCount=1, pCommandBuffers=ctypes.addressof(cmds))
            _check("vkQueueSubmit", self.fn["vkQueueSubmit"](self._queue, 1, ctypes.byref(submit), fence), what)
        except BaseException:
            self._free_cmds.append(cmd)
            self._free_fences.append(fence)
            raise
        self._pending.append((cmd, fence))

    def _wait(self, count: int) -> None:
        """Waits the oldest ``count`` submissions and recycles their command buffers and fences."""
        batch = [self._pending[i] for i in range(min(count, len(self._pending)))]
        if not batch:
            return
        fences = (_H * len(batch))(*[f for _, f in batch])
        timeout_ns = min(max(int(self.timeout_s * 1e9), 0), (1 << 64) - 1)
        code = self.fn["vkWaitForFences"](self._device, len(batch), fences, 1, timeout_ns)
        if code == _TIMEOUT:
            raise GpuError("vulkan:%d: the kernel did not finish within %g s (vkWaitForFences)" % (self.index,
                                                                                                  self.timeout_s))
        _check("vkWaitForFences", code)
        _check("vkResetFences", self.fn["vkResetFences"](self._device, len(batch), fences))
        for cmd, fence in batch:
            self._pending.popleft()
            self._free_cmds.append(cmd)  # the pool's RESET_COMMAND_BUFFER flag lets Begin reset it
            self._free_fences.append(fence)

    def synchronize(self) -> None:
        with self._lock:
            self._alive()
            self._wait(len(self._pending))

    # teardown -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle = True
            if self._pending:
                try:
                    self._wait(len(self._pending))
                except GpuError as e:
                    # a kernel still running (or a lost device): destroying what it uses could crash the process,
                    # and vkDeviceWaitIdle has no timeout; the objects are left to the process's end
                    idle = "did not finish" not in str(e)
            if idle and self._device and "vkDestroyDevice" in self.fn and "vkDeviceWaitIdle" in self.fn:
                fn, dev = self.fn, self._device
                fn["vkDeviceWaitIdle"](dev)  # nothing is in flight; errors (device lost) must not stop the teardown
                for pool in self._pools:
                    fn["vkDestroyDescriptorPool"](dev, pool, None)
                for program in self._programs.values():
                    for kern in program.kernels.values():
                        self._destroy_kernel(kern)
                for module in self._modules.values():
                    fn["vkDestroyShaderModule"](dev, module, None)
                if self._query_pool:
                    fn["vkDestroyQueryPool"](dev, self._query_pool, None)
                for fence in self._all_fences:
                    fn["vkDestroyFence"](dev, fence, None)
                if self._command_pool:
                    fn["vkDestroyCommandPool"](dev, self._command_pool, None)  # frees its command buffers
                for buf in self._buffers.values():
                    self._destroy_memory(buf.extra)
                if self._staging is not None:
                    self._destroy_memory(self._staging)
                fn["vkDestroyDevice"](dev, None)
                self._device = _p()
            self._pools, self._capacity, self._room = [], [], []
            self._programs, self._modules, self._buffers, self._sets = {}, {}, {}, collections.OrderedDict()
            self._pending.clear()
            self._staging = None
            # the instance owns the device: destroying it under a kernel still running crashes the driver too
            if getattr(self, "_instance", None) is not None and not self._device:
                self._instance.destroy()

    def __enter__(self) -> "VulkanDevice":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "VulkanDevice(%d%s)" % (self.index, ", closed" if self._closed else "")


__all__ = ["VulkanDevice", "VulkanProgram", "parse_spirv", "library_loaded", "LIBRARY_ENV", "DEFAULT_TIMEOUT_S"]
