package dev.tether.rpc;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.Charset;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

/**
 * A minimal msgpack encoder producing the smallest encoding of every value, as msgpack-python does with
 * {@code use_bin_type=True}: so encoding a vector's meaning reproduces its bytes exactly.
 *
 * <p>Values: null, Boolean, Byte/Short/Integer/Long, BigInteger (-2^63 .. 2^64-1), Double (float64), Float
 * (float32), String (str), byte[] (bin), List or Object[] (array), Map with String keys (map, in iteration order),
 * {@link Tensor} (ext 1) and {@link RemoteHandle} (ext 2).
 */
public final class MsgPackWriter {
    private static final Charset UTF8 = Charset.forName("UTF-8");
    private static final BigInteger MAX_U64 = BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE);
    /** Guards against self-containing lists/maps (which would otherwise overflow the stack). */
    private static final int MAX_NESTING = 512;

    private byte[] buf;
    private int len;

    public MsgPackWriter() {
        this(256);
    }

    public MsgPackWriter(int capacity) {
        buf = new byte[Math.max(capacity, 16)];
    }

    /** Encodes one value and returns its bytes. */
    public static byte[] pack(Object value) {
        MsgPackWriter w = new MsgPackWriter();
        w.write(value);
        return w.toByteArray();
    }

    public int size() {
        return len;
    }

    public void reset() {
        len = 0;
    }

    public byte[] toByteArray() {
        return Arrays.copyOf(buf, len);
    }

    /** The internal buffer (valid up to {@link #size()}); lets a caller send without another copy. */
    byte[] buffer() {
        return buf;
    }

    private void ensure(int extra) {
        if (len + extra > buf.length) {
            long want = Math.max((long) buf.length * 2, (long) len + extra);
            if (want > Integer.MAX_VALUE - 8) {
                throw new IllegalArgumentException("msgpack value too large to encode in memory");
            }
            buf = Arrays.copyOf(buf, (int) want);
        }
    }

    void writeRawByte(int b) {
        ensure(1);
        buf[len++] = (byte) b;
    }

    void writeRaw(byte[] b, int off, int n) {
        ensure(n);
        System.arraycopy(b, off, buf, len, n);
        len += n;
    }

    void writeRaw(ByteBuffer b) {
        int n = b.remaining();
        ensure(n);
        b.get(buf, len, n);
        len += n;
    }

    /** {@code v}'s low {@code n} bytes, big-endian. */
    private void writeRawBigEndian(long v, int n) {
        ensure(n);
        for (int shift = 8 * (n - 1); shift >= 0; shift -= 8) {
            buf[len++] = (byte) (v >>> shift);
        }
    }

    void writeRawLong(long v) {
        writeRawBigEndian(v, 8);
    }

    /** Overwrites 4 bytes at {@code pos} with {@code v} big-endian (the frame header). */
    void patch32(int pos, long v) {
        buf[pos] = (byte) (v >>> 24);
        buf[pos + 1] = (byte) (v >>> 16);
        buf[pos + 2] = (byte) (v >>> 8);
        buf[pos + 3] = (byte) v;
    }

    public void write(Object value) {
        write(value, 0);
    }

    @SuppressWarnings("unchecked")
    private void write(Object v, int depth) {
        if (depth > MAX_NESTING) {
            throw new IllegalArgumentException("value nests deeper than " + MAX_NESTING + " levels (a cycle?)");
        }
        if (v == null) {
            writeNil();
        } else if (v instanceof Boolean) {
            writeBool((Boolean) v);
        } else if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            writeInt(((Number) v).longValue());
        } else if (v instanceof BigInteger) {
            writeBigInteger((BigInteger) v);
        } else if (v instanceof Double) {
            writeDouble((Double) v);
        } else if (v instanceof Float) {
            writeFloat((Float) v);
        } else if (v instanceof String) {
            writeString((String) v);
        } else if (v instanceof byte[]) {
            byte[] b = (byte[]) v;
            writeBin(b, 0, b.length);
        } else if (v instanceof List) {
            List<Object> list = (List<Object>) v;
            writeArrayHeader(list.size());
            for (Object item : list) {
                write(item, depth + 1);
            }
        } else if (v instanceof Object[]) {
            Object[] arr = (Object[]) v;
            writeArrayHeader(arr.length);
            for (Object item : arr) {
                write(item, depth + 1);
            }
        } else if (v instanceof Map) {
            Map<Object, Object> map = (Map<Object, Object>) v;
            writeMapHeader(map.size());
            for (Map.Entry<Object, Object> e : map.entrySet()) {
                if (!(e.getKey() instanceof String)) {
                    throw new IllegalArgumentException("map keys must be strings, got "
                            + (e.getKey() == null ? "null" : e.getKey().getClass().getName()));
                }
                writeString((String) e.getKey());
                write(e.getValue(), depth + 1);
            }
        } else if (v instanceof Tensor) {
            Tensor t = (Tensor) v;
            writeExtHeader(Protocol.EXT_TENSOR, t.extLength());
            t.writeExtData(this);
        } else if (v instanceof RemoteHandle) {
            byte[] data = ((RemoteHandle) v).encode();
            writeExtHeader(Protocol.EXT_HANDLE, data.length);
            writeRaw(data, 0, data.length);
        } else {
            throw new IllegalArgumentException("cannot send " + v.getClass().getName()
                    + " over tether rpc (use numbers, String, byte[], List, Map<String,?>, Tensor, RemoteHandle)");
        }
    }

    public void writeNil() {
        writeRawByte(0xc0);
    }

    public void writeBool(boolean b) {
        writeRawByte(b ? 0xc3 : 0xc2);
    }

    /**
     * The smallest encoding: a fixint when it fits, else the unsigned forms (0xcc.. for 1/2/4/8 bytes) for positive
     * values and the signed forms (0xd0..) for negative ones.
     */
    public void writeInt(long v) {
        if (v >= -32 && v < 0x80) {
            writeRawByte((int) v);
            return;
        }
        int log2;
        if (v >= 0) {
            log2 = v <= 0xff ? 0 : v <= 0xffff ? 1 : v <= 0xffffffffL ? 2 : 3;
        } else {
            log2 = v >= -0x80 ? 0 : v >= -0x8000 ? 1 : v >= -0x80000000L ? 2 : 3;
        }
        writeRawByte((v >= 0 ? 0xcc : 0xd0) + log2);
        writeRawBigEndian(v, 1 << log2);
    }

    /** Writes an unsigned 64-bit value given as its bits (for ids above 2^63-1). */
    public void writeUnsigned64(long bits) {
        if (bits >= 0) {
            writeInt(bits);
        } else {
            writeRawByte(0xcf);
            writeRawLong(bits);
        }
    }

    public void writeBigInteger(BigInteger v) {
        if (v.bitLength() <= 63) {
            writeInt(v.longValue());
        } else if (v.signum() > 0 && v.compareTo(MAX_U64) <= 0) {
            writeUnsigned64(v.longValue());
        } else {
            throw new IllegalArgumentException("integer " + v + " does not fit msgpack (-2^63 .. 2^64-1)");
        }
    }

    public void writeDouble(double d) {
        writeRawByte(0xcb);
        writeRawLong(Double.doubleToRawLongBits(d));
    }

    public void writeFloat(float f) {
        writeRawByte(0xca);
        writeRawBigEndian(Float.floatToRawIntBits(f), 4);
    }

    public void writeString(String s) {
        byte[] b = s.getBytes(UTF8);
        writeLength(b.length, 0xa0, 32, 0xd9, 0xda);
        writeRaw(b, 0, b.length);
    }

    public void writeBin(byte[] b, int off, int n) {
        writeLength(n, 0, 0, 0xc4, 0xc5);
        writeRaw(b, off, n);
    }

    public void writeArrayHeader(int n) {
        writeLength(n, 0x90, 16, -1, 0xdc);
    }

    public void writeMapHeader(int n) {
        writeLength(n, 0x80, 16, -1, 0xde);
    }

    /** fixext 1/2/4/8/16 (0xd4..0xd8) for those exact sizes, else ext 8/16/32 (msgpack-python's choice). */
    public void writeExtHeader(int type, int n) {
        if (n >= 1 && n <= 16 && Integer.bitCount(n) == 1) {
            writeRawByte(0xd4 + Integer.numberOfTrailingZeros(n));
        } else {
            writeLength(n, 0, 0, 0xc7, 0xc8);
        }
        writeRawByte(type);
    }

    /**
     * The smallest length header of a str/bin/array/map/ext: {@code fixBase | n} below {@code fixLimit}, then
     * {@code code8} with one length byte (none when negative), {@code code16} with two, {@code code16 + 1} with
     * four (msgpack puts the 32-bit form right after the 16-bit one for every type).
     */
    private void writeLength(int n, int fixBase, int fixLimit, int code8, int code16) {
        if (n < fixLimit) {
            writeRawByte(fixBase | n);
        } else if (code8 >= 0 && n <= 0xff) {
            writeRawByte(code8);
            writeRawByte(n);
        } else {
            int log2 = n <= 0xffff ? 1 : 2;
            writeRawByte(code16 + log2 - 1);
            writeRawBigEndian(n, 1 << log2);
        }
    }
}
