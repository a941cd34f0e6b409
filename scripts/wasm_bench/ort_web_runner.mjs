// onnxruntime-web's wasm backend in node, single-threaded, SIMD on: the reference bench_wasm.py times tether's
// wasm32 build against.
//
//   node ort_web_runner.mjs ORT_WEB_PACKAGE_DIR MODEL.onnx INPUTS_DIR OUTPUTS_DIR
//
// Loads the model, sets the inputs (tensor_files.mjs), runs once, writes the outputs to OUTPUTS_DIR, prints one
// JSON line {"ready": true, ...} and then serves timing requests on stdin (serveSamples).
//
// SIMD: onnxruntime-web ships only SIMD builds (ort-wasm-simd-threaded*.wasm); this runner reads the default one
// itself and hands it over as env.wasm.wasmBinary, so the binary that runs is the one named in the ready line
// (bench_wasm.py counts its SIMD instructions), and env.wasm.simd = 'fixed' makes ort check the engine's support.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { readTensors, writeTensors, serveSamples } from './tensor_files.mjs';

const [pkgDir, modelPath, inputsDir, outputsDir] = process.argv.slice(2);
if (!outputsDir) {
  console.error('usage: node ort_web_runner.mjs ORT_WEB_PACKAGE_DIR MODEL.onnx INPUTS_DIR OUTPUTS_DIR');
  process.exit(2);
}
const ort = await import(pathToFileURL(path.join(pkgDir, 'dist', 'ort.node.min.mjs')).href);
const wasmFile = path.join(pkgDir, 'dist', 'ort-wasm-simd-threaded.wasm');
ort.env.wasm.numThreads = 1;          // no worker threads: one core, as tether's wasm32 module
ort.env.wasm.simd = 'fixed';
ort.env.wasm.wasmBinary = fs.readFileSync(wasmFile);
ort.env.logLevel = 'error';

const t0 = performance.now();
const session = await ort.InferenceSession.create(fs.readFileSync(modelPath), {
  executionProviders: ['wasm'], graphOptimizationLevel: 'all', intraOpNumThreads: 1, interOpNumThreads: 1,
});
const loadS = (performance.now() - t0) / 1e3;
const feeds = {};
for (const t of readTensors(inputsDir)) feeds[t.name] = new ort.Tensor(t.dtype, t.data, t.shape);
const run = () => session.run(feeds);
const t1 = performance.now();
const results = await run();
const firstRunS = (performance.now() - t1) / 1e3;
writeTensors(outputsDir, session.outputNames.map((name) => {
  const r = results[name];
  return { name, shape: r.dims, dtype: r.type, data: r.data };
}));
for (const name of session.outputNames) results[name].dispose?.();
process.stdout.write(JSON.stringify({
  ready: true, runtime: 'onnxruntime-web', version: ort.env.versions?.web ?? null, wasm: wasmFile,
  threads: ort.env.wasm.numThreads, simd: ort.env.wasm.simd,
  engine_simd: WebAssembly.validate(new Uint8Array([  // (func (result v128) v128.const 0): SIMD in this engine
    0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 22, 1, 20, 0, 253, 12,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11])),
  load_s: loadS, first_run_s: firstRunS,
}) + '\n');
await serveSamples(async () => {
  const out = await run();
  for (const k in out) out[k].dispose?.();
});
process.exit(0);
