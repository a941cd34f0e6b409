import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { loadModule, empty, fromTypedArray, KernelError } from "../src/runtime.js";
import { GraphExecutor } from "../src/graph.js";
import { saveParams } from "../src/params.js";

const fixture = (name) => readFileSync(fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url)));
const load = () => loadModule(fixture("abi_kernels.wasm"), { name: "abi_kernels.wasm" });
const ramp = (n, f = (i) => i) => Float32Array.from({ length: n }, (_, i) => f(i));
const f32 = (name, storage, extra = {}) => ({ name, shape: [1024], dtype: "float32", storage, ...extra });

// x -> t = x + w (param) -> y = t + t, only when flag; z = nonzero(flag) (a numpy node, data-dependent)
function graph() {
  return {
    format: "tether-graph", version: 3, name: "chain", lib: "abi_kernels.wasm",
    storages: [4096, 8192, 4096, 1, 16],
    entries: [
      f32("x", 0), f32("w", 2), f32("t", 1, { offset: 4096 }), f32("y", 1),
      { name: "flag", shape: [], dtype: "bool", storage: 3 },
      { name: "z", shape: [1, 1], dtype: "int64", storage: 4, dynamic: true },
    ],
    inputs: [0, 4], outputs: [3, 5, 2], params: [1],
    nodes: [
      { name: "add_w", func: "vadd", args: [0, 1, 2], ops: "add" },
      { name: "double", func: "vadd", args: [2, 2, 3], ops: "add", when: [[4, true]] },
      { name: "where", numpy: "nonzero", attrs: {}, inputs: [4], outputs: [5], ops: "nonzero" },
    ],
  };
}

test("graph executor: kernels at offsets, params, guards, numpy nodes with data-dependent outputs", async () => {
  const m = await load();
  const params = saveParams(new Map([["w", fromTypedArray(ramp(1024, () => 0.5))]]));
  const gm = new GraphExecutor(JSON.stringify(graph()), m, params);
  assert.deepEqual(gm.info(), {
    inputs: [{ name: "x", shape: [1024], dtype: "float32" }, { name: "flag", shape: [], dtype: "bool" }],
    outputs: [{ name: "y", shape: [1024], dtype: "float32" }, { name: "z", shape: [1, 1], dtype: "int64" }, { name: "t", shape: [1024], dtype: "float32" }],
    nodes: 3, storage_bytes: 4096 + 8192 + 4096 + 1 + 16,
  });
  gm.setInput("x", ramp(1024));
  gm.setInput(1, fromTypedArray(new Uint8Array([1]), [], "bool"));
  gm.run();
  assert.deepEqual(gm.skipped(), []);
  assert.deepEqual(gm.getOutput(0).toTypedArray(), ramp(1024, (i) => 2 * (i + 0.5)));
  const z = gm.getOutput("z");
  assert.deepEqual([z.shape, z.dtype, [...z.toTypedArray()]], [[1, 1], "int64", [0n]]);
  // the untaken branch: "double" is skipped, y keeps its bytes; nonzero of false is empty
  gm.setInput("x", fromTypedArray(ramp(1024, (i) => -i)));
  assert.throws(() => gm.setInput("flag", new Uint8Array([0])), /input 'flag': got uint8, the model expects bool/);
  gm.setInput("flag", fromTypedArray(new Uint8Array([0]), [1, 1], "bool"));
  gm.run();
  assert.deepEqual(gm.skipped(), ["double"]);
  assert.deepEqual(gm.getOutput(2).toTypedArray(), ramp(1024, (i) => 0.5 - i));
  assert.deepEqual(gm.getOutput(0).toTypedArray(), ramp(1024, (i) => 2 * (i + 0.5)));
  assert.deepEqual(gm.getOutput(1).shape, [1, 0]);
  // inputs convert as numpy's same_kind casts allow, and refuse the rest
  gm.setInput("x", new Float64Array(1024).fill(1.25));
  assert.equal(gm.getInput("x").toTypedArray()[7], 1.25);
  assert.throws(() => gm.setInput("x", empty([1000])), /input 'x': got shape \(1000,\), the model expects float32 \(1024,\)/);
  assert.throws(() => gm.setInput("x", empty([2, 512])), /input 'x': got shape \(2, 512\), the model expects \(1024,\)/);
  assert.throws(() => gm.setInput("flag", new Float32Array([1])), /input 'flag': got float32, the model expects bool/);
  assert.throws(() => gm.setInput("nope", ramp(3)), /the model has no input 'nope' \(inputs: x, flag\)/);
  assert.throws(() => gm.setInput(5, ramp(3)), /input index 5 out of range: the model has 2 input\(s\) \['x', 'flag'\]/);
  assert.throws(() => gm.loadParams(new Map()), /params lack 1 tensor\(s\) the graph needs: w/);
  assert.throws(() => gm.loadParams(new Map([["w", empty([3])]])), /param 'w' is float32 \(3,\), the graph expects float32 \(1024,\)/);
  // timing helpers
  const bench = await gm.benchmark({ number: 2, repeat: 3 });
  assert.equal(bench.samples.length, 3);
  assert.ok(bench.median_ms >= 0);
  const seen = [];
  const prof = await gm.profile({ number: 1, onNode: (r) => seen.push(r.name) });
  assert.deepEqual(seen, ["add_w", "double", "where"]);
  assert.equal(prof.nodes[1].skipped, true);
  assert.equal(prof.nodes[2].func, "numpy:nonzero");
  gm.free();
});

test("graph executor: a kernel failing at run time names the function and the argument", async () => {
  const m = await load();
  const g = graph();
  g.entries[1] = { name: "w", shape: [32, 32], dtype: "float32", storage: 2 };
  const gm = new GraphExecutor(g, m, new Map([["w", empty([32, 32])]]));
  assert.throws(() => gm.run(), (e) => e instanceof KernelError && e.message === "vadd: argument 1 'B' has 2 dimensions (shape (32, 32)), expected 1 (shape (1024,))");
});

test("graph executor: malformed graphs are refused with one clear message", async () => {
  const m = await load();
  const bad = (mutate, pattern) => {
    const g = graph();
    mutate(g);
    assert.throws(() => new GraphExecutor(g, m), pattern);
  };
  bad((g) => { g.format = "onnx"; }, /not a tether graph JSON \(format 'onnx'\)/);
  bad((g) => { g.version = 7; }, /graph JSON version 7; this runtime reads versions 1, 2, 3/);
  bad((g) => { g.entries[0].dtype = "float8"; }, /graph entry 0 has dtype 'float8'/);
  bad((g) => { g.entries[2].offset = 4098; }, /graph entry 2 \(t\): offset 4098 is not a multiple of its element size 4/);
  bad((g) => { g.entries[2].offset = 8192; }, /graph entry 2 \(t\) needs bytes 8192..12288, its storage has 8192/);
  bad((g) => { g.nodes[2].numpy = "eval"; }, /graph node 'where' runs numpy op 'eval'; this runtime has compress, det/);
  bad((g) => { g.nodes[1].when = [[4, 1]]; }, /node double: malformed "when" item \[4,1\]/);
  bad((g) => { g.nodes[1].when = [[0, true]]; }, /node double: "when" flag entry 0 has 1024 elements \(one expected\)/);
  bad((g) => { g.nodes[0].func = "nope"; }, /has no function 'nope'/);
  bad((g) => { delete g.nodes; }, /malformed graph JSON: TypeError/);
  bad((g) => { g.storages = [-1]; }, /sizes must be >= 0/);
  const before = m.allocator.stats().used;
  bad((g) => { g.nodes[0].func = "nope"; }, /nope/);
  assert.equal(m.allocator.stats().used, before, "a refused graph frees what it allocated");
});

test("graph executor: mutated graphs (an uploaded deploy.json is untrusted) end in one error type, never a crash", async () => {
  const m = await load();
  const values = [null, -1, 0, 7, 1e12, 2 ** 53, "x", [], {}, true, 3.5, [[4, true]], [-1]];
  // a deterministic generator: the same mutations every run
  let seed = 12345;
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  const paths = [];
  const walk = (obj, path) => {
    if (obj !== null && typeof obj === "object") for (const k of Object.keys(obj)) walk(obj[k], [...path, k]);
    paths.push(path);
  };
  walk(graph(), []);
  const params = new Map([["w", empty([1024])]]);
  let refused = 0;
  for (let it = 0; it < 300; it++) {
    const g = graph();
    for (let n = 0; n <= rand(3); n++) {
      const path = paths[rand(paths.length)];
      if (path.length === 0) continue;
      let obj = g;
      for (const k of path.slice(0, -1)) obj = obj?.[k];
      if (obj !== null && typeof obj === "object") obj[path[path.length - 1]] = values[rand(values.length)];
    }
    let gm = null;
    try {
      gm = new GraphExecutor(g, m, params);
      gm.setInput(0, new Float32Array(1024));
      gm.run();
      gm.getOutput(0);
    } catch (exc) {
      refused += 1;
      assert.ok(["ValueError", "ModuleLoadError", "OutOfMemory", "KernelError", "RangeError", "TypeError"].includes(exc.name), `${exc.name}: ${exc.message}`);
      // an engine's own words ("Cannot read properties of undefined") only inside "malformed graph JSON: ..."
      const raw = /Cannot read properties|is not a function|is not iterable|Invalid typed array length|Invalid array length/;
      assert.ok(!raw.test(exc.message) || /^malformed graph JSON/.test(exc.message), `${exc.name}: ${exc.message}`);
    } finally {
      if (gm) gm.free();
    }
  }
  assert.ok(refused > 100, `only ${refused} of 300 mutations were refused`);
  assert.equal(m.allocator.stats().used, 0, "every executor, accepted or refused, gave its memory back");
});
