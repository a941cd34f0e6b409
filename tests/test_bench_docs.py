"""docs/bench.md and the code agree: every field of the JSON Schema, every device option and built-in, and every
CSV column is documented (docs that drift from the code are a bug, as for docs/protocol.md)."""
import pathlib
import re

from tether.bench import io
from tether_rpc import device_state

DOC = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "bench.md").read_text()


def _properties(schema, node=None, out=None):
    out = set() if out is None else out
    node = schema if node is None else node
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            out.add(key)
            _properties(schema, value, out)
        for value in node.values():
            if isinstance(value, (dict, list)):
                _properties(schema, value, out)
    elif isinstance(node, list):
        for value in node:
            _properties(schema, value, out)
    return out


def documented(name):
    return re.search(r"`[^`]*\b%s\b[^`]*`" % re.escape(name), DOC) is not None


def test_every_schema_field_is_documented():
    missing = sorted(k for k in _properties(io.schema()) if not documented(k))
    assert not missing, "docs/bench.md does not mention: %s" % missing


def test_device_options_and_builtins_are_documented():
    missing = [k for k in device_state.RUN_OPTIONS if not documented(k)]
    missing += [name for name in device_state.BUILTINS if "`%s`" % name not in DOC and
                "`.%s`" % name.rsplit(".", 1)[1] not in DOC]
    assert not missing, "docs/bench.md does not mention: %s" % missing


def test_csv_columns_are_documented():
    missing = [c for c in io.CSV_COLUMNS if not documented(c)]
    assert not missing, missing
