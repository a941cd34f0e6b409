package dev.tether.app;

import android.app.Activity;
import android.content.SharedPreferences;
import android.graphics.Typeface;
import android.os.Build;
import android.os.Bundle;
import android.text.InputType;
import android.view.View;
import android.widget.Button;
import android.widget.EditText;
import android.widget.LinearLayout;
import android.widget.ScrollView;
import android.widget.TextView;

import dev.tether.rpc.RemoteException;
import dev.tether.rpc.TetherClient;
import dev.tether.rpc.TrackerClient;

import java.io.BufferedReader;
import java.io.FileReader;
import java.io.IOException;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

/**
 * The quick-start screen: this phone's device info (what a tether target preset needs), and a form to reach a
 * tether device server (host, port, token) or a tracker (host, port, token, optional device key). Network work
 * runs on a background thread; results are appended to the log view.
 */
public final class MainActivity extends Activity {
    private static final String PREFS = "tether";
    private static final int ECHO_ROUNDS = 50;

    private EditText host;
    private EditText port;
    private EditText token;
    private EditText key;
    private TextView log;
    private Button serverButton;
    private Button trackerButton;

    @Override
    protected void onCreate(Bundle state) {
        super.onCreate(state);
        SharedPreferences prefs = getSharedPreferences(PREFS, MODE_PRIVATE);
        LinearLayout root = new LinearLayout(this);
        root.setOrientation(LinearLayout.VERTICAL);
        int pad = (int) (12 * getResources().getDisplayMetrics().density);
        root.setPadding(pad, pad, pad, pad);

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
        ScrollView scroll = new ScrollView(this);
        scroll.addView(log);
        root.addView(scroll, new LinearLayout.LayoutParams(LinearLayout.LayoutParams.MATCH_PARENT, 0, 1f));
        setContentView(root);

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
