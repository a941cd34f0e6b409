package dev.tether.rpc;

/** Token authentication failed: no token for a server that wants one, a wrong token, or a server without proof. */
public class AuthenticationException extends TetherException {
    private static final long serialVersionUID = 1L;

    public AuthenticationException(String message) {
        super("AuthenticationError", message);
    }
}
