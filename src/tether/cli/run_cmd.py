"""`tether run out/ [--tracker HOST:PORT --key KEY | --host H --port P] [--input x.npy]`: run a compiled model
and print a summary of its outputs and timings (locally when no device is named)."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional, Tuple

import click
import numpy as np

from tether.cli.params import OutputFile


def _load_inputs(specs: Tuple[str, ...], entries: list) -> Dict[Any, np.ndarray]:
    """'x.npy' (inputs in order) or 'name=x.npy' -> {name or index: array}, each checked against the model's
    input it feeds (``entries``: the graph JSON's input entries). np.load without pickle."""
    from tether.errors import InvalidInput

    names = [e["name"] for e in entries]
    out: Dict[Any, np.ndarray] = {}
    for k, spec in enumerate(specs):
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = k, spec
        if name not in names and not (isinstance(name, int) and name < len(names)):
            raise InvalidInput("--input %s: the model has no input %s (inputs: %s)"
                               % (spec, name if isinstance(name, str) else "number %d" % (name + 1), ", ".join(names)))
        try:
            with open(path, "rb") as fh:
                if fh.read(6) != b"\x93NUMPY":
                    raise ValueError("it does not start with the .npy magic")
            out[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InvalidInput("--input %s: %s; expected a NumPy .npy file" % (spec, getattr(exc, "strerror", None)
                                                                            or exc)) from None
        entry = entries[name if isinstance(name, int) else names.index(name)]
        if out[name].size != int(np.prod(entry["shape"], dtype=np.int64)):
            raise InvalidInput("--input %s holds an array of shape %s; input %r takes %s %s"
                               % (spec, out[name].shape, entry["name"], entry["dtype"], tuple(entry["shape"])))
    return out


@contextlib.contextmanager
def _session(host: Optional[str], port: int, tracker: Optional[str], key: Optional[str],
             timeout: float) -> Iterator[Any]:
    from tether import rpc

    if tracker:
        if not key:
            raise click.UsageError("--tracker needs --key (the device kind to request)")
        from tether_rpc.config import parse_hostport

        try:
            thost, tport = parse_hostport(tracker, default_host="127.0.0.1")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--tracker") from exc
        with rpc.connect_tracker(thost, tport, timeout=timeout) as tr:
            with tr.request(key, wait_timeout=timeout) as sess:
                yield sess
        return
    if host:
        with rpc.connect(host, port, timeout=timeout) as sess:
            yield sess
        return
    yield None


@click.command("run")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--tracker", metavar="HOST:PORT", help="Request a device from this tracker.")
@click.option("--key", help="Device key to request from the tracker (e.g. rasp4b).")
@click.option("--host", help="Connect straight to a device server.")
@click.option("--port", default=9090, show_default=True, type=int)
@click.option("--input", "-i", "inputs", multiple=True, metavar="[NAME=]FILE.npy",
              help="Input data (repeatable); random data when omitted.")
@click.option("--number", default=10, show_default=True, type=int, help="Runs per timing sample.")
@click.option("--repeat", default=3, show_default=True, type=int, help="Timing samples.")
@click.option("--profile", "do_profile", is_flag=True, help="Also time every node.")
@click.option("--save-output", type=OutputFile(), help="Save output 0 as .npy.")
@click.option("--timeout", default=60.0, show_default=True, type=float, help="Seconds for connect/requests.")
def command(folder: str, tracker: Optional[str], key: Optional[str], host: Optional[str], port: int,
            inputs: Tuple[str, ...], number: int, repeat: int, do_profile: bool, save_output: Optional[str],
            timeout: float) -> None:
    """Run a compiled model folder (from `tether compile`) and print outputs and timings."""
    from tether.model_folder import check_model_folder

    # a broken folder or input is refused here, in one line, before anything is uploaded or loaded
    graph = check_model_folder(folder, local=not (host or tracker))
    in_entries = [graph["entries"][i] for i in graph["inputs"]]
    feeds = _load_inputs(inputs, in_entries)
    rng = np.random.default_rng(0)
    for k, e in enumerate(in_entries):
        if e["name"] not in feeds and k not in feeds:
            feeds[e["name"]] = rng.standard_normal(e["shape"]).astype(e["dtype"]) if e["dtype"].startswith("float") \
                else np.zeros(e["shape"], e["dtype"])
    with _session(host, port, tracker, key, timeout) as sess:
        if sess is None:
            from tether import graph_executor
            gm = graph_executor.load(folder)
            where = "local host"
        else:
            from tether.rpc.graph_client import RemoteGraphExecutor
            gm = RemoteGraphExecutor(sess, folder)
            where = "%s" % (host and "%s:%d" % (host, port) or "tracker %s key %s" % (tracker, key))
        with gm:
            for k, v in feeds.items():
                gm.set_input(k, v)
            gm.run()
            click.echo("ran %s on %s" % (graph.get("name", folder), where))
            for i in range(gm.get_num_outputs()):
                y = gm.get_output(i)
                flat = y.reshape(-1)
                extra = ""
                if y.ndim >= 1 and y.size > 1 and flat.dtype.kind == "f":
                    top = np.argsort(flat)[::-1][:5]
                    extra = " top5=%s" % [int(t) for t in top]
                click.echo("output %d: %s %s min=%.6g max=%.6g mean=%.6g%s"
                           % (i, y.dtype, tuple(y.shape), flat.min(), flat.max(), flat.mean(), extra))
                if i == 0 and save_output:
                    np.save(save_output, y)
            res = gm.benchmark(number=number, repeat=repeat)
            click.echo("latency: median %.3f ms, min %.3f ms (%d x %d runs)"
                       % (res["median_ms"], res["min_ms"], repeat, res["number"]))
            if do_profile:
                prof = gm.profile()
                for rec in sorted(prof["nodes"], key=lambda r: -r["seconds"])[:15]:
                    click.echo("  %8.3f ms  %-28s %s" % (rec["seconds"] * 1e3, rec["name"][:28], rec["ops"]))
                click.echo("  sum of nodes %.3f ms" % (prof["total_seconds"] * 1e3))
