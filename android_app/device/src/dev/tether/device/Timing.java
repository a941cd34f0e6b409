package dev.tether.device;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * tether.time_evaluator (docs/protocol.md; tether_rpc/timing.py): warmup calls, then {@code number} grown until a
 * sample lasts {@code min_repeat_ms}, then {@code repeat} samples, each streamed as a {@code sample} EVENT. The
 * calls of a sample run in one native loop (NativeBridge.timeCalls), so no Java runs between them.
 */
final class Timing {
    private static final long MAX_NUMBER = 1L << 30;
    private static final int MAX_CALIBRATION_ROUNDS = 32;
    private static final Set<String> OPTIONS = new HashSet<String>(Arrays.asList("number", "repeat",
            "min_repeat_ms", "warmup", "cooldown_ms"));

    private Timing() {
    }

    private static double num(Map<String, Object> o, String key, double dflt) throws DeviceError {
        Object v = o.get(key);
        if (v == null) {
            return dflt;
        }
        if (v instanceof Long) {
            return (Long) v;
        }
        if (v instanceof Double) {
            return (Double) v;
        }
        if (v instanceof Boolean) {
            return (Boolean) v ? 1 : 0;
        }
        throw new DeviceError("TypeError", "time_evaluator option " + key + " must be a number, got " + Builtins.typeName(v));
    }

    /** Something to time: one call, or {@code number} calls returning seconds per call. */
    interface Timed {
        void call() throws DeviceError;

        double time(int number) throws DeviceError;
    }

    /** Told each sample as it is measured. */
    interface OnSample {
        void sample(long index, double seconds, long number) throws java.io.IOException;
    }

    /** Checks the options map against the allowed keys (TypeError naming the unknown ones). */
    @SuppressWarnings("unchecked")
    static Map<String, Object> options(Object o, String what, Set<String> allowed) throws DeviceError {
        Map<String, Object> opts = new LinkedHashMap<String, Object>();
        if (o != null) {
            if (!(o instanceof Map)) {
                throw new DeviceError("TypeError", what + " options must be a map");
            }
            opts.putAll((Map<String, Object>) o);
        }
        Set<String> unknown = new TreeSet<String>(opts.keySet());
        unknown.removeAll(allowed);
        if (!unknown.isEmpty()) {
            throw new DeviceError("TypeError", "unknown " + what + " options: " + Text.join(unknown)
                    + " (allowed: " + Text.join(new TreeSet<String>(allowed)) + ")");
        }
        return opts;
    }

    /** timing.time_evaluator: returns {"samples": [...], "number": n}. */
    static Map<String, Object> measure(Timed t, Map<String, Object> opts, OnSample on) throws Exception {
        long number = (long) num(opts, "number", 10);
        long repeat = (long) num(opts, "repeat", 3);
        if (number < 1 || repeat < 1) {
            throw new DeviceError("ValueError", "time_evaluator: number and repeat must be >= 1 (got number="
                    + number + ", repeat=" + repeat + ")");
        }
        long warmup = Math.max(0, (long) num(opts, "warmup", 1));
        double minS = Math.max(0, num(opts, "min_repeat_ms", 0)) / 1e3;
        double cooldownMs = num(opts, "cooldown_ms", 0);
        for (long i = 0; i < warmup; i++) {
            t.call();
        }
        if (minS > 0) {
            for (int round = 0; round < MAX_CALIBRATION_ROUNDS; round++) {
                double elapsed = t.time((int) number) * number;
                if (elapsed >= minS || number >= MAX_NUMBER) {
                    break;
                }
                double guess = elapsed > 0 ? number * 1.2 * minS / elapsed : number * 10;
                number = Math.min(MAX_NUMBER, Math.max(number * 2, (long) Math.ceil(guess)));
            }
        }
        List<Object> samples = new ArrayList<Object>();
        for (long i = 0; i < repeat; i++) {
            if (cooldownMs > 0 && i > 0) {
                Thread.sleep((long) cooldownMs);
            }
            double perCall = t.time((int) number);
            samples.add(perCall);
            if (on != null) {
                on.sample(i, perCall, number);
            }
        }
        Map<String, Object> r = new LinkedHashMap<String, Object>();
        r.put("samples", samples);
        r.put("number", number);
        return r;
    }

    @SuppressWarnings("unchecked")
    static Object timeEvaluator(Session s, final Session.Call c, List<Object> a) throws Exception {
        Object target = a.get(0) instanceof dev.tether.rpc.RemoteHandle
                ? s.objects.get(((dev.tether.rpc.RemoteHandle) a.get(0)).id()) : null;
        PackedCall.Function func = target instanceof GpuFunction ? null
                : s.get(a.get(0), PackedCall.Function.class, "function");
        if (!(a.get(1) instanceof List)) {
            throw new DeviceError("TypeError", "time_evaluator args must be a list");
        }
        Map<String, Object> opts = options(a.size() > 2 ? a.get(2) : null, "time_evaluator", OPTIONS);
        List<Object> args = (List<Object>) a.get(1);
        Object[] kargs = new Object[args.size()];
        for (int i = 0; i < kargs.length; i++) {
            kargs[i] = s.kernelArg(args.get(i), null);
        }
        Timed timed = func != null ? new PackedCall(func, kargs) : ((GpuFunction) target).bind(kargs);
        return measure(timed, opts, new OnSample() {
            public void sample(long index, double seconds, long number) throws java.io.IOException {
                Map<String, Object> ev = new LinkedHashMap<String, Object>();
                ev.put("kind", "sample");
                ev.put("index", index);
                ev.put("seconds", seconds);
                c.emit(ev);
            }
        });
    }
}
