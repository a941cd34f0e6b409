package dev.tether.rpc;

import java.util.List;
import java.util.Map;

/** A RETURN: its value, the whole payload, and the bulk bytes that followed it (or null). */
public final class Reply {
    public final long requestId;
    public final Object value;
    public final Map<String, Object> payload;
    /** Bulk bytes that followed the RETURN, unless the caller gave a destination buffer (then null). */
    public final byte[] bulk;

    public Reply(long requestId, Map<String, Object> payload, byte[] bulk) {
        this.requestId = requestId;
        this.payload = payload;
        this.value = payload.get("value");
        this.bulk = bulk;
    }

    /** Tensor arguments of a function-handle call as they are after the call (payload {@code tensors}), or null. */
    @SuppressWarnings("unchecked")
    public List<Object> tensors() {
        Object t = payload.get("tensors");
        return t instanceof List ? (List<Object>) t : null;
    }
}
