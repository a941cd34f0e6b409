"""The table of model-format readers: filled once, refusing a second reader for a format; a reader whose optional
dependency is missing says which extra to install, in one line."""
import pytest

from tether.errors import InvalidInput
from tether.frontend import detect, readers


def test_every_reader_is_for_a_supported_detected_format():
    assert readers.READERS, "no reader registered"
    for name in readers.READERS:
        assert name in detect.FORMATS, "reader for %r, a format detect does not know" % name
        assert detect.FORMATS[name].supported, "%s has a reader but detect says tether does not read it" % name
        assert name in readers.COVERAGE
    for fmt in detect.FORMATS.values():
        if fmt.supported and fmt.name != "ONNX":
            assert fmt.name in readers.READERS, "%s is marked supported but has no reader" % fmt.name


def test_a_second_reader_for_a_format_is_refused():
    name = next(iter(readers.READERS))
    with pytest.raises(ValueError, match="registered already"):
        readers.register_reader(name, lambda p: None, lambda p: [])


def test_a_missing_optional_dependency_names_the_extra(tmp_path):
    read = readers.lazy("tether_no_such_module_here", "to_onnx", "tflite")
    with pytest.raises(InvalidInput) as info:
        read(str(tmp_path / "m.tflite"))
    msg = str(info.value)
    assert "\n" not in msg and "pip install 'tether[tflite]'" in msg and "m.tflite" in msg
