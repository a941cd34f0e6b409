package dev.tether.app;

import dev.tether.device.Backoff;

import android.app.Service;
import android.content.ComponentName;
import android.content.Context;
import android.content.Intent;
import android.content.ServiceConnection;
import android.os.Binder;
import android.os.Handler;
import android.os.IBinder;
import android.os.Looper;
import android.os.RemoteException;
import android.os.SystemClock;
import android.util.Log;

/**
 * Restarts {@link DeviceService} the moment its ":device" process dies (a kernel that segfaults in a session, or
 * the low-memory killer), instead of waiting for the system's own restart of a sticky service, which comes after
 * 1 s and then 4 s, 16 s, ... for a service that crashes again within a minute.
 *
 * <p>Runs in the UI process. {@link DeviceService} binds to it, which keeps this process as important as the
 * device process; this service holds the device service's binder and a death recipient on it. On death it calls
 * {@code startService}, which also cancels the system's pending delayed restart. It does so only while the
 * user's Start is in force ({@link DeviceService#PREF_RUN}); a Stop unbinds both sides first.
 */
public final class WatchdogService extends Service {
    private static final String TAG = "tether.watchdog";
    /** Process-wide: this service is destroyed with each death it reports, the history must outlive it. */
    private static final RestartPolicy POLICY = new RestartPolicy(Backoff.standard());
    private static final Handler MAIN = new Handler(Looper.getMainLooper());
    private boolean bound;

    private final IBinder.DeathRecipient onDeath = new IBinder.DeathRecipient() {
        @Override
        public void binderDied() {
            final Context app = getApplicationContext(); // this service may be unbound (and destroyed) by the death
            long delay = POLICY.delayAfterDeath(SystemClock.elapsedRealtime());
            Log.w(TAG, "the device process died; " + (delay == 0 ? "starting it again"
                    : "crashing on start-up (" + POLICY.quickDeaths() + " times): next start in " + delay + " ms"));
            Runnable restart = new Runnable() {
                @Override
                public void run() {
                    if (app.getSharedPreferences(DeviceService.PREFS, MODE_MULTI_PROCESS)
                            .getBoolean(DeviceService.PREF_RUN, false)) {
                        app.startService(new Intent(app, DeviceService.class).setAction(DeviceService.ACTION_START));
                    }
                }
            };
            if (delay == 0) {
                restart.run();
            } else {
                MAIN.postDelayed(restart, delay);
            }
        }
    };

    private final ServiceConnection connection = new ServiceConnection() {
        @Override
        public void onServiceConnected(ComponentName name, IBinder binder) {
            try {
                binder.linkToDeath(onDeath, 0);
                POLICY.started(SystemClock.elapsedRealtime());
            } catch (RemoteException e) {
                onDeath.binderDied(); // it died between the bind and now
            }
        }

        @Override
        public void onServiceDisconnected(ComponentName name) {
            // the death recipient has it in hand
        }
    };

    @Override
    public IBinder onBind(Intent intent) {
        if (!bound) {
            // flags 0: watch the device service, never create or keep it (a Stop must be able to end it)
            bound = bindService(new Intent(this, DeviceService.class), connection, 0);
        }
        return new Binder();
    }

    @Override
    public boolean onUnbind(Intent intent) {
        // the device service went away: stopped, or its process died. The death recipient stays linked: after a
        // death this call may come before binderDied runs (they arrive on different threads), and after a stop
        // it only reads PREF_RUN, which the UI has cleared.
        if (bound) {
            unbindService(connection);
            bound = false;
        }
        stopSelf();
        return false;
    }
}
