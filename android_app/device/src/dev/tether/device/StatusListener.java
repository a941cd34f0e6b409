package dev.tether.device;

/** Told whenever the device server's state changes (from the server's threads: post to a UI thread yourself). */
public interface StatusListener {
    void onStatus(Status s);
}
