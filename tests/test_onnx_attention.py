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
