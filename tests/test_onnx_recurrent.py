"""ONNX LSTM, GRU and RNN through tether (the input GEMM + the time-looping ``recurrent`` kernel) against
onnxruntime: every direction, layout, sequence_lens, initial states, peepholes, clip, every activation with its
alpha/beta, input_forget, linear_before_reset, omitted outputs, run-time weights, opsets 7..22; a CRNN-like
model; the refusals; and the CRNN on emulated aarch64 and armv7."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import tether
from tether import graph_executor, rpc
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx
from tether.graph import reference
from tether.rpc.graph_client import RemoteGraphExecutor

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def rnn_model(cell, seq=5, batch=3, nin=4, hid=8, direction="forward", layout=0, seq_lens=None, init=False,
              peephole=False, bias=True, outputs=None, weights_as_inputs=False, opset=14, seed=0, **attrs):
    """One ONNX recurrent node with random weights; returns (model, feeds)."""
    rng = np.random.default_rng(seed)
    g, d = GATES[cell], 2 if direction == "bidirectional" else 1
    arrays = {"W": rng.standard_normal((d, g * hid, nin)) * 0.4, "R": rng.standard_normal((d, g * hid, hid)) * 0.4}
    if bias:
        arrays["B"] = rng.standard_normal((d, 2 * g * hid)) * 0.4
    xshape = (seq, batch, nin) if layout == 0 else (batch, seq, nin)
    feeds = {"X": rng.standard_normal(xshape).astype(np.float32)}
    sshape = (d, batch, hid) if layout == 0 else (batch, d, hid)
    names = ["X", "W", "R", "B" if bias else ""]
    consts = {k: v.astype(np.float32) for k, v in arrays.items()}
    if seq_lens is not None:
        consts["sl"] = np.asarray(seq_lens, np.int32)
    names.append("sl" if seq_lens is not None else "")
    states = ["h0"] + (["c0"] if cell == "LSTM" else [])
    for s in states:
        names.append(s if init else "")
        if init:
            feeds[s] = rng.standard_normal(sshape).astype(np.float32)
    if peephole:
        consts["P"] = (rng.standard_normal((d, 3 * hid)) * 0.4).astype(np.float32)
        names.append("P")
    while names and not names[-1]:
        names.pop()
    all_outs = ["Y", "Y_h", "Y_c"][:2 + (cell == "LSTM")]
    outs = outputs if outputs is not None else all_outs
    node_outs = [o if o in outs else "" for o in all_outs]
    while node_outs and not node_outs[-1]:
        node_outs.pop()
    if opset >= 14:
        attrs["layout"] = layout
    node = helper.make_node(cell, names, node_outs, hidden_size=hid, direction=direction, **attrs)
    graph_inputs = [helper.make_tensor_value_info(k, TP.FLOAT, v.shape) for k, v in feeds.items()]
    inits = []
    for k, v in consts.items():
        if weights_as_inputs and k in ("W", "R", "B"):
            feeds[k] = v
            graph_inputs.append(helper.make_tensor_value_info(k, TP.FLOAT, v.shape))
        else:
            inits.append(numpy_helper.from_array(v, k))
    graph = helper.make_graph([node], "rnn", graph_inputs,
                              [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, feeds


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def tether_run(model, feeds, tmp_path, target="host"):
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target=target).export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.run(**feeds)
    return [gm.get_output(i) for i in range(gm.get_num_outputs())], graph, params


def check(model, feeds, tmp_path):
    expected = ort_run(model, feeds)
    actual, graph, params = tether_run(model, feeds, tmp_path)
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
        assert a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
    # the numpy definition of the op (constant folding, the reference interpreter) agrees too
    for e, r in zip(expected, reference.run(graph, params, feeds)):
        np.testing.assert_allclose(r, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions_lengths_states(cell, direction, tmp_path):
    model, feeds = rnn_model(cell, direction=direction, seq_lens=[5, 2, 4], init=True, peephole=cell == "LSTM")
    check(model, feeds, tmp_path)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1(cell, direction, tmp_path):
    """onnxruntime refuses layout 1 (batch first): the expected values are its layout-0 results, transposed."""
    kw = dict(direction=direction, seq_lens=[5, 2, 4], init=True, peephole=cell == "LSTM")
    model, feeds = rnn_model(cell, layout=1, **kw)
    model0, _ = rnn_model(cell, layout=0, **kw)
    feeds0 = {k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) for k, v in feeds.items()}
    expected = ort_run(model0, feeds0)
    expected = [np.transpose(expected[0], (2, 0, 1, 3))] + [np.swapaxes(e, 0, 1) for e in expected[1:]]
    actual, _, _ = tether_run(model, feeds, tmp_path)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cell,kw", [
    ("LSTM", {"input_forget": 1}),
    ("LSTM", {"clip": 0.7, "peephole": True}),
    ("LSTM", {"activations": ["HardSigmoid", "ScaledTanh", "Softsign"] * 2, "activation_alpha": [0.3, 1.5, 0.25, 0.9],
              "activation_beta": [0.4, 0.8, 0.6, 1.1], "direction": "bidirectional"}),
    ("LSTM", {"outputs": ["Y_h"]}),
    ("LSTM", {"outputs": ["Y_c"], "bias": False}),
    ("LSTM", {"seq_lens": [5, 5, 5]}),
    ("LSTM", {"hid": 16, "nin": 24, "batch": 1, "seq": 12}),      # vectorized gates and product
    ("LSTM", {"weights_as_inputs": True, "init": True}),
    ("GRU", {"linear_before_reset": 1, "init": True, "seq_lens": [1, 5, 3]}),
    ("GRU", {"linear_before_reset": 1, "hid": 16, "direction": "bidirectional", "clip": 0.5}),
    ("GRU", {"linear_before_reset": 0, "activations": ["Relu", "Elu"], "activation_alpha": [0.7]}),
    ("GRU", {"outputs": ["Y_h"], "batch": 1, "hid": 32}),
    ("RNN", {"clip": 0.3, "hid": 16, "seq_lens": [0, 5, 2]}),
])
def test_attributes(cell, kw, tmp_path):
    check(*rnn_model(cell, **kw), tmp_path)


ACTIVATIONS = [("Relu", [], []), ("Tanh", [], []), ("Sigmoid", [], []), ("Affine", [0.5], [0.1]),
               ("LeakyRelu", [0.2], []), ("LeakyRelu", [], []), ("ThresholdedRelu", [0.1], []),
               ("ScaledTanh", [1.2], [0.7]), ("HardSigmoid", [0.3], [0.4]), ("HardSigmoid", [], []),
               ("Elu", [0.8], []), ("Elu", [], []), ("Softsign", [], []), ("Softplus", [], [])]


@pytest.mark.parametrize("act,alpha,beta", ACTIVATIONS, ids=["%s%d" % (a[0], len(a[1])) for a in ACTIVATIONS])
def test_every_activation(act, alpha, beta, tmp_path):
    kw = {"activations": [act]}
    if alpha:
        kw["activation_alpha"] = alpha
    if beta:
        kw["activation_beta"] = beta
    check(*rnn_model("RNN", hid=8, **kw), tmp_path)


@pytest.mark.parametrize("cell,opset", [("LSTM", 7), ("GRU", 7), ("RNN", 7), ("LSTM", 22), ("GRU", 22)])
def test_opsets(cell, opset, tmp_path):
    check(*rnn_model(cell, opset=opset, seq_lens=[3, 5, 1], init=True), tmp_path)


@pytest.mark.parametrize("kw,match", [
    ({"activations": ["Affine"]}, "Affine without its activation_alpha"),
    ({"activations": ["ThresholdedRelu"]}, "ThresholdedRelu without its activation_alpha"),
    ({"activations": ["Swish"]}, "not one of the spec's"),
    ({"activations": ["Tanh", "Tanh"]}, "lists 2 activations"),
])
def test_refusals_name_the_problem(kw, match):
    model, _ = rnn_model("RNN", **kw)
    with pytest.raises(UnsupportedOpError, match=match):
        from_onnx(model)


def test_float64_is_refused():
    model, _ = rnn_model("LSTM")
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init).astype(np.float64)
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
    model.graph.input[0].type.tensor_type.elem_type = TP.DOUBLE
    with pytest.raises(UnsupportedOpError, match="LSTM on float64"):
        from_onnx(model)


def crnn_model(seed=0):
    """Conv stack -> reshape to a sequence -> bidirectional LSTM -> MatMul -> Softmax (a text-line recognizer)."""
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
    hid, ch, width, classes = 16, 8, 24, 11
    nodes = [
        helper.make_node("Conv", ["img", "cw1", "cb1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 1], strides=[2, 1]),
        helper.make_node("Conv", ["p1", "cw2", "cb2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[4, 1], strides=[4, 1]),   # (1, ch, 1, width)
        helper.make_node("Squeeze", ["p2", "ax2"], ["sq"]),                                  # (1, ch, width)
        helper.make_node("Transpose", ["sq"], ["seq"], perm=[2, 0, 1]),                     # (width, 1, ch)
        helper.make_node("LSTM", ["seq", "W", "R", "B"], ["Y"], hidden_size=hid, direction="bidirectional"),
        helper.make_node("Transpose", ["Y"], ["yt"], perm=[0, 2, 1, 3]),                    # (width, 1, 2, hid)
        helper.make_node("Reshape", ["yt", "shape"], ["feat"]),                             # (width, 2*hid)
        helper.make_node("MatMul", ["feat", "fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits = [w("cw1", ch, 1, 3, 3), w("cb1", ch), w("cw2", ch, ch, 3, 3), w("cb2", ch),
             numpy_helper.from_array(np.array([2], np.int64), "ax2"),
             w("W", 2, 4 * hid, ch), w("R", 2, 4 * hid, hid), w("B", 2, 8 * hid),
             numpy_helper.from_array(np.array([width, 2 * hid], np.int64), "shape"), w("fc", 2 * hid, classes)]
    graph = helper.make_graph(nodes, "crnn", [helper.make_tensor_value_info("img", TP.FLOAT, (1, 1, 8, width))],
                              [helper.make_tensor_value_info("probs", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, {"img": rng.standard_normal((1, 1, 8, width)).astype(np.float32)}


def test_crnn_like_model(tmp_path):
    check(*crnn_model(), tmp_path)


@pytest.mark.emulated
@pytest.mark.parametrize("preset", ["rasp4b", "rasp3b"])     # aarch64 (8 accumulator vectors), armv7 (4)
def test_crnn_on_emulated_arm(emulated_devices, preset, tmp_path):
    model, feeds = crnn_model(seed=1)
    expected = ort_run(model, feeds)
    graph, params = from_onnx(model)
    tether.build_graph(graph, params, target=preset).export(str(tmp_path))
    device = emulated_devices.for_preset(preset)
    with rpc.connect(*device.address, timeout=300) as sess:
        with RemoteGraphExecutor(sess, str(tmp_path)) as gm:
            gm.run(**feeds)
            np.testing.assert_allclose(gm.get_output(0), expected[0], rtol=1e-4, atol=1e-6)
