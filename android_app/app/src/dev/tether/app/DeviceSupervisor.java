package dev.tether.app;

import dev.tether.device.Backoff;
import dev.tether.device.DeviceConfig;
import dev.tether.device.DeviceServer;
import dev.tether.device.Status;
import dev.tether.device.StatusListener;

import java.io.File;
import java.io.IOException;

/**
 * Keeps one device server up: starts it from {@link Settings}, and when it cannot start (the listen port is taken,
 * the network is not up yet) starts a new one after a {@link Backoff} delay. A tracker that goes away is the
 * device server's own business: its registrar reconnects with backoff and reports through {@link Status}, which
 * lands on the status line. Settings the device server refuses, or a native bridge that does not load, stop the
 * loop: retrying cannot help, the user has to act.
 *
 * <p>Plain Java: {@link DeviceService} is its Android host (notification, wake lock, broadcasts); the desktop
 * tests host it with a real device server on loopback.
 */
public final class DeviceSupervisor implements StatusListener {
    /** What the host does with the supervisor's news. Called from the supervisor's and the server's threads. */
    public interface Host {
        /** The state changed; {@code force}: a change of state (not just another call) the user must see now. */
        void publish(DeviceState state, boolean force);

        /** A session began or ended: hold or release whatever keeps the device awake. */
        void sessionActive(boolean active, int sessionTimeoutS);

        void log(String message);
    }

    public final Settings settings;
    public final DeviceState state;
    private final File workDir;
    private final String nativeLibDir;
    private final Backoff backoff;
    private final Host host;
    private final Object lock = new Object();
    private final Thread thread;
    private boolean stopping;
    private boolean wasSession;
    private DeviceServer server;
    private volatile int sessionTimeoutS;

    public DeviceSupervisor(Settings settings, File workDir, String nativeLibDir, Backoff backoff, Host host) {
        this.settings = settings;
        this.state = new DeviceState(settings.tracker);
        this.workDir = workDir;
        this.nativeLibDir = nativeLibDir;
        this.backoff = backoff;
        this.host = host;
        this.thread = new Thread(new Runnable() {
            @Override
            public void run() {
                loop();
            }
        }, "tether-device-supervisor");
        this.thread.setDaemon(true);
    }

    public void start() {
        thread.start();
    }

    @Override
    public void onStatus(Status s) {
        state.update(s, System.currentTimeMillis());
        boolean changed;
        synchronized (lock) {
            changed = s.sessionActive != wasSession;
            wasSession = s.sessionActive;
        }
        if (changed) {
            host.sessionActive(s.sessionActive, sessionTimeoutS);
        }
        host.publish(state, false);
    }

    private void loop() {
        while (true) {
            String error;
            try {
                DeviceConfig config = settings.toConfig(workDir, nativeLibDir);
                sessionTimeoutS = config.sessionTimeoutS;
                DeviceServer srv = new DeviceServer(config, this);
                synchronized (lock) {
                    if (stopping) {
                        return;
                    }
                    server = srv;
                }
                srv.start();
                host.log("device server started: " + settings);
                synchronized (lock) {
                    while (!stopping) {
                        lock.wait();
                    }
                    return;
                }
            } catch (IllegalArgumentException e) {
                state.stopped("settings: " + e.getMessage());
                host.publish(state, true);
                return;
            } catch (UnsatisfiedLinkError e) {
                state.stopped("the native bridge does not load: " + e.getMessage());
                host.publish(state, true);
                return;
            } catch (IOException e) {
                error = e.getMessage() == null ? e.toString() : e.getMessage();
            } catch (InterruptedException e) {
                return;
            } catch (RuntimeException e) {
                error = e.toString();
            } finally {
                closeServer();
            }
            long delay = backoff.nextDelayMs();
            host.log("device server: " + error + "; next attempt in " + delay + " ms");
            state.retrying(error, delay, backoff.attempts());
            host.publish(state, true);
            synchronized (lock) {
                long until = System.currentTimeMillis() + delay;
                for (long left = delay; !stopping && left > 0; left = until - System.currentTimeMillis()) {
                    try {
                        lock.wait(left);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
                if (stopping) {
                    return;
                }
            }
        }
    }

    private void closeServer() {
        DeviceServer srv;
        synchronized (lock) {
            srv = server;
            server = null;
        }
        if (srv != null) {
            try {
                srv.close();
            } catch (Exception e) {
                host.log("closing the device server: " + e);
            }
        }
        boolean hadSession;
        synchronized (lock) {
            hadSession = wasSession;
            wasSession = false;
        }
        if (hadSession) {
            host.sessionActive(false, 0);
        }
    }

    /** Ends the loop and closes the server; waits up to {@code timeoutMs} for the loop's thread. Idempotent. */
    public void shutdown(long timeoutMs) {
        synchronized (lock) {
            stopping = true;
            lock.notifyAll();
        }
        closeServer();
        try {
            thread.join(timeoutMs);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
