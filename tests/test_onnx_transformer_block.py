"""A small transformer encoder block the way torch.onnx writes one (token embedding Gather, Q/K/V MatMul + Add,
head split with Reshape/Transpose, scaled Q @ K^T, Softmax, @ V, output projection, residual, LayerNormalization
fused or decomposed, a Relu feed-forward), through the whole flow against onnxruntime."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

RNG = np.random.default_rng(0)
SEQ, D, HEADS, FF, VOCAB = 8, 32, 2, 64, 50
DH = D // HEADS


def _w(*shape, scale=0.2):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _layer_norm(nodes, inits, x, out, tag, fused):
    inits["g_" + tag], inits["b_" + tag] = 1 + _w(D), _w(D)
    if fused:
        nodes.append(helper.make_node("LayerNormalization", [x, "g_" + tag, "b_" + tag], [out], axis=-1,
                                      epsilon=1e-5))
        return
    inits.setdefault("axes_last", np.array([-1], np.int64))
    inits.setdefault("two", np.array(2.0, np.float32))
    inits.setdefault("eps", np.array(1e-5, np.float32))
    p = tag + "_"
    nodes += [helper.make_node("ReduceMean", [x, "axes_last"], [p + "m"], keepdims=1),
              helper.make_node("Sub", [x, p + "m"], [p + "d"]),
              helper.make_node("Pow", [p + "d", "two"], [p + "d2"]),
              helper.make_node("ReduceMean", [p + "d2", "axes_last"], [p + "v"], keepdims=1),
              helper.make_node("Add", [p + "v", "eps"], [p + "ve"]),
              helper.make_node("Sqrt", [p + "ve"], [p + "sd"]),
              helper.make_node("Div", [p + "d", p + "sd"], [p + "n"]),
              helper.make_node("Mul", [p + "n", "g_" + tag], [p + "s"]),
              helper.make_node("Add", [p + "s", "b_" + tag], [out])]


def _encoder(fused_ln: bool):
    inits = {"emb": _w(VOCAB, D, scale=1.0), "pos": _w(1, SEQ, D),
             "heads_shape": np.array([1, SEQ, HEADS, DH], np.int64), "merge_shape": np.array([1, SEQ, D], np.int64),
             "scale": np.array(np.sqrt(DH), np.float32)}
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["tok"], axis=0),
             helper.make_node("Add", ["tok", "pos"], ["x"])]
    for n in ("q", "k", "v"):
        inits["w" + n], inits["b" + n] = _w(D, D), _w(D)
        nodes += [helper.make_node("MatMul", ["x", "w" + n], [n + "0"]),
                  helper.make_node("Add", [n + "0", "b" + n], [n + "1"]),
                  helper.make_node("Reshape", [n + "1", "heads_shape"], [n + "2"]),
                  helper.make_node("Transpose", [n + "2"], [n + "h"],
                                   perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3])]
    inits["wo"], inits["bo"] = _w(D, D), _w(D)
    inits["w1"], inits["b1"], inits["w2"], inits["b2"] = _w(D, FF), _w(FF), _w(FF, D), _w(D)
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["scores0"]),
              helper.make_node("Div", ["scores0", "scale"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["attn"], axis=-1),
              helper.make_node("MatMul", ["attn", "vh"], ["ctx0"]),
              helper.make_node("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx1", "merge_shape"], ["ctx"]),
              helper.make_node("MatMul", ["ctx", "wo"], ["o0"]),
              helper.make_node("Add", ["o0", "bo"], ["o1"]),
              helper.make_node("Add", ["o1", "x"], ["res1"])]
    _layer_norm(nodes, inits, "res1", "h1", "ln1", fused_ln)
    nodes += [helper.make_node("MatMul", ["h1", "w1"], ["f0"]),
              helper.make_node("Add", ["f0", "b1"], ["f1"]),
              helper.make_node("Relu", ["f1"], ["f2"]),
              helper.make_node("MatMul", ["f2", "w2"], ["f3"]),
              helper.make_node("Add", ["f3", "b2"], ["f4"]),
              helper.make_node("Add", ["f4", "h1"], ["res2"])]
    _layer_norm(nodes, inits, "res2", "y", "ln2", fused_ln)
    ids = RNG.integers(0, VOCAB, (1, SEQ)).astype(np.int64)
    return make_graph_model(nodes, {"ids": ids}, ["y"], inits, opset=18), ids


@pytest.mark.parametrize("fused_ln", [True, False])
def test_transformer_encoder_block(onnx_compare, fused_ln):
    model, ids = _encoder(fused_ln)
    onnx_compare(model, {"ids": ids}, rtol=1e-4, atol=1e-4)
