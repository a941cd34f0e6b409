package dev.tether.rpc;

import java.util.Arrays;

/**
 * Incremental (sans-IO) frame decoder: {@link #feed} bytes as they arrive, then {@link #next} returns complete
 * frames, or null while a frame is incomplete. A header's length is checked against the limit before the buffer
 * grows for it. After a frame that announces bulk bytes, {@link #take} hands out the buffered start of the bulk.
 */
public final class FrameDecoder {
    private Limits limits;
    private byte[] buf = new byte[4096];
    private int start;
    private int end;

    public FrameDecoder(Limits limits) {
        this.limits = limits;
    }

    public Limits limits() {
        return limits;
    }

    public void setLimits(Limits limits) {
        this.limits = limits;
    }

    public int buffered() {
        return end - start;
    }

    public void feed(byte[] data, int off, int len) throws FrameTooLargeException {
        if (buf.length - end < len) {
            int used = end - start;
            if (used >= Protocol.HEADER_SIZE) {
                // Refuse an oversized frame before growing the buffer for it.
                FrameCodec.checkedLength(buf, start, limits);
            }
            byte[] dst = used + len > buf.length ? new byte[Math.max(used + len, Math.min(buf.length * 2,
                    Integer.MAX_VALUE - 8))] : buf;
            System.arraycopy(buf, start, dst, 0, used);
            buf = dst;
            start = 0;
            end = used;
        }
        System.arraycopy(data, off, buf, end, len);
        end += len;
    }

    public void feed(byte[] data) throws FrameTooLargeException {
        feed(data, 0, data.length);
    }

    /** One complete frame, or null if more bytes are needed. */
    public Frame next() throws ProtocolException {
        if (end - start < Protocol.HEADER_SIZE) {
            return null;
        }
        int n = FrameCodec.checkedLength(buf, start, limits);
        if (end - start - Protocol.HEADER_SIZE < n) {
            return null;
        }
        int body = start + Protocol.HEADER_SIZE;
        start = body + n;
        // Tensors decode as views into the buffer, and the buffer is reused: decode from a private copy.
        byte[] copy = Arrays.copyOfRange(buf, body, body + n);
        return FrameCodec.decodeBody(copy, 0, n, limits);
    }

    /** Moves up to {@code len} buffered bytes (the start of a bulk payload) into {@code dest}; returns how many. */
    public int take(byte[] dest, int off, int len) {
        int n = Math.min(len, end - start);
        System.arraycopy(buf, start, dest, off, n);
        start += n;
        return n;
    }
}
