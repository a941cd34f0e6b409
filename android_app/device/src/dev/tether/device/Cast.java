package dev.tether.device;

import java.nio.ByteBuffer;

/**
 * Element casts for graph inputs, the subset of numpy's "same_kind" casting tether_rpc accepts (set_input):
 * integer or bool to integer, and any integer, bool or float to float (float16 only as itself). Anything else
 * is refused with ValueError rather than converted some other way.
 */
final class Cast {
    private Cast() {
    }

    private static boolean isFloat(String d) {
        return d.equals("float32") || d.equals("float64");
    }

    private static boolean isInt(String d) {
        return d.equals("bool") || d.startsWith("int") || d.startsWith("uint");
    }

    static void copy(Object key, String from, ByteBuffer src, String to, ByteBuffer dst, int count) throws DeviceError {
        boolean ok = (isFloat(to) && (isFloat(from) || isInt(from))) || (isInt(to) && !to.equals("bool") && isInt(from));
        if (!ok) {
            throw new DeviceError("ValueError", "input " + key + ": got " + from + ", the model expects " + to);
        }
        for (int i = 0; i < count; i++) {
            if (isFloat(to)) {
                double v = isFloat(from) ? readDouble(from, src, i) : (double) readLong(from, src, i);
                if (to.equals("float32")) {
                    dst.putFloat(4 * i, (float) v);
                } else {
                    dst.putDouble(8 * i, v);
                }
            } else {
                long v = readLong(from, src, i);
                if (to.equals("int8") || to.equals("uint8")) {
                    dst.put(i, (byte) v);
                } else if (to.equals("int16") || to.equals("uint16")) {
                    dst.putShort(2 * i, (short) v);
                } else if (to.equals("int32") || to.equals("uint32")) {
                    dst.putInt(4 * i, (int) v);
                } else {
                    dst.putLong(8 * i, v);
                }
            }
        }
    }

    private static double readDouble(String d, ByteBuffer b, int i) {
        return d.equals("float32") ? b.getFloat(b.position() + 4 * i) : b.getDouble(b.position() + 8 * i);
    }

    private static long readLong(String d, ByteBuffer b, int i) {
        int p = b.position();
        if (d.equals("bool") || d.equals("int8")) {
            return b.get(p + i);
        }
        if (d.equals("uint8")) {
            return b.get(p + i) & 0xff;
        }
        if (d.equals("int16")) {
            return b.getShort(p + 2 * i);
        }
        if (d.equals("uint16")) {
            return b.getShort(p + 2 * i) & 0xffff;
        }
        if (d.equals("int32")) {
            return b.getInt(p + 4 * i);
        }
        if (d.equals("uint32")) {
            return b.getInt(p + 4 * i) & 0xffffffffL;
        }
        return b.getLong(p + 8 * i);
    }
}
