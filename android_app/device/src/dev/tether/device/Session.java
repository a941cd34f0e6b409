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
    private final int idleTimeoutS;
    private final CallListener listener;
    final Map<Long, Object> objects = new HashMap<Long, Object>();
    private long nextId = 1;
    final Map<String, Builtin> builtins = new TreeMap<String, Builtin>();
    final NativePool pool = new NativePool();
    private volatile long waitingSince;   // System.nanoTime() when the loop started waiting for a frame; 0 = busy
    private volatile boolean ended;

    Session(File folder, InputStream in, OutputStream out, int idleTimeoutS, CallListener listener) throws IOException {
        this.folder = new SessionFolder(folder);
        this.wire = new Wire(in, out);
        this.idleTimeoutS = idleTimeoutS;
        this.listener = listener;
        Builtins.register(this);
        GraphExecutor.register(this);
    }

    // -- object table -------------------------------------------------------------------------------------------
    RemoteHandle put(Object o) {
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
        if (!kind.isInstance(o)) {
            throw new DeviceError("TypeError", "handle " + id + " is a " + kindName(o) + ", expected a " + what);
        }
        return kind.cast(o);
    }

    static String kindName(Object o) {
        if (o instanceof DeviceArray) {
            return "array";
        }
        if (o instanceof NativeModule) {
            return "module";
        }
        if (o instanceof PackedCall.Function) {
            return "function";
        }
        return "graph";
    }

    void release(Object o) {
        if (o instanceof NativeModule) {
            ((NativeModule) o).release();
        } else if (o instanceof PackedCall.Function) {
            ((PackedCall.Function) o).module.release();
        } else if (o instanceof GraphExecutor) {
            ((GraphExecutor) o).close();
        }
    }

    /** A kernel argument: array handles become arrays, tensors fresh device copies (added to {@code copies}). */
    Object kernelArg(Object a, List<DeviceArray> copies) throws DeviceError {
        if (a instanceof RemoteHandle) {
            return get(a, DeviceArray.class, "array");
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
        Thread watchdog = idleTimeoutS > 0 ? startIdleWatchdog() : null;
        try {
            while (!ended) {
                waitingSince = System.nanoTime();
                Frame f;
                try {
                    f = wire.read(Limits.DEFAULT);
                } catch (FrameTooLargeException e) {
                    wire.sendError(0, "FrameTooLarge", e.getMessage(), "");
                    return;
                } catch (ProtocolException e) {
                    wire.sendError(0, "ProtocolError", e.getMessage(), "");
                    return;
                } finally {
                    waitingSince = 0;
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
                long limit = idleTimeoutS * 1000000000L;
                while (!ended) {
                    try {
                        Thread.sleep(50);
                    } catch (InterruptedException e) {
                        return;
                    }
                    long since = waitingSince;
                    if (since != 0 && System.nanoTime() - since > limit && !ended) {
                        ended = true;
                        try {
                            wire.sendError(0, "TetherTimeout", "the session was idle (nothing received for "
                                    + idleTimeoutS + " s, the server's --idle-timeout) and has ended; open a new "
                                    + "session", "");
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
                PackedCall.Function func = get(fn, PackedCall.Function.class, "function");
                name = func.name;
                result = callPacked(func, argList);
            }
        } catch (DeviceError e) {
            drain(call);
            wire.sendError(f.requestId, e.type, e.getMessage(), traceback(e));
            report(name, t0);
            return true;
        } catch (IOException e) {
            throw e;
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

    private Object callPacked(PackedCall.Function func, List<Object> args) throws DeviceError {
        List<DeviceArray> copies = new ArrayList<DeviceArray>();
        Object[] kargs = new Object[args.size()];
        for (int i = 0; i < kargs.length; i++) {
            kargs[i] = kernelArg(args.get(i), copies);
        }
        new PackedCall(func, kargs).call();
        if (copies.isEmpty()) {
            return null;
        }
        List<Object> tensors = new ArrayList<Object>();
        for (DeviceArray c : copies) {
            tensors.add(Builtins.toTensor(c));
        }
        return new TensorReply(null, tensors);
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
    static String pythonType(Exception e) {
        if (e instanceof IllegalArgumentException || e instanceof ArithmeticException) {
            return "ValueError";
        }
        if (e instanceof ClassCastException || e instanceof NullPointerException) {
            return "TypeError";
        }
        if (e instanceof IndexOutOfBoundsException) {
            return "IndexError";
        }
        if (e instanceof IOException) {
            return "OSError";
        }
        return e.getClass().getSimpleName();
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
