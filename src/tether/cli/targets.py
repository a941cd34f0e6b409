"""`tether targets`: list the target presets (and what `host` resolves to on this machine)."""
from __future__ import annotations

import click


@click.command("targets")
@click.option("--plain", is_flag=True, help="Tab-separated output without rich formatting.")
@click.option("--host/--no-host", "show_host", default=True, help="Detect and show what 'host' means here.")
def command(plain: bool, show_host: bool) -> None:
    """List the compilation target presets."""
    from tether.target import Target, presets

    rows = []
    for name, p in presets().items():
        triple, cpu, features = p["triple"], p["cpu"], p["features"]
        if name == "host" and show_host:
            t = Target("host")
            triple, cpu = t.triple, t.cpu
            features = "%d features, %d-bit vectors" % (len([f for f in t.feature_set if f.startswith("+")]),
                                                        t.vector_bits)
        rows.append((name, triple, cpu, features or "-", _int8_column(name), p["description"]))
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if plain:
        for row in rows:
            click.echo("\t".join(row))
        return
    table = Table(title="tether target presets")
    for col in ("preset", "triple", "cpu", "features", "int8", "description"):
        table.add_column(col, no_wrap=col in ("preset", "triple", "cpu"))
    for row in rows:
        table.add_row(*row)
    Console().print(table)
    click.echo('Any LLVM triple works too: --target "aarch64-linux-gnu -mcpu=cortex-a55 -mattr=+neon"')


def _int8_column(preset: str) -> str:
    """The int8 instructions a preset's kernels may use, best first (issue 12); load-time choices marked."""
    from tether.target import int8_instructions

    return "; ".join(insns if when == "always" else "%s [%s]" % (insns, when)
                     for insns, when in int8_instructions(preset))
