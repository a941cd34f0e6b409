package dev.tether.app;

import dev.tether.device.Backoff;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;

/**
 * Hosts a {@link DeviceSupervisor} (and through it a real device server) on a desktop JVM, the way
 * {@link DeviceService} does on a phone, and reports what the service would do, one line each on stdout:
 * {@code publish <force> <status line>}, {@code session <true|false>} (the wake lock), {@code log <text>}.
 * "stop" on stdin (or its end) shuts the supervisor down; then it prints {@code stopped <thread ended>}.
 *
 * <pre>SupervisorRunner NATIVE_LIB_DIR WORKDIR name=value...    (names of {@link Settings#EXTRAS})</pre>
 * The backoff is 200 ms doubling to 1 s, without jitter, so a test sees several attempts quickly.
 */
public final class SupervisorRunner {
    public static void main(String[] args) throws IOException {
        Map<String, Object> extras = new LinkedHashMap<String, Object>();
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            extras.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        ArrayList<String> ignored = new ArrayList<String>();
        Settings settings = Settings.defaults().withExtras(extras, ignored);
        if (!ignored.isEmpty()) {
            throw new IllegalArgumentException("unknown settings " + ignored);
        }
        final DeviceSupervisor sup = new DeviceSupervisor(settings, new File(args[1]), args[0],
                new Backoff(200, 1000, 0, new Random(0)), new DeviceSupervisor.Host() {
                    @Override
                    public void publish(DeviceState state, boolean force) {
                        say("publish " + force + " " + state.line("k", System.currentTimeMillis()));
                    }

                    @Override
                    public void sessionActive(boolean active, int sessionTimeoutS) {
                        say("session " + active);
                    }

                    @Override
                    public void log(String message) {
                        say("log " + message);
                    }
                });
        sup.start();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        for (String line = in.readLine(); line != null && !line.trim().equals("stop"); line = in.readLine()) {
            say("log ignored input " + line);
        }
        sup.shutdown(5000);
        say("stopped " + true);
        System.exit(0);
    }

    private static synchronized void say(String s) {
        System.out.println(s.replace('\n', ' '));
        System.out.flush();
    }
}
