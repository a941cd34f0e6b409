package dev.tether.device;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.logging.Logger;

/**
 * What this CPU can execute, and whether a module needs more (metadata "requires", docs/abi.md): the same rules
 * and texts as tether_rpc/cpu_features.py. ARM features come from the auxiliary vector (/proc/self/auxv, which
 * qemu-user emulates for its guest), x86_64 flags from /proc/cpuinfo.
 */
final class CpuFeatures {
    private static final int AT_HWCAP = 16;
    private static final int AT_HWCAP2 = 26;
    private static final String[] ARM_HWCAP = new String[32];
    private static final String[] ARM_HWCAP2 = new String[32];
    private static final String[] ARM64_HWCAP = {"fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32",
            "atomics", "fphp", "asimdhp", "cpuid", "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4",
            "asimddp", "sha512", "sve", "asimdfhm", "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg"};
    private static final String[] ARM64_HWCAP2 = new String[32];

    static {
        String[][] arm = {{"1", "half"}, {"2", "thumb"}, {"4", "fastmult"}, {"6", "vfp"}, {"7", "edsp"},
                {"12", "neon"}, {"13", "vfpv3"}, {"14", "vfpv3d16"}, {"15", "tls"}, {"16", "vfpv4"}, {"17", "idiva"},
                {"18", "idivt"}, {"19", "vfpd32"}, {"20", "lpae"}, {"21", "evtstrm"}};
        for (String[] e : arm) {
            ARM_HWCAP[Integer.parseInt(e[0])] = e[1];
        }
        String[] arm2 = {"aes", "pmull", "sha1", "sha2", "crc32"};
        for (int i = 0; i < arm2.length; i++) {
            ARM_HWCAP2[i] = arm2[i];
        }
        ARM64_HWCAP2[0] = "dcpodp";
        ARM64_HWCAP2[1] = "sve2";
        ARM64_HWCAP2[13] = "i8mm";
        ARM64_HWCAP2[14] = "bf16";
    }

    private static Map<String, Object> cached;

    private CpuFeatures() {
    }

    /** {AT_HWCAP, AT_HWCAP2} of this process from /proc/self/auxv ({0, 0} if unreadable). */
    static long[] auxv() {
        long[] out = new long[2];
        byte[] raw = new byte[1 << 14];
        int n = 0;
        try {
            InputStream in = new FileInputStream("/proc/self/auxv");
            try {
                int r;
                while (n < raw.length && (r = in.read(raw, n, raw.length - n)) > 0) {
                    n += r;
                }
            } finally {
                in.close();
            }
        } catch (IOException e) {
            return out;
        }
        int word = NativeBridge.pointerSize();
        ByteBuffer b = ByteBuffer.wrap(raw, 0, n).order(ByteOrder.nativeOrder());
        for (int i = 0; i + 2 * word <= n; i += 2 * word) {
            long key = word == 8 ? b.getLong(i) : b.getInt(i) & 0xffffffffL;
            long value = word == 8 ? b.getLong(i + word) : b.getInt(i + word) & 0xffffffffL;
            if (key == 0) {
                break;
            }
            if (key == AT_HWCAP) {
                out[0] = value;
            } else if (key == AT_HWCAP2) {
                out[1] = value;
            }
        }
        return out;
    }

    private static void bits(long value, String[] names, Set<String> into) {
        for (int bit = 0; bit < names.length; bit++) {
            if (names[bit] != null && ((value >>> bit) & 1) != 0) {
                into.add(names[bit]);
            }
        }
    }

    private static boolean isArmv8Core(String core) {
        if (core.startsWith("cortex-x") || core.startsWith("neoverse-")) {
            return true;
        }
        if (core.startsWith("cortex-a")) {
            try {
                return Integer.parseInt(core.substring(8)) >= 32;
            } catch (NumberFormatException e) {
                return false;
            }
        }
        return false;
    }

    /** {"isa", "features", "source"} as cpu_features.capabilities gives them. */
    static Map<String, Object> capabilities(String arch, DeviceInfo.CpuInfo cpu, long[] aux) {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        Set<String> features = new TreeSet<String>();
        String source = null;
        String isa = arch;
        if (arch.equals("x86_64")) {
            for (String w : cpu.features) {
                features.add(w.toLowerCase());
            }
            source = features.isEmpty() ? null : "cpuinfo";
        } else if (arch.equals("aarch64") || arch.equals("armv7")) {
            if (aux[0] != 0) {
                boolean a64 = arch.equals("aarch64");
                bits(aux[0], a64 ? ARM64_HWCAP : ARM_HWCAP, features);
                bits(aux[1], a64 ? ARM64_HWCAP2 : ARM_HWCAP2, features);
                source = "auxv";
            } else if ("features".equals(cpu.featuresKey)) {
                features.addAll(cpu.features);
                source = "cpuinfo";
            }
            if (arch.equals("aarch64")) {
                isa = "armv8";
            } else {
                boolean v8 = features.contains("crc32") || "8".equals(cpu.architecture);
                for (String c : cpu.cores) {
                    v8 |= isArmv8Core(c);
                }
                isa = v8 ? "armv8" : "armv7";
            }
        }
        m.put("isa", isa);
        m.put("features", new ArrayList<Object>(features));
        m.put("source", source);
        return m;
    }

    @SuppressWarnings("unchecked")
    static List<String> missing(Object requires, Map<String, Object> caps) {
        List<String> out = new ArrayList<String>();
        if (!(requires instanceof Map) || caps.get("source") == null) {
            return out;
        }
        Map<String, Object> req = (Map<String, Object>) requires;
        Object isa = req.get("isa");
        if ("armv8".equals(isa) && "armv7".equals(caps.get("isa"))) {
            out.add("ARMv8-A instructions (lda/stl acquire-release, vsel, vrint, vmaxnm)");
        }
        Set<Object> have = new HashSet<Object>((List<Object>) caps.get("features"));
        Object needed = req.get("features");
        if (needed instanceof List) {
            for (Object f : (List<Object>) needed) {
                if (f instanceof String && !have.contains(f)) {
                    out.add((String) f);
                }
            }
        }
        return out;
    }

    @SuppressWarnings("unchecked")
    static String suggestPreset(String arch, Map<String, Object> caps, boolean android) {
        Set<Object> have = new HashSet<Object>((List<Object>) caps.get("features"));
        if (arch.equals("x86_64")) {
            return "host";
        }
        if (arch.equals("aarch64")) {
            if (android) {
                return "android-arm64";
            }
            return have.containsAll(Arrays.asList("atomics", "lrcpc", "asimddp", "fphp", "asimdhp")) ? "rasp5" : "rasp4b";
        }
        if (arch.equals("armv7")) {
            if ("armv8".equals(caps.get("isa"))) {
                return "rasp3b";
            }
            if (have.containsAll(Arrays.asList("neon", "vfpv4", "idiva"))) {
                return "armv7-a7";
            }
        }
        return null;
    }

    /** This CPU's capabilities plus "suggested_target" (computed once per process). */
    static synchronized Map<String, Object> thisCpu() {
        if (cached == null) {
            String arch = ElfInfo.hostArch();
            DeviceInfo.CpuInfo cpu = DeviceInfo.cpuInfo();
            Map<String, Object> caps = capabilities(arch, cpu, auxv());
            boolean android = DeviceInfo.isAndroid();
            String preset = DeviceInfo.suggestTarget(arch, cpu.cores, android);
            if (preset.equals(arch) || preset.equals("aarch64") || preset.equals("armv7")) {
                preset = suggestPreset(arch, caps, android);
            }
            caps.put("suggested_target", preset);
            cached = caps;
        }
        return cached;
    }

    /** Refuses a module whose code needs an ISA level or CPU features this device lacks (ArchMismatch). */
    @SuppressWarnings("unchecked")
    static void checkModule(Map<String, Object> meta, String label) throws DeviceError {
        Object requires = meta.get("requires");
        if (!(requires instanceof Map)) {
            return;
        }
        Map<String, Object> caps = thisCpu();
        List<String> lacking = missing(requires, caps);
        if (lacking.isEmpty()) {
            return;
        }
        Object preset = caps.get("suggested_target");
        Map<String, Object> target = meta.get("target") instanceof Map ? (Map<String, Object>) meta.get("target")
                : new LinkedHashMap<String, Object>();
        Object built = target.get("preset") != null ? target.get("preset")
                : target.get("cpu") != null ? target.get("cpu") : "another CPU";
        String hint = preset != null ? "rebuild it with target='" + preset + "'" : "rebuild it for this device's CPU";
        throw new DeviceError("ArchMismatch", label + " was built for " + built + " and needs " + Text.join(lacking)
                + ", which this device's CPU (" + caps.get("isa") + ") lacks: " + hint);
    }

    // -- CPU dispatch (metadata "cpu_dispatch", docs/abi.md): the rules of tether_rpc.cpu_features.dispatch_word --

    static final String DISPATCH_WORD = "tether_cpu_features";
    private static final Logger LOG = Logger.getLogger(CpuFeatures.class.getName());

    /**
     * A module's CPU-features word: bit i set when this CPU reports {@code names[i]} (the metadata list, first 32
     * entries; anything but a string names no feature), 0 when the CPU's features are unknown: every kernel then
     * takes its base version, which runs on any CPU the module's "requires" admits.
     */
    @SuppressWarnings("unchecked")
    static int dispatchWord(Object names, Map<String, Object> caps) {
        if (!(names instanceof List) || caps.get("source") == null) {
            return 0;
        }
        Set<Object> have = new HashSet<Object>((List<Object>) caps.get("features"));
        List<Object> list = (List<Object>) names;
        int word = 0;
        for (int i = 0; i < list.size() && i < 32; i++) {
            Object name = list.get(i);
            if (name instanceof String && have.contains(name)) {
                word |= 1 << i;
            }
        }
        return word;
    }

    /**
     * Writes {@link #dispatchWord} into the freshly loaded library {@code lib} when its metadata names bits, before
     * any of its functions runs (kernels compiled twice then take the version this CPU executes); returns the word.
     */
    static int setDispatchWord(long lib, Map<String, Object> meta, String label) {
        Object names = meta.get("cpu_dispatch");
        if (names == null || (names instanceof List && ((List<?>) names).isEmpty())) {
            return 0;
        }
        int word = dispatchWord(names, thisCpu());
        long address = NativeBridge.dlsym(lib, DISPATCH_WORD);
        if (address == 0) {   // bits named but no word: every kernel stays on its base version
            LOG.warning(label + ": metadata cpu_dispatch " + names + " but no " + DISPATCH_WORD
                    + " symbol; using base kernels");
            return 0;
        }
        NativeBridge.storeInt(address, word);
        LOG.fine(label + ": CPU dispatch " + names + " -> word 0x" + Integer.toHexString(word));
        return word;
    }
}
