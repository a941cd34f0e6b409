// tether's wasm32 build of a model in node, through bindings/js's GraphExecutor: what bench_wasm.py times.
//
//   node tether_wasm_runner.mjs MODEL_DIR INPUTS_DIR OUTPUTS_DIR
//
// MODEL_DIR is a wasm32 model folder (deploy.json + deploy.params + deploy.wasm). Loads it, sets the inputs
// (tensor_files.mjs), runs once, writes the outputs to OUTPUTS_DIR, prints one JSON line {"ready": true, ...} and
// then serves timing requests on stdin (serveSamples), plus {"cmd": "profile"}: each node's own time, in execution
// order (profile below).
import fs from 'node:fs';
import path from 'node:path';
import { loadModule, fromTypedArray } from '../../bindings/js/src/runtime.js';
import { GraphExecutor } from '../../bindings/js/src/graph.js';
import { readTensors, writeTensors, serveSamples } from './tensor_files.mjs';

const [modelDir, inputsDir, outputsDir] = process.argv.slice(2);
if (!outputsDir) {
  console.error('usage: node tether_wasm_runner.mjs MODEL_DIR INPUTS_DIR OUTPUTS_DIR');
  process.exit(2);
}
const graphText = fs.readFileSync(path.join(modelDir, 'deploy.json'), 'utf8');
const graph = JSON.parse(graphText);
const t0 = performance.now();
const module = await loadModule(fs.readFileSync(path.join(modelDir, graph.lib)), { name: graph.lib });
const executor = new GraphExecutor(graphText, module, fs.readFileSync(path.join(modelDir, 'deploy.params')));
const loadS = (performance.now() - t0) / 1e3;
for (const t of readTensors(inputsDir)) executor.setInput(t.name, fromTypedArray(t.data, t.shape, t.dtype));
const t1 = performance.now();
executor.run();
const firstRunS = (performance.now() - t1) / 1e3;
const outputs = [];
for (let i = 0; i < executor.numOutputs; i++) {
  const nd = executor.getOutput(i);
  outputs.push({ name: graph.entries[graph.outputs[i]].name, shape: nd.shape, dtype: nd.dtype, data: nd.toTypedArray() });
}
writeTensors(outputsDir, outputs);
process.stdout.write(JSON.stringify({
  ready: true, runtime: 'tether-wasm32', wasm: path.join(modelDir, graph.lib),
  features: module.metadata?.requires?.features ?? null, load_s: loadS, first_run_s: firstRunS,
}) + '\n');

// Per-node times: each node's bound call (the executor's _nodeCall, what its run() calls) timed alone after one
// warm-up call: 3 samples of enough calls to last about 5 ms (at most `number`... 1000), the median wall and
// process CPU time per call (CPU time: what a loaded machine's time-slicing does not inflate).
// Without _nodeCall (an internal of graph.js), the executor's public profile(): wall times only.
async function profile(req) {
  if (typeof executor._nodeCall !== 'function') {
    const res = await executor.profile({ number: 20, repeat: 3 });
    return { nodes: res.nodes.map((r) => ({ ...r, cpu_seconds: r.seconds })) };
  }
  const most = Math.max(1, Math.min(1000, req.number | 0 || 1000));
  executor.run();                   // intermediates hold real values, and the skipped mask is the run's
  const median = (v) => v.sort((a, b) => a - b)[v.length >> 1];
  return {
    nodes: graph.nodes.map((nd, k) => {
      const rec = { index: k, name: nd.name || '', func: nd.func || `numpy:${nd.numpy}`, ops: nd.ops || '', seconds: 0, cpu_seconds: 0 };
      if (executor.skippedMask && executor.skippedMask[k]) return { ...rec, skipped: true };
      const call = executor._nodeCall(k);
      const t = performance.now();
      call();
      const n = Math.max(1, Math.min(most, Math.ceil(5 / Math.max(performance.now() - t, 1e-3))));
      const wall = [], cpu = [];
      for (let r = 0; r < 3; r++) {
        const c0 = process.cpuUsage();
        const t0 = performance.now();
        for (let i = 0; i < n; i++) call();
        wall.push((performance.now() - t0) / 1e3 / n);
        const c = process.cpuUsage(c0);
        cpu.push((c.user + c.system) / 1e6 / n);
      }
      return { ...rec, seconds: median(wall), cpu_seconds: median(cpu) };
    }),
  };
}

await serveSamples(() => executor.run(), { profile });
process.exit(0);
