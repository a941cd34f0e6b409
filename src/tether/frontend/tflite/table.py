"""The converter table type: TFLite builtin op name ("CONV_2D") -> ``converter(ctx, op)``.

Each family module fills its own ``CONVERTERS`` table; ``converters.py`` merges them, and a second converter
for one op raises, naming both: an op has exactly one converter.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator, Mapping, Sequence

Converter = Callable[..., None]     # (ctx: state.Context, op: flatbuffer.Operator) -> None


def _place(fn: Converter) -> str:
    return "%s.%s" % (getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", repr(fn)))


class ConverterTable(Mapping[str, Converter]):
    def __init__(self, name: str) -> None:
        self.name = name
        self._converters: Dict[str, Converter] = {}

    def add(self, op: str, fn: Converter) -> None:
        have = self._converters.get(op)
        if have is not None:
            raise ValueError("TFLite op %r has two converters in %s: %s and %s" % (op, self.name, _place(have),
                                                                                   _place(fn)))
        self._converters[op] = fn

    def register(self, *ops: str) -> Callable[[Converter], Converter]:
        """Decorator: ``fn`` converts each op in ``ops``."""
        def deco(fn: Converter) -> Converter:
            for op in ops:
                self.add(op, fn)
            return fn
        return deco

    def __getitem__(self, op: str) -> Converter:
        return self._converters[op]

    def __iter__(self) -> Iterator[str]:
        return iter(self._converters)

    def __len__(self) -> int:
        return len(self._converters)

    def __repr__(self) -> str:
        return "ConverterTable(%r, %d ops)" % (self.name, len(self))


def merge_tables(name: str, tables: Sequence[ConverterTable]) -> ConverterTable:
    """One table holding every entry of ``tables``; an op in two of them raises."""
    merged = ConverterTable(name)
    for table in tables:
        for op, fn in table.items():
            merged.add(op, fn)
    return merged
