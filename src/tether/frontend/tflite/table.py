"""The converter table type: TFLite builtin op name ("CONV_2D") -> ``converter(ctx, op)``.

Each family module fills its own ``CONVERTERS`` table; ``converters.py`` merges them (``merge_tables``), and a
second converter for one op raises, naming both: an op has exactly one converter.
"""
from __future__ import annotations

from typing import Callable

from tether.frontend.op_table import OpTable, merge_tables

Converter = Callable[..., None]     # (ctx: state.Context, op: flatbuffer.Operator) -> None


class ConverterTable(OpTable):
    KIND = "TFLite op"


__all__ = ["Converter", "ConverterTable", "merge_tables"]
