package dev.tether.app;

import dev.tether.device.Backoff;

import android.app.Notification;
import android.app.NotificationManager;
import android.app.PendingIntent;
import android.app.Service;
import android.content.BroadcastReceiver;
import android.content.ComponentName;
import android.content.Context;
import android.content.Intent;
import android.content.IntentFilter;
import android.content.ServiceConnection;
import android.content.SharedPreferences;
import android.net.wifi.WifiManager;
import android.os.Binder;
import android.os.Bundle;
import android.os.IBinder;
import android.os.PowerManager;
import android.util.Log;


import java.io.File;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * This phone as a tether device: a foreground service, alone in the ":device" process (AndroidManifest.xml), that
 * hosts the device server through {@link DeviceSupervisor} and keeps it registered with the tracker.
 *
 * <ul>
 * <li>Sessions run kernels in this process (Android cannot start a child JVM), so a kernel that segfaults takes
 * down this process only: the UI process keeps running, and {@link WatchdogService} (UI process, bound from here so
 * it is as important as this process while it lives) sees the death and starts this service again at once;
 * START_STICKY is the fallback when the UI process is gone too.</li>
 * <li>Foreground: a visible notification keeps the process at foreground-service priority (a plain background
 * service is killed or throttled within minutes on Android 8+), and a partial wake lock plus a Wi-Fi lock are held
 * while a session is active, so neither the CPU nor the radio sleeps under a benchmark.</li>
 * <li>A device server that cannot start (port in use, network not up) is retried with {@link Backoff}; a tracker
 * that goes away is re-dialled by the device server's own registrar.</li>
 * </ul>
 * The status line ({@link DeviceState}) goes to the notification and, as a package-local broadcast, to the UI.
 */
public final class DeviceService extends Service {
    static final String ACTION_START = "dev.tether.app.action.START_DEVICE";
    static final String ACTION_STOP = "dev.tether.app.action.STOP_DEVICE";
    static final String ACTION_STATUS = "dev.tether.app.action.DEVICE_STATUS";
    static final String ACTION_STATUS_REQUEST = "dev.tether.app.action.DEVICE_STATUS_REQUEST";
    static final String EXTRA_LINE = "line";
    static final String EXTRA_RUNNING = "running";
    /** The preferences file shared with the UI: the settings and whether the device should run. */
    static final String PREFS = "device";
    /** True between the user's Start and Stop: what the watchdog and a sticky restart go by. */
    static final String PREF_RUN = "run";
    private static final String TAG = "tether.device";
    private static final int NOTIFICATION_ID = 1;
    /** A wake lock outlives no session by more than this; a session without a time limit is capped at 6 h. */
    private static final long WAKE_LOCK_SLACK_MS = 60000;
    private static final long WAKE_LOCK_UNLIMITED_MS = 6 * 3600 * 1000L;
    /** The UI and the notification hear of calls at most this often; state changes go out at once. */
    private static final long PUBLISH_INTERVAL_MS = 1000;
    /** How long Stop (on the main thread) waits for the device server's loop to end. */
    private static final long SHUTDOWN_WAIT_MS = 2000;

    private volatile DeviceSupervisor supervisor;
    private PowerManager.WakeLock wakeLock;
    private WifiManager.WifiLock wifiLock;
    private boolean watchdogBound;
    private long lastPublishMs;
    private String lastPublishedState = "";

    private final ServiceConnection watchdogConnection = new ServiceConnection() {
        @Override
        public void onServiceConnected(ComponentName name, IBinder binder) {
            // nothing to call: the binding itself is what keeps the watchdog's process alive and watching
        }

        @Override
        public void onServiceDisconnected(ComponentName name) {
            // the UI process died; the binding stays and brings the watchdog back with it
        }
    };

    private final DeviceSupervisor.Host host = new DeviceSupervisor.Host() {
        @Override
        public void publish(DeviceState state, boolean force) {
            DeviceService.this.publish(force);
        }

        @Override
        public void sessionActive(boolean active, int sessionTimeoutS) {
            holdLocks(active, sessionTimeoutS);
        }

        @Override
        public void log(String message) {
            Log.i(TAG, message);
        }
    };

    private final BroadcastReceiver statusRequests = new BroadcastReceiver() {
        @Override
        public void onReceive(Context context, Intent intent) {
            publish(true);
        }
    };

    @Override
    public void onCreate() {
        super.onCreate();
        PowerManager pm = (PowerManager) getSystemService(POWER_SERVICE);
        wakeLock = pm.newWakeLock(PowerManager.PARTIAL_WAKE_LOCK, "tether:session");
        wakeLock.setReferenceCounted(false);
        WifiManager wm = (WifiManager) getApplicationContext().getSystemService(WIFI_SERVICE);
        if (wm != null) {
            wifiLock = wm.createWifiLock(WifiManager.WIFI_MODE_FULL_HIGH_PERF, "tether:session");
            wifiLock.setReferenceCounted(false);
        }
        registerReceiver(statusRequests, new IntentFilter(ACTION_STATUS_REQUEST));
        watchdogBound = bindService(new Intent(this, WatchdogService.class), watchdogConnection, BIND_AUTO_CREATE);
        startForeground(NOTIFICATION_ID, notification("starting"));
    }

    @Override
    public int onStartCommand(Intent intent, int flags, int startId) {
        String action = intent == null ? null : intent.getAction();
        if (ACTION_STOP.equals(action)) {
            stopDevice("stopped");
            return START_NOT_STICKY;
        }
        SharedPreferences prefs = getSharedPreferences(PREFS, MODE_MULTI_PROCESS);
        if (!prefs.getBoolean(PREF_RUN, false)) {
            // a sticky or watchdog restart after the user pressed Stop
            stopDevice("stopped");
            return START_NOT_STICKY;
        }
        // settings come in the intent (written by the UI a moment ago) or, after a crash, from the stored copy
        Settings settings = Settings.fromStored(prefs.getAll());
        if (intent != null && intent.getExtras() != null) {
            try {
                settings = settings.withExtras(toMap(intent.getExtras()), new ArrayList<String>());
            } catch (IllegalArgumentException e) {
                // the UI checks before it starts us; an exception here would crash this process into the watchdog
                stopDevice("not started: " + e.getMessage());
                return START_NOT_STICKY;
            }
        }
        if (supervisor == null || !supervisor.settings.equals(settings)) {
            if (supervisor != null) {
                supervisor.shutdown(SHUTDOWN_WAIT_MS);
            }
            supervisor = new DeviceSupervisor(settings, workDir(), getApplicationInfo().nativeLibraryDir,
                    Backoff.standard(), host);
            supervisor.start();
        }
        return START_STICKY;
    }

    @Override
    public IBinder onBind(Intent intent) {
        // the watchdog binds only to hold this binder and hear of its death
        return new Binder();
    }

    @Override
    public void onDestroy() {
        if (supervisor != null) {
            supervisor.shutdown(SHUTDOWN_WAIT_MS);
            supervisor = null;
        }
        releaseLocks();
        unregisterReceiver(statusRequests);
        if (watchdogBound) {
            unbindService(watchdogConnection);
            watchdogBound = false;
        }
        super.onDestroy();
    }

    private void stopDevice(String why) {
        if (supervisor != null) {
            supervisor.shutdown(SHUTDOWN_WAIT_MS);
            supervisor = null;
        }
        releaseLocks();
        broadcast(why, false);
        stopForeground(true);
        stopSelf();
    }

    static Map<String, Object> toMap(Bundle b) {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        for (String k : b.keySet()) {
            m.put(k, b.get(k));
        }
        return m;
    }

    private File workDir() {
        File d = new File(getFilesDir(), "sessions");
        if (!d.isDirectory() && !d.mkdirs()) {
            Log.w(TAG, "cannot create " + d + "; the device server falls back to its default");
        }
        return d;
    }

    // -- wake lock, notification, broadcasts --------------------------------------------------------------------

    private synchronized void holdLocks(boolean session, int sessionTimeoutS) {
        if (session && !wakeLock.isHeld()) {
            long ms = sessionTimeoutS > 0 ? sessionTimeoutS * 1000L + WAKE_LOCK_SLACK_MS : WAKE_LOCK_UNLIMITED_MS;
            wakeLock.acquire(ms);
            if (wifiLock != null) {
                wifiLock.acquire();
            }
        } else if (!session) {
            releaseLocks();
        }
    }

    private synchronized void releaseLocks() {
        if (wakeLock != null && wakeLock.isHeld()) {
            wakeLock.release();
        }
        if (wifiLock != null && wifiLock.isHeld()) {
            wifiLock.release();
        }
    }

    private Notification notification(String line) {
        Intent open = new Intent(this, MainActivity.class).addFlags(Intent.FLAG_ACTIVITY_SINGLE_TOP);
        PendingIntent pi = PendingIntent.getActivity(this, 0, open,
                PendingIntent.FLAG_IMMUTABLE | PendingIntent.FLAG_UPDATE_CURRENT);
        return new Notification.Builder(this)
                .setSmallIcon(android.R.drawable.stat_notify_sync_noanim)
                .setContentTitle("tether device")
                .setContentText(line)
                .setStyle(new Notification.BigTextStyle().bigText(line))
                .setOngoing(true)
                .setOnlyAlertOnce(true)
                .setContentIntent(pi)
                .build();
    }

    /** Tell the UI and the notification; {@code force}, or a changed state, goes out at once, calls at most 1/s. */
    private void publish(boolean force) {
        DeviceSupervisor s = supervisor;
        if (s == null) {
            broadcast("stopped", false);
            return;
        }
        long now = System.currentTimeMillis();
        String stateKey = s.state.registered() + "/" + s.state.sessionActive() + "/" + s.state.line(s.settings.key, 0)
                .replaceAll("last call .*? ago", "");
        synchronized (this) {
            if (!force && stateKey.equals(lastPublishedState) && now - lastPublishMs < PUBLISH_INTERVAL_MS) {
                return;
            }
            lastPublishMs = now;
            lastPublishedState = stateKey;
        }
        String line = s.state.line(s.settings.key, now);
        ((NotificationManager) getSystemService(NOTIFICATION_SERVICE)).notify(NOTIFICATION_ID, notification(line));
        broadcast(line, true);
    }

    private void broadcast(String line, boolean running) {
        sendBroadcast(new Intent(ACTION_STATUS).setPackage(getPackageName()).putExtra(EXTRA_LINE, line)
                .putExtra(EXTRA_RUNNING, running));
    }
}
