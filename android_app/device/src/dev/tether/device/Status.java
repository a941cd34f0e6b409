package dev.tether.device;

/** A snapshot of the device server's state, for a UI or a log. Immutable. */
public final class Status {
    /** Registered with a tracker (direct or reverse). */
    public final boolean registered;
    /** A client holds a session now. */
    public final boolean sessionActive;
    /** The last packed or built-in call of the current or last session, or null. */
    public final String lastCall;
    /** How long it took, in milliseconds. */
    public final double lastCallMs;
    /** The last error (tracker unreachable, a crashed session...), or null. */
    public final String error;
    /** "host:port" the server listens on, or null. */
    public final String listening;

    public Status(boolean registered, boolean sessionActive, String lastCall, double lastCallMs, String error,
                  String listening) {
        this.registered = registered;
        this.sessionActive = sessionActive;
        this.lastCall = lastCall;
        this.lastCallMs = lastCallMs;
        this.error = error;
        this.listening = listening;
    }

    @Override
    public String toString() {
        return "Status(registered=" + registered + ", session=" + sessionActive + ", lastCall=" + lastCall
                + ", lastCallMs=" + lastCallMs + ", error=" + error + ", listening=" + listening + ")";
    }
}
