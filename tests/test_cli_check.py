"""`tether compile MODEL --check`: op coverage per op type (domain, opset) without compiling."""
import os

import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper

from tether.cli.main import cli

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits_cnn.onnx")


def test_a_covered_model_exits_0_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["compile", DIGITS, "--check", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "Conv" in res.output and "covered" in res.output and "NOT COVERED" not in res.output
    assert "0 not covered" in res.output
    assert not out.exists()     # nothing compiled


def test_uncovered_ops_are_listed_with_their_nodes(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"),
             helper.make_node("TfIdfVectorizer", ["a"], ["b"], name="s0"),
             helper.make_node("TfIdfVectorizer", ["b"], ["c"], name="s1"),
             helper.make_node("Custom", ["c"], ["y"], name="k0", domain="com.example")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    res = CliRunner().invoke(cli, ["compile", str(path), "--check"])   # symbolic shapes need no --input-shape
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert any(ln.startswith("Relu") and "ai.onnx" in ln and "17" in ln and "covered" in ln and "NOT" not in ln
               for ln in lines)
    assert any(ln.startswith("TfIdfVectorizer") and "NOT COVERED (2 nodes)" in ln for ln in lines)
    assert any(ln.startswith("Custom") and "com.example" in ln and "NOT COVERED" in ln for ln in lines)
    assert "uncovered TfIdfVectorizer (ai.onnx): s0, s1" in res.output
    assert "uncovered Custom (com.example): k0" in res.output
    assert "3 op type(s), 1 covered, 2 not covered" in res.output
