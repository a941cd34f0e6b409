package dev.tether.device;

import java.nio.ByteBuffer;
import java.nio.charset.Charset;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One opened OpenCL device ("opencl:N") of a session: its context and in-order profiling queue, the buffers it
 * allocated and the programs it built, all released by {@link #close}. The Java twin of
 * tether_rpc/gpu/opencl.py's OpenCLDevice, with the same checks and messages: a kernel's needs and work-group
 * against the device before building, the driver's own per-kernel limits after it, programs cached by sha256 of
 * source and options, too few launch arguments refused before the driver sees them.
 */
final class ClDevice {
    static final String BUILD_OPTIONS = "-cl-std=CL1.2";
    private static final Charset UTF8 = Charset.forName("UTF-8");

    /** A built program: its cl_program, its kernels by name (created once) and their limits. */
    static final class Program {
        final long handle;
        final Map<String, Long> kernels = new HashMap<String, Long>();
        final Map<String, long[]> kernelInfo = new HashMap<String, long[]>();   // NativeBridge.clKernelInfo

        Program(long handle) {
            this.handle = handle;
        }
    }

    final int index;
    final String spec;
    final Map<String, Object> info;
    final String name;
    private final long device;
    private long context;
    private long queue;
    private final Map<Long, Long> buffers = new LinkedHashMap<Long, Long>();   // cl_mem -> bytes
    private final Map<String, Program> programs = new HashMap<String, Program>();
    final String buildOptions;
    private boolean closed;

    /** Opens device {@code index}; GpuUnavailable in one line when this machine has no such OpenCL device. */
    static ClDevice open(int index) throws DeviceError {
        String path = OpenCL.load();
        long[] pairs;
        try {
            pairs = OpenCL.devices();
        } catch (ClError e) {
            throw e.toDeviceError(null);
        }
        int n = pairs.length / 2;
        if (n == 0) {
            throw new DeviceError("GpuUnavailable", "this device has no OpenCL: " + path + " lists no platform with a "
                    + "device (is an OpenCL driver installed? the ICD loader reads /etc/OpenCL/vendors)");
        }
        if (index < 0 || index >= n) {
            throw new DeviceError("GpuUnavailable", "this device has no OpenCL device " + index + ": " + path
                    + " lists " + n + " (opencl:0..opencl:" + (n - 1) + ")");
        }
        try {
            return new ClDevice(index, pairs[2 * index], pairs[2 * index + 1]);
        } catch (ClError e) {
            throw e.toDeviceError(null);
        }
    }

    private ClDevice(int index, long platform, long device) {
        this.index = index;
        this.spec = "opencl:" + index;
        this.device = device;
        this.info = OpenCL.info(platform, device, index);
        this.name = (String) info.get("name");
        int[] c = OpenCL.parseVersion((String) info.get("opencl_c_version"));
        this.buildOptions = c[0] > 1 || (c[0] == 1 && c[1] >= 2) ? BUILD_OPTIONS : "";
        context = NativeBridge.clCreateContext(device);
        try {
            queue = NativeBridge.clCreateQueue(context, device);
        } catch (ClError e) {
            NativeBridge.clRelease(4, context);
            throw e;
        }
    }

    private void live() throws DeviceError {
        if (closed) {
            throw new DeviceError("GpuError", spec + " (" + name + ") was closed");
        }
    }

    // -- memory ---------------------------------------------------------------------------------------------------
    /** A new cl_mem of {@code nbytes} (0 bytes: one byte, as OpenCL has no empty buffer). */
    synchronized long alloc(long nbytes) throws DeviceError {
        live();
        long n = Math.max(nbytes, 1);
        try {
            long mem = NativeBridge.clAlloc(context, n);
            buffers.put(mem, n);
            return mem;
        } catch (ClError e) {
            long max = (Long) info.get("max_alloc_bytes");
            if (e.code == -61 && n > max) {   // CL_INVALID_BUFFER_SIZE
                throw new DeviceError("GpuError", "clCreateBuffer failed: CL_INVALID_BUFFER_SIZE (-61): " + n
                        + " bytes is over " + name + "'s largest buffer of " + max + " bytes", e);
            }
            throw e.toDeviceError(n + " bytes");
        }
    }

    /** Gives a buffer back; a buffer freed already (or of another device) is left alone. */
    synchronized void free(long mem) {
        if (!closed && buffers.remove(mem) != null) {
            NativeBridge.clRelease(0, mem);
        }
    }

    synchronized long allocatedBytes() {
        long n = 0;
        for (long b : buffers.values()) {
            n += b;
        }
        return n;
    }

    private void own(long mem, long offset, long n, String what) throws DeviceError {
        live();
        Long size = buffers.get(mem);
        if (size == null) {
            throw new DeviceError("ValueError", what + ": the buffer is not one of " + spec + "'s (freed already?)");
        }
        if (offset < 0 || n < 0 || offset + n > size) {
            throw new DeviceError("ValueError", what + ": bytes " + offset + ".." + (offset + n) + " are outside the "
                    + size + "-byte buffer");
        }
    }

    /** Blocking upload of {@code n} bytes at byte {@code pos} of a direct buffer into {@code mem} at offset. */
    synchronized void upload(long mem, long offset, ByteBuffer src, long pos, long n) throws DeviceError {
        own(mem, offset, n, "upload");
        try {
            NativeBridge.clWrite(queue, mem, offset, src, pos, n);
        } catch (ClError e) {
            throw e.toDeviceError(null);
        }
    }

    /** Blocking download (after every kernel before it: the queue is in order). */
    synchronized void download(long mem, long offset, ByteBuffer dst, long pos, long n) throws DeviceError {
        own(mem, offset, n, "download");
        try {
            NativeBridge.clRead(queue, mem, offset, dst, pos, n);
        } catch (ClError e) {
            throw e.toDeviceError(null);
        }
    }

    synchronized void copy(long dst, long src, long n) throws DeviceError {
        own(dst, 0, n, "copy");
        own(src, 0, n, "copy");
        try {
            NativeBridge.clCopy(queue, dst, src, n);
        } catch (ClError e) {
            throw e.toDeviceError(null);
        }
    }

    // -- programs ---------------------------------------------------------------------------------------------------
    private static long num(Object o, long otherwise) {
        return o instanceof Number ? ((Number) o).longValue() : otherwise;
    }

    static long[] block(Map<String, Object> k, String key) {
        long[] out = {1, 1, 1};
        Object b = k.get(key);
        if (b instanceof List) {
            List<?> l = (List<?>) b;
            for (int i = 0; i < 3 && i < l.size(); i++) {
                out[i] = num(l.get(i), 1);
            }
        }
        return out;
    }

    private static String tuple(long[] b) {
        return "(" + b[0] + ", " + b[1] + ", " + b[2] + ")";
    }

    /** What the device cannot run, refused before building (opencl.py's _check_kernel_info, same words). */
    @SuppressWarnings("unchecked")
    private void checkKernelInfo(Map<String, Object> k) throws DeviceError {
        String kname = String.valueOf(k.get("name"));
        List<Object> extensions = (List<Object>) info.get("extensions");
        Object needs = k.get("needs");
        if (needs instanceof List) {
            for (Object need : (List<Object>) needs) {
                String[] exts = OpenCL.NEEDS_EXTENSIONS.get(need);
                if (exts == null) {
                    throw new DeviceError("GpuUnavailable", "kernel " + kname + " needs '" + need + "', a feature the "
                            + "OpenCL runtime does not know (known: " + Text.join(new java.util.TreeSet<String>(
                            OpenCL.NEEDS_EXTENSIONS.keySet())) + ")");
                }
                boolean have = false;
                for (String e : exts) {
                    have |= extensions.contains(e);
                }
                if (!have) {
                    StringBuilder or = new StringBuilder();
                    for (String e : exts) {
                        or.append(or.length() > 0 ? " or " : "").append(e);
                    }
                    throw new DeviceError("GpuUnavailable", "kernel " + kname + " needs " + need + ", which " + name
                            + " (" + spec + ") lacks (no " + or + ")");
                }
            }
        }
        long[] b = block(k, "block");
        long threads = b[0] * b[1] * b[2];
        long maxThreads = (Long) info.get("max_threads_per_block");
        if (threads > maxThreads) {
            throw new DeviceError("ModuleLoadError", "kernel " + kname + ": a work-group of " + threads + " threads "
                    + tuple(b) + " exceeds " + name + "'s limit of " + maxThreads + " (CL_DEVICE_MAX_WORK_GROUP_SIZE)");
        }
        List<Object> maxBlock = (List<Object>) info.get("max_block");
        for (int axis = 0; axis < 3; axis++) {
            long limit = (Long) maxBlock.get(axis);
            if (b[axis] > limit) {
                throw new DeviceError("ModuleLoadError", "kernel " + kname + ": block " + tuple(b) + " is " + b[axis]
                        + " threads along " + "xyz".charAt(axis) + ", over " + name + "'s limit of " + limit
                        + " (CL_DEVICE_MAX_WORK_ITEM_SIZES)");
            }
        }
        long shared = num(k.get("shared_bytes"), 0);
        long maxShared = (Long) info.get("shared_memory_bytes");
        if (shared > maxShared) {
            throw new DeviceError("ModuleLoadError", "kernel " + kname + ": " + shared + " bytes of work-group memory "
                    + "exceed " + name + "'s " + maxShared + " (CL_DEVICE_LOCAL_MEM_SIZE)");
        }
    }

    static String sha256(byte[]... parts) {
        try {
            MessageDigest md = MessageDigest.getInstance("SHA-256");
            for (byte[] p : parts) {
                md.update(p);
            }
            StringBuilder hex = new StringBuilder();
            for (byte x : md.digest()) {
                hex.append(String.format("%02x", x & 0xff));
            }
            return hex.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("no SHA-256 in this VM", e);
        }
    }

    /**
     * Builds OpenCL C {@code code} (cached by sha256 of code and options) after checking each kernel's launch_info
     * against the device; GpuBuildError carries the driver's log, GpuUnavailable / ModuleLoadError what the
     * device lacks.
     */
    synchronized Program load(byte[] code, List<Map<String, Object>> kernels) throws DeviceError {
        live();
        List<String> names = new ArrayList<String>();
        for (Map<String, Object> k : kernels) {
            checkKernelInfo(k);
            names.add(String.valueOf(k.get("name")));
        }
        String key = sha256(code, new byte[]{0}, buildOptions.getBytes(UTF8));
        Program p = programs.get(key);
        if (p == null) {
            long handle;
            try {
                handle = NativeBridge.clBuild(context, device, code, buildOptions);
            } catch (ClError e) {
                if (e.log != null || e.code == -11) {
                    String log = e.log == null ? "" : e.log;
                    if (log.length() > ClError.MAX_BUILD_LOG) {
                        log = log.substring(0, ClError.MAX_BUILD_LOG) + "\n... (" + (log.length()
                                - ClError.MAX_BUILD_LOG) + " more characters of build log)";
                    }
                    java.util.Collections.sort(names);
                    throw new DeviceError("GpuBuildError", "OpenCL build of " + (names.isEmpty() ? "a program"
                            : Text.join(names)) + " for " + name + " failed: " + OpenCL.errorName(e.code) + "\n" + log,
                            e);
                }
                throw e.toDeviceError(null);
            }
            p = new Program(handle);
            programs.put(key, p);
        }
        for (Map<String, Object> k : kernels) {
            String kname = String.valueOf(k.get("name"));
            kernel(p, kname);
            long[] b = block(k, "block");
            long[] ki = p.kernelInfo.get(kname);
            long threads = b[0] * b[1] * b[2];
            if ((ki[2] | ki[3] | ki[4]) != 0 && (ki[2] != b[0] || ki[3] != b[1] || ki[4] != b[2])) {
                throw new DeviceError("ModuleLoadError", "kernel " + kname + ": launched with block " + tuple(b)
                        + ", but its source requires " + tuple(new long[]{ki[2], ki[3], ki[4]})
                        + " (reqd_work_group_size)");
            }
            if (threads > ki[1]) {
                throw new DeviceError("ModuleLoadError", "kernel " + kname + ": a work-group of " + threads
                        + " threads " + tuple(b) + " exceeds the " + ki[1] + " this kernel allows on " + name
                        + " (CL_KERNEL_WORK_GROUP_SIZE)");
            }
        }
        return p;
    }

    private long kernel(Program p, String kname) throws DeviceError {
        Long k = p.kernels.get(kname);
        if (k != null) {
            return k;
        }
        long kernel;
        try {
            kernel = NativeBridge.clKernel(p.handle, kname);
        } catch (ClError e) {
            throw e.toDeviceError(kname);
        }
        try {
            p.kernelInfo.put(kname, NativeBridge.clKernelInfo(kernel, device));
        } catch (ClError e) {
            NativeBridge.clRelease(1, kernel);
            throw e.toDeviceError(kname);
        }
        p.kernels.put(kname, kernel);
        return kernel;
    }

    // -- launches ---------------------------------------------------------------------------------------------------
    /**
     * Enqueues {@code kname} with {@code args} (this device's buffers, int32s, floats) over grid x block, local size
     * block, trailing dimensions of 1 left out; timed: waits and returns the device's seconds, else 0.
     */
    synchronized double launch(Program p, String kname, List<Arg> args, long[] grid, long[] block, boolean timed)
            throws DeviceError {
        live();
        long kernel = kernel(p, kname);
        long nargs = p.kernelInfo.get(kname)[0];
        if (args.size() < nargs) {
            throw new DeviceError("GpuError", "clEnqueueNDRangeKernel(" + kname + ") refused: CL_INVALID_KERNEL_ARGS "
                    + "(the kernel takes " + nargs + " arguments, " + args.size() + " given)");
        }
        int[] kinds = new int[args.size()];
        long[] values = new long[args.size()];
        for (int i = 0; i < kinds.length; i++) {
            Arg a = args.get(i);
            if (a.kind == 0 && !buffers.containsKey(a.value)) {
                throw new DeviceError("ValueError", "argument " + i + " of " + kname + ": the buffer is not one of "
                        + spec + "'s (freed already?)");
            }
            kinds[i] = a.kind;
            values[i] = a.value;
        }
        int dims = 3;
        while (dims > 1 && grid[dims - 1] == 1 && block[dims - 1] == 1) {
            dims--;
        }
        long[] global = new long[dims];
        long[] local = new long[dims];
        for (int d = 0; d < dims; d++) {
            if (grid[d] == 0) {
                return 0.0;   // an empty grid enqueues nothing
            }
            global[d] = grid[d] * block[d];
            local[d] = block[d];
        }
        try {
            return NativeBridge.clLaunch(queue, kernel, kinds, values, global, local, dims, timed) / 1e9;
        } catch (ClError e) {
            throw e.toDeviceError(kname);
        }
    }

    /** A launch argument: a buffer (kind 0), an int32 (1) or a float32's bits (2). */
    static final class Arg {
        final int kind;
        final long value;

        Arg(int kind, long value) {
            this.kind = kind;
            this.value = value;
        }

        static Arg buffer(long mem) {
            return new Arg(0, mem);
        }
    }

    synchronized void synchronize() throws DeviceError {
        live();
        try {
            NativeBridge.clFinish(queue);
        } catch (ClError e) {
            throw e.toDeviceError(null);
        }
    }

    /** Releases buffers, kernels, programs, the queue and the context. Idempotent. */
    synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        try {
            NativeBridge.clFinish(queue);
        } catch (ClError e) {
            // a failed device: release what we can
        }
        for (long mem : buffers.keySet()) {
            NativeBridge.clRelease(0, mem);
        }
        buffers.clear();
        for (Program p : programs.values()) {
            for (long k : p.kernels.values()) {
                NativeBridge.clRelease(1, k);
            }
            NativeBridge.clRelease(2, p.handle);
        }
        programs.clear();
        NativeBridge.clRelease(3, queue);
        NativeBridge.clRelease(4, context);
        queue = context = 0;
    }

    boolean closed() {
        return closed;
    }
}
