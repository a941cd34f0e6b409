"""A constant zero pad ahead of a float conv goes into the conv's own padding (graph/passes/pad_into_conv.py):
directly on NCHW, or on NHWC behind the transpose into the conv (a TFLite model's "SAME" pad before a strided
conv). No pad kernel is left and the output is onnxruntime's; pads the conv cannot take stay."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx


def _model(pads, nhwc=False, mode="constant", value=0.0, stride=2, group=1, twice=False):
    """x -> Pad(pads) [-> Transpose NHWC->NCHW] -> Conv 3x3 (its own pads 0) [, and the pad as a second output]."""
    rng = np.random.default_rng(0)
    ch, oc = 8, 8 if group > 1 else 12
    shape = [1, 15, 14, ch] if nhwc else [1, ch, 15, 14]
    inits = [numpy_helper.from_array(rng.standard_normal((oc, ch // group, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(np.array(value, np.float32), "value")]
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode=mode)]
    src = "p"
    if nhwc:
        nodes.append(helper.make_node("Transpose", ["p"], ["t"], perm=[0, 3, 1, 2]))
        src = "t"
    nodes.append(helper.make_node("Conv", [src, "w", "b"], ["y"], strides=[stride, stride], group=group))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if twice:
        outs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "padded_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), shape


def _run(model, shape, tmp_path):
    """(tether's outputs, onnxruntime's, the ops of the built graph's kernels, its conv node)."""
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    graph, params = from_onnx(model)
    built = tether.build_graph(graph, params, target="host")
    built.export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.set_input("x", x)
    gm.run()
    got = [gm.get_output(k) for k in range(gm.get_num_outputs())]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    body = [b for n in built.graph.nodes for b in n.body()]
    convs = [b for b in body if b.op.startswith("conv2d") or b.op.startswith("depthwise_conv2d")]
    return got, ref, [b.op for b in body], convs


@pytest.mark.parametrize("nhwc,pads,conv_pads", [
    (False, [0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 1, 1]),          # TensorFlow's SAME at stride 2: bottom and right
    (False, [0, 0, 2, 1, 0, 0, 0, 3], [2, 1, 0, 3]),
    (True, [0, 0, 0, 0, 0, 1, 1, 0], [0, 0, 1, 1]),           # NHWC: H, W at axes 1, 2
    (True, [0, 1, 2, 0, 0, 1, 0, 0], [1, 2, 1, 0]),
])
@pytest.mark.parametrize("group", [1, 8])
def test_a_zero_pad_becomes_the_convs_padding(tmp_path, nhwc, pads, conv_pads, group):
    model, shape = _model(pads, nhwc=nhwc, group=group)
    got, ref, ops, convs = _run(model, shape, tmp_path)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-4)
    assert "pad" not in ops, ops
    assert len(convs) == 1 and list(convs[0].attrs["pads"]) == conv_pads, [c.attrs for c in convs]


@pytest.mark.parametrize("case", ["value", "reflect", "channel_axis", "read_twice"])
def test_pads_the_conv_cannot_take_stay(tmp_path, case):
    """A pad of another value, another mode, the channel axis, or one whose result is read elsewhere too, stays a
    pad kernel (and the conv keeps its own pads of 0)."""
    pads = [0, 0, 0, 0, 0, 0, 1, 1]
    kw = {"value": dict(value=0.5), "reflect": dict(mode="reflect"), "channel_axis": {},
          "read_twice": dict(twice=True)}[case]
    if case == "channel_axis":
        pads = [0, 0, 0, 0, 0, 2, 1, 1]
        kw = {}
    model, shape = _model(pads, **kw)
    if case == "channel_axis":  # 10 channels into the conv: weights for them
        w = numpy_helper.to_array(model.graph.initializer[0])
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
            np.concatenate([w, w[:, :2]], axis=1), "w"))
    got, ref, ops, convs = _run(model, shape, tmp_path)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    assert "pad" in ops, ops
    assert all(not any(c.attrs["pads"]) for c in convs), [c.attrs for c in convs]
