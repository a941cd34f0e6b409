#!/usr/bin/env node
// run_model.js MODEL_DIR INPUTS.params OUT.params [--repeat N]
// Runs deploy.json (+ its wasm library, + deploy.params) with the inputs named by graph input name and writes
// the outputs named "0", "1", ... by index. With --repeat N, prints the benchmark summary (N samples) as JSON.
import { writeFileSync, existsSync } from "node:fs";
import { join, basename } from "node:path";
import { loadModule } from "../src/runtime.js";
import { loadParams, saveParams } from "../src/params.js";
import { GraphExecutor } from "../src/graph.js";
import { BadInput, readBytes, runTool } from "./cli.js";

runTool(async (argv) => {
  let repeat = 0;
  const pos = [];
  for (let k = 0; k < argv.length; k++) {
    if (argv[k] === "--repeat") {
      repeat = Number(argv[++k]);
      if (!Number.isInteger(repeat) || repeat < 1) throw new BadInput(`--repeat takes a positive integer, got ${argv[k]}`);
    } else pos.push(argv[k]);
  }
  if (pos.length !== 3) throw new BadInput("usage: run_model.js MODEL_DIR INPUTS.params OUT.params [--repeat N]");
  const [dir, inputsPath, outPath] = pos;
  const text = new TextDecoder().decode(readBytes(join(dir, "deploy.json"), "graph"));
  let graph;
  try {
    graph = JSON.parse(text);
  } catch (exc) {
    throw new BadInput(`${join(dir, "deploy.json")} is not valid JSON: ${exc.message}`);
  }
  let module = null;
  if (graph.lib) {
    if (basename(graph.lib) !== graph.lib) throw new BadInput(`deploy.json names library ${JSON.stringify(graph.lib)} outside its folder`);
    module = await loadModule(readBytes(join(dir, graph.lib), "library"), { name: graph.lib });
  }
  const paramsPath = join(dir, "deploy.params");
  const params = existsSync(paramsPath) ? readBytes(paramsPath, "params") : null;
  let gm;
  try {
    gm = new GraphExecutor(graph, module, params);
  } catch (exc) {
    throw new BadInput(exc.message);
  }
  const inputs = loadParams(readBytes(inputsPath, "inputs"));
  for (const [name, arr] of inputs) {
    try {
      gm.setInput(name, arr);
    } catch (exc) {
      throw new BadInput(exc.message);
    }
  }
  gm.run();
  const out = new Map();
  for (let i = 0; i < gm.numOutputs; i++) out.set(String(i), gm.getOutput(i));
  writeFileSync(outPath, saveParams(out));
  if (repeat) {
    const res = await gm.benchmark({ number: 1, repeat, warmup: 1 });
    process.stdout.write(`${JSON.stringify({ ...res, skipped: gm.skipped() })}\n`);
  }
});
