package dev.tether.device;

import dev.tether.rpc.Frame;
import dev.tether.rpc.Handshake;
import dev.tether.rpc.Limits;

import java.io.BufferedInputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.logging.Logger;
import java.util.Random;

/**
 * The device's link to a tracker (tether_rpc/registrar.py, docs/tracker.md): HELLO as a "device" (with the
 * tracker's token: CHALLENGE/AUTH, and its proof checked), REGISTER with the device info, HEARTBEATs, EXPECT
 * answered with EXPECTED (the match token is then accepted once, for 30 s), REVOKE, SESSION started and a fresh
 * REGISTER when a session ends, and in reverse mode DIAL: the device opens a connection to the tracker, sends
 * RELAY and serves the session the tracker forwards over it. A lost, refused or silent tracker is retried for
 * ever with capped exponential backoff and jitter. One daemon thread; nothing the tracker sends reaches the server.
 */
final class Registrar {
    private static final Logger LOG = Logger.getLogger(Registrar.class.getName());
    static final int HELLO = 64;
    static final int CHALLENGE = 65;
    static final int AUTH = 66;
    static final int WELCOME = 67;
    static final int REGISTER = 68;
    static final int REGISTERED = 69;
    static final int HEARTBEAT = 70;
    static final int EXPECT = 71;
    static final int EXPECTED = 72;
    static final int REVOKE = 73;
    static final int SESSION = 74;
    static final int DIAL = 75;
    static final int RELAY = 76;
    private static final Limits LIMITS = new Limits(8 << 20, 0, 64 << 10, 4096, 1 << 16, 1 << 12, 0, 8, 32);
    private static final long MATCH_TTL_MS = 30000;
    private static final int CONNECT_TIMEOUT_MS = 5000;
    // the tracker link's reconnect policy (tether_rpc/registrar.py's): 0.1 s doubling to 10 s, each 0.5x-1.5x
    private static final long MIN_BACKOFF_MS = 100;
    private static final long MAX_BACKOFF_MS = 10000;
    private static final double BACKOFF_JITTER = 0.5;

    private final DeviceConfig config;
    private final DeviceServer server;
    private final int port;
    private final Random random = new Random();
    /** match token -> {deadline (ms), the grant's session timeout in ms (0: none)} */
    private final Map<String, long[]> expected = new HashMap<String, long[]>();
    private volatile boolean closed;
    private volatile Socket link;
    private volatile Wire wire;
    private volatile boolean registered;
    private boolean busy;
    private Map<String, Object> info;
    private Thread thread;

    Registrar(DeviceConfig c, DeviceServer s, int port) {
        this.config = c;
        this.server = s;
        this.port = port;
    }

    void start() {
        thread = new Thread(new Runnable() {
            public void run() {
                loop();
            }
        }, "tether-registrar");
        thread.setDaemon(true);
        thread.start();
    }

    private void loop() {
        Backoff backoff = new Backoff(MIN_BACKOFF_MS, MAX_BACKOFF_MS, BACKOFF_JITTER, random);
        while (!closed) {
            long linkedAt = System.currentTimeMillis();
            String why;
            try {
                serveLink();
                why = "the tracker closed the connection";
            } catch (IOException | DeviceError | RuntimeException e) {
                why = e.getMessage() != null ? e.getMessage() : e.toString();
            }
            boolean was = registered;
            dropLink();
            if (closed) {
                return;
            }
            server.setRegistered(false, "tracker " + config.trackerHost + ":" + config.trackerPort + ": " + why);
            if (was && System.currentTimeMillis() - linkedAt > 5000) {
                backoff.reset();
            }
            long delayMs = backoff.nextDelayMs();
            LOG.info("tracker " + config.trackerHost + ":" + config.trackerPort
                    + " unreachable or lost: " + why + String.format(" (retrying in %.2f s)", delayMs / 1000.0));
            try {
                Thread.sleep(delayMs);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    private Socket connect() throws IOException {
        Socket s = new Socket();
        try {
            s.connect(new InetSocketAddress(config.trackerHost, config.trackerPort), CONNECT_TIMEOUT_MS);
            s.setTcpNoDelay(true);
            return s;
        } catch (IOException e) {
            s.close();
            throw e;
        }
    }

    private void serveLink() throws IOException, DeviceError {
        Socket s = connect();
        link = s;
        Wire w = new Wire(new BufferedInputStream(s.getInputStream(), 1 << 16), s.getOutputStream());
        s.setSoTimeout(CONNECT_TIMEOUT_MS);
        Map<String, Object> hello = new LinkedHashMap<String, Object>();
        hello.put("magic", "tether-tracker");
        hello.put("version", 1L);
        hello.put("role", "device");
        hello.put("name", config.key.length() > 64 ? config.key.substring(0, 64) : config.key);
        w.send(HELLO, 0, hello);
        byte[] serverNonce = null;
        byte[] clientNonce = null;
        while (true) {
            Frame f = w.read(LIMITS);
            if (f == null) {
                throw new IOException("the tracker closed the connection during the handshake");
            }
            if (f.type == Wire.ERROR) {
                throw new DeviceError("AuthenticationError", "tracker refused: " + f.payload.get("message"));
            }
            if (f.type == CHALLENGE && serverNonce == null) {
                if (config.trackerToken == null) {
                    throw new DeviceError("AuthenticationError", "the tracker requires a token: pass --tracker-token");
                }
                Object n = f.payload.get("nonce");
                if (!(n instanceof byte[]) || ((byte[]) n).length != Handshake.NONCE_SIZE) {
                    throw new DeviceError("ProtocolError", "the tracker sent a CHALLENGE without a 32-byte nonce");
                }
                serverNonce = (byte[]) n;
                clientNonce = Handshake.newNonce();
                Map<String, Object> auth = new LinkedHashMap<String, Object>();
                auth.put("nonce", clientNonce);
                auth.put("mac", Handshake.clientMac(config.trackerToken, serverNonce, clientNonce));
                w.send(AUTH, 0, auth);
                continue;
            }
            if (f.type == WELCOME) {
                if (config.trackerToken != null && (serverNonce == null || !Handshake.macsEqual(
                        f.payload.get("proof"), Handshake.serverProof(config.trackerToken, serverNonce, clientNonce)))) {
                    throw new DeviceError("AuthenticationError", "the tracker did not prove it knows the token");
                }
                break;
            }
            throw new DeviceError("ProtocolError", "the tracker sent message type " + f.type + " during the handshake");
        }
        wire = w;
        sendRegister();
        double heartbeat = 1.0;
        long lastHeard = System.currentTimeMillis();
        long nextBeat = Long.MAX_VALUE;
        while (!closed) {
            long now = System.currentTimeMillis();
            s.setSoTimeout((int) Math.max(10, Math.min(nextBeat - now, 1000)));
            Frame f;
            try {
                f = w.read(LIMITS);
            } catch (SocketTimeoutException e) {
                now = System.currentTimeMillis();
                if (registered && now >= nextBeat) {
                    send(HEARTBEAT, new LinkedHashMap<String, Object>());
                    nextBeat = now + (long) (heartbeat * 1000);
                }
                if (now - lastHeard > (long) (heartbeat * 1000) * 5 + 5000) {
                    throw new IOException("the tracker went silent");
                }
                continue;
            }
            if (f == null) {
                return;
            }
            lastHeard = System.currentTimeMillis();
            switch (f.type) {
                case REGISTERED: {
                    Object hb = f.payload.get("heartbeat");
                    double v = hb instanceof Double ? (Double) hb : hb instanceof Long ? (Long) hb : 1.0;
                    heartbeat = v >= 0.05 && v <= 60 ? v : 1.0;
                    nextBeat = System.currentTimeMillis() + (long) (heartbeat * 1000);
                    if (!registered) {
                        registered = true;
                        LOG.info("registered with tracker " + config.trackerHost + ":"
                                + config.trackerPort + " as device " + f.payload.get("device") + " (key " + config.key
                                + (config.reverse ? ", reverse" : "") + ")");
                        server.setRegistered(true, null);
                    }
                    break;
                }
                case EXPECT: {
                    String match = checkMatch(f.payload);
                    synchronized (expected) {
                        long t = System.currentTimeMillis();
                        for (Iterator<Map.Entry<String, long[]>> it = expected.entrySet().iterator(); it.hasNext(); ) {
                            if (it.next().getValue()[0] < t) {
                                it.remove();
                            }
                        }
                        if (expected.size() < 64) {
                            Object st = f.payload.get("session_timeout");
                            double limit = st instanceof Double ? (Double) st : st instanceof Long ? (Long) st : 0;
                            long ms = limit > 0 && limit < 1e9 ? (long) Math.ceil(limit * 1000) : 0;
                            expected.put(match, new long[]{t + MATCH_TTL_MS, ms});
                        }
                    }
                    Map<String, Object> p = new LinkedHashMap<String, Object>();
                    p.put("match", match);
                    send(EXPECTED, p);
                    break;
                }
                case REVOKE: {
                    synchronized (expected) {
                        expected.remove(f.payload.get("match"));
                    }
                    break;
                }
                case DIAL:
                    if (!config.reverse) {
                        throw new DeviceError("ProtocolError", "the tracker asked a device not in reverse mode to dial");
                    }
                    dial(checkMatch(f.payload));
                    break;
                case HEARTBEAT:
                    break;
                case Wire.ERROR:
                    throw new DeviceError("TrackerError", "tracker: " + f.payload.get("message"));
                default:
                    throw new DeviceError("ProtocolError", "the tracker sent message type " + f.type);
            }
        }
    }

    private static String checkMatch(Map<String, Object> p) throws DeviceError {
        Object m = p.get("match");
        if (!(m instanceof String) || ((String) m).length() < 8 || ((String) m).length() > 128) {
            throw new DeviceError("ProtocolError", "a match token must be a string of 8 to 128 characters");
        }
        return (String) m;
    }

    /** Reverse mode: a connection to the tracker that becomes the client's session (the tracker relays bytes). */
    private void dial(final String match) {
        Thread t = new Thread(new Runnable() {
            public void run() {
                try {
                    Socket s = connect();
                    Map<String, Object> p = new LinkedHashMap<String, Object>();
                    p.put("match", match);
                    new Wire(null, s.getOutputStream()).send(RELAY, 0, p);
                    server.adopt(s);
                } catch (IOException e) {
                    LOG.warning("reverse dial to the tracker failed: " + e.getMessage());
                }
            }
        }, "tether-dial");
        t.setDaemon(true);
        t.start();
    }

    private Map<String, Object> registerPayload() {
        if (info == null) {
            try {
                info = DeviceInfo.collect();
                Object os = info.get("os");
                if (os instanceof Map) {
                    // a flat "os" string makes the os=linux / os=android tag work (as tether_rpc's registrar)
                    Map<?, ?> o = (Map<?, ?>) os;
                    info.put("os", Boolean.TRUE.equals(o.get("android")) ? "android"
                            : String.valueOf(o.get("system")).toLowerCase());
                    info.put("os_details", os);
                }
            } catch (RuntimeException e) {
                info = new LinkedHashMap<String, Object>();  // device info is a courtesy
            }
        }
        Map<String, Object> p = new LinkedHashMap<String, Object>();
        p.put("key", config.key);
        p.put("port", (long) (config.reverse ? 0 : port));
        p.put("tags", new LinkedHashMap<String, Object>());
        p.put("info", info);
        p.put("reverse", config.reverse);
        p.put("state", busy ? "busy" : "free");
        return p;
    }

    private synchronized void sendRegister() throws IOException {
        send(REGISTER, registerPayload());
    }

    private synchronized void send(int type, Map<String, Object> payload) throws IOException {
        Wire w = wire;
        if (w != null) {
            w.send(type, 0, payload);
        }
    }

    /**
     * Consumes a one-time match token from a HELLO: null to refuse it (not announced by the tracker, revoked or
     * expired), else the grant's session timeout in ms (0: the tracker set none).
     */
    Long acceptMatch(String match) {
        if (match == null) {
            return null;
        }
        synchronized (expected) {
            long[] terms = expected.remove(match);
            return terms != null && terms[0] >= System.currentTimeMillis() ? terms[1] : null;
        }
    }

    synchronized void sessionStarted(String match) {
        busy = true;
        try {
            Map<String, Object> p = new LinkedHashMap<String, Object>();
            p.put("state", "started");
            p.put("match", match);
            send(SESSION, p);
        } catch (IOException e) {
            dropLink();  // the loop reconnects and re-registers
        }
    }

    synchronized void sessionEnded() {
        busy = false;
        try {
            if (registered) {
                sendRegister();
            }
        } catch (IOException e) {
            dropLink();
        }
    }

    private void dropLink() {
        registered = false;
        wire = null;
        synchronized (expected) {
            expected.clear();
        }
        Socket s = link;
        link = null;
        if (s != null) {
            DeviceServer.closeQuietly(s);
        }
    }

    void close() {
        closed = true;
        dropLink();
        if (thread != null) {
            thread.interrupt();
        }
    }
}
