// NDArray: a C-contiguous tensor homed in host memory (an ArrayBuffer) until it is first passed to a function
// of a module; it then moves into that module's linear memory and stays there (so repeated calls and timing
// loops copy nothing). Passing it to another module copies it over; freeing its module moves it back home.
import { DTYPE_NAMES, dtypeOfTyped, lookup, convertValues, valuesOf, canCastSameKind } from "./dtypes.js";

function normalizeShape(shape) {
  const s = typeof shape === "number" || typeof shape === "bigint" ? [shape] : Array.from(shape ?? []);
  const out = s.map((d) => Number(d));
  if (!out.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new TypeError(`shape must be a sequence of non-negative integers, got [${s.join(", ")}]`);
  }
  return out;
}

export function sizeOf(shape) {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

export function formatShape(shape) {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

export class NDArray {
  /** Use empty() / fromTypedArray(); `bytes` (a Uint8Array this array takes over) holds the elements. */
  constructor(shape, dtype = "float32", bytes = null) {
    this.shape = Object.freeze(normalizeShape(shape));
    this.dtype = lookup(dtype).name;
    this.size = sizeOf(this.shape);
    this.byteLength = this.size * lookup(dtype).itemsize;
    if (bytes !== null && bytes.byteLength !== this.byteLength) {
      throw new RangeError(`${bytes.byteLength} bytes for ${this.dtype} ${formatShape(this.shape)} (expected ${this.byteLength})`);
    }
    this._host = bytes ?? new Uint8Array(this.byteLength); // host home, or null while homed in a module
    this._module = null; // the Module whose memory holds it
    this._ptr = 0; // its data in that memory
    this._dltensor = 0; // its DLTensor (and shape array) in that memory
    this._freed = false;
  }

  /** Where the array lives: "host" or the module's name. */
  get home() {
    this._check();
    return this._module === null ? "host" : this._module.name;
  }

  _check() {
    if (this._freed) throw new Error("NDArray was freed");
  }

  /** The live bytes (a view: valid until the next allocation in its module). */
  _bytesView() {
    this._check();
    if (this._module === null) return this._host;
    return this._module._u8().subarray(this._ptr, this._ptr + this.byteLength);
  }

  /** A copy of the raw bytes (little-endian elements, C order). */
  bytes() {
    return this._bytesView().slice();
  }

  /** A copy of the elements as the dtype's typed array (Uint16Array bit patterns for float16/bfloat16). */
  toTypedArray() {
    const b = this.bytes();
    return new (lookup(this.dtype).Typed)(b.buffer, 0, this.size);
  }

  /** The elements as numbers (bigints for 64-bit integers); float16/bfloat16 decoded. */
  toValues() {
    return valuesOf(this.dtype, this.toTypedArray());
  }

  /** Copy elements in: the dtype's typed array (or raw Uint8Array bytes) of the same size, or any typed array
   * or plain array of `size` elements, converted (floats truncate into integers). */
  copyFrom(src) {
    const view = this._bytesView();
    const r = lookup(this.dtype);
    if (src instanceof NDArray) {
      if (src.size !== this.size) throw new RangeError(`copyFrom: ${src.size} elements into an array of ${this.size}`);
      if (src.dtype === this.dtype) view.set(src._bytesView());
      else this.copyFrom(src.toValues());
      return this;
    }
    if (ArrayBuffer.isView(src) && src.constructor === r.Typed && src.length === this.size) {
      view.set(new Uint8Array(src.buffer, src.byteOffset, src.byteLength));
      return this;
    }
    if (src instanceof Uint8Array && src.byteLength === this.byteLength) {
      view.set(src);
      return this;
    }
    if (src instanceof ArrayBuffer && src.byteLength === this.byteLength) {
      view.set(new Uint8Array(src));
      return this;
    }
    if ((ArrayBuffer.isView(src) || Array.isArray(src)) && src.length === this.size) {
      const conv = convertValues(src, this.dtype);
      view.set(new Uint8Array(conv.buffer, conv.byteOffset, conv.byteLength));
      return this;
    }
    const what = ArrayBuffer.isView(src) ? `${src.constructor.name} of ${src.length}` : typeof src;
    throw new TypeError(`copyFrom: got ${what}, expected ${this.size} elements (or ${this.byteLength} bytes) for ${this.dtype} ${formatShape(this.shape)}`);
  }

  /** Release its memory (in its module, or the host buffer); the array is unusable afterwards. */
  free() {
    if (this._freed) return;
    if (this._module !== null) this._module._releaseArray(this);
    this._host = null;
    this._freed = true;
  }

  toString() {
    return `NDArray(${this.dtype} ${formatShape(this.shape)} @ ${this._freed ? "freed" : this.home})`;
  }
}

/** A host-homed array of zeros. */
export function empty(shape, dtype = "float32") {
  return new NDArray(shape, dtype);
}

/** A host-homed array holding a copy of `typed` (dtype defaults to the typed array's own). */
export function fromTypedArray(typed, shape = null, dtype = null) {
  const dt = dtype ?? dtypeOfTyped(typed);
  if (dt === null) throw new TypeError(`fromTypedArray: cannot infer a dtype for ${typed?.constructor?.name}; name one (${DTYPE_NAMES.join(", ")})`);
  const arr = new NDArray(shape ?? [typed.length], dt);
  arr.copyFrom(typed);
  return arr;
}

export { canCastSameKind };
