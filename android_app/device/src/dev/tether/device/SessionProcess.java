package dev.tether.device;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.lang.reflect.Method;
import java.net.Socket;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A session worker JVM ({@link SessionMain}) and the relay between it and the client's socket. The server keeps
 * one started ahead of time (a JVM takes a while to start), hands it a session, and starts the next one when the
 * session is over. How it ended decides what the client is told: a crash (a kernel's SIGSEGV takes the JVM down
 * through its fatal-error handler, which names the signal on stderr) is ERROR SessionCrashed, a session killed at
 * its time limit ERROR TetherTimeout, both on request id 0, as rpc-server does.
 */
final class SessionProcess {
    private static final Pattern SIGNAL = Pattern.compile("\\b(SIG[A-Z]+) \\(0x([0-9a-f]+)\\)");
    private static final Charset UTF8 = Charset.forName("UTF-8");

    /** Reports each call the worker makes (its "@status call" lines). */
    interface Listener {
        void onCall(String name, double ms);
    }

    final Process process;
    private final Thread stderrReader;
    private volatile String signal;
    private volatile int signalNumber;
    private volatile Listener listener;
    private final List<String> lastLines = new ArrayList<String>();

    private SessionProcess(Process process) {
        this.process = process;
        stderrReader = new Thread(new Runnable() {
            public void run() {
                readStderr();
            }
        }, "tether-session-stderr");
        stderrReader.setDaemon(true);
        stderrReader.start();
    }

    static SessionProcess start(DeviceConfig c) throws IOException {
        String java = new File(new File(System.getProperty("java.home"), "bin"), "java").getPath();
        List<String> cmd = new ArrayList<String>();
        cmd.add(java);
        // start fast and small; the fatal-error report (naming the signal) goes to stderr, never into the
        // protocol stream on stdout, and leaves no core dump or hs_err file behind
        cmd.add("-XX:TieredStopAtLevel=1");
        cmd.add("-XX:+UseSerialGC");
        cmd.add("-Xshare:auto");
        cmd.add("-XX:+DisplayVMOutputToStderr");
        cmd.add("-XX:+ErrorFileToStderr");
        cmd.add("-XX:-CreateCoredumpOnCrash");
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add(SessionMain.class.getName());
        cmd.add("--idle-timeout");
        cmd.add(Integer.toString(c.idleTimeoutS));
        if (c.nativeLibDir != null) {
            cmd.add("--native-lib-dir");
            cmd.add(c.nativeLibDir);
        }
        ProcessBuilder pb = new ProcessBuilder(cmd);
        return new SessionProcess(pb.start());
    }

    private void readStderr() {
        try {
            BufferedReader r = new BufferedReader(new InputStreamReader(process.getErrorStream(), UTF8));
            String line;
            while ((line = r.readLine()) != null) {
                if (line.startsWith("@status call ")) {
                    Listener l = listener;
                    String[] parts = line.split(" ", 4);
                    if (l != null && parts.length == 4) {
                        try {
                            l.onCall(parts[3], Double.parseDouble(parts[2]));
                        } catch (NumberFormatException e) {
                            // a garbled status line is only a missed UI update
                        }
                    }
                    continue;
                }
                Matcher m = SIGNAL.matcher(line);
                if (signal == null && m.find()) {
                    signal = m.group(1);
                    signalNumber = Integer.parseInt(m.group(2), 16);
                }
                synchronized (lastLines) {
                    if (lastLines.size() < 40) {
                        lastLines.add(line);
                    }
                }
                System.err.println("[session] " + line);
            }
        } catch (IOException e) {
            // the worker is gone
        }
    }

    boolean alive() {
        try {
            process.exitValue();
            return false;
        } catch (IllegalThreadStateException e) {
            return true;
        }
    }

    void kill() {
        try {  // Process.destroyForcibly (SIGKILL) is Java 8 / Android API 26; destroy (SIGTERM) before that
            Method m = Process.class.getMethod("destroyForcibly");
            m.invoke(process);
        } catch (Exception e) {
            process.destroy();
        }
    }

    /** How a session ended, for the server to tell the client. */
    static final class Outcome {
        final int exitCode;
        final boolean clientGone;
        final String signal;
        final int signalNumber;

        Outcome(int exitCode, boolean clientGone, String signal, int signalNumber) {
            this.exitCode = exitCode;
            this.clientGone = clientGone;
            this.signal = signal;
            this.signalNumber = signalNumber;
        }
    }

    /**
     * Serves one session: the folder goes to the worker, then bytes flow both ways until the worker exits. The
     * client hanging up kills the worker at once (even mid-kernel), so the device is free again.
     */
    Outcome serve(final Socket client, File folder, Listener l) throws IOException, InterruptedException {
        listener = l;
        final OutputStream toWorker = process.getOutputStream();
        toWorker.write((folder.getPath() + "\n").getBytes(UTF8));
        toWorker.flush();
        final boolean[] clientGone = new boolean[1];
        Thread up = new Thread(new Runnable() {
            public void run() {
                byte[] buf = new byte[1 << 16];
                InputStream in;
                try {
                    in = client.getInputStream();
                } catch (IOException e) {
                    return;
                }
                while (true) {
                    int n;
                    try {
                        n = in.read(buf);
                    } catch (IOException e) {
                        n = client.isClosed() ? 0 : -1;  // closed by the server: the session is over anyway
                        if (n == 0) {
                            return;
                        }
                    }
                    if (n < 0) {
                        clientGone[0] = true;  // the client hung up: free the device at once, even mid-kernel
                        kill();
                        return;
                    }
                    try {
                        toWorker.write(buf, 0, n);
                        toWorker.flush();
                    } catch (IOException e) {
                        return;  // the worker is gone; its exit status says why
                    }
                }
            }
        }, "tether-relay-up");
        Thread down = new Thread(new Runnable() {
            public void run() {
                byte[] buf = new byte[1 << 16];
                try {
                    InputStream in = process.getInputStream();
                    OutputStream out = client.getOutputStream();
                    int n;
                    while ((n = in.read(buf)) > 0) {
                        out.write(buf, 0, n);
                        out.flush();
                    }
                } catch (IOException e) {
                    // the client or the worker is gone; the exit status tells which
                }
            }
        }, "tether-relay-down");
        up.setDaemon(true);
        down.setDaemon(true);
        up.start();
        down.start();
        int code = process.waitFor();
        down.join(2000);
        stderrReader.join(2000);
        return new Outcome(code, clientGone[0], signal, signalNumber);
    }
}
