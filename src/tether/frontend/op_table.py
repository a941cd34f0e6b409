"""The converter table every frontend keys its ops by: op name -> converter, filled by decorators in each op
family's module and merged in one stated order. A second converter for one op raises, naming both: an op has
exactly one converter, whichever module is imported first."""
from __future__ import annotations

import os
from typing import Callable, Dict, Iterator, Mapping, Sequence, TypeVar

Converter = Callable[..., None]
T = TypeVar("T", bound="OpTable")


def _place(fn: Converter) -> str:
    """Where ``fn`` is defined, for an error message: module.qualname (file:line)."""
    code = getattr(fn, "__code__", None)
    where = " (%s:%d)" % (os.path.basename(code.co_filename), code.co_firstlineno) if code is not None else ""
    return "%s.%s%s" % (getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", repr(fn)), where)


class OpTable(Mapping[str, Converter]):
    """Op name -> converter. ``KIND`` names the ops in messages ("ONNX op", "TFLite op")."""

    KIND = "op"

    def __init__(self, name: str) -> None:
        self.name = name
        self._converters: Dict[str, Converter] = {}

    def add(self, key: str, fn: Converter) -> None:
        have = self._converters.get(key)
        if have is not None:
            raise ValueError("%s %r has two converters in %s: %s and %s"
                             % (self.KIND, key, self.name, _place(have), _place(fn)))
        self._converters[key] = fn

    def register(self, *keys: str) -> Callable[[Converter], Converter]:
        """Decorator: ``fn`` converts each op in ``keys``."""
        def deco(fn: Converter) -> Converter:
            for key in keys:
                self.add(key, fn)
            return fn
        return deco

    def __getitem__(self, key: str) -> Converter:
        return self._converters[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._converters)

    def __len__(self) -> int:
        return len(self._converters)

    def __repr__(self) -> str:
        return "%s(%r, %d ops)" % (type(self).__name__, self.name, len(self))


def merge_tables(name: str, tables: Sequence[T]) -> T:
    """One table (of the first table's type) holding every entry of ``tables``; an op in two of them raises."""
    merged = type(tables[0])(name) if tables else OpTable(name)
    for table in tables:
        for key, fn in table.items():
            merged.add(key, fn)
    return merged  # type: ignore[return-value]
