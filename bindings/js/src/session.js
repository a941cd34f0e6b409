// One session on the JS device: the server side of the handshake (HELLO -> [CHALLENGE -> AUTH] -> WELCOME),
// then CALL -> [EVENT...] RETURN | ERROR until CLOSE or the connection ends. The object table (arrays, modules,
// functions, graphs), the in-memory session folder and every built-in of docs/protocol.md live in
// SessionHandler; src/device.js decides which connection gets a session.
//
// Everything runs on the JS event loop: a wasm kernel call is synchronous, so a CLOSE that arrives during one is
// read when it returns (the Python server can abort a native call; a wasm call cannot be interrupted).
import { Handle, Tensor, ProtocolError, FrameTooLarge, HANDSHAKE_LIMITS, DEFAULT_LIMITS, bulkSize, toNumber, isInt, WIRE_DTYPES } from "./msgpack.js";
import { MsgType, PROTOCOL_MAGIC, PROTOCOL_VERSION, CAPABILITIES, RemoteError, TimeoutError, errorPayload, sleep } from "./protocol.js";
import { NONCE_SIZE, makeNonce, clientMac, serverProof, macsEqual } from "./handshake.js";
import { Float64 } from "./float.js";

export const SERVER_NAME = "tether-js/0.1.0";
const MAX_FLUSH_BYTES = 2 ** 28;
const MAX_NUMBER = 2 ** 30;
const MAX_NAME_BYTES = 255;
// the built-ins that consume bulk bytes after their CALL (each checks the size before the bytes are read)
const BULK_BUILTINS = new Set(["tether.upload", "tether.array.copy_in"]);

const err = (type, message) => new RemoteError(type, message);
const now = () => (globalThis.performance ?? Date).now();
const fmtShape = (s) => `(${s.join(", ")}${s.length === 1 ? "," : ""})`;

/** Per-session limits (docs/limits.md); null turns one off. */
export function defaultLimits(env) {
  return { memoryBytes: env.memoryBytes ?? 2 ** 30, diskBytes: env.diskBytes ?? 2 ** 30, handles: env.handles ?? 65536 };
}

/** A plain file name inside the session folder, else UnsafePathError (the rule of rpc_server's files.py). */
export function safeName(name) {
  if (typeof name !== "string") throw err("UnsafePathError", `a file name must be a string, got ${typeName(name)}`);
  if (!name) throw err("UnsafePathError", "a file name must not be empty");
  if (name.includes("\0")) throw err("UnsafePathError", `file name ${JSON.stringify(name)} contains a NUL byte`);
  if (name === "." || name === "..") throw err("UnsafePathError", `file name ${JSON.stringify(name)} is not a file`);
  if (name.includes("/") || name.includes("\\") || /^[A-Za-z]:/.test(name)) {
    throw err("UnsafePathError", `file name ${JSON.stringify(name)} must be a plain name inside the session folder (no directories)`);
  }
  if (/[\x00-\x1f]/.test(name)) throw err("UnsafePathError", `file name ${JSON.stringify(name)} contains control characters`);
  if (new TextEncoder().encode(name).length > MAX_NAME_BYTES) throw err("UnsafePathError", `file name is longer than ${MAX_NAME_BYTES} bytes`);
  return name;
}

// An array on a GPU ("opencl:0", docs/protocol.md "Device arrays on GPUs") is refused: this device has host
// memory only. No device, "cpu" and "cpu:0" are host memory.
function hostOnly(device) {
  if (device === null || device === undefined) return;
  if (typeof device !== "string") throw err("TypeError", `device must be a str, got ${typeName(device)}`);
  const spec = device.trim().toLowerCase();
  if (spec === "cpu" || spec === "cpu:0") return;
  throw err("GpuUnavailable", `this device runs CPU modules only; ${spec} is not available`);
}

function typeName(v) {
  if (v === null || v === undefined) return "NoneType";
  if (v instanceof Float64) return "float";
  if (typeof v === "number") return Number.isInteger(v) ? "int" : "float";
  if (typeof v === "bigint") return "int";
  if (typeof v === "string") return "str";
  if (typeof v === "boolean") return "bool";
  if (v instanceof Uint8Array) return "bytes";
  if (Array.isArray(v)) return "list";
  if (v instanceof Map) return "dict";
  if (v instanceof Handle) return "RemoteHandle";
  if (v instanceof Tensor) return "ndarray";
  return typeof v;
}

const asInt = (v, what) => {
  if (!isInt(v)) throw err("TypeError", `${what} must be an int, got ${typeName(v)}`);
  return Number(v);
};

let runtimePromise = null;
let graphPromise = null;
/** The JS runtime (src/runtime.js), imported on first use so a device without it still serves the rest. */
export function runtime() { return (runtimePromise ??= import("./runtime.js")); }
function graphModule() { return (graphPromise ??= import("./graph.js")); }

/** Object table + built-ins for one session. `env` describes the device (see device.js: deviceInfo, limits). */
export class SessionHandler {
  constructor(env = {}) {
    this.env = env;
    this.limits = defaultLimits(env);
    this.objects = new Map();   // id -> {kind, obj, nbytes}
    this.nextId = 1;
    this.files = new Map();     // name -> Uint8Array: the session folder, in memory
    this.memoryUsed = 0;
    this.builtins = new Map(Object.entries({
      "tether.echo": this.echo, "tether.functions": this.functions, "tether.device_info": this.deviceInfo,
      "tether.array.empty": this.arrayEmpty, "tether.array.from_tensor": this.arrayFromTensor,
      "tether.array.copy_in": this.arrayCopyIn, "tether.array.copy_out": this.arrayCopyOut,
      "tether.array.copy_to": this.arrayCopyTo,
      "tether.array.free": this.free, "tether.free": this.free,
      "tether.upload": this.upload, "tether.download": this.download, "tether.listdir": this.listdir,
      "tether.remove": this.remove, "tether.module.load": this.moduleLoad,
      "tether.module.get_function": this.moduleGetFunction, "tether.time_evaluator": this.timeEvaluator,
      // host functions (rpc-server --functions) do not exist on a JS device: the list is empty, a lookup fails
      "tether.host_functions": () => [],
      "tether.get_function": (ctx, name) => { throw err("KeyError", `no host function ${JSON.stringify(name)}: a JS device has none (it runs wasm32 modules only)`); },
      "tether.graph.create": this.graphCreate, "tether.graph.set_input": this.graphSetInput,
      "tether.graph.set_inputs": this.graphSetInputs, "tether.graph.load_params": this.graphLoadParams,
      "tether.graph.run": this.graphRun, "tether.graph.get_output": this.graphGetOutput,
      "tether.graph.copy_output": this.graphCopyOutput, "tether.graph.info": this.graphInfo,
      "tether.graph.benchmark": this.graphBenchmark, "tether.graph.profile": this.graphProfile,
    }).map(([k, f]) => [k, f.bind(this)]));
  }

  // -- object table ------------------------------------------------------------------------------------------
  put(kind, obj, nbytes = 0) {
    if (this.limits.handles && this.objects.size >= this.limits.handles) {
      throw err("LimitExceeded", `the session holds ${this.objects.size} handles, its limit (--session-handles ${this.limits.handles}); free some first`);
    }
    const id = this.nextId++;
    this.objects.set(id, { kind, obj, nbytes });
    return new Handle(id);
  }

  get(handle, kind) {
    if (!(handle instanceof Handle)) throw err("TypeError", `expected a ${kind} handle, got ${typeName(handle)}`);
    const e = this.objects.get(handle.id);
    if (!e) throw err("KeyError", `handle ${handle.id} does not exist in this session (freed already?)`);
    if (e.kind !== kind) throw err("TypeError", `handle ${handle.id} is a ${e.kind}, expected a ${kind}`);
    return e.obj;
  }

  reserveMemory(nbytes, what) {
    if (this.limits.memoryBytes && this.memoryUsed + nbytes > this.limits.memoryBytes) {
      throw err("OutOfMemory", `${what} needs ${nbytes} bytes; the session holds ${this.memoryUsed} of its ${this.limits.memoryBytes} (--session-memory)`);
    }
    this.memoryUsed += nbytes;
  }

  close() {
    for (const { kind, obj } of this.objects.values()) {
      try { if (kind === "array" || kind === "module") obj.free?.(); } catch { /* one object must not keep the others */ }
    }
    this.objects.clear();
    this.files.clear();
    this.memoryUsed = 0;
  }

  // -- dispatch ----------------------------------------------------------------------------------------------
  /** Run one call: returns {value, tensors?, bulk?}. `ctx` = {bulk: Uint8Array|null, emit(kind, fields)}. */
  async call(fn, args, ctx) {
    if (typeof fn === "string") {
      const builtin = this.builtins.get(fn);
      if (!builtin) throw err("KeyError", `no built-in function '${fn}' (have: ${[...this.builtins.keys()].sort().join(", ")})`);
      const out = await builtin(ctx, ...args);
      return out instanceof Reply ? out : new Reply(out);
    }
    return this.callPacked(this.get(fn, "function"), args);
  }

  async ndarrayFromTensor(t) {
    const rt = await runtime();
    const nd = rt.empty(t.shape, t.dtype);
    nd.copyFrom(t.data);
    return nd;
  }

  async kernelArgs(args) {
    const out = [];
    const copies = [];
    for (const a of args) {
      if (a instanceof Handle) out.push(this.get(a, "array"));
      else if (a instanceof Tensor) {
        const nd = await this.ndarrayFromTensor(a);
        copies.push(nd);
        out.push(nd);
      } else if (a instanceof Map || Array.isArray(a)) throw err("TypeError", `a kernel argument cannot be a ${typeName(a)}`);
      else out.push(a);
    }
    return { out, copies };
  }

  async callPacked(func, args) {
    const { out, copies } = await this.kernelArgs(args);
    try {
      const value = func(...out);
      const reply = new Reply(value === undefined ? null : value);
      if (copies.length) reply.tensors = copies.map(toTensor);
      return reply;
    } finally {
      for (const c of copies) c.free?.();
    }
  }

  // -- built-ins ---------------------------------------------------------------------------------------------
  echo(ctx, ...args) { return args.length === 1 ? args[0] : args; }

  functions() { return [...this.builtins.keys()].sort(); }

  deviceInfo() {
    const info = new Map(Object.entries(this.env.deviceInfo ? this.env.deviceInfo() : {}));
    // no GPU runtime here: GPU arrays and modules are refused (docs/protocol.md "Device arrays on GPUs")
    if (!info.has("gpus")) info.set("gpus", []);
    if (!info.has("gpu_errors")) info.set("gpu_errors", []);
    info.set("session_limits", new Map([["memory_bytes", this.limits.memoryBytes ?? 0], ["disk_bytes", this.limits.diskBytes ?? 0],
      ["handles", this.limits.handles ?? 0], ["call_timeout_s", null]]));
    return info;
  }

  async arrayEmpty(ctx, shape, dtype = "float32", device = null) {
    hostOnly(device);
    if (!Array.isArray(shape) || !shape.every((d) => isInt(d) && d >= 0)) throw err("TypeError", "tether.array.empty: shape must be a list of non-negative ints");
    const itemsize = WIRE_DTYPES[dtype];
    if (itemsize === undefined) throw err("KernelError", `dtype ${JSON.stringify(dtype)} is not a device array dtype (allowed: ${Object.keys(WIRE_DTYPES).join(" ")})`);
    const dims = shape.map(Number);
    const nbytes = dims.reduce((a, b) => a * b, 1) * itemsize;
    this.reserveMemory(nbytes, `an array of shape ${fmtShape(dims)} ${dtype}`);
    try {
      const nd = (await runtime()).empty(dims, dtype);
      return arrayInfo(this.put("array", nd, nbytes), nd);
    } catch (e) {
      this.memoryUsed -= nbytes;
      throw e;
    }
  }

  async arrayFromTensor(ctx, tensor, device = null) {
    hostOnly(device);
    if (!(tensor instanceof Tensor)) throw err("TypeError", `tether.array.from_tensor takes a tensor, got ${typeName(tensor)}`);
    const nbytes = tensor.data.length;
    this.reserveMemory(nbytes, `an array of shape ${fmtShape(tensor.shape)} ${tensor.dtype}`);
    try {
      const nd = await this.ndarrayFromTensor(tensor);
      return arrayInfo(this.put("array", nd, nbytes), nd);
    } catch (e) {
      this.memoryUsed -= nbytes;
      throw e;
    }
  }

  arrayCopyIn(ctx, handle) {
    const nd = this.get(handle, "array");
    if (ctx.bulk === null) throw err("ValueError", "tether.array.copy_in needs bulk bytes after the CALL (payload 'nbytes')");
    if (ctx.bulk.length !== nd.byteLength) {
      throw err("ValueError", `copy_in: ${ctx.bulk.length} bytes sent, the array ${nd.dtype} ${fmtShape(nd.shape)} holds ${nd.byteLength}`);
    }
    nd.copyFrom(ctx.bulk);
    return null;
  }

  arrayCopyOut(ctx, handle) {
    const nd = this.get(handle, "array");
    return new Reply(null, { bulk: nd.bytes() });
  }

  arrayCopyTo(ctx, srcHandle, dstHandle) {
    const src = this.get(srcHandle, "array");
    const dst = this.get(dstHandle, "array");
    if (src.dtype !== dst.dtype || fmtShape(src.shape) !== fmtShape(dst.shape)) {
      throw err("KernelError", `copy: array ${src.dtype} ${fmtShape(src.shape)} and array ${dst.dtype} ${fmtShape(dst.shape)} differ in shape or dtype`);
    }
    dst.copyFrom(src);
    return null;
  }

    free(ctx, handle) {
    const e = handle instanceof Handle ? this.objects.get(handle.id) : undefined;
    if (!e) throw err("KeyError", `cannot free ${handle}: no such handle in this session`);
    this.objects.delete(handle.id);
    this.memoryUsed -= e.nbytes;
    // a module stays alive while a function handle of it exists: wasm instances are garbage collected, so
    // only arrays are freed eagerly
    if (e.kind === "array") e.obj.free?.();
    return null;
  }

  upload(ctx, name) {
    if (ctx.bulk === null) throw err("ValueError", "tether.upload needs bulk bytes after the CALL (payload 'nbytes')");
    safeName(name);
    this.checkDisk(name, ctx.bulkSize);
    this.files.set(name, ctx.bulk);
    return new Map([["name", name], ["size", ctx.bulk.length]]);
  }

  /** Refuse an upload that would take the session folder past its cap (a file replaced counts only the difference). */
  checkDisk(name, nbytes) {
    if (!this.limits.diskBytes) return;
    let used = 0;
    for (const [k, v] of this.files) if (k !== name) used += v.length;
    if (used + nbytes > this.limits.diskBytes) {
      throw err("LimitExceeded", `uploading ${name} (${nbytes} bytes) would take the session's files to ${used + nbytes} bytes, over its limit of ${this.limits.diskBytes} (--session-disk)`);
    }
  }

  existing(name) {
    safeName(name);
    const f = this.files.get(name);
    if (f === undefined) throw err("FileNotFoundError", `no file '${name}' in the session folder (have: ${[...this.files.keys()].sort().join(", ") || "nothing"})`);
    return f;
  }

  download(ctx, name) {
    const data = this.existing(name);
    return new Reply(new Map([["name", name], ["size", data.length]]), { bulk: data });
  }

  listdir() { return [...this.files.keys()].sort(); }

  remove(ctx, name) { this.existing(name); this.files.delete(name); return null; }

  async loadWasm(name) {
    const data = this.existing(name);
    const magic = [0x00, 0x61, 0x73, 0x6d];
    if (data.length < 8 || !magic.every((b, i) => data[i] === b)) {
      const what = data[0] === 0x7f && data[1] === 0x45 && data[2] === 0x4c && data[3] === 0x46 ? "an ELF file (a native library)"
        : `a file starting with ${Array.from(data.subarray(0, 4), (b) => b.toString(16).padStart(2, "0")).join(" ") || "nothing"}`;
      throw err("ModuleLoadError", `${name} is ${what}, not a WebAssembly module: this device runs .wasm modules (magic 00 61 73 6d) built with target "wasm32"`);
    }
    const rt = await runtime();
    try {
      return await rt.loadModule(data, { name });
    } catch (e) {
      if (e?.type || (e?.name && !["Error", "TypeError", "RangeError", "CompileError", "LinkError", "RuntimeError"].includes(e.name))) throw e;
      throw err("ModuleLoadError", `${name}: ${e?.message ?? e}`);
    }
  }

  async moduleLoad(ctx, name) {
    const mod = await this.loadWasm(name);
    const meta = mod.metadata;
    const gpu = meta instanceof Map ? meta.get("device") : meta?.device;
    if (gpu !== undefined && gpu !== null) {
      // a GPU module (host code plus OpenCL, Vulkan or CUDA code): no GPU runtime here to launch its kernels
      const api = gpu instanceof Map ? gpu.get("api") : gpu.api;
      throw err("ModuleLoadError", `this device runs CPU modules only; ${name} needs ${typeof api === "string" ? api : "a GPU"}, which is not available`);
    }
    const handle = this.put("module", mod);
    return new Map([["handle", handle], ["functions", [...mod.functions]], ["metadata", mod.metadata ?? {}]]);
  }

  moduleGetFunction(ctx, handle, name) {
    const mod = this.get(handle, "module");
    if (typeof name !== "string" || !mod.functions.includes(name)) {
      throw err("KeyError", `module has no function ${JSON.stringify(name)} (it has: ${mod.functions.join(", ")})`);
    }
    const fn = mod.getFunction(name);
    return new Map([["handle", this.put("function", fn)], ["name", name]]);
  }

  async timeEvaluator(ctx, fnHandle, args, options = null) {
    const func = this.get(fnHandle, "function");
    if (!Array.isArray(args)) throw err("TypeError", "time_evaluator args must be a list");
    const opts = checkOptions(options, ["number", "repeat", "min_repeat_ms", "warmup", "cooldown_ms", "flush_bytes"], "time_evaluator");
    const { out, copies } = await this.kernelArgs(args);
    try {
      return await timeCalls(() => func(...out), opts, (index, seconds) => ctx.emit("sample", [["index", index], ["seconds", new Float64(seconds)]]));
    } finally {
      for (const c of copies) c.free?.();
    }
  }

  // -- graph built-ins (docs/graph.md) -----------------------------------------------------------------------
  async graphCreate(ctx, graphName = "deploy.json", libName = null, paramsName = "deploy.params") {
    const text = new TextDecoder().decode(this.existing(graphName));
    let graph;
    try { graph = JSON.parse(text); } catch (e) { throw err("ValueError", `${graphName} is not JSON: ${e.message}`); }
    const mod = await this.loadWasm(libName ?? graph.lib ?? "deploy.wasm");
    const params = paramsName ? this.existing(paramsName) : null;
    const { GraphExecutor } = await graphModule();
    const gm = GraphExecutor.create ? await GraphExecutor.create(graph, mod, params) : new GraphExecutor(graph, mod, params);
    const info = toMap(gm.info());
    info.set("handle", this.put("graph", gm));
    return info;
  }

  async inputValue(value) {
    if (value instanceof Handle) return this.get(value, "array");
    if (value instanceof Tensor) return this.ndarrayFromTensor(value);
    throw err("TypeError", `a graph input must be a tensor or an array handle, got ${typeName(value)}`);
  }

  async graphSetInput(ctx, handle, key, value) {
    const gm = this.get(handle, "graph");
    gm.setInput(isInt(key) ? Number(key) : key, await this.inputValue(value));
    return null;
  }

  async graphSetInputs(ctx, handle, values) {
    const gm = this.get(handle, "graph");
    if (!(values instanceof Map)) throw err("TypeError", `tether.graph.set_inputs takes a map of inputs, got ${typeName(values)}`);
    for (const [k, v] of values) gm.setInput(k, await this.inputValue(v));
    return null;
  }

  async graphLoadParams(ctx, handle, paramsName) {
    this.get(handle, "graph").loadParams(this.existing(paramsName));
    return null;
  }

  graphRun(ctx, handle) { this.get(handle, "graph").run(); return null; }

  graphGetOutput(ctx, handle, index = 0) { return toTensor(this.graphOutput(handle, index)); }

  graphOutput(handle, index) {
    const gm = this.get(handle, "graph");
    return gm.getOutput(isInt(index) ? Number(index) : index);
  }

  graphCopyOutput(ctx, handle, index, arrayHandle) {
    const out = this.graphOutput(handle, index);
    const nd = this.get(arrayHandle, "array");
    if (nd.byteLength !== out.byteLength) throw err("ValueError", `copy_output: output ${index} has ${out.byteLength} bytes, the array holds ${nd.byteLength}`);
    nd.copyFrom(out.bytes());
    return null;
  }

  graphInfo(ctx, handle) { return toMap(this.get(handle, "graph").info()); }

  async graphBenchmark(ctx, handle, options = null) {
    const gm = this.get(handle, "graph");
    const opts = checkOptions(options, ["number", "repeat", "min_repeat_ms", "warmup", "cooldown_ms"], "benchmark");
    const onSample = (index, seconds, number) =>
      ctx.emit("sample", [["index", index], ["seconds", new Float64(seconds)], ["number", number]]);
    let samples;
    let number;
    if (typeof gm.benchmark === "function") {
      // the runtime's own loop runs every node (as tether_rpc's does), without run()'s per-node checks
      const o = (k, d) => (opts.has(k) && opts.get(k) !== null ? toNumber(opts.get(k)) : d);
      const num = Math.trunc(o("number", 10));
      const rep = Math.trunc(o("repeat", 3));
      if (num < 1 || rep < 1) throw err("ValueError", `benchmark: number and repeat must be >= 1 (got number=${num}, repeat=${rep})`);
      const res = await gm.benchmark({ number: num, repeat: rep, minRepeatMs: o("min_repeat_ms", 0), warmup: o("warmup", 1),
        cooldownMs: o("cooldown_ms", 0), onSample });
      samples = res.samples.map(toNumber);
      number = res.number;
    } else {
      const res = await timeCalls(() => gm.run(), opts, onSample);
      samples = res.get("samples").map(toNumber);
      number = res.get("number");
    }
    const sorted = [...samples].sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    const median = sorted.length % 2 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
    return new Map([["samples", samples.map((x) => new Float64(x))], ["number", number], ["median_ms", new Float64(median * 1e3)],
      ["mean_ms", new Float64(samples.reduce((a, b) => a + b, 0) / samples.length * 1e3)], ["min_ms", new Float64(sorted[0] * 1e3)]]);
  }

  async graphProfile(ctx, handle, options = null) {
    const gm = this.get(handle, "graph");
    const opts = checkOptions(options, ["number", "repeat", "warmup"], "profile");
    if (typeof gm.profile !== "function") throw err("NotImplementedError", "this runtime's GraphExecutor cannot time single nodes");
    const o = (k, d) => (opts.has(k) && opts.get(k) !== null ? Math.trunc(toNumber(opts.get(k))) : d);
    const record = (rec) => {
      const m = new Map(Object.entries(rec));
      m.set("seconds", new Float64(rec.seconds));
      return m;
    };
    const res = await gm.profile({ number: o("number", 5), repeat: o("repeat", 1), warmup: o("warmup", 1),
      onNode: (rec) => ctx.emit("node", [...record(rec)]) });
    return new Map([["nodes", res.nodes.map(record)], ["total_seconds", new Float64(res.total_seconds)],
      ["wall_seconds", new Float64(res.wall_seconds)]]);
  }
}

/** A call's answer: a value, optional tensors (the arguments after a kernel call), optional bulk bytes. */
export class Reply {
  constructor(value = null, { tensors = null, bulk = null } = {}) {
    this.value = value;
    this.tensors = tensors;
    this.bulk = bulk;
  }
  payload() {
    const p = new Map([["value", this.value]]);
    if (this.tensors) p.set("tensors", this.tensors);
    if (this.bulk) p.set("nbytes", this.bulk.length);
    return p;
  }
}

function arrayInfo(handle, nd) {
  return new Map([["handle", handle], ["shape", [...nd.shape]], ["dtype", nd.dtype]]);
}

function toTensor(nd) { return new Tensor(nd.dtype, [...nd.shape].map(Number), nd.bytes()); }

function toMap(obj) {
  if (obj instanceof Map) return obj;
  return new Map(Object.entries(obj));
}

function checkOptions(options, allowed, what) {
  const opts = options === null || options === undefined ? new Map() : options;
  if (!(opts instanceof Map)) throw err("TypeError", `${what} options must be a map, got ${typeName(opts)}`);
  const unknown = [...opts.keys()].filter((k) => !allowed.includes(k)).sort();
  if (unknown.length) throw err("TypeError", `unknown ${what} options: ${unknown.join(", ")} (allowed: ${[...allowed].sort().join(", ")})`);
  return opts;
}

/** The time_evaluator loop (rpc_server's timing.py, measured with performance.now()): `warmup` untimed calls,
 * `number` grown until a sample lasts `min_repeat_ms`, then `repeat` samples of seconds per call. */
export async function timeCalls(call, opts, onSample) {
  const num = (k, d) => (opts.has(k) && opts.get(k) !== null ? toNumber(opts.get(k)) : d);
  let number = Math.trunc(num("number", 10));
  const repeat = Math.trunc(num("repeat", 3));
  if (number < 1 || repeat < 1) throw err("ValueError", `time_evaluator: number and repeat must be >= 1 (got number=${number}, repeat=${repeat})`);
  const flushBytes = Math.trunc(num("flush_bytes", 0));
  if (flushBytes < 0 || flushBytes > MAX_FLUSH_BYTES) throw err("ValueError", `time_evaluator: flush_bytes must be within 0..${MAX_FLUSH_BYTES} (got ${flushBytes})`);
  const warmup = Math.max(0, Math.trunc(num("warmup", 1)));
  const cooldownMs = num("cooldown_ms", 0);
  for (let i = 0; i < warmup; i++) call();
  const run = (n) => {
    const t0 = now();
    for (let i = 0; i < n; i++) call();
    return (now() - t0) / 1e3;
  };
  const minS = Math.max(0, num("min_repeat_ms", 0)) / 1e3;
  if (minS > 0) {
    for (let round = 0; round < 32; round++) {
      const elapsed = run(number);
      if (elapsed >= minS || number >= MAX_NUMBER) break;
      const guess = elapsed > 0 ? (number * 1.2 * minS) / elapsed : number * 10;
      number = Math.min(MAX_NUMBER, Math.max(number * 2, Math.ceil(guess)));
    }
  }
  const flush = flushBytes ? new Uint8Array(flushBytes) : null;
  const samples = [];
  for (let i = 0; i < repeat; i++) {
    if (cooldownMs > 0 && i > 0) await sleep(cooldownMs);
    if (flush) flush.fill((i + 1) & 0xff);
    const perCall = run(number) / number;
    samples.push(perCall);
    onSample?.(i, perCall, number);
  }
  return new Map([["samples", samples.map((s) => new Float64(s))], ["number", number]]);
}

// ---------------------------------------------------------------------------------------------------------------
// the connection: handshake, then the call loop

/** The server side of the handshake. `opts`: token (string|null), acceptMatch(match) -> bool (a tracker's one-time
 * tokens; null accepts any HELLO), acquire(conn, wait) -> Promise<bool> (takes the device, waiting in its queue
 * if `wait`; false when the connection was ended instead), handshakeTimeoutMs. Returns {client, match} after WELCOME, or null
 * when the connection ended (an ERROR was sent where the protocol says so). */
export async function serverHandshake(conn, opts, sessionId) {
  const deadline = Date.now() + (opts.handshakeTimeoutMs ?? 5000);
  conn.limits = HANDSHAKE_LIMITS;
  const fail = (e) => {
    conn.sendError(0, e);
    conn.close();
    return null;
  };
  try {
    const hello = await conn.nextFrame(deadline);
    if (hello === null) { conn.close(); return null; }
    if (hello.msgType !== MsgType.HELLO) throw new ProtocolError(`expected HELLO, got message type ${hello.msgType}`);
    const p = hello.payload;
    if (p.get("magic") !== PROTOCOL_MAGIC) throw new ProtocolError(`not a tether client: HELLO magic is ${JSON.stringify(p.get("magic"))}, expected "${PROTOCOL_MAGIC}"`);
    if (p.get("version") !== PROTOCOL_VERSION) {
      return fail(err("VersionMismatch", `client speaks tether protocol version ${p.get("version")}, this server speaks version ${PROTOCOL_VERSION}`));
    }
    const caps = p.get("caps") ?? [];
    if (!Array.isArray(caps) || !caps.every((c) => typeof c === "string")) throw new ProtocolError("HELLO caps must be a list of strings");
    const match = p.get("match") ?? null;
    if (match !== null && typeof match !== "string") throw new ProtocolError("HELLO match must be a string");
    let clientNonce = null;
    let serverNonce = null;
    if (opts.token) {
      serverNonce = makeNonce();
      conn.send(MsgType.CHALLENGE, 0, new Map([["algo", "hmac-sha256"], ["nonce", serverNonce]]));
      const auth = await conn.nextFrame(deadline);
      if (auth === null) { conn.close(); return null; }
      if (auth.msgType !== MsgType.AUTH) throw new ProtocolError(`expected AUTH, got message type ${auth.msgType}`);
      clientNonce = auth.payload.get("nonce");
      if (!(clientNonce instanceof Uint8Array) || clientNonce.length !== NONCE_SIZE) {
        return fail(err("AuthenticationError", `AUTH must carry a ${NONCE_SIZE}-byte nonce`));
      }
      if (!macsEqual(auth.payload.get("mac"), await clientMac(opts.token, serverNonce, clientNonce))) {
        return fail(err("AuthenticationError", "wrong token: the server refused the authentication"));
      }
    }
    if (opts.acceptMatch && !opts.acceptMatch(match)) {
      return fail(err("AuthenticationError", match === null
        ? "this device serves only sessions granted by its tracker (HELLO without a match token)"
        : "match token not accepted (unknown, already used or revoked)"));
    }
    // one session at a time: wait for the device (queue notices on request id 0), or DeviceBusy
    if (opts.acquire && !(await opts.acquire(conn, p.get("wait") !== false))) return null;
    const welcome = new Map([["version", PROTOCOL_VERSION], ["caps", CAPABILITIES], ["server", SERVER_NAME], ["session", sessionId]]);
    if (opts.token) welcome.set("proof", await serverProof(opts.token, serverNonce, clientNonce));
    conn.send(MsgType.WELCOME, 0, welcome);
    conn.limits = DEFAULT_LIMITS;
    return { client: String(p.get("client") ?? "").slice(0, 64), match };
  } catch (e) {
    if (e instanceof TimeoutError) return fail(err("TetherTimeout", `no complete handshake within ${(opts.handshakeTimeoutMs ?? 5000) / 1000} s`));
    if (e instanceof ProtocolError || e instanceof RemoteError) return fail(e);
    return fail(err("ProtocolError", String(e?.message ?? e)));
  }
}

/** Serve CALLs until CLOSE, the connection ends, or a timeout. `opts`: idleTimeoutMs, sessionTimeoutMs, env. */
export async function serveCalls(conn, handler, opts = {}) {
  const idleMs = opts.idleTimeoutMs ?? 300000;
  const endAt = opts.sessionTimeoutMs ? Date.now() + opts.sessionTimeoutMs : Infinity;
  const fatal = (rid, e) => { conn.sendError(rid, e); conn.close(); };
  try {
    for (;;) {
      const idleEnd = Date.now() + idleMs;
      const deadline = Math.min(idleEnd, endAt);
      let frame;
      try {
        frame = await conn.nextFrame(deadline);
      } catch (e) {
        if (e instanceof TimeoutError) {
          fatal(0, err("TetherTimeout", deadline === endAt ? `the session ran past its session timeout of ${opts.sessionTimeoutMs / 1000} s`
            : `the session was idle for ${idleMs / 1000} s (--idle-timeout)`));
          return;
        }
        throw e;
      }
      if (frame === null) return;
      const { msgType, requestId, payload } = frame;
      if (msgType === MsgType.CLOSE) { conn.close(); return; }
      if (msgType !== MsgType.CALL) throw new ProtocolError(`message type ${msgType} is not expected during a session`);
      const fn = payload.get("fn");
      const args = payload.has("args") ? payload.get("args") : [];
      let nbytes;
      try {
        if (typeof fn !== "string" && !(fn instanceof Handle)) throw new ProtocolError(`CALL fn must be a built-in name or a function handle, got ${typeName(fn)}`);
        if (!Array.isArray(args)) throw new ProtocolError(`CALL args must be a list, got ${typeName(args)}`);
        nbytes = bulkSize(payload, conn.limits);
      } catch (e) {
        fatal(requestId, e);
        return;
      }
      const ctx = {
        bulk: null,
        bulkSize: nbytes,
        emit: (kind, fields) => conn.send(MsgType.EVENT, requestId, new Map([["kind", kind], ...fields])),
      };
      let reply;
      try {
        if (payload.has("nbytes")) {
          // a refused upload is read and dropped, so the stream stays in step
          if (fn === "tether.upload" && typeof args[0] === "string") {
            try { safeName(args[0]); handler.checkDisk(args[0], nbytes); } catch (e) { await conn.skip(nbytes, endAt); throw e; }
          }
          let take = BULK_BUILTINS.has(fn);
          if (fn === "tether.array.copy_in") {
            const e = args[0] instanceof Handle ? handler.objects.get(args[0].id) : undefined;
            if (e && e.kind === "array" && e.obj.byteLength !== nbytes) {
              await conn.skip(nbytes, endAt);
              throw err("ValueError", `copy_in: ${nbytes} bytes sent, the array ${e.obj.dtype} ${fmtShape(e.obj.shape)} holds ${e.obj.byteLength}`);
            }
            take = e !== undefined && e.kind === "array";   // else the call names the bad handle
          }
          // the bytes are buffered only for a destination of their size; any other call's are dropped unread
          // (nbytes may be GiBs)
          if (take) ctx.bulk = await conn.readBulk(nbytes, endAt);
          else await conn.skip(nbytes, endAt);
        }
        reply = await handler.call(fn, args, ctx);
      } catch (e) {
        if (e instanceof ProtocolError && !(e instanceof RemoteError)) throw e;
        conn.sendError(requestId, e);
        continue;
      }
      conn.send(MsgType.RETURN, requestId, reply.payload(), reply.bulk);
    }
  } catch (e) {
    if (e instanceof FrameTooLarge) fatal(0, e);
    else if (e instanceof ProtocolError) fatal(0, e);
    else fatal(0, err("SessionCrashed", `the session failed: ${e?.message ?? e}`));
  } finally {
    handler.close();
  }
}

export { errorPayload };
