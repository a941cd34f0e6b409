package dev.tether.rpc;

/**
 * An ERROR frame from the peer: its {@code type} (a remote exception class name such as {@code TypeError}, or a
 * protocol name such as {@code DeviceBusy}), message and remote traceback. After an ERROR for a call (request id
 * other than 0) the session stays usable; a session-level ERROR (request id 0) ends it.
 */
public class RemoteException extends TetherException {
    private static final long serialVersionUID = 1L;

    private final String remoteType;
    private final String remoteMessage;
    private final String remoteTraceback;
    private final long requestId;

    public RemoteException(long requestId, String remoteType, String remoteMessage, String remoteTraceback) {
        super(remoteType, remoteType + ": " + remoteMessage);
        this.requestId = requestId;
        this.remoteType = remoteType;
        this.remoteMessage = remoteMessage;
        this.remoteTraceback = remoteTraceback;
    }

    /** Builds the exception from an ERROR payload, tolerating missing or mistyped fields. */
    public static RemoteException fromPayload(long requestId, java.util.Map<String, Object> payload) {
        return new RemoteException(requestId, str(payload.get("type"), "RemoteError"), str(payload.get("message"), ""),
                str(payload.get("traceback"), ""));
    }

    private static String str(Object o, String dflt) {
        return o instanceof String ? (String) o : dflt;
    }

    public String remoteType() {
        return remoteType;
    }

    public String remoteMessage() {
        return remoteMessage;
    }

    public String remoteTraceback() {
        return remoteTraceback;
    }

    public long requestId() {
        return requestId;
    }

    /** True when the ERROR ended the whole session (request id 0), e.g. SessionCrashed or TetherTimeout. */
    public boolean endsSession() {
        return requestId == 0;
    }
}
