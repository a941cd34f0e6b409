"""The ONNX converter registry (frontend/onnx/importer.py: ConverterTable, converters.py): each converter module
fills its own table, one list of families merges them, and an op converted twice is an error that names both
converters, never a silent overwrite."""
import importlib
import pkgutil

import pytest

import tether.frontend.onnx as onnx_frontend
from tether.frontend.onnx import elementwise, sequence
from tether.frontend.onnx.converters import CONVERTERS, FAMILIES
from tether.frontend.onnx.importer import SEQUENCE_OPS, ConverterTable, merge_tables


def _first(im, node, ins, a):
    pass


def _second(im, node, ins, a):
    pass


def test_a_second_registration_of_an_op_raises_naming_both_converters():
    table = ConverterTable("family_a")
    table.register("Relu", "com.example.Relu")(_first)
    with pytest.raises(ValueError) as err:
        table.register("Relu")(_second)
    msg = str(err.value)
    assert "'Relu'" in msg and "family_a" in msg
    assert "_first (test_onnx_converter_table.py:" in msg and "_second (test_onnx_converter_table.py:" in msg
    assert table["Relu"] is _first     # the first stays
    with pytest.raises(ValueError, match="com.example.Relu"):
        table.add("com.example.Relu", _second)


def test_merging_two_families_that_convert_one_op_raises():
    a, b = ConverterTable("a"), ConverterTable("b")
    a.add("Relu", _first)
    b.add("Sigmoid", _first)
    assert dict(merge_tables("ab", [a, b])) == {"Relu": _first, "Sigmoid": _first}
    b.add("Relu", _second)
    with pytest.raises(ValueError, match=r"'Relu' has two converters in ab: .*_first .* and .*_second"):
        merge_tables("ab", [a, b])


def test_every_converter_module_is_a_family_of_the_table():
    tables = {}
    for info in pkgutil.iter_modules(onnx_frontend.__path__):
        module = importlib.import_module("tether.frontend.onnx." + info.name)
        table = getattr(module, "CONVERTERS", None)
        if isinstance(table, ConverterTable) and table.name == module.__name__:    # its own, not the merged one
            tables[info.name] = module
    assert sorted(m.__name__ for m in FAMILIES) == sorted(m.__name__ for m in tables.values())
    assert len(CONVERTERS) == sum(len(m.CONVERTERS) for m in FAMILIES)
    assert onnx_frontend.CONVERTERS is CONVERTERS


def test_identity_has_one_converter_and_the_sequence_family_converts_exactly_the_sequence_ops():
    assert CONVERTERS["Identity"] is elementwise.CONVERTERS["Identity"]
    assert "Identity" not in sequence.CONVERTERS
    assert set(sequence.CONVERTERS) == SEQUENCE_OPS
