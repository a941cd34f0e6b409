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

    @SuppressWarnings("unchecked")
    static Object timeEvaluator(Session s, Session.Call c, List<Object> a) throws Exception {
        PackedCall.Function func = s.get(a.get(0), PackedCall.Function.class, "function");
        if (!(a.get(1) instanceof List)) {
            throw new DeviceError("TypeError", "time_evaluator args must be a list");
        }
        Map<String, Object> opts = new LinkedHashMap<String, Object>();
        if (a.size() > 2 && a.get(2) != null) {
            if (!(a.get(2) instanceof Map)) {
                throw new DeviceError("TypeError", "time_evaluator options must be a map");
            }
            opts.putAll((Map<String, Object>) a.get(2));
        }
        Set<String> unknown = new TreeSet<String>(opts.keySet());
        unknown.removeAll(OPTIONS);
        if (!unknown.isEmpty()) {
            throw new DeviceError("TypeError", "unknown time_evaluator options: " + Text.join(unknown)
                    + " (allowed: cooldown_ms, min_repeat_ms, number, repeat, warmup)");
        }
        long number = (long) num(opts, "number", 10);
        long repeat = (long) num(opts, "repeat", 3);
        if (number < 1 || repeat < 1) {
            throw new DeviceError("ValueError", "time_evaluator: number and repeat must be >= 1 (got number="
                    + number + ", repeat=" + repeat + ")");
        }
        long warmup = Math.max(0, (long) num(opts, "warmup", 1));
        double minS = Math.max(0, num(opts, "min_repeat_ms", 0)) / 1e3;
        double cooldownMs = num(opts, "cooldown_ms", 0);

        List<Object> args = (List<Object>) a.get(1);
        Object[] kargs = new Object[args.size()];
        for (int i = 0; i < kargs.length; i++) {
            kargs[i] = s.kernelArg(args.get(i), null);
        }
        PackedCall call = new PackedCall(func, kargs);
        for (long i = 0; i < warmup; i++) {
            call.call();
        }
        if (minS > 0) {
            for (int round = 0; round < MAX_CALIBRATION_ROUNDS; round++) {
                double elapsed = call.time((int) number) * number;
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
            double perCall = call.time((int) number);
            samples.add(perCall);
            Map<String, Object> ev = new LinkedHashMap<String, Object>();
            ev.put("kind", "sample");
            ev.put("index", i);
            ev.put("seconds", perCall);
            c.emit(ev);
        }
        Map<String, Object> r = new LinkedHashMap<String, Object>();
        r.put("samples", samples);
        r.put("number", number);
        return r;
    }
}
