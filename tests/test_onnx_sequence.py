"""ONNX sequences and optionals, resolved at import into tensor values (frontend/onnx/sequence.py):
models that split into, build, map over, insert into, erase from and concatenate sequences, carry them through
Loop and If, and wrap values in optionals, compiled for the host and compared with onnxruntime. Sequence graph
inputs and outputs are one tensor per element (``NAME.0``, ``NAME.1``, ...). Where a length or position is
only known at run time the import is refused, naming the node and why."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import tether
from tether import graph_executor
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx
from tether.frontend.onnx.sequence import element_names

RNG = np.random.default_rng(7)
F = T.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "seq", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _seq_info(name, elem=F):
    return helper.make_value_info(name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None)))


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _tether(model, feeds, tmp_path, shape=None):
    """Compile for the host and run; sequence inputs (lists) and outputs are their elements' tensors."""
    seq_shapes = {k: [x.shape for x in v] for k, v in feeds.items() if isinstance(v, list)}
    graph, params = from_onnx(model, shape=dict(seq_shapes, **(shape or {})))
    tether.build_graph(graph, params, target="host").export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    for k, v in feeds.items():
        for name, x in (zip(element_names(k, len(v)), v) if isinstance(v, list) else [(k, v)]):
            gm.set_input(name, x)
    gm.run()
    out = []
    for vi in model.graph.output:
        if vi.type.WhichOneof("value") == "sequence_type":
            n = sum(1 for o in gm.output_names if o.startswith(vi.name + "."))
            out.append([gm.get_output(o) for o in element_names(vi.name, n)])
        else:
            out.append(gm.get_output(vi.name))
    return out


def _same(got, want):
    assert type(got) is type(want) or isinstance(got, np.ndarray), (type(got), type(want))
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _check(model, feeds, tmp_path, **kw):
    got = _tether(model, feeds, tmp_path, **kw)
    want = _ort(model, feeds)
    _same(got, want)
    return got


# ---------------------------------------------------------------- split, take apart, concatenate
@pytest.mark.parametrize("new_axis", [0, 1])
def test_split_at_erase_insert_concat(tmp_path, new_axis):
    """SplitToSequence (sizes) -> SequenceAt with a negative position -> Relu -> SequenceInsert at the front,
    SequenceErase, SequenceLength (folded to a constant) -> ConcatFromSequence."""
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["s"], axis=1),
             helper.make_node("SequenceAt", ["s", "m1"], ["last"]),
             helper.make_node("Relu", ["last"], ["r"]),
             helper.make_node("SequenceInsert", ["s", "r", "zero"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "one"], ["s3"]),
             helper.make_node("SequenceLength", ["s3"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=1, new_axis=new_axis)]
    sizes = np.array([2, 2, 2], np.int64) if new_axis else np.array([1, 3, 2], np.int64)
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 6, 3])],
                   [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("n", T.INT64, None)],
                   [("sizes", sizes), ("m1", np.array(-1, np.int64)), ("zero", np.array(0, np.int64)),
                    ("one", np.array(1, np.int64))])
    _check(model, {"x": RNG.standard_normal((2, 6, 3)).astype(np.float32)}, tmp_path)


@pytest.mark.parametrize("split, keepdims", [(None, 0), (None, 1), (np.array(4, np.int64), 1)])
def test_split_to_sequence_output(tmp_path, split, keepdims):
    """A sequence the model outputs: one graph output per element (a scalar split leaves a shorter last part)."""
    ins = ["x"] + (["split"] if split is not None else [])
    model = _model([helper.make_node("SplitToSequence", ins, ["s"], axis=0, keepdims=keepdims)],
                   [helper.make_tensor_value_info("x", F, [10, 2])], [_seq_info("s")],
                   [("split", split)] if split is not None else [])
    got = _check(model, {"x": RNG.standard_normal((10, 2)).astype(np.float32)}, tmp_path)
    assert len(got[0]) == (10 if split is None else 3)


def test_sequence_input_map_and_identity(tmp_path):
    """A sequence input (its elements are graph inputs s.0, s.1, s.2), SequenceMap of a body adding a tensor
    input, SequenceConstruct of tensors, Identity of a sequence, both returned as sequences."""
    body = helper.make_graph([helper.make_node("Add", ["e", "b"], ["o"]), helper.make_node("Tanh", ["o"], ["t"])],
                             "body", [helper.make_tensor_value_info("e", F, None),
                                      helper.make_tensor_value_info("b", F, None)],
                             [helper.make_tensor_value_info("t", F, None)])
    nodes = [helper.make_node("SequenceMap", ["s", "bias"], ["m"], body=body),
             helper.make_node("SequenceConstruct", ["bias", "bias"], ["c"]),
             helper.make_node("Identity", ["c"], ["c2"])]
    model = _model(nodes, [_seq_info("s"), helper.make_tensor_value_info("bias", F, [4])],
                   [_seq_info("m"), _seq_info("c2")])
    feeds = {"s": [RNG.standard_normal(4).astype(np.float32) for _ in range(3)],
             "bias": RNG.standard_normal(4).astype(np.float32)}
    _check(model, feeds, tmp_path)


# ---------------------------------------------------------------- Loop and If
def test_loop_appending_to_a_sequence(tmp_path):
    """A loop of a known trip count inserting one tensor per iteration into a sequence it carries (unrolled),
    then ConcatFromSequence: the shape exporters write for a list built in a Python loop."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"])],
        "body", [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, []),
                 _seq_info("seq_in")],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), _seq_info("seq_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["trips", "cond", "empty"], ["seq"], body=body),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, None)],
                   [("trips", np.array(5, np.int64)), ("cond", np.array(True))])
    _check(model, {"x": RNG.standard_normal(3).astype(np.float32)}, tmp_path)


@pytest.mark.parametrize("cond", [True, False])
def test_if_on_a_run_time_condition_selects_sequences(tmp_path, cond):
    """Both branches give a sequence of two tensors: each element is selected (the executor runs one branch)."""
    def branch(name, op):
        return helper.make_graph([helper.make_node(op, ["x"], [name + "_a"]),
                                  helper.make_node("Neg", ["x"], [name + "_b"]),
                                  helper.make_node("SequenceConstruct", [name + "_a", name + "_b"], [name + "_s"])],
                                 name, [], [_seq_info(name + "_s")])
    nodes = [helper.make_node("If", ["c"], ["s"], then_branch=branch("then", "Exp"), else_branch=branch("else", "Sin")),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    model = _model(nodes, [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("x", F, [4])],
                   [helper.make_tensor_value_info("y", F, None)])
    _check(model, {"c": np.array(cond), "x": RNG.standard_normal(4).astype(np.float32)}, tmp_path)


def test_optionals(tmp_path):
    """Optional of a tensor and an empty one: OptionalHasElement folds, OptionalGetElement is the tensor."""
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("Optional", [], ["e"], type=helper.make_tensor_type_proto(F, [3])),
             helper.make_node("OptionalHasElement", ["o"], ["h1"]),
             helper.make_node("OptionalHasElement", ["e"], ["h2"]),
             helper.make_node("OptionalGetElement", ["o"], ["g"]),
             helper.make_node("Sqrt", ["g"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("h1", T.BOOL, None),
                    helper.make_tensor_value_info("h2", T.BOOL, None)])
    got = _check(model, {"x": np.abs(RNG.standard_normal(3)).astype(np.float32)}, tmp_path)
    assert bool(got[1]) and not bool(got[2])


# ---------------------------------------------------------------- refusals: data-dependent lengths and positions
def _refused(model, match, **kw):
    with pytest.raises(UnsupportedOpError, match=match):
        from_onnx(model, **kw)


def test_run_time_position_is_refused():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"]), helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("p", T.INT64, [])],
                   [helper.make_tensor_value_info("y", F, None)])
    _refused(model, r"node SequenceAt_1: SequenceAt position 'p' is computed at run time")


def test_if_giving_sequences_of_different_lengths_is_refused():
    def branch(name, n):
        outs = ["%s_%d" % (name, i) for i in range(n)]
        return helper.make_graph([helper.make_node("Identity", ["x"], [o]) for o in outs]
                                 + [helper.make_node("SequenceConstruct", outs, [name + "_s"])],
                                 name, [], [_seq_info(name + "_s")])
    nodes = [helper.make_node("If", ["c"], ["s"], then_branch=branch("t", 1), else_branch=branch("e", 2)),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    model = _model(nodes, [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("x", F, [4])],
                   [helper.make_tensor_value_info("y", F, None)])
    _refused(model, r"an If on a run-time condition gives 's' as a sequence of 1 or a sequence of 2")


def test_tensor_op_on_a_sequence_and_out_of_range_position_are_refused():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, None)])
    _refused(model, r"node Relu_1: Relu reads 's', a sequence")
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"]), helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, None)],
                   [("p", np.array(4, np.int64))])
    _refused(model, r"SequenceAt position 4 is out of range for a sequence of 4")


def test_sequence_input_needs_its_shapes():
    model = _model([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], [_seq_info("s")],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(ValueError, match=r"input 's' is a sequence: fix its length and element shapes"):
        from_onnx(model)
    graph, _ = from_onnx(model, shape={"s": [(2,), (3,)]})
    assert graph.inputs == ["s.0", "s.1"]
