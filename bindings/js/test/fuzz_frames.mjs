// Mutated frames through the JS frame decoder (bindings/js/src/msgpack.js), as the Java decoder's fuzz batch:
// every valid vector of tests/vectors/frames.json, with bytes flipped, lengths and type bytes aimed at, truncated
// or extended, must decode or be refused with ProtocolError / FrameTooLarge (or wait for more bytes) - never
// another exception, never a hang. Deterministic (seeded). Prints {"frames": n, "refused": k, "crashes": [...]}.
// Usage: node bindings/js/test/fuzz_frames.mjs [count]
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as mp from "../src/msgpack.js";

const count = Number(process.argv[2] ?? 5000);
const doc = JSON.parse(readFileSync(fileURLToPath(new URL("../../../tests/vectors/frames.json", import.meta.url)), "utf8"));
const seeds = doc.valid.map((v) => Uint8Array.from(v.hex.match(/../g), (x) => parseInt(x, 16)));
let state = 12345;
const rand = (n) => { state = (state * 1103515245 + 12345) >>> 0; return state % n; };
// msgpack type bytes and lengths worth aiming at: container headers, big sizes, ext types, float32
const SPECIAL = [0xc1, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xcf, 0xd3, 0xd4, 0xd8, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xff, 0x00, 0x7f, 0x80, 0x90, 0xa0];

function mutate(seed) {
  let b = Array.from(seed);
  const n = 1 + rand(4);
  for (let i = 0; i < n; i++) {
    const at = rand(b.length);
    switch (rand(6)) {
      case 0: b[at] = rand(256); break;
      case 1: b[at] = SPECIAL[rand(SPECIAL.length)]; break;
      case 2: b = b.slice(0, at); break;
      case 3: b.splice(at, 0, ...Array.from({ length: 1 + rand(8) }, () => rand(256))); break;
      case 4: b.splice(at, 0, 0xff, 0xff, 0xff, 0xff); break;
      default: if (b.length > 4) { const len = b.length - 4; b[0] = len >>> 24; b[1] = (len >>> 16) & 255; b[2] = (len >>> 8) & 255; b[3] = len & 255; }
    }
  }
  return Uint8Array.from(b);
}

const crashes = [];
let refused = 0;
for (let i = 0; i < count; i++) {
  const frame = mutate(seeds[i % seeds.length]);
  const buf = new mp.FrameBuffer(i % 2 ? mp.DEFAULT_LIMITS : mp.HANDSHAKE_LIMITS);
  buf.feed(frame);
  try {
    for (let k = 0; k < 4 && buf.next() !== null; k++) { /* a frame may split into several */ }
  } catch (e) {
    if (e instanceof mp.ProtocolError) refused++;
    else if (crashes.length < 10) crashes.push(`${Buffer.from(frame).toString("hex")}: ${e?.stack ?? e}`);
    else crashes.push("...");
  }
}
console.log(JSON.stringify({ frames: count, refused, crashes }));
process.exit(crashes.length ? 1 : 0);
