// Frames over a byte stream: the core message types, ERROR payloads, and FramedConnection, which reads frames and
// bulk bytes from any transport (node/transport_node.js: TCP, node-only; src/transport_ws.js: a browser WebSocket) with the
// limits of docs/protocol.md checked before anything is buffered for them.
//
// A transport is a small object: onData(cb(Uint8Array)), onClose(cb()), write(Uint8Array) (one write per
// frame, as docs/protocol.md asks), close(), and a readable `peer` string.
import { FrameBuffer, ProtocolError, encodeFrame, DEFAULT_LIMITS } from "./msgpack.js";

export const PROTOCOL_MAGIC = "tether-rpc";
export const PROTOCOL_VERSION = 1;
export const CAPABILITIES = ["bulk", "events", "tensor-ext", "handle-ext", "auth-hmac-sha256"];

export const MsgType = Object.freeze({ HELLO: 1, CHALLENGE: 2, AUTH: 3, WELCOME: 4, CALL: 5, RETURN: 6, ERROR: 7, EVENT: 8, CLOSE: 9 });

/** An error that travels as ERROR {type, message}; `type` is the protocol's name for it (docs/protocol.md). */
export class RemoteError extends Error {
  constructor(type, message) { super(message); this.name = type; this.type = type; }
}

export class TimeoutError extends RemoteError {
  constructor(message) { super("TetherTimeout", message); }
}

/** The ERROR payload for an exception: its protocol type (a JS TypeError/RangeError keep the Python names). */
export function errorPayload(err) {
  let type = err?.type;
  if (!type) {
    type = { TypeError: "TypeError", RangeError: "ValueError", SyntaxError: "ValueError" }[err?.name] ?? (err?.name && err.name !== "Error" ? err.name : "RuntimeError");
  }
  return { type, message: String(err?.message ?? err), traceback: String(err?.stack ?? "") };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export { sleep };

export class FramedConnection {
  constructor(transport, limits = DEFAULT_LIMITS) {
    this.transport = transport;
    this.buffer = new FrameBuffer(limits);
    this.eof = false;
    this.wake = null;
    this.peer = transport.peer ?? "?";
    transport.onData((bytes) => { this.buffer.feed(bytes); this._wake(); });
    transport.onClose(() => { this.eof = true; this._wake(); });
  }

  set limits(l) { this.buffer.limits = l; }
  get limits() { return this.buffer.limits; }

  _wake() { const w = this.wake; this.wake = null; if (w) w(); }

  async _waitData(deadline) {
    if (this.eof) return false;
    const timeout = deadline === undefined ? null : deadline - Date.now();
    if (timeout !== null && timeout <= 0) throw new TimeoutError("timed out waiting for the peer");
    let timer;
    await new Promise((resolve) => {
      this.wake = resolve;
      if (timeout !== null) timer = setTimeout(resolve, timeout);
    });
    clearTimeout(timer);
    return true;
  }

  /** The next frame {msgType, requestId, payload}, or null when the peer closed the connection between frames.
   * `deadline` (a Date.now() value) bounds the wait with a TimeoutError. */
  async nextFrame(deadline) {
    for (;;) {
      const f = this.buffer.next();
      if (f !== null) return f;
      if (this.eof) {
        if (this.buffer.length === 0) return null;
        throw new ProtocolError(`the connection closed inside a frame (${this.buffer.length} bytes buffered)`);
      }
      await this._waitData(deadline);
    }
  }

  /** Resolves when the peer sends anything or closes (a queued client must stay silent: docs/protocol.md). */
  async activity() {
    if (this.buffer.length || this.eof) return;
    await this._waitData();
  }

  /** Exactly n bulk bytes that follow a frame (the caller checked n against its limits). */
  async readBulk(n, deadline) {
    const out = new Uint8Array(n);
    let pos = 0;
    while (pos < n) {
      if (this.buffer.length) {
        const piece = this.buffer.takeUpTo(n - pos);
        out.set(piece, pos);
        pos += piece.length;
        continue;
      }
      if (this.eof) throw new ProtocolError(`the connection closed after ${pos} of ${n} bulk bytes`);
      await this._waitData(deadline);
    }
    return out;
  }

  /** Read and discard n bulk bytes (keeps the stream in step when a call refuses its bytes). */
  async skip(n, deadline) {
    let left = n;
    while (left > 0) {
      if (this.buffer.length) { left -= this.buffer.takeUpTo(Math.min(left, 1 << 20)).length; continue; }
      if (this.eof) throw new ProtocolError("the connection closed inside bulk bytes");
      await this._waitData(deadline);
    }
  }

  /** Send one frame (and optional bulk bytes right behind it). */
  send(msgType, requestId, payload, bulk) {
    if (this.eof) return;
    const frame = encodeFrame(msgType, requestId, payload);
    if (bulk && bulk.length && bulk.length <= 64 << 10) {
      const both = new Uint8Array(frame.length + bulk.length);
      both.set(frame);
      both.set(bulk, frame.length);
      this.transport.write(both);
    } else {
      this.transport.write(frame);
      if (bulk && bulk.length) this.transport.write(bulk);
    }
  }

  sendError(requestId, err) { this.send(MsgType.ERROR, requestId, errorPayload(err)); }

  close() { this.eof = true; this.transport.close(); this._wake(); }
}
