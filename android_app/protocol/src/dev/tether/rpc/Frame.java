package dev.tether.rpc;

import java.util.Map;

/** One decoded frame: {@code [msg_type, request_id, payload]}. */
public final class Frame {
    public final int type;
    public final long requestId;
    public final Map<String, Object> payload;

    public Frame(int type, long requestId, Map<String, Object> payload) {
        this.type = type;
        this.requestId = requestId;
        this.payload = payload;
    }

    /** The core message type, or null for tracker/unknown types. */
    public MsgType msgType() {
        return MsgType.fromValue(type);
    }

    /** How many bulk bytes follow this frame on the wire (payload {@code nbytes}), checked against the limit. */
    public long bulkSize(Limits limits) throws ProtocolException {
        return FrameCodec.bulkSize(payload, limits);
    }

    @Override
    public String toString() {
        MsgType t = msgType();
        return "Frame(" + (t != null ? t.name() : Integer.toString(type)) + ", " + requestId + ", " + payload + ")";
    }
}
