"""ONNX's node conformance cases run through tether (and onnxruntime), one case at a time.

Shared by ``scripts/onnx_conformance.py`` (the whole suite, with a per-op table) and
``tests/test_onnx_conformance.py`` (a CI selection), so both judge a case the same way:

- tether: ``frontend.from_onnx`` -> ``tether.build_graph`` for the host -> the graph executor, compiled at the
  opt_level the backend test (tests/test_onnx_backend.py) uses. Every input is first a run-time input; when the
  import needs an integer input as a constant (a Reshape shape, Pad pads, Gather indices), the case is retried
  with the int64/int32 inputs and the float shape arguments (Resize scales, OneHot depth) bound as constants, as
  the backend test does.
- Outcome: ``pass``; ``refused`` (an error while importing or compiling: UnsupportedOpError or any other, with
  its message); ``wrong`` (it ran, and an output's shape, dtype or values differ from the expected ones);
  ``crash`` (it compiled but running raised, or the worker died or timed out).
- onnxruntime runs the same model on the same inputs and is judged by the same comparison.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tether.testing import ort_bfloat16

PASS, REFUSED, WRONG, CRASH = "pass", "refused", "wrong", "crash"


@dataclasses.dataclass
class CaseResult:
    name: str
    op_type: str
    ort: str = ""                 # pass / fail / skipped
    ort_message: str = ""
    tether: str = ""              # pass / refused / wrong / crash
    tether_message: str = ""
    seconds: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def collect(include: Optional[str] = None) -> List[Any]:
    """The node cases of the installed onnx (``onnx.backend.test.case.node``), optionally those whose name
    matches the regular expression ``include`` (searched, not anchored)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():     # the case generators overflow casts on purpose
        warnings.simplefilter("ignore")
        cases = list(collect_testcases())
    if include:
        pattern = re.compile(include)
        cases = [c for c in cases if pattern.search(c.name)]
    return cases


def op_types(cases: Sequence[Any]) -> Dict[str, str]:
    """Case name -> the ONNX op type it tests. A plain case is one node; an ``_expanded`` case (the op's function
    body) counts for the op of the case it expands."""
    out: Dict[str, str] = {}
    for c in cases:
        nodes = c.model.graph.node
        if "_expanded" not in c.name and len(nodes) == 1:
            out[c.name] = nodes[0].op_type
    for c in cases:
        if c.name not in out:
            base = c.name.split("_expanded")[0]
            out[c.name] = out.get(base) or (c.model.graph.node[-1].op_type if c.model.graph.node else "?")
    return out


def case_inputs(case: Any) -> List[Dict[str, Any]]:
    """The data sets of a case as {input name: value} (the values are numpy arrays, or lists for sequences)."""
    from onnx import numpy_helper

    inits = {i.name for i in case.model.graph.initializer}
    names = [i.name for i in case.model.graph.input if i.name not in inits]
    feeds = []
    for inputs, _ in case.data_sets:
        d = {}
        for n, v in zip(names, inputs):
            if hasattr(v, "data_type"):
                v = numpy_helper.to_array(v)
            elif isinstance(v, np.generic):     # a numpy scalar is a rank-0 tensor
                v = np.asarray(v)
            d[n] = v
        feeds.append(d)
    return feeds


def case_outputs(case: Any) -> List[List[Any]]:
    from onnx import numpy_helper
    return [[numpy_helper.to_array(v) if hasattr(v, "data_type") else v for v in outputs]
            for _, outputs in case.data_sets]


def compare(case: Any, expected: Sequence[Any], actual: Sequence[Any]) -> Optional[str]:
    """None when ``actual`` matches ``expected`` by the backend runner's rule (shape, dtype, allclose with the
    case's rtol/atol); otherwise the mismatch, as text."""
    from onnx.backend.test.runner import Runner

    try:
        if len(expected) != len(actual):
            return "%d outputs, expected %d" % (len(actual), len(expected))
        for e, a in zip(expected, actual):
            if isinstance(e, list) and isinstance(a, list):     # a sequence: element by element (the runner's
                if len(e) != len(a):                            # own recursion fails on 0-d elements)
                    return "a sequence of %d, expected %d" % (len(a), len(e))
                for ej, aj in zip(e, a):
                    Runner.assert_similar_outputs([ej], [aj], rtol=case.rtol, atol=case.atol)
            else:
                Runner.assert_similar_outputs([e], [a], rtol=case.rtol, atol=case.atol)
    except (AssertionError, TypeError, ValueError) as exc:
        return str(exc).strip()
    return None


def opt_level_for(model: Any) -> int:
    """The opt_level tests/test_onnx_backend.py compiles a model of this size at."""
    return 2 if len(model.graph.node) > 40 else 3


# Float inputs that are shape arguments (Resize roi/scales, Upsample scales, OneHot depth, Range bounds): bound as
# constants like the integer ones, since tether fixes every shape at compile time.
SHAPE_ARG_INPUTS = {"Resize": (1, 2, 3), "Upsample": (1,), "OneHot": (1,), "Range": (0, 1, 2),
                    "Loop": (1,),   # a Loop's initial condition: tether fixes its iterations at compile time
                    "MelWeightMatrix": (3, 4)}    # its output is a table of its scalar arguments


def shape_arg_names(model: Any) -> set:
    """Graph inputs of ``model`` that feed a float shape argument of some node."""
    return {n.input[k] for n in model.graph.node for k in SHAPE_ARG_INPUTS.get(n.op_type, ())
            if k < len(n.input) and n.input[k]}


class TetherCase:
    """One model compiled for the host; ``run(feeds)`` returns its outputs."""

    def __init__(self, model: Any, feeds: Dict[str, Any]) -> None:
        import tether
        from tether import graph_executor
        from tether.frontend import from_onnx

        self.consts: Dict[str, np.ndarray] = {}
        # a sequence input (a list) is fixed to its elements' shapes, an empty optional (None) to nothing
        seq_shapes = {k: None if v is None else [np.shape(x) for x in v] for k, v in feeds.items()
                      if v is None or isinstance(v, list)}
        # and a tensor input the model declares with symbolic dimensions (beside a sequence) to the fed shape
        symbolic = {vi.name for vi in model.graph.input if vi.type.WhichOneof("value") == "tensor_type"
                    and any(not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)}
        if seq_shapes:
            seq_shapes.update({k: np.shape(v) for k, v in feeds.items() if k in symbolic})
        for v in feeds.values():
            if not isinstance(v, np.ndarray) and v is not None and not (
                    isinstance(v, list) and all(isinstance(x, np.ndarray) for x in v)):
                raise TypeError("input of type %s: tether takes tensors and sequences of tensors only"
                                % type(v).__name__)
        feeds = {k: v for k, v in feeds.items() if isinstance(v, np.ndarray)}
        try:
            graph, params = from_onnx(model, shape=seq_shapes)
        except Exception as first:
            # shape arguments (Reshape shape, axes, pads, Gather indices) arrive as integer inputs: bind them
            shape_args = shape_arg_names(model)
            consts = {k: v for k, v in feeds.items() if v.dtype in (np.int64, np.int32) or k in shape_args}
            if not consts:
                raise
            try:
                graph, params = from_onnx(model, constants=consts, shape=seq_shapes)
            except Exception as second:
                if str(second) == str(first):
                    raise first from None
                raise type(second)("%s; with %s bound as constants: %s"
                                   % (first, ", ".join(sorted(consts)), second)) from None
            self.consts = consts
        factory = tether.build_graph(graph, params, target="host", opt_level=opt_level_for(model))
        self._dir = tempfile.TemporaryDirectory(prefix="tether-case-")
        factory.export(self._dir.name)
        self.gm = graph_executor.load(self._dir.name)
        # sequences, and optionals of sequences, come back as their elements' outputs
        self._outputs = [(vi.name, vi.type.WhichOneof("value") == "sequence_type" or (
            vi.type.WhichOneof("value") == "optional_type"
            and vi.type.optional_type.elem_type.WhichOneof("value") == "sequence_type")) for vi in model.graph.output]

    def run(self, feeds: Dict[str, Any]) -> List[Any]:
        from tether.frontend.onnx.sequence import element_names

        for k, v in feeds.items():
            if k in self.consts:
                if not np.array_equal(self.consts[k], v):
                    raise ValueError("input %s differs from the value the model was compiled with" % k)
                continue
            if isinstance(v, list):
                for name, x in zip(element_names(k, len(v)), v):
                    self.gm.set_input(name, x)
            elif v is not None:
                self.gm.set_input(k, v)
        self.gm.run()
        names = self.gm.output_names
        out: List[Any] = []
        for name, is_sequence in self._outputs:   # a sequence output comes back as its elements' outputs
            if is_sequence:
                n = sum(1 for o in names if o.startswith(name + ".") and o[len(name) + 1:].isdigit())
                out.append([self.gm.get_output(o) for o in element_names(name, n)])
            else:
                out.append(self.gm.get_output(name))
        return out

    def close(self) -> None:
        self._dir.cleanup()


def _short(exc: BaseException, limit: int = 400) -> str:
    text = "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    return text[:limit]


#: the message of a pass that bound some inputs as constants (``TetherCase``'s retry)
BOUND_PREFIX = "passes with inputs bound as constants: "


def run_tether(case: Any) -> tuple:
    """(status, message) of ``case`` through tether on the host."""
    feeds, expected = case_inputs(case), case_outputs(case)
    try:
        compiled = TetherCase(case.model, feeds[0])
    except Exception as exc:    # any import/compile failure is a refusal, its message the reason
        return REFUSED, _short(exc)
    try:
        for f, e in zip(feeds, expected):
            try:
                actual = compiled.run(f)
            except Exception as exc:
                return CRASH, _short(exc)
            diff = compare(case, e, actual)
            if diff is not None:
                return WRONG, diff[:1000]
        # a pass that needed integer inputs fixed at compile time says which (a real model feeds them at run time)
        return PASS, (BOUND_PREFIX + ", ".join(sorted(compiled.consts))) if compiled.consts else ""
    finally:
        compiled.close()


def run_ort(case: Any) -> tuple:
    """("pass" | "fail", message) of ``case`` through onnxruntime (one thread)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "skipped", "onnxruntime is not installed"
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        if ort_bfloat16.has_bfloat16_io(case.model):    # onnxruntime's Python API has no bfloat16 arrays
            sess = ort_bfloat16.Session(case.model, so)
        else:
            sess = ort.InferenceSession(case.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for f, e in zip(case_inputs(case), case_outputs(case)):
            actual = sess.run(None, f)
            diff = compare(case, e, actual)
            if diff is not None:
                return "fail", diff[:400]
    except Exception as exc:
        return "fail", _short(exc)
    return "pass", ""


def run_case(case: Any, op_type: str, ort: bool = True) -> CaseResult:
    t0 = time.perf_counter()
    r = CaseResult(case.name, op_type)
    if ort:
        r.ort, r.ort_message = run_ort(case)
    r.tether, r.tether_message = run_tether(case)
    r.seconds = time.perf_counter() - t0
    return r


def run_forked(cases: Sequence[Any], ops: Dict[str, str], jobs: int = 1, timeout: float = 300.0,
               ort: bool = True, on_result=None) -> List[CaseResult]:
    """Run every case in its own forked process, ``jobs`` at a time; a case that hangs past ``timeout`` seconds
    or kills its process is a ``crash`` (so one bad case never stalls or ends the run)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    os.environ.setdefault("TETHER_BUILD_JOBS", "1")     # the workers are the parallelism
    # import the compiler once, before forking: workers start warm, and all of them run the same code even if
    # the source tree changes during a long run
    import importlib
    for mod in ("tether", "tether.frontend.onnx", "tether.graph.build", "tether.graph.to_te", "tether.driver",
                "tether.codegen.module", "tether.codegen.emit", "tether.graph_executor", "onnx.backend.test.runner"):
        importlib.import_module(mod)
    results: Dict[int, CaseResult] = {}
    pending = list(range(len(cases)))
    running: Dict[int, tuple] = {}

    def child(i: int, conn) -> None:
        try:
            res = run_case(cases[i], ops[cases[i].name], ort)
            conn.send(res.to_json())
        except BaseException as exc:    # report, never leave the parent waiting
            conn.send(CaseResult(cases[i].name, ops[cases[i].name], tether=CRASH,
                                 tether_message=_short(exc)).to_json())
        finally:
            conn.close()

    def finish(i: int, res: CaseResult) -> None:
        results[i] = res
        if on_result is not None:
            on_result(res)

    while pending or running:
        while pending and len(running) < max(1, jobs):
            i = pending.pop(0)
            parent, kid = ctx.Pipe(duplex=False)
            p = ctx.Process(target=child, args=(i, kid), daemon=True)
            p.start()
            kid.close()
            running[i] = (p, parent, time.monotonic())
        from multiprocessing.connection import wait
        wait([r[1] for r in running.values()], timeout=1.0)
        for i, (p, conn, t0) in list(running.items()):
            name, op = cases[i].name, ops[cases[i].name]
            if conn.poll():
                try:
                    finish(i, CaseResult(**conn.recv()))
                except EOFError:
                    p.join(5)
                    finish(i, CaseResult(name, op, tether=CRASH,
                                         tether_message="worker died (exit code %s)" % p.exitcode))
                p.join(5)
                conn.close()
                del running[i]
            elif not p.is_alive():
                finish(i, CaseResult(name, op, tether=CRASH, tether_message="worker died (exit code %s)"
                                     % p.exitcode))
                conn.close()
                del running[i]
            elif time.monotonic() - t0 > timeout:
                p.kill()
                p.join(5)
                finish(i, CaseResult(name, op, tether=CRASH, tether_message="timed out after %gs" % timeout,
                                     seconds=timeout))
                conn.close()
                del running[i]
    return [results[i] for i in range(len(cases))]


def summarize(results: Sequence[CaseResult]) -> Dict[str, Dict[str, int]]:
    """Op type -> counts: cases, ort (passes), pass, refused, wrong, crash."""
    table: Dict[str, Dict[str, int]] = {}
    for r in results:
        row = table.setdefault(r.op_type, {"cases": 0, "ort": 0, PASS: 0, REFUSED: 0, WRONG: 0, CRASH: 0})
        row["cases"] += 1
        row["ort"] += r.ort == "pass"
        row[r.tether] = row.get(r.tether, 0) + 1
    return table
