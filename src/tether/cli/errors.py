"""How every tether command reports bad input: one line on stderr, exit status 2, no traceback.

Bad input is a click usage error (a missing argument, an unknown option, a value its type refused) or a
:class:`tether.errors.InvalidInput` raised anywhere below a command (a foreign model format, a truncated file,
an unknown target). The top-level commands (``tether``, ``rpc-server``, ``rpc-tracker``) are built on the classes
here, so no sub-command needs a try/except of its own. Anything else keeps its traceback: a genuine bug should
be visible.
"""
from __future__ import annotations

import contextlib
from typing import IO, Any, Iterator, List, Optional

import click

from tether.errors import InvalidInput


class OneLineUsageError(click.UsageError):
    """A usage error shown as one line (``Error: ...``), without the usage block click prints by default."""

    def __init__(self, message: str, ctx: Optional[click.Context] = None, hint: bool = False):
        super().__init__(" ".join(line.strip() for line in message.splitlines() if line.strip()), ctx)
        self.hint = hint

    def show(self, file: Optional[IO[Any]] = None) -> None:
        line = "Error: " + self.format_message()
        if self.hint and self.ctx is not None:
            line += " (see '%s %s')" % (self.ctx.command_path, self.ctx.help_option_names[0])
        click.echo(line, file=file if file is not None else click.get_text_stream("stderr"))


@contextlib.contextmanager
def bad_input_in_one_line(ctx: Optional[click.Context]) -> Iterator[None]:
    """Turn click's usage errors and tether's InvalidInput raised inside the block into OneLineUsageError."""
    try:
        yield
    except OneLineUsageError:
        raise
    except click.UsageError as exc:
        raise OneLineUsageError(exc.format_message(), exc.ctx or ctx, hint=True) from None
    except InvalidInput as exc:
        raise OneLineUsageError(str(exc), ctx) from None


class OneLineErrors:
    """Mix-in for a top-level click command or group: its own option parsing and everything it invokes (sub-
    commands included) report bad input through :func:`bad_input_in_one_line`."""

    def make_context(self, info_name: Optional[str], args: List[str], parent: Optional[click.Context] = None,
                     **extra: Any) -> click.Context:
        with bad_input_in_one_line(parent):
            return super().make_context(info_name, args, parent=parent, **extra)  # type: ignore[misc]

    def invoke(self, ctx: click.Context) -> Any:
        with bad_input_in_one_line(ctx):
            return super().invoke(ctx)  # type: ignore[misc]


class TetherGroup(OneLineErrors, click.Group):
    """The ``tether`` command group."""


class TetherCommand(OneLineErrors, click.Command):
    """A stand-alone command (``rpc-server``, ``rpc-tracker``)."""
