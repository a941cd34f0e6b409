"""ONNX ops tether has no converter for but the spec defines by a function body (frontend/onnx/functions.py):
the node converts through its body. Each model runs through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.frontend.onnx import op_coverage, unsupported_ops

RNG = np.random.default_rng(3)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("attrs", [{}, {"lambd": 1.0, "bias": 0.5}])
def test_shrink_plain_body_from_a_newer_opset(onnx_compare, attrs):
    # Shrink (since 9) has only an opset-18 body: it defines the same op, its nodes convert at opset 18
    x = _r(3, 7) * 2
    onnx_compare(make_model("Shrink", {"x": x}, attrs, opset=9), {"x": x})


def test_mean_variance_normalization_schema_default_axes(onnx_compare):
    # the body reads the attribute `axes` by reference: left out, the schema default [0, 2, 3] applies
    x = _r(2, 3, 4, 5)
    onnx_compare(make_model("MeanVarianceNormalization", {"x": x}, {}, opset=13), {"x": x})
    onnx_compare(make_model("MeanVarianceNormalization", {"x": x}, {"axes": [1, 3]}, opset=18), {"x": x},
                 rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_swish(onnx_compare, alpha):
    x = _r(4, 9)
    onnx_compare(make_model("Swish", {"x": x}, {"alpha": alpha}, opset=24), {"x": x})


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_negative_log_likelihood_loss_context_dependent_body(onnx_compare, reduction, weighted):
    x = _r(3, 5, 2)
    t = RNG.integers(0, 5, (3, 2)).astype(np.int64)
    t[0, 0] = 2
    inits = {"t": t}
    if weighted:
        inits["w"] = np.abs(_r(5))
    m = make_model("NegativeLogLikelihoodLoss", {"x": x}, {"reduction": reduction, "ignore_index": 2}, opset=22,
                   initializers=inits)
    onnx_compare(m, {"x": x})


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_softmax_cross_entropy_nests_negative_log_likelihood(onnx_compare, reduction):
    # SoftmaxCrossEntropyLoss's body calls NegativeLogLikelihoodLoss, which expands through its own body
    x = _r(4, 6)
    t = RNG.integers(0, 6, (4,)).astype(np.int64)
    m = make_model("SoftmaxCrossEntropyLoss", {"x": x}, {"reduction": reduction}, opset=13, n_outputs=2,
                   initializers={"t": t})
    onnx_compare(m, {"x": x})


def test_function_ops_count_as_covered():
    m = make_model("Swish", {"x": _r(2, 2)}, {}, opset=24)
    assert unsupported_ops(m) == {}
    assert op_coverage(m)[0]["covered"] is True


def test_concat_with_an_empty_piece_drops_it(onnx_compare):
    x = _r(2, 3)
    empty = np.zeros((2, 0), np.float32)
    m = make_model("Concat", {"x": x}, {"axis": 1}, opset=13, initializers={"e": empty})
    onnx_compare(m, {"x": x})
