// Shared by the node tools: one-line errors and exit codes (2: bad input, 1: a failing kernel).
import { readFileSync } from "node:fs";
import { KernelError, ModuleLoadError } from "../src/runtime.js";
import { ParamsFormatError } from "../src/params.js";

export class BadInput extends Error {}

export function readBytes(path, what) {
  try {
    return new Uint8Array(readFileSync(path));
  } catch (exc) {
    throw new BadInput(`${what} ${path}: ${exc.code === "ENOENT" ? "no such file" : exc.message}`);
  }
}

/** Run `main` and turn its failures into one line on stderr and the exit code. */
export async function runTool(main) {
  try {
    await main(process.argv.slice(2));
  } catch (exc) {
    const line = String(exc && exc.message ? exc.message : exc).split("\n")[0];
    process.stderr.write(`${line}\n`);
    const bad = exc instanceof BadInput || exc instanceof ParamsFormatError || exc instanceof ModuleLoadError;
    process.exitCode = bad && !(exc instanceof KernelError) ? 2 : 1;
  }
}
