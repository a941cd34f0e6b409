"""`tether compile model.onnx --target rasp4b --input-shape input:1,3,224,224 -o out/`."""
from __future__ import annotations

import time
from typing import Dict, Optional, Tuple

import click

from tether.cli.params import TARGET, TuningLogParam


def parse_input_shapes(specs: Tuple[str, ...]) -> Dict[str, Tuple[int, ...]]:
    """'name:1,3,224,224' (repeatable) -> {name: (1, 3, 224, 224)}; the name may itself contain ':'."""
    shapes: Dict[str, Tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise click.BadParameter("expected NAME:D0,D1,... (e.g. input:1,3,224,224), got %r" % spec,
                                     param_hint="--input-shape")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise click.BadParameter("dimensions of %r must be integers separated by commas" % spec,
                                     param_hint="--input-shape") from None
    return shapes


@click.command("compile")
@click.argument("model", type=click.Path(exists=True), required=False)  # a folder too: its error says what it holds
@click.option("--target", "-t", default="host", show_default=True, type=TARGET, help="Target preset or LLVM triple.")
@click.option("--input-shape", "-s", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="Fix an input's shape (repeatable); needed for symbolic dimensions.")
@click.option("--opt-level", "-O", default=3, show_default=True, type=click.IntRange(0, 3))
@click.option("--fast-math", is_flag=True, help="Let LLVM reassociate float math (faster, not bit-exact).")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="fp16: compute the float32 convs, matmuls and elementwise ops in half precision, on targets with "
                   "half arithmetic (rasp5-fp16, android-arm64-fp16); inputs and outputs stay float32 "
                   "(docs/bench.md \"Half precision\").")
@click.option("--output", "-o", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for deploy.so, deploy.json and deploy.params.")
@click.option("--print-graph", is_flag=True, help="Print the optimised graph.")
@click.option("--print-passes", is_flag=True,
              help="Only print the graph passes --opt-level runs, in order; needs no model, compiles nothing.")
@click.option("--check", is_flag=True,
              help="Only report which op types tether covers (exit status 1 if any is not); compiles nothing.")
@click.option("--tuning-log", type=TuningLogParam(), default=None,
              help="A `tether tune` log: each kernel it has results for gets its best config (docs/tune.md).")
@click.option("--aot", is_flag=True,
              help="Write an ahead-of-time module instead: NAME.h, libNAME.so and libNAME.a whose NAME_run runs the "
                   "whole model from C (docs/deploy.md).")
@click.option("--name", default=None, metavar="NAME",
              help="The library's name; with --aot also its C prefix (default: deploy, or model with --aot).")
@click.option("--params", "params_mode", type=click.Choice(["embedded", "external"]), default="embedded",
              show_default=True, help="--aot: params inside the library, or in NAME.params that the caller loads.")
@click.option("--workspace", "workspace_mode", type=click.Choice(["static", "caller"]), default="static",
              show_default=True,
              help="--aot: a static workspace in the library for callers that pass none, or only the caller's.")
def command(model: Optional[str], target: str, input_shapes: Tuple[str, ...], opt_level: int, fast_math: bool,
            precision: str, out_dir: str, print_graph: bool, print_passes: bool, check: bool,
            tuning_log: Optional[str], aot: bool, name: Optional[str], params_mode: str, workspace_mode: str) -> None:
    """Compile a model (ONNX, TFLite, TensorFlow, Keras, Darknet, Caffe, CoreML: docs/frontends.md) into a
    deployable folder (library + graph JSON + params), or with --aot into an ahead-of-time module (header + shared
    and static library)."""
    if print_passes:
        _print_passes(opt_level, precision)
        return
    if model is None:
        raise click.UsageError("Missing argument 'MODEL'.")
    from tether.frontend.model_file import load_model_file

    if check:
        _check(model)
        _check_placement(model, target, input_shapes, opt_level)
        return
    t0 = time.perf_counter()

    import tether
    from tether.errors import InvalidInput, UnsupportedOpError
    from tether.frontend import from_onnx

    try:
        # a foreign or broken file: InvalidInput, one line (cli/errors.py); a reader's unsupported ops: one line
        shapes = parse_input_shapes(input_shapes)
        proto, base_dir = load_model_file(model, shape=shapes)
        graph, params = from_onnx(proto, shape=shapes, base_dir=base_dir)
    except InvalidInput:
        raise                   # bad input: exit 2 (cli/errors.py), not a compile error
    except (UnsupportedOpError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    t_import = time.perf_counter() - t0
    try:
        factory = tether.build_graph(graph, params, target=target, opt_level=opt_level, fast_math=fast_math,
                                      precision=precision, tuning_log=tuning_log,
                                      name=name or ("model" if aot else "deploy"),
                                      executor="aot" if aot else "graph", aot_params=params_mode,
                                      aot_workspace=workspace_mode)
    except (UnsupportedOpError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    paths = factory.export(out_dir)
    if print_graph:
        click.echo(str(factory.graph))
    click.echo("compiled %s for %s: %d nodes, %d kernels, %d params (%.1f MiB)"
               % (model, target, len(factory.graph.nodes), factory.kernel_count, len(factory.params),
                  sum(v.nbytes for v in factory.params.values()) / 2 ** 20))
    click.echo("time: import %.2fs, passes %.2fs, lower+codegen+llvm %.2fs, total %.2fs"
               % (t_import, factory.timings["passes"], factory.timings["lower_codegen_llvm"],
                  time.perf_counter() - t0))
    devices = [n.get("device") for n in getattr(factory, "graph_json", {}).get("nodes", []) if n.get("device")]
    if devices:   # a GPU target: where the nodes run
        click.echo("placement: %d node(s) on the GPU, %d on the host's CPU (--check says why)"
                   % (devices.count("gpu"), devices.count("cpu")))
    for g in factory.graph.inputs:
        click.echo("input  %s: %s" % (g, factory.graph.types[g]))
    for g in factory.graph.outputs:
        t = factory.graph.types.get(g)
        click.echo("output %s: %s" % (g, t if t is not None else "constant"))
    if aot:
        click.echo("workspace %d bytes, params %s (%d bytes)" % (factory.workspace_size, params_mode,
                                                                 len(factory.params_blob)))
    click.echo("wrote %s" % ", ".join(sorted(paths.values())))


def _print_passes(opt_level: int, precision: str = "fp32") -> None:
    """One line per pass of the ``opt_level`` pipeline (with ``precision``): its name and what it does."""
    from tether.graph.passes import SUMMARIES, pipeline

    for p in pipeline(opt_level, precision):
        click.echo("%-24s %s" % (p.__name__, SUMMARIES[p.__name__]))


def _check_placement(model: str, target: str, input_shapes: Tuple[str, ...], opt_level: int) -> None:
    """For a GPU target: where each node runs (the kernel plan, each GPU kernel scheduled but not compiled), and
    why each node that runs on the host's CPU does."""
    from tether.target import as_target

    tgt = as_target(target)
    if tgt.gpu is None:
        return
    from tether.errors import InvalidInput, UnsupportedOpError
    from tether.frontend import from_onnx
    from tether.frontend.model_file import load_model_file
    from tether.graph.gpu_graph import placement_report
    from tether.graph.plan import plan_kernels

    try:
        shapes = parse_input_shapes(input_shapes)
        proto, base_dir = load_model_file(model, shape=shapes)
        graph, params = from_onnx(proto, shape=shapes, base_dir=base_dir)
        rows = placement_report(plan_kernels(graph, params, tgt, opt_level))
    except InvalidInput:
        raise
    except (UnsupportedOpError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    on_cpu = [r for r in rows if r["device"] == "cpu"]
    click.echo("placement on %s: %d node(s) on the GPU, %d on the host's CPU"
               % (tgt.gpu.api, len(rows) - len(on_cpu), len(on_cpu)))
    for r in on_cpu:
        click.echo("cpu  %s (%s): %s" % (r["node"], r["ops"], r["why"]))


def _check(path: str) -> None:
    """Print the op coverage table of the model at ``path``, in its format's own op names; exit status 1 when an
    op type is not covered."""
    from tether.frontend.model_file import op_coverage

    rows = op_coverage(path)
    width = max([len(r["op_type"]) for r in rows] + [7])
    click.echo("%-*s  %-16s %5s  %s" % (width, "op type", "domain", "opset", "status"))
    for r in rows:
        click.echo("%-*s  %-16s %5s  %s (%d node%s)" % (width, r["op_type"], r["domain"], r["opset"],
                                                       "covered" if r["covered"] else "NOT COVERED",
                                                       len(r["nodes"]), "" if len(r["nodes"]) == 1 else "s"))
    missing = [r for r in rows if not r["covered"]]
    for r in missing:
        names = r["nodes"]
        click.echo("uncovered %s (%s): %s" % (r["op_type"], r["domain"],
                                              ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")))
    click.echo("%s: %d op type(s), %d covered, %d not covered"
               % (path, len(rows), len(rows) - len(missing), len(missing)))
    if missing:
        raise click.exceptions.Exit(1)
