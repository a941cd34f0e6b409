// The token handshake shared by the RPC core and the tracker: HMAC-SHA256 with WebCrypto (crypto.subtle, in
// every browser and in node >= 18 as globalThis.crypto), keyed by the token's UTF-8 bytes (docs/protocol.md,
// "Handshake"): mac = HMAC(token, "tether-auth-v1/client" || Ns || Nc), proof = HMAC(token,
// "tether-auth-v1/server" || Nc || Ns).
export const NONCE_SIZE = 32;
const enc = new TextEncoder();
const CLIENT_CONTEXT = enc.encode("tether-auth-v1/client");
const SERVER_CONTEXT = enc.encode("tether-auth-v1/server");

function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let pos = 0;
  for (const p of parts) { out.set(p, pos); pos += p.length; }
  return out;
}

async function hmac(token, data) {
  const key = await crypto.subtle.importKey("raw", enc.encode(token), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, data));
}

export function makeNonce() { return crypto.getRandomValues(new Uint8Array(NONCE_SIZE)); }
export function clientMac(token, serverNonce, clientNonce) { return hmac(token, concat(CLIENT_CONTEXT, serverNonce, clientNonce)); }
export function serverProof(token, serverNonce, clientNonce) { return hmac(token, concat(SERVER_CONTEXT, clientNonce, serverNonce)); }

/** Constant-time comparison of two byte strings (the time depends only on the length). */
export function macsEqual(a, b) {
  if (!(a instanceof Uint8Array) || !(b instanceof Uint8Array) || a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}
