package dev.tether.rpc.tools;

import dev.tether.rpc.AuthenticationException;
import dev.tether.rpc.EventListener;
import dev.tether.rpc.RemoteException;
import dev.tether.rpc.RemoteHandle;
import dev.tether.rpc.Reply;
import dev.tether.rpc.Tensor;
import dev.tether.rpc.TetherClient;
import dev.tether.rpc.TrackerClient;

import java.io.Closeable;
import java.io.IOException;
import java.math.BigInteger;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Talks to a real tether device server with {@link TetherClient} and checks every answer. Prints "ok NAME" or
 * "FAIL NAME: why" per check, a few "fact KEY=VALUE" lines for the caller to compare (device_info.arch), and
 * "N passed, M failed"; exits 1 on any failure.
 *
 * <pre>java dev.tether.rpc.tools.InteropRunner --host 127.0.0.1 --port P [--token T] [--vadd vadd.so]</pre>
 *
 * With --token the server must require that token: a missing and a wrong token are refused first. Without it, a
 * client holding a token must refuse the token-less server (it cannot prove it knows the token).
 */
public final class InteropRunner {
    private int passed;
    private int failed;
    private String host = "127.0.0.1";
    private int port = -1;
    private String token;
    private String vaddPath;
    private final List<String> trackerKeys = new ArrayList<String>();
    private String trackerToken;

    interface Check {
        void run() throws Exception;
    }

    private void check(String name, Check c) {
        try {
            c.run();
            passed++;
            System.out.println("ok " + name);
        } catch (Throwable e) {
            failed++;
            System.out.println("FAIL " + name + ": " + e);
        }
    }

    /** Opens a client holding {@code token} (null: none); a refusal check expects it to be refused. */
    interface Attempt {
        Closeable open(String token) throws IOException;
    }

    /** With {@code token} required by the peer: connecting without a token and with a wrong one are refused. */
    private void tokenRefusalChecks(String who, String token, Attempt attempt) {
        checkRefused(who + ": no token refused", "requires a token", true, attempt, null);
        // the peer's ERROR AuthenticationError, not our own "requires a token" refusal
        checkRefused(who + ": wrong token refused", "requires a token", false, attempt, token + "-wrong");
    }

    /** A check that {@code attempt} with {@code token} is refused as {@link #expectRefused} says. */
    private void checkRefused(String name, final String text, final boolean mentioned, final Attempt attempt,
                              final String token) {
        check(name, new Check() {
            public void run() throws Exception {
                expectRefused(text, mentioned, attempt, token);
            }
        });
    }

    /** {@code attempt} must throw AuthenticationException whose message mentions {@code text} (or, with
     *  {@code mentioned} false, does not). */
    static void expectRefused(String text, boolean mentioned, Attempt attempt, String token) throws IOException {
        Closeable opened;
        try {
            opened = attempt.open(token);
        } catch (AuthenticationException e) {
            expect(e.getMessage().contains(text) == mentioned, e.getMessage());
            return;
        }
        opened.close();
        throw new AssertionError("not refused");
    }

    static void expect(boolean cond, String why) {
        if (!cond) {
            throw new AssertionError(why);
        }
    }

    static void expectEqual(Object got, Object want) {
        if (!Values.deepEquals(got, want)) {
            throw new AssertionError("got " + Values.show(got) + ", expected " + Values.show(want));
        }
    }

    private TetherClient.Options options() {
        return new TetherClient.Options().connectTimeoutMs(10000).readTimeoutMs(20000).queueTimeoutMs(20000)
                .token(token);
    }

    public static void main(String[] args) {
        InteropRunner r = new InteropRunner();
        for (int i = 0; i < args.length; i += 2) {
            String v = i + 1 < args.length ? args[i + 1] : null;
            if ("--host".equals(args[i])) {
                r.host = v;
            } else if ("--port".equals(args[i])) {
                r.port = Integer.parseInt(v);
            } else if ("--token".equals(args[i])) {
                r.token = v;
            } else if ("--vadd".equals(args[i])) {
                r.vaddPath = v;
            } else if ("--tracker-key".equals(args[i])) {
                r.trackerKeys.add(v);
            } else if ("--tracker-token".equals(args[i])) {
                r.trackerToken = v;
            } else {
                System.err.println("unknown argument " + args[i]);
                System.exit(2);
            }
        }
        if (r.port <= 0) {
            System.err.println("usage: InteropRunner --host H --port P [--token T] [--vadd PATH]\n"
                    + "       InteropRunner --host H --port TRACKER_PORT --tracker-key KEY... [--tracker-token T]");
            System.exit(2);
        }
        if (r.trackerKeys.isEmpty()) {
            r.run();
        } else {
            r.runTracker();
        }
        System.out.println(r.passed + " passed, " + r.failed + " failed");
        System.exit(r.failed == 0 && r.passed > 0 ? 0 : 1);
    }

    private void run() {
        authChecks();
        final AtomicReference<TetherClient> holder = new AtomicReference<TetherClient>();
        check("connect", new Check() {
            public void run() throws Exception {
                TetherClient c = TetherClient.connect(host, port, options());
                holder.set(c);
                expect(c.sessionId() > 0, "session id " + c.sessionId());
                expect(c.serverName().startsWith("tether"), "server name " + c.serverName());
                System.out.println("fact server=" + c.serverName());
            }
        });
        TetherClient c = holder.get();
        if (c == null) {
            return;
        }
        try {
            echoChecks(c);
            builtinChecks(c);
            errorChecks(c);
            bulkChecks(c);
            if (vaddPath != null) {
                kernelChecks(c);
            }
            busyChecks(c);
        } finally {
            c.close();
        }
    }

    // -- through a tracker -------------------------------------------------------------------------------------
    private void runTracker() {
        if (trackerToken != null) {
            tokenRefusalChecks("tracker", trackerToken, new Attempt() {
                public Closeable open(String t) throws IOException {
                    return TrackerClient.connect(host, port, t);
                }
            });
        }
        final AtomicReference<TrackerClient> holder = new AtomicReference<TrackerClient>();
        check("tracker: connect", new Check() {
            public void run() throws Exception {
                holder.set(TrackerClient.connect(host, port, trackerToken));
                System.out.println("fact tracker=" + holder.get().trackerName());
            }
        });
        final TrackerClient t = holder.get();
        if (t == null) {
            return;
        }
        try {
            check("tracker: summary lists the devices", new Check() {
                @SuppressWarnings("unchecked")
                public void run() throws Exception {
                    Map<String, Object> s = t.summary();
                    List<Object> keys = new ArrayList<Object>();
                    for (Object d : (List<Object>) s.get("devices")) {
                        keys.add(((Map<String, Object>) d).get("key"));
                    }
                    for (String k : trackerKeys) {
                        expect(keys.contains(k), "no device " + k + " in " + keys);
                    }
                }
            });
            for (final String key : trackerKeys) {
                check("tracker: session on " + key, new Check() {
                    public void run() throws Exception {
                        TrackerClient.Grant g = t.request(key, 1, 20, 60, null);
                        System.out.println("fact grant." + key + "=" + (g.relay ? "relay" : "direct"));
                        TetherClient c = TetherClient.connect(g.host, g.port, options().token(null).match(g.match));
                        try {
                            expectEqual(c.call("tether.echo", key), key);
                            Tensor x = Tensor.fromFloats(new float[]{1f, 2f, 3f});
                            expectEqual(c.call("tether.echo", x), x);
                            System.out.println("fact device_info.arch=" + c.deviceInfo().get("arch"));
                        } finally {
                            c.close();
                        }
                    }
                });
            }
            check("tracker: a used match is refused", new Check() {
                public void run() throws Exception {
                    final TrackerClient.Grant g = t.request(trackerKeys.get(0), 1, 20, 60, null);
                    TetherClient.connect(g.host, g.port, options().token(null).match(g.match)).close();
                    // a one-time match cannot open a second session
                    expectRefused("match", true, new Attempt() {
                        public Closeable open(String none) throws IOException {
                            return TetherClient.connect(g.host, g.port, options().token(none).match(g.match));
                        }
                    }, null);
                }
            });
        } finally {
            t.close();
        }
    }

    // -- authentication ----------------------------------------------------------------------------------------
    private void authChecks() {
        Attempt connect = new Attempt() {
            public Closeable open(String t) throws IOException {
                return TetherClient.connect(host, port, options().token(t));
            }
        };
        if (token != null) {
            tokenRefusalChecks("auth", token, connect);
        } else {
            checkRefused("auth: token-less server cannot prove a token", "did not prove", true, connect, "some-token");
        }
    }

    // -- echo --------------------------------------------------------------------------------------------------
    private void echoChecks(final TetherClient c) {
        check("echo int", new Check() {
            public void run() throws Exception {
                expectEqual(c.call("tether.echo", 1L), 1L);
                expectEqual(c.call("tether.echo", 7), 7L); // an Integer goes out, a Long comes back
            }
        });
        check("echo ints at every encoding size", new Check() {
            public void run() throws Exception {
                List<Object> ints = new ArrayList<Object>(Arrays.<Object>asList(0L, 127L, 128L, 255L, 256L, 65535L,
                        65536L, 4294967295L, 4294967296L, Long.MAX_VALUE, -1L, -32L, -33L, -128L, -129L, -32768L,
                        -32769L, -2147483648L, -2147483649L, Long.MIN_VALUE));
                ints.add(BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE));
                expectEqual(c.call("tether.echo", ints.toArray()), ints);
            }
        });
        check("echo floats", new Check() {
            public void run() throws Exception {
                Object[] in = {1.5, -0.0, 1e300, Double.MIN_VALUE, Double.POSITIVE_INFINITY, Double.NaN, 0.1};
                expectEqual(c.call("tether.echo", in), Arrays.asList(in));
                // Python keeps floats as float64: a float32 goes out and a float64 of the same value comes back
                expectEqual(c.call("tether.echo", 2.5f), 2.5);
            }
        });
        check("echo strings", new Check() {
            public void run() throws Exception {
                StringBuilder big = new StringBuilder();
                for (int i = 0; i < 70000; i++) {
                    big.append((char) ('a' + i % 26));
                }
                Object[] in = {"", "h\u00e9llo \u2713 \u65e5\u672c \ud83d\ude00", "x" + big.substring(0, 40),
                        big.substring(0, 300), big.toString()};
                expectEqual(c.call("tether.echo", in), Arrays.asList(in));
            }
        });
        check("echo bytes", new Check() {
            public void run() throws Exception {
                byte[] all = new byte[256];
                for (int i = 0; i < 256; i++) {
                    all[i] = (byte) i;
                }
                byte[] big = new byte[100000];
                new Random(1).nextBytes(big);
                Object[] in = {new byte[0], all, big};
                expectEqual(c.call("tether.echo", in), Arrays.asList(in));
            }
        });
        check("echo nested list/map/nil/bool/handle", new Check() {
            public void run() throws Exception {
                Map<String, Object> m = new LinkedHashMap<String, Object>();
                m.put("a", Arrays.<Object>asList(1L, Arrays.<Object>asList(2L, null)));
                m.put("t", true);
                m.put("f", false);
                m.put("h", new RemoteHandle(42));
                expectEqual(c.call("tether.echo", m), m);
            }
        });
        check("echo float32 tensor", new Check() {
            public void run() throws Exception {
                float[] v = {1f, -2.5f, 3.25f, 0f, Float.MAX_VALUE, -0f};
                Tensor t = Tensor.fromFloats(v, 2, 3);
                Object back = c.call("tether.echo", t);
                expect(back instanceof Tensor, "got " + back);
                Tensor b = (Tensor) back;
                expectEqual(b.dtype(), "float32");
                expect(Arrays.equals(b.shape(), new long[]{2, 3}), "shape " + Arrays.toString(b.shape()));
                expect(Arrays.equals(b.toFloatArray(), v), Arrays.toString(b.toFloatArray()));
                expectEqual(back, t);
            }
        });
        check("echo tensors: int64, 0-d float64, empty, 4 MiB float32", new Check() {
            public void run() throws Exception {
                float[] big = new float[1 << 20];
                for (int i = 0; i < big.length; i++) {
                    big[i] = i * 0.5f;
                }
                Object[] in = {Tensor.fromLongs(new long[]{Long.MIN_VALUE, -1, 0, Long.MAX_VALUE}, 4),
                        Tensor.of("float64", new long[0], new byte[]{0, 0, 0, 0, 0, 0, (byte) 0xf8, 0x3f}),
                        Tensor.of("uint8", new long[]{0, 3}, new byte[0]), Tensor.fromFloats(big, 1024, 1024)};
                expectEqual(c.call("tether.echo", in), Arrays.asList(in));
                Tensor scalar = (Tensor) in[1];
                expect(scalar.toDoubleArray()[0] == 1.5, "0-d value " + scalar.toDoubleArray()[0]);
            }
        });
    }

    // -- built-ins ---------------------------------------------------------------------------------------------
    private void builtinChecks(final TetherClient c) {
        check("device_info", new Check() {
            public void run() throws Exception {
                Map<String, Object> info = c.deviceInfo();
                expect(info.get("arch") instanceof String, "arch " + info.get("arch"));
                expect(info.containsKey("cpu_features"), "keys " + info.keySet());
                System.out.println("fact device_info.arch=" + info.get("arch"));
                System.out.println("fact device_info.machine=" + info.get("machine"));
            }
        });
        check("functions", new Check() {
            public void run() throws Exception {
                List<Object> fns = c.functions();
                expect(fns.contains("tether.echo") && fns.contains("tether.device_info"), "functions " + fns);
            }
        });
    }

    // -- remote errors -----------------------------------------------------------------------------------------
    private void errorChecks(final TetherClient c) {
        check("remote exception carries type, message, traceback", new Check() {
            public void run() throws Exception {
                try {
                    c.call("tether.array.from_tensor", 1L);
                    throw new AssertionError("no error");
                } catch (RemoteException e) {
                    expectEqual(e.remoteType(), "TypeError");
                    expect(e.remoteMessage().contains("takes a tensor"), e.remoteMessage());
                    expect(e.remoteTraceback().contains("Traceback"), "traceback: " + e.remoteTraceback());
                    expect(!e.endsSession(), "request id " + e.requestId());
                }
                expectEqual(c.call("tether.echo", "still usable"), "still usable");
            }
        });
        check("unknown built-in is a remote KeyError", new Check() {
            public void run() throws Exception {
                try {
                    c.call("tether.no_such_function");
                    throw new AssertionError("no error");
                } catch (RemoteException e) {
                    expectEqual(e.remoteType(), "KeyError");
                }
                expectEqual(c.call("tether.echo", 5L), 5L);
            }
        });
        check("unsafe upload name refused", new Check() {
            public void run() throws Exception {
                try {
                    c.upload("../escape", new byte[]{1, 2, 3});
                    throw new AssertionError("no error");
                } catch (RemoteException e) {
                    expectEqual(e.remoteType(), "UnsafePathError");
                }
                expectEqual(c.call("tether.echo", 6L), 6L);
            }
        });
    }

    // -- bulk bytes --------------------------------------------------------------------------------------------
    private void bulkChecks(final TetherClient c) {
        check("upload, listdir, download, remove (bulk both ways)", new Check() {
            public void run() throws Exception {
                byte[] content = new byte[300000];
                new Random(2).nextBytes(content);
                Map<String, Object> up = c.upload("blob.bin", content);
                expectEqual(up.get("size"), (long) content.length);
                expect(((List<?>) c.call("tether.listdir")).contains("blob.bin"), "listdir");
                byte[] down = c.download("blob.bin");
                expect(Arrays.equals(down, content), "download differs (" + down.length + " bytes)");
                byte[] small = {9, 8, 7};
                c.upload("small.bin", small);
                expect(Arrays.equals(c.download("small.bin"), small), "small download differs");
                c.call("tether.remove", "blob.bin");
                expect(!((List<?>) c.call("tether.listdir")).contains("blob.bin"), "still listed after remove");
            }
        });
        check("array empty, copy_in, copy_out, free", new Check() {
            public void run() throws Exception {
                @SuppressWarnings("unchecked")
                Map<String, Object> arr = (Map<String, Object>) c.call("tether.array.empty", Arrays.asList(1000L),
                        "float32");
                RemoteHandle h = (RemoteHandle) arr.get("handle");
                expectEqual(arr.get("shape"), Arrays.<Object>asList(1000L));
                float[] v = new float[1000];
                for (int i = 0; i < v.length; i++) {
                    v[i] = i / 7f;
                }
                byte[] bytes = Tensor.fromFloats(v).toByteArray();
                c.copyIn(h, bytes);
                byte[] back = new byte[bytes.length];
                c.copyOut(h, back);
                expect(Arrays.equals(back, bytes), "copy_out differs from copy_in");
                c.call("tether.array.free", h);
                try {
                    c.copyOut(h, back);
                    throw new AssertionError("copy_out of a freed array worked");
                } catch (RemoteException e) {
                    expectEqual(e.remoteType(), "KeyError");
                }
            }
        });
    }

    // -- a real compiled kernel ----------------------------------------------------------------------------------
    @SuppressWarnings("unchecked")
    private void kernelChecks(final TetherClient c) {
        final int n = 1024;
        final float[] a = new float[n];
        final float[] b = new float[n];
        final float[] sum = new float[n];
        for (int i = 0; i < n; i++) {
            a[i] = i * 0.25f;
            b[i] = 1000f - i * 1.5f;
            sum[i] = a[i] + b[i];
        }
        final AtomicReference<RemoteHandle> fn = new AtomicReference<RemoteHandle>();
        check("kernel: upload, module.load, get_function", new Check() {
            public void run() throws Exception {
                c.upload("vadd.so", Files.readAllBytes(Paths.get(vaddPath)));
                Map<String, Object> mod = (Map<String, Object>) c.call("tether.module.load", "vadd.so");
                expect(((List<Object>) mod.get("functions")).contains("vadd"), "functions " + mod.get("functions"));
                Map<String, Object> f = (Map<String, Object>) c.call("tether.module.get_function", mod.get("handle"),
                        "vadd");
                fn.set((RemoteHandle) f.get("handle"));
            }
        });
        if (fn.get() == null) {
            return;
        }
        final RemoteHandle[] arrays = new RemoteHandle[3];
        check("kernel: vadd on device arrays", new Check() {
            public void run() throws Exception {
                arrays[0] = (RemoteHandle) ((Map<String, Object>) c.call("tether.array.from_tensor",
                        Tensor.fromFloats(a))).get("handle");
                arrays[1] = (RemoteHandle) ((Map<String, Object>) c.call("tether.array.from_tensor",
                        Tensor.fromFloats(b))).get("handle");
                arrays[2] = (RemoteHandle) ((Map<String, Object>) c.call("tether.array.empty",
                        Arrays.asList((long) n), "float32")).get("handle");
                c.call(fn.get(), arrays[0], arrays[1], arrays[2]);
                byte[] out = new byte[4 * n];
                c.copyOut(arrays[2], out);
                float[] got = Tensor.of("float32", new long[]{n}, out).toFloatArray();
                expect(Arrays.equals(got, sum), "vadd result differs from a + b");
            }
        });
        check("kernel: tensor arguments come back in RETURN tensors", new Check() {
            public void run() throws Exception {
                Reply r = c.call(fn.get(), Arrays.<Object>asList(Tensor.fromFloats(a), Tensor.fromFloats(b),
                        Tensor.fromFloats(new float[n])), null, null);
                List<Object> ts = r.tensors();
                expect(ts != null && ts.size() == 3, "tensors " + ts);
                expect(Arrays.equals(((Tensor) ts.get(2)).toFloatArray(), sum), "output tensor differs from a + b");
                expect(Arrays.equals(((Tensor) ts.get(0)).toFloatArray(), a), "input tensor changed");
            }
        });
        check("kernel: time_evaluator streams sample EVENTs before RETURN", new Check() {
            public void run() throws Exception {
                final List<Map<String, Object>> events = new ArrayList<Map<String, Object>>();
                Map<String, Object> opts = new LinkedHashMap<String, Object>();
                opts.put("number", 2L);
                opts.put("repeat", 4L);
                opts.put("min_repeat_ms", 0L);
                Reply r = c.call("tether.time_evaluator", Arrays.<Object>asList(fn.get(),
                        Arrays.<Object>asList(arrays[0], arrays[1], arrays[2]), opts), null, new EventListener() {
                            public void onEvent(long requestId, Map<String, Object> event) {
                                events.add(event);
                            }
                        });
                Map<String, Object> res = (Map<String, Object>) r.value;
                List<Object> samples = (List<Object>) res.get("samples");
                expect(samples.size() == 4, "samples " + samples);
                expect(events.size() == 4, "events " + events);
                for (int i = 0; i < 4; i++) {
                    Map<String, Object> e = events.get(i);
                    expectEqual(e.get("kind"), "sample");
                    expectEqual(e.get("index"), (long) i);
                    expectEqual(e.get("seconds"), samples.get(i));
                    expect((Double) samples.get(i) > 0, "sample " + samples.get(i));
                }
            }
        });
    }

    // -- one session at a time -----------------------------------------------------------------------------------
    private void busyChecks(final TetherClient c) {
        check("busy device: wait=false gets DeviceBusy", new Check() {
            public void run() throws Exception {
                try {
                    TetherClient.connect(host, port, options().waitIfBusy(false)).close();
                    throw new AssertionError("a second session was opened");
                } catch (RemoteException e) {
                    expectEqual(e.remoteType(), "DeviceBusy");
                }
            }
        });
        check("busy device: wait=true is queued, then welcomed when the first session closes", new Check() {
            public void run() throws Exception {
                final CountDownLatch queued = new CountDownLatch(1);
                final AtomicReference<Object> result = new AtomicReference<Object>();
                final List<Object> positions = new ArrayList<Object>();
                Thread t = new Thread(new Runnable() {
                    public void run() {
                        try {
                            TetherClient second = TetherClient.connect(host, port, options().waitIfBusy(true)
                                    .queueListener(new EventListener() {
                                        public void onEvent(long requestId, Map<String, Object> event) {
                                            synchronized (positions) {
                                                positions.add(event.get("position"));
                                            }
                                            queued.countDown();
                                        }
                                    }));
                            try {
                                result.set(second.call("tether.echo", "second session"));
                            } finally {
                                second.close();
                            }
                        } catch (IOException e) {
                            result.set(e);
                        }
                    }
                });
                t.start();
                boolean wasQueued = queued.await(10, TimeUnit.SECONDS);
                c.close(); // frees the device: the queued client gets its WELCOME
                t.join(20000);
                expect(wasQueued, "no queued EVENT within 10 s");
                expect(!t.isAlive(), "the queued client did not finish within 20 s");
                expectEqual(result.get(), "second session");
                synchronized (positions) {
                    expectEqual(positions.get(0), 1L);
                }
            }
        });
    }
}
