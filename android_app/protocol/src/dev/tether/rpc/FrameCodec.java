package dev.tether.rpc;

import java.math.BigInteger;
import java.util.List;
import java.util.Map;

/**
 * Frame encoding and decoding:
 * <pre>frame = length:u32 big-endian | body: msgpack [msg_type:int, request_id:int, payload:map]</pre>
 * An encoded frame is one array (header and body together) so that it can be written with one call.
 */
public final class FrameCodec {
    private FrameCodec() {
    }

    /** Header + body in one array, ready for a single write. */
    public static byte[] encodeFrame(int msgType, long requestId, Map<String, ?> payload) {
        MsgPackWriter w = new MsgPackWriter();
        encodeFrameInto(w, msgType, requestId, payload);
        return w.toByteArray();
    }

    public static byte[] encodeFrame(MsgType msgType, long requestId, Map<String, ?> payload) {
        return encodeFrame(msgType.value(), requestId, payload);
    }

    /** Appends one frame (header + body) to {@code w}. */
    public static void encodeFrameInto(MsgPackWriter w, int msgType, long requestId, Map<String, ?> payload) {
        if (msgType <= 0 || msgType > 255) {
            throw new IllegalArgumentException("msg_type must be 1..255, got " + msgType);
        }
        int start = w.size();
        w.writeRaw(new byte[Protocol.HEADER_SIZE], 0, Protocol.HEADER_SIZE);
        w.writeArrayHeader(3);
        w.writeInt(msgType);
        w.writeUnsigned64(requestId);
        if (payload == null) {
            w.writeMapHeader(0);
        } else {
            w.write(payload);
        }
        w.patch32(start, w.size() - start - Protocol.HEADER_SIZE);
    }

    /** Decodes one frame body (without its 4-byte header). */
    public static Frame decodeBody(byte[] body, int off, int len, Limits limits) throws ProtocolException {
        // The outer array is one level above the payload, whose nesting the limit counts (as Python does).
        MsgPackReader r = new MsgPackReader(body, off, len, limits, limits.maxDepth + 1);
        Object obj = r.read();
        if (r.remaining() != 0) {
            throw new ProtocolException("frame body has " + r.remaining() + " bytes after its msgpack object");
        }
        return checkFrame(obj);
    }

    public static Frame decodeBody(byte[] body, Limits limits) throws ProtocolException {
        return decodeBody(body, 0, body.length, limits);
    }

    @SuppressWarnings("unchecked")
    private static Frame checkFrame(Object obj) throws ProtocolException {
        if (!(obj instanceof List) || ((List<Object>) obj).size() != 3) {
            throw new ProtocolException("a frame body must be [msg_type:int, request_id:int, payload:map], got "
                    + abbreviate(obj));
        }
        List<Object> list = (List<Object>) obj;
        Object t = list.get(0);
        Object rid = list.get(1);
        Object payload = list.get(2);
        if (!isInt(t) || !isInt(rid) || !(payload instanceof Map)) {
            throw new ProtocolException("a frame body must be [msg_type:int, request_id:int, payload:map], got "
                    + abbreviate(obj));
        }
        if (!(t instanceof Long) || (Long) t <= 0 || (Long) t >= 256) {
            throw new ProtocolException("bad msg_type " + t);
        }
        if (rid instanceof BigInteger) {
            // Python allows any unsigned 64-bit id; this implementation keeps ids in a long.
            throw new ProtocolException("request_id " + rid + " is above 2^63-1");
        }
        if ((Long) rid < 0) {
            throw new ProtocolException("bad request_id " + rid);
        }
        return new Frame((int) (long) (Long) t, (Long) rid, (Map<String, Object>) payload);
    }

    private static boolean isInt(Object o) {
        return o instanceof Long || o instanceof BigInteger;
    }

    private static String abbreviate(Object o) {
        String s = String.valueOf(o);
        return s.length() > 80 ? s.substring(0, 80) + "..." : s;
    }

    /** Bulk bytes announced by a payload ({@code nbytes}, default 0), checked against {@code limits.maxBulk}. */
    public static long bulkSize(Map<String, Object> payload, Limits limits) throws ProtocolException {
        Object n = payload.get("nbytes");
        if (n == null && !payload.containsKey("nbytes")) {
            return 0;
        }
        if (n instanceof BigInteger) {
            throw new FrameTooLargeException("bulk payload of " + n + " bytes exceeds the limit of " + limits.maxBulk);
        }
        if (!(n instanceof Long) || (Long) n < 0) {
            throw new ProtocolException("nbytes must be a non-negative int, got " + n);
        }
        long v = (Long) n;
        if (v > limits.maxBulk) {
            throw new FrameTooLargeException("bulk payload of " + v + " bytes exceeds the limit of " + limits.maxBulk);
        }
        return v;
    }

    /** The length in a frame header, checked against {@code limits.maxFrame} before anything is allocated. */
    public static int checkedLength(byte[] header, int off, Limits limits) throws FrameTooLargeException {
        long n = ((header[off] & 0xffL) << 24) | ((header[off + 1] & 0xffL) << 16) | ((header[off + 2] & 0xffL) << 8)
                | (header[off + 3] & 0xffL);
        if (n > limits.maxFrame) {
            throw new FrameTooLargeException("frame of " + n + " bytes exceeds the limit of " + limits.maxFrame);
        }
        return (int) n;
    }
}
