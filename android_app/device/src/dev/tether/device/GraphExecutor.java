package dev.tether.device;

import dev.tether.rpc.Json;
import dev.tether.rpc.RemoteHandle;
import dev.tether.rpc.Tensor;

import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The graph executor for a model folder (deploy.json, deploy.so, deploy.params; docs/graph.md and
 * tether_rpc/graph_executor.py): storages are allocated once, every entry is a DLTensor over a slice of its
 * storage, every node a packed call bound once to its entries, so run() is one native call per node. The
 * {@code tether.graph.*} built-ins take the same arguments and give the same values as the Python server's.
 */
final class GraphExecutor implements Timing.Timed {
    static final long MAX_STORAGE_BYTES = 4L << 30;
    private static final Charset UTF8 = Charset.forName("UTF-8");

    private final Map<String, Object> graph;
    private final NativeModule module;
    private final List<DeviceArray> entries = new ArrayList<DeviceArray>();
    private final List<Map<String, Object>> nodes = new ArrayList<Map<String, Object>>();
    private final List<PackedCall> calls = new ArrayList<PackedCall>();
    private final List<Integer> inputs = new ArrayList<Integer>();
    private final List<Integer> outputs = new ArrayList<Integer>();
    private final List<String> inputNames = new ArrayList<String>();
    private final List<String> outputNames = new ArrayList<String>();
    private final Map<String, Integer> params = new LinkedHashMap<String, Integer>();
    private long storageBytes;

    private static int toInt(Object o) {
        if (!(o instanceof Long)) {
            throw new ClassCastException("expected an int, got " + Builtins.typeName(o));
        }
        return (int) (long) (Long) o;
    }

    private static long[] longs(Object o) {
        List<?> l = (List<?>) o;
        long[] out = new long[l.size()];
        for (int i = 0; i < out.length; i++) {
            if (!(l.get(i) instanceof Long)) {
                throw new ClassCastException("expected a list of ints");
            }
            out[i] = (Long) l.get(i);
        }
        return out;
    }

    @SuppressWarnings("unchecked")
    GraphExecutor(Object parsed, NativeModule module) throws DeviceError {
        this.module = module;
        if (!(parsed instanceof Map) || !"tether-graph".equals(((Map<String, Object>) parsed).get("format"))) {
            throw new DeviceError("ValueError", "not a tether graph JSON (format "
                    + (parsed instanceof Map ? ((Map<String, Object>) parsed).get("format") : Builtins.typeName(parsed)) + ")");
        }
        graph = (Map<String, Object>) parsed;
        Object version = graph.get("version");
        if (!Long.valueOf(1).equals(version) && !Long.valueOf(2).equals(version)) {
            throw new DeviceError("ValueError", "graph JSON version " + version + "; this runtime reads versions 1, 2 "
                    + "(update the device runtime)");
        }
        try {
            setup();
        } catch (ClassCastException | IndexOutOfBoundsException | NullPointerException e) {
            // the graph is untrusted input (an uploaded deploy.json): any shape it has ends in one error type
            throw new DeviceError("ValueError", "malformed graph JSON: " + e.getClass().getSimpleName() + ": "
                    + e.getMessage());
        }
    }

    @SuppressWarnings("unchecked")
    private void setup() throws DeviceError {
        long[] sizes = longs(graph.get("storages"));
        long total = 0;
        for (long n : sizes) {
            if (n < 0 || n > Integer.MAX_VALUE - 64) {
                throw new DeviceError("ValueError", "graph storage of " + n + " bytes: sizes must be >= 0 and at "
                        + "most 2 GiB each on this device server");
            }
            total += n;
        }
        if (total > MAX_STORAGE_BYTES) {
            throw new DeviceError("ValueError", "graph storages of " + total + " bytes in total (at most "
                    + MAX_STORAGE_BYTES + ")");
        }
        storageBytes = total;
        List<ByteBuffer> storages = new ArrayList<ByteBuffer>();
        for (long n : sizes) {
            storages.add(DeviceArray.aligned(Math.max(n, 1), "a graph storage"));
        }
        List<Object> es = (List<Object>) graph.get("entries");
        for (int k = 0; k < es.size(); k++) {
            Map<String, Object> e = (Map<String, Object>) es.get(k);
            String dtype = (String) e.get("dtype");
            if (DeviceArray.dtypeIndex(dtype) < 0) {
                throw new DeviceError("ValueError", "graph entry " + k + " has dtype " + dtype + " (allowed: "
                        + Text.join(Arrays.asList(DeviceArray.DTYPES)) + ")");
            }
            long[] shape = longs(e.get("shape"));
            long nbytes = DeviceArray.nbytesOf(shape, dtype);
            ByteBuffer store = storages.get(toInt(e.get("storage")));
            long offset = e.containsKey("offset") ? (Long) e.get("offset") : 0;
            int item = (int) DeviceArray.nbytesOf(new long[]{1}, dtype);
            if (offset < 0 || offset % item != 0) {
                throw new DeviceError("ValueError", "graph entry " + k + " (" + e.get("name") + "): offset " + offset
                        + " is not a multiple of its element size " + item);
            }
            if (offset + nbytes > store.capacity()) {
                throw new DeviceError("ValueError", "graph entry " + k + " (" + e.get("name") + ") needs bytes "
                        + offset + ".." + (offset + nbytes) + ", its storage has " + store.capacity());
            }
            ByteBuffer view = store.duplicate();
            view.position((int) offset);
            view.limit((int) (offset + nbytes));
            entries.add(new DeviceArray(shape, dtype, view.slice()));
        }
        for (Object i : (List<Object>) graph.get("inputs")) {
            inputs.add(toInt(i));
            inputNames.add((String) ((Map<String, Object>) es.get(toInt(i))).get("name"));
        }
        for (Object i : (List<Object>) graph.get("outputs")) {
            outputs.add(toInt(i));
            outputNames.add((String) ((Map<String, Object>) es.get(toInt(i))).get("name"));
        }
        for (Object i : (List<Object>) graph.get("params")) {
            params.put((String) ((Map<String, Object>) es.get(toInt(i))).get("name"), toInt(i));
        }
        for (Object o : (List<Object>) graph.get("nodes")) {
            Map<String, Object> node = (Map<String, Object>) o;
            String func = (String) node.get("func");
            if (!module.functions.containsKey(func)) {
                throw new DeviceError("KeyError", module.label + " has no function '" + func + "'; it has: "
                        + Text.join(module.functions.keySet()));
            }
            List<Object> argIds = (List<Object>) node.get("args");
            List<Object> shapes = node.get("shapes") instanceof List ? (List<Object>) node.get("shapes") : null;
            Object[] args = new Object[argIds.size()];
            for (int i = 0; i < args.length; i++) {
                DeviceArray e = entries.get(toInt(argIds.get(i)));
                long[] shape = e.shape.length == 0 ? new long[]{1} : e.shape;  // kernels never take rank 0
                if (shapes != null && i < shapes.size()) {
                    shape = longs(shapes.get(i));
                }
                args[i] = Arrays.equals(shape, e.shape) ? e : new DeviceArray(shape, e.dtype, e.view());
            }
            nodes.add(node);
            calls.add(new PackedCall(new PackedCall.Function(module, func), args));
        }
    }

    // -- params -------------------------------------------------------------------------------------------------
    /** Reads a params file (docs/params.md) straight into the param entries. */
    void loadParams(File f) throws DeviceError, IOException {
        long size = f.length();
        if (size > Integer.MAX_VALUE) {
            throw new DeviceError("ValueError", "params file of " + size + " bytes is too large for this device server");
        }
        byte[] raw = readAll(f, Integer.MAX_VALUE);
        ByteBuffer b = ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN);
        try {
            byte[] magic = new byte[8];
            b.get(magic);
            if (!new String(magic, UTF8).equals("TTHRPRM\0")) {
                throw new DeviceError("ParamsFormatError", "not a tether params file (bad magic)");
            }
            int version = b.getInt();
            if (version != 1) {
                throw new DeviceError("ParamsFormatError", "params format version " + version
                        + "; this runtime reads version 1");
            }
            long count = b.getInt() & 0xffffffffL;
            HashSet<String> seen = new HashSet<String>();
            for (long r = 0; r < count; r++) {
                byte[] name = new byte[b.getShort() & 0xffff];
                b.get(name);
                byte[] dt = new byte[b.get() & 0xff];
                b.get(dt);
                int ndim = b.get() & 0xff;
                if (ndim > 32) {
                    throw new DeviceError("ParamsFormatError", "a param has rank " + ndim + " (limit 32)");
                }
                long[] shape = new long[ndim];
                for (int i = 0; i < ndim; i++) {
                    shape[i] = b.getLong();
                }
                long nbytes = b.getLong();
                b.position(b.position() + (64 - b.position() % 64) % 64);
                if (nbytes < 0 || nbytes > b.remaining()) {
                    throw new DeviceError("ParamsFormatError", "params file truncated in record " + r);
                }
                String pname = new String(name, UTF8);
                String dtype = new String(dt, UTF8);
                Integer idx = params.get(pname);
                if (idx != null) {
                    DeviceArray dst = entries.get(idx);
                    if (!dtype.equals(dst.dtype) || !Arrays.equals(shape, dst.shape) || nbytes != dst.nbytes) {
                        throw new DeviceError("ValueError", "param '" + pname + "' is " + dtype + " "
                                + Text.shape(shape) + ", the graph expects " + dst.dtype + " " + Text.shape(dst.shape));
                    }
                    ByteBuffer src = b.duplicate();
                    src.limit(b.position() + (int) nbytes);
                    dst.view().put(src);
                    seen.add(pname);
                }
                b.position(b.position() + (int) nbytes);
            }
            List<String> missing = new ArrayList<String>();
            for (String p : params.keySet()) {
                if (!seen.contains(p)) {
                    missing.add(p);
                }
            }
            if (!missing.isEmpty()) {
                throw new DeviceError("KeyError", "params lack " + missing.size() + " tensor(s) the graph needs: "
                        + Text.join(missing.subList(0, Math.min(10, missing.size()))));
            }
        } catch (java.nio.BufferUnderflowException | IllegalArgumentException e) {
            throw new DeviceError("ParamsFormatError", "params file truncated or corrupt: " + e);
        }
    }

    // -- inputs, running, outputs -------------------------------------------------------------------------------
    private int inputEntry(Object key) throws DeviceError {
        if (key instanceof Long) {
            long i = (Long) key;
            if (i < 0 || i >= inputs.size()) {
                throw new DeviceError("IndexError", "input index " + i + " out of range: the model has "
                        + inputs.size() + " input(s) " + inputNames);
            }
            return inputs.get((int) i);
        }
        int at = inputNames.indexOf(key);
        if (at >= 0) {
            return inputs.get(at);
        }
        Integer p = key instanceof String ? params.get(key) : null;
        if (p != null) {
            return p;
        }
        throw new DeviceError("KeyError", "the model has no input '" + key + "' (inputs: " + Text.join(inputNames) + ")");
    }

    private static long[] squeeze(long[] s) {
        int n = 0;
        for (long d : s) {
            n += d == 1 ? 0 : 1;
        }
        long[] out = new long[n];
        int k = 0;
        for (long d : s) {
            if (d != 1) {
                out[k++] = d;
            }
        }
        return out;
    }

    void setInput(Object key, String srcDtype, long[] srcShape, ByteBuffer src) throws DeviceError {
        DeviceArray dst = entries.get(inputEntry(key));
        long count = 1;
        for (long d : srcShape) {
            count *= d;
        }
        long want = dst.nbytes / DeviceArray.nbytesOf(new long[]{1}, dst.dtype);
        if (count != want || (!Arrays.equals(srcShape, dst.shape)
                && !Arrays.equals(squeeze(srcShape), squeeze(dst.shape)))) {
            throw new DeviceError("ValueError", "input " + key + ": got shape " + Text.shape(srcShape)
                    + ", the model expects " + dst.dtype + " " + Text.shape(dst.shape));
        }
        if (srcDtype.equals(dst.dtype)) {
            dst.view().put(src);
            return;
        }
        Cast.copy(key, srcDtype, src, dst.dtype, dst.view(), (int) count);
    }

    public void call() throws DeviceError {
        for (PackedCall c : calls) {
            c.call();
        }
    }

    public double time(int number) throws DeviceError {
        long t0 = System.nanoTime();
        for (int i = 0; i < number; i++) {
            call();
        }
        return (System.nanoTime() - t0) / 1e9 / number;
    }

    private int outputIndex(Object index) throws DeviceError {
        int i;
        if (index instanceof String) {
            i = outputNames.indexOf(index);
            if (i < 0) {
                throw new DeviceError("KeyError", "the model has no output '" + index + "' (outputs: "
                        + Text.join(outputNames) + ")");
            }
        } else if (index instanceof Long) {
            i = (int) (long) (Long) index;
        } else {
            throw new DeviceError("TypeError", "an output index must be an int or a name");
        }
        if (i < 0 || i >= outputs.size()) {
            throw new DeviceError("IndexError", "output index " + i + " out of range: the model has "
                    + outputs.size() + " output(s)");
        }
        return outputs.get(i);
    }

    Map<String, Object> info() {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("inputs", describe(inputs));
        m.put("outputs", describe(outputs));
        m.put("nodes", (long) nodes.size());
        m.put("storage_bytes", storageBytes);
        return m;
    }

    private List<Object> describe(List<Integer> ids) {
        List<Object> out = new ArrayList<Object>();
        for (int i : ids) {
            DeviceArray e = entries.get(i);
            @SuppressWarnings("unchecked")
            Map<String, Object> src = (Map<String, Object>) ((List<Object>) graph.get("entries")).get(i);
            Map<String, Object> d = new LinkedHashMap<String, Object>();
            d.put("name", src.get("name"));
            List<Object> shape = new ArrayList<Object>();
            for (long x : e.shape) {
                shape.add(x);
            }
            d.put("shape", shape);
            d.put("dtype", e.dtype);
            out.add(d);
        }
        return out;
    }

    void close() {
        calls.clear();
        nodes.clear();
        module.release();
    }

    // -- built-ins ----------------------------------------------------------------------------------------------
    static void register(final Session s) {
        s.builtins.put("tether.graph.create", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.create", a, 0, 3);
                Object graphName = a.size() > 0 ? a.get(0) : "deploy.json";
                Object libName = a.size() > 1 ? a.get(1) : null;
                Object paramsName = a.size() > 2 ? a.get(2) : "deploy.params";
                File graphFile = s.folder.existing(graphName);
                byte[] text = readAll(graphFile, 64 << 20);
                Object parsed = Json.parse(new String(text, UTF8));
                if (libName == null && parsed instanceof Map) {
                    Object lib = ((Map<?, ?>) parsed).get("lib");
                    libName = lib != null ? lib : "deploy.so";
                }
                NativeModule m = NativeModule.load(s.folder.existing(libName), s.deviceOpener);
                s.pool.add(m);
                GraphExecutor g;
                try {
                    g = new GraphExecutor(parsed, m);
                    if (paramsName != null) {
                        g.loadParams(s.folder.existing(paramsName));
                    }
                } catch (Exception e) {
                    m.release();
                    throw e;
                }
                Map<String, Object> r = g.info();
                r.put("handle", s.put(g));
                return r;
            }
        });
        s.builtins.put("tether.graph.set_input", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.set_input", a, 3, 3);
                setFrom(s, s.get(a.get(0), GraphExecutor.class, "graph"), a.get(1), a.get(2));
                return null;
            }
        });
        s.builtins.put("tether.graph.set_inputs", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.set_inputs", a, 2, 2);
                GraphExecutor g = s.get(a.get(0), GraphExecutor.class, "graph");
                if (!(a.get(1) instanceof Map)) {
                    throw new DeviceError("TypeError", "tether.graph.set_inputs takes a map of inputs");
                }
                for (Map.Entry<?, ?> e : ((Map<?, ?>) a.get(1)).entrySet()) {
                    setFrom(s, g, e.getKey(), e.getValue());
                }
                return null;
            }
        });
        s.builtins.put("tether.graph.load_params", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.load_params", a, 2, 2);
                s.get(a.get(0), GraphExecutor.class, "graph").loadParams(s.folder.existing(a.get(1)));
                return null;
            }
        });
        s.builtins.put("tether.graph.run", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.run", a, 1, 1);
                s.get(a.get(0), GraphExecutor.class, "graph").call();
                return null;
            }
        });
        s.builtins.put("tether.graph.get_output", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.get_output", a, 1, 2);
                GraphExecutor g = s.get(a.get(0), GraphExecutor.class, "graph");
                return Builtins.toTensor(g.entries.get(g.outputIndex(a.size() > 1 ? a.get(1) : 0L)));
            }
        });
        s.builtins.put("tether.graph.copy_output", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.copy_output", a, 3, 3);
                GraphExecutor g = s.get(a.get(0), GraphExecutor.class, "graph");
                DeviceArray out = g.entries.get(g.outputIndex(a.get(1)));
                DeviceArray dst = s.get(a.get(2), DeviceArray.class, "array");
                if (dst.nbytes != out.nbytes || !dst.dtype.equals(out.dtype)) {
                    throw new DeviceError("ValueError", "copy_output: the array is " + dst.dtype + " "
                            + Text.shape(dst.shape) + ", the output " + out.dtype + " " + Text.shape(out.shape));
                }
                dst.view().put(out.view());
                return null;
            }
        });
        s.builtins.put("tether.graph.info", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.info", a, 1, 1);
                return s.get(a.get(0), GraphExecutor.class, "graph").info();
            }
        });
        s.builtins.put("tether.graph.benchmark", new Session.Builtin() {
            public Object call(final Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.benchmark", a, 1, 2);
                GraphExecutor g = s.get(a.get(0), GraphExecutor.class, "graph");
                Map<String, Object> opts = Timing.options(a.size() > 1 ? a.get(1) : null, "benchmark",
                        new HashSet<String>(Arrays.asList("number", "repeat", "min_repeat_ms", "warmup", "cooldown_ms")));
                Map<String, Object> r = Timing.measure(g, opts, new Timing.OnSample() {
                    public void sample(long index, double seconds, long number) throws IOException {
                        Map<String, Object> ev = new LinkedHashMap<String, Object>();
                        ev.put("kind", "sample");
                        ev.put("index", index);
                        ev.put("seconds", seconds);
                        ev.put("number", number);
                        c.emit(ev);
                    }
                });
                return summarize(r);
            }
        });
        s.builtins.put("tether.graph.profile", new Session.Builtin() {
            public Object call(Session.Call c, List<Object> a) throws Exception {
                Builtins.arity("tether.graph.profile", a, 1, 2);
                return s.get(a.get(0), GraphExecutor.class, "graph").profile(c, a.size() > 1 ? a.get(1) : null);
            }
        });
    }

    private Map<String, Object> profile(Session.Call c, Object options) throws Exception {
        Map<String, Object> opts = Timing.options(options, "profile",
                new HashSet<String>(Arrays.asList("number", "repeat", "warmup")));
        if (!opts.containsKey("number")) {
            opts.put("number", 5L);
        }
        if (!opts.containsKey("repeat")) {
            opts.put("repeat", 1L);
        }
        call();  // intermediates hold real values, so every node sees realistic data
        long t0 = System.nanoTime();
        List<Object> records = new ArrayList<Object>();
        double total = 0;
        for (int k = 0; k < calls.size(); k++) {
            Map<String, Object> res = Timing.measure(calls.get(k), opts, null);
            List<Object> samples = new ArrayList<Object>((List<?>) res.get("samples"));
            double[] sorted = new double[samples.size()];
            for (int i = 0; i < sorted.length; i++) {
                sorted[i] = (Double) samples.get(i);
            }
            Arrays.sort(sorted);
            Map<String, Object> node = nodes.get(k);
            Map<String, Object> rec = new LinkedHashMap<String, Object>();
            rec.put("index", (long) k);
            rec.put("name", node.containsKey("name") ? node.get("name") : "");
            rec.put("func", node.get("func"));
            rec.put("ops", node.containsKey("ops") ? node.get("ops") : "");
            rec.put("seconds", sorted[sorted.length / 2]);
            total += sorted[sorted.length / 2];
            records.add(rec);
            Map<String, Object> ev = new LinkedHashMap<String, Object>();
            ev.put("kind", "node");
            ev.putAll(rec);
            c.emit(ev);
        }
        Map<String, Object> r = new LinkedHashMap<String, Object>();
        r.put("nodes", records);
        r.put("total_seconds", total);
        r.put("wall_seconds", (System.nanoTime() - t0) / 1e9);
        return r;
    }

    private static Map<String, Object> summarize(Map<String, Object> res) {
        List<?> samples = (List<?>) res.get("samples");
        double[] s = new double[samples.size()];
        double sum = 0;
        for (int i = 0; i < s.length; i++) {
            s[i] = (Double) samples.get(i);
            sum += s[i];
        }
        double[] sorted = s.clone();
        Arrays.sort(sorted);
        int mid = sorted.length / 2;
        double median = sorted.length % 2 == 1 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
        Map<String, Object> r = new LinkedHashMap<String, Object>();
        r.put("samples", res.get("samples"));
        r.put("number", res.get("number"));
        r.put("median_ms", median * 1e3);
        r.put("mean_ms", sum / s.length * 1e3);
        r.put("min_ms", sorted[0] * 1e3);
        return r;
    }

    private static void setFrom(Session s, GraphExecutor g, Object key, Object value) throws DeviceError {
        if (value instanceof RemoteHandle) {
            DeviceArray arr = s.get(value, DeviceArray.class, "array");
            g.setInput(key, arr.dtype, arr.shape, arr.view());
        } else if (value instanceof Tensor) {
            Tensor t = (Tensor) value;
            g.setInput(key, t.dtype(), t.shape(), t.data());
        } else {
            throw new DeviceError("TypeError", "an input value must be a tensor or an array handle, got "
                    + Builtins.typeName(value));
        }
    }

    static byte[] readAll(File f, long max) throws IOException, DeviceError {
        if (f.length() > max) {
            throw new DeviceError("ValueError", f.getName() + " is larger than " + max + " bytes");
        }
        byte[] b = new byte[(int) f.length()];
        InputStream in = new FileInputStream(f);
        try {
            int n = 0;
            int r;
            while (n < b.length && (r = in.read(b, n, b.length - n)) > 0) {
                n += r;
            }
        } finally {
            in.close();
        }
        return b;
    }

}
