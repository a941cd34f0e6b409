"""The `tether` command group.

Each sub-command lives in its own module under ``tether.cli`` and exposes a click command named ``command``;
this group only assembles them, so adding a command never touches this file's logic. Bad input anywhere below
it (click's usage errors, ``tether.errors.InvalidInput``) ends in one line and exit status 2 (``cli/errors.py``).
"""
from __future__ import annotations

import importlib
import logging

import click

from tether.cli.errors import TetherGroup

# One row per sub-command module (each defines a click command named ``command``).
COMMAND_MODULES = ("quickstart", "targets", "build_cmd", "bundle", "emulate", "query", "compile_cmd", "run_cmd",
                   "bootstrap", "bench_cmd", "tune_cmd", "runtime_cmd", "build_many_cmd")


@click.group(cls=TetherGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.version_option(package_name="tether")
def cli(verbose: int) -> None:
    """tether: cross-compile kernels and models for ARM devices, and run them remotely over RPC."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


for _name in COMMAND_MODULES:
    cli.add_command(importlib.import_module("tether.cli." + _name).command)


if __name__ == "__main__":
    cli()
