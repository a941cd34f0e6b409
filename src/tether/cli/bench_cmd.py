"""`tether bench TARGET... [--local | --host H --port P | --tracker HOST:PORT --key KEY [--all-devices]]` and
`tether bench compare BASE.json NEW.json [--fail-above PCT] [--pair-by-order | --pair BASE_NAME=NEW_NAME]`.
docs/bench.md describes the method and outputs."""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import click

from ..bench.stats import format_seconds as fmt_time
from .compile_cmd import parse_input_shapes
from .params import TARGET, OutputFile


class _BenchGroup(click.Group):
    """`tether bench ARGS` runs benchmarks; `tether bench compare ...` compares two JSON documents."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        if not args or args[0] not in self.commands:
            args = ["run"] + list(args)
        return super().parse_args(ctx, args)


class _RunCommand(click.Command):
    """`run` is the group's default: its usage line reads `tether bench [OPTIONS] TARGETS...`."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        path = ctx.parent.command_path if ctx.parent is not None else ctx.command_path
        formatter.write_usage(path, " ".join(self.collect_usage_pieces(ctx)))


@click.group("bench", cls=_BenchGroup)
def command() -> None:
    """Benchmark kernels and models on a device (see `tether bench run --help`, `tether bench compare --help`)."""


def _parse_shape(text: str) -> Tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise click.BadParameter("a shape is integers separated by commas, e.g. 1024 or 64,64; got %r" % text,
                                 param_hint="--shape") from None


def _parse_cpus(text: Optional[str]) -> Optional[List[int]]:
    """'0-2,5' -> [0, 1, 2, 5]."""
    if not text:
        return None
    cpus: List[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise click.BadParameter("CPUs as a list like 0-2,5; got %r" % text, param_hint="--pin") from None
    return sorted(set(cpus))


def _split_hostport(text: str, option: str) -> Tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter("expected HOST:PORT, got %r" % text, param_hint=option)
    return host.strip("[]") or "127.0.0.1", int(port)


def _unit(seconds: float) -> Tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return unit, scale
    return "ns", 1e-9


def _fmt_ci(lo: float, hi: float) -> str:
    unit, scale = _unit(hi)
    return "%.3g-%.3g %s" % (lo / scale, hi / scale, unit)


@contextlib.contextmanager
def _tracker_session(tracker: str, key: str, timeout: float, token: Optional[str], call_timeout: Any,
                     session_seconds: float) -> Iterator[Tuple[Any, str, Dict]]:
    from tether import rpc

    thost, tport = _split_hostport(tracker, "--tracker")
    with rpc.connect_tracker(thost, tport, token=token, timeout=min(timeout, 30.0)) as tr:
        grant = tr.reserve(key, wait_timeout=timeout, session_timeout=session_seconds)
        host = grant["host"] if grant.get("host") is not None else thost
        port = grant["port"] if grant.get("port") is not None else tport
        with rpc.connect(host, port, match=grant["match"], timeout=call_timeout) as sess:
            device_id = "%s/device-%s" % (grant.get("key", key), grant.get("device"))
            yield sess, device_id, {"mode": "tracker", "tracker": tracker, "key": key, "device": grant.get("device"),
                                    "relay": bool(grant.get("relay"))}


def _count_devices(tracker: str, key: str, token: Optional[str]) -> int:
    from tether import rpc
    from tether_rpc.tracker_protocol import parse_pattern, pattern_matches

    thost, tport = _split_hostport(tracker, "--tracker")
    with rpc.connect_tracker(thost, tport, token=token) as tr:
        devices = tr.summary()["devices"]
    pattern = parse_pattern(key)
    return sum(1 for d in devices if pattern_matches(pattern, d["key"], d.get("tags", {})))


class _Live:
    """The rich progress display: one bar per (device, target), advanced by the device's sample events."""

    def __init__(self, console: Any, expected: int, enabled: bool):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled
        self.expected = expected
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), console=console, transient=False, disable=not enabled)
        self._tasks: Dict[Tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def on_sample(self, device: str, target: str, payload: Dict[str, Any]) -> None:
        with self._lock:
            task = self._tasks.get((device, target))
            if task is None:
                task = self.progress.add_task("%s on %s" % (target, device), total=self.expected, info="")
                self._tasks[(device, target)] = task
        info = fmt_time(float(payload.get("seconds", 0)))
        if "temp_c" in payload:
            info += "  %.1f C" % payload["temp_c"]
        # sample events are rate-limited on the device: each says how far the run is
        self.progress.update(task, completed=min(self.expected, int(payload.get("index", 0)) + 1), info=info)


def _results_tables(doc: Dict[str, Any]) -> List[Any]:
    from rich.table import Table

    table = Table(title="tether bench: time per run", show_lines=False)
    for col in ("target", "device", "median", "95% CI", "min", "p90", "p99", "IQR", "CV", "n x runs", "warm-up"):
        table.add_column(col, justify="left" if col in ("target", "device") else "right")
    phases = Table(title="phases and memory")
    for col in ("target", "device", "compile", "upload", "load", "first run", "steady", "peak RSS", "arena"):
        phases.add_column(col, justify="left" if col in ("target", "device") else "right")
    for r in doc["results"]:
        s = r["stats"]
        cv = "%.1f%%" % (100 * s["cv"])
        if s["unstable"]:
            cv = "[yellow]%s ![/yellow]" % cv
        table.add_row(r["target"], r["device"], fmt_time(s["median"]),
                      _fmt_ci(*s["ci95_median"]),
                      fmt_time(s["min"]), fmt_time(s["p90"]), fmt_time(s["p99"]), fmt_time(s["iqr"]), cv,
                      "%d x %d" % (s["n"], r["number"]), str(r["warmup"]["count"]))
        ph, mem = r["phases"], r["memory"]
        phases.add_row(r["target"], r["device"], fmt_time(ph.get("compile_s")), fmt_time(ph.get("upload_s")),
                       fmt_time(ph.get("load_s")), fmt_time(ph.get("first_run_s")), fmt_time(ph.get("steady_s")),
                       "%.1f MiB" % (mem["peak_rss_bytes"] / 2 ** 20) if "peak_rss_bytes" in mem else "-",
                       "%.1f KiB" % (mem["arena_bytes"] / 2 ** 10) if "arena_bytes" in mem else "-")
    tables = [table, phases]
    if doc.get("pairs"):
        pairs = Table(title="GPU and CPU builds on the same device")
        for col in ("target", "device", "GPU", "GPU median", "clock", "CPU median", "clock ", "speedup (CPU / GPU)"):
            pairs.add_column(col, justify="left" if col in ("target", "device", "GPU") else "right")
        for p in doc["pairs"]:
            pairs.add_row(p["pair"], p["device"], p["compute"], fmt_time(p["gpu_median_s"]), p["gpu_clock"],
                          fmt_time(p["cpu_median_s"]), p["cpu_clock"],
                          "-" if p["speedup"] is None else "%.2fx" % p["speedup"])
        tables.append(pairs)
    return tables


def _fmt_count(n: float) -> str:
    return "%d" % n if float(n).is_integer() else "%.1f" % n


def _counts_table(doc: Dict[str, Any]) -> Optional[Any]:
    """Instructions per inference by class, one row per result that has them (--count-instructions)."""
    from rich.table import Table

    from tether.bench.insn_count import CLASSES

    rows = [r for r in doc["results"] if "instruction_counts" in r]
    if not rows:
        return None
    table = Table(title="instructions per inference (emulated CPU, exact)")
    for col in ("target", "cpu", "total", *CLASSES, "in kernels"):
        table.add_column(col, justify="left" if col in ("target", "cpu") else "right")
    for r in rows:
        ic = r["instruction_counts"]
        per = ic["per_inference"]
        in_kernels = ic["in_kernels"]["total"] if "in_kernels" in ic else None
        table.add_row(r["target"], "%s (%s)" % (ic["cpu"], ic["preset"]), _fmt_count(per["total"]),
                      *[_fmt_count(per[c]) for c in CLASSES], "-" if in_kernels is None else _fmt_count(in_kernels))
    return table


@command.command("run", cls=_RunCommand)
@click.argument("targets", nargs=-1, required=True)
@click.option("--local", is_flag=True, help="Measure in this process (the default when no device is named).")
@click.option("--host", help="A device server to connect to.")
@click.option("--port", default=9090, show_default=True, type=int)
@click.option("--token", default=None, help="The device server's token (default: env TETHER_TOKEN).")
@click.option("--tracker", metavar="HOST:PORT", help="Request devices from this tracker.")
@click.option("--key", help="Device key, glob or tags to request from the tracker.")
@click.option("--tracker-token", default=None, help="The tracker's token (default: env TETHER_TRACKER_TOKEN).")
@click.option("--all-devices", is_flag=True, help="Run on every device matching --key at once.")
@click.option("--shape", "shapes", multiple=True, metavar="D0,D1,...",
              help="LIB.so:FUNC argument shape, once per argument (default: the library's metadata).")
@click.option("--dtype", "dtypes", multiple=True, help="Argument dtype: once for all, or once per argument.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="ONNX input shape (symbolic dimensions).")
@click.option("--target", "compile_target", default=None, type=TARGET,
              help="Compile ONNX files for this preset (default: the device's suggested target).")
@click.option("--gpu", type=click.Choice(["opencl", "vulkan", "cuda"]), default=None,
              help="Build op: kernels and ONNX models for this GPU API too, and report them beside the CPU build "
                   "(also implied by a GPU --target).")
@click.option("--opt-level", default=3, show_default=True, type=click.IntRange(0, 3))
@click.option("--fast-math", is_flag=True)
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="ONNX files: compute float32 math in half on a device with half arithmetic (aarch64 "
                   "fphp/asimdhp; its -fp16 preset when no --target is given), as `tether compile --precision`.")
@click.option("--samples", "-n", default=20, show_default=True, type=click.IntRange(1, 10000),
              help="Steady-state samples (at least this many after the warm-up).")
@click.option("--min-sample-ms", default=10.0, show_default=True, type=float,
              help="Runs per sample are calibrated so one sample lasts at least this long.")
@click.option("--number", type=click.IntRange(1), default=None,
              help="Fixed runs per sample (default: calibrated from --min-sample-ms).")
@click.option("--max-warmup", default=10, show_default=True, type=click.IntRange(0, 1000),
              help="At most this many leading samples are dropped as warm-up.")
@click.option("--max-seconds", default=120.0, show_default=True, type=float, help="Time budget per target.")
@click.option("--cooldown-temp", type=float, default=None, metavar="C",
              help="Wait until the device is at most C degrees before each target.")
@click.option("--cooldown-timeout", type=float, default=300.0, show_default=True)
@click.option("--hot-temp", type=float, default=None, metavar="C",
              help="Flag samples at or above C (default: the thermal zone's passive trip point, else 80).")
@click.option("--pin", default=None, metavar="CPUS", help="Pin the run to these device CPUs, e.g. 0-3 or 2.")
@click.option("--keep-disturbed", is_flag=True,
              help="Keep samples during which other programs took the CPU in the statistics.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random inputs.")
@click.option("--profile", is_flag=True, help="Per-layer times of models.")
@click.option("--count-instructions", is_flag=True,
              help="Also count the guest instructions per inference of each model on the emulated CPU of the "
                   "target it was compiled for (qemu-user: rasp4b, rasp5, armv7-a7, ...), by class and kernel.")
@click.option("--json", "json_path", type=OutputFile(), help="Write the run document (raw samples).")
@click.option("--csv", "csv_path", type=OutputFile(), help="Write one summary row per result.")
@click.option("--html", "html_path", type=OutputFile(), help="Write a self-contained HTML report.")
@click.option("--upload-tracker", "upload_url", metavar="URL",
              help="Post the results' summary to a tracker's dashboard (`rpc-tracker --http`: http://HOST:PORT); "
                   "with --tracker-token or env TETHER_TRACKER_TOKEN when the tracker has a token.")
@click.option("--timeout", default=60.0, show_default=True, type=float,
              help="Seconds to wait for a device / connect.")
@click.option("--quiet", "-q", is_flag=True, help="No live progress display.")
def run_command(targets: Tuple[str, ...], local: bool, host: Optional[str], port: int, token: Optional[str],
                tracker: Optional[str], key: Optional[str], tracker_token: Optional[str], all_devices: bool,
                shapes: Tuple[str, ...], dtypes: Tuple[str, ...], input_shapes: Tuple[str, ...],
                compile_target: Optional[str], gpu: Optional[str], opt_level: int, fast_math: bool, precision: str,
                samples: int, min_sample_ms: float,
                number: Optional[int], max_warmup: int, max_seconds: float, cooldown_temp: Optional[float],
                cooldown_timeout: float, hot_temp: Optional[float], pin: Optional[str], keep_disturbed: bool,
                seed: int, profile: bool, count_instructions: bool, json_path: Optional[str], csv_path: Optional[str],
                html_path: Optional[str], upload_url: Optional[str], timeout: float, quiet: bool) -> None:
    """Benchmark TARGETs: LIB.so:FUNC, model folders (from `tether compile`), ONNX files or op:NAME:DIMS kernels
    (op:add:N, op:matmul:M,K,N, op:conv2d:N,C,H,W,O,K, op:softmax:R,C). With a GPU --target or --gpu API, ops and
    ONNX models are built for the GPU and for the host CPU and reported side by side.

    Also: `tether bench compare BASE.json NEW.json [--fail-above PCT]`.
    """
    from rich.console import Console

    from tether.bench import io as bench_io
    from tether.bench import runner

    modes = sum(bool(x) for x in (local, host, tracker))
    if modes > 1:
        raise click.UsageError("choose one of --local, --host or --tracker")
    if tracker and not key:
        raise click.UsageError("--tracker needs --key")
    if all_devices and not tracker:
        raise click.UsageError("--all-devices needs --tracker and --key")
    from tether.gpu_target import is_gpu_spec
    from tether.target import check_precision

    if precision != "fp32" and (gpu or (compile_target and is_gpu_spec(compile_target))):
        raise click.ClickException("--precision %s is for CPU builds; a GPU target takes -fp16=1 in its spec "
                               "(docs/gpu.md)" % precision)
    if compile_target:
        try:
            check_precision(compile_target, precision)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    options = runner.BenchOptions(min_sample_ms=min_sample_ms, samples=samples, max_warmup=max_warmup,
                                  max_seconds=max_seconds, pin=_parse_cpus(pin), hot_c=hot_temp,
                                  cooldown_temp=cooldown_temp, cooldown_timeout=cooldown_timeout, seed=seed,
                                  profile=profile, compile_target=compile_target, opt_level=opt_level,
                                  fast_math=fast_math, keep_disturbed=keep_disturbed, number=number,
                                  count_instructions=count_instructions, gpu=gpu, precision=precision)
    try:
        parsed = [runner.parse_target(t, [_parse_shape(s) for s in shapes] or None, list(dtypes) or None,
                                      parse_input_shapes(input_shapes)) for t in targets]
    except runner.BenchError as exc:
        raise click.UsageError(str(exc)) from None
    from tether.rpc import Timeout

    # One bench.run call lasts up to --max-seconds plus the first run and the calibration: the read timeout
    # (the longest a reply may take) must outlast it, and a granted session must outlast every target.
    per_target = max_seconds + 300.0
    call_timeout = Timeout(connect=timeout, read=max(timeout, per_target), write=max(timeout, 60.0),
                           session=max(timeout, 600.0))
    session_seconds = max(600.0, len(parsed) * per_target + 60.0)
    console = Console(stderr=True)
    out = Console()
    if not out.is_terminal:  # a pipe or a file: no terminal width to respect, so no wrapped cells
        out = Console(width=200)
    live = _Live(console, samples, enabled=not quiet and console.is_terminal)
    devices: List[Dict[str, Any]] = []
    results: List[Dict[str, Any]] = []

    def job(open_session: Any) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
        with open_session() as (sess, device_id, connection):
            return runner.bench_on_session(
                sess, parsed, options, device_id, connection, cache,
                on_sample=lambda target, payload: live.on_sample(device_id, target, payload),
                on_result=lambda r: [console.print("[yellow]warning[/yellow] %s on %s: %s"
                                                   % (r["target"], r["device"], w)) for w in r["warnings"]])

    @contextlib.contextmanager
    def local_session() -> Iterator[Tuple[Any, str, Dict]]:
        from tether import rpc

        with rpc.LocalSession() as sess:
            yield sess, "local", {"mode": "local"}

    @contextlib.contextmanager
    def direct_session() -> Iterator[Tuple[Any, str, Dict]]:
        from tether import rpc

        with rpc.connect(host, port, token=token, timeout=call_timeout) as sess:
            yield sess, "%s:%d" % (host, port), {"mode": "direct", "host": host, "port": port}

    from tether.errors import InvalidInput, TetherError

    with runner.temp_workdir() as work:
        cache = runner.OnnxCache(work)
        try:
            with live.progress:
                if tracker and all_devices:
                    count = _count_devices(tracker, key, tracker_token)
                    if count == 0:
                        raise click.ClickException("the tracker has no device matching %r" % key)
                    def pooled() -> Any:
                        return _tracker_session(tracker, key, timeout, tracker_token, call_timeout, session_seconds)

                    # one session per device, all at once: each request is granted a different free device
                    with concurrent.futures.ThreadPoolExecutor(count) as pool:
                        futures = [pool.submit(job, pooled) for _ in range(count)]
                        for fut in futures:
                            dev, res = fut.result()
                            devices.append(dev)
                            results.extend(res)
                elif tracker:
                    dev, res = job(lambda: _tracker_session(tracker, key, timeout, tracker_token, call_timeout,
                                                                   session_seconds))
                    devices.append(dev)
                    results.extend(res)
                else:
                    dev, res = job(direct_session if host else local_session)
                    devices.append(dev)
                    results.extend(res)
        except InvalidInput:
            raise                   # bad input: one line and exit status 2 (cli/errors.py)
        except (runner.BenchError, TetherError, OSError, ValueError) as exc:
            # ValueError: a bad option the device refused (--pin to a CPU it lacks), raised as is by --local
            raise click.ClickException(str(exc)) from None
    doc = runner.run_document(devices, results, options, sys.argv)
    for table in _results_tables(doc):
        out.print(table)
    counts = _counts_table(doc)
    if counts is not None:
        out.print(counts)
    for p in doc.get("pool", []):
        out.print("%s across %d devices: medians %s-%s (spread %.1f%%), between-device share of variance %.0f%%"
                      % (p["target"], len(p["devices"]), fmt_time(p["min_median"]), fmt_time(p["max_median"]),
                         100 * p["spread_of_medians"], 100 * p["between_share"]))
    if json_path:
        bench_io.write_json(doc, json_path)
    if csv_path:
        bench_io.write_csv(doc, csv_path)
    if html_path:
        from tether.bench import report
        report.write_report(doc, html_path)
    if upload_url:
        from tether.tracker.bench_board import upload_bench

        try:
            upload_bench(upload_url, doc, tracker_token or os.environ.get("TETHER_TRACKER_TOKEN") or None,
                         timeout=timeout)
        except (OSError, ValueError) as exc:
            # the results are written and printed; only the upload is missing
            raise click.ClickException("bench upload: %s" % exc) from None


@command.command("compare")
@click.argument("base", type=click.Path(exists=True, dir_okay=False))
@click.argument("new", type=click.Path(exists=True, dir_okay=False))
@click.option("--fail-above", default=5.0, show_default=True, type=float, metavar="PCT",
              help="Smallest change called faster/slower; exit 1 when something is significantly slower by more "
                   "than PCT percent.")
@click.option("--alpha", default=0.01, show_default=True, type=float, help="Significance level of the U test.")
@click.option("--pair-by-order", is_flag=True,
              help="Compare the k-th target of BASE with the k-th of NEW, whatever their names.")
@click.option("--pair", "pairs", multiple=True, metavar="BASE_NAME=NEW_NAME",
              help="Compare BASE's target BASE_NAME with NEW's NEW_NAME (repeatable); other targets pair by name.")
@click.option("--json", "json_path", type=OutputFile(), help="Write the comparison as JSON.")
@click.option("--html", "html_path", type=OutputFile(), help="Write the comparison as a report.")
def compare_command(base: str, new: str, fail_above: float, alpha: float, pair_by_order: bool,
                    pairs: Tuple[str, ...], json_path: Optional[str], html_path: Optional[str]) -> None:
    """Compare two `tether bench --json` documents per target and device: faster, slower or same.

    Exit status 1 when something is slower (see --fail-above), 2 when nothing could be compared: results pair up
    by target name, so name the pairs (--pair) or pair them by order (--pair-by-order) when two builds of one
    model sit in folders of different names."""
    from rich.console import Console
    from rich.table import Table

    from tether.bench import compare
    from tether.bench import io as bench_io
    from tether.errors import InvalidInput

    if pair_by_order and pairs:
        raise click.UsageError("--pair-by-order and --pair exclude each other")
    named = []
    for spec in pairs:
        b, sep, n = spec.partition("=")
        if not sep or not b or not n:
            raise click.BadParameter("expected BASE_NAME=NEW_NAME, got %r" % spec, param_hint="--pair")
        named.append((b, n))
    base_doc, new_doc = bench_io.read_json(base), bench_io.read_json(new)
    rename = compare.pair_by_order(base_doc, new_doc) if pair_by_order else \
        compare.pair_by_names(base_doc, new_doc, named)
    cmp = compare.compare_documents(base_doc, new_doc, alpha=alpha, fail_above=fail_above, rename=rename)
    if not cmp["rows"]:
        # a gate that compared nothing must not pass
        raise InvalidInput("nothing was compared: %s and %s have no target in common (base: %s; new: %s); pair "
                           "them with --pair BASE_NAME=NEW_NAME or --pair-by-order"
                           % (base, new, ", ".join(compare.targets(base_doc)) or "no results",
                              ", ".join(compare.targets(new_doc)) or "no results"))
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    table = Table(title="tether bench compare")
    for col in ("target", "device", "base median", "new median", "ratio", "95% CI", "p (U test)", "verdict"):
        table.add_column(col)
    colors = {"slower": "red", "faster": "green", "same": "white"}
    for row in cmp["rows"]:
        table.add_row(compare.paired_name(row), row["device"], fmt_time(row["base_median"]),
                      fmt_time(row["new_median"]),
                      "%.3f" % row["ratio"], "%.3f-%.3f" % tuple(row["ratio_ci95"]), "%.2g" % row["p_value"],
                      "[%s]%s[/%s]" % (colors[row["verdict"]], row["verdict"], colors[row["verdict"]]))
    console.print(table)
    for note in cmp["notes"]:
        console.print("[yellow]note[/yellow] " + note)
    if json_path:
        bench_io.write_json(cmp, json_path)
    if html_path:
        from tether.bench import report
        report.write_compare_report(cmp, base_doc, new_doc, html_path)
    if cmp["failed"]:
        console.print("[red]FAIL[/red]: significantly slower by more than %.1f%%: %s"
                      % (fail_above, ", ".join("%s on %s" % (r["target"], r["device"]) for r in cmp["failed"])))
        sys.exit(1)
