package dev.tether.device;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A device array: a 64-byte-aligned direct buffer plus the DLTensor (DLPack 0.x layout, docs/abi.md) that
 * describes it, built once in another direct buffer for the pointer size of this process.
 */
final class DeviceArray {
    // bfloat16: DLPack kDLBfloat (code 4), its 16-bit patterns as they travel in a tensor
    static final String[] DTYPES = {"bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32",
            "float64", "bfloat16"};
    private static final int[] CODES = {6, 0, 1, 0, 0, 0, 2, 2, 2, 4};
    private static final int[] BITS = {8, 8, 8, 16, 32, 64, 16, 32, 64, 16};
    private static final int ALIGN = 64;

    final String dtype;
    final long[] shape;
    final long nbytes;
    /** The elements, little-endian, position 0, limit nbytes. */
    final ByteBuffer data;
    final long address;
    private final ByteBuffer dltensor;
    final long dltensorAddress;

    static int dtypeIndex(String dtype) {
        for (int i = 0; i < DTYPES.length; i++) {
            if (DTYPES[i].equals(dtype)) {
                return i;
            }
        }
        return -1;
    }

    static long nbytesOf(long[] shape, String dtype) throws DeviceError {
        int i = dtypeIndex(dtype);
        if (i < 0) {
            throw new DeviceError("KernelError", "dtype " + dtype + " cannot be a device array (tether kernels take "
                    + "bool, int8, uint8, int16, int32, int64, float16, float32, float64, bfloat16)");
        }
        if (shape.length > 32) {
            throw new DeviceError("ValueError", "an array has at most 32 dimensions, got " + shape.length);
        }
        long n = BITS[i] / 8;
        for (long d : shape) {
            if (d < 0) {
                throw new DeviceError("ValueError", "negative dimension in shape " + Text.shape(shape));
            }
            if (d != 0 && n > (Integer.MAX_VALUE - ALIGN) / d) {
                throw new DeviceError("OutOfMemory", "an array of shape " + Text.shape(shape) + " " + dtype
                        + " is larger than this device server's 2 GiB per array");
            }
            n *= d;
        }
        return n;
    }

    /** {@code n} zeroed bytes at a 64-byte-aligned address, as a little-endian buffer of exactly n bytes. */
    static ByteBuffer aligned(long n, String what) throws DeviceError {
        ByteBuffer raw;
        try {
            raw = ByteBuffer.allocateDirect((int) n + ALIGN);
        } catch (OutOfMemoryError e) {
            throw new DeviceError("OutOfMemory", "cannot allocate " + n + " bytes for " + what);
        }
        long base = NativeBridge.address(raw);
        int skew = (int) ((ALIGN - (base % ALIGN)) % ALIGN);
        raw.position(skew);
        raw.limit(skew + (int) n);
        return raw.slice().order(ByteOrder.LITTLE_ENDIAN);
    }

    DeviceArray(long[] shape, String dtype) throws DeviceError {
        this(shape, dtype, null);
    }

    /** An array over {@code memory} (exactly its bytes, e.g. a slice of a graph storage), or a fresh one. */
    DeviceArray(long[] shape, String dtype, ByteBuffer memory) throws DeviceError {
        this.dtype = dtype;
        this.shape = shape.clone();
        this.nbytes = nbytesOf(shape, dtype);
        int idx = dtypeIndex(dtype);
        if (memory == null) {
            memory = aligned(nbytes, "an array of shape " + Text.shape(shape) + " " + dtype);
        } else if (memory.remaining() != nbytes) {
            throw new DeviceError("ValueError", "an array of shape " + Text.shape(shape) + " " + dtype + " needs "
                    + nbytes + " bytes, its memory has " + memory.remaining());
        }
        data = memory.slice().order(ByteOrder.LITTLE_ENDIAN);
        address = NativeBridge.address(memory) + memory.position();

        int ptr = NativeBridge.pointerSize();
        int ndim = shape.length;
        // data, device {int32 type, int32 id}, int32 ndim, dtype {u8 code, u8 bits, u16 lanes}, shape*, strides*,
        // u64 byte_offset (8-aligned); the shape array follows the struct.
        int offDevice = ptr;
        int offNdim = offDevice + 8;
        int offDtype = offNdim + 4;
        int offShape = offDtype + 4;
        int offStrides = offShape + ptr;
        int offByteOffset = ((offStrides + ptr) + 7) & ~7;
        int structSize = offByteOffset + 8;
        dltensor = ByteBuffer.allocateDirect(structSize + 8 * Math.max(ndim, 1) + 8).order(ByteOrder.nativeOrder());
        long tbase = NativeBridge.address(dltensor);
        int tskew = (int) ((8 - (tbase % 8)) % 8);
        dltensorAddress = tbase + tskew;
        long shapeAddress = dltensorAddress + structSize;
        putPointer(tskew, ptr, address);
        dltensor.putInt(tskew + offDevice, 1);  // kDLCPU
        dltensor.putInt(tskew + offDevice + 4, 0);
        dltensor.putInt(tskew + offNdim, ndim);
        dltensor.put(tskew + offDtype, (byte) CODES[idx]);
        dltensor.put(tskew + offDtype + 1, (byte) BITS[idx]);
        dltensor.putShort(tskew + offDtype + 2, (short) 1);
        putPointer(tskew + offShape, ptr, shapeAddress);
        putPointer(tskew + offStrides, ptr, 0);
        dltensor.putLong(tskew + offByteOffset, 0);
        for (int i = 0; i < ndim; i++) {
            dltensor.putLong(tskew + structSize + 8 * i, shape[i]);
        }
    }

    private void putPointer(int at, int ptr, long value) {
        if (ptr == 8) {
            dltensor.putLong(at, value);
        } else {
            dltensor.putInt(at, (int) value);
        }
    }

    /** A fresh view of the elements (position 0). */
    ByteBuffer view() {
        ByteBuffer v = data.duplicate().order(ByteOrder.LITTLE_ENDIAN);
        v.clear();
        return v;
    }
}
