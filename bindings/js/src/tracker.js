// The device side of the tracker protocol (docs/tracker.md), in reverse mode: HELLO (role device) with the
// tracker's token HMAC, REGISTER {key, tags, info, reverse: true}, heartbeats, EXPECT -> EXPECTED, REVOKE, and
// DIAL -> a second connection that sends RELAY {match} and then carries the session. Neither a browser tab nor
// a node behind NAT can accept connections, so the device only ever dials out. After each session it registers
// again; after losing the tracker it reconnects forever with capped exponential backoff (0.1 s doubling to
// 10 s, with jitter).
import { encodeFrame, TRACKER_LIMITS, HANDSHAKE_LIMITS, toNumber } from "./msgpack.js";
import { FramedConnection, MsgType, sleep } from "./protocol.js";
import { NONCE_SIZE, makeNonce, clientMac, serverProof, macsEqual } from "./handshake.js";

export const TrackerMsg = Object.freeze({
  HELLO: 64, CHALLENGE: 65, AUTH: 66, WELCOME: 67, REGISTER: 68, REGISTERED: 69, HEARTBEAT: 70, EXPECT: 71,
  EXPECTED: 72, REVOKE: 73, SESSION: 74, DIAL: 75, RELAY: 76,
});

const BACKOFF_MIN_MS = 100;
const BACKOFF_MAX_MS = 10000;

export class TrackerError extends Error {}

export class TrackerLink {
  /** opts: connect() -> Promise<transport> (a new connection to the tracker, TCP or through the web relay),
   * key, tags ({name: value}), token (tracker token or null), name, device (src/device.js), onState(state, detail). */
  constructor(opts) {
    this.opts = opts;
    this.device = opts.device;
    this.device.tracker = this;
    this.conn = null;
    this.state = "idle";
    this.stopped = false;
    this.registrations = 0;
    this.deviceId = null;
  }

  setState(state, detail = "") {
    this.state = state;
    this.opts.onState?.(state, detail);
  }

  send(type, payload) { this.conn?.send(type, 0, payload); }

  registerPayload() {
    return new Map([["key", this.opts.key], ["port", 0], ["tags", new Map(Object.entries(this.opts.tags ?? {}))],
      ["info", new Map(Object.entries(this.device.deviceInfo()))], ["reverse", true], ["state", this.device.busy ? "busy" : "free"]]);
  }

  sessionStarted(match) { if (this.state === "registered") this.send(TrackerMsg.SESSION, new Map([["state", "started"], ["match", match]])); }

  sessionEnded() { if (this.state === "registered") this.send(TrackerMsg.REGISTER, this.registerPayload()); }

  /** Run until stop(): connect, register, serve; reconnect with backoff after any loss. */
  async run() {
    let backoff = BACKOFF_MIN_MS;
    while (!this.stopped) {
      try {
        await this.once(() => { backoff = BACKOFF_MIN_MS; });
      } catch (e) {
        this.setState("lost", String(e?.message ?? e));
      }
      if (this.stopped) break;
      const wait = Math.min(BACKOFF_MAX_MS, backoff) * (0.5 + Math.random() * 0.5);
      this.setState("reconnecting", `in ${(wait / 1000).toFixed(1)} s`);
      await sleep(wait);
      backoff = Math.min(BACKOFF_MAX_MS, backoff * 2);
    }
    this.setState("stopped");
  }

  stop() { this.stopped = true; this.conn?.close(); }

  async once(onRegistered) {
    this.setState("connecting");
    const transport = await this.opts.connect();
    const conn = new FramedConnection(transport, HANDSHAKE_LIMITS);
    this.conn = conn;
    if (this.stopped) { conn.close(); return; }
    const deadline = Date.now() + 5000;
    conn.send(TrackerMsg.HELLO, 0, new Map([["magic", "tether-tracker"], ["version", 1], ["role", "device"], ["name", (this.opts.name ?? this.opts.key).slice(0, 64)]]));
    let serverNonce = null;
    let clientNonce = null;
    for (;;) {
      const f = await conn.nextFrame(deadline);
      if (f === null) throw new TrackerError("the tracker closed the connection during the handshake");
      if (f.msgType === MsgType.ERROR) throw new TrackerError(`the tracker refused: ${f.payload.get("type")}: ${f.payload.get("message")}`);
      if (f.msgType === TrackerMsg.CHALLENGE && serverNonce === null) {
        if (!this.opts.token) throw new TrackerError("the tracker requires a token (give --tracker-token, or #token= in the page's address)");
        serverNonce = f.payload.get("nonce");
        if (!(serverNonce instanceof Uint8Array) || serverNonce.length !== NONCE_SIZE) throw new TrackerError("the tracker sent a CHALLENGE without a 32-byte nonce");
        clientNonce = makeNonce();
        conn.send(TrackerMsg.AUTH, 0, new Map([["nonce", clientNonce], ["mac", await clientMac(this.opts.token, serverNonce, clientNonce)]]));
        continue;
      }
      if (f.msgType === TrackerMsg.WELCOME) {
        if (this.opts.token) {
          if (serverNonce === null) throw new TrackerError("the tracker did not ask for the token this device holds, so it cannot prove it is genuine");
          if (!macsEqual(f.payload.get("proof"), await serverProof(this.opts.token, serverNonce, clientNonce))) throw new TrackerError("the tracker did not prove it knows the token");
        }
        break;
      }
      throw new TrackerError(`the tracker sent message type ${f.msgType} during the handshake`);
    }
    conn.limits = TRACKER_LIMITS;
    this.setState("registering");
    this.send(TrackerMsg.REGISTER, this.registerPayload());
    let heartbeatMs = 1000;
    let lastHeard = Date.now();
    let timer = null;
    try {
      for (;;) {
        const f = await conn.nextFrame(Date.now() + Math.max(3 * heartbeatMs, 3000));
        if (f === null) throw new TrackerError("the tracker closed the connection");
        lastHeard = Date.now();
        const p = f.payload;
        switch (f.msgType) {
          case TrackerMsg.REGISTERED:
            this.deviceId = p.get("device");
            heartbeatMs = Math.max(100, toNumber(p.get("heartbeat") ?? 1) * 1000);
            if (this.state !== "registered") {
              this.registrations++;
              this.setState("registered", `device ${this.deviceId}`);
              onRegistered();
              clearInterval(timer);
              timer = setInterval(() => {
                if (Date.now() - lastHeard > 3 * heartbeatMs) conn.close();
                else this.send(TrackerMsg.HEARTBEAT, new Map());
              }, heartbeatMs);
            }
            break;
          case TrackerMsg.HEARTBEAT:
            break;
          case TrackerMsg.EXPECT: {
            const match = p.get("match");
            const timeout = toNumber(p.get("session_timeout") ?? 0);
            this.device.expect(match, timeout > 0 ? timeout * 1000 : undefined);
            this.send(TrackerMsg.EXPECTED, new Map([["match", match]]));
            break;
          }
          case TrackerMsg.REVOKE:
            this.device.revoke(p.get("match"));
            break;
          case TrackerMsg.DIAL:
            this.dial(p.get("match"));
            break;
          case MsgType.ERROR:
            throw new TrackerError(`the tracker sent ${p.get("type")}: ${p.get("message")}`);
          default:
            break;   // a newer tracker's message: ignore
        }
      }
    } finally {
      clearInterval(timer);
      conn.close();
      this.conn = null;
      if (this.state === "registered") this.state = "lost";
    }
  }

  /** Reverse mode: open the data connection for `match` and serve the session on it. */
  async dial(match) {
    let transport;
    try {
      transport = await this.opts.connect();
    } catch (e) {
      this.opts.onState?.(this.state, `dial for a session failed: ${e?.message ?? e}`);
      return;
    }
    transport.write(encodeFrame(TrackerMsg.RELAY, 0, new Map([["match", match]])));
    try {
      await this.device.serve(transport, { relayed: true });
    } catch (e) {
      this.opts.onState?.(this.state, `session failed: ${e?.message ?? e}`);
    }
  }
}
