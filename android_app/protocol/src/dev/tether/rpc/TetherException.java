package dev.tether.rpc;

import java.io.IOException;

/**
 * Root of every error this library raises; {@link #wireType()} is the ERROR {@code type} string it maps to. A
 * subclass only names its wire type (passed to the protected constructor).
 */
public class TetherException extends IOException {
    private static final long serialVersionUID = 1L;

    private final String wireType;

    public TetherException(String message) {
        this("TetherError", message);
    }

    public TetherException(String message, Throwable cause) {
        super(message, cause);
        this.wireType = "TetherError";
    }

    protected TetherException(String wireType, String message) {
        super(message);
        this.wireType = wireType;
    }

    /** The protocol's name for this kind of error (the ERROR frame's {@code type}). */
    public String wireType() {
        return wireType;
    }
}
