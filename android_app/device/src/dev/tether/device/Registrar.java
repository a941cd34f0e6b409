package dev.tether.device;

/** Placeholder: tracker registration lands in a later step. */
final class Registrar {
    Registrar(DeviceConfig c, DeviceServer s, int port) {
    }

    void start() {
    }

    boolean checkMatch(String match) {
        return true;
    }

    void sessionStarted() {
    }

    void sessionEnded() {
    }

    void close() {
    }
}
