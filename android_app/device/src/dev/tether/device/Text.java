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

    /** The name the first row of {@code table} ({class, name} pairs) whose class {@code o} is an instance of
     *  gives it, else its Java class name. */
    static String nameOf(Object o, Object[][] table) {
        for (Object[] row : table) {
            if (((Class<?>) row[0]).isInstance(o)) {
                return (String) row[1];
            }
        }
        return o.getClass().getSimpleName();
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
