import { test } from "node:test";
import assert from "node:assert/strict";
import { Allocator, OutOfMemory } from "../src/allocator.js";

test("allocator: 64-byte aligned, never 0, reuses and coalesces freed blocks", () => {
  const mem = new WebAssembly.Memory({ initial: 1 });
  const a = new Allocator(mem, 1000);
  const p = a.alloc(10);
  const q = a.alloc(100);
  const r = a.alloc(1);
  for (const x of [p, q, r]) {
    assert.equal(x % 64, 0);
    assert.ok(x >= 1000);
  }
  assert.equal(q - p, 64);
  assert.equal(r - q, 128);
  a.free(q);
  assert.equal(a.alloc(64), q, "first fit reuses the freed block");
  a.free(p);
  a.free(q);
  a.free(r);
  const s = a.stats();
  assert.equal(s.used, 0);
  assert.equal(s.freeBlocks, 1, "all blocks coalesced back into one");
  assert.throws(() => a.free(p), /not an allocated block/);
});

test("allocator: grows memory when nothing fits, and reports a memory that cannot grow", () => {
  const mem = new WebAssembly.Memory({ initial: 1, maximum: 4 });
  const a = new Allocator(mem, 64);
  const big = a.alloc(100000);
  assert.ok(mem.buffer.byteLength >= big + 100000);
  const u8 = new Uint8Array(mem.buffer);
  u8.fill(7, big, big + 100000);
  assert.throws(() => a.alloc(1 << 20), (e) => e instanceof OutOfMemory && /cannot grow linear memory/.test(e.message));
  a.free(big);
  assert.equal(a.alloc(100000), big);
});

test("allocator: reserve grows once for many blocks", () => {
  const mem = new WebAssembly.Memory({ initial: 1 });
  const a = new Allocator(mem, 64);
  a.reserve(10 * 65536);
  const size = mem.buffer.byteLength;
  assert.ok(size >= 11 * 65536 - 64);
  for (let k = 0; k < 10; k++) a.alloc(60000);
  assert.equal(mem.buffer.byteLength, size, "no further growth");
});
