package dev.tether.device;

import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.lang.reflect.Field;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * tether.device_info: the same keys as tether_rpc/device_info.py, read from /proc and /sys (and, on Android,
 * from android.os.Build through reflection, so this class needs no Android API to compile or run on a desktop
 * JVM). A field that cannot be read is null (or an empty list), never an exception. The language versions
 * differ: "python" and friends are null, "java" and "java_vm" say what runs the server.
 */
final class DeviceInfo {
    private static final Charset UTF8 = Charset.forName("UTF-8");
    private static final Map<String, String> PARTS = new HashMap<String, String>();

    static {
        String[] arm = {"c05", "cortex-a5", "c07", "cortex-a7", "c08", "cortex-a8", "c09", "cortex-a9", "c0d",
                "cortex-a12", "c0e", "cortex-a17", "c0f", "cortex-a15", "d02", "cortex-a34", "d03", "cortex-a53", "d04",
                "cortex-a35", "d05", "cortex-a55", "d06", "cortex-a65", "d07", "cortex-a57", "d08", "cortex-a72", "d09",
                "cortex-a73", "d0a", "cortex-a75", "d0b", "cortex-a76", "d0c", "neoverse-n1", "d0d", "cortex-a77",
                "d0e", "cortex-a76ae", "d40", "neoverse-v1", "d41", "cortex-a78", "d44", "cortex-x1", "d46",
                "cortex-a510", "d47", "cortex-a710", "d48", "cortex-x2", "d49", "neoverse-n2", "d4d", "cortex-a715",
                "d4e", "cortex-x3", "d4f", "neoverse-v2", "d80", "cortex-a520", "d81", "cortex-a720", "d82", "cortex-x4"};
        for (int i = 0; i < arm.length; i += 2) {
            PARTS.put("41:" + Integer.parseInt(arm[i], 16), arm[i + 1]);
        }
        String[] qcom = {"800", "cortex-a73", "801", "cortex-a53", "802", "cortex-a75", "803", "cortex-a55", "804",
                "cortex-a76", "805", "cortex-a55"};
        for (int i = 0; i < qcom.length; i += 2) {
            PARTS.put("51:" + Integer.parseInt(qcom[i], 16), qcom[i + 1]);
        }
    }

    private DeviceInfo() {
    }

    /** What /proc/cpuinfo says (parse_cpuinfo). */
    static final class CpuInfo {
        String model;
        String hardware;
        String architecture;
        String featuresKey;
        final List<String> cores = new ArrayList<String>();
        final List<String> features = new ArrayList<String>();
    }

    static String read(String path, int limit) {
        try {
            InputStream in = new FileInputStream(path);
            try {
                byte[] buf = new byte[limit];
                int n = 0;
                int r;
                while (n < limit && (r = in.read(buf, n, limit - n)) > 0) {
                    n += r;
                }
                return new String(buf, 0, n, UTF8);
            } finally {
                in.close();
            }
        } catch (IOException e) {
            return null;
        }
    }

    private static Long readLong(String path) {
        String t = read(path, 64);
        try {
            return t == null ? null : Long.valueOf(t.trim());
        } catch (NumberFormatException e) {
            return null;
        }
    }

    private static Integer parseInt(String s) {
        try {
            s = s.trim();
            return s.startsWith("0x") ? Integer.parseInt(s.substring(2), 16) : Integer.parseInt(s);
        } catch (NumberFormatException e) {
            return null;
        }
    }

    static CpuInfo cpuInfo() {
        CpuInfo c = new CpuInfo();
        String text = read("/proc/cpuinfo", 1 << 20);
        TreeSet<String> features = new TreeSet<String>();
        TreeSet<String> cores = new TreeSet<String>();
        Integer implementer = null;
        for (String line : (text == null ? "" : text).split("\n")) {
            int colon = line.indexOf(':');
            if (colon < 0) {
                continue;
            }
            String key = line.substring(0, colon).trim().toLowerCase();
            String value = line.substring(colon + 1).trim();
            if ((key.equals("model name") || key.equals("processor")) && !value.isEmpty()
                    && !value.matches("\\d+") && c.model == null) {
                c.model = value;
            } else if (key.equals("hardware") && !value.isEmpty()) {
                c.hardware = value;
            } else if (key.equals("features") || key.equals("flags")) {
                for (String w : value.split("\\s+")) {
                    if (!w.isEmpty()) {
                        features.add(w);
                    }
                }
                c.featuresKey = key;
            } else if (key.equals("cpu architecture") && c.architecture == null) {
                c.architecture = value;
            } else if (key.equals("cpu implementer")) {
                implementer = parseInt(value);
            } else if (key.equals("cpu part")) {
                Integer part = parseInt(value);
                if (part != null) {
                    String name = PARTS.get(Integer.toHexString(implementer == null ? 0 : implementer) + ":" + part);
                    cores.add(name != null ? name : String.format("unknown-0x%x-0x%03x",
                            implementer == null ? 0 : implementer, part));
                }
            }
        }
        if (c.model == null) {
            c.model = c.hardware;
        }
        c.features.addAll(features);
        c.cores.addAll(cores);
        return c;
    }

    static boolean isAndroid() {
        return System.getenv("ANDROID_ROOT") != null || System.getenv("ANDROID_DATA") != null
                || new File("/system/build.prop").exists() || buildField("VERSION", "RELEASE") != null;
    }

    /** android.os.Build[.$inner].name through reflection (null off Android or if absent on this API level). */
    static Object buildField(String inner, String name) {
        try {
            Class<?> cls = Class.forName(inner == null ? "android.os.Build" : "android.os.Build$" + inner);
            Field f = cls.getField(name);
            return f.get(null);
        } catch (Exception e) {
            return null;
        }
    }

    static String suggestTarget(String arch, List<String> cores, boolean android) {
        if (arch.equals("aarch64")) {
            if (android) {
                return "android-arm64";
            }
            String[][] presets = {{"cortex-a76", "rasp5"}, {"cortex-a72", "rasp4b"}, {"cortex-a57", "jetson-nano"}};
            for (String[] p : presets) {
                if (cores.contains(p[0])) {
                    return p[1];
                }
            }
            return "aarch64";
        }
        if (arch.equals("armv7")) {
            if (cores.contains("cortex-a53")) {
                return "rasp3b";
            }
            if (cores.contains("cortex-a7")) {
                return "armv7-a7";
            }
            return "armv7";
        }
        return arch;
    }

    /** The native ABI this server's bridge is built for: Android's names on Android, tether's arch elsewhere. */
    static String abi(String arch, boolean android) {
        if (!android) {
            return arch;
        }
        return arch.equals("aarch64") ? "arm64-v8a" : arch.equals("armv7") ? "armeabi-v7a" : arch;
    }

    private static Double temperature() {
        File[] zones = new File("/sys/class/thermal").listFiles();
        if (zones == null) {
            return null;
        }
        java.util.Arrays.sort(zones);
        List<File> ordered = new ArrayList<File>();
        for (File z : zones) {
            String type = read(z.getPath() + "/type", 256);
            String t = type == null ? "" : type.toLowerCase();
            if (z.getName().startsWith("thermal_zone") && (t.contains("cpu") || t.contains("soc")
                    || t.contains("x86_pkg") || t.contains("cluster"))) {
                ordered.add(z);
            }
        }
        for (File z : zones) {
            if (z.getName().startsWith("thermal_zone") && !ordered.contains(z)) {
                ordered.add(z);
            }
        }
        for (File z : ordered) {
            Long milli = readLong(z.getPath() + "/temp");
            if (milli != null && milli > -50000 && milli < 200000) {
                return milli / 1000.0;
            }
        }
        return null;
    }

    private static String stripped(String s) {
        if (s == null) {
            return null;
        }
        String t = s.replace("\0", "").trim();
        return t.isEmpty() ? null : t;
    }

    static Map<String, Object> collect() {
        String arch = ElfInfo.hostArch();
        CpuInfo cpu = cpuInfo();
        boolean android = isAndroid();
        Map<String, Object> info = new LinkedHashMap<String, Object>();
        info.put("arch", arch);
        info.put("machine", System.getProperty("os.arch"));
        info.put("pointer_bits", (long) NativeBridge.pointerSize() * 8);
        info.put("abi", abi(arch, android));
        info.put("cpu_model", cpu.model);
        String board = read("/proc/device-tree/model", 256);
        if (board == null) {
            board = read("/sys/firmware/devicetree/base/model", 256);
        }
        info.put("board", stripped(board));
        info.put("cpu_cores", new ArrayList<Object>(cpu.cores));
        info.put("cpu_features", new ArrayList<Object>(cpu.features));
        Map<String, Object> caps = new LinkedHashMap<String, Object>(CpuFeatures.thisCpu());
        caps.remove("suggested_target");
        info.put("cpu_capabilities", caps);
        long cores = Runtime.getRuntime().availableProcessors();
        info.put("num_cores", cores);
        info.put("usable_cores", cores);
        info.put("parallel_threads", (long) NativePool.numThreads());
        Long[] mem = memory();
        info.put("memory_bytes", mem[0]);
        info.put("memory_available_bytes", mem[1]);
        Map<String, Object> os = new LinkedHashMap<String, Object>();
        os.put("system", System.getProperty("os.name"));
        os.put("release", System.getProperty("os.version"));
        os.put("version", stripped(read("/proc/sys/kernel/version", 256)));
        Map<String, String> osr = osRelease();
        os.put("name", osr.containsKey("PRETTY_NAME") ? osr.get("PRETTY_NAME") : osr.get("NAME"));
        os.put("id", osr.get("ID"));
        os.put("android", android);
        Object release = buildField("VERSION", "RELEASE");
        os.put("android_version", android && release != null ? String.valueOf(release) : null);
        info.put("os", os);
        if (android) {
            Map<String, Object> a = new LinkedHashMap<String, Object>();
            a.put("sdk_int", buildField("VERSION", "SDK_INT"));
            a.put("manufacturer", buildField(null, "MANUFACTURER"));
            a.put("model", buildField(null, "MODEL"));
            a.put("hardware", buildField(null, "HARDWARE"));
            a.put("soc_manufacturer", buildField(null, "SOC_MANUFACTURER"));
            a.put("soc_model", buildField(null, "SOC_MODEL"));
            Object abis = buildField(null, "SUPPORTED_ABIS");
            a.put("abis", abis instanceof String[] ? java.util.Arrays.asList((Object[]) abis) : null);
            info.put("android", a);
        }
        String cpufreq = "/sys/devices/system/cpu/cpu0/cpufreq/";
        info.put("governor", stripped(read(cpufreq + "scaling_governor", 256)));
        info.put("cpu_max_khz", readLong(cpufreq + "cpuinfo_max_freq"));
        info.put("cpu_cur_khz", readLong(cpufreq + "scaling_cur_freq"));
        info.put("temperature_c", temperature());
        info.put("python", null);
        info.put("python_implementation", null);
        info.put("tether_rpc", "0.1.0");
        info.put("numpy", null);
        info.put("msgpack", null);
        info.put("java", System.getProperty("java.version"));
        info.put("java_vm", System.getProperty("java.vm.name"));
        info.put("server", DeviceServer.SERVER_NAME);
        info.put("suggested_target", suggestTarget(arch, cpu.cores, android));
        // the OpenCL devices, listed as tether_rpc.device_info lists them (Vulkan and CUDA do not run here)
        Object[] gpus = listGpus();
        info.put("gpus", gpus[0]);
        info.put("gpu_errors", gpus[1]);
        return info;
    }

    /** Seconds a driver may take to list its devices before device_info gives up on it (as the Python runtime). */
    static final long GPU_LIST_TIMEOUT_MS = 20000;
    private static Thread probe;

    /**
     * {gpus, gpu_errors}: every OpenCL device's info() with "spec" ("opencl:N"), listed in a daemon thread so a
     * driver that hangs costs that thread, never the session; a driver failing mid-listing is one error line.
     */
    static synchronized Object[] listGpus() {
        final List<Object> gpus = new ArrayList<Object>();
        final List<Object> errors = new ArrayList<Object>();
        if (probe != null && probe.isAlive()) {
            errors.add("GPU drivers are still listing their devices (an earlier listing hung)");
            return new Object[]{gpus, errors};
        }
        final Object[][] box = new Object[1][];
        Thread t = new Thread(new Runnable() {
            public void run() {
                List<Object> g = new ArrayList<Object>();
                List<Object> e = new ArrayList<Object>();
                try {
                    for (Map<String, Object> d : OpenCL.listDevices()) {
                        d.put("spec", "opencl:" + d.get("index"));
                        g.add(d);
                    }
                } catch (ClError x) {
                    e.add("opencl: GpuError: " + x.getMessage());
                } catch (RuntimeException | LinkageError x) {
                    e.add("opencl: " + x.getClass().getSimpleName() + ": " + x.getMessage());
                }
                synchronized (box) {
                    box[0] = new Object[]{g, e};
                }
            }
        }, "tether-gpu-probe");
        t.setDaemon(true);
        probe = t;
        t.start();
        try {
            t.join(GPU_LIST_TIMEOUT_MS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        synchronized (box) {
            if (box[0] == null) {
                errors.add("GPU drivers did not list their devices within " + GPU_LIST_TIMEOUT_MS / 1000 + " s");
                return new Object[]{gpus, errors};
            }
            return box[0];
        }
    }

    private static Long[] memory() {
        Long[] out = new Long[2];
        String text = read("/proc/meminfo", 1 << 16);
        for (String line : (text == null ? "" : text).split("\n")) {
            String[] parts = line.split("[:\\s]+");
            if (parts.length >= 2 && (parts[0].equals("MemTotal") || parts[0].equals("MemAvailable"))) {
                try {
                    long v = Long.parseLong(parts[1]) * (parts.length > 2 && parts[2].equalsIgnoreCase("kb") ? 1024 : 1);
                    out[parts[0].equals("MemTotal") ? 0 : 1] = v;
                } catch (NumberFormatException e) {
                    // unreadable: null
                }
            }
        }
        return out;
    }

    private static Map<String, String> osRelease() {
        Map<String, String> out = new HashMap<String, String>();
        String text = read("/etc/os-release", 1 << 16);
        if (text == null) {
            text = read("/usr/lib/os-release", 1 << 16);
        }
        for (String line : (text == null ? "" : text).split("\n")) {
            int eq = line.indexOf('=');
            if (eq > 0) {
                out.put(line.substring(0, eq).trim(), line.substring(eq + 1).trim().replaceAll("^[\"']|[\"']$", ""));
            }
        }
        return out;
    }
}
