"""onnxruntime's DynamicQuantizeLSTM: models with an LSTM and a MatMul quantized by onnxruntime's own
quantize_dynamic (int8 and uint8 weights, per tensor and per channel, every direction), run by tether on the host
and on an emulated aarch64 device, against onnxruntime.

The bound: at most one quantization step on >= 99.9% of the elements, the step of a float output
being the one DynamicQuantizeLinear would give it, (max(y, 0) - min(y, 0)) / 255 (the scale at which onnxruntime
quantizes the hidden state for the next step and the LSTM output for the MatMul). onnxruntime runs at one thread:
at more it quantizes blocks of batch rows on their own, which tether does not model (frontend/onnx/quantized_lstm.py).
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor, rpc
from tether.errors import UnsupportedOpError
from tether.frontend import from_onnx
from tether.graph import op_info
from tether.rpc.graph_client import RemoteGraphExecutor

S, B, I, H, OUT = 7, 3, 12, 24, 10


def _fp32_model(direction: str, seed: int, peephole: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    inits = {"W": rng.normal(0, 0.4, (d, 4 * H, I)), "R": rng.normal(0, 0.4, (d, 4 * H, H)),
             "B": rng.normal(0, 0.2, (d, 8 * H)), "M": rng.normal(0, 0.3, (d * H, OUT)),
             "shape": np.array([S, B, d * H], np.int64)}
    lstm_in = ["x", "W", "R", "B"]
    if peephole:    # with initial states (without them the first step quantizes an all-zero state: scale 1)
        inits["h0"] = rng.normal(0, 0.5, (d, B, H))
        inits["c0"] = rng.normal(0, 0.5, (d, B, H))
        inits["P"] = rng.normal(0, 0.3, (d, 3 * H))
        lstm_in += ["", "h0", "c0", "P"]
    nodes = [helper.make_node("LSTM", lstm_in, ["y", "yh", "yc"], hidden_size=H, direction=direction),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "shape"], ["ys"]),
             helper.make_node("MatMul", ["ys", "M"], ["out"])]
    g = helper.make_graph(nodes, "lstm_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [S, B, I])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "yh", "yc")],
                          [numpy_helper.from_array(np.asarray(v, np.int64 if k == "shape" else np.float32), k)
                           for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _quantized(tmp_path, direction, weight_type, per_channel, seed=0, peephole=False) -> str:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(_fp32_model(direction, seed, peephole), str(src))
    quantize_dynamic(str(src), str(dst), weight_type=getattr(QuantType, weight_type), per_channel=per_channel)
    ops = {n.op_type for n in onnx.load(str(dst)).graph.node}
    assert "DynamicQuantizeLSTM" in ops and "LSTM" not in ops, ops
    return str(dst)


def _ort(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _assert_within_one_step(got, ref):
    step = (max(float(ref.max()), 0.0) - min(float(ref.min()), 0.0)) / 255
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    within = float(np.mean(d <= step))
    assert within >= 0.999, "only %.4f of the outputs within one step %.3g (max %.2f steps)" % (within, step,
                                                                                             d.max() / step)


def _inputs(n, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1.5, (S, B, I)).astype(np.float32) for _ in range(n)]


def _check(gm, sess):
    for x in _inputs(3):
        ref = sess.run(None, {"x": x})
        gm.set_input("x", x)
        gm.run()
        for k, r in enumerate(ref):
            _assert_within_one_step(gm.get_output(k), r)


@pytest.mark.parametrize("direction,weight_type,per_channel", [
    ("forward", "QInt8", False), ("forward", "QUInt8", False), ("forward", "QInt8", True),
    ("reverse", "QUInt8", True), ("bidirectional", "QInt8", False), ("bidirectional", "QInt8", True)])
def test_dynamic_quantize_lstm_matches_onnxruntime(tmp_path, direction, weight_type, per_channel):
    path = _quantized(tmp_path, direction, weight_type, per_channel)
    graph, params = from_onnx(onnx.load(path))
    assert any(n.op == "recurrent" and n.attrs.get("quant_h") for n in graph.nodes)
    tether.build_graph(graph, params, target="host").export(str(tmp_path / "lib"))
    _check(graph_executor.load(str(tmp_path / "lib")), _ort(path))


def test_dynamic_quantize_lstm_peepholes_and_states(tmp_path):
    path = _quantized(tmp_path, "forward", "QInt8", False, seed=2, peephole=True)
    graph, params = from_onnx(onnx.load(path))
    tether.build_graph(graph, params, target="host").export(str(tmp_path / "lib"))
    _check(graph_executor.load(str(tmp_path / "lib")), _ort(path))


def test_quantization_is_modelled(tmp_path):
    """The run-time quantization of the hidden state matters and is what tether computes: the same graph without
    it (the recurrent product in float on the dequantized R) lies far from onnxruntime, tether's kernel close."""
    path = _quantized(tmp_path, "forward", "QInt8", False)
    graph, params = from_onnx(onnx.load(path))
    tether.build_graph(graph, params, target="host").export(str(tmp_path / "lib"))
    gm = graph_executor.load(str(tmp_path / "lib"))
    x = _inputs(1)[0]
    ref = _ort(path).run(None, {"x": x})[1]
    gm.set_input("x", x)
    gm.run()
    env = dict(params, x=x)
    for node in graph.nodes:
        if node.op == "recurrent":
            ins = [env[i] for i in node.inputs]
            # R back to float with its scale: the product without quantizing h
            ins[1] = ins[1] * ins[-1][:, None, :]
            float_yh = op_info.evaluate("recurrent", dict(node.attrs, quant_h=0), ins[:-1])[1]
        outs = op_info.evaluate(node.op, node.attrs, [env[i] for i in node.inputs])
        env.update(zip(node.outputs, outs))
    d_float = np.abs(float_yh - ref).max()
    d_tether = np.abs(gm.get_output(1) - ref).max()
    assert d_tether < d_float / 10, (d_tether, d_float)


def test_refuses_partial_sequence_lens(tmp_path):
    path = _quantized(tmp_path, "forward", "QInt8", False)
    model = onnx.load(path)
    (node,) = [n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM"]
    node.input[4] = "lens"
    model.graph.initializer.append(numpy_helper.from_array(np.array([S, 2, S], np.int32), "lens"))
    with pytest.raises(UnsupportedOpError, match="sequence_lens"):
        from_onnx(model)


@pytest.mark.emulated
def test_dynamic_quantize_lstm_on_emulated_aarch64(emulated_devices, tmp_path):
    dev = emulated_devices.for_preset("rasp5")
    path = _quantized(tmp_path, "bidirectional", "QInt8", True)
    graph, params = from_onnx(onnx.load(path))
    tether.build_graph(graph, params, target=dev.preset).export(str(tmp_path / "lib"))
    host, port = dev.address
    with rpc.connect(host, port, timeout=300) as sess, RemoteGraphExecutor(sess, str(tmp_path / "lib")) as gm:
        _check(gm, _ort(path))
