// The params file (docs/params.md): named tensors, magic "TTHRPRM\0", version 1, records whose data is 64-byte
// aligned from the start of the file. Read and written here with DataView only (no node modules), with the
// validation and messages of rpc_server/tether_rpc/params.py.
import { NDArray, formatShape } from "./ndarray.js";
import { DTYPES, DTYPE_NAMES } from "./dtypes.js";

const MAGIC = [0x54, 0x54, 0x48, 0x52, 0x50, 0x52, 0x4d, 0x00]; // "TTHRPRM\0"
export const VERSION = 1;
const ALIGN = 64;
const MAX_NDIM = 32;
const MAX_NAME = 4096;
const PARAMS_DTYPES = [...DTYPE_NAMES].sort();

export class ParamsFormatError extends Error {
  constructor(message) {
    super(message);
    this.name = "ParamsFormatError";
  }
}

function asBytes(source) {
  if (source instanceof Uint8Array) return source;
  if (source instanceof ArrayBuffer) return new Uint8Array(source);
  if (ArrayBuffer.isView(source)) return new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
  throw new TypeError(`params: expected bytes (Uint8Array or ArrayBuffer), got ${typeof source}`);
}

function pyTuple(shape) {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

function pyRepr(s) {
  return `'${s.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;
}

/** Parse params-file bytes into Map name -> NDArray (host-homed copies). */
export function loadParams(source) {
  const buf = asBytes(source);
  const size = buf.byteLength;
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  if (size < 16) throw new ParamsFormatError(`params file too short (${size} bytes) for its header`);
  for (let k = 0; k < 8; k++) {
    if (buf[k] !== MAGIC[k]) {
      const shown = Array.from(buf.subarray(0, 8), (b) => (b >= 0x20 && b < 0x7f && b !== 0x5c && b !== 0x27 ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, "0")}`)).join("");
      throw new ParamsFormatError(`not a tether params file (magic b'${shown}')`);
    }
  }
  const version = dv.getUint32(8, true);
  const count = dv.getUint32(12, true);
  if (version !== VERSION) throw new ParamsFormatError(`params format version ${version}; this runtime reads version ${VERSION}`);
  let off = 16;
  const out = new Map();
  const truncated = () => new ParamsFormatError(`params file truncated at byte ${off} (record ${out.size} of ${count})`);
  const need = (n) => {
    if (off + n > size) throw truncated();
  };
  const text = (n, what, ascii) => {
    need(n);
    const raw = buf.subarray(off, off + n);
    off += n;
    if (ascii && raw.some((b) => b > 0x7f)) throw new ParamsFormatError(`params file: record ${out.size}'s ${what} is not ascii`);
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(raw);
    } catch {
      throw new ParamsFormatError(`params file: record ${out.size}'s ${what} is not utf-8`);
    }
  };
  for (let r = 0; r < count; r++) {
    need(2);
    const nameLen = dv.getUint16(off, true);
    off += 2;
    const name = text(nameLen, "name", false);
    need(1);
    const dlen = dv.getUint8(off);
    off += 1;
    const dtype = text(dlen, "dtype", true);
    if (!PARAMS_DTYPES.includes(dtype)) throw new ParamsFormatError(`param ${pyRepr(name)} has unknown dtype ${pyRepr(dtype)}`);
    need(1);
    const ndim = dv.getUint8(off);
    off += 1;
    if (ndim > MAX_NDIM) throw new ParamsFormatError(`param ${pyRepr(name)} has rank ${ndim} (limit ${MAX_NDIM})`);
    need(8 * ndim);
    const shape = [];
    for (let d = 0; d < ndim; d++) shape.push(dv.getBigInt64(off + 8 * d, true));
    off += 8 * ndim;
    if (shape.some((d) => d < 0n)) throw new ParamsFormatError(`param ${pyRepr(name)} has a negative extent in ${pyTuple(shape)}`);
    need(8);
    const nbytes = dv.getBigUint64(off, true);
    off += 8;
    let expect = BigInt(DTYPES[dtype].itemsize);
    for (const d of shape) expect *= d; // exact: a forged size cannot wrap around
    if (nbytes !== expect) {
      throw new ParamsFormatError(`param ${pyRepr(name)}: ${nbytes} data bytes for ${dtype} ${pyTuple(shape)} (expected ${expect})`);
    }
    off += (ALIGN - (off % ALIGN)) % ALIGN;
    if (BigInt(off) + nbytes > BigInt(size)) throw new ParamsFormatError(`param ${pyRepr(name)}: data runs past the end of the file`);
    const n = Number(nbytes);
    const dims = shape.map(Number);
    if (!dims.every(Number.isSafeInteger)) {
      throw new ParamsFormatError(`param ${pyRepr(name)}: the shape ${pyTuple(shape)} is too large for this runtime`);
    }
    out.set(name, new NDArray(dims, dtype, buf.slice(off, off + n)));
    off += n;
  }
  return out;
}

function entriesOf(params) {
  if (params instanceof Map) return [...params.entries()];
  return Object.entries(params);
}

/** Serialize Map (or object) name -> NDArray into params-file bytes. */
export function saveParams(params) {
  const enc = new TextEncoder();
  const items = entriesOf(params);
  const chunks = [];
  let length = 0;
  const push = (u8) => {
    chunks.push(u8);
    length += u8.byteLength;
  };
  const head = new Uint8Array(16);
  head.set(MAGIC);
  new DataView(head.buffer).setUint32(8, VERSION, true);
  new DataView(head.buffer).setUint32(12, items.length, true);
  push(head);
  for (const [name, arr] of items) {
    if (!(arr instanceof NDArray)) throw new TypeError(`param ${pyRepr(name)}: expected an NDArray, got ${typeof arr}`);
    const rawName = enc.encode(name);
    if (rawName.byteLength > MAX_NAME || arr.shape.length > MAX_NDIM) {
      throw new RangeError(`param ${pyRepr(name)}: name longer than ${MAX_NAME} bytes or rank above ${MAX_NDIM}`);
    }
    const ndim = arr.shape.length;
    const rec = new Uint8Array(2 + rawName.byteLength + 1 + arr.dtype.length + 1 + 8 * ndim + 8);
    const dv = new DataView(rec.buffer);
    let o = 0;
    dv.setUint16(o, rawName.byteLength, true);
    o += 2;
    rec.set(rawName, o);
    o += rawName.byteLength;
    dv.setUint8(o++, arr.dtype.length);
    rec.set(enc.encode(arr.dtype), o);
    o += arr.dtype.length;
    dv.setUint8(o++, ndim);
    for (const d of arr.shape) {
      dv.setBigInt64(o, BigInt(d), true);
      o += 8;
    }
    dv.setBigUint64(o, BigInt(arr.byteLength), true);
    push(rec);
    const pad = (ALIGN - (length % ALIGN)) % ALIGN;
    if (pad) push(new Uint8Array(pad));
    push(arr.bytes());
  }
  const out = new Uint8Array(length);
  let o = 0;
  for (const c of chunks) {
    out.set(c, o);
    o += c.byteLength;
  }
  return out;
}

export { formatShape };
