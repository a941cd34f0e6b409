package dev.tether.rpc;

/** Constants of the tether wire protocol, version 1 (docs/protocol.md is the reference). */
public final class Protocol {
    private Protocol() {
    }

    public static final String MAGIC = "tether-rpc";
    public static final int VERSION = 1;
    /** Capabilities this implementation offers in HELLO; a peer ignores names it does not know. */
    public static final String[] CAPABILITIES = {"bulk", "events", "tensor-ext", "handle-ext", "auth-hmac-sha256"};

    public static final int HEADER_SIZE = 4;
    public static final int EXT_TENSOR = 1;
    public static final int EXT_HANDLE = 2;

    /** Message types 64..127 belong to the tracker protocol, which uses the same framing. */
    public static final int TRACKER_TYPE_MIN = 64;
    public static final int TRACKER_TYPE_MAX = 127;

    // Well-known ERROR type strings (a remote exception otherwise carries its class name).
    public static final String ERR_VERSION_MISMATCH = "VersionMismatch";
    public static final String ERR_AUTHENTICATION = "AuthenticationError";
    public static final String ERR_PROTOCOL = "ProtocolError";
    public static final String ERR_FRAME_TOO_LARGE = "FrameTooLarge";
    public static final String ERR_DEVICE_BUSY = "DeviceBusy";
    public static final String ERR_SESSION_CRASHED = "SessionCrashed";
    public static final String ERR_TIMEOUT = "TetherTimeout";
}
