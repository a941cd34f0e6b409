"""`tether runtime`: build the C runtime for model folders (libtether_runtime) and its headers for a target."""
from __future__ import annotations

import click

from tether.cli.params import TargetParam


@click.command("runtime")
@click.option("-t", "--target", "target", type=TargetParam(), default="host", show_default=True,
              help="Target preset or LLVM triple the library is for (the board that runs the model).")
@click.option("-o", "--output", "output", type=click.Path(file_okay=False), required=True,
              help="Folder to write lib/ (libtether_runtime.so, .a) and include/ (headers) into; created if its "
                   "parent exists.")
def command(target: str, output: str) -> None:
    """Build libtether_runtime (a shared library and a static archive) and copy its headers, so a C or C++ program
    runs model folders written by `tether compile` without Python (docs/deploy.md). Cross-compiles with zig cc from
    the ziglang wheel: no system toolchain needed."""
    import os

    from tether import c_runtime
    from tether.target import as_target

    tgt = as_target(target)
    if tgt.is_android:
        raise click.BadParameter("%s is an Android target: zig cc has no Android libc; build runtime_c/*.c with the "
                                 "NDK's clang" % target, param_hint="--target")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise click.BadParameter("%s: its parent folder %s does not exist" % (output, parent), param_hint="--output")
    if not os.access(parent, os.W_OK) or (os.path.isdir(output) and not os.access(output, os.W_OK)):
        raise click.BadParameter("%s is not writable" % output, param_hint="--output")
    built = c_runtime.build_runtime(tgt, output)
    click.echo("wrote %s (%.1f kB) and %s (%.1f kB) for %s, headers in %s"
               % (built["shared"], built["shared_bytes"] / 1024, built["static"], built["static_bytes"] / 1024,
                  built["target"], built["include"]))
    click.echo("link a program: %s -O2 -I%s main.c %s %s -o main"
               % (" ".join(["zig", "cc"] + _target_args(tgt)), built["include"], built["static"],
                  " ".join(c_runtime.LINK_LIBS)))


def _target_args(tgt) -> list:
    from tether.cc import zig_target
    return zig_target(tgt)
