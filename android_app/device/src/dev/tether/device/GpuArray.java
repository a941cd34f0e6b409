package dev.tether.device;

import java.nio.ByteBuffer;

/**
 * An array in one OpenCL device's memory (the GPU twin of {@link DeviceArray}, tether_rpc/gpu/array.py's
 * DeviceArray): shape and dtype over one cl_mem of a session's {@link ClDevice}. Its bytes cross to the host only
 * through the device's upload/download, from and into direct buffers; copies between two arrays of one device stay
 * on it.
 */
final class GpuArray {
    /** Bytes staged per piece between the wire and the device (tether_rpc/session.py's GPU_STAGING). */
    static final int STAGING = 16 << 20;

    final ClDevice device;
    final String dtype;
    final long[] shape;
    final long nbytes;
    private long mem;

    GpuArray(ClDevice device, long[] shape, String dtype) throws DeviceError {
        this.device = device;
        this.dtype = dtype;
        this.shape = shape.clone();
        this.nbytes = DeviceArray.nbytesOf(shape, dtype);
        this.mem = device.alloc(nbytes);   // an empty array still holds a buffer: every array has a handle
    }

    String spec() {
        return device.spec;
    }

    /** The cl_mem (KernelError once freed). */
    long mem() throws DeviceError {
        if (mem == 0) {
            throw new DeviceError("KernelError", "array " + dtype + " " + Text.shape(shape) + " on " + spec()
                    + " was freed");
        }
        return mem;
    }

    void upload(ByteBuffer src, long pos, long offset, long n) throws DeviceError {
        device.upload(mem(), offset, src, pos, n);
    }

    /** All of it from a direct host buffer holding exactly nbytes from position 0. */
    void uploadAll(ByteBuffer src) throws DeviceError {
        if (nbytes > 0) {
            device.upload(mem(), 0, src, 0, nbytes);
        }
    }

    void downloadAll(ByteBuffer dst) throws DeviceError {
        if (nbytes > 0) {
            device.download(mem(), 0, dst, 0, nbytes);
        }
    }

    /** Gives the device memory back now. Idempotent. */
    void free() {
        long m = mem;
        mem = 0;
        if (m != 0) {
            device.free(m);
        }
    }

    /**
     * {@code src} into {@code dst} (each a DeviceArray or a GpuArray, same shape and dtype): on the device when
     * both are arrays of one device, else through host memory.
     */
    static void copy(Object dst, Object src) throws DeviceError {
        String sd = dtypeOf(src);
        String dd = dtypeOf(dst);
        long[] ss = shapeOf(src);
        long[] ds = shapeOf(dst);
        if (!sd.equals(dd) || !java.util.Arrays.equals(ss, ds)) {
            throw new DeviceError("KernelError", "copy: array " + sd + " " + Text.shape(ss) + " and array " + dd + " "
                    + Text.shape(ds) + " differ in shape or dtype");
        }
        if (dst == src) {
            return;
        }
        if (src instanceof GpuArray && dst instanceof GpuArray) {
            GpuArray s = (GpuArray) src;
            GpuArray d = (GpuArray) dst;
            if (s.device == d.device) {
                if (s.nbytes > 0) {
                    s.device.copy(d.mem(), s.mem(), s.nbytes);
                }
                return;
            }
            ByteBuffer staging = DeviceArray.aligned(s.nbytes, "the copy of an array through host memory");
            s.downloadAll(staging);
            d.uploadAll(staging);
        } else if (dst instanceof GpuArray) {
            ((GpuArray) dst).uploadAll(((DeviceArray) src).view());
        } else if (src instanceof GpuArray) {
            ((GpuArray) src).downloadAll(((DeviceArray) dst).view());
        } else {
            ByteBuffer from = ((DeviceArray) src).view();
            from.limit((int) ((DeviceArray) src).nbytes);
            ((DeviceArray) dst).view().put(from);
        }
    }

    static String dtypeOf(Object a) {
        return a instanceof GpuArray ? ((GpuArray) a).dtype : ((DeviceArray) a).dtype;
    }

    static long[] shapeOf(Object a) {
        return a instanceof GpuArray ? ((GpuArray) a).shape : ((DeviceArray) a).shape;
    }

    static long nbytesOf(Object a) {
        return a instanceof GpuArray ? ((GpuArray) a).nbytes : ((DeviceArray) a).nbytes;
    }
}
