// The dtype table of tether (rpc_server/tether_rpc/dtypes.py): name, kind, storage width, DLPack code and the
// typed array that holds the elements. float16 and bfloat16 have no typed array in every engine, so both are
// stored as Uint16Array bit patterns (as the Python device runtime stores bfloat16), bool as one byte.

export const DL_INT = 0;
export const DL_UINT = 1;
export const DL_FLOAT = 2;
export const DL_BFLOAT = 4;
export const DL_BOOL = 6;

function row(name, kind, bits, code, Typed) {
  return Object.freeze({ name, kind, bits, code, itemsize: bits / 8, Typed });
}

export const DTYPES = Object.freeze({
  bool: row("bool", "bool", 8, DL_BOOL, Uint8Array),
  int8: row("int8", "int", 8, DL_INT, Int8Array),
  uint8: row("uint8", "uint", 8, DL_UINT, Uint8Array),
  int16: row("int16", "int", 16, DL_INT, Int16Array),
  uint16: row("uint16", "uint", 16, DL_UINT, Uint16Array),
  int32: row("int32", "int", 32, DL_INT, Int32Array),
  uint32: row("uint32", "uint", 32, DL_UINT, Uint32Array),
  int64: row("int64", "int", 64, DL_INT, BigInt64Array),
  uint64: row("uint64", "uint", 64, DL_UINT, BigUint64Array),
  float16: row("float16", "float", 16, DL_FLOAT, Uint16Array),
  bfloat16: row("bfloat16", "bfloat", 16, DL_BFLOAT, Uint16Array),
  float32: row("float32", "float", 32, DL_FLOAT, Float32Array),
  float64: row("float64", "float", 64, DL_FLOAT, Float64Array),
});

export const DTYPE_NAMES = Object.freeze(Object.keys(DTYPES));

/** The row of a dtype name; TypeError naming the known ones. */
export function lookup(name) {
  const r = typeof name === "string" && Object.prototype.hasOwnProperty.call(DTYPES, name) ? DTYPES[name] : null;
  if (r === null) throw new TypeError(`unsupported dtype ${JSON.stringify(name)}; tether supports ${DTYPE_NAMES.join(", ")}`);
  return r;
}

/** The dtype name for a (code, bits) pair of a DLTensor, or null. */
export function byDlpack(code, bits) {
  for (const r of Object.values(DTYPES)) if (r.code === code && r.bits === bits) return r.name;
  return null;
}

/** The dtype a typed array holds by default (Uint16Array: uint16, never float16/bfloat16). */
export function dtypeOfTyped(typed) {
  if (typed instanceof Float32Array) return "float32";
  if (typed instanceof Float64Array) return "float64";
  if (typed instanceof Int8Array) return "int8";
  if (typed instanceof Uint8Array || typed instanceof Uint8ClampedArray) return "uint8";
  if (typed instanceof Int16Array) return "int16";
  if (typed instanceof Uint16Array) return "uint16";
  if (typed instanceof Int32Array) return "int32";
  if (typed instanceof Uint32Array) return "uint32";
  if (typed instanceof BigInt64Array) return "int64";
  if (typed instanceof BigUint64Array) return "uint64";
  return null;
}

// numpy's can_cast(src, dst, "same_kind") over the numeric types (bfloat16 is handled by its callers)
const SAME_KIND = {
  bool: DTYPE_NAMES.filter((n) => n !== "bfloat16"),
  int8: ["int8", "int16", "int32", "int64", "float16", "float32", "float64"],
  int16: ["int8", "int16", "int32", "int64", "float16", "float32", "float64"],
  int32: ["int8", "int16", "int32", "int64", "float16", "float32", "float64"],
  int64: ["int8", "int16", "int32", "int64", "float16", "float32", "float64"],
  float16: ["float16", "float32", "float64"],
  float32: ["float16", "float32", "float64"],
  float64: ["float16", "float32", "float64"],
};
for (const u of ["uint8", "uint16", "uint32", "uint64"]) {
  SAME_KIND[u] = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"];
}

export function canCastSameKind(src, dst) {
  return src === dst || (SAME_KIND[src] || []).includes(dst);
}

// ---------------------------------------------------------------------------------------------- half floats
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float value -> bfloat16 bits, rounded to nearest even from float32 (a float64 is first rounded to float32,
 * as tether_rpc.dtypes.bfloat16_bits); NaN stays a quiet NaN. */
export function bfloat16Bits(value) {
  f32[0] = value;
  const u = u32[0];
  if (Number.isNaN(f32[0])) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) / 65536) & 0xffff;
}

/** bfloat16 bits -> the float32 value (exact). */
export function bfloat16ToNumber(bits) {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0];
}

/** float16 bits -> its value (exact). */
export function float16ToNumber(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const man = bits & 0x3ff;
  if (exp === 0) return sign * man * 2 ** -24;
  if (exp === 31) return man ? NaN : sign * Infinity;
  return sign * (1024 + man) * 2 ** (exp - 25);
}

/** A number -> float16 bits, rounded once to nearest even (numpy's astype(float16) of a float64). */
export function float16Bits(value) {
  if (Number.isNaN(value)) return 0x7e00;
  const sign = value < 0 || Object.is(value, -0) ? 0x8000 : 0;
  let a = Math.abs(value);
  if (a === Infinity) return sign | 0x7c00;
  if (a < 2 ** -24 * 0.5) return sign; // below half the smallest subnormal (ties handled below)
  let exp = Math.floor(Math.log2(a));
  if (2 ** exp > a) exp -= 1;
  else if (2 ** (exp + 1) <= a) exp += 1;
  if (exp < -14) {
    // subnormal: units of 2^-24
    const q = roundEven(a / 2 ** -24);
    return sign | q; // q == 1024 becomes the smallest normal, which is the right bit pattern
  }
  const q = roundEven(a / 2 ** (exp - 10)); // 1024..2048
  let e = exp + 15;
  let m = q - 1024;
  if (q === 2048) {
    e += 1;
    m = 0;
  }
  if (e >= 31) return sign | 0x7c00;
  return sign | (e << 10) | m;
}

function roundEven(x) {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

// ------------------------------------------------------------------------- element values of any dtype
/** Element k of raw storage `data` (the dtype's typed array) as a JS value: a number, or a bigint for the
 * 64-bit integers; float16/bfloat16 decoded to their values, bool as 0/1. */
export function readValue(dtype, data, k) {
  if (dtype === "float16") return float16ToNumber(data[k]);
  if (dtype === "bfloat16") return bfloat16ToNumber(data[k]);
  return data[k];
}

/** Storage of `count` elements of `dtype` holding `values` (numbers or bigints) converted as numpy's unsafe
 * astype does for in-range values: floats truncate toward zero into integers, nonzero is true. */
export function convertValues(values, dtype) {
  const r = lookup(dtype);
  const n = values.length;
  const out = new r.Typed(n);
  if (dtype === "bool") {
    for (let k = 0; k < n; k++) {
      const v = values[k];
      out[k] = typeof v === "bigint" ? (v !== 0n ? 1 : 0) : (v !== 0 ? 1 : 0); // NaN is true, as numpy
    }
  } else if (dtype === "float16") {
    for (let k = 0; k < n; k++) out[k] = float16Bits(Number(values[k]));
  } else if (dtype === "bfloat16") {
    for (let k = 0; k < n; k++) out[k] = bfloat16Bits(Number(values[k]));
  } else if (r.bits === 64 && r.kind !== "float") {
    const wrap = r.kind === "int" ? (b) => BigInt.asIntN(64, b) : (b) => BigInt.asUintN(64, b);
    for (let k = 0; k < n; k++) {
      const v = values[k];
      out[k] = typeof v === "bigint" ? wrap(v) : wrap(BigInt(Number.isFinite(v) ? Math.trunc(v) : 0));
    }
  } else {
    // typed-array stores truncate and wrap integers, round floats
    for (let k = 0; k < n; k++) {
      const v = values[k];
      out[k] = typeof v === "bigint" ? (r.kind === "float" ? Number(v) : Number(BigInt.asIntN(32, v))) : v;
    }
  }
  return out;
}

/** All elements of storage `data` as JS values (see readValue). */
export function valuesOf(dtype, data) {
  if (dtype !== "float16" && dtype !== "bfloat16") return data;
  const out = new Float64Array(data.length);
  for (let k = 0; k < data.length; k++) out[k] = readValue(dtype, data, k);
  return out;
}
