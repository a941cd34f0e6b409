package dev.tether.device;

import java.io.File;

/**
 * What a device server does: where it listens or which tracker it registers with, its token, its timeouts and
 * folders. Plain public fields so the Android app can fill them from its UI; {@link #fromArgs} parses the same
 * options as {@code run_device.sh} (and, where they overlap, as {@code rpc-server}).
 */
public final class DeviceConfig {
    /** Tracker to register with (null: none). */
    public String trackerHost;
    public int trackerPort;
    /** The device key the tracker files this device under (e.g. "android-arm64"). */
    public String key;
    /** Listen address; 127.0.0.1 by default: beyond loopback a token is required. */
    public String host = "127.0.0.1";
    /** Listen port; 0 = an ephemeral port when not registering in reverse mode. */
    public int port;
    /** Session token (HMAC-SHA256 handshake); null = none (loopback only). */
    public String token;
    /** Token of the tracker, if it has one. */
    public String trackerToken;
    /** Reverse registration: the device dials out to the tracker and serves sessions over that connection. */
    public boolean reverse;
    /** A session is ended after this many seconds (0 = no limit). */
    public int sessionTimeoutS = 3600;
    /** A session that sends nothing for this many seconds is ended (0 = no limit). */
    public int idleTimeoutS = 300;
    /** Where session folders are made (default: java.io.tmpdir). */
    public File workDir;
    /** Folder holding libtether_bridge.so (null: System.loadLibrary searches java.library.path). */
    public String nativeLibDir;
    /**
     * "process": every session runs in a child JVM, so a crashing kernel ends only its session (desktop);
     * "thread": sessions run in this process (Android, where a child JVM cannot be started); "auto" picks.
     */
    public String isolation = "auto";
    /** Handshake timeout in milliseconds. */
    public int handshakeTimeoutMs = 5000;

    /** Parses {@code --tracker HOST:PORT --key KEY --host H --port P --token T --tracker-token T --reverse
     *  --session-timeout S --idle-timeout S --workdir DIR --native-lib-dir DIR --isolation process|thread|auto}. */
    public static DeviceConfig fromArgs(String[] args) {
        DeviceConfig c = new DeviceConfig();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("--reverse")) {
                c.reverse = true;
                continue;
            }
            if (i + 1 >= args.length) {
                throw new IllegalArgumentException("option " + a + " needs a value");
            }
            String v = args[++i];
            if (a.equals("--tracker")) {
                int colon = v.lastIndexOf(':');
                if (colon <= 0) {
                    throw new IllegalArgumentException("--tracker takes HOST:PORT, got " + v);
                }
                c.trackerHost = v.substring(0, colon).replace("[", "").replace("]", "");
                c.trackerPort = parsePort(v.substring(colon + 1), "--tracker");
            } else if (a.equals("--key")) {
                c.key = v;
            } else if (a.equals("--host")) {
                c.host = v;
            } else if (a.equals("--port")) {
                c.port = parsePort(v, "--port");
            } else if (a.equals("--token")) {
                c.token = v.isEmpty() ? null : v;
            } else if (a.equals("--tracker-token")) {
                c.trackerToken = v.isEmpty() ? null : v;
            } else if (a.equals("--session-timeout")) {
                c.sessionTimeoutS = parseSeconds(v, a);
            } else if (a.equals("--idle-timeout")) {
                c.idleTimeoutS = parseSeconds(v, a);
            } else if (a.equals("--workdir")) {
                c.workDir = new File(v);
            } else if (a.equals("--native-lib-dir")) {
                c.nativeLibDir = v;
            } else if (a.equals("--isolation")) {
                if (!v.equals("process") && !v.equals("thread") && !v.equals("auto")) {
                    throw new IllegalArgumentException("--isolation takes process, thread or auto, got " + v);
                }
                c.isolation = v;
            } else {
                throw new IllegalArgumentException("unknown option " + a + " (see run_device.sh --help)");
            }
        }
        if (c.trackerHost != null && (c.key == null || c.key.isEmpty())) {
            throw new IllegalArgumentException("--tracker needs --key KEY (the device key to register under)");
        }
        if (c.reverse && c.trackerHost == null) {
            throw new IllegalArgumentException("--reverse needs --tracker HOST:PORT");
        }
        if (c.token == null && !isLoopback(c.host)) {
            throw new IllegalArgumentException("listening on " + c.host + " beyond loopback needs --token");
        }
        return c;
    }

    static boolean isLoopback(String host) {
        return host.equals("127.0.0.1") || host.equals("localhost") || host.equals("::1") || host.startsWith("127.");
    }

    private static int parsePort(String v, String opt) {
        try {
            int p = Integer.parseInt(v);
            if (p >= 0 && p < 65536) {
                return p;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException(opt + " takes a port number 0-65535, got " + v);
    }

    private static int parseSeconds(String v, String opt) {
        try {
            int s = Integer.parseInt(v);
            if (s >= 0) {
                return s;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException(opt + " takes whole seconds >= 0 (0 = no limit), got " + v);
    }

    /** Whether sessions run in child JVMs: "auto" means yes unless this is Android (ART cannot start one). */
    boolean sessionsInChildProcess() {
        if (isolation.equals("process")) {
            return true;
        }
        if (isolation.equals("thread")) {
            return false;
        }
        String vm = System.getProperty("java.vm.name", "");
        return !vm.toLowerCase().contains("dalvik") && !vm.toLowerCase().contains("art");
    }
}
