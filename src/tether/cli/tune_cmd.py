"""`tether tune`: search the schedule configs of a model's kernels on the devices of a tracker key (docs/tune.md).

    tether tune model.onnx --tracker 127.0.0.1:9190 --key host --log tune.jsonl --time-budget 600
    tether tune model.onnx ... --resume          # after a kill: continues, measuring nothing twice
    tether tune --log tune.jsonl --report tune.html
    tether compile model.onnx --tuning-log tune.jsonl
"""
from __future__ import annotations

import time
from typing import Any, Optional, Tuple

import click

from tether.cli.compile_cmd import parse_input_shapes
from tether.cli.params import TARGET, OutputFile, check_tuning_log


def _table(tuner: Any) -> Any:
    from rich.table import Table

    pool = tuner.pool
    elapsed = max(tuner.elapsed(), 1e-6)
    devices = pool.devices_in_use() if pool is not None else []
    title = ("tether tune: %d measured, %.1f/s, %d in flight, %.0f s; devices in use (%d): %s"
             % (tuner.measured_now, tuner.measured_now / elapsed, tuner.in_flight, elapsed, len(devices),
                ", ".join(devices) or "-"))
    table = Table(title=title, title_justify="left")
    verified = {r["task"]: r for r in tuner.summary()["tasks"] if "verified_best_s" in r}
    for col in ("task", "kernel", "weight", "trials", "default", "best", "speedup", "verified", "invalid"):
        table.add_column(col, justify="left" if col in ("task", "kernel", "invalid") else "right")
    for st in tuner.states:
        speed = "%.2fx" % (st.default_s / st.best_s) if st.default_s and st.best_s else "-"
        v = verified.get(st.task.key)
        checked = "%.2fx" % (v["verified_default_s"] / v["verified_best_s"]) if v else "-"
        table.add_row(st.task.key[:8], st.task.name[:40], str(st.task.weight), str(st.trials), _ms(st.default_s),
                      _ms(st.best_s), speed, checked, ", ".join("%s %d" % kv for kv in sorted(st.failures.items()))
                      or ("default failed" if st.reference == "failed" else ""))
    return table


def require_ray() -> None:
    """--ray without Ray installed: one line naming the extra that installs it, before any work."""
    from tether.tune.ray_build import RayUnavailable, import_ray

    try:
        import_ray()
    except RayUnavailable as exc:
        raise click.ClickException(str(exc)) from None


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else "%.4f ms" % (seconds * 1e3)


@click.command("tune")
@click.argument("model", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--input-shape", "-s", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="Fix an input's shape (repeatable).")
@click.option("--tracker", metavar="HOST:PORT", help="The tracker the devices registered with.")
@click.option("--key", help="Device key (or glob) at the tracker; every device under it measures in parallel.")
@click.option("--tracker-token", envvar="TETHER_TRACKER_TOKEN", default=None,
              help="The tracker's token, if it has one (default: env TETHER_TRACKER_TOKEN).")
@click.option("--token", "session_token", envvar="TETHER_TOKEN", default=None,
              help="The devices' own token, if they have one (default: env TETHER_TOKEN).")
@click.option("--log", "log_path", required=True, type=OutputFile(),
              help="The tuning log (JSON lines, appended as results arrive).")
@click.option("--trials", default=200, show_default=True, type=click.IntRange(1),
              help="Configs measured per kernel at most (its default config included).")
@click.option("--time-budget", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Stop proposing configs after this long (running measurements finish).")
@click.option("--resume", is_flag=True, help="Continue the log: nothing measured in it is measured again.")
@click.option("--target", "-t", default="host", show_default=True, type=TARGET, help="Target preset or LLVM triple.")
@click.option("--opt-level", "-O", default=3, show_default=True, type=click.IntRange(0, 3))
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="Tune the kernels of a `tether compile --precision` build (fp16: a target with +fullfp16).")
@click.option("--only", multiple=True, metavar="TEXT", help="Tune only kernels whose ops label contains TEXT.")
@click.option("--build-jobs", default=2, show_default=True, type=click.IntRange(1), help="Forked build workers.")
@click.option("--repeat", default=8, show_default=True, type=click.IntRange(1), help="Timed repeats per config.")
@click.option("--min-repeat-ms", default=0.5, show_default=True, type=click.FloatRange(min=0),
              help="Each repeat runs the kernel for at least this long.")
@click.option("--flush-mb", default=4.0, show_default=True, type=click.FloatRange(min=0, max=256),
              help="MiB written on the device before each timed repeat, to start from cold caches (0: none).")
@click.option("--timeout", default=20.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a measurement may stay silent before its device counts as hung.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--report", "report_path", type=OutputFile(), default=None,
              help="Write the HTML tuning curves of the log here (alone, or after tuning).")
@click.option("--no-progress", is_flag=True, help="No live table (logging only).")
@click.option("--ray", "ray_address", default=None, metavar="HOST:PORT",
              help="Build the candidates on the Ray cluster with this head (pip install 'tether[ray]'); "
                   "measurement stays on the tracker's devices.")
@click.option("--op", "op_specs", multiple=True, metavar="op:NAME:DIMS",
              help="GPU targets: tune this op kernel (op:matmul:M,K,N, op:conv2d:N,C,H,W,O,K, ...) instead of a model.")
@click.option("--local", is_flag=True, help="GPU targets: measure on this machine's GPU (else --tracker/--key).")
def command(model: Optional[str], input_shapes: Tuple[str, ...], tracker: Optional[str], key: Optional[str],
            tracker_token: Optional[str], session_token: Optional[str], log_path: str, trials: int,
            time_budget: Optional[float], resume: bool, target: str, opt_level: int,
            only: Tuple[str, ...], build_jobs: int, repeat: int, min_repeat_ms: float, flush_mb: float, timeout: float,
            seed: int, report_path: Optional[str], no_progress: bool, ray_address: Optional[str],
            op_specs: Tuple[str, ...] = (), local: bool = False, precision: str = "fp32") -> None:
    """Tune MODEL's kernels on the devices of --key at --tracker, logging every measurement to --log. With a GPU
    --target: the GPU kernels of MODEL, or --op kernels, timed on the device's clock (--local or --tracker/--key)."""
    import os

    from tether.target import Target, check_precision

    try:   # before the model is read: a target without half arithmetic is a usage error
        check_precision(target, precision)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if Target(target).is_gpu:
        if model is None and not op_specs:
            raise click.UsageError("a GPU --target tunes a MODEL's GPU kernels or --op op:NAME:DIMS kernels")
        if not local and not (tracker and key):
            raise click.UsageError("GPU tuning measures on --local or a device of --tracker HOST:PORT --key KEY")
        _tune_gpu(model, input_shapes, op_specs, target, log_path, trials, time_budget, repeat, min_repeat_ms,
                  seed, opt_level, tracker if not local else None, key, timeout, resume,
                  tokens=(tracker_token, session_token))
        return
    if op_specs or local:
        raise click.UsageError("--op and --local tune GPU kernels: give a GPU --target (opencl, vulkan, cuda ...)")

    if model is None and not os.path.isfile(log_path):
        raise click.BadParameter("%s does not exist: the report needs a tuning log" % log_path, param_hint="--log")
    if os.path.isfile(log_path) and os.path.getsize(log_path):
        check_tuning_log(log_path)      # tuning appends to it: never to someone's other file
    if model is not None:
        if not tracker or not key:
            raise click.UsageError("tuning needs --tracker HOST:PORT and --key KEY")
        if ray_address:
            require_ray()
        from tether.tune.measure import MeasureOptions

        _tune(model, input_shapes, tracker, key, log_path, trials, time_budget, resume, target, opt_level, only,
              build_jobs, MeasureOptions(repeat=repeat, min_repeat_ms=min_repeat_ms, timeout=timeout,
                                         flush_bytes=int(flush_mb * (1 << 20))), seed, no_progress, ray_address,
              tokens=(tracker_token, session_token), precision=precision)
    elif report_path is None:
        raise click.UsageError("give a MODEL to tune, or --report to write the report of --log")
    if report_path is not None:
        from tether.tune.report import write_report

        n = write_report(log_path, report_path)
        click.echo("wrote %s (%d tasks)" % (report_path, n))


def _tune(model: str, input_shapes: Tuple[str, ...], tracker: str, key: str, log_path: str, trials: int,
          time_budget: Optional[float], resume: bool, target: str, opt_level: int, only: Tuple[str, ...],
          build_jobs: int, measure: Any, seed: int, no_progress: bool, ray_address: Optional[str] = None,
          tokens: Tuple[Optional[str], Optional[str]] = (None, None), precision: str = "fp32") -> None:
    from rich.console import Console
    from rich.live import Live

    from tether.errors import InvalidInput, TetherError, UnsupportedOpError
    from tether.frontend import from_onnx
    from tether.frontend.model_file import load_model_file
    from tether.tune.search import Tuner, TuneOptions
    from tether.tune.tasks import extract_tasks

    try:
        # a foreign or broken file: InvalidInput, one line, exit 2 (cli/errors.py); a reader's unsupported ops: 1
        shapes = parse_input_shapes(input_shapes)
        proto, base_dir = load_model_file(model, shape=shapes)
        graph, params = from_onnx(proto, shape=shapes, base_dir=base_dir)
    except InvalidInput:
        raise                   # bad input: exit 2 (cli/errors.py), not a compile error
    except (UnsupportedOpError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    tasks = extract_tasks(graph, params, target, opt_level, only=list(only) or None, precision=precision)
    if not tasks:
        raise click.ClickException("%s has no kernel to tune%s" % (model, " matching --only" if only else ""))
    options = TuneOptions(trials=trials, time_budget=time_budget, build_jobs=build_jobs, seed=seed,
                          measure=measure, ray=ray_address)
    console = Console()
    live: Any = None

    def progress(tuner: Any) -> None:
        if live is not None:
            live.update(_table(tuner))

    tuner = Tuner(tasks, log_path, tracker, key, options=options, resume=resume,
                  on_progress=None if no_progress else progress, tracker_token=tokens[0], session_token=tokens[1])
    t0 = time.monotonic()
    try:
        if no_progress:
            summary = tuner.run()
        else:
            with Live(console=console, refresh_per_second=4) as live:
                summary = tuner.run()
    except TetherError as exc:
        raise click.ClickException(str(exc)) from None
    console.print(_table(tuner))
    speed = summary["kernel_speedup"]
    click.echo("%d measurements in %.0f s; kernel time of the model (weighted), default / tuned: %s; log %s"
               % (summary["measured"], time.monotonic() - t0, "%.2fx" % speed if speed else "-", log_path))
    stats = getattr(tuner.builder, "stats", None)
    if stats is not None:
        click.echo("builds on Ray: %(built)d built, %(cluster_hits)d from the cluster's store, %(local_hits)d from "
                   "the local cache, %(run_hits)d shared within the run" % stats)


def _tune_gpu(model: Optional[str], input_shapes: Tuple[str, ...], op_specs: Tuple[str, ...], target: str,
              log_path: str, trials: int, time_budget: Optional[float], repeat: int, min_repeat_ms: float, seed: int,
              opt_level: int, tracker: Optional[str], key: Optional[str], timeout: float, resume: bool = False,
              tokens: Tuple[Optional[str], Optional[str]] = (None, None)) -> None:
    """GPU kernels tuned one config at a time on one device (tune/gpu.py), on the device's clock."""
    import contextlib

    from tether.bench.op_kernels import OpSpecError, parse_op
    from tether.tune import gpu as gpu_tune

    tasks: list = []
    try:
        tasks += [gpu_tune.GpuOpTask(parse_op(spec), target) for spec in op_specs]
    except OpSpecError as exc:
        raise click.BadParameter(str(exc), param_hint="--op") from None
    if model is not None:
        from tether.frontend import from_onnx
        from tether.frontend.model_file import load_model_file

        shapes = parse_input_shapes(input_shapes)
        proto, base_dir = load_model_file(model, shape=shapes)
        graph, params = from_onnx(proto, shape=shapes, base_dir=base_dir)
        tasks += gpu_tune.model_gpu_tasks(graph, params, target, opt_level)
    if not tasks:
        raise click.ClickException("nothing to tune on the GPU for %s" % target)

    @contextlib.contextmanager
    def open_session() -> Any:
        from tether import rpc

        if tracker is None:
            with rpc.LocalSession() as sess:
                yield sess
        else:
            thost, _, tport = tracker.rpartition(":")
            with rpc.connect_tracker(thost, int(tport), token=tokens[0], timeout=min(timeout, 30.0)) as tr:
                grant = tr.reserve(key, wait_timeout=max(timeout, 60.0), session_timeout=3600.0)
                host = grant["host"] if grant.get("host") is not None else thost
                port = grant["port"] if grant.get("port") is not None else int(tport)
                with rpc.connect(host, port, match=grant["match"], token=tokens[1],
                                 timeout=max(timeout, 60.0)) as sess:
                    yield sess

    def show(rec: Any) -> None:
        click.echo("%-12s %s %s" % (rec["status"], "%.3g ms" % (rec["latency_s"] * 1e3) if rec.get("latency_s")
                                    else "-", rec["config"]))

    try:
        gpu_tune.tune_gpu(tasks, log_path, open_session, trials=trials, time_budget=time_budget, repeat=repeat,
                          min_repeat_ms=min_repeat_ms, seed=seed, device_label="local" if tracker is None else key,
                          on_result=show, resume=resume)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(gpu_tune.read_summary(log_path))
