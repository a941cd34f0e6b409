package dev.tether.device;

import dev.tether.rpc.Frame;
import dev.tether.rpc.Handshake;
import dev.tether.rpc.Limits;
import dev.tether.rpc.ProtocolException;
import dev.tether.rpc.Protocol;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.LinkedList;
import java.util.List;
import java.util.Map;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.concurrent.CountDownLatch;

/**
 * The device server in Java: the same protocol, built-ins and behaviour as rpc_server/tether_rpc (server.py),
 * so a host cannot tell the two apart. The accept thread takes connections (or the registrar hands over the
 * ones it dialled to a tracker); each connection's thread runs the handshake (HELLO, CHALLENGE/AUTH with a
 * token, WELCOME) under the handshake timeout, waits in the one-session queue (EVENT queued, or ERROR DeviceBusy)
 * and serves its session: in a child JVM ({@link SessionProcess}: a crashing kernel ends only its session, the
 * client gets SessionCrashed) or, on Android, in this process.
 */
public final class DeviceServer implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger(DeviceServer.class.getName());
    public static final String SERVER_NAME = "tether-rpc-java/0.1.0";
    private static final int MAX_PENDING = 64;
    private static final long QUEUE_POLL_MS = 20;
    private static final int MAX_QUEUE = 16;

    private final DeviceConfig config;
    private final StatusListener listener;
    private final boolean childSessions;
    private final Object lock = new Object();
    private final LinkedList<Conn> queue = new LinkedList<Conn>();
    private Conn active;
    /** Connections still in their handshake, oldest first (at most MAX_PENDING). */
    private final java.util.LinkedHashSet<Socket> handshaking = new java.util.LinkedHashSet<Socket>();
    private long sessions;
    private ServerSocket listenerSocket;
    private Thread acceptThread;
    private SessionProcess spare;
    private SessionProcess running;
    private Registrar registrar;
    private volatile boolean closed;
    private final CountDownLatch stopped = new CountDownLatch(1);
    // status fields, reported as one immutable Status
    private boolean registered;
    private String lastCall;
    private double lastCallMs;
    private String lastError;
    private String listening;

    public DeviceServer(DeviceConfig c, StatusListener l) {
        this.config = c;
        this.listener = l;
        this.childSessions = c.sessionsInChildProcess();
    }

    /** Binds (unless only registering in reverse), starts accepting and, with a tracker, registering. */
    public void start() throws IOException {
        NativeBridge.load(config.nativeLibDir);
        if (!childSessions) {
            CrashReport.install();   // a kernel's crash still reaches the client as SessionCrashed
        }
        if (config.workDir == null) {
            config.workDir = new File(System.getProperty("java.io.tmpdir"));
        }
        if (!config.workDir.isDirectory() && !config.workDir.mkdirs()) {
            throw new IOException("cannot create the work folder " + config.workDir);
        }
        if (!config.reverse) {
            listenerSocket = new ServerSocket();
            listenerSocket.setReuseAddress(true);
            listenerSocket.bind(new InetSocketAddress(InetAddress.getByName(config.host), config.port), 64);
            listening = config.host + ":" + listenerSocket.getLocalPort();
            acceptThread = new Thread(new Runnable() {
                public void run() {
                    acceptLoop();
                }
            }, "tether-accept");
            acceptThread.setDaemon(true);
            acceptThread.start();
        }
        if (childSessions) {
            prepareSpare();
        }
        if (config.trackerHost != null) {
            registrar = new Registrar(config, this, listenerSocket == null ? 0 : listenerSocket.getLocalPort());
            registrar.start();
        }
        publish();
    }

    /** "host:port" this server listens on, or null in reverse mode. */
    public String address() {
        return listening;
    }

    // -- status -------------------------------------------------------------------------------------------------
    void setRegistered(boolean r, String error) {
        synchronized (lock) {
            registered = r;
            if (error != null) {
                lastError = error;
            }
        }
        publish();
    }

    private void publish() {
        if (listener == null) {
            return;
        }
        Status s;
        synchronized (lock) {
            s = new Status(registered, active != null, lastCall, lastCallMs, lastError, listening);
        }
        try {
            listener.onStatus(s);
        } catch (RuntimeException e) {
            LOG.log(Level.WARNING, "the status listener failed", e);
        }
    }

    private void onCall(String name, double ms) {
        synchronized (lock) {
            lastCall = name;
            lastCallMs = ms;
        }
        publish();
    }

    boolean busy() {
        synchronized (lock) {
            return active != null || !queue.isEmpty();
        }
    }

    // -- connections --------------------------------------------------------------------------------------------
    private void acceptLoop() {
        while (!closed) {
            Socket s;
            try {
                s = listenerSocket.accept();
            } catch (IOException e) {
                if (!closed) {
                    LOG.log(Level.WARNING, "accept failed; no more connections", e);
                }
                return;
            }
            adopt(s);
        }
    }

    /** Serve a connection (accepted here, or dialled to a tracker by the registrar). */
    void adopt(final Socket s) {
        synchronized (lock) {
            if (closed) {
                closeQuietly(s);
                return;
            }
            // Evict the oldest handshake rather than refuse the newcomer: a flood of silent connections then
            // cannot lock a real client out (as rpc-server does)
            if (handshaking.size() >= MAX_PENDING) {
                Socket oldest = handshaking.iterator().next();
                handshaking.remove(oldest);
                closeQuietly(oldest);
            }
            handshaking.add(s);
        }
        Thread t = new Thread(new Runnable() {
            public void run() {
                try {
                    handle(s);
                } finally {
                    handshakeOver(s);
                    closeQuietly(s);
                }
            }
        }, "tether-conn");
        t.setDaemon(true);
        t.start();
    }

    private void handshakeOver(Socket s) {
        synchronized (lock) {
            handshaking.remove(s);
        }
    }

    static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (IOException e) {
            // nothing to do
        }
    }

    /** A connection from handshake to the end of its session. */
    private final class Conn {
        final Socket socket;
        final Wire wire;
        final InputStream in;
        boolean admitted;
        String match;
        long grantTimeoutMs;   // a tracker grant's session timeout (0: none)

        Conn(Socket socket, InputStream in, OutputStream out) {
            this.socket = socket;
            this.in = in;
            this.wire = new Wire(in, out);
        }
    }

    private void handle(Socket s) {
        Conn conn;
        try {
            s.setTcpNoDelay(true);
            conn = new Conn(s, new BufferedInputStream(s.getInputStream(), 1 << 16),
                    new BufferedOutputStream(s.getOutputStream(), 1 << 16));
        } catch (IOException e) {
            return;
        }
        Map<String, Object> welcome;
        boolean wait;
        try {
            long deadline = System.currentTimeMillis() + config.handshakeTimeoutMs;
            Frame hello = readHandshake(conn, deadline);
            if (hello == null) {
                return;
            }
            if (hello.type != Wire.HELLO) {
                throw new ProtocolException("expected HELLO, got message type " + hello.type);
            }
            Map<String, Object> p = hello.payload;
            if (!Protocol.MAGIC.equals(p.get("magic"))) {
                throw new ProtocolException("not a tether client: HELLO magic is " + repr(p.get("magic"))
                        + ", expected 'tether-rpc'");
            }
            Object version = p.get("version");
            if (!Long.valueOf(Protocol.VERSION).equals(version)) {
                conn.wire.sendError(0, "VersionMismatch", "client speaks tether protocol version " + repr(version)
                        + ", this server speaks version " + Protocol.VERSION, "");
                return;
            }
            Object caps = p.containsKey("caps") ? p.get("caps") : new ArrayList<Object>();
            boolean capsOk = caps instanceof List;
            if (capsOk) {
                for (Object c : (List<?>) caps) {
                    capsOk &= c instanceof String;
                }
            }
            if (!capsOk) {
                throw new ProtocolException("HELLO caps must be a list of strings");
            }
            Object match = p.get("match");
            if (match != null && !(match instanceof String)) {
                throw new ProtocolException("HELLO match must be a string");
            }
            wait = !Boolean.FALSE.equals(p.get("wait"));
            welcome = new LinkedHashMap<String, Object>();
            welcome.put("version", (long) Protocol.VERSION);
            welcome.put("caps", new ArrayList<Object>(Arrays.asList((Object[]) Protocol.CAPABILITIES)));
            welcome.put("server", SERVER_NAME);
            if (config.token != null) {
                byte[] nonce = Handshake.newNonce();
                Map<String, Object> ch = new LinkedHashMap<String, Object>();
                ch.put("algo", Handshake.AUTH_ALGO);
                ch.put("nonce", nonce);
                conn.wire.send(Wire.CHALLENGE, 0, ch);
                Frame auth = readHandshake(conn, deadline);
                if (auth == null) {
                    return;
                }
                if (auth.type != Wire.AUTH) {
                    throw new ProtocolException("expected AUTH, got message type " + auth.type);
                }
                Object cn = auth.payload.get("nonce");
                if (!(cn instanceof byte[]) || ((byte[]) cn).length != Handshake.NONCE_SIZE) {
                    conn.wire.sendError(0, "AuthenticationError", "AUTH must carry a 32-byte nonce", "");
                    return;
                }
                byte[] clientNonce = (byte[]) cn;
                if (!Handshake.macsEqual(auth.payload.get("mac"), Handshake.clientMac(config.token, nonce, clientNonce))) {
                    conn.wire.sendError(0, "AuthenticationError", "wrong token: the server refused the authentication", "");
                    return;
                }
                welcome.put("proof", Handshake.serverProof(config.token, nonce, clientNonce));
            }
            conn.match = (String) match;
            Registrar r = registrar;
            Long grant = r != null ? r.acceptMatch((String) match) : Long.valueOf(0);
            if (grant == null) {
                conn.wire.sendError(0, "AuthenticationError", "this device does not accept the session's match token "
                        + repr(match), "");
                return;
            }
            conn.grantTimeoutMs = grant;
        } catch (SocketTimeoutException e) {
            sendQuietly(conn, "TetherTimeout", "no complete handshake within "
                    + (config.handshakeTimeoutMs / 1000.0) + " s");
            return;
        } catch (ProtocolException e) {
            sendQuietly(conn, e.wireType(), e.getMessage());
            return;
        } catch (IOException e) {
            return;
        }
        handshakeOver(s);
        if (!admit(conn, wait)) {
            return;
        }
        try {
            conn.socket.setSoTimeout(0);  // the handshake's deadline is over: a session may be quiet (idle timeout)
        } catch (IOException e) {
            return;
        }
        try {
            runSession(conn, welcome);
        } finally {
            synchronized (lock) {
                if (active == conn) {
                    active = null;
                }
            }
            admitNext();
            publish();
        }
    }

    private static String repr(Object o) {
        return o instanceof String ? "'" + o + "'" : String.valueOf(o);
    }

    private void sendQuietly(Conn conn, String type, String message) {
        try {
            conn.wire.sendError(0, type, message, "");
        } catch (IOException e) {
            // the peer is gone
        }
    }

    private Frame readHandshake(Conn conn, long deadline) throws IOException {
        long left = deadline - System.currentTimeMillis();
        if (left <= 0) {
            throw new SocketTimeoutException("handshake");
        }
        conn.socket.setSoTimeout((int) left);
        return conn.wire.read(Limits.HANDSHAKE);
    }

    /** Waits for the device (queued, with position EVENTs); false if refused or the client gave up. */
    private boolean admit(Conn conn, boolean wait) {
        synchronized (lock) {
            if (closed) {
                return false;
            }
            if (active == null && queue.isEmpty()) {
                active = conn;
                conn.admitted = true;
                return true;
            }
            if (!wait || queue.size() >= MAX_QUEUE) {
                sendQuietly(conn, "DeviceBusy", wait ? "the device's queue is full (" + queue.size() + " waiting)"
                        : "the device is serving another session (" + queue.size() + " waiting); connect with "
                        + "wait=True to queue");
                return false;
            }
            queue.add(conn);
        }
        notifyQueue();
        // A queued client has nothing to say: a byte or EOF means it gives up its place.
        try {
            conn.socket.setSoTimeout((int) QUEUE_POLL_MS);
            while (true) {
                synchronized (lock) {
                    if (conn.admitted) {
                        conn.socket.setSoTimeout(0);
                        return true;
                    }
                    if (closed) {
                        queue.remove(conn);
                        return false;
                    }
                }
                try {
                    conn.in.read();
                    break;  // data or EOF: the client gave up its place
                } catch (SocketTimeoutException e) {
                    // still waiting
                }
            }
        } catch (IOException e) {
            // gone
        }
        boolean admitted;
        synchronized (lock) {
            admitted = conn.admitted;
            queue.remove(conn);
            if (admitted && active == conn) {
                active = null;  // admitted just as it left
            }
        }
        if (admitted) {
            admitNext();
        }
        notifyQueue();
        return false;
    }

    private void notifyQueue() {
        List<Conn> q;
        synchronized (lock) {
            q = new ArrayList<Conn>(queue);
        }
        for (int i = 0; i < q.size(); i++) {
            Map<String, Object> ev = new LinkedHashMap<String, Object>();
            ev.put("kind", "queued");
            ev.put("position", (long) (i + 1));
            try {
                q.get(i).wire.send(Wire.EVENT, 0, ev);
            } catch (IOException e) {
                closeQuietly(q.get(i).socket);
            }
        }
    }

    private void admitNext() {
        synchronized (lock) {
            if (active == null && !queue.isEmpty() && !closed) {
                Conn next = queue.removeFirst();
                next.admitted = true;
                active = next;
            }
        }
        notifyQueue();
    }

    // -- sessions -----------------------------------------------------------------------------------------------
    private void runSession(final Conn conn, Map<String, Object> welcome) {
        long id;
        synchronized (lock) {
            id = ++sessions;
        }
        welcome.put("session", id);
        File folder;
        try {
            folder = File.createTempFile("tether-session-" + id + "-", "", config.workDir);
            if (!folder.delete() || !folder.mkdir()) {
                throw new IOException("cannot create a session folder in " + config.workDir);
            }
        } catch (IOException e) {
            sendQuietly(conn, "SessionCrashed", "the device could not start a session: " + e.getMessage());
            return;
        }
        Registrar r = registrar;
        if (r != null) {
            r.sessionStarted(conn.match);
        }
        publish();
        try {
            conn.wire.send(Wire.WELCOME, 0, welcome);
            if (childSessions) {
                runInChild(conn, folder);
            } else {
                runInProcess(conn, folder);
            }
        } catch (IOException e) {
            // the client is gone
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            SessionFolder.delete(folder);
            if (r != null) {
                r.sessionEnded();
            }
        }
    }

    private void runInChild(Conn conn, File folder) throws IOException, InterruptedException {
        SessionProcess worker;
        synchronized (lock) {
            worker = spare;
            spare = null;
        }
        if (worker == null || !worker.alive()) {
            worker = SessionProcess.start(config);
        }
        final SessionProcess w = worker;
        synchronized (lock) {
            running = w;
        }
        final boolean[] timedOut = new boolean[1];
        Thread timer = sessionTimer(conn, new Runnable() {
            public void run() {
                timedOut[0] = true;
                w.kill();
            }
        });
        SessionProcess.Outcome out;
        try {
            out = w.serve(conn.socket, conn.in, folder, new SessionProcess.Listener() {
                public void onCall(String name, double ms) {
                    DeviceServer.this.onCall(name, ms);
                }
            });
        } finally {
            if (timer != null) {
                timer.interrupt();
            }
            synchronized (lock) {
                running = null;
            }
            prepareSpare();
        }
        String type = null;
        String message = null;
        LOG.info("session worker exited with status " + out.exitCode
                + (out.clientGone ? " (the client hung up or sent CLOSE)" : ""));
        if (timedOut[0]) {
            type = "TetherTimeout";
            message = sessionTimeoutMessage(conn);
        } else if (out.exitCode != 0 && !out.clientGone) {
            type = "SessionCrashed";
            if (out.signal != null) {
                message = "the session worker died from " + out.signal + " (" + out.signalNumber + "), probably in a "
                        + "kernel; the server keeps serving, start a new session";
            } else if (out.exitCode > 128) {
                message = "the session worker died from signal " + (out.exitCode - 128) + "; the server keeps "
                        + "serving, start a new session";
            } else {
                message = "the session worker exited with status " + out.exitCode;
            }
        }
        if (type != null) {
            synchronized (lock) {
                lastError = message;
            }
            LOG.warning("session: " + message);
            sendQuietly(conn, type, message);
        }
    }

    private void runInProcess(final Conn conn, File folder) throws IOException {
        final Session s = new Session(folder, conn.in, conn.socket.getOutputStream(), config.idleMs(), config.limits(),
                new Session.CallListener() {
                    public void onCall(String name, double ms) {
                        DeviceServer.this.onCall(name, ms);
                    }
                });
        // a timeout closes the socket under a kernel that may still run: its descriptor number can then be reused,
        // so the crash report is disarmed first (the client has its TetherTimeout)
        final CrashReport report = CrashReport.arm(conn.socket);
        s.onIdle = new Runnable() {
            public void run() {
                CrashReport.disarm(report);
                closeQuietly(conn.socket);
            }
        };
        Thread timer = sessionTimer(conn, new Runnable() {
            public void run() {
                // a kernel running in this process cannot be stopped; the client is told and let go
                sendQuietly(conn, "TetherTimeout", sessionTimeoutMessage(conn));
                CrashReport.disarm(report);
                closeQuietly(conn.socket);
            }
        });
        try {
            s.serve();
        } finally {
            CrashReport.disarm(report);
            if (timer != null) {
                timer.interrupt();
            }
        }
    }

    /** The session's time limit in ms: the server's --session-timeout, or a tracker grant's if shorter (0: none). */
    private long sessionLimitMs(Conn conn) {
        long own = config.sessionTimeoutS * 1000L;
        long grant = conn.grantTimeoutMs;
        return own > 0 && grant > 0 ? Math.min(own, grant) : Math.max(own, grant);
    }

    private String sessionTimeoutMessage(Conn conn) {
        return "the session ran past its session timeout of " + sessionLimitMs(conn) / 1000.0 + " s and was ended";
    }

    /** Runs {@code onTimeout} when the session's time limit runs out, unless interrupted first (null: no limit). */
    private Thread sessionTimer(Conn conn, final Runnable onTimeout) {
        final long limit = sessionLimitMs(conn);
        if (limit <= 0) {
            return null;
        }
        Thread t = new Thread(new Runnable() {
            public void run() {
                try {
                    Thread.sleep(limit);
                } catch (InterruptedException e) {
                    return;
                }
                onTimeout.run();
            }
        }, "tether-session-timeout");
        t.setDaemon(true);
        t.start();
        return t;
    }

    private void prepareSpare() {
        if (!childSessions || closed) {
            return;
        }
        synchronized (lock) {
            if (spare != null && spare.alive()) {
                return;
            }
        }
        try {
            SessionProcess p = SessionProcess.start(config);
            synchronized (lock) {
                if (spare == null && !closed) {
                    spare = p;
                    return;
                }
            }
            p.kill();
        } catch (IOException e) {
            LOG.log(Level.SEVERE, "cannot start a session worker JVM", e);
        }
    }

    // -- shutdown -----------------------------------------------------------------------------------------------
    @Override
    public void close() {
        List<Conn> conns;
        SessionProcess p;
        synchronized (lock) {
            if (closed) {
                return;
            }
            closed = true;
            conns = new ArrayList<Conn>(queue);
            if (active != null) {
                conns.add(active);
            }
            p = spare;
            spare = null;
            if (running != null) {
                running.kill();
            }
        }
        if (registrar != null) {
            registrar.close();
        }
        if (listenerSocket != null) {
            try {
                listenerSocket.close();
            } catch (IOException e) {
                // closing anyway
            }
        }
        for (Conn c : conns) {
            closeQuietly(c.socket);
        }
        if (p != null) {
            p.kill();
        }
        stopped.countDown();
    }

    /** Blocks until {@link #close}. */
    public void awaitClose() throws InterruptedException {
        stopped.await();
    }

    /** The desktop entry (android_app/run_device.sh): serve until SIGTERM or SIGINT. */
    public static void main(String[] args) throws Exception {
        if (System.getProperty("java.util.logging.SimpleFormatter.format") == null) {
            System.setProperty("java.util.logging.SimpleFormatter.format", "%1$tT %3$s %4$s %5$s%6$s%n");
        }
        DeviceConfig c;
        try {
            c = DeviceConfig.fromArgs(args);
        } catch (IllegalArgumentException e) {
            System.err.println("run_device: " + e.getMessage());
            System.exit(2);
            return;
        }
        final DeviceServer server = new DeviceServer(c, null);  // the registrar prints "registered" itself
        Runtime.getRuntime().addShutdownHook(new Thread(new Runnable() {
            public void run() {
                server.close();
            }
        }, "tether-shutdown"));
        server.start();
        if (server.address() != null) {
            LOG.info("tether device server (Java, " + ElfInfo.hostArch() + ", sessions in "
                    + (server.childSessions ? "child JVMs" : "this process") + ") listening on " + server.address());
        }
        server.awaitClose();
    }
}
