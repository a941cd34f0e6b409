// Loading tether wasm32 modules and calling their packed functions (WASM_ABI.md, docs/abi.md).
//
// loadModule vets the bytes before compiling them: the wasm header (an ELF module for another architecture is
// named as such), the metadata in the custom section "tether_meta" (ABI version, target arch, required
// features), then compiles, checks imports (none) and exports (memory, __heap_base, every function the
// metadata lists) and instantiates with an empty import object.
//
// Packed-function arguments (one 8-byte TetherValue + an i32 type code each, in module memory):
//   NDArray -> DLTENSOR (its cached DLTensor, after homing it in this module's memory)
//   integral number, bigint, boolean -> INT64;  non-integral number, Float64 -> FLOAT64
//   string -> STR (NUL-terminated UTF-8);  Uint8Array / ArrayBuffer -> BYTES;  null / undefined -> NULL
import { Float64 } from "./float.js";
import { lookup } from "./dtypes.js";
import { NDArray, empty, fromTypedArray, formatShape } from "./ndarray.js";
import { Allocator, OutOfMemory } from "./allocator.js";

export { Float64, NDArray, empty, fromTypedArray, Allocator, OutOfMemory };

export const ABI_VERSION = 1;
export const META_SECTION = "tether_meta";
export const TETHER_INT64 = 0;
export const TETHER_FLOAT64 = 1;
export const TETHER_HANDLE = 2;
export const TETHER_DLTENSOR = 3;
export const TETHER_STR = 4;
export const TETHER_BYTES = 5;
export const TETHER_NULL = 6;
const DLTENSOR_BYTES = 40;
const KDLCPU = 1;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;
// wasm features this runtime knows; simd128 and relaxed-simd are probed, the rest every engine with WebAssembly
// has today
const KNOWN_FEATURES = new Set(["simd128", "relaxed-simd", "bulk-memory", "nontrapping-fptoint", "sign-ext", "mutable-globals", "multivalue"]);
const ELF_MACHINES = { 3: "x86", 8: "mips", 40: "armv7", 62: "x86_64", 183: "aarch64", 243: "riscv" };

export class ModuleLoadError extends Error {
  constructor(message) {
    super(message);
    this.name = "ModuleLoadError";
  }
}

export class ArchMismatch extends ModuleLoadError {
  constructor(message) {
    super(message);
    this.name = "ArchMismatch";
  }
}

export class KernelError extends Error {
  constructor(message, code = 0) {
    super(message);
    this.name = "KernelError";
    this.code = code;
  }
}

function asBytes(bytes) {
  if (bytes instanceof Uint8Array) return bytes;
  if (bytes instanceof ArrayBuffer) return new Uint8Array(bytes);
  if (ArrayBuffer.isView(bytes)) return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  throw new TypeError(`loadModule: expected the module's bytes (Uint8Array or ArrayBuffer), got ${typeof bytes}`);
}

function readLeb(buf, pos) {
  let result = 0;
  let shift = 0;
  for (let k = 0; k < 5; k++) {
    if (pos >= buf.length) return null;
    const b = buf[pos++];
    result += (b & 0x7f) * 2 ** shift;
    if (!(b & 0x80)) return [result, pos];
    shift += 7;
  }
  return null;
}

/** The custom sections of a wasm binary, name -> [Uint8Array], read without compiling it. */
export function customSections(buf) {
  const out = new Map();
  let pos = 8;
  while (pos < buf.length) {
    const id = buf[pos++];
    const sz = readLeb(buf, pos);
    if (sz === null) break;
    const [size, start] = sz;
    const end = start + size;
    if (end > buf.length) break; // truncated: compile() names it
    if (id === 0) {
      const nl = readLeb(buf, start);
      if (nl !== null && nl[1] + nl[0] <= end) {
        const name = new TextDecoder().decode(buf.subarray(nl[1], nl[1] + nl[0]));
        if (!out.has(name)) out.set(name, []);
        out.get(name).push(buf.subarray(nl[1] + nl[0], end));
      }
    }
    pos = end;
  }
  return out;
}

// a module with one function () -> v128 whose body is `code` (then `end`)
function v128Probe(code) {
  const body = [0x00, ...code, 0x0b];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
    0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // type: () -> v128
    0x03, 0x02, 0x01, 0x00, // one function of type 0
    0x0a, body.length + 2, 0x01, body.length, ...body,
  ]);
}

const V128_ZERO = [0xfd, 0x0c, ...new Array(16).fill(0)]; // v128.const 0
const probes = new Map();

function validates(name, bytes) {
  if (!probes.has(name)) {
    let ok = false;
    try {
      ok = WebAssembly.validate(bytes);
    } catch {
      ok = false;
    }
    probes.set(name, ok);
  }
  return probes.get(name);
}

/** Whether this engine runs wasm SIMD (validates a function returning a v128 constant). */
export function hasSimd128() {
  return validates("simd128", v128Probe(V128_ZERO));
}

/** Whether this engine runs relaxed SIMD (i32x4.relaxed_trunc_f32x4_s). */
export function hasRelaxedSimd() {
  return validates("relaxed-simd", v128Probe([...V128_ZERO, 0xfd, 0x81, 0x02]));
}

function checkHeader(buf, label) {
  if (buf.length >= 20 && buf[0] === 0x7f && buf[1] === 0x45 && buf[2] === 0x4c && buf[3] === 0x46) {
    const little = buf[5] === 1;
    const machine = little ? buf[18] | (buf[19] << 8) : (buf[18] << 8) | buf[19];
    const arch = ELF_MACHINES[machine] ?? `ELF machine ${machine}`;
    throw new ArchMismatch(`${label} was built for ${arch} (an ELF shared library), but this runtime runs wasm32 modules: rebuild it with target="wasm32"`);
  }
  if (buf.length < 8 || buf[0] !== 0x00 || buf[1] !== 0x61 || buf[2] !== 0x73 || buf[3] !== 0x6d) {
    throw new ModuleLoadError(`${label} is not a WebAssembly module (no \\0asm magic): export a wasm32 build with export_library("x.wasm")`);
  }
  const version = buf[4] | (buf[5] << 8) | (buf[6] << 16) | (buf[7] << 24);
  if (version !== 1) throw new ModuleLoadError(`${label}: WebAssembly binary version ${version}; this runtime reads version 1`);
}

function readMetadata(buf, label) {
  const secs = customSections(buf).get(META_SECTION);
  if (!secs) {
    throw new ModuleLoadError(`${label} has no ${META_SECTION} custom section: it is not a tether module (build it with tether.build(..., target="wasm32") and export_library)`);
  }
  let meta;
  try {
    meta = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(secs[0]));
  } catch (exc) {
    throw new ModuleLoadError(`${label}: metadata in ${META_SECTION} is not valid JSON: ${exc.message}`);
  }
  if (meta === null || typeof meta !== "object" || Array.isArray(meta)) {
    throw new ModuleLoadError(`${label}: metadata must be a JSON object, got ${Array.isArray(meta) ? "list" : typeof meta}`);
  }
  if (meta.abi_version !== ABI_VERSION) {
    throw new ModuleLoadError(`${label} uses tether ABI version ${JSON.stringify(meta.abi_version)} but this runtime speaks version ${ABI_VERSION}: update the runtime or rebuild the module with a matching tether`);
  }
  const funcs = meta.functions;
  if (!Array.isArray(funcs) || !funcs.every((f) => f && typeof f === "object" && typeof f.name === "string")) {
    throw new ModuleLoadError(`${label}: metadata 'functions' must be a list of objects with a 'name'`);
  }
  return meta;
}

function checkTarget(meta, label) {
  const target = meta.target && typeof meta.target === "object" ? meta.target : {};
  const arch = target.arch;
  if (arch !== "wasm32") {
    throw new ArchMismatch(`${label} was built for ${arch ?? "an unknown architecture"} but this runtime runs wasm32 modules: rebuild it with target="wasm32"`);
  }
  const req = meta.requires;
  if (req && typeof req === "object") {
    if (req.isa !== undefined && req.isa !== "wasm32") {
      throw new ArchMismatch(`${label} needs instruction set ${req.isa}; this runtime runs wasm32`);
    }
    const feats = Array.isArray(req.features) ? req.features : [];
    const unknown = feats.filter((f) => !KNOWN_FEATURES.has(f));
    const lacking = feats.filter((f) => (f === "simd128" && !hasSimd128()) || (f === "relaxed-simd" && !hasRelaxedSimd()));
    if (lacking.length || unknown.length) {
      const what = [...lacking, ...unknown].join(", ");
      let hint;
      if (lacking.includes("simd128")) hint = 'rebuild it with target="wasm32-nosimd"';
      else if (lacking.includes("relaxed-simd")) hint = 'rebuild it with target="wasm32" (without +relaxed-simd), or run it on an engine with relaxed SIMD (Chrome 114+, node 22)';
      else hint = "rebuild it without them";
      throw new ArchMismatch(`${label} was built for ${target.preset ?? "wasm32"} and needs ${what}, which this WebAssembly engine lacks: ${hint}`);
    }
  }
}

/** Validate, compile and instantiate a tether wasm32 module. */
export async function loadModule(bytes, { name = "module.wasm" } = {}) {
  const buf = asBytes(bytes);
  checkHeader(buf, name);
  const meta = readMetadata(buf, name);
  checkTarget(meta, name);
  let compiled;
  try {
    compiled = await WebAssembly.compile(buf);
  } catch (exc) {
    throw new ModuleLoadError(`${name} is not a valid WebAssembly module: ${exc.message}`);
  }
  const imports = WebAssembly.Module.imports(compiled);
  if (imports.length) {
    const names = imports.slice(0, 8).map((i) => `${i.module}.${i.name}`).join(", ");
    throw new ModuleLoadError(`${name} imports ${names}; tether wasm modules are self-contained (no imports)`);
  }
  const exports = new Map(WebAssembly.Module.exports(compiled).map((e) => [e.name, e.kind]));
  if (exports.get("memory") !== "memory") throw new ModuleLoadError(`${name} does not export its memory ("memory")`);
  if (exports.get("__heap_base") !== "global") throw new ModuleLoadError(`${name} does not export __heap_base`);
  const missing = meta.functions.map((f) => f.name).filter((f) => exports.get(f) !== "function");
  if (missing.length) {
    throw new ModuleLoadError(`${name}: metadata lists ${missing.join(", ")} but the module does not export ${missing.length === 1 ? "it" : "them"}`);
  }
  let instance;
  try {
    instance = await WebAssembly.instantiate(compiled, {});
  } catch (exc) {
    throw new ModuleLoadError(`${name} failed to instantiate: ${exc.message}`);
  }
  return new Module(name, meta, instance);
}

function describe(value) {
  if (value instanceof NDArray || (value && typeof value === "object" && Array.isArray(value.shape) && typeof value.dtype === "string")) {
    return ["array", value.shape, value.dtype];
  }
  if (value === null || value === undefined) return ["NoneType", null, null];
  if (value instanceof Float64) return ["float", null, null];
  if (typeof value === "number") return [Number.isInteger(value) ? "int" : "float", null, null];
  if (typeof value === "bigint" || typeof value === "boolean") return ["int", null, null];
  if (typeof value === "string") return ["str", null, null];
  if (value instanceof Uint8Array || value instanceof ArrayBuffer) return ["bytes", null, null];
  return [value?.constructor?.name ?? typeof value, null, null];
}

export class Module {
  constructor(name, metadata, instance) {
    this.name = name;
    this.metadata = metadata;
    this.functions = metadata.functions.map((f) => f.name);
    this._infos = new Map(metadata.functions.map((f) => [f.name, f]));
    this._instance = instance;
    this._exports = instance.exports;
    this.memory = instance.exports.memory;
    this.allocator = new Allocator(this.memory, Number(instance.exports.__heap_base.value), name);
    this._homed = new Set(); // NDArrays whose data lives here
    this._funcs = new Map();
    this._buf = null;
    this._u8cache = null;
    this._dvcache = null;
  }

  get target() {
    return this.metadata.target ?? {};
  }

  get closed() {
    return this._instance === null;
  }

  _checkOpen(what) {
    if (this._instance === null) throw new ModuleLoadError(`${what}: module ${this.name} was freed; load it again`);
  }

  _refresh() {
    const b = this.memory.buffer;
    if (b !== this._buf) {
      this._buf = b;
      this._u8cache = new Uint8Array(b);
      this._dvcache = new DataView(b);
    }
  }

  /** A Uint8Array over the whole memory (valid until the next allocation). */
  _u8() {
    this._refresh();
    return this._u8cache;
  }

  _dv() {
    this._refresh();
    return this._dvcache;
  }

  _alloc(nbytes) {
    this._checkOpen("alloc");
    return this.allocator.alloc(nbytes);
  }

  _free(ptr) {
    if (this._instance !== null) this.allocator.free(ptr);
  }

  /** A DLTensor (plus its shape array) in this memory, describing `shape`/`dtype` at `dataPtr`. */
  _makeDLTensor(dataPtr, shape, dtype) {
    const r = lookup(dtype);
    const ptr = this._alloc(DLTENSOR_BYTES + 8 * shape.length);
    const dv = this._dv();
    dv.setUint32(ptr, dataPtr, true);
    dv.setInt32(ptr + 4, KDLCPU, true);
    dv.setInt32(ptr + 8, 0, true);
    dv.setInt32(ptr + 12, shape.length, true);
    dv.setUint8(ptr + 16, r.code);
    dv.setUint8(ptr + 17, r.bits);
    dv.setUint16(ptr + 18, 1, true);
    dv.setUint32(ptr + 20, ptr + DLTENSOR_BYTES, true);
    dv.setUint32(ptr + 24, 0, true);
    dv.setUint32(ptr + 28, 0, true);
    dv.setBigUint64(ptr + 32, 0n, true);
    for (let d = 0; d < shape.length; d++) dv.setBigInt64(ptr + DLTENSOR_BYTES + 8 * d, BigInt(shape[d]), true);
    return ptr;
  }

  /** Home `arr` here (copying it from the host or another module) and return its DLTensor. */
  _home(arr) {
    arr._check();
    if (arr._module === this) return arr._dltensor;
    this._checkOpen("home an array");
    const bytes = arr._bytesView();
    const ptr = this._alloc(arr.byteLength);
    let dlt;
    try {
      dlt = this._makeDLTensor(ptr, arr.shape, arr.dtype);
    } catch (exc) {
      this._free(ptr);
      throw exc;
    }
    this._u8().set(arr._module === null ? bytes : arr._bytesView(), ptr); // (re-read: the alloc may have grown memory)
    if (arr._module !== null) arr._module._releaseArray(arr);
    arr._host = null;
    arr._module = this;
    arr._ptr = ptr;
    arr._dltensor = dlt;
    this._homed.add(arr);
    return dlt;
  }

  _releaseArray(arr) {
    this._homed.delete(arr);
    this._free(arr._ptr);
    this._free(arr._dltensor);
    arr._module = null;
    arr._ptr = 0;
    arr._dltensor = 0;
  }

  /** The packed function `name`: callable as fn(...args); fn.prepare(...args) converts once and returns a
   * zero-argument call (graph executors and timing loops). */
  getFunction(name) {
    this._checkOpen(name);
    let fn = this._funcs.get(name);
    if (fn) return fn;
    if (!this._infos.has(name)) throw new ModuleLoadError(`${this.name} has no function '${name}'; it has: ${this.functions.join(", ") || "(none)"}`);
    const pf = new PackedFunction(this, name, this._infos.get(name), this._exports[name]);
    fn = (...args) => pf.call(args);
    Object.defineProperty(fn, "name", { value: name });
    fn.packed = pf;
    fn.argInfo = pf.argInfo;
    fn.prepare = (...args) => pf.prepare(args);
    this._funcs.set(name, fn);
    return fn;
  }

  /** Move every array homed here back to host memory, then drop the instance. */
  free() {
    if (this._instance === null) return;
    for (const arr of [...this._homed]) {
      const bytes = arr._bytesView().slice();
      arr._module = null;
      arr._ptr = 0;
      arr._dltensor = 0;
      arr._host = bytes;
    }
    this._homed.clear();
    for (const fn of this._funcs.values()) fn.packed._scratch = 0;
    this._funcs.clear();
    this._instance = null;
    this._exports = null;
  }
}

export class PackedFunction {
  constructor(module, name, info, wasmFn) {
    this.module = module;
    this.name = name;
    this.info = info;
    this.argInfo = Array.isArray(info.args) ? info.args.filter((a) => a && typeof a === "object") : [];
    this._fn = wasmFn;
    this._scratch = 0; // a reused values+codes block for unprepared calls
    this._scratchN = -1;
  }

  _argname(i) {
    return i < this.argInfo.length && "name" in this.argInfo[i] ? ` '${this.argInfo[i].name}'` : "";
  }

  /** Write args into values/codes blocks; returns the temporaries to free after the call. */
  _pack(args, values, codes) {
    const m = this.module;
    const temps = [];
    // home arrays and allocate temporaries first: allocation may grow memory (and detach old views)
    const slots = args.map((a, i) => {
      if (a instanceof NDArray) return [TETHER_DLTENSOR, m._home(a)];
      if (a === null || a === undefined) return [TETHER_NULL, 0];
      if (a instanceof Float64) return [TETHER_FLOAT64, a.value];
      if (typeof a === "boolean") return [TETHER_INT64, a ? 1n : 0n];
      if (typeof a === "bigint") {
        if (a < INT64_MIN || a > INT64_MAX) throw new KernelError(`${this.name}: argument ${i}${this._argname(i)} = ${a} does not fit in int64`);
        return [TETHER_INT64, a];
      }
      if (typeof a === "number") {
        if (Number.isInteger(a)) {
          if (!Number.isSafeInteger(a) && Math.abs(a) >= 2 ** 63) throw new KernelError(`${this.name}: argument ${i}${this._argname(i)} = ${a} does not fit in int64`);
          return [TETHER_INT64, BigInt(a)];
        }
        return [TETHER_FLOAT64, a];
      }
      if (typeof a === "string") {
        const enc = new TextEncoder().encode(a);
        const p = m._alloc(enc.byteLength + 1);
        temps.push(p);
        const u8 = m._u8();
        u8.set(enc, p);
        u8[p + enc.byteLength] = 0;
        return [TETHER_STR, p];
      }
      if (a instanceof Uint8Array || a instanceof ArrayBuffer) {
        const bytes = a instanceof ArrayBuffer ? new Uint8Array(a) : a;
        const p = m._alloc(bytes.byteLength + 16);
        temps.push(p);
        m._u8().set(bytes, p + 16);
        const dv = m._dv();
        dv.setUint32(p, p + 16, true);
        dv.setUint32(p + 4, 0, true);
        dv.setBigUint64(p + 8, BigInt(bytes.byteLength), true);
        return [TETHER_BYTES, p];
      }
      for (const t of temps) m._free(t);
      throw new KernelError(`${this.name}: argument ${i}${this._argname(i)} has unsupported type ${describe(a)[0]} (pass NDArray, number, bigint, Float64, string, Uint8Array or null)`);
    });
    const dv = m._dv();
    slots.forEach(([code, v], i) => {
      const at = values + 8 * i;
      if (code === TETHER_INT64) dv.setBigInt64(at, v, true);
      else if (code === TETHER_FLOAT64) dv.setFloat64(at, v, true);
      else {
        dv.setUint32(at, v, true);
        dv.setUint32(at + 4, 0, true);
      }
      dv.setInt32(codes + 4 * i, code, true);
    });
    return temps;
  }

  call(args) {
    const m = this.module;
    m._checkOpen(this.name);
    const n = args.length;
    if (this._scratchN < n) {
      if (this._scratch) m._free(this._scratch);
      this._scratch = 0;
      this._scratch = m._alloc(12 * Math.max(n, 1));
      this._scratchN = Math.max(n, 1);
    }
    const values = this._scratch;
    const codes = values + 8 * this._scratchN;
    const temps = this._pack(args, values, codes);
    let rc;
    try {
      rc = this._invoke(values, codes, n);
    } finally {
      for (const t of temps) m._free(t);
    }
    if (rc !== 0) throw this.decodeError(rc, args);
  }

  _invoke(values, codes, n) {
    try {
      return this._fn(values, codes, n);
    } catch (exc) {
      if (exc instanceof WebAssembly.RuntimeError) throw new KernelError(`${this.name}: the kernel trapped: ${exc.message}`);
      throw exc;
    }
  }

  /** Convert `args` once (arrays are homed here and must stay alive) and return a zero-argument call. */
  prepare(args) {
    const m = this.module;
    m._checkOpen(this.name);
    const n = args.length;
    const values = m._alloc(12 * Math.max(n, 1));
    const codes = values + 8 * Math.max(n, 1);
    const temps = this._pack(args, values, codes);
    const arrays = args.map((a, i) => [a, i]).filter(([a]) => a instanceof NDArray);
    const call = () => {
      if (m._instance === null) throw new ModuleLoadError(`${this.name}: module ${m.name} was freed; load it again`);
      for (const [a, i] of arrays) {
        if (a._module !== m) throw new KernelError(`${this.name}: argument ${i}${this._argname(i)} left module ${m.name} (freed or passed to another module) after prepare(); prepare the call again`);
      }
      const rc = this._invoke(values, codes, n);
      if (rc !== 0) throw this.decodeError(rc, args);
    };
    call.release = () => {
      for (const t of temps) m._free(t);
      m._free(values);
    };
    return call;
  }

  /** A nonzero return code (docs/abi.md "Return codes") as a readable KernelError, worded as tether_rpc's. */
  decodeError(rc, args = []) {
    rc = rc >>> 0;
    const kind = rc >>> 24;
    const i = (rc >>> 8) & 0xffff;
    const d = rc & 0xff;
    const low24 = rc & 0xffffff;
    const name = this.name;
    const expected = i < this.argInfo.length ? this.argInfo[i] : {};
    const ename = "name" in expected ? ` '${expected.name}'` : "";
    const [actualKind, actualShape, actualDtype] = i < args.length ? describe(args[i]) : ["?", null, null];
    const expShape = Array.isArray(expected.shape) ? expected.shape : null;
    let msg;
    if (kind === 1) {
      msg = `${name}: expected ${this.argInfo.length} arguments (${this.argInfo.map((a) => a.name ?? "?").join(", ")}), got ${low24}`;
    } else if (kind === 2) {
      msg = `${name}: argument ${i}${ename} must be an array, got ${actualKind}`;
    } else if (kind === 3) {
      msg = `${name}: argument ${i}${ename} has ${actualShape ? actualShape.length : "the wrong number of"} dimensions${actualShape ? ` (shape ${formatShape(actualShape)})` : ""}, expected ${expShape ? expShape.length : "another number"}${expShape ? ` (shape ${formatShape(expShape)})` : ""}`;
    } else if (kind === 4) {
      msg = `${name}: argument ${i}${ename} has dtype ${actualDtype ?? "?"}, expected ${expected.dtype ?? "another dtype"}`;
    } else if (kind === 5) {
      msg = `${name}: argument ${i}${ename} has shape ${actualShape ? formatShape(actualShape) : "?"}, expected ${expShape ? formatShape(expShape) : "?"} (dimension ${d} differs)`;
    } else if (kind === 6) {
      msg = `${name}: argument ${i}${ename} is not a compact row-major array (dimension ${d})`;
    } else if (kind === 7) {
      msg = `${name}: argument ${i}${ename} has a NULL data pointer`;
    } else if (kind === 8) {
      msg = `${name}: a parallel task failed with code ${low24}`;
    } else if (kind === 9) {
      msg = `${name}: host function ${low24} failed (host functions are not supported on wasm32)`;
    } else {
      msg = `${name}: failed with return code ${rc} (0x${rc.toString(16).padStart(8, "0")})`;
    }
    return new KernelError(msg, rc);
  }
}
