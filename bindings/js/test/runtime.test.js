import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { loadModule, empty, fromTypedArray, Float64, KernelError, ArchMismatch, ModuleLoadError, hasSimd128, hasRelaxedSimd } from "../src/runtime.js";

const fixture = (name) => readFileSync(fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url)));
const load = () => loadModule(fixture("abi_kernels.wasm"), { name: "abi_kernels.wasm" });
const ramp = (n, f = (i) => i) => Float32Array.from({ length: n }, (_, i) => f(i));

test("a packed call computes in module memory; arrays move there once and stay", async () => {
  const m = await load();
  assert.deepEqual(m.functions, ["vadd", "scale", "text_info", "trap"]);
  assert.equal(m.metadata.target.arch, "wasm32");
  const a = fromTypedArray(ramp(1024));
  const b = fromTypedArray(ramp(1024, (i) => 0.25 * i));
  const c = empty([1024]);
  assert.equal(a.home, "host");
  const vadd = m.getFunction("vadd");
  vadd(a, b, c);
  assert.deepEqual(c.toTypedArray(), ramp(1024, (i) => i + 0.25 * i));
  assert.equal(a.home, "abi_kernels.wasm");
  const used = m.allocator.stats().used;
  vadd(a, b, c);
  vadd(c, b, c);
  assert.equal(m.allocator.stats().used, used, "repeated calls allocate nothing");
  assert.deepEqual(c.toTypedArray(), ramp(1024, (i) => i + 0.5 * i));
  // another module: the array is copied over, its first home freed
  const m2 = await load();
  m2.getFunction("vadd")(a, b, c);
  assert.equal(a.home, "abi_kernels.wasm");
  assert.ok(m.allocator.stats().used < used);
  assert.deepEqual(c.toTypedArray(), ramp(1024, (i) => i + 0.25 * i));
  // freeing the module moves its arrays back to host memory
  m2.free();
  assert.equal(c.home, "host");
  assert.deepEqual(c.toTypedArray(), ramp(1024, (i) => i + 0.25 * i));
  assert.throws(() => m2.getFunction("vadd"), ModuleLoadError);
  c.copyFrom(new Float64Array(1024).fill(3));
  assert.equal(c.toTypedArray()[5], 3);
  c.free();
  assert.throws(() => c.toTypedArray(), /freed/);
});

test("scalars: Float64 and non-integers as FLOAT64, integers and bigints as INT64; strings and bytes", async () => {
  const m = await load();
  const x = fromTypedArray(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
  const y = empty([2, 3]);
  const scale = m.getFunction("scale");
  scale(x, y, new Float64(2), 1);
  assert.deepEqual(y.toTypedArray(), new Float32Array([3, 5, 7, 9, 11, 13]));
  scale(x, y, 0.5, -1n);
  assert.deepEqual(y.toTypedArray(), new Float32Array([-0.5, 0, 0.5, 1, 1.5, 2]));
  assert.throws(() => scale(x, y, 2, 1), /scale: argument 2 's' must be an array, got int/);
  const call = scale.prepare(x, y, new Float64(3), 0);
  call();
  assert.deepEqual(y.toTypedArray(), new Float32Array([3, 6, 9, 12, 15, 18]));
  const other = await load();
  other.getFunction("scale")(x, y, 1.5, 0);
  assert.throws(call, /scale: argument 0 'X' left module abi_kernels.wasm \(freed or passed to another module\) after prepare\(\)/);
  const out = empty([3]);
  m.getFunction("text_info")("héllo", new Uint8Array([1, 2, 250]), out);
  assert.deepEqual(out.toTypedArray(), new Float32Array([6, 3, 253]));
});

test("return codes become tether_rpc's messages, naming the argument and shapes", async () => {
  const m = await load();
  const vadd = m.getFunction("vadd");
  const a = empty([1024]);
  const msg = (f) => {
    try {
      f();
    } catch (exc) {
      assert.ok(exc instanceof KernelError, String(exc));
      return exc.message;
    }
    assert.fail("no error");
  };
  assert.equal(msg(() => vadd(a, empty([1000]), a)), "vadd: argument 1 'B' has shape (1000,), expected (1024,) (dimension 0 differs)");
  assert.equal(msg(() => vadd(a, a)), "vadd: expected 3 arguments (A, B, C), got 2");
  assert.equal(msg(() => vadd(a, 3, a)), "vadd: argument 1 'B' must be an array, got int");
  assert.equal(msg(() => vadd(a, a, empty([32, 32]))), "vadd: argument 2 'C' has 2 dimensions (shape (32, 32)), expected 1 (shape (1024,))");
  assert.equal(msg(() => vadd(empty([1024], "int32"), a, a)), "vadd: argument 0 'A' has dtype int32, expected float32");
  assert.equal(msg(() => m.getFunction("trap")()), "trap: the kernel trapped: unreachable");
  assert.throws(() => vadd(a, {}, a), /argument 1 'B' has unsupported type Object/);
});

test("modules for another architecture, non-wasm bytes and broken metadata are refused", async () => {
  await assert.rejects(loadModule(fixture("abi_kernels_aarch64.wasm"), { name: "k.wasm" }),
    (e) => e instanceof ArchMismatch && /k\.wasm was built for aarch64 but this runtime runs wasm32 modules/.test(e.message));
  const elf = new Uint8Array(64);
  elf.set([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1]);
  elf[18] = 183;
  await assert.rejects(loadModule(elf, { name: "lib.so" }), (e) => e instanceof ArchMismatch && /lib\.so was built for aarch64 \(an ELF shared library\)/.test(e.message));
  await assert.rejects(loadModule(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9]), { name: "x" }), /x is not a WebAssembly module/);
  const bare = new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]);
  await assert.rejects(loadModule(bare, { name: "bare.wasm" }), /bare\.wasm has no tether_meta custom section/);
  const good = fixture("abi_kernels.wasm");
  await assert.rejects(loadModule(good.subarray(0, 200), { name: "cut.wasm" }), /cut\.wasm (has no tether_meta|is not a valid WebAssembly module)/);
  assert.equal(hasSimd128(), true);
});

/** The fixture module with `meta` as its tether_meta custom section. */
function withMeta(meta) {
  const payload = new TextEncoder().encode(JSON.stringify(meta));
  const name = new TextEncoder().encode("tether_meta");
  const leb = (n) => {
    const out = [];
    do {
      let b = n & 0x7f;
      n >>>= 7;
      if (n) b |= 0x80;
      out.push(b);
    } while (n);
    return out;
  };
  const body = [...leb(name.length), ...name, ...payload];
  return new Uint8Array([...fixture("abi_kernels_nometa.wasm"), 0, ...leb(body.length), ...body]);
}

test("metadata: ABI version, required features and listed functions are checked before running anything", async () => {
  const meta = JSON.parse(JSON.stringify((await load()).metadata));
  assert.ok(await loadModule(withMeta(meta), { name: "ok.wasm" }));
  await assert.rejects(loadModule(withMeta({ ...meta, abi_version: 2 }), { name: "v2.wasm" }),
    /v2\.wasm uses tether ABI version 2 but this runtime speaks version 1/);
  await assert.rejects(loadModule(withMeta({ ...meta, requires: { isa: "wasm32", features: ["simd128", "tail-call"] } }), { name: "tc.wasm" }),
    (e) => e instanceof ArchMismatch && /tc\.wasm was built for wasm32 and needs tail-call, which this WebAssembly engine lacks/.test(e.message));
  const relaxed = loadModule(withMeta({ ...meta, requires: { isa: "wasm32", features: ["simd128", "relaxed-simd"] } }), { name: "r.wasm" });
  if (hasRelaxedSimd()) assert.ok(await relaxed);
  else await assert.rejects(relaxed, /r\.wasm was built for wasm32 and needs relaxed-simd/);
  await assert.rejects(loadModule(withMeta({ ...meta, functions: [...meta.functions, { name: "ghost" }] }), { name: "g.wasm" }),
    /g\.wasm: metadata lists ghost but the module does not export it/);
  await assert.rejects(loadModule(withMeta([1]), { name: "l.wasm" }), /l\.wasm: metadata must be a JSON object, got list/);
});
