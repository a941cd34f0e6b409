// Repeatable timings with a fixed, small per-call cost (rpc_server/tether_rpc/timing.py): `call` is a prepared
// zero-argument function; `number` grows until one sample lasts at least minRepeatMs; samples are seconds per
// call. Async only for the cooldown between samples (a browser's main thread cannot block).
const MAX_NUMBER = 2 ** 30;
const MAX_CALIBRATION_ROUNDS = 32;

const now = () => performance.now() / 1e3;

function runTimed(call, number) {
  const t0 = now();
  for (let k = 0; k < number; k++) call();
  return now() - t0;
}

export async function timeEvaluator(call, { number = 10, repeat = 3, minRepeatMs = 0, warmup = 1, cooldownMs = 0, onSample = null } = {}) {
  number = Math.trunc(number);
  repeat = Math.trunc(repeat);
  if (!(number >= 1 && repeat >= 1)) {
    throw new RangeError(`time_evaluator: number and repeat must be >= 1 (got number=${number}, repeat=${repeat})`);
  }
  for (let k = 0; k < Math.max(0, Math.trunc(warmup)); k++) call();
  const minS = Math.max(0, Number(minRepeatMs)) / 1e3;
  if (minS > 0) {
    for (let r = 0; r < MAX_CALIBRATION_ROUNDS; r++) {
      const elapsed = runTimed(call, number);
      if (elapsed >= minS || number >= MAX_NUMBER) break;
      // aim 20% past the target so the first real sample does not fall just short of it
      const guess = elapsed > 0 ? (number * 1.2 * minS) / elapsed : number * 10;
      number = Math.min(MAX_NUMBER, Math.max(number * 2, Math.ceil(guess)));
    }
  }
  const samples = [];
  for (let i = 0; i < repeat; i++) {
    if (cooldownMs > 0 && i > 0) await new Promise((resolve) => setTimeout(resolve, cooldownMs));
    const perCall = runTimed(call, number) / number;
    samples.push(perCall);
    if (onSample) onSample(i, perCall, number);
  }
  return { samples, number };
}

/** The benchmark summary of tether.graph.benchmark: samples, number, median/mean/min in ms. */
export function summarize(res) {
  const samples = res.samples.map(Number);
  const ordered = [...samples].sort((a, b) => a - b);
  const mid = ordered.length >> 1;
  const median = ordered.length % 2 ? ordered[mid] : 0.5 * (ordered[mid - 1] + ordered[mid]);
  return {
    samples,
    number: res.number,
    median_ms: median * 1e3,
    mean_ms: (samples.reduce((a, b) => a + b, 0) / samples.length) * 1e3,
    min_ms: ordered[0] * 1e3,
  };
}
