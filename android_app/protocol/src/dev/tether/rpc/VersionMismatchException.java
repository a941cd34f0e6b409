package dev.tether.rpc;

/** The peer speaks another protocol version; the message names both versions. */
public class VersionMismatchException extends TetherException {
    private static final long serialVersionUID = 1L;

    public VersionMismatchException(String message) {
        super("VersionMismatch", message);
    }
}
