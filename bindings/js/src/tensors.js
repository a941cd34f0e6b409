// The tensors numpy nodes compute on ({dtype, shape, data}: data the dtype's storage typed array, C order) and
// the error they raise, shared by numpy_ops.js and dynamic_ops.js.
import { convertValues, valuesOf } from "./dtypes.js";

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
