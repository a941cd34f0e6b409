package dev.tether.app;

import android.app.Activity;
import android.content.BroadcastReceiver;
import android.content.Context;
import android.content.Intent;
import android.content.IntentFilter;
import android.content.SharedPreferences;
import android.graphics.Typeface;
import android.os.Build;
import android.os.Bundle;
import android.os.Handler;
import android.text.InputType;
import android.view.View;
import android.widget.Button;
import android.widget.CheckBox;
import android.widget.EditText;
import android.widget.LinearLayout;
import android.widget.ScrollView;
import android.widget.Switch;
import android.widget.TextView;

import dev.tether.rpc.RemoteException;
import dev.tether.rpc.TetherClient;
import dev.tether.rpc.TrackerClient;

import java.io.BufferedReader;
import java.io.FileReader;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The app's one screen. Top: this phone as a tether device - tracker HOST:PORT and/or listen port, device key,
 * token, "reverse" and "keep running", Start/Stop, and the status line of {@link DeviceService} (which runs in
 * its own ":device" process). The same settings can be filled from the host with an intent (docs/android.md):
 * {@code adb shell am start -n dev.tether.app/.MainActivity --es tracker HOST:PORT --es key KEY --es token T}
 * ({@code --ez start true} also starts the device). Below: the diagnostic client (this phone's device info; reach
 * a device server or a tracker), whose network work runs on a background thread and is appended to the log.
 */
public final class MainActivity extends Activity {
    private static final String PREFS = "tether";
    private static final int ECHO_ROUNDS = 50;
    /** Extra of the adb recipe: start the device after filling the fields. */
    static final String EXTRA_START = "start";
    /** While the screen is visible, the status line (with its "N s ago") is refreshed this often. */
    private static final long STATUS_REFRESH_MS = 2000;

    private EditText devTracker;
    private EditText devKey;
    private EditText devToken;
    private EditText devHost;
    private EditText devPort;
    private CheckBox devReverse;
    private Switch devKeepRunning;
    private TextView devStatus;

    private EditText host;
    private EditText port;
    private EditText token;
    private EditText key;
    private TextView log;
    private Button serverButton;
    private Button trackerButton;
    private final Handler handler = new Handler();

    private final BroadcastReceiver statusReceiver = new BroadcastReceiver() {
        @Override
        public void onReceive(Context context, Intent intent) {
            devStatus.setText(intent.getStringExtra(DeviceService.EXTRA_LINE));
        }
    };

    private final Runnable refresh = new Runnable() {
        @Override
        public void run() {
            if (devicePrefs().getBoolean(DeviceService.PREF_RUN, false)) {
                sendBroadcast(new Intent(DeviceService.ACTION_STATUS_REQUEST).setPackage(getPackageName()));
            }
            handler.postDelayed(this, STATUS_REFRESH_MS);
        }
    };

    @Override
    protected void onCreate(Bundle state) {
        super.onCreate(state);
        SharedPreferences prefs = getSharedPreferences(PREFS, MODE_PRIVATE);
        LinearLayout root = new LinearLayout(this);
        root.setOrientation(LinearLayout.VERTICAL);
        int pad = (int) (12 * getResources().getDisplayMetrics().density);
        root.setPadding(pad, pad, pad, pad);

        heading(root, "This phone as a tether device");
        Settings ds = Settings.fromStored(devicePrefs().getAll());
        devTracker = field(root, "tracker HOST:PORT (empty: none)", ds.tracker, InputType.TYPE_CLASS_TEXT);
        devKey = field(root, "device key (e.g. android-arm64)", ds.key, InputType.TYPE_CLASS_TEXT);
        devToken = field(root, "session token (needed beyond loopback)", ds.token,
                InputType.TYPE_CLASS_TEXT | InputType.TYPE_TEXT_VARIATION_PASSWORD);
        devHost = field(root, "listen address (127.0.0.1)", ds.host, InputType.TYPE_CLASS_TEXT);
        devPort = field(root, "listen port (0: none)", Integer.toString(ds.port), InputType.TYPE_CLASS_NUMBER);
        devReverse = check(root, "reverse: dial out to the tracker (NAT, adb reverse)", ds.reverse);
        devKeepRunning = new Switch(this);
        devKeepRunning.setText("keep running after leaving the app");
        devKeepRunning.setChecked(ds.keepRunning);
        root.addView(devKeepRunning);
        LinearLayout devButtons = new LinearLayout(this);
        devButtons.setOrientation(LinearLayout.HORIZONTAL);
        Button startButton = new Button(this);
        startButton.setText("Start device");
        Button stopButton = new Button(this);
        stopButton.setText("Stop");
        devButtons.addView(startButton);
        devButtons.addView(stopButton);
        root.addView(devButtons);
        devStatus = new TextView(this);
        devStatus.setTextIsSelectable(true);
        devStatus.setText(devicePrefs().getBoolean(DeviceService.PREF_RUN, false) ? "waiting for the device process"
                : "stopped");
        root.addView(devStatus);
        startButton.setOnClickListener(new View.OnClickListener() {
            @Override
            public void onClick(View v) {
                Settings s = readDeviceFields();
                if (s != null) {
                    startDevice(s);
                }
            }
        });
        stopButton.setOnClickListener(new View.OnClickListener() {
            @Override
            public void onClick(View v) {
                stopDevice();
            }
        });

        heading(root, "Diagnostic client");
        host = field(root, "host (server or tracker)", prefs.getString("host", "192.168.1.2"),
                InputType.TYPE_CLASS_TEXT);
        port = field(root, "port (server 9090, tracker 9190)", prefs.getString("port", "9090"),
                InputType.TYPE_CLASS_NUMBER);
        token = field(root, "token (optional)", prefs.getString("token", ""),
                InputType.TYPE_CLASS_TEXT | InputType.TYPE_TEXT_VARIATION_PASSWORD);
        key = field(root, "tracker: device key to request (optional)", prefs.getString("key", ""),
                InputType.TYPE_CLASS_TEXT);

        LinearLayout buttons = new LinearLayout(this);
        buttons.setOrientation(LinearLayout.HORIZONTAL);
        serverButton = new Button(this);
        serverButton.setText("Connect to server");
        trackerButton = new Button(this);
        trackerButton.setText("Query tracker");
        buttons.addView(serverButton);
        buttons.addView(trackerButton);
        root.addView(buttons);

        log = new TextView(this);
        log.setTypeface(Typeface.MONOSPACE);
        log.setTextIsSelectable(true);
        root.addView(log);
        ScrollView scroll = new ScrollView(this);
        scroll.addView(root);
        setContentView(scroll);

        serverButton.setOnClickListener(new View.OnClickListener() {
            @Override
            public void onClick(View v) {
                start(false);
            }
        });
        trackerButton.setOnClickListener(new View.OnClickListener() {
            @Override
            public void onClick(View v) {
                start(true);
            }
        });
        append(localInfo());
        if (state == null) {
            applyIntent(getIntent());
        }
    }

    @Override
    protected void onNewIntent(Intent intent) {
        super.onNewIntent(intent);
        setIntent(intent);
        applyIntent(intent);
    }

    @Override
    protected void onResume() {
        super.onResume();
        registerReceiver(statusReceiver, new IntentFilter(DeviceService.ACTION_STATUS));
        handler.post(refresh);
    }

    @Override
    protected void onPause() {
        handler.removeCallbacks(refresh);
        unregisterReceiver(statusReceiver);
        super.onPause();
    }

    @Override
    protected void onDestroy() {
        // "keep running" off: the device lives as long as this screen (a rotation is not the end of it)
        if (isFinishing() && !Settings.fromStored(devicePrefs().getAll()).keepRunning) {
            stopDevice();
        }
        super.onDestroy();
    }

    private SharedPreferences devicePrefs() {
        return getSharedPreferences(DeviceService.PREFS, MODE_MULTI_PROCESS);
    }

    /** The adb recipe: extras fill (and store) the device fields; {@code start=true} also starts the device. */
    private void applyIntent(Intent intent) {
        Bundle extras = intent == null ? null : intent.getExtras();
        if (extras == null || extras.isEmpty()) {
            return;
        }
        Map<String, Object> m = DeviceService.toMap(extras);
        Object start = m.remove(EXTRA_START);
        List<String> ignored = new ArrayList<String>();
        Settings s;
        try {
            s = Settings.fromStored(devicePrefs().getAll()).withExtras(m, ignored);
        } catch (IllegalArgumentException e) {
            devStatus.setText("intent refused: " + e.getMessage());
            return;
        }
        if (!ignored.isEmpty()) {
            append("ignored unknown extras " + ignored + "; known: " + Settings.EXTRAS + " and " + EXTRA_START);
        }
        showDeviceFields(s);
        saveDevice(s, devicePrefs().getBoolean(DeviceService.PREF_RUN, false));
        append("settings from the intent: " + s);
        if (Boolean.TRUE.equals(start) || "true".equals(start) || "1".equals(start)) {
            startDevice(s);
        }
    }

    private void showDeviceFields(Settings s) {
        devTracker.setText(s.tracker);
        devKey.setText(s.key);
        devToken.setText(s.token);
        devHost.setText(s.host);
        devPort.setText(Integer.toString(s.port));
        devReverse.setChecked(s.reverse);
        devKeepRunning.setChecked(s.keepRunning);
    }

    /** The device fields as settings, or null (and the reason on the status line). */
    private Settings readDeviceFields() {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put(Settings.TRACKER, devTracker.getText().toString());
        m.put(Settings.KEY, devKey.getText().toString());
        m.put(Settings.TOKEN, devToken.getText().toString());
        m.put(Settings.HOST, devHost.getText().toString());
        String p = devPort.getText().toString().trim();
        m.put(Settings.PORT, p.isEmpty() ? "0" : p);
        m.put(Settings.REVERSE, devReverse.isChecked());
        m.put(Settings.KEEP_RUNNING, devKeepRunning.isChecked());
        try {
            Settings s = Settings.defaults().withExtras(m, new ArrayList<String>());
            s.toConfig(null, null); // the device server's own checks, before anything starts
            return s;
        } catch (IllegalArgumentException e) {
            devStatus.setText("not started: " + e.getMessage());
            return null;
        }
    }

    /** commit(), not apply(): the ":device" process reads this file when it (re)starts. */
    private void saveDevice(Settings s, boolean run) {
        SharedPreferences.Editor e = devicePrefs().edit();
        for (Map.Entry<String, Object> kv : s.toStored().entrySet()) {
            Object v = kv.getValue();
            if (v instanceof Boolean) {
                e.putBoolean(kv.getKey(), (Boolean) v);
            } else if (v instanceof Integer) {
                e.putInt(kv.getKey(), (Integer) v);
            } else {
                e.putString(kv.getKey(), (String) v);
            }
        }
        e.putBoolean(DeviceService.PREF_RUN, run).commit();
    }

    private void startDevice(Settings s) {
        saveDevice(s, true);
        Intent i = new Intent(this, DeviceService.class).setAction(DeviceService.ACTION_START);
        for (Map.Entry<String, String> kv : s.toExtras().entrySet()) {
            i.putExtra(kv.getKey(), kv.getValue());
        }
        startService(i);
        devStatus.setText("starting");
    }

    private void stopDevice() {
        devicePrefs().edit().putBoolean(DeviceService.PREF_RUN, false).commit();
        startService(new Intent(this, DeviceService.class).setAction(DeviceService.ACTION_STOP));
        devStatus.setText("stopped");
    }

    private void heading(LinearLayout root, String text) {
        TextView t = new TextView(this);
        t.setText(text);
        t.setTypeface(Typeface.DEFAULT_BOLD);
        root.addView(t);
    }

    private CheckBox check(LinearLayout root, String text, boolean value) {
        CheckBox c = new CheckBox(this);
        c.setText(text);
        c.setChecked(value);
        root.addView(c);
        return c;
    }

    private EditText field(LinearLayout root, String hint, String value, int type) {
        EditText e = new EditText(this);
        e.setHint(hint);
        e.setText(value);
        e.setInputType(type);
        e.setSingleLine(true);
        root.addView(e);
        return e;
    }

    private void append(final String text) {
        runOnUiThread(new Runnable() {
            @Override
            public void run() {
                log.append(text + "\n");
            }
        });
    }

    private void setBusy(final boolean busy) {
        runOnUiThread(new Runnable() {
            @Override
            public void run() {
                serverButton.setEnabled(!busy);
                trackerButton.setEnabled(!busy);
            }
        });
    }

    private void start(final boolean tracker) {
        final String h = host.getText().toString().trim();
        final String t = token.getText().toString();
        final String k = key.getText().toString().trim();
        final int p;
        try {
            p = Integer.parseInt(port.getText().toString().trim());
        } catch (NumberFormatException e) {
            append("port must be a number");
            return;
        }
        getSharedPreferences(PREFS, MODE_PRIVATE).edit().putString("host", h).putString("port", Integer.toString(p))
                .putString("token", t).putString("key", k).apply();
        setBusy(true);
        // Sockets may not be used on the UI thread.
        new Thread(new Runnable() {
            @Override
            public void run() {
                try {
                    if (tracker) {
                        queryTracker(h, p, t, k);
                    } else {
                        TetherClient c = TetherClient.connect(h, p, options(t));
                        try {
                            append("connected to " + c.serverName() + " at " + h + ":" + p + ", session "
                                    + c.sessionId());
                            describe(c);
                        } finally {
                            c.close();
                        }
                    }
                } catch (RemoteException e) {
                    append("remote error " + e.remoteType() + ": " + e.remoteMessage());
                } catch (IOException e) {
                    append("failed: " + e.getMessage());
                } catch (RuntimeException e) {
                    append("failed: " + e);
                } finally {
                    setBusy(false);
                }
            }
        }, "tether-connect").start();
    }

    private static TetherClient.Options options(String token) {
        return new TetherClient.Options().token(token).connectTimeoutMs(10000).readTimeoutMs(30000)
                .clientName("tether-android");
    }

    @SuppressWarnings("unchecked")
    private void queryTracker(String h, int p, String t, String k) throws IOException {
        TrackerClient tracker = TrackerClient.connect(h, p, t);
        try {
            append("tracker " + tracker.trackerName() + " at " + h + ":" + p);
            Map<String, Object> s = tracker.summary();
            for (Object o : (List<Object>) s.get("devices")) {
                Map<String, Object> d = (Map<String, Object>) o;
                append("  device " + d.get("key") + " " + d.get("host") + ":" + d.get("port") + " " + d.get("state")
                        + (Boolean.TRUE.equals(d.get("reverse")) ? " (reverse)" : ""));
            }
            append("  queues " + s.get("queues"));
            if (!k.isEmpty()) {
                TrackerClient.Grant g = tracker.request(k, 1, 60, 600, null);
                append("granted " + g);
                TetherClient c = TetherClient.connect(g.host, g.port, options(null).match(g.match));
                try {
                    describe(c);
                } finally {
                    c.close();
                }
            }
        } finally {
            tracker.close();
        }
    }

    /** Remote device info, and the median round trip of a small call. */
    private void describe(TetherClient c) throws IOException {
        Map<String, Object> info = c.deviceInfo();
        String[] fields = {"arch", "cpu_model", "num_cores", "memory_bytes", "os", "python", "numpy",
            "suggested_target", "governor"};
        for (String f : fields) {
            if (info.containsKey(f)) {
                append("  " + f + ": " + info.get(f));
            }
        }
        long[] ns = new long[ECHO_ROUNDS];
        for (int i = 0; i < ECHO_ROUNDS; i++) {
            long t0 = System.nanoTime();
            c.call("tether.echo", (long) i);
            ns[i] = System.nanoTime() - t0;
        }
        Arrays.sort(ns);
        append(String.format("  small call round trip: median %.1f us over %d calls", ns[ECHO_ROUNDS / 2] / 1e3,
                ECHO_ROUNDS));
    }

    /** What this phone would tell a tether host: ABI, SoC, cores, Android version, suggested target preset. */
    private static String localInfo() {
        StringBuilder b = new StringBuilder("this device\n");
        b.append("  model: ").append(Build.MANUFACTURER).append(' ').append(Build.MODEL).append('\n');
        b.append("  android: ").append(Build.VERSION.RELEASE).append(" (API ").append(Build.VERSION.SDK_INT)
                .append(")\n");
        b.append("  abis: ").append(Arrays.toString(Build.SUPPORTED_ABIS)).append('\n');
        b.append("  hardware: ").append(Build.HARDWARE).append('\n');
        b.append("  cores: ").append(Runtime.getRuntime().availableProcessors()).append('\n');
        String features = cpuinfoField("Features");
        if (features != null) {
            b.append("  cpu features: ").append(features).append('\n');
        }
        String abi = Build.SUPPORTED_ABIS.length > 0 ? Build.SUPPORTED_ABIS[0] : "";
        b.append("  suggested target preset: ").append("arm64-v8a".equals(abi) ? "android-arm64" : "(none for " + abi
                + ")");
        return b.toString();
    }

    private static String cpuinfoField(String name) {
        try {
            BufferedReader r = new BufferedReader(new FileReader("/proc/cpuinfo"));
            try {
                // /proc/cpuinfo is small and finite; this ends at its last line.
                for (String line = r.readLine(); line != null; line = r.readLine()) {
                    int colon = line.indexOf(':');
                    if (colon > 0 && line.substring(0, colon).trim().equals(name)) {
                        return line.substring(colon + 1).trim();
                    }
                }
            } finally {
                r.close();
            }
        } catch (IOException e) {
            return null; // some devices hide /proc/cpuinfo from apps
        }
        return null;
    }
}
