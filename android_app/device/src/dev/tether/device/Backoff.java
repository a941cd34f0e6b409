package dev.tether.device;

import java.util.Random;

/**
 * Delays between attempts to reach a tracker that went away: {@code initialMs}, doubling up to {@code maxMs},
 * each spread by +-{@code jitter} so phones that lost the same tracker do not all come back in the same instant.
 * {@link #reset} after a success, so the next outage starts short again. The one reconnect policy of the app
 * (device server restarts, the watchdog) and of the device server's {@link Registrar} (its tracker link).
 */
public final class Backoff {
    public static final long INITIAL_MS = 500;
    public static final long MAX_MS = 30000;
    public static final double JITTER = 0.2;

    private final long initialMs;
    private final long maxMs;
    private final double jitter;
    private final Random random;
    private int attempts;

    public Backoff(long initialMs, long maxMs, double jitter, Random random) {
        if (initialMs <= 0 || maxMs < initialMs) {
            throw new IllegalArgumentException("backoff needs 0 < initialMs <= maxMs, got " + initialMs + ", " + maxMs);
        }
        if (jitter < 0 || jitter >= 1) {
            throw new IllegalArgumentException("backoff jitter must be in [0, 1), got " + jitter);
        }
        this.initialMs = initialMs;
        this.maxMs = maxMs;
        this.jitter = jitter;
        this.random = random;
    }

    /** The app's restart policy: 0.5 s, 1 s, 2 s, ... 30 s, +-20 %. */
    public static Backoff standard() {
        return new Backoff(INITIAL_MS, MAX_MS, JITTER, new Random());
    }

    /** How long to wait before the next attempt; counts the attempt. Never above maxMs * (1 + jitter). */
    public long nextDelayMs() {
        // the shift is bounded so that a long outage cannot overflow: 2^20 * initialMs is far above any maxMs
        long base = Math.min(maxMs, initialMs << Math.min(attempts, 20));
        attempts++;
        double spread = 1 + jitter * (2 * random.nextDouble() - 1);
        return Math.max(1, Math.round(base * spread));
    }

    /** Failed attempts since the last {@link #reset}. */
    public int attempts() {
        return attempts;
    }

    public void reset() {
        attempts = 0;
    }
}
