package dev.tether.rpc.tools;

import dev.tether.rpc.EventListener;
import dev.tether.rpc.RemoteException;
import dev.tether.rpc.Reply;
import dev.tether.rpc.TetherClient;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

/**
 * Connects once, optionally makes one {@code tether.echo} call, and reports what happened, for tests that point the
 * client at a misbehaving server. Prints "events: N" (EVENTs seen during the call), "result: VALUE" or
 * "error: ExceptionClass: message" (plus "remote_type: T" for a RemoteException), then "elapsed_ms: N" and
 * "closed: true|false". Exits 0 whatever the outcome (the caller judges it), 2 on bad arguments.
 *
 * <pre>java dev.tether.rpc.tools.ClientProbe --host H --port P [--timeout-ms N] [--token T] [--call]
 *     [--upload-mb N]</pre>
 */
public final class ClientProbe {
    public static void main(String[] args) {
        String host = "127.0.0.1";
        int port = -1;
        int timeout = 2000;
        String token = null;
        boolean call = false;
        int uploadMb = 0;
        for (int i = 0; i < args.length; i++) {
            if ("--host".equals(args[i])) {
                host = args[++i];
            } else if ("--port".equals(args[i])) {
                port = Integer.parseInt(args[++i]);
            } else if ("--timeout-ms".equals(args[i])) {
                timeout = Integer.parseInt(args[++i]);
            } else if ("--token".equals(args[i])) {
                token = args[++i];
            } else if ("--call".equals(args[i])) {
                call = true;
            } else if ("--upload-mb".equals(args[i])) {
                uploadMb = Integer.parseInt(args[++i]);
            } else {
                System.err.println("unknown argument " + args[i]);
                System.exit(2);
            }
        }
        if (port <= 0) {
            System.err.println("usage: ClientProbe --host H --port P [--timeout-ms N] [--token T] [--call]");
            System.exit(2);
        }
        long t0 = System.nanoTime();
        TetherClient c = null;
        final List<Object> events = new ArrayList<Object>();
        try {
            c = TetherClient.connect(host, port, new TetherClient.Options().token(token).connectTimeoutMs(timeout)
                    .readTimeoutMs(timeout).writeTimeoutMs(timeout).queueTimeoutMs(timeout));
            if (uploadMb > 0) {
                System.out.println("result: " + Values.show(c.upload("probe.bin", new byte[uploadMb << 20])));
            } else if (call) {
                Reply r = c.call("tether.echo", Arrays.<Object>asList("probe"), null, new EventListener() {
                    public void onEvent(long requestId, Map<String, Object> event) {
                        events.add(event.get("kind"));
                    }
                });
                System.out.println("events: " + events.size());
                System.out.println("result: " + Values.show(r.value));
            } else {
                System.out.println("result: connected");
            }
        } catch (Exception e) {
            System.out.println("events: " + events.size());
            System.out.println("error: " + e.getClass().getSimpleName() + ": " + e.getMessage());
            if (e instanceof RemoteException) {
                System.out.println("remote_type: " + ((RemoteException) e).remoteType());
            }
        } catch (OutOfMemoryError e) {
            System.out.println("error: OutOfMemoryError: " + e.getMessage());
        }
        System.out.println("elapsed_ms: " + (System.nanoTime() - t0) / 1000000);
        System.out.println("closed: " + (c == null || c.isClosed()));
        if (c != null) {
            c.close();
        }
    }
}
