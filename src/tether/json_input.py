"""A JSON file a user names (a bench document, a model folder's graph), read or refused in one line.

Every reader of such a file wants the same three outcomes told apart, each naming the file and what was expected:
not text, not valid JSON (with the line and column), or the parsed value.
"""
from __future__ import annotations

import json
from typing import Any

from tether.errors import InvalidInput


def read_json_file(path: str, expected: str) -> Any:
    """The parsed content of `path`; InvalidInput naming it and `expected` (e.g. "expected a `tether bench --json`
    document") when it is not text or not JSON. The caller checks the value's shape."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            return json.load(fh)
    except UnicodeDecodeError:
        raise InvalidInput("%s is not text; %s" % (path, expected)) from None
    except json.JSONDecodeError as exc:
        raise InvalidInput("%s is not valid JSON (line %d column %d: %s); %s"
                           % (path, exc.lineno, exc.colno, exc.msg, expected)) from None
