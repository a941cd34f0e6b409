package dev.tether.rpc.tools;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small JSON reader for the test vectors (objects keep their key order): objects to LinkedHashMap, arrays to
 * ArrayList, integers to Long, other numbers to Double, strings, booleans and null as themselves.
 */
final class Json {
    private static final String[] WORDS = {"true", "false", "null"};
    private static final Object[] WORD_VALUES = {Boolean.TRUE, Boolean.FALSE, null};
    /** The one-letter escapes after a backslash and the characters they stand for. */
    private static final String ESCAPES = "ntrbf";
    private static final String ESCAPED = "\n\t\r\b\f";

    private final String s;
    private int pos;

    private Json(String s) {
        this.s = s;
    }

    static Object parse(String text) {
        Json j = new Json(text);
        j.ws();
        Object v = j.value();
        j.ws();
        if (j.pos != j.s.length()) {
            throw j.error("trailing characters");
        }
        return v;
    }

    private IllegalArgumentException error(String what) {
        return new IllegalArgumentException("JSON: " + what + " at offset " + pos);
    }

    private void ws() {
        while (pos < s.length() && " \t\r\n".indexOf(s.charAt(pos)) >= 0) {
            pos++;
        }
    }

    private void expect(char c) {
        if (pos >= s.length() || s.charAt(pos) != c) {
            throw error("expected '" + c + "'");
        }
        pos++;
    }

    private Object value() {
        if (pos >= s.length()) {
            throw error("unexpected end");
        }
        char c = s.charAt(pos);
        if (c == '"') {
            return string();
        }
        if (c == '{') {
            pos++;
            Map<String, Object> m = new LinkedHashMap<String, Object>();
            if (!skip('}')) {
                do {
                    ws();
                    String k = string();
                    ws();
                    expect(':');
                    ws();
                    m.put(k, value());
                } while (skip(','));
                expect('}');
            }
            return m;
        }
        if (c == '[') {
            pos++;
            List<Object> l = new ArrayList<Object>();
            if (!skip(']')) {
                do {
                    ws();
                    l.add(value());
                } while (skip(','));
                expect(']');
            }
            return l;
        }
        for (int i = 0; i < WORDS.length; i++) {
            if (s.startsWith(WORDS[i], pos)) {
                pos += WORDS[i].length();
                return WORD_VALUES[i];
            }
        }
        return number();
    }

    /** Skips white space, then {@code c} if it comes next; says whether it did. */
    private boolean skip(char c) {
        ws();
        if (pos < s.length() && s.charAt(pos) == c) {
            pos++;
            return true;
        }
        return false;
    }

    private Object number() {
        int start = pos;
        boolean integral = true;
        while (pos < s.length() && "+-0123456789.eE".indexOf(s.charAt(pos)) >= 0) {
            char c = s.charAt(pos);
            integral &= c != '.' && c != 'e' && c != 'E';
            pos++;
        }
        String t = s.substring(start, pos);
        if (t.isEmpty()) {
            throw error("unexpected character");
        }
        return integral ? (Object) Long.parseLong(t) : (Object) Double.parseDouble(t);
    }

    private String string() {
        expect('"');
        StringBuilder b = new StringBuilder();
        while (true) {
            if (pos >= s.length()) {
                throw error("unterminated string");
            }
            char c = s.charAt(pos++);
            if (c == '"') {
                return b.toString();
            }
            if (c != '\\') {
                b.append(c);
                continue;
            }
            char e = s.charAt(pos++);
            if (e == 'u') {
                b.append((char) Integer.parseInt(s.substring(pos, pos + 4), 16));
                pos += 4;
            } else {
                int k = ESCAPES.indexOf(e);
                b.append(k >= 0 ? ESCAPED.charAt(k) : e); // \" \\ and \/ stand for themselves
            }
        }
    }
}
