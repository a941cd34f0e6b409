package dev.tether.rpc.tools;

import dev.tether.rpc.Frame;
import dev.tether.rpc.FrameCodec;
import dev.tether.rpc.FrameDecoder;
import dev.tether.rpc.Handshake;
import dev.tether.rpc.Json;
import dev.tether.rpc.Limits;
import dev.tether.rpc.MsgType;
import dev.tether.rpc.Protocol;
import dev.tether.rpc.ProtocolException;
import dev.tether.rpc.TetherException;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.Charset;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Checks this implementation against protocol test vector files (tests/vectors/frames.json and files in the same
 * format). For each {@code valid} frame: decode its bytes, compare with its {@code meaning} (when given), encode
 * the meaning and the decoded frame back and compare the bytes. For each {@code invalid} frame: it must be refused
 * with the named error ({@code Incomplete}: the decoder waits for more bytes without error). For each
 * {@code auth_exchanges} entry: the MAC and proof computed from its token and nonces must equal the ones given and
 * the ones inside its named CHALLENGE, AUTH and WELCOME frames. Prints one line per failure and
 * "N passed, M failed"; exits 1 on any failure.
 *
 * <pre>java dev.tether.rpc.tools.VectorsRunner tests/vectors/frames.json [more.json ...]</pre>
 */
public final class VectorsRunner {
    private int passed;
    private int failed;

    private void pass() {
        passed++;
    }

    private void fail(String name, String why) {
        failed++;
        System.out.println("FAIL " + name + ": " + why);
    }

    public static void main(String[] args) throws IOException {
        if (args.length == 0) {
            System.err.println("usage: VectorsRunner FRAMES.json [MORE.json ...]");
            System.exit(2);
        }
        VectorsRunner r = new VectorsRunner();
        for (String path : args) {
            String text = new String(Files.readAllBytes(Paths.get(path)), Charset.forName("UTF-8"));
            r.runFile(path, text);
        }
        System.out.println(r.passed + " passed, " + r.failed + " failed");
        System.exit(r.failed == 0 && r.passed > 0 ? 0 : 1);
    }

    @SuppressWarnings("unchecked")
    private void runFile(String path, String text) {
        Map<String, Object> doc = (Map<String, Object>) Json.parse(text);
        if (doc.containsKey("protocol_version")) {
            check(path + ":protocol_version", Long.valueOf(Protocol.VERSION).equals(doc.get("protocol_version")),
                    "file is version " + doc.get("protocol_version") + ", this code speaks " + Protocol.VERSION);
        }
        if (doc.containsKey("msg_types")) {
            for (Map.Entry<String, Object> e : ((Map<String, Object>) doc.get("msg_types")).entrySet()) {
                MsgType t = null;
                try {
                    t = MsgType.valueOf(e.getKey());
                } catch (IllegalArgumentException ignored) {
                    // reported below
                }
                check("msg_type " + e.getKey(), t != null && Long.valueOf(t.value()).equals(e.getValue()),
                        "Java has " + t + (t != null ? "=" + t.value() : "") + ", the file " + e.getValue());
            }
        }
        List<Object> valid = doc.containsKey("valid") ? (List<Object>) doc.get("valid") : new ArrayList<Object>();
        ByteArrayOutputStream stream = new ByteArrayOutputStream();
        List<Frame> expected = new ArrayList<Frame>();
        Map<String, Frame> byName = new HashMap<String, Frame>();
        for (Object o : valid) {
            Map<String, Object> v = (Map<String, Object>) o;
            byte[] bytes = Values.unhex((String) v.get("hex"));
            Frame f = runValid((String) v.get("name"), bytes, (Map<String, Object>) v.get("meaning"));
            if (f != null) {
                stream.write(bytes, 0, bytes.length);
                expected.add(f);
                byName.put((String) v.get("name"), f);
            }
        }
        if (doc.containsKey("auth_exchanges")) {
            for (Object o : (List<Object>) doc.get("auth_exchanges")) {
                runAuth((Map<String, Object>) o, byName);
            }
        }
        if (!expected.isEmpty()) {
            runStream(path + ":all valid frames byte by byte", stream.toByteArray(), expected);
        }
        if (doc.containsKey("invalid")) {
            for (Object o : (List<Object>) doc.get("invalid")) {
                Map<String, Object> v = (Map<String, Object>) o;
                runInvalid((String) v.get("name"), Values.unhex((String) v.get("hex")), (String) v.get("error"));
            }
        }
    }

    /** One authenticated handshake: token + nonces -> MAC and proof, as given and as carried by its frames. */
    @SuppressWarnings("unchecked")
    private void runAuth(Map<String, Object> a, Map<String, Frame> byName) {
        String name = (String) a.get("name");
        String token = (String) a.get("token");
        byte[] ns = Values.unhex((String) a.get("server_nonce"));
        byte[] nc = Values.unhex((String) a.get("client_nonce"));
        byte[] mac = Handshake.clientMac(token, ns, nc);
        byte[] proof = Handshake.serverProof(token, ns, nc);
        List<String> problems = new ArrayList<String>();
        if (!Values.hex(mac).equals(a.get("mac"))) {
            problems.add("client MAC is " + Values.hex(mac) + ", the file says " + a.get("mac"));
        }
        if (!Values.hex(proof).equals(a.get("proof"))) {
            problems.add("server proof is " + Values.hex(proof) + ", the file says " + a.get("proof"));
        }
        for (Object frameName : (List<Object>) a.get("frames")) {
            Frame f = byName.get(frameName);
            if (f == null) {
                problems.add("frame " + frameName + " is missing or failed");
            } else if (f.type == MsgType.CHALLENGE.value() && !Arrays.equals((byte[]) f.payload.get("nonce"), ns)) {
                problems.add(frameName + " carries another server nonce");
            } else if (f.type == MsgType.AUTH.value() && (!Arrays.equals((byte[]) f.payload.get("nonce"), nc)
                    || !Arrays.equals((byte[]) f.payload.get("mac"), mac))) {
                problems.add(frameName + " carries another client nonce or MAC");
            } else if (f.type == MsgType.WELCOME.value() && !Arrays.equals((byte[]) f.payload.get("proof"), proof)) {
                problems.add(frameName + " carries another proof");
            }
        }
        check(name, problems.isEmpty(), problems.toString());
    }

    private void check(String name, boolean ok, String why) {
        if (ok) {
            pass();
        } else {
            fail(name, why);
        }
    }

    @SuppressWarnings("unchecked")
    private Frame runValid(String name, byte[] bytes, Map<String, Object> meaning) {
        Frame f;
        try {
            FrameDecoder d = new FrameDecoder(Limits.DEFAULT);
            d.feed(bytes);
            f = d.next();
            if (f == null) {
                fail(name, "decoder wants more bytes for a complete frame");
                return null;
            }
            if (d.buffered() != 0) {
                fail(name, d.buffered() + " bytes left after the frame");
                return null;
            }
        } catch (TetherException e) {
            fail(name, "refused: " + e.wireType() + ": " + e.getMessage());
            return null;
        }
        List<String> problems = new ArrayList<String>();
        if (meaning != null) {
            long type = (Long) meaning.get("msg_type");
            long rid = (Long) meaning.get("request_id");
            Map<String, Object> payload = (Map<String, Object>) Values.toWire(meaning.get("payload"));
            if (f.type != type || f.requestId != rid || !Values.deepEquals(f.payload, payload)) {
                problems.add("decoded " + f.type + "/" + f.requestId + " " + Values.show(f.payload) + ", meaning is "
                        + type + "/" + rid + " " + Values.show(payload));
            }
            byte[] fromMeaning = FrameCodec.encodeFrame((int) type, rid, payload);
            if (!Arrays.equals(fromMeaning, bytes)) {
                problems.add("meaning encodes to " + Values.hex(fromMeaning) + ", expected " + Values.hex(bytes));
            }
        }
        byte[] again = FrameCodec.encodeFrame(f.type, f.requestId, f.payload);
        if (!Arrays.equals(again, bytes)) {
            problems.add("decoded frame re-encodes to " + Values.hex(again) + ", expected " + Values.hex(bytes));
        }
        if (!problems.isEmpty()) {
            StringBuilder why = new StringBuilder();
            for (String problem : problems) {
                why.append(why.length() > 0 ? "; " : "").append(problem);
            }
            fail(name, why.toString());
            return null;
        }
        pass();
        return f;
    }

    /** All valid frames back to back, fed one byte at a time: each frame appears exactly when complete. */
    private void runStream(String name, byte[] all, List<Frame> expected) {
        FrameDecoder d = new FrameDecoder(Limits.DEFAULT);
        List<Frame> got = new ArrayList<Frame>();
        try {
            for (int i = 0; i < all.length; i++) {
                d.feed(all, i, 1);
                Frame f = d.next();
                if (f != null) {
                    got.add(f);
                }
            }
        } catch (TetherException e) {
            fail(name, "refused after " + got.size() + " frames: " + e.getMessage());
            return;
        }
        if (got.size() != expected.size()) {
            fail(name, "got " + got.size() + " frames, expected " + expected.size());
            return;
        }
        for (int i = 0; i < got.size(); i++) {
            Frame a = got.get(i);
            Frame b = expected.get(i);
            if (a.type != b.type || a.requestId != b.requestId || !Values.deepEquals(a.payload, b.payload)) {
                fail(name, "frame " + i + " differs: " + a + " vs " + b);
                return;
            }
        }
        pass();
    }

    private void runInvalid(String name, byte[] bytes, String error) {
        FrameDecoder d = new FrameDecoder(Limits.DEFAULT);
        try {
            d.feed(bytes);
            Frame f = d.next();
            if ("Incomplete".equals(error)) {
                check(name, f == null, "decoded " + f + " from an incomplete frame");
            } else {
                fail(name, "accepted (" + f + "), expected " + error);
            }
        } catch (ProtocolException e) {
            check(name, e.wireType().equals(error), "refused with " + e.wireType() + " (" + e.getMessage()
                    + "), expected " + error);
        } catch (RuntimeException e) {
            fail(name, "crashed with " + e + ", expected " + error);
        }
    }
}
