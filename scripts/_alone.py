"""Each runtime timed alone, in a worker process of its own, in rounds until the ratio between them is stable.

Two runtimes' thread pools in one process disturb each other (a pool's workers keep spinning after a run, and the
process's threads share its cores), so an interleaved in-process comparison swings by 2x at 2 threads from one
run to the next. Here the parent process only coordinates: every runtime is loaded in a worker process of its own
(:class:`Worker`), and while one worker samples, the others wait idle on their stdin.

Parent and worker speak JSON lines over the worker's stdin and stdout; arrays travel as ``.npz`` files (loaded with
``allow_pickle=False``). Every reply is awaited for at most ``timeout_s``; a worker that dies, hangs or fails
raises :class:`WorkerError`, one line that names the runtime.

The stopping rule (:func:`finished`, on the rounds so far): a round takes one sample of every runtime at every
thread count, the runtimes' order reversed from one round to the next so none always runs first. After
``min_rounds`` rounds, stop as soon as, for every thread count and every runtime against the base, the median of
the per-round ratios (runtime / base, from the same round's samples) over all rounds and the same median over
all but the last two rounds agree within ``tolerance`` (relative); else stop at ``max_rounds`` and call the
ratio unstable. The goal is a ratio a user can quote: two more rounds no longer move it.

    python scripts/_alone.py KIND MODEL INPUTS.npz OUT_FOLDER     (the worker; started by Worker)
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from _rows import add_json_option
from _timing import per_call_samples, settle

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KINDS = ("tether", "litert", "onnxruntime")
SAMPLE_S = 0.05        # an automatic sample: enough back-to-back calls to last this long
QUIT_WAIT_S = 5.0      # a worker told to quit gets this long before SIGTERM, then as long again before SIGKILL


class WorkerError(RuntimeError):
    """A worker that failed to load its model, failed a command, died or did not answer in time."""


# ---------------------------------------------------------------- the stopping rule
Round = Mapping[int, Mapping[str, float]]       # thread count -> runtime -> seconds per call, one round's samples


def ratios(rounds: Sequence[Round], threads: int, name: str, base: str) -> List[float]:
    """``name`` / ``base`` at ``threads`` threads, one ratio per round."""
    return [r[threads][name] / r[threads][base] for r in rounds]


def ratio_settled(series: Sequence[float], tolerance: float) -> bool:
    """The median of ``series`` and the median of all of it but its last two agree within ``tolerance``
    (relative); never with fewer than three values, since nothing would be left to compare with."""
    if len(series) < 3:
        return False
    early = statistics.median(series[:-2])
    return abs(statistics.median(series) / early - 1) <= tolerance


def settled(rounds: Sequence[Round], base: str, tolerance: float, threads: Optional[Sequence[int]] = None) -> bool:
    """Every runtime's ratio to ``base`` settled (:func:`ratio_settled`) at every thread count (or at ``threads``)."""
    if not rounds:
        return False
    counts = list(rounds[0]) if threads is None else list(threads)
    return all(ratio_settled(ratios(rounds, t, name, base), tolerance)
               for t in counts for name in rounds[0][t] if name != base)


def finished(rounds: Sequence[Round], base: str, min_rounds: int, max_rounds: int, tolerance: float) -> bool:
    """Whether :func:`compare_alone` stops after ``rounds``: at ``max_rounds``, or from ``min_rounds`` on once
    :func:`settled`."""
    return len(rounds) >= max_rounds or (len(rounds) >= min_rounds and settled(rounds, base, tolerance))


# ---------------------------------------------------------------- parent side
def write_arrays(path: str, arrays: Mapping[str, np.ndarray]) -> str:
    """``arrays`` in an ``.npz`` at ``path``, in their order (LiteRT takes its inputs by position)."""
    np.savez(path, **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
    return path


class Worker:
    """One runtime with one model, loaded in a process of its own; a context manager that ends the process.

    ``kind``: "tether" (``model`` a folder written by ``tether.build_graph(...).export``), "litert" (a ``.tflite``
    file) or "onnxruntime" (an ``.onnx`` file). ``inputs``: an ``.npz`` of the model's inputs (by name for tether
    and onnxruntime, in order for LiteRT). Every reply is awaited for at most ``timeout_s``."""

    def __init__(self, kind: str, model: str, inputs: str, name: Optional[str] = None, timeout_s: float = 120.0):
        if kind not in KINDS:
            raise ValueError("worker kind must be one of %s, got %r" % (", ".join(KINDS), kind))
        self.kind, self.name, self.timeout_s = kind, name or kind, timeout_s
        self.folder = tempfile.mkdtemp(prefix="tether-alone-%s-" % self.name)
        self.log_path = os.path.join(self.folder, "stderr.log")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "rpc_server")]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self._buf = b""
        with open(self.log_path, "wb") as log:  # the child holds its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), kind, os.path.abspath(model), os.path.abspath(inputs),
                 self.folder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, cwd=self.folder)
        self.pid = self.proc.pid
        try:
            self._read()            # the worker says it has loaded the model, or why it could not
        except WorkerError:
            self.close()
            raise

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
        except OSError:
            lines = []
        return lines[-1] if lines else "nothing on stderr"

    def _error(self, what: str) -> WorkerError:
        return WorkerError("%s worker (pid %d): %s" % (self.name, self.pid, " ".join(what.split())))

    def _exited(self) -> WorkerError:
        try:
            code = self.proc.wait(timeout=QUIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        return self._error("exited (status %s): %s" % (code, self._log_tail()))

    def _read(self) -> Dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._error("no answer in %.0f s" % self.timeout_s)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise self._exited()
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            raise self._error("printed %r, not a JSON line" % line[:200]) from None
        if "error" in reply:
            raise self._error(reply["error"])
        return reply

    def request(self, cmd: str, **args: Any) -> Dict[str, Any]:
        """Send one command, return the worker's reply (WorkerError if it reports an error)."""
        if self.proc.poll() is not None:
            raise self._exited()
        try:
            self.proc.stdin.write((json.dumps(dict(args, cmd=cmd)) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:             # its end of the pipe closed: it is exiting
            raise self._exited() from None
        return self._read()

    def outputs(self) -> List[np.ndarray]:
        """The model's outputs, in order, from one run at 1 thread."""
        with np.load(self.request("outputs")["path"], allow_pickle=False) as npz:
            return [npz[str(k)] for k in range(len(npz.files))]

    def sample(self, threads: int, number: Optional[int] = None) -> float:
        """Seconds per call at ``threads`` threads: the mean over ``number`` back-to-back calls after a pause and
        a warm-up call; without ``number``, as many calls as last about 50 ms (the same count on every call)."""
        return float(self.request("sample", threads=int(threads), number=int(number or 0))["seconds"])

    def profile(self, threads: int, number: Optional[int] = None, repeat: int = 1) -> List[Dict[str, Any]]:
        """tether's per-node profile at ``threads`` threads (its graph executor's ``profile``: one record per node,
        ``seconds`` the median of ``repeat`` means over ``number`` calls of that node alone); without ``number``,
        as many as :meth:`sample` makes of the whole model. Only a tether worker has one."""
        return self.request("profile", threads=int(threads), number=int(number or 0), repeat=int(repeat))["nodes"]

    def close(self) -> None:
        """Ask the worker to quit; SIGTERM, then SIGKILL (by its PID) where it does not; reap it; remove its
        folder. Safe to call twice."""
        proc = self.proc
        if proc.poll() is None:
            try:
                proc.stdin.write(b'{"cmd": "quit"}\n')
                proc.stdin.flush()
            except OSError:
                pass
            for stop in (None, proc.terminate, proc.kill):
                if stop is not None:
                    stop()
                try:
                    proc.wait(timeout=QUIT_WAIT_S)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


def compare_alone(workers: Mapping[str, Worker], base: str, threads: Sequence[int] = (1, 2),
                  number: Optional[int] = None, min_rounds: int = 5, max_rounds: int = 25,
                  tolerance: float = 0.02) -> Dict[int, Dict[str, Any]]:
    """Sample every worker at every thread count in rounds until :func:`finished` (the module's stopping rule).

    Per thread count: ``ms`` (runtime -> median ms per call), ``ratio`` and ``spread`` (runtime -> the median and
    the interquartile range of its per-round ratios to ``base``, the base left out), ``speedup`` (runtime -> the
    median of its per-round speed-ups from the first thread count to this one), ``rounds`` and ``stable`` (every
    ratio at this thread count settled; the speed-ups have no say in when the rounds stop)."""
    if base not in workers:
        raise ValueError("the base %r is not among the workers (%s)" % (base, ", ".join(workers)))
    if not 1 <= min_rounds <= max_rounds:
        raise ValueError("need 1 <= min_rounds <= max_rounds, got %d and %d" % (min_rounds, max_rounds))
    names = list(workers)
    rounds: List[Dict[int, Dict[str, float]]] = []
    while not finished(rounds, base, min_rounds, max_rounds, tolerance):
        order = names if len(rounds) % 2 == 0 else names[::-1]
        rounds.append({t: {n: workers[n].sample(t, number) for n in order} for t in threads})
    report: Dict[int, Dict[str, Any]] = {}
    for t in threads:
        series = {n: ratios(rounds, t, n, base) for n in names if n != base}
        report[t] = {
            "ms": {n: statistics.median(r[t][n] for r in rounds) * 1e3 for n in names},
            "ratio": {n: statistics.median(s) for n, s in series.items()},
            "spread": {n: float(np.subtract(*np.percentile(s, [75, 25]))) for n, s in series.items()},
            "speedup": {n: statistics.median(r[threads[0]][n] / r[t][n] for r in rounds) for n in names},
            "rounds": len(rounds),
            "stable": settled(rounds, base, tolerance, threads=[t]),
        }
    return report


# ---------------------------------------------------------------- the scripts' options, rows and table cells
def add_round_options(ap: argparse.ArgumentParser) -> None:
    """``--number``, ``--min-rounds``, ``--max-rounds`` and ``--tolerance``: the arguments of :func:`compare_alone`."""
    ap.add_argument("--number", type=int, default=0, help="calls per sample (default: as many as last ~50 ms)")
    ap.add_argument("--min-rounds", type=int, default=5, help="rounds before the ratio may be called stable")
    ap.add_argument("--max-rounds", type=int, default=25, help="rounds at most (the ratio is then marked unstable)")
    ap.add_argument("--tolerance", type=float, default=0.02,
                    help="stable: the median ratio of all rounds and of all but the last two agree this closely")


def compare_args(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments of :func:`compare_alone` from the options of :func:`add_round_options` (checked
    here, before a script's first model compiles)."""
    if not 1 <= args.min_rounds <= args.max_rounds:
        raise SystemExit("--min-rounds must be at least 1 and at most --max-rounds (got %d and %d)"
                         % (args.min_rounds, args.max_rounds))
    if args.number < 0 or args.tolerance < 0:
        raise SystemExit("--number and --tolerance cannot be negative")
    return {"number": args.number or None, "min_rounds": args.min_rounds, "max_rounds": args.max_rounds,
            "tolerance": args.tolerance}


def comparison_parser(description: str, models: Sequence[str], option: str = "--models") -> argparse.ArgumentParser:
    """The options every comparison script has: ``option`` (comma-separated, from ``models``, all by default), the
    round options, ``--target`` and ``--json``; a script adds its own, then calls :func:`parse_comparison`."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument(option, default=",".join(models), help="comma-separated, from: " + ", ".join(models))
    add_round_options(ap)
    ap.add_argument("--target", default="host")
    add_json_option(ap)
    return ap


def parse_comparison(ap: argparse.ArgumentParser) -> tuple:
    """(arguments, compare_alone's keywords) from a :func:`comparison_parser`; a bad value exits with one line
    before anything is compiled."""
    args = ap.parse_args()
    return args, compare_args(args)


def comparison_options(description: str, models: Sequence[str]) -> tuple:
    """:func:`parse_comparison` of a :func:`comparison_parser` the script adds nothing to."""
    return parse_comparison(comparison_parser(description, models))


def table_line(width: int, cells: Sequence[Any]) -> str:
    """One row of a comparison table: model (``width`` wide), compile, kernels, then per thread count tether,
    the reference and the ratio, then the error and the rounds; cells already formatted as strings."""
    return ("%-*s %8s %5s %10s %10s %7s %10s %10s %7s %9s %6s" % ((width,) + tuple(cells)))


def table_header(width: int, reference: str, first: str = "model") -> str:
    return table_line(width, (first, "compile", "kern", "tether 1t", reference + " 1t", "ratio", "tether 2t",
                              reference + " 2t", "ratio", "max err", "rounds"))


def table_row(width: int, name: str, row: Mapping[str, Any], reference: str, err_key: str) -> str:
    return table_line(width, (name, "%.2fs" % row["compile_s"], row["kernels"],
                              "%.2fms" % row["tether_ms_1t"], "%.2fms" % row["%s_ms_1t" % reference],
                              ratio_cell(row, 1), "%.2fms" % row["tether_ms_2t"],
                              "%.2fms" % row["%s_ms_2t" % reference], ratio_cell(row, 2),
                              "%.2g" % row[err_key], row["rounds"]))


def row_figures(report: Mapping[int, Mapping[str, Any]], columns: Mapping[str, str]) -> Dict[str, Any]:
    """A benchmark row's figures from a two-runtime :func:`compare_alone` report: ``<column>_ms_<N>t`` for each
    worker (``columns``: worker name -> column prefix), ``ratio_<N>t``, ``spread_<N>t``, ``stable_<N>t`` and
    ``rounds``; past the first thread count also ``<column>_speedup_<N>t``."""
    row: Dict[str, Any] = {}
    first = next(iter(report))
    for t, rep in report.items():
        for name, prefix in columns.items():
            row["%s_ms_%dt" % (prefix, t)] = rep["ms"][name]
            if t != first:
                row["%s_speedup_%dt" % (prefix, t)] = rep["speedup"][name]
        (name,) = rep["ratio"]
        row["ratio_%dt" % t] = rep["ratio"][name]
        row["spread_%dt" % t] = rep["spread"][name]
        row["stable_%dt" % t] = rep["stable"]
        row["rounds"] = rep["rounds"]
    return row


def ratio_cell(row: Mapping[str, Any], threads: int) -> str:
    """``ratio_<N>t`` for a table, ``*`` after it when it did not settle (see :data:`UNSTABLE_NOTE`)."""
    return "%5.2fx%s" % (row["ratio_%dt" % threads], " " if row["stable_%dt" % threads] else "*")


UNSTABLE_NOTE = ("* unstable: not settled by --max-rounds (the median ratios over all rounds and over all but the "
                 "last two differed by more than --tolerance)")


# ---------------------------------------------------------------- worker side
class _Tether:
    """The device runtime's graph executor (what a deployed model runs on), without the compiler."""

    def __init__(self, folder: str, inputs: Mapping[str, np.ndarray]):
        from tether_rpc.graph_executor import GraphExecutor
        from tether_rpc import parallel

        if not os.path.isfile(os.path.join(folder, "deploy.json")):
            raise FileNotFoundError("no deploy.json there (export a model with tether.build_graph(...).export())")
        self.gm = GraphExecutor.from_folder(folder)
        self.parallel, self.threads = parallel, None
        for k, v in inputs.items():
            self.gm.set_input(k, v)

    def call(self, threads: int) -> Callable[[], object]:
        if threads != self.threads:     # a new count restarts the native pool: only when it changes
            self.parallel.set_num_threads(threads)
            self.threads = threads
        return self.gm.run

    def outputs(self) -> List[np.ndarray]:
        return [self.gm.get_output(k) for k in range(self.gm.get_num_outputs())]

    def profile(self, threads: int, number: int, repeat: int) -> List[Dict[str, Any]]:
        self.call(threads)
        return self.gm.profile(number=number, repeat=repeat)["nodes"]


class _LiteRT:
    """One interpreter per thread count (LiteRT fixes its threads when the interpreter is made), made on first use."""

    def __init__(self, path: str, inputs: Mapping[str, np.ndarray]):
        self.path, self.inputs, self.made = path, list(inputs.values()), {}
        self.call(1)

    def _interpreter(self, threads: int) -> Any:
        if threads not in self.made:
            from ai_edge_litert.interpreter import Interpreter

            it = Interpreter(model_path=self.path, num_threads=threads)
            it.allocate_tensors()
            for d, x in zip(it.get_input_details(), self.inputs):
                it.set_tensor(d["index"], x)
            self.made[threads] = it
        return self.made[threads]

    def call(self, threads: int) -> Callable[[], object]:
        return self._interpreter(threads).invoke

    def outputs(self) -> List[np.ndarray]:
        it = self._interpreter(1)
        return [it.get_tensor(d["index"]) for d in it.get_output_details()]


class _OnnxRuntime:
    """One session per thread count (intra-op threads as asked, one inter-op thread), made on first use."""

    def __init__(self, path: str, inputs: Mapping[str, np.ndarray]):
        self.path, self.feeds, self.sessions, self.last = path, dict(inputs), {}, []
        self.call(1)

    def call(self, threads: int) -> Callable[[], object]:
        if threads not in self.sessions:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            self.sessions[threads] = ort.InferenceSession(self.path, so, providers=["CPUExecutionProvider"])
        sess, feeds = self.sessions[threads], self.feeds

        def run() -> None:
            self.last = sess.run(None, feeds)
        return run

    def outputs(self) -> List[np.ndarray]:
        return self.last


RUNNERS = {"tether": _Tether, "litert": _LiteRT, "onnxruntime": _OnnxRuntime}


def _serve(kind: str, model: str, inputs_path: str, folder: str, reply: Callable[[Dict[str, Any]], None]) -> None:
    with np.load(inputs_path, allow_pickle=False) as npz:
        inputs = {k: npz[k] for k in npz.files}
    try:
        runner = RUNNERS[kind](model, inputs)
    except Exception as exc:
        reply({"error": "cannot load %s: %s: %s" % (model, type(exc).__name__, exc)})
        return
    reply({"ready": kind})
    numbers: Dict[int, int] = {}     # threads -> the automatic number of calls, fixed on first use

    def calls(threads: int, call: Callable[[], object]) -> int:
        if threads not in numbers:
            numbers[threads] = max(1, int(SAMPLE_S / max(per_call_samples(call, 1, 1)[0], 1e-6)))
        return numbers[threads]

    for line in sys.stdin:           # the parent gone, stdin ends and so does the worker
        req = json.loads(line)
        cmd = req.get("cmd")
        if cmd == "quit":
            return
        try:
            if cmd == "outputs":
                call = runner.call(1)
                call()
                path = os.path.join(folder, "outputs.npz")
                np.savez(path, **{str(k): np.asarray(v) for k, v in enumerate(runner.outputs())})
                reply({"path": path})
            elif cmd == "sample":
                threads, number = int(req["threads"]), int(req.get("number") or 0)
                call = runner.call(threads)
                settle(call)             # whatever ran before has gone idle; this pool's wake-up is untimed
                number = number or calls(threads, call)
                reply({"seconds": per_call_samples(call, number, 1)[0], "number": number})
            elif cmd == "profile":
                if not hasattr(runner, "profile"):
                    raise ValueError("%s has no per-node profile" % kind)
                threads, number = int(req["threads"]), int(req.get("number") or 0)
                call = runner.call(threads)
                settle(call)
                nodes = runner.profile(threads, number or calls(threads, call), int(req.get("repeat") or 1))
                reply({"nodes": nodes})
            else:
                reply({"error": "unknown command %r" % (cmd,)})
        except Exception as exc:
            traceback.print_exc()
            reply({"error": "%s failed: %s: %s" % (cmd, type(exc).__name__, exc)})


def main(argv: Sequence[str]) -> int:
    if len(argv) != 4 or argv[0] not in KINDS:
        print("usage: _alone.py {%s} MODEL INPUTS.npz OUT_FOLDER (started by _alone.Worker)" % ",".join(KINDS),
              file=sys.stderr)
        return 2
    # ---- the replies get stdout's descriptor to themselves; whatever a library prints (LiteRT's delegate
    # notice, a C runtime's printf) goes to stderr, so it can never break a JSON line
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(msg: Dict[str, Any]) -> None:
        if "error" in msg:
            msg["error"] = " ".join(str(msg["error"]).split())
        proto.write(json.dumps(msg) + "\n")

    _serve(argv[0], argv[1], argv[2], argv[3], reply)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
