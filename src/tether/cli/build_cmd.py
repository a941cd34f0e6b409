"""`tether build kernels.py:make --target rasp3b -o out/`: compile kernels written in Python for C users.

The function named after the colon (default ``kernels``) takes no arguments and returns ``(schedule, args)``, a
list of ``(schedule, args, name)`` triples, or PrimFuncs; tether compiles them into one module and writes the
requested artifacts (shared library, static archive, object, C header, assembly, LLVM IR).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Optional, Tuple

import click

from tether.cli.params import TARGET

EMIT_KINDS = ("so", "a", "o", "h", "asm", "ll")


def _load_kernels(spec: str) -> Any:
    path, _, func = spec.partition(":")
    func = func or "kernels"
    if not os.path.isfile(path):
        raise click.BadParameter("no such file: %s" % path, param_hint="FILE.py[:FUNCTION]")
    mod_name = "tether_user_kernels_%d" % abs(hash(os.path.abspath(path)))
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise click.BadParameter("cannot import %s as Python" % path, param_hint="FILE.py[:FUNCTION]")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes, i.e. a binary file
        # the file is not Python at all; an error its code raises while running keeps its traceback
        where = " (line %s)" % exc.lineno if getattr(exc, "lineno", None) else ""
        raise click.BadParameter("%s is not valid Python: %s%s" % (path, getattr(exc, "msg", None) or exc, where),
                                 param_hint="FILE.py[:FUNCTION]") from None
    maker = getattr(module, func, None)
    if not callable(maker):
        raise click.BadParameter("%s defines no function %r (use FILE.py:FUNCTION)" % (path, func),
                                 param_hint="FILE.py[:FUNCTION]")
    return maker()


@click.command("build")
@click.argument("kernels", metavar="FILE.py[:FUNCTION]")
@click.option("--target", "-t", default="host", show_default=True, type=TARGET,
              help="Target preset or LLVM triple, or a GPU target (opencl, vulkan, cuda -arch=sm_XX, rasp5-vulkan).")
@click.option("--target-host", default=None, type=TARGET,
              help="The CPU that runs a GPU target's library and launches its kernels (default: its preset's, else "
                   "host).")
@click.option("--name", "-n", default="kernels", show_default=True, help="Module (and file) name.")
@click.option("--output", "-o", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False))
@click.option("--emit", "emit", default="so,h", show_default=True,
              help="Comma-separated artifacts: %s." % ", ".join(EMIT_KINDS))
@click.option("--fast-math", is_flag=True, help="Let LLVM reassociate float math (faster, not bit-exact).")
def command(kernels: str, target: str, target_host: Optional[str], name: str, out_dir: str, emit: str,
            fast_math: bool) -> None:
    """Compile kernels defined in a Python file into a library, archive, object and/or C header.

    FUNCTION (default: kernels) takes no arguments and returns (schedule, args), a list of (schedule, args, name)
    triples, or PrimFuncs."""
    import tether

    kinds: Tuple[str, ...] = tuple(k.strip() for k in emit.split(",") if k.strip())
    unknown = [k for k in kinds if k not in EMIT_KINDS]
    if unknown:
        raise click.BadParameter("unknown artifact kind(s) %s; choose from %s" % (unknown, ", ".join(EMIT_KINDS)),
                                 param_hint="--emit")
    if target_host is not None:
        from tether.target import Target, UnknownTargetError

        try:
            target = str(Target(target, host=target_host))
        except UnknownTargetError as exc:
            raise click.BadParameter(str(exc), param_hint="--target-host") from None
    made = _load_kernels(kernels)
    if isinstance(made, tuple) and len(made) == 2:
        lib = tether.build(made[0], made[1], target=target, name=name, fast_math=fast_math)
    else:
        lib = tether.build(list(made), target=target, name=name, fast_math=fast_math)
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, name)
    writers = {
        "so": lambda: lib.export_library(base + lib.target.library_suffix),   # (x.wasm for wasm32)
        "a": lambda: lib.export_static(os.path.join(out_dir, "lib%s.a" % name)),
        "o": lambda: lib.export_object(base + ".o"),
        "h": lambda: lib.export_header(base + ".h"),
        "asm": lambda: _write(base + ".s", lib.get_source("asm")),
        "ll": lambda: _write(base + ".ll", lib.get_source("ll")),
    }
    for kind in kinds:
        click.echo("wrote %s" % writers[kind]())
    click.echo("%s for %s: %s" % (name, lib.target.preset or lib.target, ", ".join(lib.function_names)))


def _write(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
