package dev.tether.app;

import dev.tether.device.Status;

import java.util.Locale;

/**
 * What the device process tells the user, in words: registered or not, listening where, a session or none, the
 * last call with how long it took and how long ago, and the last error; plus what the service itself is doing
 * (stopped, starting, waiting to retry a start). Fed from the device server's {@link Status} callbacks and the
 * service's retry loop; plain Java so the wording is tested on a desktop JVM.
 */
public final class DeviceState {
    private final String tracker;
    private Status status;
    private long lastCallAtMs = -1;
    private String service = "starting";
    private String serviceError;

    /** @param tracker "HOST:PORT" of the tracker, or "" when the device only listens */
    public DeviceState(String tracker) {
        this.tracker = tracker == null ? "" : tracker;
    }

    /** A status from the device server at wall time {@code nowMs}. */
    public synchronized void update(Status s, long nowMs) {
        Status before = status;
        boolean newCall = s.lastCall != null && (before == null || !s.lastCall.equals(before.lastCall)
                || s.lastCallMs != before.lastCallMs || (s.sessionActive && !before.sessionActive));
        if (newCall) {
            lastCallAtMs = nowMs;
        }
        status = s;
        service = "running";
        serviceError = null;
    }

    /** The server could not start; the next attempt is in {@code delayMs}. */
    public synchronized void retrying(String error, long delayMs, int attempt) {
        service = String.format(Locale.ROOT, "retrying in %.1f s (attempt %d)", delayMs / 1e3, attempt);
        serviceError = error;
    }

    public synchronized void stopped(String why) {
        service = "stopped";
        serviceError = why;
        status = null;
    }

    /** Whether a client holds a session now: the service holds a wake lock exactly then. */
    public synchronized boolean sessionActive() {
        return status != null && status.sessionActive;
    }

    public synchronized boolean registered() {
        return status != null && status.registered;
    }

    /** One line for the UI and the notification, e.g. "registered with 127.0.0.1:9190 as android-arm64; ...". */
    public synchronized String line(String key, long nowMs) {
        StringBuilder b = new StringBuilder();
        if (status == null) {
            b.append(service);
        } else {
            if (!tracker.isEmpty()) {
                b.append(status.registered ? "registered with " + tracker + " as " + key
                        : "not registered with " + tracker);
            }
            if (status.listening != null) {
                sep(b).append("listening on ").append(status.listening);
            }
            sep(b).append(status.sessionActive ? "session active" : "no session");
            if (!service.equals("running")) {
                sep(b).append(service);
            }
        }
        if (status != null && status.lastCall != null && lastCallAtMs >= 0) {
            sep(b).append("last call ").append(status.lastCall).append(String.format(Locale.ROOT, " (%s) %s ago",
                    millis(status.lastCallMs), ago(nowMs - lastCallAtMs)));
        }
        String error = serviceError != null ? serviceError : status != null ? status.error : null;
        if (error != null && !error.isEmpty()) {
            sep(b).append("error: ").append(error);
        }
        return b.toString();
    }

    private static StringBuilder sep(StringBuilder b) {
        return b.length() == 0 ? b : b.append("; ");
    }

    static String millis(double ms) {
        if (ms < 1) {
            return String.format(Locale.ROOT, "%.0f us", ms * 1e3);
        }
        if (ms < 1000) {
            return String.format(Locale.ROOT, "%.1f ms", ms);
        }
        return String.format(Locale.ROOT, "%.2f s", ms / 1e3);
    }

    static String ago(long ms) {
        long s = Math.max(0, ms) / 1000;
        if (s < 60) {
            return s + " s";
        }
        if (s < 3600) {
            return (s / 60) + " min";
        }
        return (s / 3600) + " h " + (s % 3600 / 60) + " min";
    }
}
