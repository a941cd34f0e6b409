package dev.tether.rpc;

import java.math.BigInteger;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.Charset;
import java.nio.charset.CodingErrorAction;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A minimal msgpack decoder over one byte array, enforcing {@link Limits} before allocating anything: a declared
 * length is compared with its limit and with the bytes actually left, so a short hostile input cannot make it
 * allocate much. Ints decode to Long (BigInteger above 2^63-1), float64 to Double, float32 to Float, str to
 * String, bin to byte[], arrays to List, maps to LinkedHashMap with String keys (insertion order), ext 1 to
 * {@link Tensor} (a view of the input, no copy) and ext 2 to {@link RemoteHandle}. Any other ext is refused.
 */
public final class MsgPackReader {
    private static final Charset UTF8 = Charset.forName("UTF-8");

    private final byte[] buf;
    private final int end;
    private final Limits limits;
    private final int maxDepth;
    private int pos;
    private int depth;

    /**
     * Reads from {@code buf[off, off+len)}. {@code maxDepth} bounds container nesting (the outermost container is
     * level 1).
     */
    public MsgPackReader(byte[] buf, int off, int len, Limits limits, int maxDepth) {
        if (off < 0 || len < 0 || off + len > buf.length) {
            throw new IndexOutOfBoundsException("bad range " + off + "+" + len + " of " + buf.length);
        }
        this.buf = buf;
        this.pos = off;
        this.end = off + len;
        this.limits = limits;
        this.maxDepth = maxDepth;
    }

    /** Decodes exactly one value filling all of {@code data} (trailing bytes are a protocol error). */
    public static Object unpack(byte[] data, Limits limits) throws ProtocolException {
        MsgPackReader r = new MsgPackReader(data, 0, data.length, limits, limits.maxDepth);
        Object v = r.read();
        if (r.remaining() != 0) {
            throw new ProtocolException("msgpack data has " + r.remaining() + " bytes after its value");
        }
        return v;
    }

    public int position() {
        return pos;
    }

    public int remaining() {
        return end - pos;
    }

    private void need(long n, String what) throws ProtocolException {
        if (n > end - pos) {
            throw new ProtocolException("truncated msgpack: " + what + " needs " + n + " bytes, " + (end - pos)
                    + " left");
        }
    }

    private int u8() throws ProtocolException {
        need(1, "a byte");
        return buf[pos++] & 0xff;
    }

    private int u16() throws ProtocolException {
        need(2, "a 16-bit field");
        int v = ((buf[pos] & 0xff) << 8) | (buf[pos + 1] & 0xff);
        pos += 2;
        return v;
    }

    private long u32() throws ProtocolException {
        need(4, "a 32-bit field");
        long v = ((buf[pos] & 0xffL) << 24) | ((buf[pos + 1] & 0xffL) << 16) | ((buf[pos + 2] & 0xffL) << 8)
                | (buf[pos + 3] & 0xffL);
        pos += 4;
        return v;
    }

    private long u64() throws ProtocolException {
        need(8, "a 64-bit field");
        long v = 0;
        for (int i = 0; i < 8; i++) {
            v = (v << 8) | (buf[pos + i] & 0xffL);
        }
        pos += 8;
        return v;
    }

    /** Reads one value. */
    public Object read() throws ProtocolException {
        int b = u8();
        if (b <= 0x7f) {
            return (long) b;
        }
        if (b >= 0xe0) {
            return (long) (byte) b;
        }
        if (b >= 0xa0 && b <= 0xbf) {
            return str(b & 0x1f);
        }
        if (b >= 0x90 && b <= 0x9f) {
            return array(b & 0x0f);
        }
        if (b >= 0x80 && b <= 0x8f) {
            return map(b & 0x0f);
        }
        switch (b) {
            case 0xc0:
                return null;
            case 0xc2:
                return Boolean.FALSE;
            case 0xc3:
                return Boolean.TRUE;
            case 0xc4:
                return bin(u8());
            case 0xc5:
                return bin(u16());
            case 0xc6:
                return bin(u32());
            case 0xc7:
                return ext(u8());
            case 0xc8:
                return ext(u16());
            case 0xc9:
                return ext(u32());
            case 0xca:
                return Float.intBitsToFloat((int) u32());
            case 0xcb:
                return Double.longBitsToDouble(u64());
            case 0xcc:
                return (long) u8();
            case 0xcd:
                return (long) u16();
            case 0xce:
                return u32();
            case 0xcf: {
                long v = u64();
                return v >= 0 ? (Object) v : BigInteger.valueOf(v).add(BigInteger.ONE.shiftLeft(64));
            }
            case 0xd0:
                return (long) (byte) u8();
            case 0xd1:
                return (long) (short) u16();
            case 0xd2:
                return (long) (int) u32();
            case 0xd3:
                return u64();
            case 0xd4:
                return ext(1);
            case 0xd5:
                return ext(2);
            case 0xd6:
                return ext(4);
            case 0xd7:
                return ext(8);
            case 0xd8:
                return ext(16);
            case 0xd9:
                return str(u8());
            case 0xda:
                return str(u16());
            case 0xdb:
                return str(u32());
            case 0xdc:
                return array(u16());
            case 0xdd:
                return array(u32());
            case 0xde:
                return map(u16());
            case 0xdf:
                return map(u32());
            default: // 0xc1 is "never used"
                throw new ProtocolException(String.format("invalid msgpack type byte 0x%02x", b));
        }
    }

    private String str(long n) throws ProtocolException {
        if (n > limits.maxStr) {
            throw new ProtocolException("str of " + n + " bytes exceeds the limit of " + limits.maxStr);
        }
        need(n, "a str");
        try {
            String s = UTF8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(buf, pos, (int) n)).toString();
            pos += (int) n;
            return s;
        } catch (CharacterCodingException e) {
            throw new ProtocolException("str is not valid UTF-8");
        }
    }

    private byte[] bin(long n) throws ProtocolException {
        if (n > limits.maxBin) {
            throw new ProtocolException("bin of " + n + " bytes exceeds the limit of " + limits.maxBin);
        }
        need(n, "a bin");
        byte[] out = new byte[(int) n];
        System.arraycopy(buf, pos, out, 0, (int) n);
        pos += (int) n;
        return out;
    }

    private void enter() throws ProtocolException {
        if (++depth > maxDepth) {
            throw new ProtocolException("msgpack value nests deeper than the limit of " + maxDepth + " levels");
        }
    }

    private List<Object> array(long n) throws ProtocolException {
        if (n > limits.maxArray) {
            throw new ProtocolException("array of " + n + " items exceeds the limit of " + limits.maxArray);
        }
        need(n, "an array"); // every item takes at least one byte
        enter();
        List<Object> out = new ArrayList<Object>((int) n);
        for (long i = 0; i < n; i++) {
            out.add(read());
        }
        depth--;
        return out;
    }

    private Map<String, Object> map(long n) throws ProtocolException {
        if (n > limits.maxMap) {
            throw new ProtocolException("map of " + n + " entries exceeds the limit of " + limits.maxMap);
        }
        need(2 * n, "a map"); // every key and value takes at least one byte
        enter();
        Map<String, Object> out = new LinkedHashMap<String, Object>((int) Math.min(n * 2, 1 << 13));
        for (long i = 0; i < n; i++) {
            Object key = read();
            if (!(key instanceof String)) {
                throw new ProtocolException("map keys must be strings, got "
                        + (key == null ? "nil" : key.getClass().getSimpleName()));
            }
            out.put((String) key, read());
        }
        depth--;
        return out;
    }

    private Object ext(long n) throws ProtocolException {
        int type = (byte) u8();
        if (n > limits.maxExt) {
            throw new ProtocolException("ext of " + n + " bytes exceeds the limit of " + limits.maxExt);
        }
        need(n, "an ext");
        int off = pos;
        pos += (int) n;
        if (type == Protocol.EXT_TENSOR) {
            return Tensor.decode(buf, off, (int) n, limits);
        }
        if (type == Protocol.EXT_HANDLE) {
            return RemoteHandle.decode(buf, off, (int) n);
        }
        throw new ProtocolException("unknown msgpack ext type " + type);
    }
}
