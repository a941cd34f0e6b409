#!/usr/bin/env node
// run_kernel.js MODULE.wasm FUNC ARGS.params OUT.params
// Calls FUNC of MODULE with the arrays of ARGS.params named "0", "1", ... by position, then writes every
// argument to OUT.params under the same names (outputs are written in place).
import { writeFileSync } from "node:fs";
import { basename } from "node:path";
import { loadModule } from "../src/runtime.js";
import { loadParams, saveParams } from "../src/params.js";
import { BadInput, readBytes, runTool } from "./cli.js";

runTool(async (argv) => {
  if (argv.length !== 4) throw new BadInput("usage: run_kernel.js MODULE.wasm FUNC ARGS.params OUT.params");
  const [modPath, func, argsPath, outPath] = argv;
  const module = await loadModule(readBytes(modPath, "module"), { name: basename(modPath) });
  const params = loadParams(readBytes(argsPath, "arguments"));
  const args = [];
  for (let i = 0; i < params.size; i++) {
    if (!params.has(String(i))) throw new BadInput(`${basename(argsPath)}: arguments are named "0".."${params.size - 1}" by position; "${i}" is missing`);
    args.push(params.get(String(i)));
  }
  const fn = module.getFunction(func);
  fn(...args);
  const out = new Map(args.map((a, i) => [String(i), a]));
  writeFileSync(outPath, saveParams(out));
});
