package dev.tether.rpc;

/** The peer sent something the protocol does not allow (malformed msgpack, a bad frame shape, a limit exceeded). */
public class ProtocolException extends TetherException {
    private static final long serialVersionUID = 1L;

    public ProtocolException(String message) {
        super("ProtocolError", message);
    }

    /** For subclasses: a narrower protocol violation with its own wire type. */
    protected ProtocolException(String wireType, String message) {
        super(wireType, message);
    }
}
