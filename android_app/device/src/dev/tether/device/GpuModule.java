package dev.tether.device;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The device half of a GPU module (docs/gpu.md "GPU modules", tether_rpc/gpu/module.py): the metadata's "device"
 * entry checked for shape, the code of section .tether_device checked against its length and sha256, built on the
 * session's OpenCL device, and the module's functions run as their launch sequences. Only OpenCL runs here; a
 * Vulkan or CUDA module is refused in one line.
 */
final class GpuModule {
    static final String DEVICE_SECTION = ".tether_device";
    static final long DEVICE_META_VERSION = 1;
    static final String[][] APIS = {{"opencl", "opencl-c", "OpenCL"}, {"vulkan", "spirv", "Vulkan"},
            {"cuda", "ptx", "CUDA"}};

    /** The session's device for a spec such as "opencl:0" (opened once; GpuUnavailable without one). */
    interface DeviceOpener {
        ClDevice open(String spec) throws DeviceError;
    }

    final String label;
    final ClDevice device;
    final ClDevice.Program program;
    final Map<String, Map<String, Object>> kernels = new HashMap<String, Map<String, Object>>();
    final Map<String, Map<String, Object>> functions = new LinkedHashMap<String, Map<String, Object>>();
    private final Map<String, GpuFunction> calls = new HashMap<String, GpuFunction>();

    private GpuModule(String label, ClDevice device, ClDevice.Program program, Map<String, Object> dev) {
        this.label = label;
        this.device = device;
        this.program = program;
        for (Map<String, Object> k : list(dev.get("kernels"))) {
            kernels.put((String) k.get("name"), k);
        }
        for (Map<String, Object> f : list(dev.get("functions"))) {
            functions.put((String) f.get("name"), f);
        }
    }

    @SuppressWarnings("unchecked")
    static List<Map<String, Object>> list(Object o) {
        List<Map<String, Object>> out = new ArrayList<Map<String, Object>>();
        if (o instanceof List) {
            for (Object x : (List<Object>) o) {
                if (x instanceof Map) {
                    out.add((Map<String, Object>) x);
                }
            }
        }
        return out;
    }

    static String title(String api) {
        for (String[] a : APIS) {
            if (a[0].equals(api)) {
                return a[2];
            }
        }
        return api;
    }

    /** The metadata's "device" entry, checked for shape as module.py's device_entry does; null for a CPU module. */
    @SuppressWarnings("unchecked")
    static Map<String, Object> deviceEntry(Map<String, Object> meta, String label) throws DeviceError {
        Object d = meta.get("device");
        if (d == null) {
            return null;
        }
        if (!(d instanceof Map) || !Long.valueOf(DEVICE_META_VERSION).equals(((Map<String, Object>) d).get("version"))) {
            throw new DeviceError("ModuleLoadError", label + ": metadata 'device' is not a version-"
                    + DEVICE_META_VERSION + " device entry (rebuild the module with a matching tether)");
        }
        Map<String, Object> dev = (Map<String, Object>) d;
        boolean known = false;
        StringBuilder expected = new StringBuilder();
        for (String[] a : APIS) {
            known |= a[0].equals(dev.get("api")) && a[1].equals(dev.get("format"));
            expected.append(expected.length() > 0 ? ", " : "").append(a[0]).append(" (").append(a[1]).append(")");
        }
        if (!known) {
            throw new DeviceError("ModuleLoadError", label + ": metadata 'device' names API " + repr(dev.get("api"))
                    + " with code format " + repr(dev.get("format")) + "; expected one of " + expected);
        }
        java.util.Set<Object> names = new java.util.HashSet<Object>();
        for (Map<String, Object> k : list(dev.get("kernels"))) {
            names.add(k.get("name"));
        }
        Object funcs = dev.get("functions");
        boolean ok = funcs instanceof List;
        if (ok) {
            for (Object f : (List<Object>) funcs) {
                ok &= f instanceof Map && ((Map<String, Object>) f).get("name") instanceof String;
            }
        }
        if (!ok) {
            throw new DeviceError("ModuleLoadError", label + ": metadata 'device' 'functions' must be a list of objects "
                    + "with a 'name'");
        }
        for (Map<String, Object> f : list(funcs)) {
            int nBufs = list(f.get("temporaries")).size() + (f.get("args") instanceof List
                    ? ((List<Object>) f.get("args")).size() : 0);
            for (Map<String, Object> launch : list(f.get("launches"))) {
                boolean good = names.contains(launch.get("kernel"));
                Object args = launch.get("args");
                if (args instanceof List) {
                    for (Object i : (List<Object>) args) {
                        good &= i instanceof Long && (Long) i >= 0 && (Long) i < nBufs;
                    }
                }
                if (!good) {
                    throw new DeviceError("ModuleLoadError", label + ": function " + f.get("name") + " launches "
                            + repr(launch.get("kernel")) + " with arguments " + args + ", which its metadata does not "
                            + "define (corrupt module)");
                }
            }
        }
        return dev;
    }

    private static String repr(Object o) {
        return o instanceof String ? "'" + o + "'" : String.valueOf(o);
    }

    /** A GPU API other than OpenCL: refused, as before, in one line. */
    static void refuseOtherApis(Map<String, Object> dev, String label) throws DeviceError {
        Object api = dev.get("api");
        if (!"opencl".equals(api)) {
            throw new DeviceError("ModuleLoadError", "this device runs CPU and OpenCL modules only; " + label
                    + " needs " + api + ", which is not available");
        }
    }

    /** The device code from section .tether_device, checked against the metadata's length and sha256. */
    static byte[] readCode(ElfInfo elf, Map<String, Object> dev, String label) throws DeviceError, java.io.IOException {
        byte[] sec = elf.section(DEVICE_SECTION);
        if (sec == null) {
            throw new DeviceError("ModuleLoadError", label + ": metadata has a 'device' entry but the file has no "
                    + DEVICE_SECTION + " section (corrupt module)");
        }
        Object want = dev.get("code_bytes");
        long n = want instanceof Long ? (Long) want : -1;
        byte[] code = null;
        if (n >= 0 && n <= sec.length) {
            code = java.util.Arrays.copyOf(sec, (int) n);
        }
        if (code == null || !ClDevice.sha256(code).equals(dev.get("code_sha256"))) {
            throw new DeviceError("ModuleLoadError", label + ": the device code in " + DEVICE_SECTION + " does not "
                    + "match the metadata's length and sha256 (corrupt module)");
        }
        return code;
    }

    /**
     * Opens the session's device "opencl:0" and builds the code there; GpuUnavailable / GpuBuildError /
     * ModuleLoadError in one line naming the module (no OpenCL, a missing feature, a block over the limits).
     */
    static GpuModule load(byte[] code, Map<String, Object> dev, String label, DeviceOpener opener)
            throws DeviceError {
        ClDevice device;
        try {
            device = opener.open("opencl:0");
        } catch (DeviceError e) {
            throw new DeviceError(e.type, label + " runs on OpenCL; " + e.getMessage(), e);
        }
        ClDevice.Program program;
        try {
            program = device.load(code, list(dev.get("kernels")));
        } catch (DeviceError e) {
            throw new DeviceError(e.type, label + ": " + e.getMessage(), e);
        }
        return new GpuModule(label, device, program, dev);
    }

    synchronized GpuFunction function(NativeModule module, String name) {
        GpuFunction f = calls.get(name);
        if (f == null) {
            f = new GpuFunction(module, this, name, functions.get(name));
            calls.put(name, f);
        }
        return f;
    }

    /** Frees every buffer the functions allocated (the device stays open: the session owns it). */
    synchronized void release() {
        for (GpuFunction f : calls.values()) {
            f.release();
        }
        calls.clear();
    }
}
