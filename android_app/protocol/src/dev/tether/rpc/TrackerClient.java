package dev.tether.rpc;

import java.io.Closeable;
import java.io.IOException;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A blocking client for a tether tracker (docs/tracker.md): list the pooled devices, or request one by key and open
 * a session on it.
 *
 * <pre>
 * TrackerClient t = TrackerClient.connect("10.0.0.2", 9190, null);
 * Map&lt;String, Object&gt; s = t.summary();                    // {devices: [...], queues: {...}, stats}
 * TetherClient device = t.requestSession("rasp4b", 1, 60, 600, new TetherClient.Options());
 * </pre>
 */
public final class TrackerClient implements Closeable {
    public static final String MAGIC = "tether-tracker";
    public static final int VERSION = 1;

    // Tracker message types (64..127).
    public static final int HELLO = 64;
    public static final int CHALLENGE = 65;
    public static final int AUTH = 66;
    public static final int WELCOME = 67;
    public static final int REQUEST = 80;
    public static final int QUEUED = 81;
    public static final int GRANT = 82;
    public static final int SUMMARY = 83;
    public static final int SUMMARY_REPLY = 84;
    public static final int CANCEL = 85;

    /** A device handed out by the tracker: connect to it (or, for a relayed device, to the tracker) with the match. */
    public static final class Grant {
        public final String host;
        public final int port;
        public final String match;
        public final boolean relay;
        public final Map<String, Object> payload;

        Grant(String host, int port, String match, boolean relay, Map<String, Object> payload) {
            this.host = host;
            this.port = port;
            this.match = match;
            this.relay = relay;
            this.payload = payload;
        }

        @Override
        public String toString() {
            return "Grant(" + host + ":" + port + (relay ? " via relay" : "") + ", key " + payload.get("key") + ")";
        }
    }

    private final FrameConnection conn;
    private final String token;
    private final int connectTimeoutMs;
    private long peerId;
    private String trackerName = "";

    private TrackerClient(String host, int port, String token, int connectTimeoutMs, int readTimeoutMs)
            throws IOException {
        this.token = token == null || token.isEmpty() ? null : token;
        this.connectTimeoutMs = connectTimeoutMs;
        conn = new FrameConnection(host, port, connectTimeoutMs, readTimeoutMs, readTimeoutMs, Limits.DEFAULT);
        try {
            handshake();
        } catch (Throwable t) { // rethrown as is: handshake() throws only IOException and unchecked ones
            conn.close();
            throw t;
        }
    }

    public static TrackerClient connect(String host, int port, String token) throws IOException {
        return connect(host, port, token, 10000, 60000);
    }

    public static TrackerClient connect(String host, int port, String token, int connectTimeoutMs, int readTimeoutMs)
            throws IOException {
        return new TrackerClient(host, port, token, connectTimeoutMs, readTimeoutMs);
    }

    public String trackerName() {
        return trackerName;
    }

    public long peerId() {
        return peerId;
    }

    private void handshake() throws IOException {
        Map<String, Object> hello = new LinkedHashMap<String, Object>();
        hello.put("magic", MAGIC);
        hello.put("version", (long) VERSION);
        hello.put("role", "client");
        hello.put("name", "tether-java");
        conn.send(FrameCodec.encodeFrame(HELLO, 0, hello), null);
        byte[] serverNonce = new byte[0];
        byte[] clientNonce = new byte[0];
        long deadline = System.currentTimeMillis() + connectTimeoutMs;
        // Bounded: at most a CHALLENGE and a WELCOME, each within the deadline.
        for (int turn = 0; turn < 3; turn++) {
            Frame f = conn.readFrame(deadline, "the tracker handshake with " + conn.where());
            if (f.type == CHALLENGE) {
                if (token == null) {
                    throw new AuthenticationException("the tracker at " + conn.where() + " requires a token");
                }
                Object ns = f.payload.get("nonce");
                serverNonce = ns instanceof byte[] ? (byte[]) ns : new byte[0];
                clientNonce = Handshake.newNonce();
                Map<String, Object> auth = new LinkedHashMap<String, Object>();
                auth.put("nonce", clientNonce);
                auth.put("mac", Handshake.clientMac(token, serverNonce, clientNonce));
                conn.send(FrameCodec.encodeFrame(AUTH, 0, auth), null);
            } else if (f.type == WELCOME) {
                Object v = f.payload.get("version");
                if (!(v instanceof Long) || (Long) v != VERSION) {
                    throw new VersionMismatchException("tracker speaks tracker protocol version " + v
                            + ", this client speaks version " + VERSION);
                }
                if (token != null && !Handshake.macsEqual(f.payload.get("proof"),
                        Handshake.serverProof(token, serverNonce, clientNonce))) {
                    throw new AuthenticationException("the tracker at " + conn.where()
                            + " did not prove it knows the token");
                }
                Object peer = f.payload.get("peer");
                peerId = peer instanceof Long ? (Long) peer : 0;
                Object name = f.payload.get("tracker");
                trackerName = name instanceof String ? (String) name : "";
                return;
            } else if (f.type == MsgType.ERROR.value()) {
                RemoteException e = RemoteException.fromPayload(0, f.payload);
                if (Protocol.ERR_AUTHENTICATION.equals(e.remoteType())) {
                    throw new AuthenticationException(e.remoteMessage() + " (tracker " + conn.where() + ")");
                }
                throw e;
            } else {
                throw new ProtocolException("unexpected message type " + f.type + " during the tracker handshake");
            }
        }
        throw new ProtocolException("the tracker at " + conn.where() + " did not finish its handshake");
    }

    /** {@code {devices: [...], queues: {...}, stats: {...}}}. */
    public synchronized Map<String, Object> summary() throws IOException {
        long rid = conn.nextRequestId();
        conn.send(FrameCodec.encodeFrame(SUMMARY, rid, new LinkedHashMap<String, Object>()), null);
        Frame f = await(rid, SUMMARY_REPLY, 0, null);
        return f.payload;
    }

    /**
     * Asks for a device matching {@code key} (a key, a glob or tag constraints) and waits up to
     * {@code waitTimeoutS} for it; {@code queued} (may be null) sees each QUEUED notice.
     */
    public synchronized Grant request(String key, double priority, double waitTimeoutS, double sessionTimeoutS,
                                      EventListener queued) throws IOException {
        long rid = conn.nextRequestId();
        Map<String, Object> req = new LinkedHashMap<String, Object>();
        req.put("key", key);
        req.put("priority", priority);
        req.put("wait_timeout", waitTimeoutS);
        req.put("session_timeout", sessionTimeoutS);
        conn.send(FrameCodec.encodeFrame(REQUEST, rid, req), null);
        // The tracker answers within wait_timeout (ERROR TetherTimeout); allow a few seconds more for the network.
        long deadline = System.currentTimeMillis() + (long) (waitTimeoutS * 1000) + 10000;
        Frame f = await(rid, GRANT, deadline, queued);
        Object host = f.payload.get("host");
        Object port = f.payload.get("port");
        Object match = f.payload.get("match");
        boolean relay = Boolean.TRUE.equals(f.payload.get("relay")) || host == null || port == null;
        if (!(match instanceof String)) {
            throw new ProtocolException("GRANT without a match token: " + f.payload);
        }
        return new Grant(relay ? conn.host : (String) host, relay ? conn.port : (int) (long) (Long) port,
                (String) match, relay, f.payload);
    }

    /** Requests a device and opens a session on it (the match travels in the HELLO). */
    public TetherClient requestSession(String key, double priority, double waitTimeoutS, double sessionTimeoutS,
                                       TetherClient.Options options) throws IOException {
        Grant g = request(key, priority, waitTimeoutS, sessionTimeoutS, null);
        TetherClient.Options o = options == null ? new TetherClient.Options() : options;
        return TetherClient.connect(g.host, g.port, o.match(g.match));
    }

    private Frame await(long rid, int want, long deadline, EventListener queued) throws IOException {
        // Bounded by the deadline / read timeout per frame.
        while (true) {
            Frame f = conn.readFrame(deadline, "the tracker's reply");
            if (f.requestId != rid) {
                continue; // a late reply to an earlier, abandoned request
            }
            if (f.type == want) {
                return f;
            }
            if (f.type == QUEUED) {
                if (queued != null) {
                    queued.onEvent(rid, f.payload);
                }
            } else if (f.type == MsgType.ERROR.value()) {
                throw RemoteException.fromPayload(rid, f.payload);
            } else {
                throw new ProtocolException("unexpected tracker message type " + f.type);
            }
        }
    }

    @Override
    public void close() {
        conn.close();
    }
}
