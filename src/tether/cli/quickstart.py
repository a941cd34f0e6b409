"""`tether quickstart`: the main job on the embedded default, end to end on loopback.

It starts a local tracker and a device server that registers with it (both on loopback), compiles
small kernels for this machine with tether.build, uploads them, runs them remotely, checks every result against
numpy, and prints a timing table measured on the device next to numpy's time for the same work.
"""
from __future__ import annotations

import pathlib
import tempfile
import time
from typing import Callable, List, Tuple

import click
import numpy as np


def _kernels(n: int, m: int):
    """(name, schedule, args, make_inputs, numpy_reference) for each demo kernel."""
    from tether import ops, te

    A = te.placeholder((n,), "float32", name="A")
    B = te.placeholder((n,), "float32", name="B")
    Cin = te.placeholder((n,), "float32", name="C")
    Y = ops.relu(ops.add(ops.multiply(A, B), Cin))
    s_fused = ops.schedule([Y], target="host")

    X = te.placeholder((m, m), "float32", name="X")
    W = te.placeholder((m, m), "float32", name="W")
    Z = ops.matmul(X, W)
    s_mm = ops.schedule([Z], target="host")

    rng = np.random.default_rng(0)
    vec = lambda: rng.standard_normal(n).astype("float32")  # noqa: E731
    mat = lambda: rng.standard_normal((m, m)).astype("float32")  # noqa: E731
    return [
        ("fused_relu_fma", s_fused, [A, B, Cin, Y], lambda: [vec(), vec(), vec()],
         lambda a, b, c: np.maximum(a * b + c, 0), (n,)),
        ("matmul", s_mm, [X, W, Z], lambda: [mat(), mat()], lambda x, w: x @ w, (m, m)),
    ]


def _median_seconds(fn: Callable[[], object], repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@click.command("quickstart")
@click.option("--size", default=1 << 20, show_default=True, type=click.IntRange(1),
              help="Vector length of the elementwise kernel.")
@click.option("--matmul-size", default=256, show_default=True, type=click.IntRange(1),
              help="Matrix size of the matmul kernel.")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Seconds allowed for any single step.")
def command(size: int, matmul_size: int, timeout: float) -> None:
    """Start a local tracker and device server, compile kernels for this machine, run them remotely through the
    tracker, check them against numpy and time them on the device."""
    import tether
    from rich.console import Console
    from rich.table import Table

    from tether import rpc
    from tether.launch import start_rpc_server, start_tracker

    console = Console()
    key = "local"
    with tempfile.TemporaryDirectory(prefix="tether-quickstart-") as tmp, \
            start_tracker("--host", "127.0.0.1", "--port", "0", start_timeout=timeout) as tracker_proc, \
            start_rpc_server("--host", "127.0.0.1", "--port", "0", "--tracker", tracker_proc.address, "--key", key,
                             start_timeout=timeout) as server:
        console.print("tracker listening on [bold]%s[/] (pid %d); device server on [bold]%s[/] (pid %d), key %r"
                      % (tracker_proc.address, tracker_proc.pid, server.address, server.pid, key))
        rows: List[Tuple[str, str, float, float]] = []
        tracker = rpc.connect_tracker(tracker_proc.host, tracker_proc.port)
        with tracker, tracker.request(key, wait_timeout=timeout, session_timeout=600) as remote:
            info = remote.device_info()
            console.print("device: %s, %s cores, suggested target %s"
                          % (info.get("arch"), info.get("num_cores"), info.get("suggested_target")))
            for name, sch, args, make_inputs, reference, out_shape in _kernels(size, matmul_size):
                t0 = time.perf_counter()
                lib = tether.build(sch, args, target="host", name=name)
                path = pathlib.Path(tmp) / (name + ".so")
                lib.export_library(str(path))
                compile_s = time.perf_counter() - t0
                remote.upload(str(path))
                f = remote.load_module(path.name)[name]
                inputs = make_inputs()
                dev_in = [remote.array(x) for x in inputs]
                out = remote.empty(out_shape, "float32")
                f(*dev_in, out)
                expected = reference(*inputs)
                np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
                res = f.time_evaluator(number=10, repeat=5, min_repeat_ms=50)(*dev_in, out)
                numpy_s = _median_seconds(lambda: reference(*inputs))
                rows.append((name, "%.0f ms" % (compile_s * 1e3), res.median, numpy_s))
                console.print("[green]ok[/] %s matches numpy" % name)

    table = Table(title="tether quickstart (device times measured on the device)")
    for col in ("kernel", "compile", "device median", "numpy median", "numpy / tether"):
        table.add_column(col, justify="right" if col != "kernel" else "left")
    for name, compile_ms, dev, ref in rows:
        table.add_row(name, compile_ms, "%.1f µs" % (dev * 1e6), "%.1f µs" % (ref * 1e6), "%.2fx" % (ref / dev))
    console.print(table)
