// The ops a graph runs in the executor between its compiled kernels (graph JSON version 3 "numpy" nodes): a
// port of rpc_server/tether_rpc/numpy_ops.py and detection_ops.py (dynamic_ops.py: dynamic_ops.js) with the same
// semantics, orders and float32 roundings (Math.fround where numpy computes in float32). Tensors here are {dtype, shape, data}: data is the
// dtype's storage typed array (float16/bfloat16 as Uint16Array bit patterns), C order.
import { lookup, valuesOf, convertValues } from "./dtypes.js";
import { DYNAMIC_OPS } from "./dynamic_ops.js";
import { sizeOf as size } from "./ndarray.js";
import { NumpyOpError, takeAxis, tensor } from "./tensors.js";

export { NumpyOpError, castTensor, tensor } from "./tensors.js";


const fr = Math.fround;


export function pyShape(shape) {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

function normAxis(axis, ndim) {
  const a = Number(axis);
  const out = a < 0 ? a + ndim : a;
  if (!Number.isInteger(out) || out < 0 || out >= ndim) throw new NumpyOpError(`axis ${axis} is out of bounds for array of dimension ${ndim}`);
  return out;
}

/** Storage of `n` int64 values from JS numbers. */
function int64s(values) {
  const out = new BigInt64Array(values.length);
  for (let k = 0; k < values.length; k++) out[k] = BigInt(values[k]);
  return out;
}

/** Python's truth of element k (nonzero; a float's -0.0 is false, NaN true). bfloat16 is held as uint16 bit
 * patterns on the Python device, so there its -0.0 (0x8000) is true: the same here. */
function truthTest(dtype) {
  if (dtype === "float16") return (data, k) => (data[k] & 0x7fff) !== 0;
  if (dtype === "int64" || dtype === "uint64") return (data, k) => data[k] !== 0n;
  return (data, k) => data[k] !== 0;
}

/** The first element as a number (int() / float() of a one-element array). */
function first(t) {
  return Number(valuesOf(t.dtype, t.data.subarray(0, 1))[0]);
}

// ------------------------------------------------------------------------------------------------ ops
function nonzero(attrs, x) {
  const shape = x.shape.length === 0 ? [1] : x.shape;
  const nd = shape.length;
  const test = truthTest(x.dtype);
  const hits = [];
  for (let k = 0; k < x.data.length; k++) if (test(x.data, k)) hits.push(k);
  const out = new BigInt64Array(nd * hits.length);
  const count = hits.length;
  for (let j = 0; j < count; j++) {
    let rest = hits[j];
    for (let d = nd - 1; d >= 0; d--) {
      out[d * count + j] = BigInt(rest % shape[d]);
      rest = Math.floor(rest / shape[d]);
    }
  }
  return [tensor("int64", [nd, count], out)];
}

function compress(attrs, x, cond) {
  const test = truthTest(cond.dtype);
  const c = [];
  for (let k = 0; k < cond.data.length; k++) c.push(test(cond.data, k));
  const axis = attrs.axis ?? null;
  if (axis === null) {
    const m = Math.min(c.length, x.data.length);
    const picked = [];
    for (let k = 0; k < m; k++) if (c[k]) picked.push(k);
    const out = new (lookup(x.dtype).Typed)(picked.length);
    picked.forEach((k, j) => {
      out[j] = x.data[k];
    });
    return [tensor(x.dtype, [picked.length], out)];
  }
  const ax = normAxis(axis, x.shape.length);
  const n = Math.min(x.shape[ax], c.length);
  const idx = [];
  for (let k = 0; k < n; k++) if (c[k]) idx.push(k);
  return [takeAxis(x, ax, idx)];
}

/** Sort keys for ordering the values of a tensor as numpy does: bfloat16 by its bit patterns (the device holds
 * it as uint16), float16 by value, everything else by value. */
function sortKeys(x) {
  return x.dtype === "float16" ? valuesOf("float16", x.data) : x.data;
}

function cmpScalar(a, b) {
  // NaN sorts last; numbers or bigints otherwise
  if (typeof a === "number") {
    const an = a !== a;
    const bn = b !== b;
    if (an || bn) return an === bn ? 0 : an ? 1 : -1;
  }
  return a < b ? -1 : a > b ? 1 : 0;
}

function unique(attrs, x) {
  const axis = attrs.axis ?? null;
  const keys = sortKeys(x);
  let rows; // number of items compared; each item a list of keys
  let itemKeys;
  let equal;
  let ax = 0;
  if (axis === null) {
    rows = x.data.length;
    itemKeys = (i) => keys[i];
    equal = (i, j) => {
      const a = keys[i];
      const b = keys[j];
      return a === b || (typeof a === "number" && a !== a && b !== b); // NaNs collapse into one (equal_nan)
    };
  } else {
    ax = normAxis(axis, x.shape.length);
    rows = x.shape[ax];
  }
  let cmp;
  if (axis === null) {
    cmp = (i, j) => cmpScalar(itemKeys(i), itemKeys(j)) || i - j;
  } else {
    // rows along `axis` compared lexicographically (numpy's structured view of each row)
    const moved = [];
    const outer = size(x.shape.slice(0, ax));
    const inner = size(x.shape.slice(ax + 1));
    for (let r = 0; r < rows; r++) {
      const row = [];
      for (let a = 0; a < outer; a++) for (let q = 0; q < inner; q++) row.push(keys[(a * rows + r) * inner + q]);
      moved.push(row);
    }
    const rowCmp = (i, j) => {
      const a = moved[i];
      const b = moved[j];
      for (let q = 0; q < a.length; q++) {
        const c = cmpScalar(a[q], b[q]);
        if (c) return c;
      }
      return 0;
    };
    cmp = (i, j) => rowCmp(i, j) || i - j;
    equal = (i, j) => {
      const a = moved[i];
      const b = moved[j];
      for (let q = 0; q < a.length; q++) if (!(a[q] === b[q])) return false;
      return true;
    };
  }
  const perm = Array.from({ length: rows }, (_, i) => i).sort(cmp);
  let firsts = [];
  let counts = [];
  const inverse = new Array(rows);
  let group = -1;
  for (let p = 0; p < perm.length; p++) {
    if (p === 0 || !equal(perm[p], perm[p - 1])) {
      group += 1;
      firsts.push(perm[p]);
      counts.push(0);
    }
    counts[group] += 1;
    inverse[perm[p]] = group;
  }
  let inv = inverse;
  if (!(attrs.sorted ?? 1)) {
    // first-occurrence order: renumber the unique values by where they first appear
    const order = firsts.map((_, g) => g).sort((a, b) => firsts[a] - firsts[b] || a - b);
    const rank = new Array(order.length);
    order.forEach((g, r) => {
      rank[g] = r;
    });
    firsts = order.map((g) => firsts[g]);
    counts = order.map((g) => counts[g]);
    inv = inverse.map((g) => rank[g]);
  }
  let y;
  if (axis === null) {
    const out = new (lookup(x.dtype).Typed)(firsts.length);
    firsts.forEach((k, j) => {
      out[j] = x.data[k];
    });
    y = tensor(x.dtype, [firsts.length], out);
  } else {
    y = takeAxis(x, ax, firsts);
  }
  return [y, tensor("int64", [firsts.length], int64s(firsts)), tensor("int64", [inv.length], int64s(inv)),
    tensor("int64", [counts.length], int64s(counts))];
}

function corners(boxes, b, n, centerPointBox) {
  // (n, 4) boxes of batch b -> (y_min, x_min, y_max, x_max) in float64
  const v = valuesOf(boxes.dtype, boxes.data);
  const out = new Float64Array(4 * n);
  for (let i = 0; i < n; i++) {
    const at = (b * n + i) * 4;
    const b0 = Number(v[at]);
    const b1 = Number(v[at + 1]);
    const b2 = Number(v[at + 2]);
    const b3 = Number(v[at + 3]);
    if (centerPointBox) {
      const w = b2 / 2;
      const h = b3 / 2;
      out.set([b1 - h, b0 - w, b1 + h, b0 + w], 4 * i);
    } else {
      out.set([Math.min(b0, b2), Math.min(b1, b3), Math.max(b0, b2), Math.max(b1, b3)], 4 * i);
    }
  }
  return out;
}

function iouAbove(c, i, js, threshold) {
  // whether box i overlaps any of boxes js by more than threshold (ONNX's suppress_by_iou), in float64
  const areaI = (c[4 * i + 2] - c[4 * i]) * (c[4 * i + 3] - c[4 * i + 1]);
  for (const j of js) {
    const ih = Math.min(c[4 * i + 2], c[4 * j + 2]) - Math.max(c[4 * i], c[4 * j]);
    const iw = Math.min(c[4 * i + 3], c[4 * j + 3]) - Math.max(c[4 * i + 1], c[4 * j + 1]);
    const inter = ih > 0 && iw > 0 ? ih * iw : 0.0;
    const areaJ = (c[4 * j + 2] - c[4 * j]) * (c[4 * j + 3] - c[4 * j + 1]);
    const union = areaI + areaJ - inter;
    const ok = inter > 0 && areaI > 0 && areaJ > 0 && union > 0;
    if (ok && inter / union > threshold) return true;
  }
  return false;
}

/** A comparison value in the scores' own precision (numpy compares a float32 array with a Python float in
 * float32). */
function asScoreType(dtype, v) {
  return dtype === "float32" ? fr(v) : v;
}

function nonMaxSuppression(attrs, boxes, scores, maxOut, iou, score) {
  const limit = maxOut.data.length ? Math.max(Math.trunc(first(maxOut)), 0) : 0;
  const iouT = iou.data.length ? first(iou) : 0.0;
  const useScore = Boolean(attrs.has_score_threshold ?? 0) && score.data.length > 0;
  const scoreT = useScore ? first(score) : 0.0;
  const [nb, nboxes] = [boxes.shape[0], boxes.shape[1]];
  const [, nc, ns] = scores.shape;
  const sv = valuesOf(scores.dtype, scores.data);
  const out = [];
  for (let b = 0; b < nb; b++) {
    const c = corners(boxes, b, nboxes, Number(attrs.center_point_box ?? 0));
    for (let k = 0; k < nc; k++) {
      const at = (b * nc + k) * ns;
      const s = (i) => Number(sv[at + i]);
      let cand = [];
      const thr = asScoreType(scores.dtype, scoreT);
      for (let i = 0; i < ns; i++) if (!useScore || s(i) > thr) cand.push(i);
      cand = cand.map((i) => [i, -s(i)]).sort((p, q) => cmpScalar(p[1], q[1]) || p[0] - q[0]).map((p) => p[0]);
      const chosen = [];
      for (const i of cand) {
        if (chosen.length >= limit) break;
        if (!iouAbove(c, i, chosen, iouT)) {
          chosen.push(i);
          out.push(b, k, i);
        }
      }
    }
  }
  return [tensor("int64", [out.length / 3, 3], int64s(out))];
}

function topk(attrs, x, k) {
  const axis = normAxis(attrs.axis, x.shape.length);
  const kk = Math.trunc(first(k));
  const n = x.shape[axis];
  if (!(kk >= 0 && kk <= n)) throw new NumpyOpError(`TopK k=${kk} for an axis of ${n}`);
  const isFloat = x.dtype === "float16" || x.dtype === "float32" || x.dtype === "float64";
  const largest = attrs.largest ?? 1;
  let keys;
  if (isFloat) {
    keys = Float64Array.from(valuesOf(x.dtype, x.data));
    if (largest) for (let q = 0; q < keys.length; q++) keys[q] = -keys[q];
  } else if (x.dtype === "int64" || x.dtype === "uint64") {
    keys = Array.from(x.data, (v) => (largest ? ~BigInt.asIntN(64, v) : BigInt.asIntN(64, v)));
  } else {
    keys = Array.from(x.data, (v) => (largest ? -v - 1 : v)); // ~v on int64 (bfloat16: its bit patterns)
  }
  const outer = size(x.shape.slice(0, axis));
  const inner = size(x.shape.slice(axis + 1));
  const shape = x.shape.slice();
  shape[axis] = kk;
  const Typed = lookup(x.dtype).Typed;
  const vals = new Typed(outer * kk * inner);
  const idx = new BigInt64Array(outer * kk * inner);
  for (let a = 0; a < outer; a++) {
    for (let q = 0; q < inner; q++) {
      const base = a * n * inner + q;
      const order = Array.from({ length: n }, (_, i) => i).sort((i, j) => cmpScalar(keys[base + i * inner], keys[base + j * inner]) || i - j);
      for (let r = 0; r < kk; r++) {
        const o = (a * kk + r) * inner + q;
        vals[o] = x.data[base + order[r] * inner];
        idx[o] = BigInt(order[r]);
      }
    }
  }
  return [tensor(x.dtype, shape, vals), tensor("int64", shape, idx)];
}

function det(attrs, x) {
  const nd = x.shape.length;
  if (nd < 2 || x.shape[nd - 1] !== x.shape[nd - 2]) {
    throw new NumpyOpError(`Last 2 dimensions of the array must be square`);
  }
  const m = x.shape[nd - 1];
  const batch = size(x.shape.slice(0, nd - 2));
  const v = valuesOf(x.dtype, x.data);
  const res = new Float64Array(batch);
  const a = new Float64Array(m * m);
  for (let b = 0; b < batch; b++) {
    for (let q = 0; q < m * m; q++) a[q] = Number(v[b * m * m + q]);
    // LU with partial pivoting (the first largest pivot, as LAPACK's getrf); det = sign * exp(sum log|u_ii|)
    // as numpy's umath_linalg computes it
    let sign = 1;
    let logdet = 0;
    let singular = false;
    for (let col = 0; col < m; col++) {
      let p = col;
      let best = Math.abs(a[col * m + col]);
      for (let r = col + 1; r < m; r++) {
        const cand = Math.abs(a[r * m + col]);
        if (cand > best) {
          best = cand;
          p = r;
        }
      }
      if (p !== col) {
        for (let q = 0; q < m; q++) {
          const t = a[col * m + q];
          a[col * m + q] = a[p * m + q];
          a[p * m + q] = t;
        }
        sign = -sign;
      }
      const piv = a[col * m + col];
      if (piv === 0) {
        singular = true;
        continue;
      }
      for (let r = col + 1; r < m; r++) {
        const f = a[r * m + col] / piv;
        a[r * m + col] = f;
        for (let q = col + 1; q < m; q++) a[r * m + q] -= f * a[col * m + q];
      }
    }
    if (singular) {
      res[b] = 0;
      continue;
    }
    for (let col = 0; col < m; col++) {
      const u = a[col * m + col];
      if (u < 0) sign = -sign;
      logdet += Math.log(Math.abs(u));
    }
    res[b] = sign * Math.exp(logdet);
  }
  return [tensor(x.dtype, x.shape.slice(0, nd - 2), convertValues(res, x.dtype))];
}

// ------------------------------------------------------------------------------------- detection ops
export function decodeBoxes(enc, encStride, anchors, scales) {
  // (n, >=4) encodings (rows of encStride numbers) and (n, 4) anchors -> (n, 4) float32 corners
  const n = anchors.length / 4;
  const [ys, xs, hs, ws] = scales.map((s) => fr(Number(s)));
  const out = new Float32Array(4 * n);
  for (let i = 0; i < n; i++) {
    const e0 = Number(enc[i * encStride]);
    const e1 = Number(enc[i * encStride + 1]);
    const e2 = Number(enc[i * encStride + 2]);
    const e3 = Number(enc[i * encStride + 3]);
    const a0 = fr(Number(anchors[4 * i]));
    const a1 = fr(Number(anchors[4 * i + 1]));
    const a2 = fr(Number(anchors[4 * i + 2]));
    const a3 = fr(Number(anchors[4 * i + 3]));
    const yc = fr((e0 / ys) * a2 + a0);
    const xc = fr((e1 / xs) * a3 + a1);
    const hh = fr(0.5 * Math.exp(e2 / hs) * a2);
    const hw = fr(0.5 * Math.exp(e3 / ws) * a3);
    out[4 * i] = fr(yc - hh);
    out[4 * i + 1] = fr(xc - hw);
    out[4 * i + 2] = fr(yc + hh);
    out[4 * i + 3] = fr(xc + hw);
  }
  return out;
}

function iou32(boxes, i, j) {
  // IoU of box i with box j in float32; 0 where either box has no area
  const bi0 = boxes[4 * i], bi1 = boxes[4 * i + 1], bi2 = boxes[4 * i + 2], bi3 = boxes[4 * i + 3];
  const bj0 = boxes[4 * j], bj1 = boxes[4 * j + 1], bj2 = boxes[4 * j + 2], bj3 = boxes[4 * j + 3];
  const areaI = fr(fr(bi2 - bi0) * fr(bi3 - bi1));
  const areaJ = fr(fr(bj2 - bj0) * fr(bj3 - bj1));
  const ih = Math.max(fr(Math.min(bi2, bj2) - Math.max(bi0, bj0)), 0);
  const iw = Math.max(fr(Math.min(bi3, bj3) - Math.max(bi1, bj1)), 0);
  const inter = fr(ih * iw);
  const union = fr(fr(areaI + areaJ) - inter);
  if (!(areaI > 0 && areaJ > 0)) return 0;
  return fr(inter / union);
}

/** Indices of the boxes NMS keeps for one score column, best first, at most `limit`. */
export function nmsSingleClass(boxes, scores, limit, scoreThreshold, iouThreshold) {
  const st = fr(scoreThreshold);
  const it = fr(iouThreshold);
  const keep = [];
  for (let i = 0; i < scores.length; i++) if (scores[i] >= st) keep.push(i);
  const order = keep.sort((a, b) => cmpScalar(-scores[a], -scores[b]) || a - b);
  const active = new Uint8Array(order.length).fill(1);
  const selected = [];
  for (let pos = 0; pos < order.length; pos++) {
    if (selected.length >= limit) break;
    if (!active[pos]) continue;
    const i = order[pos];
    selected.push(i);
    for (let r = pos + 1; r < order.length; r++) if (active[r] && iou32(boxes, i, order[r]) > it) active[r] = 0;
  }
  return selected;
}

function topClasses(row, k) {
  const idx = Array.from({ length: row.length }, (_, i) => i);
  return idx.sort((a, b) => cmpScalar(-row[a], -row[b]) || a - b).slice(0, k);
}

function detectionPostprocess(attrs, boxEncodings, classScores, anchors) {
  const maxDet = Math.trunc(Number(attrs.max_detections));
  const perDet = Math.trunc(Number(attrs.max_classes_per_detection));
  const numClasses = Math.trunc(Number(attrs.num_classes));
  const scoreT = Number(attrs.nms_score_threshold);
  const iouT = Number(attrs.nms_iou_threshold);
  if (boxEncodings.shape[0] !== 1 || classScores.shape[0] !== 1) {
    throw new NumpyOpError(`DetectionPostProcess runs on a batch of 1, not ${boxEncodings.shape[0]}`);
  }
  const nBoxes = anchors.shape[0];
  const width = classScores.shape[2];
  const offset = width - numClasses;
  const boxes = decodeBoxes(valuesOf(boxEncodings.dtype, boxEncodings.data), boxEncodings.shape[2],
    valuesOf(anchors.dtype, anchors.data), [attrs.y_scale, attrs.x_scale, attrs.h_scale, attrs.w_scale]);
  for (let i = 0; i < nBoxes; i++) {
    if (boxes[4 * i] > boxes[4 * i + 2] || boxes[4 * i + 1] > boxes[4 * i + 3]) {
      throw new NumpyOpError("DetectionPostProcess decoded a box with y_min > y_max or x_min > x_max");
    }
  }
  const cs = valuesOf(classScores.dtype, classScores.data);
  const scoreCols = Math.max(width - offset, 0);
  const scores = new Float32Array(nBoxes * scoreCols); // (boxes, classes)
  for (let i = 0; i < nBoxes; i++) for (let c = 0; c < scoreCols; c++) scores[i * scoreCols + c] = cs[i * width + offset + c];
  const n = maxDet * perDet;
  const outBoxes = new Float32Array(4 * n);
  const outClasses = new Float32Array(n);
  const outScores = new Float32Array(n);
  let count;
  if (attrs.use_regular_nms) {
    const found = []; // [score, box, class]
    for (let c = 0; c < numClasses; c++) {
      const col = new Float32Array(nBoxes);
      for (let i = 0; i < nBoxes; i++) col[i] = scores[i * scoreCols + c];
      for (const i of nmsSingleClass(boxes, col, Math.trunc(Number(attrs.detections_per_class)), scoreT, iouT)) {
        found.push([scores[i * scoreCols + c], i, c]);
      }
    }
    const order = found.map((_, k) => k).sort((a, b) => cmpScalar(-found[a][0], -found[b][0]) || a - b).slice(0, maxDet);
    order.forEach((k, row) => {
      const [, i, c] = found[k];
      outBoxes.set(boxes.subarray(4 * i, 4 * i + 4), 4 * row);
      outClasses[row] = c;
      outScores[row] = scores[i * scoreCols + c];
    });
    count = order.length;
  } else {
    const perBox = Math.min(perDet, numClasses);
    const best = new Float32Array(nBoxes);
    if (scoreCols) {
      for (let i = 0; i < nBoxes; i++) {
        let m = scores[i * scoreCols];
        for (let c = 1; c < scoreCols; c++) {
          const v = scores[i * scoreCols + c];
          if (v !== v || m !== m) m = NaN;
          else if (v > m) m = v;
        }
        best[i] = m;
      }
    }
    const kept = nmsSingleClass(boxes, best, maxDet, scoreT, iouT);
    kept.forEach((i, slot) => {
      const row = scores.subarray(i * scoreCols, (i + 1) * scoreCols);
      topClasses(row, perBox).forEach((c, col) => {
        const r = perDet * slot + col;
        outBoxes.set(boxes.subarray(4 * i, 4 * i + 4), 4 * r);
        outClasses[r] = c;
        outScores[r] = row[c];
      });
    });
    count = kept.length;
  }
  return [tensor("float32", [1, n, 4], outBoxes), tensor("float32", [1, n], outClasses),
    tensor("float32", [1, n], outScores), tensor("float32", [1], new Float32Array([count]))];
}

// Python's min/max of two scalars: the first argument unless the second compares strictly less/greater
const pyMin = (a, b) => (b < a ? b : a);
const pyMax = (a, b) => (b > a ? b : a);

function cornerIou(boxes, i, j) {
  const a = boxes.subarray(4 * i, 4 * i + 4);
  const b = boxes.subarray(4 * j, 4 * j + 4);
  const ay0 = pyMin(a[0], a[2]), ay1 = pyMax(a[0], a[2]), ax0 = pyMin(a[1], a[3]), ax1 = pyMax(a[1], a[3]);
  const by0 = pyMin(b[0], b[2]), by1 = pyMax(b[0], b[2]), bx0 = pyMin(b[1], b[3]), bx1 = pyMax(b[1], b[3]);
  const areaA = fr(fr(ay1 - ay0) * fr(ax1 - ax0));
  const areaB = fr(fr(by1 - by0) * fr(bx1 - bx0));
  if (areaA <= 0 || areaB <= 0) return 0.0;
  const inter = fr(pyMax(fr(pyMin(ay1, by1) - pyMax(ay0, by0)), 0) * pyMax(fr(pyMin(ax1, bx1) - pyMax(ax0, bx0)), 0));
  const union = fr(fr(areaA + areaB) - inter);
  return union === 0 ? 0.0 : fr(inter / union);
}

class Heap {
  // a binary min-heap of [negScore, index, begin] tuples ordered as Python compares tuples
  constructor(items) {
    this.a = [];
    for (const it of items) this.push(it);
  }

  static less(x, y) {
    return x[0] !== y[0] ? x[0] < y[0] : x[1] !== y[1] ? x[1] < y[1] : x[2] < y[2];
  }

  get length() {
    return this.a.length;
  }

  push(it) {
    const a = this.a;
    a.push(it);
    let k = a.length - 1;
    while (k > 0) {
      const p = (k - 1) >> 1;
      if (!Heap.less(a[k], a[p])) break;
      [a[k], a[p]] = [a[p], a[k]];
      k = p;
    }
  }

  pop() {
    const a = this.a;
    const top = a[0];
    const last = a.pop();
    if (a.length) {
      a[0] = last;
      let k = 0;
      for (;;) {
        const l = 2 * k + 1;
        const r = l + 1;
        let m = k;
        if (l < a.length && Heap.less(a[l], a[m])) m = l;
        if (r < a.length && Heap.less(a[r], a[m])) m = r;
        if (m === k) break;
        [a[k], a[m]] = [a[m], a[k]];
        k = m;
      }
    }
    return top;
  }
}

function nmsPadded(attrs, boxesIn, scoresIn, iou, score) {
  const limit = Math.trunc(Number(attrs.max_output_size));
  const boxes = Float32Array.from(valuesOf(boxesIn.dtype, boxesIn.data), Number);
  const scores = Float32Array.from(valuesOf(scoresIn.dtype, scoresIn.data), Number);
  const iouT = fr(first(iou));
  const scoreT = fr(first(score));
  const sigma = Number(attrs.soft_nms_sigma ?? 0.0);
  const scale = sigma > 0 ? -0.5 / sigma : 0.0;
  const items = [];
  for (let i = 0; i < scores.length; i++) if (scores[i] > scoreT) items.push([-scores[i], i, 0]);
  const heap = new Heap(items);
  const count = Math.min(heap.length, limit);
  const kept = [];
  const keptScores = [];
  while (kept.length < count && heap.length) {
    const [neg, i, begin0] = heap.pop();
    const original = -neg;
    let s = original;
    let hard = false;
    for (let j = kept.length - 1; j >= begin0; j--) {
      const v = cornerIou(boxes, i, kept[j]);
      if (v >= iouT) {
        hard = true;
        break;
      }
      if (sigma > 0) s = fr(s * fr(Math.exp(fr(scale * v * v))));
      if (s <= scoreT) break;
    }
    if (hard) continue;
    const begin = kept.length;
    if (s === original) {
      kept.push(i);
      keptScores.push(s);
    }
    // as LiteRT: a selected box goes back too, and its IoU of 1 with itself drops it when popped again
    if (s > scoreT) heap.push([-s, i, begin]);
  }
  const indices = new Int32Array(Math.max(limit, 0));
  const outScores = new Float32Array(Math.max(limit, 0));
  indices.set(kept);
  outScores.set(keptScores);
  return [tensor("int32", [limit], indices), tensor("float32", [limit], outScores), tensor("int32", [], new Int32Array([kept.length]))];
}

export const OPS = Object.freeze({
  nonzero,
  compress,
  unique,
  non_max_suppression: nonMaxSuppression,
  det,
  topk,
  detection_postprocess: detectionPostprocess,
  nms_padded: nmsPadded,
  ...DYNAMIC_OPS,
});
