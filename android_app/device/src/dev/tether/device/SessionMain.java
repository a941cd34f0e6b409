package dev.tether.device;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;

/**
 * A session worker JVM (the desktop's crash isolation, see {@link SessionProcess}): started ahead of time, it
 * loads the bridge, then waits on stdin for its session folder (one line) and serves that one session over
 * stdin/stdout, which the server relays to and from the client. A kernel that crashes takes down only this JVM.
 * Status lines for the server go to stderr ({@code @status call MS NAME}); System.out is stderr too, so nothing
 * but frames reaches the protocol stream.
 *
 * <pre>java dev.tether.device.SessionMain --idle-timeout S [--native-lib-dir DIR]</pre>
 */
public final class SessionMain {
    private SessionMain() {
    }

    public static void main(String[] args) throws IOException {
        final PrintStream err = System.err;
        System.setOut(err);
        int idle = 0;
        String libDir = null;
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (args[i].equals("--idle-timeout")) {
                idle = Integer.parseInt(args[i + 1]);
            } else if (args[i].equals("--native-lib-dir")) {
                libDir = args[i + 1];
            }
        }
        NativeBridge.load(libDir);
        NativeBridge.pointerSize();
        InputStream in = new BufferedInputStream(new java.io.FileInputStream(FileDescriptor.in), 1 << 16);
        OutputStream out = new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16);
        String folder = readLine(in);
        if (folder == null || folder.isEmpty()) {
            return;  // the server stopped before handing us a session
        }
        Session s = new Session(new File(folder), in, out, idle, new Session.CallListener() {
            public void onCall(String name, double ms) {
                err.println("@status call " + ms + " " + name);
            }
        });
        s.onIdle = new Runnable() {
            public void run() {
                err.flush();
                Runtime.getRuntime().halt(0);
            }
        };
        s.serve();
        out.flush();
        err.flush();
        Runtime.getRuntime().halt(0);  // no shutdown hooks: the pool threads may sit in native code
    }

    private static String readLine(InputStream in) throws IOException {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        while (true) {
            int c = in.read();
            if (c < 0) {
                return null;
            }
            if (c == '\n') {
                return b.toString("UTF-8");
            }
            if (b.size() > 4096) {
                throw new IOException("session folder line too long");
            }
            b.write(c);
        }
    }
}
