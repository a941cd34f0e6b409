"""ONNX Einsum (the equations exporters write: batched matmuls, attention's QK^T and PV, transposes, sums,
outer and inner products, diagonals, chains) and LpNormalization, through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model, make_model
from onnx import helper

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(11)

SHAPES = {"a": 2, "b": 3, "c": 4, "d": 5, "e": 2, "h": 2, "i": 3, "j": 4, "k": 5, "n": 3, "q": 4}


def _operands(eq):
    lhs = eq.replace(" ", "").split("->")[0]
    out = []
    for t in lhs.split(","):
        if "..." in t:
            t = t.replace("...", "ab")
        out.append(RNG.standard_normal([SHAPES[c] for c in t]).astype(np.float32))
    return out


@pytest.mark.parametrize("eq", ["bij,bjk->bik", "ij->ji", "ij->i", "i,i", "ij,jk", "bhqd,bhkd->bhqk",
                                "bhqk,bhkd->bhqd", "i,j->ij", "...ii->...i", "ii->i", "ii", "abc,cd,de->abe",
                                "bid,bjd->bij", "ijk->kji", "ij,ij->ij", "...ij,...jk->...ik", "ijk->", "bi ,  bi"])
def test_einsum(onnx_compare, eq):
    xs = _operands(eq)
    if eq in ("...ii->...i",):
        xs = [RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)]
    elif eq in ("ii->i", "ii"):
        xs = [RNG.standard_normal((4, 4)).astype(np.float32)]
    feeds = {"x%d" % k: x for k, x in enumerate(xs)}
    node = helper.make_node("Einsum", list(feeds), ["y"], equation=eq)
    onnx_compare(make_graph_model([node], feeds, ["y"], opset=12), feeds, rtol=1e-4, atol=1e-4)


def test_einsum_refuses_broadcast_letters():
    feeds = {"x": np.ones((1, 3), np.float32), "y": np.ones((2, 3), np.float32)}
    node = helper.make_node("Einsum", ["x", "y"], ["z"], equation="bi,bi->bi")
    with pytest.raises(UnsupportedOpError, match="broadcasting"):
        from_onnx(make_graph_model([node], feeds, ["z"], opset=12))


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_lp_normalization(onnx_compare, p, axis):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 0, :] = 0
    x[:, 0, 0] = 0
    onnx_compare(make_model("LpNormalization", {"x": x}, {"p": p, "axis": axis}, opset=22), {"x": x})


def test_lp_normalization_refuses_p3():
    x = np.ones((2, 2), np.float32)
    with pytest.raises(UnsupportedOpError, match="p=3"):
        from_onnx(make_model("LpNormalization", {"x": x}, {"p": 3}, opset=22))
