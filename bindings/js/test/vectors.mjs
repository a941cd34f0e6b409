// Round-trips every frame of tests/vectors/frames.json through the JS codec (bindings/js/src/msgpack.js):
// each valid frame decodes to its meaning (floats where the meaning says {"$float": x}, ints elsewhere) and
// encodes back to the same bytes; each invalid frame is refused with the named error. Prints a JSON summary.
// Usage: node bindings/js/test/vectors.mjs [frames.json]
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as mp from "../src/msgpack.js";
import { Float64 } from "../src/float.js";

const path = process.argv[2] ?? fileURLToPath(new URL("../../../tests/vectors/frames.json", import.meta.url));
const doc = JSON.parse(readFileSync(path, "utf8"));
const unhex = (h) => Uint8Array.from(h.match(/../g) ?? [], (x) => parseInt(x, 16));
const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

// JSON meaning -> wire value. JSON.parse cannot tell 2.0 from 2, which is why the file tags every float.
function toWire(v) {
  if (Array.isArray(v)) return v.map(toWire);
  if (v !== null && typeof v === "object") {
    const keys = Object.keys(v);
    if (keys.length === 1 && keys[0] === "$bin") return unhex(v.$bin);
    if (keys.length === 1 && keys[0] === "$handle") return new mp.Handle(v.$handle);
    if (keys.length === 1 && keys[0] === "$float") return Number.isInteger(v.$float) ? new Float64(v.$float) : v.$float;
    if (keys.length === 1 && keys[0] === "$tensor") return new mp.Tensor(v.$tensor.dtype, v.$tensor.shape, unhex(v.$tensor.data));
    return new Map(keys.map((k) => [k, toWire(v[k])]));
  }
  return v;
}

function same(a, b, where) {
  const fail = (why) => { throw new Error(`${where}: ${why}`); };
  if (b instanceof Map) {
    if (!(a instanceof Map)) fail("not a map");
    if (JSON.stringify([...a.keys()]) !== JSON.stringify([...b.keys()])) fail(`keys ${[...a.keys()]} != ${[...b.keys()]}`);
    for (const k of b.keys()) same(a.get(k), b.get(k), `${where}.${k}`);
  } else if (Array.isArray(b)) {
    if (!Array.isArray(a) || a.length !== b.length) fail("list length");
    b.forEach((x, i) => same(a[i], x, `${where}[${i}]`));
  } else if (b instanceof Uint8Array) {
    if (!(a instanceof Uint8Array) || hex(a) !== hex(b)) fail("bin differs");
  } else if (b instanceof mp.Handle) {
    if (!(a instanceof mp.Handle) || a.id !== b.id) fail("handle differs");
  } else if (b instanceof mp.Tensor) {
    if (!(a instanceof mp.Tensor) || a.dtype !== b.dtype || JSON.stringify(a.shape) !== JSON.stringify(b.shape) || hex(a.data) !== hex(b.data)) fail("tensor differs");
  } else if (b instanceof Float64) {
    if (!(a instanceof Float64) || !Object.is(mp.toNumber(a), mp.toNumber(b))) fail(`want float ${mp.toNumber(b)}, got ${a}`);
  } else if (typeof b === "number" && !Number.isInteger(b)) {
    if (typeof a !== "number" || !Object.is(a, b)) fail(`want float ${b}, got ${a}`);
  } else if (a !== b) fail(`${a} (${typeof a}) != ${b} (${typeof b})`);
}

const failures = [];
let checked = 0;
for (const v of doc.valid) {
  try {
    const raw = unhex(v.hex);
    const buf = new mp.FrameBuffer();
    buf.feed(raw);
    const f = buf.next();
    if (f === null || buf.length !== 0) throw new Error("did not decode to exactly one frame");
    const m = v.meaning;
    if (f.msgType !== m.msg_type || f.requestId !== m.request_id) throw new Error(`header ${f.msgType} ${f.requestId}`);
    const want = toWire(m.payload);
    same(f.payload, want, "payload");
    const enc = mp.encodeFrame(m.msg_type, m.request_id, want);
    if (hex(enc) !== v.hex) throw new Error(`encodes to ${hex(enc)}, want ${v.hex}`);
    const again = mp.encodeFrame(f.msgType, f.requestId, f.payload);
    if (hex(again) !== v.hex) throw new Error(`re-encoding the decoded frame gives ${hex(again)}`);
    checked++;
  } catch (e) {
    failures.push(`${v.name}: ${e.message}`);
  }
}
for (const v of doc.invalid) {
  const buf = new mp.FrameBuffer();
  buf.feed(unhex(v.hex));
  let got;
  try {
    got = buf.next() === null ? "Incomplete" : "ok";
  } catch (e) {
    got = e instanceof mp.FrameTooLarge ? "FrameTooLarge" : e instanceof mp.ProtocolError ? "ProtocolError" : `other: ${e}`;
  }
  if (got !== v.error) failures.push(`${v.name}: got ${got}, want ${v.error}`);
  else checked++;
}
console.log(JSON.stringify({ checked, failures }));
process.exit(failures.length ? 1 : 0);
