// The tensors bench_wasm.py and its node runners hand each other: a folder with tensors.json (a list of
// {name, shape, dtype, file}) and one file of raw little-endian elements per tensor (C order). Plain files, so
// neither runner needs the other's reader and the ONNX reference runner does not depend on tether's JS runtime.
import fs from 'node:fs';
import path from 'node:path';

const TYPED = {
  float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array, int16: Int16Array,
  uint16: Uint16Array, int32: Int32Array, uint32: Uint32Array, int64: BigInt64Array, uint64: BigUint64Array,
  bool: Uint8Array,
};

export function typedArrayClass(dtype) {
  const cls = TYPED[dtype];
  if (!cls) throw new Error(`dtype ${dtype} is not one of ${Object.keys(TYPED).join(', ')}`);
  return cls;
}

/** [{name, shape, dtype, data: TypedArray}] from a folder written by bench_wasm.py. */
export function readTensors(folder) {
  const list = JSON.parse(fs.readFileSync(path.join(folder, 'tensors.json'), 'utf8'));
  return list.map(({ name, shape, dtype, file }) => {
    const bytes = fs.readFileSync(path.join(folder, file));
    const cls = typedArrayClass(dtype);
    const copy = new Uint8Array(bytes.byteLength);     // an own, aligned buffer (a Buffer may share a pool)
    copy.set(bytes);
    const data = new cls(copy.buffer, 0, bytes.byteLength / cls.BYTES_PER_ELEMENT);
    const count = shape.reduce((a, b) => a * b, 1);
    if (data.length !== count) throw new Error(`${file}: ${data.length} elements, shape ${JSON.stringify(shape)} needs ${count}`);
    return { name, shape, dtype, data };
  });
}

/** Writes [{name, shape, dtype, data}] as readTensors reads them. */
export function writeTensors(folder, tensors) {
  fs.mkdirSync(folder, { recursive: true });
  const list = tensors.map((t, i) => {
    const file = `t${i}.bin`;
    fs.writeFileSync(path.join(folder, file), new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    return { name: t.name, shape: t.shape.map(Number), dtype: t.dtype, file };
  });
  fs.writeFileSync(path.join(folder, 'tensors.json'), JSON.stringify(list));
}

/**
 * The timing loop both runners serve, one JSON line per request on stdin: {"cmd": "sample", "number": N,
 * "warmup": W} runs W untimed calls, then N back-to-back calls timed with performance.now(), and answers
 * {"seconds": per call, "cpu_seconds": the process's CPU time per call (process.cpuUsage), which time-slicing on
 * a loaded machine does not inflate}; {"cmd": "quit"} ends the process. Python drives the rounds, so the runtimes are sampled
 * in turn, each alone (the others wait on their stdin), and a burst of load hits them alike.
 */
export async function serveSamples(runOnce, extra = {}) {
  const readline = await import('node:readline');
  const rl = readline.createInterface({ input: process.stdin, terminal: false });
  for await (const line of rl) {
    if (!line.trim()) continue;
    const req = JSON.parse(line);
    let reply;
    try {
      if (req.cmd === 'quit') break;
      if (req.cmd === 'sample') {
        for (let i = 0; i < (req.warmup || 0); i++) await runOnce();
        const n = Math.max(1, req.number | 0);
        const c0 = process.cpuUsage();
        const t0 = performance.now();
        for (let i = 0; i < n; i++) await runOnce();
        const t1 = performance.now();
        const c1 = process.cpuUsage(c0);
        reply = { seconds: (t1 - t0) / 1e3 / n, cpu_seconds: (c1.user + c1.system) / 1e6 / n };
      } else if (extra[req.cmd]) {
        reply = await extra[req.cmd](req);
      } else {
        reply = { error: `unknown command ${JSON.stringify(req.cmd)}` };
      }
    } catch (e) {
      reply = { error: String(e && e.message || e) };
    }
    process.stdout.write(JSON.stringify(reply) + '\n');
  }
  rl.close();
}
