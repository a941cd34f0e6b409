"""Darknet's .cfg text: a ``[net]`` section of input options, then one ``[type]`` section per layer, each a list of
``key=value`` lines.

Read as darknet's own parser reads it: whitespace anywhere in a line is dropped, ``#`` and ``;`` start comment
lines, and the layers are numbered from 0 in file order (the numbers ``[route] layers=`` and ``[shortcut] from=``
refer to).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from tether.errors import InvalidInput


@dataclasses.dataclass
class Section:
    """One ``[type]`` section: its options as written, and the line it starts on (for messages)."""

    type: str
    options: Dict[str, str]
    line: int
    index: int = -1                         # the layer number (-1 for [net])

    def _get(self, key: str, default, convert, path: str):
        if key not in self.options:
            return default
        try:
            return convert(self.options[key])
        except ValueError:
            raise InvalidInput("%s: [%s] at line %d has %s=%s, expected a number"
                               % (path, self.type, self.line, key, self.options[key])) from None

    def int(self, key: str, default: Optional[int], path: str = "") -> int:
        return self._get(key, default, lambda v: int(float(v)) if "." in v else int(v), path)

    def float(self, key: str, default: Optional[float], path: str = "") -> float:
        return self._get(key, default, float, path)

    def ints(self, key: str, path: str = "") -> List[int]:
        return self._get(key, [], lambda v: [int(x) for x in v.split(",") if x], path)

    def floats(self, key: str, path: str = "") -> List[float]:
        return self._get(key, [], lambda v: [float(x) for x in v.split(",") if x], path)

    def str(self, key: str, default: str) -> str:
        return self.options.get(key, default)


@dataclasses.dataclass
class Network:
    net: Section
    layers: List[Section]


def parse_cfg(text: str, path: str) -> Network:
    sections: List[Section] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = "".join(raw.split())
        if not line or line[0] in "#;":
            continue
        if line[0] == "[":
            if not line.endswith("]") or len(line) < 3:
                raise InvalidInput("%s: line %d is %r, expected a [section] header" % (path, lineno, raw.strip()))
            sections.append(Section(line[1:-1].lower(), {}, lineno))
            continue
        key, sep, value = line.partition("=")
        if not sep or not key or not sections:
            raise InvalidInput("%s: line %d is %r, expected key=value inside a [section]"
                               % (path, lineno, raw.strip()))
        sections[-1].options[key] = value
    if not sections or sections[0].type not in ("net", "network"):
        raise InvalidInput("%s is not a Darknet .cfg: expected a [net] section first" % path)
    layers = sections[1:]
    for i, s in enumerate(layers):
        s.index = i
    return Network(sections[0], layers)
