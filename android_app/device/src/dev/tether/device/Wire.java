package dev.tether.device;

import dev.tether.rpc.Frame;
import dev.tether.rpc.FrameCodec;
import dev.tether.rpc.Limits;
import dev.tether.rpc.MsgPackWriter;
import dev.tether.rpc.ProtocolException;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Frames over blocking streams (docs/protocol.md): a frame header is checked against the limit before its body
 * is allocated, and every frame leaves in one write (header and body together, small bulk bytes too).
 */
final class Wire {
    static final int HELLO = 1;
    static final int CHALLENGE = 2;
    static final int AUTH = 3;
    static final int WELCOME = 4;
    static final int CALL = 5;
    static final int RETURN = 6;
    static final int ERROR = 7;
    static final int EVENT = 8;
    static final int CLOSE = 9;
    private static final int SMALL_BULK = 64 << 10;
    private static final int CHUNK = 1 << 20;

    private final InputStream in;
    private final OutputStream out;
    private final MsgPackWriter writer = new MsgPackWriter(4096);
    private final byte[] header = new byte[4];
    private byte[] chunk;

    Wire(InputStream in, OutputStream out) {
        this.in = in;
        this.out = out;
    }

    /** Reads {@code n} bytes; false on a clean EOF before the first byte, EOFException on one after it. */
    boolean readFully(byte[] b, int off, int n) throws IOException {
        int done = 0;
        while (done < n) {
            int r = in.read(b, off + done, n - done);
            if (r < 0) {
                if (done == 0) {
                    return false;
                }
                throw new EOFException("the peer closed the connection in the middle of a frame");
            }
            done += r;
        }
        return true;
    }

    /** The next frame, or null at a clean end of stream. */
    Frame read(Limits limits) throws IOException {
        if (!readFully(header, 0, 4)) {
            return null;
        }
        int n = FrameCodec.checkedLength(header, 0, limits);
        byte[] body = new byte[n];
        if (n > 0 && !readFully(body, 0, n)) {
            throw new EOFException("the peer closed the connection in the middle of a frame");
        }
        return FrameCodec.decodeBody(body, limits);
    }

    /** Reads exactly {@code n} bulk bytes into {@code dst} (from its position). */
    void readBulk(ByteBuffer dst, long n) throws IOException {
        byte[] c = chunk();
        while (n > 0) {
            int k = (int) Math.min(n, c.length);
            if (!readFully(c, 0, k)) {
                throw new EOFException("the peer closed the connection during bulk bytes");
            }
            dst.put(c, 0, k);
            n -= k;
        }
    }

    void readBulk(OutputStream dst, long n) throws IOException {
        byte[] c = chunk();
        while (n > 0) {
            int k = (int) Math.min(n, c.length);
            if (!readFully(c, 0, k)) {
                throw new EOFException("the peer closed the connection during bulk bytes");
            }
            dst.write(c, 0, k);
            n -= k;
        }
    }

    void skip(long n) throws IOException {
        readBulk(new OutputStream() {
            @Override
            public void write(int b) {
            }

            @Override
            public void write(byte[] b, int off, int len) {
            }
        }, n);
    }

    private byte[] chunk() {
        if (chunk == null) {
            chunk = new byte[CHUNK];
        }
        return chunk;
    }

    synchronized void send(int type, long rid, Map<String, ?> payload) throws IOException {
        writer.reset();
        FrameCodec.encodeFrameInto(writer, type, rid, payload);
        out.write(writer.toByteArray());
        out.flush();
    }

    /** A frame followed by {@code n} bulk bytes from {@code src} (its remaining bytes, or a stream). */
    synchronized void send(int type, long rid, Map<String, ?> payload, ByteBuffer src, InputStream stream, long n)
            throws IOException {
        writer.reset();
        FrameCodec.encodeFrameInto(writer, type, rid, payload);
        if (src != null && n <= SMALL_BULK) {
            byte[] frame = writer.toByteArray();
            byte[] both = new byte[frame.length + (int) n];
            System.arraycopy(frame, 0, both, 0, frame.length);
            src.get(both, frame.length, (int) n);
            out.write(both);
            out.flush();
            return;
        }
        out.write(writer.toByteArray());
        byte[] c = chunk();
        while (n > 0) {
            int k = (int) Math.min(n, c.length);
            if (src != null) {
                src.get(c, 0, k);
            } else {
                int done = 0;
                while (done < k) {
                    int r = stream.read(c, done, k - done);
                    if (r < 0) {
                        throw new EOFException("the file shrank while it was being sent");
                    }
                    done += r;
                }
            }
            out.write(c, 0, k);
            n -= k;
        }
        out.flush();
    }

    void sendError(long rid, String type, String message, String traceback) throws IOException {
        Map<String, Object> p = new LinkedHashMap<String, Object>();
        p.put("type", type);
        p.put("message", message);
        p.put("traceback", traceback == null ? "" : traceback);
        send(ERROR, rid, p);
    }

    static boolean isProtocolError(Throwable t) {
        return t instanceof ProtocolException;
    }
}
