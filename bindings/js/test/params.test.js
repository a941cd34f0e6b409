import { test } from "node:test";
import assert from "node:assert/strict";
import { loadParams, saveParams, ParamsFormatError } from "../src/params.js";
import { fromTypedArray, empty } from "../src/ndarray.js";

function sample() {
  return new Map([
    ["w", fromTypedArray(new Float32Array([1.5, -2, 3, 4, 5, 6]), [2, 3])],
    ["ids", fromTypedArray(new BigInt64Array([1n, -(2n ** 62n)]))],
    ["flag", fromTypedArray(new Uint8Array([1, 0, 1]), [3], "bool")],
    ["half", fromTypedArray(new Uint16Array([0x3c00, 0xc000]), [2], "float16")],
    ["bf", fromTypedArray(new Uint16Array([0x3f80]), [1], "bfloat16")],
    ["scalar", fromTypedArray(new Float64Array([2.5]), [], "float64")],
    ["empty", empty([0, 4], "int32")],
    ["név", fromTypedArray(new Uint8Array([7]))],
  ]);
}

test("params round trip keeps names, dtypes, shapes and bytes, data 64-byte aligned", () => {
  const bytes = saveParams(sample());
  const back = loadParams(bytes);
  assert.deepEqual([...back.keys()], [...sample().keys()]);
  for (const [name, arr] of sample()) {
    const got = back.get(name);
    assert.equal(got.dtype, arr.dtype, name);
    assert.deepEqual(got.shape, arr.shape, name);
    assert.deepEqual(got.bytes(), arr.bytes(), name);
  }
  assert.deepEqual(saveParams(back), bytes);
  // the first record's data starts at a multiple of 64
  const w = back.get("w").bytes();
  const at = bytes.findIndex((_, k) => k % 64 === 0 && k > 0 && bytes.subarray(k, k + w.length).every((b, j) => b === w[j]));
  assert.equal(at % 64, 0);
});

function expectError(bytes, pattern) {
  assert.throws(() => loadParams(bytes), (exc) => exc instanceof ParamsFormatError && pattern.test(exc.message));
}

test("params: bad files are refused with a message naming the problem", () => {
  const good = saveParams(sample());
  expectError(good.slice(0, 10), /too short \(10 bytes\)/);
  const magic = good.slice();
  magic[0] = 0x51;
  expectError(magic, /not a tether params file \(magic b'QTHRPRM\\x00'\)/);
  const version = good.slice();
  version[8] = 9;
  expectError(version, /params format version 9; this runtime reads version 1/);
  expectError(good.slice(0, good.length - 3), /runs past the end of the file|truncated/);
  expectError(good.slice(0, 20), /truncated at byte 20 \(record 0 of 8\)/);
  // one record, patched: dtype, nbytes, a negative extent, the rank
  const one = saveParams(new Map([["x", fromTypedArray(new Float32Array([1, 2]))]]));
  const dtype = one.slice();
  dtype.set(new TextEncoder().encode("float99"), 16 + 2 + 1 + 1);
  expectError(dtype, /param 'x' has unknown dtype 'float99'/);
  const nbytes = one.slice();
  const dv = new DataView(nbytes.buffer);
  const nbOff = 16 + 2 + 1 + 1 + 7 + 1 + 8;
  dv.setBigUint64(nbOff, 12n, true);
  expectError(nbytes, /param 'x': 12 data bytes for float32 \(2,\) \(expected 8\)/);
  const neg = one.slice();
  new DataView(neg.buffer).setBigInt64(nbOff - 8, -2n, true);
  expectError(neg, /param 'x' has a negative extent in \(-2,\)/);
  const rank = one.slice();
  rank[nbOff - 9] = 40;
  expectError(rank, /param 'x' has rank 40 \(limit 32\)/);
});
