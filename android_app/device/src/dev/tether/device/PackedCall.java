package dev.tether.device;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * One packed-function call's arguments laid out for the native side (docs/abi.md): {@code TetherValue values[n]}
 * and {@code int32_t codes[n]} in direct buffers, plus whatever they point to (DLTensors, strings, byte
 * descriptors), kept alive as long as this object. Built once and reusable (time_evaluator calls it many times).
 */
final class PackedCall implements Timing.Timed {
    static final int INT64 = 0;
    static final int FLOAT64 = 1;
    static final int DLTENSOR = 3;
    static final int STR = 4;
    static final int BYTES = 5;
    static final int NULL = 6;
    private static final Charset UTF8 = Charset.forName("UTF-8");

    final Function function;
    final Object[] args;
    final int n;
    final long values;
    final long codes;
    private final List<Object> keep = new ArrayList<Object>();

    /** A function of a loaded module: its address, name and metadata. */
    static final class Function {
        final NativeModule module;
        final String name;
        final long address;
        final List<Object> argInfo;

        @SuppressWarnings("unchecked")
        Function(NativeModule module, String name) {
            this.module = module;
            this.name = name;
            this.address = module.functions.get(name);
            Object a = module.functionInfo.get(name).get("args");
            this.argInfo = a instanceof List ? (List<Object>) a : new ArrayList<Object>();
        }
    }

    /** {@code args}: DeviceArray, Long, Double, Boolean, String, byte[] or null. */
    PackedCall(Function function, Object[] args) throws DeviceError {
        this.function = function;
        this.args = args;
        this.n = args.length;
        ByteBuffer v = direct(8 * Math.max(n, 1));
        ByteBuffer c = direct(4 * Math.max(n, 1));
        int ptr = NativeBridge.pointerSize();
        for (int i = 0; i < n; i++) {
            Object a = args[i];
            int code;
            if (a instanceof DeviceArray) {
                v.putLong(8 * i, ((DeviceArray) a).dltensorAddress);
                code = DLTENSOR;
            } else if (a instanceof Long || a instanceof Boolean) {
                v.putLong(8 * i, a instanceof Long ? (Long) a : ((Boolean) a ? 1 : 0));
                code = INT64;
            } else if (a instanceof Double) {
                v.putDouble(8 * i, (Double) a);
                code = FLOAT64;
            } else if (a instanceof String) {
                byte[] s = ((String) a).getBytes(UTF8);
                ByteBuffer b = direct(s.length + 1);
                b.put(s).put((byte) 0);
                keep.add(b);
                v.putLong(8 * i, NativeBridge.address(b));
                code = STR;
            } else if (a instanceof byte[]) {
                byte[] s = (byte[]) a;
                ByteBuffer b = direct(Math.max(s.length, 1));
                b.put(s);
                ByteBuffer desc = direct(16);  // {const void* data; uint64_t size;}
                if (ptr == 8) {
                    desc.putLong(0, NativeBridge.address(b));
                } else {
                    desc.putInt(0, (int) NativeBridge.address(b));
                }
                desc.putLong(8, s.length);
                keep.add(b);
                keep.add(desc);
                v.putLong(8 * i, NativeBridge.address(desc));
                code = BYTES;
            } else if (a == null) {
                v.putLong(8 * i, 0);
                code = NULL;
            } else if (a instanceof GpuArray) {
                throw new DeviceError("KernelError", function.name + ": argument " + i + argName(i) + " is an array "
                        + "on " + ((GpuArray) a).spec() + "; this CPU function takes host arrays (copy it to one)");
            } else {
                throw new DeviceError("KernelError", function.name + ": argument " + i + argName(i)
                        + " has unsupported type " + a.getClass().getSimpleName()
                        + " (pass arrays, tensors, int, float, str, bytes or None)");
            }
            c.putInt(4 * i, code);
        }
        keep.add(v);
        keep.add(c);
        values = NativeBridge.address(v);
        codes = NativeBridge.address(c);
    }

    private static ByteBuffer direct(int n) {
        return ByteBuffer.allocateDirect(n).order(ByteOrder.nativeOrder());
    }

    public void call() throws DeviceError {
        checkLoaded();
        int rc = NativeBridge.callPacked(function.address, values, codes, n);
        if (rc != 0) {
            throw decodeError(rc);
        }
    }

    /** Seconds per call over {@code number} calls, timed in native code. */
    public double time(int number) throws DeviceError {
        checkLoaded();
        long ns = NativeBridge.timeCalls(function.address, values, codes, n, number);
        if (ns < 0) {
            throw decodeError((int) (-1 - ns));
        }
        return ns / 1e9 / number;
    }

    private void checkLoaded() throws DeviceError {
        if (!function.module.loaded()) {
            throw new DeviceError("ModuleLoadError", function.name + ": module " + function.module.label
                    + " was closed and unloaded; load it again");
        }
    }

    @SuppressWarnings("unchecked")
    private Map<String, Object> expected(int i) {
        Object e = i < function.argInfo.size() ? function.argInfo.get(i) : null;
        return e instanceof Map ? (Map<String, Object>) e : new java.util.HashMap<String, Object>();
    }

    private String argName(int i) {
        Object name = expected(i).get("name");
        return name != null ? " '" + name + "'" : "";
    }

    @SuppressWarnings("unchecked")
    private static String shapeOf(Object s) {
        if (!(s instanceof List)) {
            return "?";
        }
        List<Object> l = (List<Object>) s;
        long[] out = new long[l.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = l.get(i) instanceof Long ? (Long) l.get(i) : -1;
        }
        return Text.shape(out);
    }

    /** A nonzero return code (docs/abi.md "Return codes") as the readable error tether_rpc/module.py gives. */
    @SuppressWarnings("unchecked")
    DeviceError decodeError(int rc) {
        long urc = rc & 0xffffffffL;
        int kind = (int) (urc >>> 24);
        int i = (int) ((urc >>> 8) & 0xffff);
        int d = (int) (urc & 0xff);
        long low24 = urc & 0xffffff;
        String name = function.name;
        String ename = argName(i);
        Map<String, Object> exp = expected(i);
        Object actual = i < args.length ? args[i] : null;
        DeviceArray arr = actual instanceof DeviceArray ? (DeviceArray) actual : null;
        String msg;
        switch (kind) {
            case 1: {
                StringBuilder names = new StringBuilder();
                for (Object o : function.argInfo) {
                    Object nm = o instanceof Map ? ((Map<String, Object>) o).get("name") : null;
                    names.append(names.length() > 0 ? ", " : "").append(nm != null ? nm : "?");
                }
                msg = name + ": expected " + function.argInfo.size() + " arguments (" + names + "), got " + low24;
                break;
            }
            case 2:
                msg = name + ": argument " + i + ename + " must be an array, got "
                        + Builtins.typeName(actual);
                break;
            case 3:
                msg = name + ": argument " + i + ename + " has "
                        + (arr != null ? arr.shape.length + " dimensions (shape " + Text.shape(arr.shape) + ")"
                        : "the wrong number of dimensions") + ", expected "
                        + (exp.get("shape") instanceof List ? ((List<Object>) exp.get("shape")).size()
                        + " (shape " + shapeOf(exp.get("shape")) + ")" : "another number");
                break;
            case 4:
                msg = name + ": argument " + i + ename + " has dtype " + (arr != null ? arr.dtype : "?") + ", expected "
                        + (exp.get("dtype") != null ? exp.get("dtype") : "another dtype");
                break;
            case 5:
                msg = name + ": argument " + i + ename + " has shape " + (arr != null ? Text.shape(arr.shape) : "?")
                        + ", expected " + shapeOf(exp.get("shape")) + " (dimension " + d + " differs)";
                break;
            case 6:
                msg = name + ": argument " + i + ename + " is not a compact row-major array (dimension " + d + ")";
                break;
            case 7:
                msg = name + ": argument " + i + ename + " has a NULL data pointer";
                break;
            case 8:
                msg = name + ": a parallel task failed with code " + low24;
                break;
            default:
                msg = name + ": failed with return code " + urc + String.format(" (0x%08x)", urc);
        }
        return new DeviceError("KernelError", msg);
    }
}
