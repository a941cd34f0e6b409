// tether-runtime: everything in one import.
export * from "./runtime.js";
export { DTYPES, DTYPE_NAMES, lookup as lookupDtype, bfloat16Bits, bfloat16ToNumber, float16Bits, float16ToNumber } from "./dtypes.js";
export { loadParams, saveParams, ParamsFormatError } from "./params.js";
export { GraphExecutor, GraphError, loadGraph, GRAPH_VERSIONS } from "./graph.js";
export { OPS as NUMPY_OPS } from "./numpy_ops.js";
export { timeEvaluator } from "./timing.js";
