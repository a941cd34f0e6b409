package dev.tether.rpc;

import java.io.BufferedInputStream;
import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.Arrays;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;

/**
 * A TCP connection carrying tether frames: TCP_NODELAY, one write per frame, every read bounded by a timeout,
 * frame lengths and bulk sizes checked against {@link Limits} before allocating. Shared by {@link TetherClient}
 * and {@link TrackerClient}.
 *
 * <p>Every write is bounded too: Java sockets have no send timeout, so a shared watchdog thread closes the socket
 * when one {@link #send} takes longer than the write timeout (a peer that stopped reading), which ends the blocked
 * write; the caller gets a {@link TetherException} saying so.
 */
final class FrameConnection implements Closeable {
    private static final int SMALL_BULK = 64 << 10;
    private static final int CHUNK = 1 << 20;
    private static final ScheduledExecutorService WATCHDOG = Executors.newSingleThreadScheduledExecutor(
            new ThreadFactory() {
                public Thread newThread(Runnable r) {
                    Thread t = new Thread(r, "tether-write-watchdog");
                    t.setDaemon(true);
                    return t;
                }
            });

    final String host;
    final int port;
    private final Socket socket;
    private final InputStream in;
    private final OutputStream out;
    private final byte[] header = new byte[Protocol.HEADER_SIZE];
    private final int readTimeoutMs;
    private final int writeTimeoutMs;
    private volatile boolean writeTimedOut;
    Limits limits;
    private volatile boolean closed;
    private long nextRequestId = 1;

    FrameConnection(String host, int port, int connectTimeoutMs, int readTimeoutMs, int writeTimeoutMs,
            Limits limits) throws IOException {
        this.host = host;
        this.port = port;
        this.readTimeoutMs = readTimeoutMs;
        this.writeTimeoutMs = writeTimeoutMs;
        this.limits = limits;
        socket = new Socket();
        boolean ok = false;
        try {
            socket.setTcpNoDelay(true);
            socket.connect(new InetSocketAddress(host, port), connectTimeoutMs);
            socket.setTcpNoDelay(true);
            in = new BufferedInputStream(socket.getInputStream(), 64 << 10);
            out = socket.getOutputStream();
            ok = true;
        } catch (IOException e) {
            throw new ConnectionClosedException("cannot connect to " + host + ":" + port + ": " + e.getMessage());
        } finally {
            if (!ok) {
                close();
            }
        }
    }

    /** The id for the next request on this connection (ids count from 1; 0 is the session's own). */
    long nextRequestId() {
        return nextRequestId++;
    }

    String where() {
        return host + ":" + port;
    }

    boolean isClosed() {
        return closed;
    }

    /** One write for the frame (and a small bulk with it); a large bulk follows in chunks. The whole send is
     * bounded by the write timeout (0 = none). */
    void send(byte[] frame, byte[] bulk) throws IOException {
        ScheduledFuture<?> guard = null;
        if (writeTimeoutMs > 0) {
            guard = WATCHDOG.schedule(new Runnable() {
                public void run() {
                    writeTimedOut = true;
                    close();
                }
            }, writeTimeoutMs, TimeUnit.MILLISECONDS);
        }
        try {
            sendUnguarded(frame, bulk);
        } finally {
            if (guard != null) {
                guard.cancel(false);
            }
        }
        if (writeTimedOut) { // the write finished just as the watchdog closed the socket
            throw writeTimeout(null);
        }
    }

    private TetherException writeTimeout(IOException cause) {
        return new TetherException("timed out after " + writeTimeoutMs + " ms sending to " + where()
                + " (the peer stopped reading); the connection is closed", cause);
    }

    private void sendUnguarded(byte[] frame, byte[] bulk) throws IOException {
        try {
            if (bulk == null || bulk.length == 0) {
                out.write(frame);
            } else if (bulk.length <= SMALL_BULK) {
                byte[] both = Arrays.copyOf(frame, frame.length + bulk.length);
                System.arraycopy(bulk, 0, both, frame.length, bulk.length);
                out.write(both);
            } else {
                out.write(frame);
                for (int off = 0; off < bulk.length; off += CHUNK) {
                    out.write(bulk, off, Math.min(CHUNK, bulk.length - off));
                }
            }
            out.flush();
        } catch (IOException e) {
            if (writeTimedOut) {
                throw writeTimeout(e);
            }
            throw new ConnectionClosedException("connection to " + where() + " lost while sending: " + e);
        }
    }

    /** Reads one frame; {@code deadline} (ms since epoch, 0 = none) bounds the wait besides the read timeout. */
    Frame readFrame(long deadline, String what) throws IOException {
        int timeout = readTimeoutMs;
        if (deadline != 0) {
            long left = deadline - System.currentTimeMillis();
            if (left <= 0) {
                throw new TetherException("timed out waiting for " + what);
            }
            timeout = (int) Math.min(left, timeout > 0 ? timeout : Integer.MAX_VALUE);
        }
        try {
            socket.setSoTimeout(timeout);
            readFullyRaw(header, 0, header.length);
            int n = FrameCodec.checkedLength(header, 0, limits);
            byte[] body = new byte[n];
            readFullyRaw(body, 0, n);
            return FrameCodec.decodeBody(body, 0, n, limits);
        } catch (SocketTimeoutException e) {
            throw new TetherException("timed out after " + timeout + " ms waiting for " + what, e);
        }
    }

    void readFully(byte[] dest, int off, int len) throws IOException {
        try {
            socket.setSoTimeout(readTimeoutMs);
            readFullyRaw(dest, off, len);
        } catch (SocketTimeoutException e) {
            throw new TetherException("timed out after " + readTimeoutMs + " ms reading bulk bytes", e);
        }
    }

    private void readFullyRaw(byte[] dest, int off, int len) throws IOException {
        int pos = 0;
        while (pos < len) {
            int n;
            try {
                n = in.read(dest, off + pos, len - pos);
            } catch (SocketTimeoutException e) {
                throw e;
            } catch (IOException e) {
                throw new ConnectionClosedException("connection to " + where() + " lost: " + e);
            }
            if (n < 0) {
                throw new ConnectionClosedException("the peer at " + where() + " closed the connection");
            }
            pos += n;
        }
    }

    /** Discards {@code n} bulk bytes. */
    void skip(long n) throws IOException {
        byte[] scratch = new byte[(int) Math.min(Math.max(n, 1), CHUNK)];
        while (n > 0) {
            int step = (int) Math.min(n, scratch.length);
            readFully(scratch, 0, step);
            n -= step;
        }
    }

    /** Idempotent. */
    @Override
    public void close() {
        closed = true;
        try {
            socket.close();
        } catch (IOException ignored) {
            // nothing more to release
        }
    }
}
