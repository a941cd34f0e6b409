// The JS device: serves one session at a time on whatever connection reaches it (a direct TCP listener in node,
// or a reverse-mode relay connection the tracker asked for), accepts only the one-time match tokens its tracker
// announced (src/tracker.js) on relayed connections, and describes itself in device_info.
import { FramedConnection, MsgType, RemoteError } from "./protocol.js";
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
  // globalThis.process: this file also runs in browsers, where there is no process
  const proc = globalThis.process;
  const isNode = !!proc?.versions?.node;
  const simd = simdSupported();
  const os = isNode && proc.getBuiltinModule ? proc.getBuiltinModule("node:os") : null;
  const info = {
    arch: "wasm32",
    os: isNode ? proc.platform : "browser",
    runtime: isNode ? "node" : "browser",
    runtime_version: isNode ? proc.version : (globalThis.navigator?.userAgent ?? ""),
    user_agent: globalThis.navigator?.userAgent ?? (isNode ? `node/${proc.version}` : ""),
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

/** Clients that may wait for the device at once; one more gets DeviceBusy (as rpc_server's --max-queue). */
export const MAX_QUEUE = 16;

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
    this.queue = [];             // {conn, resolve}: clients waiting for the device, in arrival order
  }

  /** Take the device for `conn`'s session: at once when it is free; else, with `wait`, after the sessions ahead
   * (EVENT queued {position} on request id 0 whenever the position changes); without `wait`, or with the queue
   * full, ERROR DeviceBusy. A queued client that sends anything or closes gives up its place (false). */
  async acquire(conn, wait) {
    if (!this.busy && this.queue.length === 0) {
      this.busy = true;
      return true;
    }
    if (!wait || this.queue.length >= MAX_QUEUE) {
      conn.sendError(0, new RemoteError("DeviceBusy", wait ? `the device's queue is full (${MAX_QUEUE} clients wait already)`
        : "the device is serving another session (connect with wait=True to queue)"));
      conn.close();
      return false;
    }
    let resolve;
    const turn = new Promise((r) => { resolve = r; });
    const entry = { conn, resolve };
    this.queue.push(entry);
    conn.send(MsgType.EVENT, 0, new Map([["kind", "queued"], ["position", this.queue.length]]));
    const gaveUp = conn.activity().then(() => "left");
    const outcome = await Promise.race([turn, gaveUp]);
    if (outcome === "left") {
      const at = this.queue.indexOf(entry);
      if (at >= 0) {
        this.queue.splice(at, 1);
        this.notifyQueue(at);
      } else {
        this.release();          // the turn came at the same moment: pass it on
      }
      conn.close();
      return false;
    }
    return true;
  }

  notifyQueue(from = 0) {
    for (let i = from; i < this.queue.length; i++) {
      this.queue[i].conn.send(MsgType.EVENT, 0, new Map([["kind", "queued"], ["position", i + 1]]));
    }
  }

  /** The session ended: the next queued client gets the device, or it is free. */
  release() {
    const next = this.queue.shift();
    if (next) {
      this.notifyQueue();
      next.resolve("turn");
    } else {
      this.busy = false;
    }
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
      acquire: (c, wait) => this.acquire(c, wait),
      acceptMatch: (match) => {
        if (!relayed && match === null) return true;      // a direct connection (--port), token rules apply
        grant = this.takeMatch(match);
        return grant !== null;
      },
    }, this.sessions + 1);
    if (accepted === null) return;
    this.sessions++;
    this.opts.onState?.("busy", accepted.client);
    this.tracker?.sessionStarted(accepted.match);
    const handler = new SessionHandler({ deviceInfo: () => this.deviceInfo(), memoryBytes: this.opts.memoryBytes,
      diskBytes: this.opts.diskBytes, handles: this.opts.handles });
    try {
      await serveCalls(conn, handler, { idleTimeoutMs: this.opts.idleTimeoutMs, sessionTimeoutMs: grant?.sessionTimeoutMs });
    } finally {
      conn.close();
      this.release();
      if (!this.busy) {
        this.opts.onState?.("free", `${this.sessions} session(s) served`);
        this.tracker?.sessionEnded();
      }
    }
  }
}
