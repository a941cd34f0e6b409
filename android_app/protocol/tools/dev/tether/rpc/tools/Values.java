package dev.tether.rpc.tools;

import dev.tether.rpc.RemoteHandle;
import dev.tether.rpc.Tensor;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Helpers for the runners: hex, the vectors' JSON value convention, and deep comparison of decoded values. */
final class Values {
    private Values() {
    }

    static byte[] unhex(String h) {
        if (h.length() % 2 != 0) {
            throw new IllegalArgumentException("odd-length hex");
        }
        byte[] out = new byte[h.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder(b.length * 2);
        for (byte x : b) {
            sb.append(String.format("%02x", x & 0xff));
        }
        return sb.toString();
    }

    /** JSON meaning -> wire value: {"$bin": hex} -> byte[], {"$handle": id}, {"$tensor": {dtype, shape, data}},
     *  {"$float": x} -> Double. Every float of a meaning is tagged, so a bare JSON float is a broken vector. */
    @SuppressWarnings("unchecked")
    static Object toWire(Object v) {
        if (v instanceof Map) {
            Map<String, Object> m = (Map<String, Object>) v;
            if (m.size() == 1 && m.containsKey("$bin")) {
                return unhex((String) m.get("$bin"));
            }
            if (m.size() == 1 && m.containsKey("$handle")) {
                return new RemoteHandle((Long) m.get("$handle"));
            }
            if (m.size() == 1 && m.containsKey("$float")) {
                return ((Number) m.get("$float")).doubleValue();
            }
            if (m.size() == 1 && m.containsKey("$tensor")) {
                Map<String, Object> t = (Map<String, Object>) m.get("$tensor");
                List<Object> shape = (List<Object>) t.get("shape");
                long[] s = new long[shape.size()];
                for (int i = 0; i < s.length; i++) {
                    s[i] = (Long) shape.get(i);
                }
                return Tensor.of((String) t.get("dtype"), s, unhex((String) t.get("data")));
            }
            Map<String, Object> out = new LinkedHashMap<String, Object>();
            for (Map.Entry<String, Object> e : m.entrySet()) {
                out.put(e.getKey(), toWire(e.getValue()));
            }
            return out;
        }
        if (v instanceof List) {
            List<Object> out = new ArrayList<Object>();
            for (Object x : (List<Object>) v) {
                out.add(toWire(x));
            }
            return out;
        }
        if (v instanceof Double) {
            throw new IllegalArgumentException("untagged float " + v + " in a vector meaning (write {\"$float\": x})");
        }
        return v;
    }

    /** Deep equality with exact types (Long vs Double differ), byte[] by content, maps in the same key order. */
    @SuppressWarnings("unchecked")
    static boolean deepEquals(Object a, Object b) {
        if (a == null || b == null) {
            return a == b;
        }
        if (a instanceof byte[] && b instanceof byte[]) {
            return Arrays.equals((byte[]) a, (byte[]) b);
        }
        if (a instanceof List && b instanceof List) {
            List<Object> x = (List<Object>) a;
            List<Object> y = (List<Object>) b;
            if (x.size() != y.size()) {
                return false;
            }
            for (int i = 0; i < x.size(); i++) {
                if (!deepEquals(x.get(i), y.get(i))) {
                    return false;
                }
            }
            return true;
        }
        if (a instanceof Map && b instanceof Map) {
            Map<String, Object> x = (Map<String, Object>) a;
            Map<String, Object> y = (Map<String, Object>) b;
            if (x.size() != y.size()) {
                return false;
            }
            Iterator<Map.Entry<String, Object>> i = x.entrySet().iterator();
            Iterator<Map.Entry<String, Object>> j = y.entrySet().iterator();
            while (i.hasNext()) {
                Map.Entry<String, Object> e = i.next();
                Map.Entry<String, Object> f = j.next();
                if (!e.getKey().equals(f.getKey()) || !deepEquals(e.getValue(), f.getValue())) {
                    return false;
                }
            }
            return true;
        }
        return a.getClass() == b.getClass() && a.equals(b);
    }

    /** A readable rendering for failure messages. */
    @SuppressWarnings("unchecked")
    static String show(Object v) {
        if (v instanceof byte[]) {
            byte[] b = (byte[]) v;
            return "bin(" + (b.length > 32 ? hex(Arrays.copyOf(b, 32)) + "...(" + b.length + " bytes)" : hex(b)) + ")";
        }
        if (v instanceof List) {
            StringBuilder sb = new StringBuilder("[");
            for (Object x : (List<Object>) v) {
                sb.append(sb.length() > 1 ? ", " : "").append(show(x));
            }
            return sb.append("]").toString();
        }
        if (v instanceof Map) {
            StringBuilder sb = new StringBuilder("{");
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                sb.append(sb.length() > 1 ? ", " : "").append(e.getKey()).append(": ").append(show(e.getValue()));
            }
            return sb.append("}").toString();
        }
        if (v instanceof String) {
            return "\"" + v + "\"";
        }
        return v == null ? "nil" : v + (v instanceof Long ? "L" : v instanceof Double ? "d" : "");
    }
}
