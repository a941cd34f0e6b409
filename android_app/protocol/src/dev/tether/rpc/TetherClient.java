package dev.tether.rpc;

import java.io.Closeable;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small blocking client for a tether device server: one TCP connection = one session.
 *
 * <pre>
 * TetherClient c = TetherClient.connect("127.0.0.1", 9090, new TetherClient.Options().token("secret"));
 * try {
 *     Object v = c.call("tether.echo", 1L);
 *     Map&lt;String, Object&gt; info = c.deviceInfo();
 * } finally {
 *     c.close();
 * }
 * </pre>
 *
 * TCP_NODELAY is on and every frame leaves in one write. Every read has a timeout. An ERROR reply to a call is
 * thrown as {@link RemoteException} and the session stays usable; a transport or protocol failure closes the
 * client (the byte stream can no longer be trusted). Calls are serialised (one at a time per client).
 */
public final class TetherClient implements Closeable {
    /** Connection options; fluent setters. */
    public static final class Options {
        int connectTimeoutMs = 10000;
        int readTimeoutMs = 60000;
        int writeTimeoutMs = 60000;
        int queueTimeoutMs = 600000;
        String token;
        String match;
        boolean wait = true;
        String clientName = "tether-java";
        Limits limits = Limits.DEFAULT;
        EventListener queueListener;

        /** TCP connect and handshake (until WELCOME or a queue notice). Default 10 s. */
        public Options connectTimeoutMs(int ms) {
            connectTimeoutMs = ms;
            return this;
        }

        /** Longest silence while waiting for any reply frame or bulk bytes. Default 60 s. */
        public Options readTimeoutMs(int ms) {
            readTimeoutMs = ms;
            return this;
        }

        /** Longest time one frame (with its bulk bytes) may take to send; 0 = no limit. Default 60 s. */
        public Options writeTimeoutMs(int ms) {
            writeTimeoutMs = ms;
            return this;
        }

        /** Longest wait in the device's queue once queued (with {@code wait(true)}). Default 10 min. */
        public Options queueTimeoutMs(int ms) {
            queueTimeoutMs = ms;
            return this;
        }

        public Options token(String token) {
            this.token = token == null || token.isEmpty() ? null : token;
            return this;
        }

        /** A one-time token issued by a tracker. */
        public Options match(String match) {
            this.match = match;
            return this;
        }

        /** Wait in the queue when the device is busy (true, default) or fail with DeviceBusy (false). */
        public Options waitIfBusy(boolean wait) {
            this.wait = wait;
            return this;
        }

        public Options clientName(String name) {
            clientName = name;
            return this;
        }

        public Options limits(Limits limits) {
            this.limits = limits;
            return this;
        }

        /** Called with each {@code queued} EVENT while waiting for the session. */
        public Options queueListener(EventListener l) {
            queueListener = l;
            return this;
        }
    }

    private final String host;
    private final int port;
    private final Options options;
    private final FrameConnection conn;
    private long sessionId;
    private String serverName = "";
    private List<Object> serverCaps = new ArrayList<Object>();
    private boolean closed;

    private TetherClient(String host, int port, Options options) throws IOException {
        this.host = host;
        this.port = port;
        this.options = options;
        conn = new FrameConnection(host, port, options.connectTimeoutMs, options.readTimeoutMs,
                options.writeTimeoutMs, options.limits);
        try {
            handshake();
        } catch (Throwable t) { // rethrown as is: handshake() throws only IOException and unchecked ones
            closeQuietly();
            throw t;
        }
    }

    /** Connects and completes the handshake (authenticating when a token is set). */
    public static TetherClient connect(String host, int port, Options options) throws IOException {
        return new TetherClient(host, port, options == null ? new Options() : options);
    }

    public static TetherClient connect(String host, int port) throws IOException {
        return connect(host, port, new Options());
    }

    public long sessionId() {
        return sessionId;
    }

    public String serverName() {
        return serverName;
    }

    public List<Object> serverCaps() {
        return serverCaps;
    }

    public boolean isClosed() {
        return closed;
    }

    // -- handshake ---------------------------------------------------------------------------------------------
    private void handshake() throws IOException {
        Options o = options;
        send(FrameCodec.encodeFrame(MsgType.HELLO, 0,
                Handshake.helloPayload(Protocol.CAPABILITIES, o.match, o.wait, o.clientName)), null);
        byte[] serverNonce = new byte[0];
        byte[] clientNonce = new byte[0];
        long deadline = System.currentTimeMillis() + o.connectTimeoutMs;
        // Bounded: every turn either returns, throws, or reads a frame within the remaining time.
        while (true) {
            Frame f = readFrame(deadline, "the handshake with " + host + ":" + port);
            MsgType t = f.msgType();
            if (t == MsgType.CHALLENGE) {
                if (o.token == null) {
                    throw new AuthenticationException("the server at " + host + ":" + port
                            + " requires a token: set Options.token(...)");
                }
                Object ns = f.payload.get("nonce");
                serverNonce = ns instanceof byte[] ? (byte[]) ns : new byte[0];
                clientNonce = Handshake.newNonce();
                Map<String, Object> auth = new LinkedHashMap<String, Object>();
                auth.put("nonce", clientNonce);
                auth.put("mac", Handshake.clientMac(o.token, serverNonce, clientNonce));
                send(FrameCodec.encodeFrame(MsgType.AUTH, 0, auth), null);
            } else if (t == MsgType.WELCOME) {
                Handshake.checkWelcome(f.payload);
                if (o.token != null && !Handshake.macsEqual(f.payload.get("proof"),
                        Handshake.serverProof(o.token, serverNonce, clientNonce))) {
                    throw new AuthenticationException("the server at " + host + ":" + port
                            + " did not prove it knows the token");
                }
                Object s = f.payload.get("session");
                sessionId = s instanceof Long ? (Long) s : 0;
                Object name = f.payload.get("server");
                serverName = name instanceof String ? (String) name : "";
                Object caps = f.payload.get("caps");
                if (caps instanceof List) {
                    @SuppressWarnings("unchecked")
                    List<Object> c = (List<Object>) caps;
                    serverCaps = c;
                }
                return;
            } else if (t == MsgType.EVENT && "queued".equals(f.payload.get("kind"))) {
                // Queued: from now on the queue timeout bounds the wait.
                deadline = Math.max(deadline, System.currentTimeMillis() + o.queueTimeoutMs);
                if (o.queueListener != null) {
                    o.queueListener.onEvent(f.requestId, f.payload);
                }
            } else if (t == MsgType.ERROR) {
                throw handshakeError(f.payload);
            } else {
                throw new ProtocolException("unexpected message type " + f.type + " during the handshake");
            }
        }
    }

    private TetherException handshakeError(Map<String, Object> payload) {
        RemoteException e = RemoteException.fromPayload(0, payload);
        String type = e.remoteType();
        String where = " (server " + host + ":" + port + ")";
        if (Protocol.ERR_AUTHENTICATION.equals(type)) {
            return new AuthenticationException(e.remoteMessage() + where);
        }
        if (Protocol.ERR_VERSION_MISMATCH.equals(type)) {
            return new VersionMismatchException(e.remoteMessage() + where);
        }
        return e;
    }

    // -- calls -------------------------------------------------------------------------------------------------
    /** Calls a built-in (by name) or a remote function (by handle) and returns the RETURN value. */
    public Object call(Object fn, Object... args) throws IOException {
        return call(fn, Arrays.asList(args), null, null).value;
    }

    /**
     * The general call: {@code bulk} (or null) travels after the CALL with {@code nbytes}; EVENT frames for this
     * call go to {@code listener} as they arrive; bulk bytes after the RETURN end up in {@link Reply#bulk}.
     */
    public Reply call(Object fn, List<?> args, byte[] bulk, EventListener listener) throws IOException {
        return call(fn, args, bulk, listener, null, 0);
    }

    /** As above; bulk bytes after the RETURN are read straight into {@code dest[destOff...]} (sizes must match). */
    public synchronized Reply call(Object fn, List<?> args, byte[] bulk, EventListener listener, byte[] dest,
                                   int destOff) throws IOException {
        if (closed) {
            throw new ConnectionClosedException("this client is closed");
        }
        long rid = conn.nextRequestId();
        Map<String, Object> payload = new LinkedHashMap<String, Object>();
        payload.put("fn", fn);
        payload.put("args", args == null ? new ArrayList<Object>() : args);
        if (bulk != null) {
            payload.put("nbytes", (long) bulk.length);
        }
        // An unencodable argument throws IllegalArgumentException here, before anything is sent.
        byte[] frame = FrameCodec.encodeFrame(MsgType.CALL, rid, payload);
        boolean ok = false;
        try {
            send(frame, bulk);
            Reply r = awaitReply(rid, listener, dest, destOff);
            ok = true;
            return r;
        } catch (RemoteException e) {
            ok = !e.endsSession();
            throw e;
        } finally {
            if (!ok) {
                closeQuietly();
            }
        }
    }

    private Reply awaitReply(long rid, EventListener listener, byte[] dest, int destOff) throws IOException {
        // Bounded by the read timeout: each frame must arrive within it (a kernel's EVENTs keep it alive).
        while (true) {
            Frame f = readFrame(0, "the reply to call " + rid);
            if (f.requestId != rid && f.requestId != 0) {
                throw new ProtocolException("reply for request " + f.requestId + " while waiting for " + rid);
            }
            long nbytes = f.bulkSize(options.limits);
            MsgType t = f.msgType();
            if (t == MsgType.RETURN && f.requestId == rid) {
                byte[] data = null;
                if (f.payload.containsKey("nbytes")) {
                    if (dest != null) {
                        if (nbytes != dest.length - destOff) {
                            skip(nbytes);
                            throw new ProtocolException("the reply carries " + nbytes + " bulk bytes, the destination"
                                    + " holds " + (dest.length - destOff));
                        }
                        readFully(dest, destOff, (int) nbytes);
                    } else {
                        if (nbytes > Integer.MAX_VALUE - 8) {
                            throw new FrameTooLargeException("bulk payload of " + nbytes
                                    + " bytes does not fit a Java array; pass a destination");
                        }
                        data = new byte[(int) nbytes];
                        readFully(data, 0, data.length);
                    }
                }
                return new Reply(rid, f.payload, data);
            }
            skip(nbytes);
            if (t == MsgType.EVENT) {
                if (listener != null) {
                    listener.onEvent(f.requestId, f.payload);
                }
            } else if (t == MsgType.ERROR) {
                throw RemoteException.fromPayload(f.requestId, f.payload);
            } else if (t == MsgType.CLOSE) {
                Object reason = f.payload.get("reason");
                throw new ConnectionClosedException("the server closed the session"
                        + (reason != null ? ": " + reason : ""));
            } else {
                throw new ProtocolException("unexpected message type " + f.type + " while waiting for a reply");
            }
        }
    }

    // -- built-in conveniences ---------------------------------------------------------------------------------
    @SuppressWarnings("unchecked")
    public Map<String, Object> deviceInfo() throws IOException {
        return (Map<String, Object>) call("tether.device_info");
    }

    @SuppressWarnings("unchecked")
    public List<Object> functions() throws IOException {
        return (List<Object>) call("tether.functions");
    }

    /** Uploads {@code content} as {@code name} into the session folder; returns {@code {name, size}}. */
    @SuppressWarnings("unchecked")
    public Map<String, Object> upload(String name, byte[] content) throws IOException {
        return (Map<String, Object>) call("tether.upload", Arrays.<Object>asList(name), content, null).value;
    }

    public byte[] download(String name) throws IOException {
        return call("tether.download", Arrays.<Object>asList(name), null, null).bulk;
    }

    /** Copies {@code data} (exactly the array's nbytes) into a remote array. */
    public void copyIn(RemoteHandle array, byte[] data) throws IOException {
        call("tether.array.copy_in", Arrays.<Object>asList(array), data, null);
    }

    /** Copies a remote array's bytes into {@code dest} (its length must be the array's nbytes). */
    public void copyOut(RemoteHandle array, byte[] dest) throws IOException {
        call("tether.array.copy_out", Arrays.<Object>asList(array), null, null, dest, 0);
    }

    // -- transport ---------------------------------------------------------------------------------------------
    private void send(byte[] frame, byte[] bulk) throws IOException {
        conn.send(frame, bulk);
    }

    private Frame readFrame(long deadline, String what) throws IOException {
        return conn.readFrame(deadline, what);
    }

    private void readFully(byte[] dest, int off, int len) throws IOException {
        conn.readFully(dest, off, len);
    }

    private void skip(long n) throws IOException {
        conn.skip(n);
    }

    /** Ends the session (CLOSE, then the socket); idempotent. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        try {
            Map<String, Object> p = new LinkedHashMap<String, Object>();
            p.put("reason", "client closed");
            conn.send(FrameCodec.encodeFrame(MsgType.CLOSE, 0, p), null);
        } catch (IOException ignored) {
            // the connection is gone already: closing the socket below is all that is left to do
        }
        closeQuietly();
    }

    private void closeQuietly() {
        closed = true;
        conn.close();
    }
}
