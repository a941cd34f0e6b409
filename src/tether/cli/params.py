"""Click parameter types shared by the commands: each checks its value before the command does any work, so a
bad value ends in one line naming the option (and nothing is written)."""
from __future__ import annotations

from typing import Any, Optional

import click


class TargetParam(click.ParamType):
    """A target preset or LLVM triple (``--target``), checked by building the Target; the text is passed on."""

    name = "target"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        from tether.target import Target, UnknownTargetError

        if not isinstance(value, str):
            return value
        try:
            Target(value)
        except UnknownTargetError as exc:
            self.fail(str(exc), param, ctx)
        return value


def check_tuning_log(path: str) -> None:
    """Refuse (InvalidInput) a file that is not a `tether tune` log: not text, or no line a record of this version."""
    import json

    from tether.errors import InvalidInput
    from tether.tune.log import LOG_VERSION

    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except UnicodeDecodeError:
        raise InvalidInput("%s is not a tuning log: it is not text (a tuning log is the JSON lines `tether tune "
                           "--log` writes)" % path) from None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue    # a torn last line after a kill is expected; read_log skips it with a warning
        if isinstance(record, dict) and record.get("v") == LOG_VERSION:
            return
    raise InvalidInput("%s is not a tuning log: no line is a version-%s tuning record (write one with `tether tune "
                       "--log`)" % (path, LOG_VERSION))


class TuningLogParam(click.Path):
    """An existing `tether tune` log (JSON lines) with at least one record of the current log version."""

    name = "tuning log"

    def __init__(self) -> None:
        super().__init__(exists=True, dir_okay=False)

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        from tether.errors import InvalidInput

        path = super().convert(value, param, ctx)
        try:
            check_tuning_log(path)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)
        return path


class OutputFile(click.Path):
    """A file the command will write: its folder must exist now, so a long run does not fail at its last step."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        import os

        path = super().convert(value, param, ctx)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            self.fail("%s: the folder %s does not exist" % (path, folder), param, ctx)
        return path


TARGET = TargetParam()
