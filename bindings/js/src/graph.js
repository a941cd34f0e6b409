// The graph executor: runs a compiled model (deploy.json + deploy.wasm + deploy.params) in a JS engine. A port
// of rpc_server/tether_rpc/graph_executor.py (docs/graph.md): storages allocated in the module's memory, entries
// as typed views of them (version 2 offsets), inputs by name or index, params, "when" guards (run-time If
// branches), version-3 numpy nodes with data-dependent shapes (numpy_ops.js), info(), benchmark and profile.
//
// At creation every kernel node gets its DLTensors and its TetherValue/type-code block in module memory, so
// run() is a loop of export calls and return-code checks; nothing is converted or allocated per run.
import { lookup, canCastSameKind, convertValues, valuesOf, bfloat16Bits, DTYPE_NAMES } from "./dtypes.js";
import { NDArray, formatShape, sizeOf } from "./ndarray.js";
import { Allocator } from "./allocator.js";
import { KernelError, Module, loadModule, TETHER_DLTENSOR } from "./runtime.js";
import { OPS, castTensor, tensor } from "./numpy_ops.js";
import { loadParams as parseParams } from "./params.js";
import { timeEvaluator, summarize } from "./timing.js";

export const GRAPH_FORMAT = "tether-graph";
// 1: every entry at the start of its storage; 2: entries may carry "offset"; 3: numpy nodes, dynamic entries
export const GRAPH_VERSIONS = [1, 2, 3];
export const MAX_STORAGE_BYTES = 2 ** 32; // a wasm32 memory cannot hold more

export class GraphError extends Error {
  constructor(message) {
    super(message);
    this.name = "ValueError";
  }
}

function pyRepr(v) {
  if (typeof v === "string") return `'${v.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;
  if (v === null || v === undefined) return "None";
  return JSON.stringify(v);
}

function pyList(names) {
  return `[${names.map(pyRepr).join(", ")}]`;
}

/** Linear memory for graphs without kernels (numpy nodes only): the executor needs storages, not a module. */
class HostHeap {
  constructor() {
    this.name = "graph memory";
    this.memory = new WebAssembly.Memory({ initial: 1 });
    this.allocator = new Allocator(this.memory, 64, this.name);
  }

  _u8() {
    if (this._buf !== this.memory.buffer) this._cache();
    return this._u8cache;
  }

  _dv() {
    if (this._buf !== this.memory.buffer) this._cache();
    return this._dvcache;
  }

  _cache() {
    this._buf = this.memory.buffer;
    this._u8cache = new Uint8Array(this._buf);
    this._dvcache = new DataView(this._buf);
  }

  _alloc(n) {
    return this.allocator.alloc(n);
  }

  _free(p) {
    this.allocator.free(p);
  }
}

/** Python's bool() of the one element at `ptr` (nonzero; a float's -0.0 is false, NaN true; bfloat16, held as
 * uint16 bit patterns by tether_rpc, is true for any nonzero pattern). */
function truthReader(dtype, ptr) {
  switch (dtype) {
    case "float32":
      return (dv) => dv.getFloat32(ptr, true) !== 0;
    case "float64":
      return (dv) => dv.getFloat64(ptr, true) !== 0;
    case "float16":
      return (dv) => (dv.getUint16(ptr, true) & 0x7fff) !== 0;
    default: {
      const n = lookup(dtype).itemsize;
      return (dv) => {
        for (let k = 0; k < n; k++) if (dv.getUint8(ptr + k) !== 0) return true;
        return false;
      };
    }
  }
}

export class GraphExecutor {
  /** `graph`: deploy.json text, bytes or the decoded object; `module`: a loaded Module (null for a graph of
   * numpy nodes only); `params`: params-file bytes or Map name -> NDArray (optional). */
  constructor(graph, module, params = null, { maxBytes = MAX_STORAGE_BYTES } = {}) {
    try {
      this._setup(graph, module, maxBytes);
    } catch (exc) {
      if (exc instanceof TypeError || exc instanceof RangeError) {
        this._releaseMemory();
        throw new GraphError(`malformed graph JSON: ${exc.name}: ${exc.message}`);
      }
      this._releaseMemory();
      throw exc;
    }
    if (params !== null && params !== undefined) {
      try {
        this.loadParams(params);
      } catch (exc) {
        this._releaseMemory();
        throw exc;
      }
    }
  }

  _setup(graph, module, maxBytes) {
    this._blocks = [];
    if (graph instanceof Uint8Array || graph instanceof ArrayBuffer) graph = new TextDecoder().decode(graph);
    if (typeof graph === "string") {
      try {
        graph = JSON.parse(graph);
      } catch (exc) {
        throw new GraphError(`graph JSON does not parse: ${exc.message}`);
      }
    }
    if (graph === null || typeof graph !== "object" || Array.isArray(graph) || graph.format !== GRAPH_FORMAT) {
      const fmt = graph !== null && typeof graph === "object" && !Array.isArray(graph) ? pyRepr(graph.format) : Array.isArray(graph) ? "list" : typeof graph;
      throw new GraphError(`not a tether graph JSON (format ${fmt})`);
    }
    if (!GRAPH_VERSIONS.includes(graph.version)) {
      throw new GraphError(`graph JSON version ${pyRepr(graph.version)}; this runtime reads versions ${GRAPH_VERSIONS.join(", ")} (update the runtime)`);
    }
    this.graph = graph;
    this.module = module;
    const hasKernels = graph.nodes.some((n) => !("numpy" in n));
    if (hasKernels && !(module instanceof Module)) throw new GraphError("the graph has kernel nodes: pass the Module its library loads into");
    this._heap = module instanceof Module ? module : new HostHeap();
    const heap = this._heap;
    const sizes = graph.storages.map((n) => Number(n));
    if (sizes.some((n) => !Number.isSafeInteger(n) || n < 0) || sizes.reduce((a, b) => a + b, 0) > maxBytes) {
      throw new GraphError(`graph storages of [${sizes.slice(0, 8).join(", ")}] bytes: sizes must be >= 0 and total at most ${maxBytes}`);
    }
    // one memory.grow for every storage and argument block (each block rounds up to 64 bytes)
    const argBytes = graph.nodes.reduce((a, nd) => a + (Array.isArray(nd.args) ? nd.args.length * 128 + 64 : 0), 0);
    heap.allocator.reserve(sizes.reduce((a, n) => a + Math.ceil(Math.max(n, 1) / 64) * 64, 0) + argBytes);
    this._storages = sizes.map((n) => {
      const p = heap._alloc(Math.max(n, 1));
      this._blocks.push(p);
      return { ptr: p, nbytes: n };
    });
    const u8 = heap._u8();
    for (const s of this._storages) u8.fill(0, s.ptr, s.ptr + s.nbytes); // a reused block may hold old bytes
    this._entries = graph.entries.map((e, k) => {
      if (!DTYPE_NAMES.includes(e.dtype)) {
        throw new GraphError(`graph entry ${k} has dtype ${pyRepr(String(e.dtype).slice(0, 40))} (allowed: ${[...DTYPE_NAMES].sort().join(", ")})`);
      }
      const r = lookup(e.dtype);
      const shape = e.shape.map((d) => Number(d));
      if (!shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw new GraphError(`graph entry ${k} (${e.name}) has shape ${JSON.stringify(e.shape)}`);
      const size = sizeOf(shape);
      const nbytes = size * r.itemsize;
      const sid = Number(e.storage);
      if (!(Number.isInteger(sid) && sid >= 0 && sid < this._storages.length)) {
        throw new GraphError(`graph entry ${k} (${e.name}) names storage ${e.storage} of ${this._storages.length}`);
      }
      const store = this._storages[sid];
      const offset = Number(e.offset ?? 0);
      // kernels assume element alignment only (docs/abi.md), so an offset must be a whole element
      if (!Number.isInteger(offset) || offset < 0 || offset % r.itemsize) {
        throw new GraphError(`graph entry ${k} (${e.name}): offset ${offset} is not a multiple of its element size ${r.itemsize}`);
      }
      if (offset + nbytes > store.nbytes) {
        throw new GraphError(`graph entry ${k} (${e.name}) needs bytes ${offset}..${offset + nbytes}, its storage has ${store.nbytes}`);
      }
      return { name: e.name, shape, dtype: e.dtype, ptr: store.ptr + offset, size, nbytes, dynamic: Boolean(e.dynamic) };
    });
    // entry id -> the tensor a numpy node last produced, for entries whose shape is data-dependent
    this._dynamic = new Map();
    this._entries.forEach((e, k) => {
      if (e.dynamic) this._dynamic.set(k, tensor(e.dtype, e.shape.map(() => 0), new (lookup(e.dtype).Typed)(0)));
    });
    const checkIds = (what, ids) => {
      for (const i of ids) {
        if (!(Number.isInteger(i) && i >= 0 && i < this._entries.length)) throw new GraphError(`${what} entry ${i} out of range (${this._entries.length} entries)`);
      }
    };
    checkIds("input", graph.inputs);
    checkIds("output", graph.outputs);
    checkIds("param", graph.params);
    this.inputNames = graph.inputs.map((i) => this._entries[i].name);
    this.outputNames = graph.outputs.map((i) => this._entries[i].name);
    this._paramIndex = new Map(graph.params.map((i) => [this._entries[i].name, i]));
    // per node, flat arrays for run(): the wasm export (or null), its value/code blocks, argument count, the
    // numpy call, the guard
    const n = graph.nodes.length;
    this._nodes = graph.nodes;
    this._kfn = new Array(n).fill(null);
    this._kvalues = new Int32Array(n);
    this._kcodes = new Int32Array(n);
    this._knargs = new Int32Array(n);
    this._kdescs = new Array(n).fill(null);
    this._kpacked = new Array(n).fill(null);
    this._ncall = new Array(n).fill(null);
    this._guards = new Array(n).fill(null);
    this.skippedMask = new Uint8Array(n);
    graph.nodes.forEach((node, k) => {
      if ("numpy" in node) this._ncall[k] = this._bindNumpy(node);
      else this._bindKernel(k, node);
      this._guards[k] = this._guard(node);
    });
    this._calls = graph.nodes.map((node, k) => this._nodeCall(k));
  }

  _bindKernel(k, node) {
    const module = this.module;
    const fn = module.getFunction(node.func);
    const args = node.args;
    if (!Array.isArray(args)) throw new TypeError(`node ${node.name}: args must be a list`);
    for (const i of args) {
      if (!(Number.isInteger(i) && i >= 0 && i < this._entries.length)) throw new GraphError(`graph node ${pyRepr(node.name)} names entry ${i} of ${this._entries.length}`);
    }
    if (node.shapes !== undefined && (!Array.isArray(node.shapes) || node.shapes.length !== args.length)) {
      throw new GraphError(`graph node ${pyRepr(node.name)} has ${node.shapes?.length} shapes for ${args.length} args`);
    }
    const descs = args.map((id, j) => {
      const e = this._entries[id];
      // kernels never take rank-0 tensors: a scalar travels as shape (1,)
      let shape = e.shape.length === 0 ? [1] : e.shape;
      if (node.shapes !== undefined) {
        // same bytes, the kernel's view (e.g. an NCHW conv input as a matrix)
        shape = node.shapes[j].map((d) => Number(d));
        if (sizeOf(shape) !== e.size) {
          throw new GraphError(`graph node ${pyRepr(node.name)}: cannot view entry ${id} of shape ${formatShape(e.shape)} as ${formatShape(shape)}`);
        }
      }
      return { shape, dtype: e.dtype, ptr: e.ptr };
    });
    const dlts = descs.map((d) => {
      const p = module._makeDLTensor(d.ptr, d.shape, d.dtype);
      this._blocks.push(p);
      return p;
    });
    const nargs = args.length;
    const block = module._alloc(12 * Math.max(nargs, 1));
    this._blocks.push(block);
    const dv = module._dv();
    const codes = block + 8 * Math.max(nargs, 1);
    dlts.forEach((p, j) => {
      dv.setUint32(block + 8 * j, p, true);
      dv.setUint32(block + 8 * j + 4, 0, true);
      dv.setInt32(codes + 4 * j, TETHER_DLTENSOR, true);
    });
    this._kfn[k] = module._exports[node.func];
    this._kvalues[k] = block;
    this._kcodes[k] = codes;
    this._knargs[k] = nargs;
    this._kdescs[k] = descs;
    this._kpacked[k] = fn.packed;
  }

  _entryTensor(i) {
    const e = this._entries[i];
    const T = lookup(e.dtype).Typed;
    return tensor(e.dtype, e.shape, new T(this._heap.memory.buffer, e.ptr, e.size));
  }

  _writeEntry(i, t) {
    const e = this._entries[i];
    const c = castTensor(t, e.dtype);
    this._heap._u8().set(new Uint8Array(c.data.buffer, c.data.byteOffset, e.nbytes), e.ptr);
  }

  _bindNumpy(node) {
    const op = node.numpy;
    const name = node.name;
    if (typeof op !== "string" || !Object.prototype.hasOwnProperty.call(OPS, op)) {
      throw new GraphError(`graph node ${pyRepr(name)} runs numpy op ${pyRepr(String(op).slice(0, 40))}; this runtime has ${Object.keys(OPS).sort().join(", ")}`);
    }
    const fn = OPS[op];
    const attrs = node.attrs ?? {};
    if (attrs === null || typeof attrs !== "object" || Array.isArray(attrs)) throw new GraphError(`graph node ${pyRepr(name)}: attrs must be an object`);
    const inputs = node.inputs.map(Number);
    const outputs = node.outputs.map(Number);
    for (const i of [...inputs, ...outputs]) {
      if (!(Number.isInteger(i) && i >= 0 && i < this._entries.length)) throw new GraphError(`graph node ${pyRepr(name)} names entry ${i} of ${this._entries.length}`);
    }
    const dynamic = this._dynamic;
    return () => {
      const args = inputs.map((i) => (dynamic.has(i) ? dynamic.get(i) : this._entryTensor(i)));
      const results = fn(attrs, ...args);
      for (let j = 0; j < Math.min(outputs.length, results.length); j++) {
        const i = outputs[j];
        const bound = this._entries[i];
        const r = results[j];
        if (dynamic.has(i)) {
          if (r.shape.length !== bound.shape.length || r.shape.some((d, q) => d > bound.shape[q])) {
            throw new GraphError(`numpy node ${pyRepr(name)}: output of shape ${formatShape(r.shape)} exceeds its bound ${formatShape(bound.shape)}`);
          }
          dynamic.set(i, castTensor(r, bound.dtype));
        } else {
          if (sizeOf(r.shape) !== bound.size) {
            throw new GraphError(`numpy node ${pyRepr(name)}: output of shape ${formatShape(r.shape)}, the graph says ${formatShape(bound.shape)}`);
          }
          this._writeEntry(i, r);
        }
      }
    };
  }

  // run-time branches: a node with "when" [[entry, truth], ...] runs only if every flag entry has its truth
  _guard(node) {
    const when = node.when;
    if (!when || (Array.isArray(when) && when.length === 0)) return null;
    if (!Array.isArray(when)) throw new GraphError(`node ${node.name}: malformed "when" ${JSON.stringify(when)} (expected [[entry id, true|false], ...])`);
    return when.map((item) => {
      if (!(Array.isArray(item) && item.length === 2 && Number.isInteger(item[0]) && item[0] >= 0 && item[0] < this._entries.length && typeof item[1] === "boolean")) {
        throw new GraphError(`node ${node.name}: malformed "when" item ${JSON.stringify(item)} (expected [entry id, true|false])`);
      }
      const flag = this._entries[item[0]];
      if (flag.size !== 1) throw new GraphError(`node ${node.name}: "when" flag entry ${item[0]} has ${flag.size} elements (one expected)`);
      return { read: truthReader(flag.dtype, flag.ptr), truth: item[1] };
    });
  }

  _holds(guard) {
    const dv = this._heap._dv();
    for (const g of guard) if (g.read(dv) !== g.truth) return false;
    return true;
  }

  _kernelFailure(k, rc) {
    return this._kpacked[k].decodeError(rc, this._kdescs[k]);
  }

  _nodeCall(k) {
    const f = this._kfn[k];
    if (f === null) return this._ncall[k];
    const values = this._kvalues[k];
    const codes = this._kcodes[k];
    const n = this._knargs[k];
    return () => {
      const rc = f(values, codes, n);
      if (rc !== 0) throw this._kernelFailure(k, rc);
    };
  }

  // -- inputs and params ----------------------------------------------------------------------------------
  _inputEntry(key) {
    if (typeof key === "number") {
      if (!(Number.isInteger(key) && key >= 0 && key < this.inputNames.length)) {
        throw new RangeError(`input index ${key} out of range: the model has ${this.inputNames.length} input(s) ${pyList(this.inputNames)}`);
      }
      return this.graph.inputs[key];
    }
    const at = this.inputNames.indexOf(key);
    if (at >= 0) return this.graph.inputs[at];
    if (this._paramIndex.has(key)) return this._paramIndex.get(key);
    throw new RangeError(`the model has no input ${pyRepr(key)} (inputs: ${this.inputNames.join(", ")})`);
  }

  /** setInput(name | index, NDArray | typed array): copies into the input buffer. A typed array has no shape:
   * only its element count is checked. Values convert as numpy's same_kind casts allow. */
  setInput(key, value) {
    const e = this._entries[this._inputEntry(key)];
    let dtype;
    let shape;
    let data; // storage typed array
    if (value instanceof NDArray) {
      dtype = value.dtype;
      shape = value.shape;
      data = value.toTypedArray();
    } else if (ArrayBuffer.isView(value)) {
      dtype = { Float32Array: "float32", Float64Array: "float64", Int8Array: "int8", Uint8Array: "uint8", Int16Array: "int16", Uint16Array: "uint16", Int32Array: "int32", Uint32Array: "uint32", BigInt64Array: "int64", BigUint64Array: "uint64" }[value.constructor.name];
      if (!dtype) throw new TypeError(`input ${pyRepr(key)}: got a ${value.constructor.name}, expected an NDArray or a typed array`);
      shape = null;
      data = value;
    } else {
      throw new TypeError(`input ${pyRepr(key)}: got ${typeof value}, expected an NDArray or a typed array`);
    }
    // bfloat16: into a bfloat16 entry floats round to its bit patterns, uint16/bfloat16 go as bit patterns; a
    // bfloat16 array into any other entry goes as its float32 values
    if (e.dtype === "bfloat16") {
      if (dtype === "float16" || dtype === "float32" || dtype === "float64") {
        data = Uint16Array.from(valuesOf(dtype, data), bfloat16Bits);
      } else if (dtype !== "uint16" && dtype !== "bfloat16") {
        throw new TypeError(`a bfloat16 input takes bfloat16, uint16 bit patterns or float values, got ${dtype}`);
      }
      dtype = "bfloat16";
    } else if (dtype === "bfloat16") {
      data = Float32Array.from(valuesOf("bfloat16", data));
      dtype = "float32";
    }
    if (data.length !== e.size) {
      throw new RangeError(`input ${pyRepr(key)}: got shape ${formatShape(shape ?? [data.length])}, the model expects ${e.dtype} ${formatShape(e.shape)}`);
    }
    if (shape !== null) {
      const squeeze = (s) => s.filter((d) => d !== 1).join(",");
      if (shape.join(",") !== e.shape.join(",") && squeeze(shape) !== squeeze(e.shape)) {
        throw new RangeError(`input ${pyRepr(key)}: got shape ${formatShape(shape)}, the model expects ${formatShape(e.shape)}`);
      }
    }
    if (dtype !== e.dtype && !canCastSameKind(dtype, e.dtype)) throw new TypeError(`input ${pyRepr(key)}: got ${dtype}, the model expects ${e.dtype}`);
    const conv = dtype === e.dtype ? data : convertValues(valuesOf(dtype, data), e.dtype);
    this._heap._u8().set(new Uint8Array(conv.buffer, conv.byteOffset, e.nbytes), e.ptr);
  }

  /** A copy of an input (or param) entry. */
  getInput(key) {
    return this._entryArray(this._inputEntry(key));
  }

  _entryArray(i) {
    const e = this._entries[i];
    const t = this._dynamic.has(i) ? this._dynamic.get(i) : this._entryTensor(i);
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength).slice();
    return new NDArray(t.shape, e.dtype, bytes);
  }

  /** Params-file bytes, or a Map (or object) name -> NDArray; every param of the graph must be there. */
  loadParams(params) {
    if (params instanceof Uint8Array || params instanceof ArrayBuffer) params = parseParams(params);
    const get = params instanceof Map ? (n) => params.get(n) : (n) => (Object.prototype.hasOwnProperty.call(params, n) ? params[n] : undefined);
    const missing = [...this._paramIndex.keys()].filter((n) => get(n) === undefined);
    if (missing.length) throw new RangeError(`params lack ${missing.length} tensor(s) the graph needs: ${missing.slice(0, 10).join(", ")}`);
    for (const [name, idx] of this._paramIndex) {
      const e = this._entries[idx];
      const src = get(name);
      if (!(src instanceof NDArray) || src.dtype !== e.dtype || src.shape.join(",") !== e.shape.join(",") || src.shape.length !== e.shape.length) {
        const what = src instanceof NDArray ? `${src.dtype} ${formatShape(src.shape)}` : typeof src;
        throw new GraphError(`param ${pyRepr(name)} is ${what}, the graph expects ${e.dtype} ${formatShape(e.shape)}`);
      }
      this._heap._u8().set(src._bytesView(), e.ptr);
    }
  }

  // -- running --------------------------------------------------------------------------------------------
  /** Run every node in order (a node whose "when" does not hold is skipped). */
  run() {
    const fns = this._kfn;
    const values = this._kvalues;
    const codes = this._kcodes;
    const nargs = this._knargs;
    const guards = this._guards;
    const skipped = this.skippedMask;
    const n = fns.length;
    if (this.module !== null && this.module.closed) throw new GraphError(`the graph's module ${this.module.name} was freed; load it again`);
    let k = 0;
    try {
      for (; k < n; k++) {
        const g = guards[k];
        if (g !== null && !this._holds(g)) {
          skipped[k] = 1;
          continue;
        }
        skipped[k] = 0;
        const f = fns[k];
        if (f !== null) {
          const rc = f(values[k], codes[k], nargs[k]);
          if (rc !== 0) throw this._kernelFailure(k, rc);
        } else {
          this._ncall[k]();
        }
      }
    } catch (exc) {
      if (exc instanceof WebAssembly.RuntimeError) {
        throw new KernelError(`node ${this._nodes[k].name} (${this._nodes[k].func}): the kernel trapped: ${exc.message}`);
      }
      throw exc;
    }
  }

  /** The nodes the last run() skipped (kernels of untaken run-time If branches), by name. */
  skipped() {
    return this._nodes.filter((_, k) => this.skippedMask[k]).map((nd) => nd.name);
  }

  get numOutputs() {
    return this.outputNames.length;
  }

  get numInputs() {
    return this.inputNames.length;
  }

  /** Output `index` (or name) as a host-homed NDArray copy; a data-dependent output has its real shape. */
  getOutput(index = 0) {
    if (typeof index === "string") {
      const at = this.outputNames.indexOf(index);
      if (at < 0) throw new RangeError(`the model has no output ${pyRepr(index)} (outputs: ${this.outputNames.join(", ")})`);
      index = at;
    }
    if (!(Number.isInteger(index) && index >= 0 && index < this.numOutputs)) {
      throw new RangeError(`output index ${index} out of range: the model has ${this.numOutputs} output(s)`);
    }
    return this._entryArray(this.graph.outputs[index]);
  }

  info() {
    const describe = (ids) => ids.map((i) => ({ name: this.graph.entries[i].name, shape: [...this.graph.entries[i].shape], dtype: this.graph.entries[i].dtype }));
    return {
      inputs: describe(this.graph.inputs),
      outputs: describe(this.graph.outputs),
      nodes: this._nodes.length,
      storage_bytes: this._storages.reduce((a, s) => a + Math.max(s.nbytes, 1), 0),
    };
  }

  // -- timing ---------------------------------------------------------------------------------------------
  /** Whole-model timing (tether.graph.benchmark): {samples: [seconds per run], number, median_ms, mean_ms,
   * min_ms}; onSample(index, seconds, number) as each sample is measured. Every node runs, as in tether_rpc. */
  async benchmark({ number = 10, repeat = 3, minRepeatMs = 0, warmup = 1, cooldownMs = 0, onSample = null } = {}) {
    const calls = this._calls;
    const runAll = () => {
      for (let k = 0; k < calls.length; k++) calls[k]();
    };
    return summarize(await timeEvaluator(runAll, { number, repeat, minRepeatMs, warmup, cooldownMs, onSample }));
  }

  /** Per-node timings in execution order (tether.graph.profile); onNode(record) as each node is measured. */
  async profile({ number = 5, repeat = 1, warmup = 1, onNode = null } = {}) {
    this.run(); // intermediates hold real values, so every node sees realistic data
    const records = [];
    const t0 = performance.now();
    for (let k = 0; k < this._nodes.length; k++) {
      const node = this._nodes[k];
      const rec = { index: k, name: node.name ?? "", func: node.func ?? `numpy:${node.numpy}`, ops: node.ops ?? "", seconds: 0.0 };
      const g = this._guards[k];
      if (g !== null && !this._holds(g)) {
        rec.skipped = true; // an untaken branch: its inputs were never computed
      } else {
        const res = await timeEvaluator(this._calls[k], { number, repeat, warmup });
        const sorted = [...res.samples].sort((a, b) => a - b);
        rec.seconds = sorted[sorted.length >> 1];
      }
      records.push(rec);
      if (onNode) onNode(rec);
    }
    const total = records.reduce((a, r) => a + r.seconds, 0);
    return { nodes: records, total_seconds: total, wall_seconds: (performance.now() - t0) / 1e3 };
  }

  _releaseMemory() {
    const heap = this._heap;
    if (heap && this._blocks && !(heap instanceof Module && heap.closed)) for (const p of this._blocks) heap._free(p);
    this._blocks = [];
  }

  /** Release the storages and argument blocks (the module stays loaded). */
  free() {
    this._releaseMemory();
    this._kfn = [];
    this._calls = [];
  }
}

/** Load a model from its three files' contents: deploy.json (text or object), the wasm bytes (or null for a
 * graph of numpy nodes only) and the params bytes (or null). */
export async function loadGraph(graphJson, wasmBytes, paramsBytes = null, { name = "deploy.wasm" } = {}) {
  const module = wasmBytes ? await loadModule(wasmBytes, { name }) : null;
  return new GraphExecutor(graphJson, module, paramsBytes);
}
