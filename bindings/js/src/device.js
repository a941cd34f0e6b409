// The JS device: serves one session at a time on whatever connection reaches it (a direct TCP listener in node,
// or a reverse-mode relay connection the tracker asked for), accepts only the one-time match tokens its tracker
// announced (src/tracker.js) on relayed connections, and describes itself in device_info.
import { FramedConnection } from "./protocol.js";
import { SessionHandler, serverHandshake, serveCalls } from "./session.js";

// The smallest module that uses a SIMD instruction (v128.const + i8x16.popcnt): WebAssembly.validate says whether
// this engine runs +simd128 modules.
const SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0, 65, 0, 253, 15, 253, 98, 11]);

export function simdSupported() {
  try { return WebAssembly.validate(SIMD_PROBE); } catch { return false; }
}

/** The smallest step of performance.now() in seconds (browsers coarsen it: 100 us in a tab that is not
 * cross-origin isolated, 5 us in one that is), measured over a bounded number of reads. */
export function timerResolution() {
  const clock = globalThis.performance ?? Date;
  let best = Infinity;
  for (let i = 0, last = clock.now(); i < 200000 && best > 1e-6; i++) {
    const t = clock.now();
    if (t > last) { best = Math.min(best, t - last); last = t; }
  }
  return Number.isFinite(best) ? best / 1e3 : 1e-3;
}

/** What this device is: the map `tether.device_info` returns and REGISTER carries to the tracker. */
export function describeDevice(extra = {}) {
  const isNode = typeof process !== "undefined" && !!process.versions?.node;
  const simd = simdSupported();
  const os = isNode && process.getBuiltinModule ? process.getBuiltinModule("node:os") : null;
  const info = {
    arch: "wasm32",
    os: isNode ? process.platform : "browser",
    runtime: isNode ? "node" : "browser",
    runtime_version: isNode ? process.version : (globalThis.navigator?.userAgent ?? ""),
    user_agent: globalThis.navigator?.userAgent ?? (isNode ? `node/${process.version}` : ""),
    simd,
    features: simd ? ["simd128"] : [],
    suggested_target: simd ? "wasm32" : "wasm32-nosimd",
    cores: os ? os.cpus().length : (globalThis.navigator?.hardwareConcurrency ?? 1),
    threads: 1,
    timer_resolution_s: timerResolution(),
    cross_origin_isolated: isNode ? false : globalThis.crossOriginIsolated === true,
  };
  if (extra.memoryBytes !== undefined) info.memory_bytes = extra.memoryBytes;
  else if (os) info.memory_bytes = os.totalmem();
  else if (globalThis.navigator?.deviceMemory) info.memory_bytes = globalThis.navigator.deviceMemory * 2 ** 30;
  return Object.assign(info, extra.info ?? {});
}

export class Device {
  /** opts: token (string|null: the RPC token clients must prove), info (extra device_info fields), memoryBytes,
   * diskBytes, handles (per-session limits), idleTimeoutMs, onState(state, detail) for a UI or a log. */
  constructor(opts = {}) {
    this.opts = opts;
    this.busy = false;
    this.sessions = 0;
    this.expected = new Map();   // match -> {expires, sessionTimeoutMs}
    this.tracker = null;         // set by TrackerLink
    this.infoCache = null;
  }

  deviceInfo() { return (this.infoCache ??= describeDevice(this.opts)); }

  /** The tracker announced a grant (EXPECT): its match token is good once, for `windowMs`. */
  expect(match, sessionTimeoutMs, windowMs = 30000) {
    this.expected.set(match, { expires: Date.now() + windowMs, sessionTimeoutMs });
  }

  revoke(match) { this.expected.delete(match); }

  takeMatch(match) {
    const e = typeof match === "string" ? this.expected.get(match) : undefined;
    if (!e) return null;
    this.expected.delete(match);
    return e.expires >= Date.now() ? e : null;
  }

  /** Serve one connection: handshake, then the session if the device is free. `relayed`: the connection came
   * through the tracker, so its HELLO must carry a match token the tracker announced. */
  async serve(transport, { relayed = false } = {}) {
    const conn = new FramedConnection(transport);
    let grant = null;
    const accepted = await serverHandshake(conn, {
      token: this.opts.token ?? null,
      handshakeTimeoutMs: this.opts.handshakeTimeoutMs,
      busy: () => this.busy,
      acceptMatch: (match) => {
        if (!relayed && match === null) return true;      // a direct connection (--port), token rules apply
        grant = this.takeMatch(match);
        return grant !== null;
      },
    }, this.sessions + 1);
    if (accepted === null) return;
    this.busy = true;
    this.sessions++;
    this.opts.onState?.("busy", accepted.client);
    this.tracker?.sessionStarted(accepted.match);
    const handler = new SessionHandler({ deviceInfo: () => this.deviceInfo(), memoryBytes: this.opts.memoryBytes,
      diskBytes: this.opts.diskBytes, handles: this.opts.handles });
    try {
      await serveCalls(conn, handler, { idleTimeoutMs: this.opts.idleTimeoutMs, sessionTimeoutMs: grant?.sessionTimeoutMs });
    } finally {
      conn.close();
      this.busy = false;
      this.opts.onState?.("free", `${this.sessions} session(s) served`);
      this.tracker?.sessionEnded();
    }
  }
}
