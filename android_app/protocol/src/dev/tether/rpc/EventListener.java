package dev.tether.rpc;

import java.util.Map;

/** Receives EVENT frames ({@code kind}: progress, sample, log, queued) as they arrive, before the final reply. */
public interface EventListener {
    void onEvent(long requestId, Map<String, Object> event);
}
