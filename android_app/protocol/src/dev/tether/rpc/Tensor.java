package dev.tether.rpc;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.Charset;
import java.util.Arrays;

/**
 * A tensor as it travels in msgpack ext type 1: a dtype name, a shape and little-endian C-order element bytes.
 *
 * <pre>ext data = dtype_len:u8  dtype:ascii  ndim:u8  shape: ndim x u64 big-endian  raw elements</pre>
 *
 * A decoded tensor's {@link #data()} is a read-only view into the received frame (no copy).
 */
public final class Tensor {
    private static final Charset ASCII = Charset.forName("US-ASCII");
    // bfloat16 travels as its 16-bit patterns (the upper half of a float32)
    private static final String[] DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
            "uint64", "float16", "bfloat16", "float32", "float64"};
    private static final int[] ITEMSIZES = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};

    private final String dtype;
    private final long[] shape;
    private final ByteBuffer data;

    private Tensor(String dtype, long[] shape, ByteBuffer data) {
        this.dtype = dtype;
        this.shape = shape;
        this.data = data;
    }

    /** Bytes per element of {@code dtype}, or -1 if it is not a dtype that may travel as a tensor. */
    public static int itemSize(String dtype) {
        for (int i = 0; i < DTYPES.length; i++) {
            if (DTYPES[i].equals(dtype)) {
                return ITEMSIZES[i];
            }
        }
        return -1;
    }

    /** A tensor over {@code data} (little-endian element bytes, C order); the byte count must match the shape. */
    public static Tensor of(String dtype, long[] shape, byte[] data) {
        int item = itemSize(dtype);
        if (item < 0) {
            throw new IllegalArgumentException("dtype " + dtype + " cannot travel as a tensor (allowed: "
                    + Arrays.toString(DTYPES) + ")");
        }
        if (shape.length > 255) {
            throw new IllegalArgumentException("a tensor has at most 255 dimensions, got " + shape.length);
        }
        long count = 1;
        for (long d : shape) {
            if (d < 0) {
                throw new IllegalArgumentException("negative dimension in shape " + Arrays.toString(shape));
            }
            if (d != 0 && count > Long.MAX_VALUE / d / item) {
                throw new IllegalArgumentException("shape " + Arrays.toString(shape) + " is too large");
            }
            count *= d;
        }
        if (count * item != data.length) {
            throw new IllegalArgumentException("a " + dtype + " tensor of shape " + Arrays.toString(shape) + " needs "
                    + count * item + " bytes, got " + data.length);
        }
        return new Tensor(dtype, shape.clone(), ByteBuffer.wrap(data).asReadOnlyBuffer());
    }

    public static Tensor fromFloats(float[] values, long... shape) {
        ByteBuffer b = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        b.asFloatBuffer().put(values);
        return of("float32", shapeOr1d(shape, values.length), b.array());
    }

    public static Tensor fromDoubles(double[] values, long... shape) {
        ByteBuffer b = ByteBuffer.allocate(values.length * 8).order(ByteOrder.LITTLE_ENDIAN);
        b.asDoubleBuffer().put(values);
        return of("float64", shapeOr1d(shape, values.length), b.array());
    }

    public static Tensor fromInts(int[] values, long... shape) {
        ByteBuffer b = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        b.asIntBuffer().put(values);
        return of("int32", shapeOr1d(shape, values.length), b.array());
    }

    public static Tensor fromLongs(long[] values, long... shape) {
        ByteBuffer b = ByteBuffer.allocate(values.length * 8).order(ByteOrder.LITTLE_ENDIAN);
        b.asLongBuffer().put(values);
        return of("int64", shapeOr1d(shape, values.length), b.array());
    }

    private static long[] shapeOr1d(long[] shape, int n) {
        return shape.length == 0 ? new long[]{n} : shape;
    }

    public String dtype() {
        return dtype;
    }

    public long[] shape() {
        return shape.clone();
    }

    public int ndim() {
        return shape.length;
    }

    /** Number of elements (the product of the shape; 1 for a 0-d tensor). */
    public long size() {
        long n = 1;
        for (long d : shape) {
            n *= d;
        }
        return n;
    }

    public int nbytes() {
        return data.remaining();
    }

    /** The element bytes, little-endian, as a read-only buffer positioned at 0 (a fresh view on every call). */
    public ByteBuffer data() {
        return data.duplicate().order(ByteOrder.LITTLE_ENDIAN);
    }

    /** A copy of the element bytes. */
    public byte[] toByteArray() {
        byte[] out = new byte[data.remaining()];
        data.duplicate().get(out);
        return out;
    }

    public float[] toFloatArray() {
        requireDtype("float32");
        float[] out = new float[(int) size()];
        data().asFloatBuffer().get(out);
        return out;
    }

    public double[] toDoubleArray() {
        requireDtype("float64");
        double[] out = new double[(int) size()];
        data().asDoubleBuffer().get(out);
        return out;
    }

    public int[] toIntArray() {
        requireDtype("int32");
        int[] out = new int[(int) size()];
        data().asIntBuffer().get(out);
        return out;
    }

    public long[] toLongArray() {
        requireDtype("int64");
        long[] out = new long[(int) size()];
        data().asLongBuffer().get(out);
        return out;
    }

    private void requireDtype(String want) {
        if (!dtype.equals(want)) {
            throw new IllegalStateException("tensor holds " + dtype + ", not " + want);
        }
    }

    /** Length of the ext data (header + elements). */
    int extLength() {
        return 2 + dtype.length() + 8 * shape.length + data.remaining();
    }

    /** Writes the ext data (header, then the element bytes). */
    void writeExtData(MsgPackWriter w) {
        byte[] name = dtype.getBytes(ASCII);
        w.writeRawByte(name.length);
        w.writeRaw(name, 0, name.length);
        w.writeRawByte(shape.length);
        for (long d : shape) {
            w.writeRawLong(d);
        }
        w.writeRaw(data.duplicate());
    }

    /** Decodes ext-1 data without copying the element bytes; every size is checked before use. */
    static Tensor decode(byte[] buf, int off, int len, Limits limits) throws ProtocolException {
        int end = off + len;
        if (len < 1 || len < 2 + (buf[off] & 0xff)) {
            throw new ProtocolException("malformed tensor ext: truncated dtype");
        }
        int n = buf[off] & 0xff;
        String name;
        for (int i = 0; i < n; i++) {
            if (buf[off + 1 + i] < 0) {
                throw new ProtocolException("malformed tensor ext: non-ascii dtype");
            }
        }
        name = new String(buf, off + 1, n, ASCII);
        int pos = off + 1 + n;
        int ndim = buf[pos] & 0xff;
        pos++;
        int item = itemSize(name);
        if (item < 0) {
            throw new ProtocolException("tensor ext names dtype '" + name + "', which is not accepted");
        }
        if (ndim > limits.maxNdim) {
            throw new ProtocolException("tensor ext has " + ndim + " dimensions (limit " + limits.maxNdim + ")");
        }
        if (end - pos < 8 * ndim) {
            throw new ProtocolException("malformed tensor ext: shape truncated");
        }
        long[] shape = new long[ndim];
        long count = 1;
        boolean overflow = false;
        for (int i = 0; i < ndim; i++) {
            long d = 0;
            for (int k = 0; k < 8; k++) {
                d = (d << 8) | (buf[pos + k] & 0xffL);
            }
            pos += 8;
            shape[i] = d;
            if (d < 0 || (d != 0 && count > Long.MAX_VALUE / d)) {
                overflow = true; // beyond 2^63-1 bytes: no real tensor is this big
            } else if (!overflow) {
                count *= d;
            }
        }
        int have = end - pos;
        boolean zero = false;
        for (long d : shape) {
            zero |= d == 0;
        }
        if (zero && overflow) {
            throw new ProtocolException("tensor ext has an empty shape with a dimension above 2^63-1");
        }
        if (!overflow && count > Long.MAX_VALUE / item) {
            overflow = true;
        }
        if (overflow || count * item != have) {
            throw new ProtocolException("tensor ext of shape " + Arrays.toString(shape) + " " + name + " needs "
                    + (overflow ? "more than 2^63" : Long.toString(count * item)) + " bytes, carries " + have);
        }
        ByteBuffer data = ByteBuffer.wrap(buf, pos, have).slice().asReadOnlyBuffer();
        return new Tensor(name, shape, data);
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof Tensor)) {
            return false;
        }
        Tensor t = (Tensor) o;
        return dtype.equals(t.dtype) && Arrays.equals(shape, t.shape) && data.duplicate().equals(t.data.duplicate());
    }

    @Override
    public int hashCode() {
        return dtype.hashCode() * 31 + Arrays.hashCode(shape);
    }

    @Override
    public String toString() {
        return "Tensor(" + dtype + ", " + Arrays.toString(shape) + ")";
    }
}
