"""`tether targets`: list the target presets (and what `host` resolves to on this machine), the GPU targets and
presets with their host, and the GPU APIs this machine has."""
from __future__ import annotations

from typing import List, Tuple

import click


@click.command("targets")
@click.option("--plain", is_flag=True, help="Tab-separated output without rich formatting.")
@click.option("--host/--no-host", "show_host", default=True, help="Detect and show what 'host' means here.")
@click.option("--gpu", "gpu_only", is_flag=True,
              help="Only the GPU targets and presets (with their host) and the GPU APIs this machine has.")
def command(plain: bool, show_host: bool, gpu_only: bool) -> None:
    """List the compilation target presets, the GPU targets and the GPU APIs of this machine."""
    from tether.target import Target, presets

    if gpu_only:
        _gpu_section(plain)
        return

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
            from rich.padding import Padding
            from rich.table import Table
            from rich.text import Text
        except ImportError:
            plain = True
    if plain:   # (the GPU rows: --gpu, so these rows stay one per CPU preset)
        for row in rows:
            click.echo("\t".join(row))
        return
    console = Console()
    if console.width >= _table_width(rows):
        table = Table(title="tether target presets")
        for col in COLUMNS:
            table.add_column(col, no_wrap=col in ("preset", "triple", "cpu"))
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))  # Text: a "[if ...]" in a cell is not rich markup
        console.print(table)
    else:
        # Too narrow for six columns side by side (rich would cut them to a letter or two): one block per preset,
        # its name, triple and cpu on one line and the long fields below it, each wrapped across the width.
        console.print("tether target presets", style="bold")
        for name, triple, cpu, *details in rows:
            console.print()
            console.print(Text.assemble((name, "bold"), "  %s  %s" % (triple, cpu)))
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True, style="dim")
            grid.add_column()
            for label, value in zip(COLUMNS[3:], details):
                grid.add_row(label, Text(value))
            console.print(Padding(grid, (0, 0, 0, 2)))
    click.echo('Any LLVM triple works too, e.g.\n  --target "aarch64-linux-gnu -mcpu=cortex-a55 -mattr=+neon"')
    click.echo()
    _gpu_section(plain)


def _gpu_rows() -> List[Tuple[str, str, str, str]]:
    """(kind, target, host, description): each GPU device family, then each GPU preset."""
    from tether.gpu_target import describe_devices, gpu_presets

    rows = []
    for api, device, words in describe_devices():
        spec = api + ("" if device == "generic" else " -device=" + device) + (" -arch=sm_XX" if api == "cuda" else "")
        rows.append(("gpu", spec, "host (--target-host)", words))
    for name, p in gpu_presets().items():
        rows.append(("gpu-preset", name, p["host"], "%s (%s)" % (p["description"], p["gpu"])))
    return rows


def _gpu_apis() -> List[Tuple[str, str]]:
    """(api, what this machine has of it). Listed by the device runtime in another process (device_info): pocl
    initialised in a process that had imported the frontends' libraries segfaulted it, and a CLI that only lists
    should never be the process a driver takes down."""
    from tether_rpc.device_info import gpu_devices
    from tether_rpc.gpu.module import API_TITLES

    gpus, errors = gpu_devices()
    out = []
    for api in API_TITLES:
        found = [g for g in gpus if g.get("api") == api]
        if found:
            out.append((api, "; ".join("%d: %s" % (g.get("index", k), g.get("name", "?"))
                                       for k, g in enumerate(found))))
        else:
            why = [e.split(": ", 1)[1] for e in errors if e.startswith(api + ":")]
            out.append((api, "none (%s)" % (why[0] if why else "no driver or no device")))
    return out


def _gpu_section(plain: bool) -> None:
    rows, apis = _gpu_rows(), _gpu_apis()
    if not plain:
        try:
            import rich  # noqa: F401
        except ImportError:
            plain = True
    if plain:
        for row in rows:
            click.echo("\t".join(row))
        for api, have in apis:
            click.echo("\t".join(("gpu-api", api, have)))
        return
    from rich.console import Console
    from rich.text import Text

    console = Console()
    console.print("GPU targets (a GPU target's host is the CPU that runs its library and launches its kernels)",
                  style="bold")
    for kind, name, host, words in rows:
        console.print(Text.assemble((name, "bold"), "  host: %s" % host))
        console.print(Text("  " + words))
    console.print("GPU APIs on this machine", style="bold")
    for api, have in apis:
        console.print(Text.assemble((api, "bold"), ": " + have))


COLUMNS = ("preset", "triple", "cpu", "features", "int8", "description")
WRAPPED_MIN = 24  # the narrowest a wrapped column (features, int8, description) may be in the table


def _table_width(rows: List[tuple]) -> int:
    """The console width the table needs: the unwrapped columns (preset, triple, cpu) whole, each wrapped one at
    least WRAPPED_MIN wide, and per column two spaces of padding and a border."""
    whole = sum(max(len(r[i]) for r in rows + [COLUMNS]) for i in range(3))
    return whole + WRAPPED_MIN * (len(COLUMNS) - 3) + 3 * len(COLUMNS) + 1


def _int8_column(preset: str) -> str:
    """The int8 instructions a preset's kernels may use, best first; load-time choices marked."""
    from tether.target import int8_instructions

    return "; ".join(insns if when == "always" else "%s [%s]" % (insns, when)
                     for insns, when in int8_instructions(preset))
