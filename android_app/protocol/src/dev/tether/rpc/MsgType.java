package dev.tether.rpc;

/** Core message types. The values are part of the wire format: never renumber. */
public enum MsgType {
    HELLO(1), CHALLENGE(2), AUTH(3), WELCOME(4), CALL(5), RETURN(6), ERROR(7), EVENT(8), CLOSE(9);

    private final int value;

    MsgType(int value) {
        this.value = value;
    }

    public int value() {
        return value;
    }

    /** The core type with this value, or null (tracker types 64..127 and unknown values). */
    public static MsgType fromValue(int value) {
        for (MsgType t : values()) {
            if (t.value == value) {
                return t;
            }
        }
        return null;
    }
}
