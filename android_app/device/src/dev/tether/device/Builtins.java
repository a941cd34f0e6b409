package dev.tether.device;

import dev.tether.rpc.RemoteHandle;
import dev.tether.rpc.Tensor;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The core built-ins of a session (docs/protocol.md "Built-in functions"); same names and values as Python. */
final class Builtins {
    private Builtins() {
    }

    static void register(final Session s) {
        s.builtins.put("tether.echo", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) {
                return a.size() == 1 ? a.get(0) : new ArrayList<Object>(a);
            }
        });
        s.builtins.put("tether.functions", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.functions", a, 0, 0);
                return new ArrayList<Object>(s.builtins.keySet());
            }
        });
        s.builtins.put("tether.device_info", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.device_info", a, 0, 0);
                Map<String, Object> info = DeviceInfo.collect();
                info.put("session_limits", s.limits.describe());
                return info;
            }
        });
        s.builtins.put("tether.array.empty", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.array.empty", a, 1, 3);
                String spec = gpuSpec(a.size() > 2 ? a.get(2) : null);
                String dtype = a.size() > 1 ? str(a.get(1), "dtype") : "float32";
                long[] shape = shape(a.get(0));
                return spec == null ? keep(s, shape, dtype, null) : keepGpu(s, spec, shape, dtype, null);
            }
        });
        s.builtins.put("tether.array.from_tensor", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.array.from_tensor", a, 1, 2);
                String spec = gpuSpec(a.size() > 1 ? a.get(1) : null);
                if (!(a.get(0) instanceof Tensor)) {
                    throw new DeviceError("TypeError", "tether.array.from_tensor takes a tensor, got " + typeName(a.get(0)));
                }
                Tensor t = (Tensor) a.get(0);
                return spec == null ? keep(s, t.shape(), t.dtype(), t) : keepGpu(s, spec, t.shape(), t.dtype(), t);
            }
        });
        s.builtins.put("tether.array.copy_in", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError, IOException {
                arity("tether.array.copy_in", a, 1, 1);
                Object o = s.getArray(a.get(0));
                long n = c.requireBulk("tether.array.copy_in");
                long nbytes = GpuArray.nbytesOf(o);
                if (n != nbytes) {
                    throw new DeviceError("ValueError", "copy_in: " + n + " bytes sent, the array " + GpuArray.dtypeOf(o)
                            + " " + Text.shape(GpuArray.shapeOf(o)) + " holds " + nbytes);
                }
                if (o instanceof DeviceArray) {
                    s.readBulkTo(c, ((DeviceArray) o).view(), n);
                    return null;
                }
                // a GPU array: the bytes land in host memory first, in bounded pieces (no second whole copy)
                GpuArray arr = (GpuArray) o;
                ByteBuffer staging = ByteBuffer.allocateDirect((int) Math.min(Math.max(n, 1), GpuArray.STAGING));
                for (long offset = 0; offset < n; offset += GpuArray.STAGING) {
                    int piece = (int) Math.min(GpuArray.STAGING, n - offset);
                    staging.clear();
                    staging.limit(piece);
                    s.readBulkTo(c, staging, piece);
                    arr.upload(staging, 0, offset, piece);
                }
                return null;
            }
        });
        s.builtins.put("tether.array.copy_out", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.array.copy_out", a, 1, 1);
                Object o = s.getArray(a.get(0));
                if (o instanceof DeviceArray) {
                    DeviceArray arr = (DeviceArray) o;
                    return new Session.BulkReply(null, arr.view(), null, arr.nbytes);
                }
                GpuArray arr = (GpuArray) o;
                ByteBuffer staging = DeviceArray.aligned(arr.nbytes, "the download of an array on " + arr.spec());
                arr.downloadAll(staging);
                return new Session.BulkReply(null, staging, null, arr.nbytes);
            }
        });
        s.builtins.put("tether.array.copy_to", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.array.copy_to", a, 2, 2);
                GpuArray.copy(s.getArray(a.get(1)), s.getArray(a.get(0)));
                return null;
            }
        });
        Session.Builtin free = new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.free", a, 1, 1);
                Object h = a.get(0);
                Object o = h instanceof RemoteHandle ? s.objects.remove(((RemoteHandle) h).id()) : null;
                if (o == null) {
                    throw new DeviceError("KeyError", "cannot free " + h + ": no such handle in this session");
                }
                s.release(o);
                if (o instanceof DeviceArray || o instanceof GpuArray) {
                    s.limits.release(GpuArray.nbytesOf(o));
                }
                return null;
            }
        };
        s.builtins.put("tether.array.free", free);
        s.builtins.put("tether.free", free);
        s.builtins.put("tether.upload", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError, IOException {
                arity("tether.upload", a, 1, 1);
                long n = c.requireBulk("tether.upload");
                File dst = s.folder.pathFor(a.get(0));  // refuses unsafe names before anything is written
                // (a file of the same name is replaced: its bytes do not count)
                s.limits.checkDisk(s.folder.bytes() - (dst.isFile() ? dst.length() : 0), n, (String) a.get(0));
                // written beside it and renamed over it: rewriting a loaded library in place could crash the process
                File part = File.createTempFile(".upload-", "", s.folder.dir);
                boolean ok = false;
                try {
                    FileOutputStream out = new FileOutputStream(part);
                    try {
                        s.readBulkTo(c, out, n);
                    } finally {
                        out.close();
                    }
                    if (!part.renameTo(dst)) {
                        throw new IOException("cannot rename the upload to " + dst.getName());
                    }
                    ok = true;
                } finally {
                    if (!ok) {
                        part.delete();
                    }
                }
                Map<String, Object> r = new LinkedHashMap<String, Object>();
                r.put("name", a.get(0));
                r.put("size", n);
                return r;
            }
        });
        s.builtins.put("tether.download", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError, IOException {
                arity("tether.download", a, 1, 1);
                File f = s.folder.existing(a.get(0));
                Map<String, Object> r = new LinkedHashMap<String, Object>();
                r.put("name", a.get(0));
                r.put("size", f.length());
                return new Session.BulkReply(r, null, f, f.length());
            }
        });
        s.builtins.put("tether.listdir", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.listdir", a, 0, 0);
                return new ArrayList<Object>(s.folder.list());
            }
        });
        s.builtins.put("tether.remove", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError, IOException {
                arity("tether.remove", a, 1, 1);
                File f = s.folder.existing(a.get(0));
                if (!f.delete()) {
                    throw new DeviceError("OSError", "cannot remove " + f.getName());
                }
                return null;
            }
        });
        s.builtins.put("tether.module.load", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError, IOException {
                arity("tether.module.load", a, 1, 1);
                // a GPU module runs on the session's device "opencl:0", the one its device arrays live on
                NativeModule m = NativeModule.load(s.folder.existing(a.get(0)), s.deviceOpener);
                s.pool.add(m);
                Map<String, Object> r = new LinkedHashMap<String, Object>();
                r.put("handle", s.put(m));
                r.put("functions", new ArrayList<Object>(m.functionNames()));
                r.put("metadata", m.metadata);
                return r;
            }
        });
        s.builtins.put("tether.module.get_function", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws DeviceError {
                arity("tether.module.get_function", a, 2, 2);
                NativeModule m = s.get(a.get(0), NativeModule.class, "module");
                Object name = a.get(1);
                if (!(name instanceof String) || !m.functionNames().contains(name)) {
                    throw new DeviceError("KeyError", "module has no function '" + name + "' (it has: "
                            + Text.join(m.functionNames()) + ")");
                }
                if (!m.loaded()) {
                    throw new DeviceError("ModuleLoadError", "module " + m.label + " is closed");
                }
                Object f = m.functions.containsKey(name) ? new PackedCall.Function(m, (String) name)
                        : m.gpu.function(m, (String) name);
                Map<String, Object> r = new LinkedHashMap<String, Object>();
                r.put("handle", s.put(f));
                m.acquire();  // the library stays loaded while this handle exists
                r.put("name", name);
                return r;
            }
        });
        s.builtins.put("tether.time_evaluator", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                arity("tether.time_evaluator", a, 2, 3);
                return Timing.timeEvaluator(s, c, a);
            }
        });
    }

    /**
     * A client's device spec as "API:INDEX" ("opencl" is "opencl:0", tether_rpc/gpu/array.py canonical_spec), or
     * null for host memory (none, "cpu", "cpu:0"); ValueError naming a malformed one.
     */
    static String gpuSpec(Object device) throws DeviceError {
        if (device == null) {
            return null;
        }
        if (!(device instanceof String)) {
            throw new DeviceError("ValueError", "device must be a string such as 'opencl:0' or 'cpu', got "
                    + typeName(device));
        }
        String text = ((String) device).trim().toLowerCase(java.util.Locale.ROOT);
        if (text.equals("cpu") || text.equals("cpu:0")) {
            return null;
        }
        int colon = text.indexOf(':');
        String api = colon < 0 ? text : text.substring(0, colon);
        String index = colon < 0 ? "0" : text.substring(colon + 1);
        if (!api.matches("[a-z0-9]+") || !index.matches("[0-9]{1,9}")) {
            throw new DeviceError("ValueError", "device '" + device + "': expected API:INDEX such as opencl:0, vulkan:0 "
                    + "or cuda:0, or cpu");
        }
        return api + ":" + Integer.parseInt(index);
    }

    /** The session's device for a GPU array; its refusal names the spec ("opencl:0: this device has no OpenCL..."). */
    static ClDevice gpuDevice(Session s, String spec) throws DeviceError {
        try {
            return s.device(spec);
        } catch (DeviceError e) {
            String m = e.getMessage();
            throw new DeviceError(e.type, m.startsWith(spec) || m.startsWith("this device runs") ? m
                    : spec + ": " + m, e);
        }
    }

    /** A new array on a GPU (uninitialised, or a copy of {@code t}) charged to the session's memory budget. */
    static Map<String, Object> keepGpu(Session s, String spec, long[] shape, String dtype, Tensor t) throws DeviceError {
        long nbytes = DeviceArray.nbytesOf(shape, dtype);
        ClDevice device = gpuDevice(s, spec);   // a missing GPU is named before any memory is charged
        s.limits.reserve(nbytes, "an array of shape " + Text.shape(shape) + " " + dtype + " on " + spec);
        GpuArray arr = null;
        try {
            arr = new GpuArray(device, shape, dtype);
            if (t != null && nbytes > 0) {
                ByteBuffer staging = DeviceArray.aligned(nbytes, "the upload of an array to " + spec);
                staging.put(t.data());
                arr.uploadAll(staging);
            }
            Map<String, Object> r = info(s.put(arr), arr.shape, arr.dtype);
            r.put("device", spec);
            return r;
        } catch (DeviceError | RuntimeException e) {
            s.limits.release(nbytes);
            if (arr != null) {
                arr.free();
            }
            throw e;
        }
    }

    static void arity(String name, List<Object> a, int min, int max) throws DeviceError {
        if (a.size() < min || a.size() > max) {
            throw new DeviceError("TypeError", name + " takes " + (min == max ? "" + min : min + " to " + max)
                    + " arguments, got " + a.size());
        }
    }

    /** Python's type names for the values a frame decodes to. */
    private static final Object[][] PY_TYPES = {{Boolean.class, "bool"}, {Long.class, "int"}, {Double.class, "float"},
            {String.class, "str"}, {byte[].class, "bytes"}, {List.class, "list"}, {Map.class, "dict"},
            {Tensor.class, "ndarray"}, {RemoteHandle.class, "RemoteHandle"}, {DeviceArray.class, "array"},
            {GpuArray.class, "array"}};

    static String typeName(Object o) {
        return o == null ? "NoneType" : Text.nameOf(o, PY_TYPES);
    }

    static String str(Object o, String what) throws DeviceError {
        if (!(o instanceof String)) {
            throw new DeviceError("TypeError", what + " must be a str, got " + typeName(o));
        }
        return (String) o;
    }

    static long[] shape(Object o) throws DeviceError {
        if (o instanceof Long) {
            return new long[]{(Long) o};
        }
        if (!(o instanceof List)) {
            throw new DeviceError("TypeError", "shape must be a list of ints, got " + typeName(o));
        }
        List<?> l = (List<?>) o;
        long[] out = new long[l.size()];
        for (int i = 0; i < out.length; i++) {
            if (!(l.get(i) instanceof Long)) {
                throw new DeviceError("TypeError", "shape must be a list of ints, got " + o);
            }
            out[i] = (Long) l.get(i);
        }
        return out;
    }

    /** A new array (zeroed, or a copy of {@code t}) charged to the session's memory budget, in the table. */
    static Map<String, Object> keep(Session s, long[] shape, String dtype, Tensor t) throws DeviceError {
        long nbytes = DeviceArray.nbytesOf(shape, dtype);
        s.limits.reserve(nbytes, "an array of shape " + Text.shape(shape) + " " + dtype);
        try {
            DeviceArray arr = t != null ? fromTensor(t) : new DeviceArray(shape, dtype);
            return info(s.put(arr), arr.shape, arr.dtype);
        } catch (DeviceError | RuntimeException e) {
            s.limits.release(nbytes);
            throw e;
        }
    }

    static Map<String, Object> info(RemoteHandle h, long[] arrShape, String dtype) {
        Map<String, Object> r = new LinkedHashMap<String, Object>();
        r.put("handle", h);
        List<Object> shape = new ArrayList<Object>();
        for (long d : arrShape) {
            shape.add(d);
        }
        r.put("shape", shape);
        r.put("dtype", dtype);
        return r;
    }

    static DeviceArray fromTensor(Tensor t) throws DeviceError {
        DeviceArray arr = new DeviceArray(t.shape(), t.dtype());
        arr.view().put(t.data());
        return arr;
    }

    static Tensor toTensor(DeviceArray arr) {
        byte[] b = new byte[(int) arr.nbytes];
        arr.view().get(b);
        return Tensor.of(arr.dtype, arr.shape, b);
    }
}
