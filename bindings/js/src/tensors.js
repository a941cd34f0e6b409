// The tensors numpy nodes compute on ({dtype, shape, data}: data the dtype's storage typed array, C order) and
// the error they raise, shared by numpy_ops.js and dynamic_ops.js.
import { convertValues, lookup, valuesOf } from "./dtypes.js";
import { sizeOf as size } from "./ndarray.js";

export class NumpyOpError extends Error {
  constructor(message) {
    super(message);
    this.name = "ValueError";
  }
}

export function tensor(dtype, shape, data) {
  return { dtype, shape: Array.from(shape), data };
}

/** Convert a result tensor to `dtype` (numpy's unsafe copy). */
export function castTensor(t, dtype) {
  if (t.dtype === dtype) return t;
  return tensor(dtype, t.shape, convertValues(valuesOf(t.dtype, t.data), dtype));
}

/** Slices of `x` along `axis` at `indices`, in that order. */
export function takeAxis(x, axis, indices) {
  const outer = size(x.shape.slice(0, axis));
  const n = x.shape[axis];
  const inner = size(x.shape.slice(axis + 1));
  const shape = x.shape.slice();
  shape[axis] = indices.length;
  const out = new (lookup(x.dtype).Typed)(outer * indices.length * inner);
  let o = 0;
  for (let a = 0; a < outer; a++) {
    for (const i of indices) {
      const at = (a * n + i) * inner;
      out.set(x.data.subarray(at, at + inner), o);
      o += inner;
    }
  }
  return tensor(x.dtype, shape, out);
}
