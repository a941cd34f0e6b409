package dev.tether.device;

import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * What one session may use (docs/limits.md, tether_rpc/limits.py), with the same defaults, options and messages:
 * array memory (--session-memory, 3/4 of the RAM), upload bytes (--session-disk, 4 GiB), open handles
 * (--session-handles, 65536) and one call's wall time (--call-timeout, 1800 s). {@link #reserve} and friends
 * raise OutOfMemory / LimitExceeded; the session goes on.
 */
final class SessionLimits {
    static final long DEFAULT_DISK = 4L << 30;
    static final int DEFAULT_HANDLES = 65536;
    static final double DEFAULT_CALL_TIMEOUT_S = 1800.0;
    private static final Pattern SIZE = Pattern.compile("^\\s*(\\d+(?:\\.\\d*)?)\\s*([a-zA-Z]*)\\s*$");
    private static final String[][] UNITS = {{"", "1"}, {"b", "1"}, {"k", "1e3"}, {"kb", "1e3"}, {"m", "1e6"},
            {"mb", "1e6"}, {"g", "1e9"}, {"gb", "1e9"}, {"t", "1e12"}, {"tb", "1e12"}, {"kib", "1024"},
            {"mib", "1048576"}, {"gib", "1073741824"}, {"tib", "1099511627776"}};

    final long memory;
    final long disk;
    final int handles;
    final double callTimeoutS;
    private long memoryUsed;

    SessionLimits(long memory, long disk, int handles, double callTimeoutS) {
        this.memory = memory;
        this.disk = disk;
        this.handles = handles;
        this.callTimeoutS = callTimeoutS;
    }

    /** "512MB" -> 512000000, "2GiB" -> 2147483648, "1024" -> 1024. */
    static long parseSize(String text) {
        Matcher m = SIZE.matcher(text);
        if (m.matches()) {
            for (String[] u : UNITS) {
                if (u[0].equals(m.group(2).toLowerCase(Locale.ROOT))) {
                    return (long) (Double.parseDouble(m.group(1)) * Double.parseDouble(u[1]));
                }
            }
        }
        throw new IllegalArgumentException("expected a size such as 512MB, 2GiB or 1048576, got '" + text + "'");
    }

    static String formatSize(long n) {
        String[] names = {"GiB", "MiB", "KiB"};
        long[] sizes = {1L << 30, 1L << 20, 1L << 10};
        for (int i = 0; i < names.length; i++) {
            if (n >= sizes[i]) {
                return String.format(Locale.ROOT, "%.1f %s", n / (double) sizes[i], names[i]);
            }
        }
        return n + " B";
    }

    /** 3/4 of this device's RAM (MemTotal), or 4 GiB when it cannot be read. */
    static long defaultMemory() {
        String text = DeviceInfo.read("/proc/meminfo", 1 << 16);
        for (String line : (text == null ? "" : text).split("\n")) {
            String[] parts = line.trim().split("\\s+");
            if (parts.length >= 2 && parts[0].equals("MemTotal:")) {
                try {
                    return Long.parseLong(parts[1]) * 1024 * 3 / 4;
                } catch (NumberFormatException e) {
                    break;
                }
            }
        }
        return 4L << 30;
    }

    static String callTimeoutMessage(double seconds) {
        return "a call ran past the server's call timeout of " + seconds + " s (--call-timeout) and was aborted; "
                + "the session has ended, start a new one";
    }

    /** The form device_info shows. */
    Map<String, Object> describe() {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("memory_bytes", memory);
        m.put("disk_bytes", disk);
        m.put("handles", (long) handles);
        m.put("call_timeout_s", callTimeoutS);
        return m;
    }

    /** Charges {@code nbytes} for an array about to be made, or raises OutOfMemory naming the sizes. */
    void reserve(long nbytes, String what) throws DeviceError {
        if (memoryUsed + nbytes > memory) {
            throw new DeviceError("OutOfMemory", what + " needs " + formatSize(nbytes) + " but this session already "
                    + "holds " + formatSize(memoryUsed) + " of its " + formatSize(memory) + " array memory (the "
                    + "server's --session-memory): free arrays you no longer need, or ask for a larger limit");
        }
        memoryUsed += nbytes;
    }

    void release(long nbytes) {
        memoryUsed = Math.max(0, memoryUsed - nbytes);
    }

    void checkHandles(int open) throws DeviceError {
        if (open >= handles) {
            throw new DeviceError("LimitExceeded", "this session holds " + open + " handles, its limit (the server's "
                    + "--session-handles): free arrays, modules or functions you no longer need");
        }
    }

    void checkDisk(long used, long nbytes, String name) throws DeviceError {
        if (used + nbytes > disk) {
            throw new DeviceError("LimitExceeded", "uploading '" + name + "' (" + formatSize(nbytes) + ") would put "
                    + "this session's files at " + formatSize(used + nbytes) + ", over its " + formatSize(disk)
                    + " (the server's --session-disk): remove files you no longer need (remote.remove)");
        }
    }
}
