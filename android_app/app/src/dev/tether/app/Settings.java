package dev.tether.app;

import dev.tether.device.DeviceConfig;

import java.io.File;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What the user chose for this phone as a tether device: the tracker to register with and/or the port to listen
 * on, the device key, the session token, and whether the device keeps running in the background.
 *
 * <p>Plain Java (no Android types), so the same rules serve the UI, the stored preferences, the intent extras of
 * the {@code adb shell am start} recipe (docs/android.md) and the desktop tests. The stored form and the extras use
 * the same names ({@link #EXTRAS}); {@link #toConfig} checks the result through {@link DeviceConfig#fromArgs}, so
 * the app refuses exactly what the device server would.
 */
public final class Settings {
    /** "HOST:PORT" of the tracker, or "" for none. */
    public static final String TRACKER = "tracker";
    public static final String KEY = "key";
    public static final String TOKEN = "token";
    public static final String TRACKER_TOKEN = "tracker_token";
    /** Listen address (127.0.0.1 unless a token is set). */
    public static final String HOST = "host";
    /** Listen port, 0 = none (only a tracker registration). */
    public static final String PORT = "port";
    /** Dial out to the tracker and serve sessions over that connection (works behind NAT and `adb reverse`). */
    public static final String REVERSE = "reverse";
    public static final String KEEP_RUNNING = "keep_running";
    /** The value of {@link #TRACKER} that means none, for the adb recipe. */
    public static final String NO_TRACKER = "none";
    /** Every name the stored form and the intent extras accept. */
    public static final List<String> EXTRAS = Collections.unmodifiableList(java.util.Arrays.asList(
            TRACKER, KEY, TOKEN, TRACKER_TOKEN, HOST, PORT, REVERSE, KEEP_RUNNING));

    public final String tracker;
    public final String key;
    public final String token;
    public final String trackerToken;
    public final String host;
    public final int port;
    public final boolean reverse;
    public final boolean keepRunning;

    public Settings(String tracker, String key, String token, String trackerToken, String host, int port,
                    boolean reverse, boolean keepRunning) {
        this.tracker = tracker == null ? "" : tracker.trim();
        this.key = key == null ? "" : key.trim();
        this.token = token == null ? "" : token;
        this.trackerToken = trackerToken == null ? "" : trackerToken;
        this.host = host == null || host.trim().isEmpty() ? "127.0.0.1" : host.trim();
        this.port = port;
        this.reverse = reverse;
        this.keepRunning = keepRunning;
    }

    /** A fresh install: register in reverse with a tracker reached through `adb reverse tcp:9190 tcp:9190`. */
    public static Settings defaults() {
        return new Settings("127.0.0.1:9190", "android-arm64", "", "", "127.0.0.1", 0, true, false);
    }

    /** The stored form (SharedPreferences.getAll()); a missing or mistyped entry keeps its default. */
    public static Settings fromStored(Map<String, ?> stored) {
        Settings d = defaults();
        try {
            return d.withExtras(stored, new ArrayList<String>());
        } catch (IllegalArgumentException e) {
            return d; // written by this class, so only a hand-edited file gets here
        }
    }

    /** The stored form: strings, an int and booleans, the names of {@link #EXTRAS}. */
    public Map<String, Object> toStored() {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put(TRACKER, tracker);
        m.put(KEY, key);
        m.put(TOKEN, token);
        m.put(TRACKER_TOKEN, trackerToken);
        m.put(HOST, host);
        m.put(PORT, port);
        m.put(REVERSE, reverse);
        m.put(KEEP_RUNNING, keepRunning);
        return m;
    }

    /**
     * These settings with the given extras applied: {@code --es tracker HOST:PORT --es key K --es token T} and
     * the rest of {@link #EXTRAS}; a port may come as {@code --es} or {@code --ei}, a flag as {@code --ez} or as
     * "true"/"false"/"1"/"0". Names this class does not know are appended to {@code ignored} (the caller reports
     * them: a typo such as "tokn" must not pass silently).
     *
     * @throws IllegalArgumentException naming the extra and what it takes
     */
    public Settings withExtras(Map<String, ?> extras, List<String> ignored) {
        // the stored form's entry of each name says how its extra reads: a port, a flag or text (the constructor
        // trims what it trims)
        Map<String, Object> m = toStored();
        for (Map.Entry<String, ?> e : extras.entrySet()) {
            String name = e.getKey();
            Object v = e.getValue();
            if (v == null) {
                continue;
            }
            Object now = m.get(name);
            if (now == null) {
                ignored.add(name);
            } else if (now instanceof Integer) {
                m.put(name, port(name, v));
            } else if (now instanceof Boolean) {
                m.put(name, flag(name, v));
            } else if (name.equals(TRACKER)) {
                m.put(name, tracker(name, v));
            } else {
                m.put(name, text(name, v));
            }
        }
        return new Settings((String) m.get(TRACKER), (String) m.get(KEY), (String) m.get(TOKEN),
                (String) m.get(TRACKER_TOKEN), (String) m.get(HOST), (Integer) m.get(PORT), (Boolean) m.get(REVERSE),
                (Boolean) m.get(KEEP_RUNNING));
    }

    /**
     * The intent extras that stand for these settings: each entry of the stored form as text, as the adb recipe
     * passes it ({@code --es}); {@link #withExtras} reads every setting back from text.
     */
    public Map<String, String> toExtras() {
        Map<String, String> m = new LinkedHashMap<String, String>();
        for (Map.Entry<String, Object> kv : toStored().entrySet()) {
            m.put(kv.getKey(), String.valueOf(kv.getValue()));
        }
        return m;
    }

    /** The arguments of {@link DeviceConfig#fromArgs} these settings stand for. */
    public String[] toArgs() {
        List<String> a = new ArrayList<String>();
        if (!tracker.isEmpty()) {
            a.add("--tracker");
            a.add(tracker);
            a.add("--key");
            a.add(key);
            if (reverse) {
                a.add("--reverse");
            }
            if (!trackerToken.isEmpty()) {
                a.add("--tracker-token");
                a.add(trackerToken);
            }
        }
        a.add("--host");
        a.add(host);
        a.add("--port");
        a.add(Integer.toString(port));
        if (!token.isEmpty()) {
            a.add("--token");
            a.add(token);
        }
        return a.toArray(new String[0]);
    }

    /**
     * The device server's configuration: sessions run in this process (Android cannot start a child JVM; the
     * app's ":device" process is the isolation instead), work files under {@code workDir}.
     *
     * @throws IllegalArgumentException what is missing or wrong, in words for the status line
     */
    public DeviceConfig toConfig(File workDir, String nativeLibDir) {
        if (tracker.isEmpty() && port == 0) {
            throw new IllegalArgumentException("set a tracker HOST:PORT or a listen port");
        }
        if (!tracker.isEmpty() && key.isEmpty()) {
            throw new IllegalArgumentException("a tracker needs a device key (e.g. android-arm64)");
        }
        DeviceConfig c = DeviceConfig.fromArgs(toArgs());
        c.workDir = workDir;
        c.nativeLibDir = nativeLibDir;
        c.isolation = "thread";
        return c;
    }

    /** "HOST:PORT" or "[v6]:PORT" split into host and port. */
    static Object[] parseTracker(String s) {
        int colon = s.lastIndexOf(':');
        if (colon <= 0 || colon == s.length() - 1) {
            throw new IllegalArgumentException("tracker takes HOST:PORT (e.g. 127.0.0.1:9190), got \"" + s + "\"");
        }
        String h = s.substring(0, colon);
        if (h.startsWith("[") && h.endsWith("]")) {
            h = h.substring(1, h.length() - 1);
        } else if (h.indexOf(':') >= 0) {
            throw new IllegalArgumentException("tracker: write an IPv6 address in brackets, [" + h + "]:PORT");
        }
        int p = port(TRACKER, s.substring(colon + 1));
        if (p == 0) {
            throw new IllegalArgumentException("tracker port must be 1-65535, got 0");
        }
        return new Object[] {h, p};
    }

    private static String text(String name, Object v) {
        if (v instanceof String) {
            return (String) v;
        }
        throw new IllegalArgumentException(name + " takes a string (adb: --es " + name + " VALUE), got "
                + v.getClass().getSimpleName());
    }

    /** A tracker extra: HOST:PORT, or "none" or "" for no tracker. */
    private static String tracker(String name, Object v) {
        String tr = text(name, v).trim();
        if (tr.equals(NO_TRACKER)) {
            return ""; // an empty string does not survive `adb shell` quoting
        }
        if (!tr.isEmpty()) {
            parseTracker(tr);
        }
        return tr;
    }

    private static int port(String name, Object v) {
        long p;
        if (v instanceof Integer || v instanceof Long) {
            p = ((Number) v).longValue();
        } else if (v instanceof String) {
            try {
                p = Long.parseLong(((String) v).trim());
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(name + " takes a port number 0-65535, got \"" + v + "\"");
            }
        } else {
            throw new IllegalArgumentException(name + " takes a port number, got " + v.getClass().getSimpleName());
        }
        if (p < 0 || p > 65535) {
            throw new IllegalArgumentException(name + " takes a port number 0-65535, got " + p);
        }
        return (int) p;
    }

    private static boolean flag(String name, Object v) {
        if (v instanceof Boolean) {
            return (Boolean) v;
        }
        if (v instanceof String) {
            String s = ((String) v).trim().toLowerCase(java.util.Locale.ROOT);
            if (s.equals("true") || s.equals("1")) {
                return true;
            }
            if (s.equals("false") || s.equals("0")) {
                return false;
            }
        }
        throw new IllegalArgumentException(name + " takes true or false (adb: --ez " + name + " true), got \"" + v
                + "\"");
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Settings && ((Settings) o).toStored().equals(toStored());
    }

    @Override
    public int hashCode() {
        return toStored().hashCode();
    }

    /** For logs: the token is never shown. */
    @Override
    public String toString() {
        return "Settings(tracker=" + tracker + ", key=" + key + ", token=" + (token.isEmpty() ? "none" : "set")
                + ", host=" + host + ", port=" + port + ", reverse=" + reverse + ", keepRunning=" + keepRunning + ")";
    }
}
