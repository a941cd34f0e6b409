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
    /**
     * What each type byte from 0xc4 to 0xdf reads, one letter per byte: b bin, e ext, f float, u uint, i int,
     * x fixext, s str, a array, m map; FIELD_LOG2 is log2 of its field's width (the length, the value, or for
     * fixext the data). msgpack lays these families out in this order, so the table is the spec's.
     */
    private static final String FAMILY = "bbbeeeffuuuuiiiixxxxxsssaamm";
    private static final String FIELD_LOG2 = "0120122301230123012340121212";

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

    /** A big-endian unsigned field of {@code n} bytes (1, 2, 4 or 8; 8 gives the raw 64 bits). */
    private long uint(int n) throws ProtocolException {
        need(n, n == 1 ? "a byte" : "a " + 8 * n + "-bit field");
        long v = 0;
        for (int i = 0; i < n; i++) {
            v = (v << 8) | (buf[pos + i] & 0xffL);
        }
        pos += n;
        return v;
    }

    /** Reads one value. */
    public Object read() throws ProtocolException {
        int b = u8();
        if (b <= 0x7f || b >= 0xe0) {
            return (long) (byte) b; // positive and negative fixint: the byte's signed value
        }
        if (b <= 0x8f) {
            return map(b & 0x0f);
        }
        if (b <= 0x9f) {
            return array(b & 0x0f);
        }
        if (b <= 0xbf) {
            return str(b & 0x1f);
        }
        if (b == 0xc0) {
            return null;
        }
        if (b == 0xc2 || b == 0xc3) {
            return b == 0xc3;
        }
        if (b == 0xc1) { // "never used"
            throw new ProtocolException(String.format("invalid msgpack type byte 0x%02x", b));
        }
        int width = 1 << (FIELD_LOG2.charAt(b - 0xc4) - '0');
        char family = FAMILY.charAt(b - 0xc4);
        if (family == 'x') {
            return ext(width);
        }
        long field = uint(width);
        int unused = 64 - 8 * width;
        switch (family) {
            case 'b': return bin(field);
            case 'e': return ext(field);
            case 's': return str(field);
            case 'a': return array(field);
            case 'm': return map(field);
            case 'f': return width == 4 ? (Object) Float.intBitsToFloat((int) field) : Double.longBitsToDouble(field);
            case 'i': return (field << unused) >> unused; // sign-extend
            default: // 'u'
                return field >= 0 ? (Object) field : BigInteger.valueOf(field).add(BigInteger.ONE.shiftLeft(64));
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
