package dev.tether.device;

import java.util.Collection;

/** String helpers that exist on Android 5 (String.join needs API 26). */
final class Text {
    private Text() {
    }

    static String join(Collection<?> items) {
        StringBuilder b = new StringBuilder();
        for (Object o : items) {
            if (b.length() > 0) {
                b.append(", ");
            }
            b.append(o);
        }
        return b.toString();
    }

    /** Python's repr of a shape: (1024,) or (2, 3). */
    static String shape(long[] shape) {
        if (shape.length == 1) {
            return "(" + shape[0] + ",)";
        }
        StringBuilder b = new StringBuilder("(");
        for (int i = 0; i < shape.length; i++) {
            b.append(i > 0 ? ", " : "").append(shape[i]);
        }
        return b.append(')').toString();
    }
}
