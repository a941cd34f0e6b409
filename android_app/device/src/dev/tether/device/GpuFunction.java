package dev.tether.device;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * One function of a GPU module (tether_rpc/gpu/module.py's GpuFunction): a call launches its kernels in the order
 * of the metadata's "launches", each on the buffers it names among the arguments followed by the temporaries, and
 * waits for the last. Arguments are arrays of the module's device (no copies) or host arrays, uploaded into a
 * staging buffer per argument and, if the function writes them, downloaded back after the launches. Temporaries
 * and staging buffers are allocated at the first call and freed with the module.
 */
final class GpuFunction {
    final NativeModule module;
    final GpuModule gpu;
    final String name;
    private final Map<String, Object> info;
    private final List<Map<String, Object>> argInfo;
    private final Set<Long> outputs = new HashSet<Long>();
    private List<Long> temporaries;
    private final Map<Integer, Long> staging = new HashMap<Integer, Long>();

    @SuppressWarnings("unchecked")
    GpuFunction(NativeModule module, GpuModule gpu, String name, Map<String, Object> info) {
        this.module = module;
        this.gpu = gpu;
        this.name = name;
        this.info = info;
        this.argInfo = GpuModule.list(info.get("args"));
        Object out = info.get("outputs");
        if (out instanceof List) {
            for (Object o : (List<Object>) out) {
                if (o instanceof Long) {
                    outputs.add((Long) o);
                }
            }
        } else {
            for (long i = 0; i < argInfo.size(); i++) {
                outputs.add(i);
            }
        }
    }

    private static long[] shapeOf(Object o) {
        List<?> l = o instanceof List ? (List<?>) o : new ArrayList<Object>();
        long[] out = new long[l.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = l.get(i) instanceof Long ? (Long) l.get(i) : -1;
        }
        return out;
    }

    private String argNames() {
        StringBuilder b = new StringBuilder();
        for (Map<String, Object> a : argInfo) {
            b.append(b.length() > 0 ? ", " : "").append(a.get("name"));
        }
        return b.toString();
    }

    /** The cl_mem argument {@code i} runs on; host arrays are staged (and remembered in {@code host}). */
    private long bufferOf(int i, Object a, List<Object[]> host) throws DeviceError {
        Map<String, Object> spec = argInfo.get(i);
        long[] shape = shapeOf(spec.get("shape"));
        String dtype = String.valueOf(spec.get("dtype"));
        String want = dtype + " array of shape " + Text.shape(shape);
        String head = name + ": argument " + i + " (" + spec.get("name") + ")";
        if (a instanceof GpuArray) {
            GpuArray g = (GpuArray) a;
            if (g.device != gpu.device) {
                throw new DeviceError("KernelError", head + " is on another device than the module's "
                        + gpu.device.spec);
            }
            if (!java.util.Arrays.equals(g.shape, shape) || !g.dtype.equals(dtype)) {
                throw new DeviceError("KernelError", head + " must be a " + want + ", got a " + g.dtype
                        + " array of shape " + Text.shape(g.shape));
            }
            return g.mem();
        }
        if (a instanceof DeviceArray) {
            DeviceArray h = (DeviceArray) a;
            if (!java.util.Arrays.equals(h.shape, shape) || !h.dtype.equals(dtype)) {
                throw new DeviceError("KernelError", head + " must be a C-contiguous " + want + ", got a " + h.dtype
                        + " array of shape " + Text.shape(h.shape));
            }
            Long staged = staging.get(i);
            if (staged == null) {
                staged = gpu.device.alloc(Math.max(h.nbytes, 1));
                staging.put(i, staged);
            }
            if (h.nbytes > 0) {
                gpu.device.upload(staged, 0, h.view(), 0, h.nbytes);
            }
            host.add(new Object[]{i, h, staged});
            return staged;
        }
        throw new DeviceError("KernelError", head + " must be a device array or a host " + want + ", got "
                + Builtins.typeName(a));
    }

    private List<Long> temps() throws DeviceError {
        if (temporaries == null) {
            List<Long> out = new ArrayList<Long>();
            try {
                for (Map<String, Object> t : GpuModule.list(info.get("temporaries"))) {
                    long size = t.get("size") instanceof Long ? (Long) t.get("size") : 0;
                    out.add(gpu.device.alloc(DeviceArray.nbytesOf(new long[]{size}, String.valueOf(t.get("dtype")))));
                }
            } catch (DeviceError e) {
                for (long m : out) {
                    gpu.device.free(m);
                }
                throw e;
            }
            temporaries = out;
        }
        return temporaries;
    }

    /** Runs the function on {@code args} (GpuArray or host DeviceArray each); seconds on the device when timed. */
    @SuppressWarnings("unchecked")
    synchronized double call(Object[] args, boolean timed) throws DeviceError {
        if (args.length != argInfo.size()) {
            throw new DeviceError("KernelError", name + " takes " + argInfo.size() + " arguments (" + argNames()
                    + "), got " + args.length);
        }
        if (!module.loaded()) {
            throw new DeviceError("ModuleLoadError", name + ": module " + gpu.label + " was closed");
        }
        List<Object[]> host = new ArrayList<Object[]>();
        List<Long> buffers = new ArrayList<Long>();
        for (int i = 0; i < args.length; i++) {
            buffers.add(bufferOf(i, args[i], host));
        }
        buffers.addAll(temps());
        double seconds = 0;
        for (Map<String, Object> launch : GpuModule.list(info.get("launches"))) {
            Map<String, Object> k = gpu.kernels.get(launch.get("kernel"));
            List<ClDevice.Arg> kargs = new ArrayList<ClDevice.Arg>();
            for (Object j : (List<Object>) launch.get("args")) {
                kargs.add(ClDevice.Arg.buffer(buffers.get((int) (long) (Long) j)));
            }
            seconds += gpu.device.launch(gpu.program, (String) k.get("name"), kargs, ClDevice.block(k, "grid"),
                    ClDevice.block(k, "block"), timed);
        }
        gpu.device.synchronize();
        for (Object[] h : host) {
            int i = (Integer) h[0];
            DeviceArray arr = (DeviceArray) h[1];
            if (outputs.contains((long) i) && arr.nbytes > 0) {
                gpu.device.download((Long) h[2], 0, arr.view(), 0, arr.nbytes);
            }
        }
        return seconds;
    }

    /** A call on fixed arguments, for time_evaluator: seconds per call on the device's clock. */
    Timing.Timed bind(final Object[] args) {
        return new Timing.Timed() {
            public void call() throws DeviceError {
                GpuFunction.this.call(args, false);
            }

            public double time(int number) throws DeviceError {
                double total = 0;
                for (int i = 0; i < number; i++) {
                    total += GpuFunction.this.call(args, true);
                }
                return total / number;
            }
        };
    }

    synchronized void release() {
        for (long m : staging.values()) {
            gpu.device.free(m);
        }
        staging.clear();
        if (temporaries != null) {
            for (long m : temporaries) {
                gpu.device.free(m);
            }
            temporaries = null;
        }
    }
}
