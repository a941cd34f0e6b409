package dev.tether.app;

import dev.tether.device.Backoff;

/**
 * When the watchdog starts the device process again after it died. A death during work (a kernel that crashed a
 * session) is answered at once, however often it happens: the client's next session must find the device back
 * within 2 s. A process that dies again within {@link #QUICK_DEATH_MS} of its start, more than
 * {@link #QUICK_DEATHS_ALLOWED} times in a row, is crashing on start-up (a bridge that does not load, a broken
 * setting): those restarts wait by {@link Backoff}, so a crash loop cannot spin the phone.
 */
public final class RestartPolicy {
    public static final long QUICK_DEATH_MS = 2000;
    public static final int QUICK_DEATHS_ALLOWED = 3;

    private final Backoff backoff;
    private long startedAtMs = -1;
    private int quickDeaths;

    public RestartPolicy(Backoff backoff) {
        this.backoff = backoff;
    }

    /** The device process was (re)started at {@code nowMs} (elapsed-time clock). */
    public synchronized void started(long nowMs) {
        startedAtMs = nowMs;
    }

    /** The device process died at {@code nowMs}: milliseconds to wait before starting it again (0: now). */
    public synchronized long delayAfterDeath(long nowMs) {
        boolean quick = startedAtMs >= 0 && nowMs - startedAtMs < QUICK_DEATH_MS;
        if (!quick) {
            quickDeaths = 0;
            backoff.reset();
            return 0;
        }
        quickDeaths++;
        return quickDeaths <= QUICK_DEATHS_ALLOWED ? 0 : backoff.nextDelayMs();
    }

    /** Quick deaths in a row so far. */
    public synchronized int quickDeaths() {
        return quickDeaths;
    }
}
