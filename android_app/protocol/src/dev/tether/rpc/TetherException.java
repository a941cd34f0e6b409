package dev.tether.rpc;

import java.io.IOException;

/** Root of every error this library raises; {@link #wireType()} is the ERROR {@code type} string it maps to. */
public class TetherException extends IOException {
    private static final long serialVersionUID = 1L;

    public TetherException(String message) {
        super(message);
    }

    public TetherException(String message, Throwable cause) {
        super(message, cause);
    }

    /** The protocol's name for this kind of error (the ERROR frame's {@code type}). */
    public String wireType() {
        return "TetherError";
    }
}
