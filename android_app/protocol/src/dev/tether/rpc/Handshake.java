package dev.tether.rpc;

import java.nio.charset.Charset;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Handshake helpers: HELLO payloads and the HMAC-SHA256 challenge-response.
 * <pre>
 * client mac   = HMAC-SHA256(token, "tether-auth-v1/client" || Ns || Nc)
 * server proof = HMAC-SHA256(token, "tether-auth-v1/server" || Nc || Ns)
 * </pre>
 */
public final class Handshake {
    private Handshake() {
    }

    public static final String AUTH_ALGO = "hmac-sha256";
    public static final int NONCE_SIZE = 32;
    private static final Charset UTF8 = Charset.forName("UTF-8");
    private static final byte[] CLIENT_CONTEXT = "tether-auth-v1/client".getBytes(UTF8);
    private static final byte[] SERVER_CONTEXT = "tether-auth-v1/server".getBytes(UTF8);
    private static final SecureRandom RANDOM = new SecureRandom();

    public static byte[] newNonce() {
        byte[] n = new byte[NONCE_SIZE];
        RANDOM.nextBytes(n);
        return n;
    }

    public static byte[] clientMac(String token, byte[] serverNonce, byte[] clientNonce) {
        return hmac(token, CLIENT_CONTEXT, serverNonce, clientNonce);
    }

    public static byte[] serverProof(String token, byte[] serverNonce, byte[] clientNonce) {
        return hmac(token, SERVER_CONTEXT, clientNonce, serverNonce);
    }

    private static byte[] hmac(String token, byte[] context, byte[] first, byte[] second) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            byte[] key = token.getBytes(UTF8);
            // An empty key is valid HMAC (Python accepts it) but SecretKeySpec refuses it; a zero byte is equivalent
            // because HMAC pads keys with zeros to the block size.
            mac.init(new SecretKeySpec(key.length == 0 ? new byte[1] : key, "HmacSHA256"));
            mac.update(context);
            mac.update(first);
            mac.update(second);
            return mac.doFinal();
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HMAC-SHA256 is not available on this platform", e);
        }
    }

    /** Constant-time comparison (MessageDigest.isEqual is constant-time since Java 6u17 and on Android). */
    public static boolean macsEqual(Object a, byte[] b) {
        return a instanceof byte[] && b != null && MessageDigest.isEqual((byte[]) a, b);
    }

    /** A HELLO payload in the key order of the Python implementation (magic, version, caps, wait, client, match?). */
    public static Map<String, Object> helloPayload(String[] caps, String match, boolean wait, String client) {
        Map<String, Object> p = new LinkedHashMap<String, Object>();
        p.put("magic", Protocol.MAGIC);
        p.put("version", (long) Protocol.VERSION);
        List<Object> c = new ArrayList<Object>(Arrays.asList((Object[]) caps));
        p.put("caps", c);
        p.put("wait", wait);
        p.put("client", client);
        if (match != null) {
            p.put("match", match);
        }
        return p;
    }

    /** Checks a WELCOME's version; throws naming both versions on a mismatch. */
    public static void checkWelcome(Map<String, Object> payload) throws VersionMismatchException {
        Object v = payload.get("version");
        if (!(v instanceof Long) || (Long) v != Protocol.VERSION) {
            throw new VersionMismatchException("server speaks tether protocol version " + v
                    + ", this client speaks version " + Protocol.VERSION);
        }
    }
}
