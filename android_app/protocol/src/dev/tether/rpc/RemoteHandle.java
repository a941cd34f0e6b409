package dev.tether.rpc;

import java.math.BigInteger;

/** An object (array, module, function) living in a remote session, named by its unsigned 64-bit id (ext type 2). */
public final class RemoteHandle {
    private final long id;

    /** {@code id} holds the unsigned 64-bit value's bits (ids above 2^63-1 appear negative). */
    public RemoteHandle(long id) {
        this.id = id;
    }

    public long id() {
        return id;
    }

    byte[] encode() {
        byte[] out = new byte[8];
        for (int i = 0; i < 8; i++) {
            out[i] = (byte) (id >>> (56 - 8 * i));
        }
        return out;
    }

    static RemoteHandle decode(byte[] buf, int off, int len) throws ProtocolException {
        if (len != 8) {
            throw new ProtocolException("handle ext must carry 8 bytes, got " + len);
        }
        long v = 0;
        for (int i = 0; i < 8; i++) {
            v = (v << 8) | (buf[off + i] & 0xffL);
        }
        return new RemoteHandle(v);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof RemoteHandle && ((RemoteHandle) o).id == id;
    }

    @Override
    public int hashCode() {
        return (int) (id ^ (id >>> 32));
    }

    @Override
    public String toString() {
        // Long.toUnsignedString needs Android API 26; BigInteger works everywhere.
        String s = id >= 0 ? Long.toString(id) : BigInteger.valueOf(id).add(BigInteger.ONE.shiftLeft(64)).toString();
        return "RemoteHandle(" + s + ")";
    }
}
