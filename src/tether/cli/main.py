"""The `tether` command group.

Each sub-command lives in its own module under ``tether.cli`` and exposes a click command named ``command``;
this group only assembles them, so adding a command never touches this file's logic.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging

import click

# One row per sub-command module; a module that is not there yet is simply not offered.
COMMAND_MODULES = ("quickstart", "targets", "build_cmd", "bundle", "emulate", "query", "compile_cmd", "run_cmd",
                   "bootstrap", "bench_cmd")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.version_option(package_name="tether")
def cli(verbose: int) -> None:
    """tether: cross-compile kernels and models for ARM devices, and run them remotely over RPC."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


for _name in COMMAND_MODULES:
    _qualified = "tether.cli." + _name
    if importlib.util.find_spec(_qualified) is not None:
        cli.add_command(importlib.import_module(_qualified).command)


if __name__ == "__main__":
    cli()
