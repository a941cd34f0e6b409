package dev.tether.device;

import dev.tether.rpc.Json;

import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A loaded tether module (docs/abi.md), vetted before any of its code runs exactly as tether_rpc/module.py does:
 * ELF header (architecture, word size, byte order, shared object), then the JSON metadata in
 * {@code .tether_meta} (ABI version, target arch against e_machine, the functions, the CPU features it needs);
 * only then dlopen and dlsym of every function. Unloaded (dlclose) when the last holder releases it.
 */
final class NativeModule {
    static final int ABI_VERSION = 1;
    private static final Charset UTF8 = Charset.forName("UTF-8");
    // dlopen hands back the library already loaded from a path even if the file changed since: a path loaded
    // before is loaded again through a fresh copy, so the code that runs is always the file that was vetted.
    private static final Map<String, Integer> LOADED_PATHS = new HashMap<String, Integer>();
    private static int aliasCounter;

    final String label;
    final Map<String, Object> metadata;
    final Map<String, Long> functions = new LinkedHashMap<String, Long>();
    final Map<String, Map<String, Object>> functionInfo = new HashMap<String, Map<String, Object>>();
    final long setLauncher;
    final long poolLaunch;
    final long poolWorker;
    final long poolShutdown;
    private long lib;
    private int refs = 1;
    /** The device half of a GPU module (metadata "device"), built on the session's device; null for CPU modules. */
    GpuModule gpu;

    private NativeModule(String label, long lib, Map<String, Object> metadata) {
        this.label = label;
        this.lib = lib;
        this.metadata = metadata;
        setLauncher = NativeBridge.dlsym(lib, "tether_set_parallel_launcher");
        boolean pool = Long.valueOf(1).equals(metadata.get("thread_pool"));
        poolLaunch = pool ? NativeBridge.dlsym(lib, "tether_pool_launch") : 0;
        poolWorker = pool ? NativeBridge.dlsym(lib, "tether_pool_worker") : 0;
        poolShutdown = pool ? NativeBridge.dlsym(lib, "tether_pool_shutdown") : 0;
    }

    boolean hasPool() {
        return poolLaunch != 0 && poolWorker != 0 && poolShutdown != 0;
    }

    boolean loaded() {
        return lib != 0;
    }

    void acquire() {
        refs++;
    }

    void release() {
        if (refs > 0 && --refs == 0 && lib != 0) {
            if (gpu != null) {
                gpu.release();
            }
            NativeBridge.dlclose(lib);
            lib = 0;
        }
    }

    /** Every function a client may ask for: the library's CPU functions, then the GPU functions of "device". */
    List<String> functionNames() {
        List<String> out = new ArrayList<String>(functions.keySet());
        if (gpu != null) {
            out.addAll(gpu.functions.keySet());
        }
        return out;
    }

    @SuppressWarnings("unchecked")
    static NativeModule load(File file, GpuModule.DeviceOpener devices) throws DeviceError, IOException {
        String label = file.getName();
        ElfInfo elf = ElfInfo.open(file, label);
        Map<String, Object> meta;
        Map<String, Object> dev;
        byte[] deviceCode = null;
        try {
            checkElf(elf, label);
            meta = readMetadata(elf, label);
            dev = GpuModule.deviceEntry(meta, label);
            if (dev != null) {   // Vulkan and CUDA are refused; OpenCL code is read and checked before dlopen
                GpuModule.refuseOtherApis(dev, label);
                deviceCode = GpuModule.readCode(elf, dev, label);
            }
        } finally {
            elf.close();
        }
        CpuFeatures.checkModule(meta, label);
        // the device code is built before dlopen: a device that refuses it leaves nothing loaded behind
        GpuModule gpu = dev != null ? GpuModule.load(deviceCode, dev, label, devices) : null;
        String path = file.getCanonicalPath();
        long lib;
        synchronized (LOADED_PATHS) {
            Integer seen = LOADED_PATHS.get(path);
            if (seen == null) {
                lib = NativeBridge.dlopen(path);
            } else {
                File alias = new File(file.getParentFile(), "." + label + ".tether-" + (++aliasCounter) + ".so");
                copy(file, alias);
                try {
                    lib = NativeBridge.dlopen(alias.getPath());
                } finally {
                    alias.delete();  // the mapping outlives the name
                }
            }
            if (lib == 0) {
                throw new DeviceError("ModuleLoadError", "dlopen failed for " + label + ": " + NativeBridge.dlerror());
            }
            LOADED_PATHS.put(path, seen == null ? 1 : seen + 1);
        }
        NativeModule m = new NativeModule(label, lib, meta);
        m.gpu = gpu;
        // kernels compiled twice pick their version from the features this CPU reports (metadata "cpu_dispatch")
        CpuFeatures.setDispatchWord(lib, meta, label);
        List<String> missing = new ArrayList<String>();
        for (Object f : (List<Object>) meta.get("functions")) {
            Map<String, Object> info = (Map<String, Object>) f;
            String name = (String) info.get("name");
            long fn = NativeBridge.dlsym(lib, name);
            if (fn == 0) {
                missing.add(name);
            }
            m.functions.put(name, fn);
            m.functionInfo.put(name, info);
        }
        if (!missing.isEmpty()) {
            m.release();
            throw new DeviceError("ModuleLoadError", label + ": metadata lists " + Text.join(missing)
                    + " but the library does not export " + (missing.size() == 1 ? "it" : "them"));
        }
        if (meta.get("host_functions") instanceof List && !((List<Object>) meta.get("host_functions")).isEmpty()) {
            m.release();
            throw new DeviceError("ModuleLoadError", label + " calls host functions "
                    + meta.get("host_functions") + ", which this Java device server does not register: "
                    + "run it on rpc-server --functions");
        }
        return m;
    }

    private static void copy(File src, File dst) throws IOException {
        InputStream in = new FileInputStream(src);
        try {
            OutputStream out = new FileOutputStream(dst);
            try {
                byte[] buf = new byte[1 << 16];
                int n;
                while ((n = in.read(buf)) > 0) {
                    out.write(buf, 0, n);
                }
            } finally {
                out.close();
            }
        } finally {
            in.close();
        }
    }

    private static void checkElf(ElfInfo elf, String label) throws DeviceError {
        String here = ElfInfo.hostArch();
        String built = elf.machineName();
        String arch = ElfInfo.archOf(elf.machine);
        int expectedBits = arch == null ? elf.bits : (arch.equals("armv7") ? 32 : 64);
        if (elf.bits != expectedBits) {
            built += " (" + elf.bits + "-bit ELF)";
        }
        if (!elf.little) {
            built += " (big-endian)";
        }
        if (!built.equals(here)) {
            throw new DeviceError("ArchMismatch", label + " was built for " + built + " but this device is " + here
                    + ": rebuild it with the target for this device (e.g. `tether query` suggests one)");
        }
        if (!elf.isSharedObject()) {
            throw new DeviceError("ModuleLoadError", label + " is not a shared library (ELF type " + elf.type
                    + "); export modules with export_library");
        }
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> readMetadata(ElfInfo elf, String label) throws DeviceError, IOException {
        byte[] raw = elf.section(".tether_meta");
        if (raw == null) {
            throw new DeviceError("ModuleLoadError", label + " has no .tether_meta section: it is not a tether module "
                    + "(build it with tether.build and Module.export_library)");
        }
        int end = 0;
        while (end < raw.length && raw[end] != 0) {
            end++;
        }
        if (end == raw.length) {
            throw new DeviceError("ModuleLoadError", label + ": metadata in .tether_meta is not NUL-terminated "
                    + "(corrupt module)");
        }
        Object parsed;
        try {
            parsed = Json.parse(new String(raw, 0, end, UTF8));
        } catch (IllegalArgumentException e) {
            throw new DeviceError("ModuleLoadError", label + ": metadata in .tether_meta is not valid JSON: "
                    + e.getMessage());
        }
        if (!(parsed instanceof Map)) {
            throw new DeviceError("ModuleLoadError", label + ": metadata must be a JSON object");
        }
        Map<String, Object> meta = (Map<String, Object>) parsed;
        Object version = meta.get("abi_version");
        if (!Long.valueOf(ABI_VERSION).equals(version)) {
            throw new DeviceError("ModuleLoadError", label + " uses tether ABI version " + version
                    + " but this runtime speaks version " + ABI_VERSION + ": update the device runtime or rebuild "
                    + "the module with a matching tether");
        }
        Object target = meta.get("target");
        if (target instanceof Map) {
            Object arch = ((Map<String, Object>) target).get("arch");
            if (arch != null && !arch.equals(ElfInfo.archOf(elf.machine))) {
                throw new DeviceError("ModuleLoadError", label + ": metadata says arch '" + arch + "' but the ELF "
                        + "header says " + elf.machineName() + " (corrupt or mislabelled module)");
            }
        }
        Object funcs = meta.get("functions");
        boolean ok = funcs instanceof List;
        if (ok) {
            for (Object f : (List<Object>) funcs) {
                ok &= f instanceof Map && ((Map<String, Object>) f).get("name") instanceof String;
            }
        }
        if (!ok) {
            throw new DeviceError("ModuleLoadError", label + ": metadata 'functions' must be a list of objects with "
                    + "a 'name'");
        }
        return meta;
    }
}
