package dev.tether.device;

import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * This process's OpenCL library, found as tether_rpc/gpu/opencl.py finds it and opened by the bridge
 * (NativeBridge.clLoad: dlopen at run time, never linked, so a phone without OpenCL still loads the bridge), the
 * device listing in tether's order and each device's info() with the Python runtime's keys. An opened device is
 * {@link ClDevice}.
 */
final class OpenCL {
    static final String LIBRARY_ENV = "TETHER_OPENCL_LIBRARY";
    /**
     * Where the ICD loader or a vendor's library usually is: opencl.py's LIBRARY_CANDIDATES (less macOS's framework),
     * then Pixels' libOpenCL-pixel.so, which the app's manifest asks for beside libOpenCL.so.
     */
    static final String[] LIBRARY_CANDIDATES = {"libOpenCL.so.1", "libOpenCL.so",
            "/system/vendor/lib64/libOpenCL.so", "/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so",
            "/system/vendor/lib64/egl/libGLES_mali.so", "/vendor/lib64/egl/libGLES_mali.so",
            "/system/vendor/lib/libOpenCL.so", "/vendor/lib/libOpenCL.so", "/system/lib/libOpenCL.so",
            "/vendor/lib/egl/libGLES_mali.so", "libOpenCL-pixel.so"};

    static final int CL_PLATFORM_VERSION = 0x0901;
    static final int CL_PLATFORM_NAME = 0x0902;
    static final int CL_PLATFORM_VENDOR = 0x0903;
    static final int CL_DEVICE_TYPE = 0x1000;
    static final int CL_DEVICE_MAX_COMPUTE_UNITS = 0x1002;
    static final int CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS = 0x1003;
    static final int CL_DEVICE_MAX_WORK_GROUP_SIZE = 0x1004;
    static final int CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1005;
    static final int CL_DEVICE_MAX_CLOCK_FREQUENCY = 0x100C;
    static final int CL_DEVICE_MAX_MEM_ALLOC_SIZE = 0x1010;
    static final int CL_DEVICE_GLOBAL_MEM_SIZE = 0x101F;
    static final int CL_DEVICE_LOCAL_MEM_SIZE = 0x1023;
    static final int CL_DEVICE_PROFILING_TIMER_RESOLUTION = 0x1025;
    static final int CL_DEVICE_NAME = 0x102B;
    static final int CL_DEVICE_VENDOR = 0x102C;
    static final int CL_DRIVER_VERSION = 0x102D;
    static final int CL_DEVICE_VERSION = 0x102F;
    static final int CL_DEVICE_EXTENSIONS = 0x1030;
    static final int CL_DEVICE_OPENCL_C_VERSION = 0x103D;
    static final int CL_DEVICE_IL_VERSION = 0x105B;

    /** A kernel's "needs" -> the device extensions that provide it (any one suffices), as in opencl.py. */
    static final Map<String, String[]> NEEDS_EXTENSIONS = new LinkedHashMap<String, String[]>();

    static {
        NEEDS_EXTENSIONS.put("fp16", new String[]{"cl_khr_fp16"});
        NEEDS_EXTENSIONS.put("fp64", new String[]{"cl_khr_fp64"});
        NEEDS_EXTENSIONS.put("int8_dot", new String[]{"cl_khr_integer_dot_product", "cl_arm_integer_dot_product_int8"});
        NEEDS_EXTENSIONS.put("subgroups", new String[]{"cl_khr_subgroups"});
    }

    private static final Map<Integer, String> ERRORS = new HashMap<Integer, String>();

    static {
        String[] names = {"CL_SUCCESS", "CL_DEVICE_NOT_FOUND", "CL_DEVICE_NOT_AVAILABLE", "CL_COMPILER_NOT_AVAILABLE",
                "CL_MEM_OBJECT_ALLOCATION_FAILURE", "CL_OUT_OF_RESOURCES", "CL_OUT_OF_HOST_MEMORY",
                "CL_PROFILING_INFO_NOT_AVAILABLE", "CL_MEM_COPY_OVERLAP", "CL_IMAGE_FORMAT_MISMATCH",
                "CL_IMAGE_FORMAT_NOT_SUPPORTED", "CL_BUILD_PROGRAM_FAILURE", "CL_MAP_FAILURE",
                "CL_MISALIGNED_SUB_BUFFER_OFFSET", "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
                "CL_COMPILE_PROGRAM_FAILURE", "CL_LINKER_NOT_AVAILABLE", "CL_LINK_PROGRAM_FAILURE",
                "CL_DEVICE_PARTITION_FAILED", "CL_KERNEL_ARG_INFO_NOT_AVAILABLE"};
        for (int i = 0; i < names.length; i++) {
            ERRORS.put(-i, names[i]);
        }
        String[] invalid = {"CL_INVALID_VALUE", "CL_INVALID_DEVICE_TYPE", "CL_INVALID_PLATFORM", "CL_INVALID_DEVICE",
                "CL_INVALID_CONTEXT", "CL_INVALID_QUEUE_PROPERTIES", "CL_INVALID_COMMAND_QUEUE", "CL_INVALID_HOST_PTR",
                "CL_INVALID_MEM_OBJECT", "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR", "CL_INVALID_IMAGE_SIZE",
                "CL_INVALID_SAMPLER", "CL_INVALID_BINARY", "CL_INVALID_BUILD_OPTIONS", "CL_INVALID_PROGRAM",
                "CL_INVALID_PROGRAM_EXECUTABLE", "CL_INVALID_KERNEL_NAME", "CL_INVALID_KERNEL_DEFINITION",
                "CL_INVALID_KERNEL", "CL_INVALID_ARG_INDEX", "CL_INVALID_ARG_VALUE", "CL_INVALID_ARG_SIZE",
                "CL_INVALID_KERNEL_ARGS", "CL_INVALID_WORK_DIMENSION", "CL_INVALID_WORK_GROUP_SIZE",
                "CL_INVALID_WORK_ITEM_SIZE", "CL_INVALID_GLOBAL_OFFSET", "CL_INVALID_EVENT_WAIT_LIST",
                "CL_INVALID_EVENT", "CL_INVALID_OPERATION", "CL_INVALID_GL_OBJECT", "CL_INVALID_BUFFER_SIZE",
                "CL_INVALID_MIP_LEVEL", "CL_INVALID_GLOBAL_WORK_SIZE", "CL_INVALID_PROPERTY",
                "CL_INVALID_IMAGE_DESCRIPTOR", "CL_INVALID_COMPILER_OPTIONS", "CL_INVALID_LINKER_OPTIONS",
                "CL_INVALID_DEVICE_PARTITION_COUNT", "CL_INVALID_PIPE_SIZE", "CL_INVALID_DEVICE_QUEUE",
                "CL_INVALID_SPEC_ID", "CL_MAX_SIZE_RESTRICTION_EXCEEDED"};
        for (int i = 0; i < invalid.length; i++) {
            ERRORS.put(-30 - i, invalid[i]);
        }
        ERRORS.put(-1001, "CL_PLATFORM_NOT_FOUND_KHR");
        ERRORS.put(-1002, "the OpenCL library is not loaded");   // the bridge's own code, not cl.h's
    }

    private static final Charset UTF8 = Charset.forName("UTF-8");
    private static String loadedPath;

    private OpenCL() {
    }

    /** {@code -52} -> {@code "CL_INVALID_KERNEL_ARGS"}; an unknown code is named by its number. */
    static String errorName(int code) {
        String n = ERRORS.get(code);
        return n != null ? n : "CL error " + code;
    }

    /** The paths tried, in order: $TETHER_OPENCL_LIBRARY alone when set, else the candidates for this word size. */
    static List<String> libraryCandidates() {
        String env = System.getenv(LIBRARY_ENV);
        if (env != null && !env.isEmpty()) {
            return Collections.singletonList(env);
        }
        boolean bits64 = NativeBridge.pointerSize() == 8;
        List<String> out = new ArrayList<String>();
        for (String p : LIBRARY_CANDIDATES) {
            boolean lib64 = p.contains("/lib64/");
            boolean lib32 = (p.startsWith("/system/") || p.startsWith("/vendor/")) && p.contains("/lib/");
            if ((lib64 && !bits64) || (lib32 && bits64)) {
                continue;
            }
            out.add(p);
        }
        return out;
    }

    /** Loads the library once per process; GpuUnavailable naming every path tried when none loads. */
    static synchronized String load() throws DeviceError {
        if (loadedPath != null) {
            return loadedPath;
        }
        List<String> candidates = libraryCandidates();
        List<String> failures = new ArrayList<String>();
        for (String path : candidates) {
            String why = NativeBridge.clLoad(path);
            if (why == null) {
                loadedPath = path;
                return path;
            }
            boolean missing = why.contains("No such file") || why.contains("cannot open shared object")
                    || why.contains("not found");
            failures.add(path + (missing ? " not found" : " could not be loaded (" + why + ")"));
        }
        if (System.getenv(LIBRARY_ENV) != null && !System.getenv(LIBRARY_ENV).isEmpty()) {
            throw new DeviceError("GpuUnavailable", "this device has no OpenCL: " + failures.get(0) + " (named by "
                    + LIBRARY_ENV + ")");
        }
        throw new DeviceError("GpuUnavailable", "this device has no OpenCL: " + failures.get(0) + " (also tried "
                + Text.join(candidates.subList(1, candidates.size())) + "; set " + LIBRARY_ENV
                + " to the library's path)");
    }

    /** {platform, device} pairs in tether's order (ClError from a driver failing mid-listing). */
    static long[] devices() {
        return NativeBridge.clDevices();
    }

    /**
     * info() of every device, in index order: [] without a library or a driver; a driver failing mid-listing
     * raises ClError (device_info tells "no OpenCL" from "a broken driver").
     */
    static List<Map<String, Object>> listDevices() {
        try {
            load();
        } catch (DeviceError e) {
            return new ArrayList<Map<String, Object>>();
        }
        long[] pairs = devices();
        List<Map<String, Object>> out = new ArrayList<Map<String, Object>>();
        for (int i = 0; i + 1 < pairs.length; i += 2) {
            out.add(info(pairs[i], pairs[i + 1], i / 2));
        }
        return out;
    }

    private static String str(boolean platform, long handle, int param) {
        byte[] raw = NativeBridge.clInfo(platform, handle, param);
        int end = 0;
        while (end < raw.length && raw[end] != 0) {
            end++;
        }
        return new String(raw, 0, end, UTF8).trim();
    }

    /** A little-endian unsigned value of {@code bytes} bytes at {@code at} (every target we build is LE). */
    private static long word(byte[] raw, int at, int bytes) {
        long v = 0;
        for (int i = bytes - 1; i >= 0; i--) {
            v = v << 8 | (at + i < raw.length ? raw[at + i] & 0xff : 0);
        }
        return v;
    }

    private static long num(long device, int param, int bytes) {
        return word(NativeBridge.clInfo(false, device, param), 0, bytes);
    }

    /** The Python runtime's info(): same keys, same meaning (tether_rpc/gpu/opencl.py _device_info). */
    static Map<String, Object> info(long platform, long device, int index) {
        int sizeT = NativeBridge.pointerSize();
        List<Object> extensions = new ArrayList<Object>(new TreeSet<String>(
                Arrays.asList(str(false, device, CL_DEVICE_EXTENSIONS).split("\\s+"))));
        extensions.remove("");
        int dims = (int) num(device, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, 4);
        byte[] sizes = NativeBridge.clInfo(false, device, CL_DEVICE_MAX_WORK_ITEM_SIZES);
        List<Object> maxBlock = new ArrayList<Object>();
        for (int d = 0; d < 3; d++) {
            maxBlock.add(d < dims ? word(sizes, d * sizeT, sizeT) : 1L);
        }
        String il;
        try {
            il = str(false, device, CL_DEVICE_IL_VERSION);
            if (il.isEmpty()) {
                il = null;
            }
        } catch (ClError e) {   // OpenCL >= 2.1 only; older devices refuse the query
            il = null;
        }
        long kind = num(device, CL_DEVICE_TYPE, 8);
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("api", "opencl");
        m.put("index", (long) index);
        m.put("name", str(false, device, CL_DEVICE_NAME));
        m.put("vendor", str(false, device, CL_DEVICE_VENDOR));
        m.put("driver", str(false, device, CL_DRIVER_VERSION));
        m.put("version", str(false, device, CL_DEVICE_VERSION));
        m.put("opencl_c_version", str(false, device, CL_DEVICE_OPENCL_C_VERSION));
        m.put("platform", str(true, platform, CL_PLATFORM_NAME));
        m.put("platform_vendor", str(true, platform, CL_PLATFORM_VENDOR));
        m.put("platform_version", str(true, platform, CL_PLATFORM_VERSION));
        m.put("type", (kind & 4) != 0 ? "gpu" : (kind & 8) != 0 ? "accelerator" : (kind & 2) != 0 ? "cpu"
                : (kind & 16) != 0 ? "custom" : "other");
        m.put("compute_units", num(device, CL_DEVICE_MAX_COMPUTE_UNITS, 4));
        m.put("clock_mhz", num(device, CL_DEVICE_MAX_CLOCK_FREQUENCY, 4));
        m.put("memory_bytes", num(device, CL_DEVICE_GLOBAL_MEM_SIZE, 8));
        m.put("max_alloc_bytes", num(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, 8));
        m.put("max_threads_per_block", num(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeT));
        m.put("max_block", maxBlock);
        m.put("shared_memory_bytes", num(device, CL_DEVICE_LOCAL_MEM_SIZE, 8));
        m.put("timer_resolution_ns", num(device, CL_DEVICE_PROFILING_TIMER_RESOLUTION, sizeT));
        m.put("extensions", extensions);
        m.put("fp16", extensions.contains("cl_khr_fp16"));
        m.put("fp64", extensions.contains("cl_khr_fp64"));
        boolean dot = false;
        for (String e : NEEDS_EXTENSIONS.get("int8_dot")) {
            dot |= extensions.contains(e);
        }
        m.put("int8_dot", dot);
        m.put("il", il);
        return m;
    }

    /** {@code "OpenCL C 1.2 pocl"} -> {1, 2}; {0, 0} when there is none. */
    static int[] parseVersion(String text) {
        for (String word : text.split("\\s+")) {
            int dot = word.indexOf('.');
            if (dot > 0 && dot + 1 < word.length() && word.substring(0, dot).matches("\\d+")
                    && Character.isDigit(word.charAt(dot + 1))) {
                String minor = word.substring(dot + 1).replaceAll("\\D.*", "");
                return new int[]{Integer.parseInt(word.substring(0, dot)), Integer.parseInt(minor)};
            }
        }
        return new int[]{0, 0};
    }
}
