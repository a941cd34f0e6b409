package dev.tether.app;

import dev.tether.device.Backoff;
import dev.tether.device.DeviceConfig;
import dev.tether.device.Status;

import java.io.File;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

/**
 * Desktop checks of the app's Android-free logic: {@link Settings} (stored form, adb intent extras, the device
 * server configuration through the device server's own parser), {@link Backoff} and {@link DeviceState}'s status
 * line. Prints one line per failure and "N passed, M failed"; exits 1 on any failure.
 */
public final class AppLogicRunner {
    private static int passed;
    private static final List<String> failures = new ArrayList<String>();

    private static void check(String what, boolean ok, Object detail) {
        if (ok) {
            passed++;
        } else {
            failures.add(what + ": " + detail);
        }
    }

    private static void checkEq(String what, Object expected, Object actual) {
        check(what, expected == null ? actual == null : expected.equals(actual),
                "expected <" + expected + "> got <" + actual + ">");
    }

    /** The IllegalArgumentException message of {@code r}, or null if it did not throw. */
    private static String refusal(Runnable r) {
        try {
            r.run();
            return null;
        } catch (IllegalArgumentException e) {
            return e.getMessage();
        }
    }

    private static void checkRefused(String what, Runnable r, String mustMention) {
        String m = refusal(r);
        check(what, m != null && m.contains(mustMention), m == null ? "accepted" : "message: " + m);
    }

    /** {@code base.withExtras} refuses the adb intent {@code extras} with a message naming {@code mustMention}. */
    private static void checkExtrasRefused(String what, final Settings base, final Map<String, Object> extras,
                                           String mustMention) {
        checkRefused(what, new Runnable() {
            public void run() {
                base.withExtras(extras, new ArrayList<String>());
            }
        }, mustMention);
    }

    /** {@code settings.toConfig} (the device server's configuration) refuses, naming {@code mustMention}. */
    private static void checkConfigRefused(String what, final Settings settings, String mustMention) {
        checkRefused(what, new Runnable() {
            public void run() {
                settings.toConfig(null, null);
            }
        }, mustMention);
    }

    private static Map<String, Object> extras(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    static void settings() {
        final Settings d = Settings.defaults();
        checkEq("defaults survive the stored form", d, Settings.fromStored(d.toStored()));
        checkEq("an empty store gives the defaults", d, Settings.fromStored(new LinkedHashMap<String, Object>()));
        checkEq("a mistyped stored entry keeps the defaults", d, Settings.fromStored(extras("port", "many")));

        // the adb recipe: am start ... --es tracker HOST:PORT --es key KEY --es token T
        List<String> ignored = new ArrayList<String>();
        // the UI starts the device service with the settings as text extras, the adb recipe's form
        Settings custom = new Settings("10.0.0.2:9190", "k1", " t ", "tt", "0.0.0.0", 9090, false, true);
        checkEq("settings survive their text extras", custom, d.withExtras(custom.toExtras(), ignored));
        Settings listenOnly = new Settings("", "k1", "t", "", "127.0.0.1", 9091, true, false);
        checkEq("no tracker survives the text extras", listenOnly, d.withExtras(listenOnly.toExtras(), ignored));
        Settings s = d.withExtras(extras("tracker", "10.0.0.2:9190", "key", "pixel8", "token", "s3cret",
                "tokn", "typo"), ignored);
        checkEq("tracker from the extra", "10.0.0.2:9190", s.tracker);
        checkEq("key from the extra", "pixel8", s.key);
        checkEq("token from the extra", "s3cret", s.token);
        checkEq("an unknown extra is reported", "[tokn]", ignored.toString());
        checkEq("extras keep what they do not name", d.reverse, s.reverse);
        checkEq("settings with extras survive the stored form", s, Settings.fromStored(s.toStored()));
        check("toString hides the token", !s.toString().contains("s3cret"), s.toString());

        DeviceConfig c = s.toConfig(new File("/data/work"), "/data/lib");
        checkEq("config tracker host", "10.0.0.2", c.trackerHost);
        checkEq("config tracker port", 9190, c.trackerPort);
        checkEq("config key", "pixel8", c.key);
        checkEq("config token", "s3cret", c.token);
        checkEq("config reverse", true, c.reverse);
        checkEq("config listen host", "127.0.0.1", c.host);
        checkEq("config sessions run in the device process", "thread", c.isolation);
        checkEq("config work dir", new File("/data/work"), c.workDir);
        checkEq("config native lib dir", "/data/lib", c.nativeLibDir);

        Settings v6 = d.withExtras(extras("tracker", "[::1]:9190"), ignored);
        checkEq("an IPv6 tracker in brackets", "::1", v6.toConfig(null, null).trackerHost);
        checkExtrasRefused("an IPv6 tracker without brackets", d, extras("tracker", "::1:9190"), "brackets");
        checkExtrasRefused("a tracker without a port", d, extras("tracker", "10.0.0.2"), "HOST:PORT");
        checkExtrasRefused("a tracker on port 0", d, extras("tracker", "10.0.0.2:0"), "1-65535");

        checkEq("a port as --ei", 9090, d.withExtras(extras("port", 9090), ignored).port);
        checkEq("a port as --es", 9091, d.withExtras(extras("port", " 9091 "), ignored).port);
        checkExtrasRefused("a port above 65535", d, extras("port", "70000"), "0-65535");
        checkExtrasRefused("a port that is not a number", d, extras("port", "ninety"), "port");
        checkExtrasRefused("a key as a number", d, extras("key", 7), "--es key");
        checkEq("a flag as --ez", true, d.withExtras(extras("keep_running", true), ignored).keepRunning);
        checkEq("a flag as a string", false, d.withExtras(extras("reverse", "0"), ignored).reverse);
        checkExtrasRefused("a flag that is not true or false", d, extras("reverse", "yes"), "true or false");

        checkEq("tracker none (adb) means no tracker", "", d.withExtras(extras("tracker", "none"), ignored).tracker);
        Settings none = d.withExtras(extras("tracker", "", "port", 0), ignored);
        checkConfigRefused("neither tracker nor port", none, "tracker HOST:PORT or a listen port");
        Settings noKey = d.withExtras(extras("key", ""), ignored);
        checkConfigRefused("a tracker without a key", noKey, "device key");
        Settings open = d.withExtras(extras("tracker", "", "port", 9090, "host", "0.0.0.0"), ignored);
        checkConfigRefused("listening beyond loopback without a token (the device server's rule)", open, "token");
        DeviceConfig listen = open.withExtras(extras("token", "t"), ignored).toConfig(null, null);
        checkEq("listen only: no tracker", null, listen.trackerHost);
        checkEq("listen only: host", "0.0.0.0", listen.host);
        checkEq("listen only: port", 9090, listen.port);
        checkEq("direct registration is not reverse", false,
                d.withExtras(extras("reverse", false), ignored).toConfig(null, null).reverse);
    }

    static void backoff() {
        Backoff b = new Backoff(500, 30000, 0, new Random(1));
        long[] want = {500, 1000, 2000, 4000, 8000, 16000, 30000, 30000};
        for (int i = 0; i < want.length; i++) {
            checkEq("backoff delay " + i, want[i], b.nextDelayMs());
        }
        checkEq("attempts counted", want.length, b.attempts());
        long last = 0;
        for (int i = 0; i < 200; i++) {
            last = b.nextDelayMs();
        }
        checkEq("a long outage stays at the cap (no overflow)", 30000L, last);
        b.reset();
        checkEq("reset starts short again", 500L, b.nextDelayMs());

        Backoff j = new Backoff(1000, 1000, 0.2, new Random(42));
        long min = Long.MAX_VALUE;
        long max = 0;
        for (int i = 0; i < 1000; i++) {
            long x = j.nextDelayMs();
            min = Math.min(min, x);
            max = Math.max(max, x);
        }
        check("jitter stays within +-20 %", min >= 800 && max <= 1200, min + ".." + max);
        check("jitter spreads the delays", min < 900 && max > 1100, min + ".." + max);
        checkEq("the standard policy starts at 0.5 s", true, Backoff.standard().nextDelayMs() <= 600);

        checkRefused("a zero initial delay", new Runnable() {
            public void run() {
                new Backoff(0, 10, 0, new Random());
            }
        }, "initialMs");
        checkRefused("jitter of 1", new Runnable() {
            public void run() {
                new Backoff(1, 10, 1, new Random());
            }
        }, "jitter");
    }

    static void statusLine() {
        DeviceState st = new DeviceState("127.0.0.1:9190");
        checkEq("before any status", "starting", st.line("k", 0));
        st.update(new Status(true, false, null, 0, null, null), 1000);
        checkEq("registered, idle", "registered with 127.0.0.1:9190 as k; no session", st.line("k", 1000));
        check("no wake lock without a session", !st.sessionActive(), "sessionActive");
        st.update(new Status(true, true, "tether.echo", 0.25, null, null), 2000);
        check("wake lock during a session", st.sessionActive(), "sessionActive");
        checkEq("a session with a call",
                "registered with 127.0.0.1:9190 as k; session active; last call tether.echo (250 us) 12 s ago",
                st.line("k", 14000));
        st.update(new Status(true, true, "tether.echo", 0.25, null, null), 20000);
        checkEq("the same status again keeps the call's time",
                "registered with 127.0.0.1:9190 as k; session active; last call tether.echo (250 us) 1 min ago",
                st.line("k", 62000));
        st.update(new Status(true, true, "vadd", 1500, null, null), 62000);
        checkEq("a new call", "registered with 127.0.0.1:9190 as k; session active; last call vadd (1.50 s) 0 s ago",
                st.line("k", 62000));
        st.update(new Status(false, true, "vadd", 1500, "tracker 127.0.0.1:9190 closed the connection", null),
                62500);
        st.update(new Status(false, false, "vadd", 1500, "tracker 127.0.0.1:9190 closed the connection", null),
                70000);

        checkEq("an error in words", "not registered with 127.0.0.1:9190; no session; last call vadd (1.50 s) "
                + "16 s ago; error: tracker 127.0.0.1:9190 closed the connection", st.line("k", 78000));
        st.retrying("connection refused", 2000, 3);
        checkEq("retrying", "not registered with 127.0.0.1:9190; no session; retrying in 2.0 s (attempt 3); "
                + "last call vadd (1.50 s) 16 s ago; error: connection refused", st.line("k", 78000));
        st.stopped(null);
        checkEq("stopped", "stopped", st.line("k", 80000));

        DeviceState listen = new DeviceState("");
        listen.retrying("port 9090 is in use", 500, 1);
        checkEq("not started yet", "retrying in 0.5 s (attempt 1); error: port 9090 is in use",
                listen.line("k", 0));
        listen.update(new Status(false, false, null, 0, null, "127.0.0.1:9090"), 0);
        checkEq("listening only", "listening on 127.0.0.1:9090; no session", listen.line("k", 0));
        checkEq("hours", "2 h 5 min", DeviceState.ago((2 * 3600 + 5 * 60 + 9) * 1000L));
    }

    static void restartPolicy() {
        RestartPolicy r = new RestartPolicy(new Backoff(500, 30000, 0, new Random(3)));
        checkEq("a death before any start is answered at once", 0L, r.delayAfterDeath(100));
        r.started(1000);
        checkEq("a session crash after 10 s: restart now", 0L, r.delayAfterDeath(11000));
        // a client that crashes one kernel after another: each process lives for a few seconds
        for (int i = 0; i < 20; i++) {
            long t = 20000 + i * 3000L;
            r.started(t);
            checkEq("repeated session crashes are all answered at once (" + i + ")", 0L, r.delayAfterDeath(t + 2500));
        }
        // a crash on start-up: the process dies within 2 s of each start
        long t = 100000;
        long[] want = {0, 0, 0, 500, 1000, 2000, 4000};
        for (int i = 0; i < want.length; i++) {
            r.started(t);
            t += 300;
            checkEq("start-up crash loop, death " + (i + 1), want[i], r.delayAfterDeath(t));
            t += want[i];
        }
        checkEq("quick deaths counted", want.length, r.quickDeaths());
        r.started(t);
        checkEq("a process that lived past 2 s ends the loop", 0L, r.delayAfterDeath(t + 2000));
        checkEq("and resets the count", 0, r.quickDeaths());
        r.started(t + 3000);
        checkEq("the next quick death starts from scratch", 0L, r.delayAfterDeath(t + 3100));
    }

    public static void main(String[] args) {
        settings();
        backoff();
        statusLine();
        restartPolicy();
        for (String f : failures) {
            System.out.println("FAIL " + f);
        }
        System.out.println(passed + " passed, " + failures.size() + " failed");
        System.exit(failures.isEmpty() ? 0 : 1);
    }
}
