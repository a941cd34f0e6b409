package dev.tether.device;

/** Placeholder: the graph executor's built-ins land in a later step. */
final class GraphExecutor {
    static void register(Session s) {
    }

    void close() {
    }
}
