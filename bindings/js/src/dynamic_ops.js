// The numpy ops on data-dependent values (casts, layout, slicing, indexing, elementwise, reductions): a port of
// rpc_server/tether_rpc/dynamic_ops.py with the same results bit for bit. Floats compute in float64 (JS numbers)
// and round once to the output dtype, integers compute as BigInt and wrap to their width, sums accumulate in
// index order. numpy_ops.js puts these ops in its OPS.
import { convertValues, valuesOf, lookup } from "./dtypes.js";
import { sizeOf as size } from "./ndarray.js";
import { NumpyOpError, castTensor, takeAxis, tensor } from "./tensors.js";

const FLOATS = new Set(["float16", "bfloat16", "float32", "float64"]);

function stridesOf(shape) {
  const st = new Array(shape.length);
  let s = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d];
  }
  return st;
}

function pyShape(shape) {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

/** For each element of `outShape` in C order, the storage index base + sum(index[d] * steps[d]). */
function walk(outShape, steps, base = 0) {
  const n = size(outShape);
  const at = new Float64Array(n);
  const nd = outShape.length;
  const idx = new Array(nd).fill(0);
  let off = base;
  for (let k = 0; k < n; k++) {
    at[k] = off;
    for (let d = nd - 1; d >= 0; d--) {
      idx[d] += 1;
      off += steps[d];
      if (idx[d] < outShape[d]) break;
      off -= steps[d] * idx[d];
      idx[d] = 0;
    }
  }
  return at;
}

function pick(x, shape, at) {
  const out = new (lookup(x.dtype).Typed)(at.length);
  for (let k = 0; k < at.length; k++) out[k] = x.data[at[k]];
  return tensor(x.dtype, shape, out);
}

// ------------------------------------------------------------------------------------------ casts
function dynCast(attrs, x) {
  if (attrs.from === attrs.to) return [tensor(x.dtype, x.shape, x.data.slice())];
  return [castTensor(x, attrs.to)];
}

// ------------------------------------------------------------------------------------------ layout
function dynTranspose(attrs, x) {
  const perm = attrs.perm.map(Number);
  const st = stridesOf(x.shape);
  const shape = perm.map((p) => x.shape[p]);
  return [pick(x, shape, walk(shape, perm.map((p) => st[p])))];
}

function prod(dims) {
  let n = 1;
  for (const d of dims) n *= d;
  return n;
}

function reshapeTarget(mode, attrs, shape) {
  if (mode === "reshape") {
    const out = attrs.shape.map((d, i) => (Number(d) === 0 && i < shape.length ? shape[i] : Number(d)));
    const m = out.indexOf(-1);
    if (m >= 0) {
      const known = prod(out.filter((d) => d !== -1));
      const total = prod(shape);
      if (known === 0 || total % known) throw new NumpyOpError(`Reshape of a ${pyShape(shape)} tensor to [${attrs.shape.join(", ")}]`);
      out[m] = total / known;
    }
    return out;
  }
  if (mode === "flatten") {
    const axis = Number(attrs.axis);
    return [prod(shape.slice(0, axis)), prod(shape.slice(axis))];
  }
  if (mode === "squeeze") {
    const axes = attrs.axes.map(Number);
    for (const a of axes) if (shape[a] !== 1) throw new NumpyOpError(`Squeeze of axis ${a}, of size ${shape[a]} (1 expected)`);
    return shape.filter((_, i) => !axes.includes(i));
  }
  if (mode === "unsqueeze") {
    const out = shape.slice();
    for (const a of attrs.axes.map(Number).sort((p, q) => p - q)) out.splice(a, 0, 1);
    return out;
  }
  throw new NumpyOpError(`reshape mode '${String(mode).slice(0, 40)}' (reshape, flatten, squeeze or unsqueeze)`);
}

function dynReshape(attrs, x) {
  const target = reshapeTarget(attrs.mode, attrs, x.shape);
  if (prod(target) !== x.data.length) throw new NumpyOpError(`Reshape of a ${pyShape(x.shape)} tensor to [${target.join(", ")}]`);
  return [tensor(x.dtype, target, x.data.slice())];
}

/** ONNX Slice on an axis of `dim`: [first index, count, step] after its clamping rules. */
function sliceRange(start, end, step, dim) {
  if (step === 0) throw new NumpyOpError("Slice step 0");
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  const clamp = (v, lo, hi) => Math.min(Math.max(v, lo), hi);
  if (step > 0) {
    start = clamp(start, 0, dim);
    end = clamp(end, 0, dim);
    return [start, Math.max(0, Math.floor((end - start + step - 1) / step)), step];
  }
  start = clamp(start, 0, dim - 1);
  end = clamp(end, -1, dim - 1);
  return [start, Math.max(0, Math.floor((start - end - step - 1) / -step)), step];
}

function dynSlice(attrs, x) {
  const st = stridesOf(x.shape);
  const shape = x.shape.slice();
  const steps = st.slice();
  let base = 0;
  attrs.axes.forEach((a, j) => {
    const ax = Number(a);
    const [first, count, step] = sliceRange(Number(attrs.starts[j]), Number(attrs.ends[j]), Number(attrs.steps[j]), x.shape[ax]);
    shape[ax] = count;
    steps[ax] = st[ax] * step;
    base += first * st[ax];
  });
  return [pick(x, shape, size(shape) ? walk(shape, steps, base) : new Float64Array(0))];
}

function dynConcat(attrs, ...xs) {
  const axis = Number(attrs.axis);
  const first = xs[0];
  for (const x of xs.slice(1)) {
    if (x.shape.length !== first.shape.length || x.shape.some((d, k) => k !== axis && d !== first.shape[k])) {
      throw new NumpyOpError(`Concat on axis ${axis} of shapes ${pyShape(first.shape)} and ${pyShape(x.shape)}`);
    }
  }
  const outer = size(first.shape.slice(0, axis));
  const inner = size(first.shape.slice(axis + 1));
  const shape = first.shape.slice();
  shape[axis] = xs.reduce((s, x) => s + x.shape[axis], 0);
  const out = new (lookup(first.dtype).Typed)(size(shape));
  let o = 0;
  for (let a = 0; a < outer; a++) {
    for (const x of xs) {
      const n = x.shape[axis] * inner;
      out.set(x.data.subarray(a * n, a * n + n), o);
      o += n;
    }
  }
  return [tensor(first.dtype, shape, out)];
}

function dynShape(attrs, x) {
  if (attrs.size) return [tensor("int64", [], new BigInt64Array([BigInt(x.data.length)]))];
  const dims = x.shape.slice(Number(attrs.start), Number(attrs.end));
  return [tensor("int64", [dims.length], BigInt64Array.from(dims, (d) => BigInt(d)))];
}

// ------------------------------------------------------------------------------------------ indexing
/** ONNX indices as indices into an axis of `dim` (negative from the end); the first out of range is an error. */
function indices(values, dim, what) {
  const out = new Array(values.length);
  for (let k = 0; k < values.length; k++) {
    const i = Number(values[k]);
    if (i < -dim || i >= dim) throw new NumpyOpError(`${what} index ${i} is out of range for an axis of ${dim}`);
    out[k] = i < 0 ? i + dim : i;
  }
  return out;
}

function dynGather(attrs, x, idx) {
  const axis = Number(attrs.axis);
  const taken = takeAxis(x, axis, indices(idx.data, x.shape[axis], "Gather"));
  return [tensor(x.dtype, [...x.shape.slice(0, axis), ...idx.shape, ...x.shape.slice(axis + 1)], taken.data)];
}

function dynGatherNd(attrs, x, idx) {
  const k = idx.shape.length ? idx.shape[idx.shape.length - 1] : 0;
  if (idx.shape.length === 0 || k > x.shape.length) throw new NumpyOpError(`GatherND indices of shape ${pyShape(idx.shape)} into a rank-${x.shape.length} tensor`);
  const rows = k ? idx.data.length / k : 0;
  const st = stridesOf(x.shape);
  const offsets = new Array(rows).fill(0);
  for (let d = 0; d < k; d++) {
    const col = new Array(rows);
    for (let r = 0; r < rows; r++) col[r] = idx.data[r * k + d];
    indices(col, x.shape[d], "GatherND").forEach((i, r) => {
      offsets[r] += i * st[d];
    });
  }
  const inner = size(x.shape.slice(k));
  const out = new (lookup(x.dtype).Typed)(rows * inner);
  offsets.forEach((at, r) => out.set(x.data.subarray(at, at + inner), r * inner));
  return [tensor(x.dtype, [...idx.shape.slice(0, -1), ...x.shape.slice(k)], out)];
}

// ------------------------------------------------------------------------------------------ broadcasting
function broadcastShape(shapes) {
  const rank = Math.max(...shapes.map((s) => s.length));
  const out = [];
  for (let d = 0; d < rank; d++) {
    let n = 1;
    for (const s of shapes) {
      const v = d - (rank - s.length) >= 0 ? s[d - (rank - s.length)] : 1;
      if (v === 1) continue;
      if (n !== 1 && v !== n) throw new NumpyOpError(`operands could not be broadcast together with shapes ${shapes.map(pyShape).join(" ")}`);
      n = v;
    }
    out.push(n);
  }
  return out;
}

/** The storage index in a tensor of `shape` of each element of the broadcast `out`. */
function broadcastAt(shape, out) {
  const st = stridesOf(shape);
  const off = out.length - shape.length;
  return walk(out, out.map((_, d) => (d < off || shape[d - off] === 1 ? 0 : st[d - off])));
}

function dynWhere(attrs, cond, x, y) {
  const shape = broadcastShape([cond.shape, x.shape, y.shape]);
  const [ic, ix, iy] = [cond, x, y].map((t) => broadcastAt(t.shape, shape));
  const out = new (lookup(x.dtype).Typed)(ic.length);
  for (let k = 0; k < ic.length; k++) out[k] = cond.data[ic[k]] ? x.data[ix[k]] : y.data[iy[k]];
  return [tensor(x.dtype, shape, out)];
}

// ------------------------------------------------------------------------------------------ elementwise
const maxOf = (a, b) => (a >= b || a !== a ? a : b);
const minOf = (a, b) => (a <= b || a !== a ? a : b);

const COMPARE = {
  equal: (a, b) => a === b,
  greater: (a, b) => a > b,
  greater_equal: (a, b) => a >= b,
  less: (a, b) => a < b,
  less_equal: (a, b) => a <= b,
  and: (a, b) => Boolean(a && b),
  or: (a, b) => Boolean(a || b),
  xor: (a, b) => Boolean(a) !== Boolean(b),
};
const ARITH = {
  add: (a, b) => a + b,
  sub: (a, b) => a - b,
  mul: (a, b) => a * b,
  div: (a, b) => a / b,
  max: maxOf,
  min: minOf,
};

/** Values to compute with: floats as numbers, integers as BigInt, bool as 0/1. */
function operands(t, dtype) {
  if (FLOATS.has(dtype) || dtype === "bool") return valuesOf(t.dtype, t.data);
  return Array.from(t.data, (v) => BigInt(v));
}

function dynBinary(attrs, a, b) {
  const { op, dtype } = attrs;
  const shape = broadcastShape([a.shape, b.shape]);
  const ia = broadcastAt(a.shape, shape);
  const ib = broadcastAt(b.shape, shape);
  const va = operands(a, dtype);
  const vb = operands(b, dtype);
  const n = ia.length;
  if (Object.prototype.hasOwnProperty.call(COMPARE, op)) {
    const out = new Uint8Array(n);
    const f = COMPARE[op];
    for (let k = 0; k < n; k++) out[k] = f(va[ia[k]], vb[ib[k]]) ? 1 : 0;
    return [tensor("bool", shape, out)];
  }
  if (!Object.prototype.hasOwnProperty.call(ARITH, op)) {
    throw new NumpyOpError(`binary op '${String(op).slice(0, 40)}' (${[...Object.keys(COMPARE), ...Object.keys(ARITH)].sort().join(", ")})`);
  }
  if (op === "div" && !FLOATS.has(dtype) && Array.prototype.some.call(vb, (v) => v === 0n)) {
    throw new NumpyOpError("Div: integer division by zero");
  }
  const f = ARITH[op];
  const out = new Array(n);
  for (let k = 0; k < n; k++) out[k] = f(va[ia[k]], vb[ib[k]]);
  return [tensor(dtype, shape, convertValues(out, dtype))];
}

const UNARY = {
  neg: (v) => -v,
  abs: (v) => (v < 0 ? -v : v),
  not: (v) => (v ? 0 : 1),
  sqrt: Math.sqrt,
  exp: Math.exp,
  log: Math.log,
  sigmoid: (v) => 1 / (1 + Math.exp(-v)),
  relu: (v) => (v < 0 ? (typeof v === "bigint" ? 0n : 0) : v),
  floor: Math.floor,
  ceil: Math.ceil,
};

function dynUnary(attrs, x) {
  const { op, dtype } = attrs;
  if (!Object.prototype.hasOwnProperty.call(UNARY, op)) throw new NumpyOpError(`unary op '${String(op).slice(0, 40)}' (${Object.keys(UNARY).sort().join(", ")})`);
  const f = UNARY[op];
  const v = operands(x, dtype);
  const out = new Array(v.length);
  for (let k = 0; k < v.length; k++) out[k] = f(v[k]);
  if (op === "abs" && FLOATS.has(dtype)) for (let k = 0; k < v.length; k++) out[k] = Math.abs(v[k]);
  return [tensor(dtype, x.shape, convertValues(out, dtype))];
}

// ------------------------------------------------------------------------------------------ reductions
function dynReduce(attrs, x) {
  const { op, dtype } = attrs;
  const nd = x.shape.length;
  const red = attrs.axes == null ? [...Array(nd).keys()] : attrs.axes.map(Number).sort((p, q) => p - q);
  const rest = [...Array(nd).keys()].filter((d) => !red.includes(d));
  const st = stridesOf(x.shape);
  const outer = walk(rest.map((d) => x.shape[d]), rest.map((d) => st[d]));
  const inner = walk(red.map((d) => x.shape[d]), red.map((d) => st[d]));
  const v = operands(x, dtype);
  const isFloat = FLOATS.has(dtype);
  const n = inner.length;
  const out = new Array(outer.length);
  if (op === "max" || op === "min") {
    if (n === 0) throw new NumpyOpError(`Reduce${op[0].toUpperCase()}${op.slice(1)} over an empty axis`);
    const f = op === "max" ? maxOf : minOf;
    outer.forEach((o, r) => {
      let acc = v[o + inner[0]];
      for (let j = 1; j < n; j++) acc = f(acc, v[o + inner[j]]);
      out[r] = acc;
    });
  } else if (op === "sum" || op === "mean") {
    outer.forEach((o, r) => {
      let acc = isFloat ? 0 : 0n;
      for (let j = 0; j < n; j++) acc += v[o + inner[j]];
      out[r] = op === "mean" ? (n ? acc / n : NaN) : acc;
    });
  } else {
    throw new NumpyOpError(`reduce op '${String(op).slice(0, 40)}' (max, min, sum, mean)`);
  }
  const keep = attrs.keepdims ?? 1;
  const shape = keep ? x.shape.map((d, i) => (red.includes(i) ? 1 : d)) : rest.map((d) => x.shape[d]);
  return [tensor(dtype, shape, convertValues(out, dtype))];
}

export const DYNAMIC_OPS = Object.freeze({
  dyn_cast: dynCast,
  dyn_transpose: dynTranspose,
  dyn_reshape: dynReshape,
  dyn_slice: dynSlice,
  dyn_concat: dynConcat,
  dyn_shape: dynShape,
  dyn_gather: dynGather,
  dyn_gather_nd: dynGatherNd,
  dyn_where: dynWhere,
  dyn_binary: dynBinary,
  dyn_unary: dynUnary,
  dyn_reduce: dynReduce,
});
