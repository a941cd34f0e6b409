"""ONNX Attention (opset 23/24, through its function body) and LinearAttention (opset 27, the recurrence
unrolled), through the whole flow against onnxruntime, across the attribute space."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_graph_model
from onnx import helper

from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx

RNG = np.random.default_rng(5)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(op, feeds, attrs, opset, n_out=1, optional=()):
    """One node; names in ``optional`` are left out (empty input names) in that position."""
    names = [("" if n in optional else n) for n in feeds]
    outs = ["y%d" % i for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    return make_graph_model([node], {k: v for k, v in feeds.items() if k not in optional}, outs, opset=opset)


# ---------------------------------------------------------------- LinearAttention
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_linear_attention_rules_and_head_groups(onnx_compare, rule, heads):
    hq, hkv = heads
    b, t, dk = 2, 3, 4
    feeds = {"q": _r(b, t, hq * dk), "k": _r(b, t, hkv * dk) * 0.5, "v": _r(b, t, hkv * dk),
             "past": _r(b, hkv, dk, dk), "decay": -np.abs(_r(b, t, hkv * dk)), "beta": np.abs(_r(b, t, hkv))}
    optional = [n for n, used in (("decay", "gated" in rule), ("beta", "delta" in rule)) if not used]
    m = _model("LinearAttention", feeds, {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule}, 27, 2,
               optional)
    onnx_compare(m, {k: v for k, v in feeds.items() if k not in optional}, rtol=1e-4, atol=1e-4)


def test_linear_attention_per_head_decay_scalar_beta_scale_no_past(onnx_compare):
    b, t, h, d = 1, 5, 2, 3
    feeds = {"q": _r(b, t, h * d), "k": _r(b, t, h * d), "v": _r(b, t, h * d), "past": _r(1),
             "decay": -np.abs(_r(b, t, h)), "beta": np.abs(_r(b, t, 1))}
    m = _model("LinearAttention", feeds, {"q_num_heads": h, "kv_num_heads": h, "scale": 0.3}, 27, 2, ["past"])
    onnx_compare(m, {k: v for k, v in feeds.items() if k != "past"}, rtol=1e-4, atol=1e-4)


def test_linear_attention_refuses_long_sequences_and_missing_decay():
    from tether.frontend.onnx.linear_attention import MAX_STEPS
    t = MAX_STEPS + 1
    feeds = {"q": _r(1, t, 4), "k": _r(1, t, 4), "v": _r(1, t, 4)}
    m = _model("LinearAttention", feeds, {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "linear"}, 27, 2)
    with pytest.raises(UnsupportedOpError, match="%d steps" % t):
        from_onnx(m)
    feeds = {"q": _r(1, 2, 4), "k": _r(1, 2, 4), "v": _r(1, 2, 4)}
    m = _model("LinearAttention", feeds, {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "gated"}, 27, 2)
    with pytest.raises(UnsupportedOpError, match="needs decay"):
        from_onnx(m)


# ---------------------------------------------------------------- Attention
def _attention(feeds, attrs, n_out=1, names=None, opset=23):
    outs = ["y%d" % i for i in range(n_out)]
    node = helper.make_node("Attention", names or list(feeds), outs, **attrs)
    return make_graph_model([node], feeds, outs, opset=opset)


def _reference(model, feeds):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


def _ops(model):
    return [n.op for n in from_onnx(model)[0].nodes]


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_4d_heads_and_causal_take_the_fused_path(onnx_compare, heads, causal):
    hq, hkv = heads
    feeds = {"q": _r(2, hq, 5, 8), "k": _r(2, hkv, 7, 8), "v": _r(2, hkv, 7, 6)}
    m = _attention(feeds, {"is_causal": causal})
    onnx_compare(m, feeds, rtol=1e-4, atol=1e-5)
    ops = _ops(m)
    assert ops.count("batch_matmul") == 2 and "broadcast_to" not in ops and len(ops) <= 14


@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])
def test_attention_3d_with_scale_and_softcap(onnx_compare, heads):
    hq, hkv = heads
    feeds = {"q": _r(2, 5, hq * 4), "k": _r(2, 6, hkv * 4), "v": _r(2, 6, hkv * 3)}
    m = _attention(feeds, {"q_num_heads": hq, "kv_num_heads": hkv, "scale": 0.4, "softcap": 2.0})
    onnx_compare(m, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(7,), (5, 7), (4, 5, 7), (2, 1, 5, 7), (2, 4, 5, 7), (1, 1, 1, 7)])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("runtime", [False, True])
def test_attention_masks_broadcast(onnx_compare, mask_shape, kind, runtime):
    feeds = {"q": _r(2, 4, 5, 8), "k": _r(2, 4, 7, 8), "v": _r(2, 4, 7, 8)}
    mask = RNG.random(mask_shape) > 0.3 if kind == "bool" else _r(*mask_shape)
    if kind == "bool":
        mask[..., 0] = True     # ort and the spec agree on rows with an attendable key
    m = _attention(dict(feeds, mask=mask), {})
    if not runtime:
        from onnx import numpy_helper
        m.graph.input.pop()
        m.graph.initializer.append(numpy_helper.from_array(mask, "mask"))
    run = dict(feeds, mask=mask) if runtime else feeds
    # onnxruntime refuses a rank-1 mask and a mask broadcasting over the queries, which the spec allows: the
    # onnx reference answers there
    ort_takes = len(mask_shape) >= 2 and mask_shape[-2] == 5
    onnx_compare(m, run, rtol=1e-4, atol=1e-5, expected=None if ort_takes else _reference(m, run))


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_fully_masked_rows_give_zeros(onnx_compare, runtime, causal):
    feeds = {"q": _r(1, 2, 4, 8), "k": _r(1, 2, 4, 8), "v": _r(1, 2, 4, 8)}
    mask = np.ones((4, 4), bool)
    mask[1, :] = False
    m = _attention(dict(feeds, mask=mask), {"is_causal": causal})
    if not runtime:
        from onnx import numpy_helper
        m.graph.input.pop()
        m.graph.initializer.append(numpy_helper.from_array(mask, "mask"))
    run = dict(feeds, mask=mask) if runtime else feeds
    tether_out, _ = onnx_compare(m, run, expected=_reference(m, run), rtol=1e-4, atol=1e-5)
    assert np.all(tether_out[0][:, :, 1] == 0)


def test_attention_short_mask_pads_with_masked_keys(onnx_compare):
    feeds = {"q": _r(1, 2, 3, 4), "k": _r(1, 2, 6, 4), "v": _r(1, 2, 6, 4), "mask": _r(3, 4)}
    m = _attention(feeds, {})
    onnx_compare(m, feeds, expected=_reference(m, feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("rank", [3, 4])
def test_attention_past_and_present(onnx_compare, causal, rank):
    b, hq, hkv, s, p, d = 2, 4, 2, 3, 5, 4
    if rank == 4:
        feeds = {"q": _r(b, hq, s, d), "k": _r(b, hkv, s, d), "v": _r(b, hkv, s, d)}
        attrs = {"is_causal": causal}
    else:
        feeds = {"q": _r(b, s, hq * d), "k": _r(b, s, hkv * d), "v": _r(b, s, hkv * d)}
        attrs = {"is_causal": causal, "q_num_heads": hq, "kv_num_heads": hkv}
    feeds.update(pk=_r(b, hkv, p, d), pv=_r(b, hkv, p, d))
    m = _attention(feeds, attrs, 3, names=["q", "k", "v", "", "pk", "pv"])
    onnx_compare(m, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_through_the_function_body(onnx_compare, mode):
    feeds = {"q": _r(1, 2, 3, 4), "k": _r(1, 2, 5, 4), "v": _r(1, 2, 5, 4), "mask": _r(3, 5)}
    m = _attention(feeds, {"qk_matmul_output_mode": mode, "softcap": 3.0}, 4,
                   names=["q", "k", "v", "mask"])
    # against onnxruntime: with softcap, onnx's reference returns the capped scores for mode 0, where the spec's
    # function body and onnxruntime return the raw ones
    onnx_compare(m, feeds, rtol=1e-4, atol=1e-5)


def test_attention_float64_through_the_function_body(onnx_compare):
    feeds = {k: v.astype(np.float64)
             for k, v in {"q": _r(1, 2, 3, 4), "k": _r(1, 2, 5, 4), "v": _r(1, 2, 5, 4)}.items()}
    m = _attention(feeds, {"is_causal": 1})
    onnx_compare(m, feeds, expected=_reference(m, feeds))
    assert "softmax" in _ops(m)
