package dev.tether.rpc;

/** The peer closed the connection (or it was lost) while a frame or bulk bytes were expected. */
public class ConnectionClosedException extends TetherException {
    private static final long serialVersionUID = 1L;

    public ConnectionClosedException(String message) {
        super("ConnectionClosed", message);
    }
}
