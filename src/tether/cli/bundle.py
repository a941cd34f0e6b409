"""`tether bundle`: write the device package as one runnable file (a zipapp)."""
from __future__ import annotations

import click

from tether import bundle as bundle_mod


@click.command("bundle")
@click.option("-o", "--output", type=click.Path(dir_okay=True), default=bundle_mod.DEFAULT_NAME,
              show_default=True, help="Where to write the zipapp (a folder gets tether-rpc.pyz inside).")
def command(output: str) -> None:
    """Write tether-rpc.pyz: the device server and runtime alone (no compiler), for a device to run with
    `python3 tether-rpc.pyz --port 9090`. The device needs only Python 3.9+, numpy and msgpack
    (Debian/Raspberry Pi OS: apt-get install python3-numpy python3-msgpack)."""
    import os

    folder = output if os.path.isdir(output) else os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise click.BadParameter("%s: %s is not an existing folder" % (output, folder), param_hint="--output")
    if not os.access(folder, os.W_OK):
        raise click.BadParameter("%s: the folder %s is not writable" % (output, folder), param_hint="--output")
    path = bundle_mod.write_bundle(output)
    size = path.stat().st_size
    click.echo("wrote %s (%.1f kB, %d files of tether_rpc); copy it to the device and run: "
               "python3 %s --host 0.0.0.0 --port 9090 --token SECRET"
               % (path, size / 1024, len(bundle_mod.package_files()), path.name))
