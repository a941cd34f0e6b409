package dev.tether.rpc;

/** A frame or bulk payload is larger than the receiver's limit; refused before anything is allocated for it. */
public class FrameTooLargeException extends ProtocolException {
    private static final long serialVersionUID = 1L;

    public FrameTooLargeException(String message) {
        super("FrameTooLarge", message);
    }
}
