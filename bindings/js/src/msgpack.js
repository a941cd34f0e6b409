// The tether wire codec: msgpack with minimal-size encodings, ext 1 (tensor) and ext 2 (remote handle), every
// limit of docs/protocol.md checked before anything is allocated for it, and explicit floats.
//
// Values, both ways:
//   null, true/false, strings (UTF-8 str), Uint8Array (bin), arrays, Map (decoded maps are always Map, so their
//   key order survives even for keys like "1"; the encoder also takes plain objects), Handle (ext 2),
//   Tensor (ext 1).
// Numbers: JavaScript has one number type, msgpack has ints and floats, and the protocol keeps them apart (an
//   echo of 2.0 must come back as a float). So:
//   - encode: a plain number that is an integer goes out as an int, any other number (1.5, NaN, Infinity) as a
//     float64; a Float64 (src/float.js) always as a float64, even when integral; a bigint as an int.
//   - decode: an int comes back as a number (a bigint when outside Number.MAX_SAFE_INTEGER); a float that is
//     integral (2.0, -0.0) comes back as a Float64, any other float as a plain number. Decoding and encoding
//     again therefore reproduces the bytes; code that only reads a float uses toNumber().
import { Float64 } from "./float.js";

export class ProtocolError extends Error {
  constructor(message) { super(message); this.name = "ProtocolError"; this.type = "ProtocolError"; }
}

export class FrameTooLarge extends ProtocolError {
  constructor(message) { super(message); this.name = "FrameTooLarge"; this.type = "FrameTooLarge"; }
}

/** A remote object (array, module, function, graph) named by its unsigned 64-bit id. */
export class Handle {
  constructor(id) {
    const big = BigInt(id);
    if (big < 0n || big >= 1n << 64n) throw new ProtocolError(`a remote handle id must be an unsigned 64-bit int, got ${id}`);
    this.id = big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
  }
  toString() { return `Handle(${this.id})`; }
}

// dtype -> element size in bytes (docs/protocol.md, "Extension types").
export const WIRE_DTYPES = Object.freeze({
  bool: 1, int8: 1, int16: 2, int32: 4, int64: 8, uint8: 1, uint16: 2, uint32: 4, uint64: 8,
  float16: 2, bfloat16: 2, float32: 4, float64: 8,
});

/** A tensor on the wire: dtype name, shape (numbers), raw little-endian C-order element bytes. */
export class Tensor {
  constructor(dtype, shape, data) {
    const itemsize = WIRE_DTYPES[dtype];
    if (itemsize === undefined) throw new ProtocolError(`dtype ${JSON.stringify(dtype)} cannot travel as a tensor (allowed: ${Object.keys(WIRE_DTYPES).join(", ")})`);
    const size = shape.reduce((a, b) => a * b, 1);
    if (data.byteLength !== size * itemsize) {
      throw new ProtocolError(`tensor of shape [${shape}] ${dtype} needs ${size * itemsize} bytes, carries ${data.byteLength}`);
    }
    this.dtype = dtype;
    this.shape = shape.map(Number);
    this.data = data instanceof Uint8Array ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  }
  get size() { return this.shape.reduce((a, b) => a * b, 1); }
}

/** Upper bounds on what a peer may make us allocate (docs/protocol.md, "Limits"). */
export class Limits {
  constructor(o = {}) {
    this.maxFrame = o.maxFrame ?? 16 * 2 ** 20;
    this.maxBulk = o.maxBulk ?? 4 * 2 ** 30;
    this.maxStr = o.maxStr ?? 2 ** 20;
    this.maxBin = o.maxBin ?? 16 * 2 ** 20;
    this.maxArray = o.maxArray ?? 2 ** 16;
    this.maxMap = o.maxMap ?? 2 ** 12;
    this.maxExt = o.maxExt ?? 16 * 2 ** 20;
    this.maxDepth = o.maxDepth ?? 32;
    this.maxNdim = o.maxNdim ?? 32;
    Object.freeze(this);
  }
}
export const DEFAULT_LIMITS = new Limits();
export const HANDSHAKE_LIMITS = new Limits({ maxFrame: 64 << 10, maxBulk: 0, maxStr: 4096, maxBin: 4096, maxArray: 64, maxMap: 32, maxExt: 0, maxDepth: 4 });
export const TRACKER_LIMITS = new Limits({ maxFrame: 8 << 20, maxBulk: 0, maxStr: 64 << 10, maxBin: 4096, maxArray: 1 << 16, maxMap: 1 << 12, maxExt: 0, maxDepth: 8 });

/** A float's value, whether it arrived as a Float64 or a plain number. */
export function toNumber(v) {
  if (v instanceof Float64) return typeof v.value === "number" ? v.value : Number(v.valueOf());
  if (typeof v === "bigint") return Number(v);
  return v;
}

/** True for a number, bigint or Float64 that is integral and not a Float64 (what the wire calls an int). */
export function isInt(v) {
  return typeof v === "bigint" || (typeof v === "number" && Number.isInteger(v));
}

const TEXT_ENCODER = new TextEncoder();
const TEXT_DECODER = new TextDecoder("utf-8", { fatal: true });

// ---------------------------------------------------------------------------------------------------------------
// encoding

class Writer {
  constructor(size = 256) { this.buf = new Uint8Array(size); this.view = new DataView(this.buf.buffer); this.pos = 0; }
  reserve(n) {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(x) { this.reserve(1); this.buf[this.pos++] = x; }
  u16(x) { this.reserve(2); this.view.setUint16(this.pos, x); this.pos += 2; }
  u32(x) { this.reserve(4); this.view.setUint32(this.pos, x); this.pos += 4; }
  u64(x) { this.reserve(8); this.view.setBigUint64(this.pos, BigInt(x)); this.pos += 8; }
  i64(x) { this.reserve(8); this.view.setBigInt64(this.pos, BigInt(x)); this.pos += 8; }
  f64(x) { this.reserve(8); this.view.setFloat64(this.pos, x); this.pos += 8; }
  bytes(b) { this.reserve(b.length); this.buf.set(b, this.pos); this.pos += b.length; }
  result() { return this.buf.subarray(0, this.pos); }
}

function encodeInt(w, v) {
  if (typeof v === "number") {
    if (v >= 0) {
      if (v < 128) w.u8(v);
      else if (v < 256) { w.u8(0xcc); w.u8(v); }
      else if (v < 65536) { w.u8(0xcd); w.u16(v); }
      else if (v < 2 ** 32) { w.u8(0xce); w.u32(v); }
      else { w.u8(0xcf); w.u64(v); }
    } else if (v >= -32) w.u8(v & 0xff);
    else if (v >= -128) { w.u8(0xd0); w.u8(v & 0xff); }
    else if (v >= -32768) { w.u8(0xd1); w.u16(v & 0xffff); }
    else if (v >= -(2 ** 31)) { w.u8(0xd2); w.u32(v >>> 0); }
    else { w.u8(0xd3); w.i64(v); }
    return;
  }
  // bigint
  if (v >= 0n) {
    if (v >= 1n << 64n) throw new TypeError(`cannot send ${v}: larger than an unsigned 64-bit int`);
    if (v <= BigInt(Number.MAX_SAFE_INTEGER)) return encodeInt(w, Number(v));
    w.u8(0xcf); w.u64(v);
  } else {
    if (v < -(1n << 63n)) throw new TypeError(`cannot send ${v}: smaller than a signed 64-bit int`);
    if (v >= BigInt(Number.MIN_SAFE_INTEGER)) return encodeInt(w, Number(v));
    w.u8(0xd3); w.i64(v);
  }
}

function encodeHeader(w, n, fix, fixMax, c8, c16, c32) {
  if (n <= fixMax && fix !== null) w.u8(fix | n);
  else if (n < 256 && c8 !== null) { w.u8(c8); w.u8(n); }
  else if (n < 65536) { w.u8(c16); w.u16(n); }
  else { w.u8(c32); w.u32(n); }
}

function encodeExt(w, type, data) {
  const n = data.length;
  const fixed = { 1: 0xd4, 2: 0xd5, 4: 0xd6, 8: 0xd7, 16: 0xd8 }[n];
  if (fixed !== undefined) w.u8(fixed);
  else if (n < 256) { w.u8(0xc7); w.u8(n); }
  else if (n < 65536) { w.u8(0xc8); w.u16(n); }
  else { w.u8(0xc9); w.u32(n); }
  w.u8(type);
  w.bytes(data);
}

function tensorExt(t) {
  const name = TEXT_ENCODER.encode(t.dtype);
  const head = new Uint8Array(2 + name.length + 8 * t.shape.length);
  const dv = new DataView(head.buffer);
  head[0] = name.length;
  head.set(name, 1);
  head[1 + name.length] = t.shape.length;
  t.shape.forEach((d, i) => dv.setBigUint64(2 + name.length + 8 * i, BigInt(d)));
  const out = new Uint8Array(head.length + t.data.byteLength);
  out.set(head);
  out.set(t.data, head.length);
  return out;
}

function encodeValue(w, v) {
  if (v === null || v === undefined) w.u8(0xc0);
  else if (v === true) w.u8(0xc3);
  else if (v === false) w.u8(0xc2);
  else if (typeof v === "number") {
    if (Number.isInteger(v) && Number.isSafeInteger(v) && !Object.is(v, -0)) encodeInt(w, v);
    else if (Number.isInteger(v) && !Object.is(v, -0) && Math.abs(v) < 2 ** 64) encodeInt(w, BigInt(v));
    else { w.u8(0xcb); w.f64(v); }
  } else if (typeof v === "bigint") encodeInt(w, v);
  else if (v instanceof Float64) { w.u8(0xcb); w.f64(toNumber(v)); }
  else if (typeof v === "string") {
    const b = TEXT_ENCODER.encode(v);
    encodeHeader(w, b.length, 0xa0, 31, 0xd9, 0xda, 0xdb);
    w.bytes(b);
  } else if (v instanceof Uint8Array) {
    encodeHeader(w, v.length, null, -1, 0xc4, 0xc5, 0xc6);
    w.bytes(v);
  } else if (v instanceof ArrayBuffer) encodeValue(w, new Uint8Array(v));
  else if (Array.isArray(v)) {
    encodeHeader(w, v.length, 0x90, 15, null, 0xdc, 0xdd);
    for (const x of v) encodeValue(w, x);
  } else if (v instanceof Handle) {
    const d = new Uint8Array(8);
    new DataView(d.buffer).setBigUint64(0, BigInt(v.id));
    encodeExt(w, 2, d);
  } else if (v instanceof Tensor) encodeExt(w, 1, tensorExt(v));
  else if (v instanceof Map) {
    encodeHeader(w, v.size, 0x80, 15, null, 0xde, 0xdf);
    for (const [k, x] of v) {
      if (typeof k !== "string") throw new TypeError(`map keys must be strings, got ${typeof k}`);
      encodeValue(w, k);
      encodeValue(w, x);
    }
  } else if (typeof v === "object" && (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null)) {
    const keys = Object.keys(v);
    encodeHeader(w, keys.length, 0x80, 15, null, 0xde, 0xdf);
    for (const k of keys) { encodeValue(w, k); encodeValue(w, v[k]); }
  } else {
    throw new TypeError(`cannot send ${v?.constructor?.name ?? typeof v} over tether rpc (use numbers, strings, Uint8Array, arrays, Map, Tensor, Handle)`);
  }
}

/** One value as msgpack bytes. */
export function encode(value) {
  const w = new Writer();
  encodeValue(w, value);
  return w.result();
}

/** A whole frame: 4-byte big-endian length + msgpack [msgType, requestId, payload]. */
export function encodeFrame(msgType, requestId, payload = {}) {
  const w = new Writer(64);
  w.u32(0);
  w.u8(0x93);
  encodeInt(w, msgType);
  encodeInt(w, typeof requestId === "bigint" ? requestId : Number(requestId));
  encodeValue(w, payload);
  const out = w.result();
  new DataView(out.buffer, out.byteOffset).setUint32(0, out.length - 4);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// decoding

class Reader {
  constructor(bytes, limits) {
    this.b = bytes;
    this.dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
    this.limits = limits;
  }
  need(n) {
    if (this.pos + n > this.b.length) throw new ProtocolError("truncated msgpack: the frame ends inside a value");
  }
  u8() { this.need(1); return this.b[this.pos++]; }
  u16() { this.need(2); const x = this.dv.getUint16(this.pos); this.pos += 2; return x; }
  u32() { this.need(4); const x = this.dv.getUint32(this.pos); this.pos += 4; return x; }
  take(n) { this.need(n); const s = this.b.subarray(this.pos, this.pos + n); this.pos += n; return s; }
}

function smallInt(big) {
  return big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
}

function floatValue(x) {
  return Number.isInteger(x) ? new Float64(x) : x;
}

function decodeTensor(data, limits) {
  const dv = new DataView(data.buffer, data.byteOffset, data.byteLength);
  if (data.length < 1 || data.length < 1 + data[0] + 1) throw new ProtocolError("malformed tensor ext: truncated or non-ascii dtype");
  const nameBytes = data.subarray(1, 1 + data[0]);
  if (nameBytes.some((c) => c > 127)) throw new ProtocolError("malformed tensor ext: truncated or non-ascii dtype");
  const dtype = String.fromCharCode(...nameBytes);
  const itemsize = Object.hasOwn(WIRE_DTYPES, dtype) ? WIRE_DTYPES[dtype] : undefined;
  if (itemsize === undefined) throw new ProtocolError(`tensor ext names dtype ${JSON.stringify(dtype)}, which is not accepted`);
  let pos = 1 + data[0];
  const ndim = data[pos++];
  if (ndim > limits.maxNdim) throw new ProtocolError(`tensor ext has ${ndim} dimensions (limit ${limits.maxNdim})`);
  if (pos + 8 * ndim > data.length) throw new ProtocolError("malformed tensor ext: shape truncated");
  const shape = [];
  let size = 1n;
  for (let i = 0; i < ndim; i++) {
    const d = dv.getBigUint64(pos);
    pos += 8;
    shape.push(d);
    size *= d;
  }
  const carried = BigInt(data.length - pos);
  if (size * BigInt(itemsize) !== carried) {
    throw new ProtocolError(`tensor ext of shape [${shape.join(", ")}] ${dtype} needs ${size * BigInt(itemsize)} bytes, carries ${carried}`);
  }
  // the sizes agree, so every extent is small enough for a number; copy the elements out of the frame
  return new Tensor(dtype, shape.map(Number), data.slice(pos));
}

function decodeValue(r, depth) {
  const L = r.limits;
  const c = r.u8();
  if (c <= 0x7f) return c;
  if (c >= 0xe0) return c - 256;
  if ((c & 0xe0) === 0xa0) return decodeStr(r, c & 0x1f);
  if ((c & 0xf0) === 0x90) return decodeArray(r, c & 0x0f, depth);
  if ((c & 0xf0) === 0x80) return decodeMap(r, c & 0x0f, depth);
  switch (c) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: case 0xc5: case 0xc6: {
      const n = c === 0xc4 ? r.u8() : c === 0xc5 ? r.u16() : r.u32();
      if (n > L.maxBin) throw new ProtocolError(`bin of ${n} bytes exceeds the limit of ${L.maxBin}`);
      return r.take(n).slice();
    }
    case 0xc7: case 0xc8: case 0xc9: return decodeExt(r, c === 0xc7 ? r.u8() : c === 0xc8 ? r.u16() : r.u32());
    case 0xca: { r.need(4); const x = r.dv.getFloat32(r.pos); r.pos += 4; return floatValue(x); }
    case 0xcb: { r.need(8); const x = r.dv.getFloat64(r.pos); r.pos += 8; return floatValue(x); }
    case 0xcc: return r.u8();
    case 0xcd: return r.u16();
    case 0xce: return r.u32();
    case 0xcf: { r.need(8); const x = r.dv.getBigUint64(r.pos); r.pos += 8; return smallInt(x); }
    case 0xd0: { r.need(1); const x = r.dv.getInt8(r.pos); r.pos += 1; return x; }
    case 0xd1: { r.need(2); const x = r.dv.getInt16(r.pos); r.pos += 2; return x; }
    case 0xd2: { r.need(4); const x = r.dv.getInt32(r.pos); r.pos += 4; return x; }
    case 0xd3: { r.need(8); const x = r.dv.getBigInt64(r.pos); r.pos += 8; return smallInt(x); }
    case 0xd4: return decodeExt(r, 1);
    case 0xd5: return decodeExt(r, 2);
    case 0xd6: return decodeExt(r, 4);
    case 0xd7: return decodeExt(r, 8);
    case 0xd8: return decodeExt(r, 16);
    case 0xd9: return decodeStr(r, r.u8());
    case 0xda: return decodeStr(r, r.u16());
    case 0xdb: return decodeStr(r, r.u32());
    case 0xdc: return decodeArray(r, r.u16(), depth);
    case 0xdd: return decodeArray(r, r.u32(), depth);
    case 0xde: return decodeMap(r, r.u16(), depth);
    case 0xdf: return decodeMap(r, r.u32(), depth);
    default: throw new ProtocolError(`invalid msgpack type byte 0x${c.toString(16)}`);
  }
}

function decodeStr(r, n) {
  if (n > r.limits.maxStr) throw new ProtocolError(`str of ${n} bytes exceeds the limit of ${r.limits.maxStr}`);
  try {
    return TEXT_DECODER.decode(r.take(n));
  } catch (e) {
    if (e instanceof ProtocolError) throw e;
    throw new ProtocolError("str is not valid UTF-8");
  }
}

function decodeExt(r, n) {
  const type = r.dv.getInt8(r.pos);
  r.need(1);
  r.pos += 1;
  if (type !== 1 && type !== 2) throw new ProtocolError(`unknown msgpack ext type ${type}`);
  if (n > r.limits.maxExt) throw new ProtocolError(`ext of ${n} bytes exceeds the limit of ${r.limits.maxExt}`);
  const data = r.take(n);
  if (type === 2) {
    if (n !== 8) throw new ProtocolError(`handle ext must carry 8 bytes, got ${n}`);
    return new Handle(new DataView(data.buffer, data.byteOffset, 8).getBigUint64(0));
  }
  return decodeTensor(data, r.limits);
}

function decodeArray(r, n, depth) {
  if (n > r.limits.maxArray) throw new ProtocolError(`array of ${n} items exceeds the limit of ${r.limits.maxArray}`);
  if (depth + 1 > r.limits.maxDepth) throw new ProtocolError(`frame nests deeper than ${r.limits.maxDepth} levels`);
  if (n > r.b.length - r.pos) throw new ProtocolError("truncated msgpack: the frame ends inside a value");
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = decodeValue(r, depth + 1);
  return out;
}

function decodeMap(r, n, depth) {
  if (n > r.limits.maxMap) throw new ProtocolError(`map of ${n} entries exceeds the limit of ${r.limits.maxMap}`);
  if (depth + 1 > r.limits.maxDepth) throw new ProtocolError(`frame nests deeper than ${r.limits.maxDepth} levels`);
  if (2 * n > r.b.length - r.pos) throw new ProtocolError("truncated msgpack: the frame ends inside a value");
  const out = new Map();
  for (let i = 0; i < n; i++) {
    const k = decodeValue(r, depth + 1);
    if (typeof k !== "string") throw new ProtocolError(`map keys must be strings, got ${k instanceof Uint8Array ? "bin" : typeof k}`);
    out.set(k, decodeValue(r, depth + 1));
  }
  return out;
}

/** One msgpack value from bytes (the whole input must be one value). */
export function decode(bytes, limits = DEFAULT_LIMITS, depth = 0) {
  const r = new Reader(bytes, limits);
  const v = decodeValue(r, depth);
  if (r.pos !== bytes.length) throw new ProtocolError(`${bytes.length - r.pos} trailing bytes after the msgpack value`);
  return v;
}

/** A frame body -> {msgType, requestId, payload (a Map)}; the payload map is nesting level 1. */
export function decodeBody(body, limits = DEFAULT_LIMITS) {
  const r = new Reader(body, limits);
  if (body.length < 1 || body[0] !== 0x93) throw new ProtocolError("a frame body must be a msgpack array [msg_type, request_id, payload]");
  r.pos = 1;
  const msgType = decodeValue(r, 0);
  const requestId = decodeValue(r, 0);
  if (typeof msgType !== "number" || !Number.isInteger(msgType)) throw new ProtocolError("msg_type must be an int");
  if (!isInt(requestId)) throw new ProtocolError("request_id must be an int");
  if (requestId < 0) throw new ProtocolError(`request_id must be an unsigned 64-bit int, got ${requestId}`);
  const payload = decodeValue(r, 0);
  if (!(payload instanceof Map)) throw new ProtocolError("a frame payload must be a map");
  if (r.pos !== body.length) throw new ProtocolError(`${body.length - r.pos} trailing bytes after the frame body`);
  return { msgType, requestId, payload };
}

/** Sans-IO frame reader: feed() bytes, next() returns a frame or null (needs more bytes); bulk bytes are taken
 * with takeBulk(n) after a frame that announced them. Sizes are checked before buffering a body. */
export class FrameBuffer {
  constructor(limits = DEFAULT_LIMITS) {
    this.limits = limits;
    this.chunks = [];
    this.length = 0;
  }
  feed(bytes) { if (bytes.length) { this.chunks.push(bytes); this.length += bytes.length; } }
  peek(n) {
    // the first n bytes as one array (joins chunks only as far as needed); an empty body is a frame too
    if (n === 0) return new Uint8Array(0);
    if (this.chunks[0].length >= n) return this.chunks[0].subarray(0, n);
    const out = new Uint8Array(n);
    let pos = 0;
    for (const c of this.chunks) {
      const take = Math.min(c.length, n - pos);
      out.set(c.subarray(0, take), pos);
      pos += take;
      if (pos === n) break;
    }
    return out;
  }
  take(n) {
    const out = this.peek(n).slice();
    let left = n;
    while (left > 0) {
      const c = this.chunks[0];
      if (c.length <= left) { this.chunks.shift(); left -= c.length; } else { this.chunks[0] = c.subarray(left); left = 0; }
    }
    this.length -= n;
    return out;
  }
  /** Bytes the next frame still needs (0: next() will return it). Throws FrameTooLarge for a big header. */
  missing() {
    if (this.length < 4) return 4 - this.length;
    const h = this.peek(4);
    const n = new DataView(h.buffer, h.byteOffset, 4).getUint32(0);
    if (n > this.limits.maxFrame) throw new FrameTooLarge(`frame of ${n} bytes exceeds the limit of ${this.limits.maxFrame}`);
    return Math.max(0, 4 + n - this.length);
  }
  next() {
    if (this.missing() > 0) return null;
    const h = this.take(4);
    const n = new DataView(h.buffer, h.byteOffset, 4).getUint32(0);
    return decodeBody(this.take(n), this.limits);
  }
  /** Up to n buffered bytes (for bulk data that follows a frame). */
  takeUpTo(n) { return this.take(Math.min(n, this.length)); }
}

/** The bulk byte count a payload announces, checked against the limit (docs/protocol.md, "Frames"). */
export function bulkSize(payload, limits = DEFAULT_LIMITS) {
  if (!payload.has("nbytes")) return 0;
  const n = payload.get("nbytes");
  if (!isInt(n) || n < 0) throw new ProtocolError("nbytes must be a non-negative int");
  if (Number(n) > limits.maxBulk) throw new FrameTooLarge(`${n} bulk bytes exceed the limit of ${limits.maxBulk}`);
  return Number(n);
}
