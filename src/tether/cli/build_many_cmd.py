"""`tether build-many MODEL... -o OUT [--ray HOST:PORT]`: compile several models, each into OUT/<file stem>/.

With --ray every model is a Ray task on that cluster (tune/ray_build.py): the model file's bytes travel there, the
folder's files come back, and a model whose bytes and options were built before (by this machine or the cluster)
is not built again. Without --ray they are built here, one after the other, exactly as `tether compile` does.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Tuple

import click

from tether.cli.compile_cmd import parse_input_shapes
from tether.cli.params import TARGET


@click.command("build-many")
@click.argument("models", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--target", "-t", default="host", show_default=True, type=TARGET, help="Target preset or LLVM triple.")
@click.option("--input-shape", "-s", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="Fix an input's shape (repeatable; applies to every model that has the input).")
@click.option("--opt-level", "-O", default=3, show_default=True, type=click.IntRange(0, 3))
@click.option("--fast-math", is_flag=True, help="Let LLVM reassociate float math (faster, not bit-exact).")
@click.option("--output", "-o", "out_root", default="out", show_default=True, type=click.Path(file_okay=False),
              help="Each model's folder goes to OUTPUT/<its file name without the suffix>.")
@click.option("--ray", "ray_address", default=None, metavar="HOST:PORT",
              help="Build on the Ray cluster with this head (pip install 'tether[ray]').")
def command(models: Tuple[str, ...], target: str, input_shapes: Tuple[str, ...], opt_level: int, fast_math: bool,
            out_root: str, ray_address: Optional[str]) -> None:
    """Compile every MODEL into OUTPUT/<stem>/ (deploy.so, deploy.json, deploy.params), on a Ray cluster with
    --ray."""
    stems: Dict[str, str] = {}
    for m in models:
        stem = os.path.splitext(os.path.basename(m))[0]
        if stem in stems and os.path.abspath(stems[stem]) != os.path.abspath(m):
            raise click.BadParameter("%s and %s would both go to %s/%s: rename one" % (stems[stem], m, out_root,
                                                                                     stem), param_hint="MODELS")
        stems[stem] = m
    shapes = parse_input_shapes(input_shapes)
    options: Dict[str, Any] = {"target": target, "opt_level": opt_level, "fast_math": fast_math,
                               "input_shapes": {k: list(v) for k, v in shapes.items()}}
    if ray_address:
        from tether.cli.tune_cmd import require_ray

        require_ray()
    from tether.frontend.model_file import load_model_file

    for m in dict.fromkeys(models):
        # a foreign or broken file is refused here, in one line (InvalidInput: exit 2), before any build
        load_model_file(m, shape=shapes)
    t0 = time.perf_counter()
    failed = []

    def write(name: str, files: Optional[Dict[str, bytes]], error: Optional[str], how: str) -> None:
        if files is None:
            failed.append(name)
            click.echo("%s: failed: %s" % (name, error), err=True)
            return
        out = os.path.join(out_root, os.path.splitext(os.path.basename(name))[0])
        os.makedirs(out, exist_ok=True)
        for entry, data in files.items():
            with open(os.path.join(out, os.path.basename(entry)), "wb") as fh:
                fh.write(data)
        click.echo("%s -> %s (%s)" % (name, out, how))

    if ray_address:
        from tether.errors import TetherError
        from tether.tune.ray_build import build_models

        loaded = []
        for m in dict.fromkeys(models):
            with open(m, "rb") as fh:
                loaded.append((m, fh.read()))
        try:
            build_models(ray_address, loaded, options, on_done=write)
        except TetherError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        from tether.tune.ray_build import compile_model_file

        for m in dict.fromkeys(models):
            with open(m, "rb") as fh:
                files, error = compile_model_file(m, fh.read(), options)
            write(m, files, error, "built")
    click.echo("%d of %d models built in %.1f s" % (len(stems) - len(failed), len(stems), time.perf_counter() - t0))
    if failed:
        raise click.exceptions.Exit(1)
