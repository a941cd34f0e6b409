package dev.tether.device;

import dev.tether.rpc.Frame;
import dev.tether.rpc.FrameTooLargeException;
import dev.tether.rpc.Limits;
import dev.tether.rpc.ProtocolException;
import dev.tether.rpc.RemoteHandle;
import dev.tether.rpc.Tensor;

import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * One session: the object table (device arrays, modules, functions, graph executors, each named by a 64-bit
 * handle id), the session folder and every built-in, served over a handshaken stream until CLOSE, hang-up or
 * the idle timeout. Same built-ins, arguments, values and error types as tether_rpc/session.py.
 */
final class Session {
    /** Told about each call as it ends (the app's "last call" line). */
    interface CallListener {
        void onCall(String name, double ms);
    }

    interface Builtin {
        Object call(Call c, List<Object> args) throws Exception;
    }

    /** What a built-in sees besides its arguments: the request id, bulk bytes and the event stream. */
    final class Call {
        final long rid;
        long bulkLeft;

        Call(long rid, long bulk) {
            this.rid = rid;
            this.bulkLeft = bulk;
        }

        void emit(Map<String, Object> event) throws IOException {
            wire.send(Wire.EVENT, rid, event);
        }

        long requireBulk(String what) throws DeviceError {
            if (bulkLeft == 0 && !hadBulk) {
                throw new DeviceError("ValueError", what + " needs bulk bytes after the CALL (payload 'nbytes')");
            }
            return bulkLeft;
        }

        boolean hadBulk;
    }

    /** A RETURN with bulk bytes after it. */
    static final class BulkReply {
        final Object value;
        final ByteBuffer buffer;
        final File file;
        final long size;

        BulkReply(Object value, ByteBuffer buffer, File file, long size) {
            this.value = value;
            this.buffer = buffer;
            this.file = file;
            this.size = size;
        }
    }

    /** A RETURN whose payload carries tensors after the value. */
    static final class TensorReply {
        final Object value;
        final List<Object> tensors;

        TensorReply(Object value, List<Object> tensors) {
            this.value = value;
            this.tensors = tensors;
        }
    }

    final SessionFolder folder;
    final Wire wire;
    private final long idleMs;
    final SessionLimits limits;
    private volatile long callStartedAt;   // System.nanoTime() when the running call began; 0 between calls
    private final CallListener listener;
    final Map<Long, Object> objects = new HashMap<Long, Object>();
    private long nextId = 1;
    final Map<String, Builtin> builtins = new TreeMap<String, Builtin>();
    final NativePool pool = new NativePool();
    private static final int BOUND_MAX = 256;
    /** Bound kernel calls by "function id,array ids..." (cleared whenever an object is freed). */
    final Map<String, PackedCall> bound = new HashMap<String, PackedCall>();
    private volatile boolean ended;
    /** The OpenCL devices this session opened, by "opencl:N" (opened on first use, closed with the session). */
    private final Map<String, ClDevice> devices = new LinkedHashMap<String, ClDevice>();
    /** Opens the session's device for a GPU module (GpuModule.load names the module in a refusal). */
    final GpuModule.DeviceOpener deviceOpener = new GpuModule.DeviceOpener() {
        public ClDevice open(String spec) throws DeviceError {
            return device(spec);
        }
    };

    Session(File folder, InputStream in, OutputStream out, long idleMs, SessionLimits limits, CallListener listener)
            throws IOException {
        this.folder = new SessionFolder(folder);
        this.wire = new Wire(in, out);
        this.idleMs = idleMs;
        this.limits = limits;
        this.listener = listener;
        Builtins.register(this);
        GraphExecutor.register(this);
    }

    // -- object table -------------------------------------------------------------------------------------------
    RemoteHandle put(Object o) throws DeviceError {
        limits.checkHandles(objects.size());
        long id = nextId++;
        objects.put(id, o);
        return new RemoteHandle(id);
    }

    <T> T get(Object handle, Class<T> kind, String what) throws DeviceError {
        if (!(handle instanceof RemoteHandle)) {
            throw new DeviceError("TypeError", "expected a " + what + " handle, got "
                    + (handle == null ? "NoneType" : handle.getClass().getSimpleName()));
        }
        long id = ((RemoteHandle) handle).id();
        Object o = objects.get(id);
        if (o == null) {
            throw new DeviceError("KeyError", "handle " + id + " does not exist in this session (freed already?)");
        }
        if (!kind.isInstance(o) && o instanceof GpuArray && kind == DeviceArray.class) {
            throw new DeviceError("TypeError", "handle " + id + " is an array on " + ((GpuArray) o).spec()
                    + ", expected a host array (copy it to one first)");
        }
        if (!kind.isInstance(o)) {
            throw new DeviceError("TypeError", "handle " + id + " is a " + kindName(o) + ", expected a " + what);
        }
        return kind.cast(o);
    }

    private static final Object[][] KINDS = {{DeviceArray.class, "array"}, {GpuArray.class, "array"},
            {NativeModule.class, "module"}, {PackedCall.Function.class, "function"}, {GpuFunction.class, "function"},
            {GraphExecutor.class, "graph"}};

    /** An array handle's array: a host DeviceArray or a GpuArray. */
    Object getArray(Object handle) throws DeviceError {
        Object o = get(handle, Object.class, "array");
        if (!(o instanceof DeviceArray) && !(o instanceof GpuArray)) {
            throw new DeviceError("TypeError", "handle " + ((RemoteHandle) handle).id() + " is a " + kindName(o)
                    + ", expected a array");
        }
        return o;
    }

    /**
     * The session's OpenCL device {@code spec} ("opencl:N", canonical), opened on first use; GpuUnavailable
     * (this machine's own words, without the spec) when it cannot be opened. The session goes on either way.
     */
    ClDevice device(String spec) throws DeviceError {
        ClDevice d = devices.get(spec);
        if (d == null) {
            int colon = spec.indexOf(':');
            if (colon < 0 || !spec.substring(0, colon).equals("opencl")) {
                throw new DeviceError("GpuUnavailable", "this device runs CPU and OpenCL modules only; " + spec
                        + " is not available");
            }
            d = ClDevice.open(Integer.parseInt(spec.substring(colon + 1)));
            devices.put(spec, d);
        }
        return d;
    }

    static String kindName(Object o) {
        return Text.nameOf(o, KINDS);
    }

    void release(Object o) {
        bound.clear();  // bound calls hold their arrays' memory
        if (o instanceof NativeModule) {
            ((NativeModule) o).release();
        } else if (o instanceof PackedCall.Function) {
            ((PackedCall.Function) o).module.release();
        } else if (o instanceof GraphExecutor) {
            ((GraphExecutor) o).close();
        } else if (o instanceof GpuFunction) {
            ((GpuFunction) o).module.release();
        } else if (o instanceof GpuArray) {
            ((GpuArray) o).free();
        }
    }

    /** A kernel argument: array handles become arrays, tensors fresh device copies (added to {@code copies}). */
    Object kernelArg(Object a, List<DeviceArray> copies) throws DeviceError {
        if (a instanceof RemoteHandle) {
            return getArray(a);
        }
        if (a instanceof Tensor) {
            DeviceArray copy = Builtins.fromTensor((Tensor) a);
            if (copies != null) {
                copies.add(copy);
            }
            return copy;
        }
        if (a instanceof Long || a instanceof Double || a instanceof Boolean || a instanceof String
                || a instanceof byte[] || a == null) {
            return a;
        }
        if (a instanceof Float) {
            return (double) (Float) a;
        }
        throw new DeviceError("KernelError", "a kernel argument cannot be a " + a.getClass().getSimpleName());
    }

    // -- the loop -----------------------------------------------------------------------------------------------
    /** Serves calls until CLOSE or hang-up; an idle session gets ERROR TetherTimeout and ends. */
    void serve() throws IOException {
        Thread watchdog = idleMs > 0 || limits.callTimeoutS > 0 ? startIdleWatchdog() : null;
        try {
            while (!ended) {
                Frame f;
                try {
                    f = wire.read(Limits.DEFAULT);
                } catch (FrameTooLargeException e) {
                    wire.sendError(0, "FrameTooLarge", e.getMessage(), "");
                    return;
                } catch (ProtocolException e) {
                    wire.sendError(0, "ProtocolError", e.getMessage(), "");
                    return;
                }
                if (f == null || ended || f.type == Wire.CLOSE) {
                    return;
                }
                if (f.type != Wire.CALL) {
                    wire.sendError(0, "ProtocolError", "message type " + f.type + " is not expected during a session "
                            + "(only CALL and CLOSE)", "");
                    return;
                }
                if (!handleCall(f)) {
                    return;
                }
            }
        } finally {
            ended = true;
            if (watchdog != null) {
                watchdog.interrupt();
            }
            close();
        }
    }

    private Thread startIdleWatchdog() {
        Thread t = new Thread(new Runnable() {
            @Override
            public void run() {
                while (!ended) {
                    try {
                        Thread.sleep(50);
                    } catch (InterruptedException e) {
                        return;
                    }
                    long now = System.nanoTime();
                    long since = wire.readingSince;
                    long call = callStartedAt;
                    String message = null;
                    if (idleMs > 0 && since != 0 && now - since > idleMs * 1000000L) {
                        message = "the session was idle (nothing received for " + idleMs / 1000.0 + " s, the "
                                + "server's --idle-timeout) and has ended; open a new session";
                    } else if (limits.callTimeoutS > 0 && call != 0 && now - call > limits.callTimeoutS * 1e9) {
                        message = SessionLimits.callTimeoutMessage(limits.callTimeoutS);
                    }
                    if (message != null && !ended) {
                        ended = true;
                        try {
                            wire.sendError(0, "TetherTimeout", message, "");
                        } catch (IOException e) {
                            // the client is gone already
                        }
                        onIdle.run();
                        return;
                    }
                }
            }
        }, "tether-idle-watchdog");
        t.setDaemon(true);
        t.start();
        return t;
    }

    /** Ends the session from the idle watchdog (closes the input so the loop returns). */
    Runnable onIdle = new Runnable() {
        @Override
        public void run() {
        }
    };

    /** Handles one CALL; false when the connection must close (a malformed CALL, a lost peer). */
    private boolean handleCall(Frame f) throws IOException {
        long bulk;
        try {
            bulk = f.bulkSize(Limits.DEFAULT);
        } catch (FrameTooLargeException e) {
            wire.sendError(f.requestId, "FrameTooLarge", e.getMessage(), "");
            return false;
        } catch (ProtocolException e) {
            wire.sendError(f.requestId, "ProtocolError", e.getMessage(), "");
            return false;
        }
        Object fn = f.payload.get("fn");
        Object args = f.payload.get("args");
        if (!(fn instanceof String) && !(fn instanceof RemoteHandle)) {
            wire.sendError(f.requestId, "ProtocolError", "CALL fn must be a built-in name or a function handle, got "
                    + (fn == null ? "NoneType" : fn.getClass().getSimpleName()), "");
            return false;
        }
        if (!(args instanceof List)) {
            wire.sendError(f.requestId, "ProtocolError", "CALL args must be a list, got "
                    + (args == null ? "NoneType" : args.getClass().getSimpleName()), "");
            return false;
        }
        @SuppressWarnings("unchecked")
        List<Object> argList = (List<Object>) args;
        Call call = new Call(f.requestId, bulk);
        call.hadBulk = f.payload.containsKey("nbytes");
        long t0 = System.nanoTime();
        callStartedAt = t0;
        String name = fn instanceof String ? (String) fn : "function";
        Object result;
        try {
            if (fn instanceof String) {
                Builtin b = builtins.get(fn);
                if (b == null) {
                    throw new DeviceError("KeyError", "no built-in function '" + fn + "' (have: "
                            + Text.join(builtins.keySet()) + ")");
                }
                result = b.call(call, argList);
            } else {
                Object target = objects.get(((RemoteHandle) fn).id());
                if (target instanceof GpuFunction) {
                    name = ((GpuFunction) target).name;
                    result = callGpu((GpuFunction) target, argList);
                } else {
                    PackedCall.Function func = get(fn, PackedCall.Function.class, "function");
                    name = func.name;
                    result = callPacked(func, ((RemoteHandle) fn).id(), argList);
                }
            }
        } catch (DeviceError e) {
            drain(call);
            wire.sendError(f.requestId, e.type, e.getMessage(), traceback(e));
            report(name, t0);
            return true;
        } catch (IOException e) {
            throw e;
        } catch (ClError e) {   // (a CL call without a DeviceError around it: still named, never a bare exception)
            drain(call);
            DeviceError d = e.toDeviceError(null);
            wire.sendError(f.requestId, d.type, d.getMessage(), traceback(e));
            report(name, t0);
            return true;
        } catch (Exception e) {
            drain(call);
            wire.sendError(f.requestId, pythonType(e), String.valueOf(e.getMessage()), traceback(e));
            report(name, t0);
            return true;
        }
        drain(call);
        reply(f.requestId, result);
        report(name, t0);
        return true;
    }

    private void report(String name, long t0) {
        callStartedAt = 0;
        if (listener != null) {
            listener.onCall(name, (System.nanoTime() - t0) / 1e6);
        }
    }

    private void drain(Call call) throws IOException {
        if (call.bulkLeft > 0) {
            wire.skip(call.bulkLeft);
            call.bulkLeft = 0;
        }
    }

    private Object callPacked(PackedCall.Function func, long funcId, List<Object> args) throws DeviceError {
        // The common kernel call: device arrays only. Its arguments are laid out once per (function, arrays)
        // and reused until an object is freed (as tether_rpc's session does), so a call allocates nothing.
        StringBuilder key = new StringBuilder().append(funcId);
        for (Object a : args) {
            if (!(a instanceof RemoteHandle)) {
                key = null;
                break;
            }
            key.append(',').append(((RemoteHandle) a).id());
        }
        if (key != null) {
            String k = key.toString();
            PackedCall bound = this.bound.get(k);
            if (bound == null) {
                Object[] arrays = new Object[args.size()];
                for (int i = 0; i < arrays.length; i++) {
                    arrays[i] = getArray(args.get(i));
                }
                bound = new PackedCall(func, arrays);
                if (this.bound.size() >= BOUND_MAX) {
                    this.bound.clear();
                }
                this.bound.put(k, bound);
            }
            bound.call();
            return null;
        }
        List<DeviceArray> copies = new ArrayList<DeviceArray>();
        Object[] kargs = new Object[args.size()];
        for (int i = 0; i < kargs.length; i++) {
            kargs[i] = kernelArg(args.get(i), copies);
        }
        new PackedCall(func, kargs).call();
        return copiesReply(copies);
    }

    /** The arrays a call staged through the device, sent back as tensors; nothing when there were none. */
    private static Object copiesReply(List<DeviceArray> copies) {
        if (copies.isEmpty()) {
            return null;
        }
        List<Object> tensors = new ArrayList<Object>();
        for (DeviceArray c : copies) {
            tensors.add(Builtins.toTensor(c));
        }
        return new TensorReply(null, tensors);
    }

    /** A GPU function: arrays of the module's device as they are, host arrays and tensors staged through it. */
    Object callGpu(GpuFunction func, List<Object> args) throws DeviceError {
        List<DeviceArray> copies = new ArrayList<DeviceArray>();
        Object[] kargs = new Object[args.size()];
        for (int i = 0; i < kargs.length; i++) {
            Object a = args.get(i);
            if (!(a instanceof RemoteHandle) && !(a instanceof Tensor)) {
                throw new DeviceError("KernelError", func.name + ": argument " + i + " must be a device array or a "
                        + "tensor, got " + Builtins.typeName(a));
            }
            kargs[i] = kernelArg(a, copies);
        }
        func.call(kargs, false);
        return copiesReply(copies);
    }

    private void reply(long rid, Object result) throws IOException {
        Map<String, Object> p = new LinkedHashMap<String, Object>();
        if (result instanceof BulkReply) {
            BulkReply r = (BulkReply) result;
            p.put("value", r.value);
            p.put("nbytes", r.size);
            if (r.buffer != null) {
                wire.send(Wire.RETURN, rid, p, r.buffer, null, r.size);
            } else {
                InputStream in = new FileInputStream(r.file);
                try {
                    wire.send(Wire.RETURN, rid, p, null, in, r.size);
                } finally {
                    in.close();
                }
            }
            return;
        }
        if (result instanceof TensorReply) {
            p.put("value", ((TensorReply) result).value);
            p.put("tensors", ((TensorReply) result).tensors);
        } else {
            p.put("value", result);
        }
        wire.send(Wire.RETURN, rid, p);
    }

    /** Java exceptions under the names Python gives the same failures. */
    private static final Object[][] PY_ERRORS = {{IllegalArgumentException.class, "ValueError"},
            {ArithmeticException.class, "ValueError"}, {ClassCastException.class, "TypeError"},
            {NullPointerException.class, "TypeError"}, {IndexOutOfBoundsException.class, "IndexError"},
            {IOException.class, "OSError"}};

    static String pythonType(Exception e) {
        return Text.nameOf(e, PY_ERRORS);
    }

    static String traceback(Throwable e) {
        StringWriter w = new StringWriter();
        w.write("Traceback (most recent call last, Java device server):\n");
        e.printStackTrace(new PrintWriter(w));
        return w.toString();
    }

    /** Drops every object and stops the native pool (idempotent). */
    void close() {
        if (objects.isEmpty() && !pool.running()) {
            closeDevices();
            return;
        }
        pool.shutdown();
        List<Object> all = new ArrayList<Object>(objects.values());
        objects.clear();
        for (Object o : all) {
            try {
                release(o);
            } catch (RuntimeException e) {
                // one object's failure must not keep the others alive
            }
        }
        pool.releaseProvider();
        closeDevices();
    }

    private void closeDevices() {
        List<ClDevice> open = new ArrayList<ClDevice>(devices.values());
        devices.clear();
        for (ClDevice d : open) {
            try {
                d.close();
            } catch (RuntimeException e) {
                // one driver's failure must not keep the other devices open
            }
        }
    }

    static List<Object> list(Object... items) {
        return new ArrayList<Object>(Arrays.asList(items));
    }

    void readBulkTo(Call call, ByteBuffer dst, long n) throws IOException {
        wire.readBulk(dst, n);
        call.bulkLeft -= n;
    }

    void readBulkTo(Call call, OutputStream dst, long n) throws IOException {
        wire.readBulk(dst, n);
        call.bulkLeft -= n;
    }

    static FileOutputStream openWrite(File f) throws IOException {
        return new FileOutputStream(f);
    }
}
