"""`tether emulate`: an emulated ARM device (Debian userland under qemu-user) running the device server."""
from __future__ import annotations

import signal
from typing import Optional

import click

from tether import emulate as emu


def _list(cache) -> None:
    for row in emu.list_userlands(cache=cache):
        name = row["arch"] if row["package_set"] == "base" else "%s+%s" % (row["arch"], row["package_set"])
        if row["status"] == "ready":
            click.echo("%-14s ready   %s  (Debian %s %s: python %s, numpy %s, msgpack %s; %.0f MB; built in %.1f s)"
                       % (name, row["path"], row["suite"], row["debian_arch"], row["python_version"],
                          row["numpy_version"], row["msgpack_version"], row["size_bytes"] / 1e6,
                          row["build_seconds"]))
        else:
            click.echo("%-14s %-7s %s" % (name, row["status"], row["path"]))


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt()


@click.command("emulate")
@click.option("--arch", type=click.Choice(sorted(emu.ARCHES)), default="aarch64", show_default=True,
              help="Architecture to emulate: aarch64 (cortex-a72, runs rasp4b code) or armv7 (cortex-a7, runs "
                   "armv7-a7 code).")
@click.option("--preset", type=click.Choice(sorted(emu.PRESET_DEVICES)), default=None,
              help="Emulate the board of this target preset (sets --arch and --cpu; rasp3b -> armv7 on qemu's "
                   "ARMv8 AArch32 'max' CPU).")
@click.option("--cpu", default=None, help="qemu CPU model (default: cortex-a72 on aarch64, cortex-a7 on armv7).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the device server binds.")
@click.option("--port", type=int, default=9090, show_default=True, help="First port to try.")
@click.option("--port-end", type=int, default=9199, show_default=True, help="Last port to try.")
@click.option("--tracker", default=None, metavar="HOST:PORT", help="Register with this tracker.")
@click.option("--key", default=None, help="Device key to register under (with --tracker).")
@click.option("--token", default=None, help="Require this token from clients.")
@click.option("--insecure", is_flag=True, help="Allow listening beyond loopback without a token.")
@click.option("--packages", type=click.Choice(sorted(emu.PACKAGE_SETS)), default="base", show_default=True,
              help="The userland's package set: base (python3, numpy, msgpack) or opencl (base + pocl, for OpenCL "
                   "modules; a separate, larger userland built on first use).")
@click.option("--list", "list_", is_flag=True, help="List the cached userlands and exit.")
@click.option("--clean", is_flag=True, help="Delete the cached userland(s) (only --arch's if given) and exit.")
@click.option("--rebuild", is_flag=True, help="Rebuild the userland even if a cached one exists.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Userland cache folder (default: $TETHER_USERLAND_CACHE or $XDG_CACHE_HOME/tether/userlands).")
@click.pass_context
def command(ctx: click.Context, arch: str, preset: Optional[str], cpu: Optional[str], host: str, port: int,
            port_end: int, tracker: Optional[str], key: Optional[str], token: Optional[str], insecure: bool,
            list_: bool, clean: bool, rebuild: bool, cache_dir: Optional[str], packages: str) -> None:
    """Run the device server on an emulated ARM device (qemu-user + a cached Debian userland).

    The first run builds the userland (about 10-20 s, needs root, qemu-user and mmdebstrap); later runs start
    in a few seconds. The server runs in the foreground until Ctrl-C.
    """
    import pathlib
    cache = pathlib.Path(cache_dir) if cache_dir else None
    if list_:
        _list(cache)
        return
    if clean:
        explicit = ctx.get_parameter_source("arch") == click.core.ParameterSource.COMMANDLINE
        removed = emu.clean_userlands(arch if explicit else None, cache=cache)
        for path in removed:
            click.echo("removed %s" % path)
        if not removed:
            click.echo("nothing to clean under %s" % (cache or emu.cache_root()))
        return
    if preset:
        arch, preset_cpu = emu.preset_device(preset)
        cpu = cpu or preset_cpu
    # SIGTERM ends the foreground run like Ctrl-C, so the server and its workers are always stopped.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        userland = emu.ensure_userland(arch, cache=cache, force=rebuild, packages=packages,
                                       progress=lambda msg: click.echo("[userland] " + msg, err=True))
        device = emu.EmulatedDevice(userland, cpu=cpu, host=host, port=port, port_end=port_end, tracker=tracker,
                                    key=key, token=token, on_line=lambda line: click.echo(line, err=True),
                                    preset=preset, extra_args=["--insecure"] if insecure else ())
        click.echo("starting an emulated %s device (qemu %s, -cpu %s) from %s"
                   % (arch, userland.spec.qemu, device.cpu, userland.path), err=True)
        with device:   # starts it, and stops it however this block is left
            click.echo("emulated %s device (-cpu %s, runs target %s) listening on %s:%d (pid %d, up in %.1f s); "
                       "Ctrl-C stops it" % (arch, device.cpu, device.preset or "(custom cpu)", device.host,
                                             device.port, device.pid, device.startup_seconds))
            code = device.wait()
    except KeyboardInterrupt:
        click.echo("stopped the emulated device", err=True)
        return
    except emu.EmulationError as exc:
        raise click.ClickException(str(exc))
    if code:
        raise click.ClickException("the emulated device server exited with code %d" % code)
