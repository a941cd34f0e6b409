"""Caffe2 models (predict_net.pb + init_net.pb) read without caffe2 (retired with PyTorch 2.x): a small net
written at test time with tether's own caffe2.proto descriptors, compiled by tether and compared with a numpy
implementation of the same ops (Caffe2's documented semantics)."""
import os

import numpy as np
import pytest
from click.testing import CliRunner

import tether
from tether import graph_executor
from tether.cli.main import cli
from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend import detect, from_caffe2
from tether.frontend.caffe2 import op_coverage, to_onnx
from tether.frontend.caffe2.proto import messages


def _op(net, op_type, inputs, outputs, **args):
    op = net.op.add(type=op_type)
    op.input.extend(inputs)
    op.output.extend(outputs)
    for name, value in args.items():
        arg = op.arg.add(name=name)
        if isinstance(value, float):
            arg.f = value
        elif isinstance(value, int):
            arg.i = value
        elif isinstance(value, str):
            arg.s = value.encode()
        elif all(isinstance(v, int) for v in value):
            arg.ints.extend(value)
        else:
            arg.floats.extend(value)
    return op


def _weights(rng):
    return {
        "conv1_w": rng.normal(0, 0.3, (8, 3, 3, 3)), "conv1_b": rng.normal(0, 0.1, 8),
        "bn_s": rng.uniform(0.5, 1.5, 8), "bn_b": rng.normal(0, 0.1, 8), "bn_m": rng.normal(0, 0.1, 8),
        "bn_v": rng.uniform(0.5, 1.5, 8), "gate_w": rng.normal(0, 0.3, (8, 8, 1, 1)),
        "fc_w": rng.normal(0, 0.3, (5, 16)), "fc_b": rng.normal(0, 0.1, 5),
    }


def write_nets(folder, rng):
    M = messages()
    predict, init = M["NetDef"](name="small"), M["NetDef"](name="small_init")
    weights = {k: v.astype(np.float32) for k, v in _weights(rng).items()}
    for name, arr in weights.items():
        _op(init, "GivenTensorFill", [], [name], shape=list(arr.shape), values=arr.reshape(-1).tolist())
    predict.external_input.extend(["data"] + list(weights))
    _op(predict, "Conv", ["data", "conv1_w", "conv1_b"], ["conv1"], kernel=3, stride=2, pad=1, order="NCHW")
    _op(predict, "SpatialBN", ["conv1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], is_test=1, epsilon=1e-5)
    _op(predict, "Relu", ["bn"], ["bn"])
    _op(predict, "MaxPool", ["bn"], ["pool"], kernel=2, stride=2)
    _op(predict, "Conv", ["pool", "gate_w"], ["gate"], kernel=1)
    _op(predict, "Sigmoid", ["gate"], ["gate"])
    _op(predict, "Mul", ["pool", "gate"], ["gated"])
    _op(predict, "Concat", ["pool", "gated"], ["cat", "cat_info"], axis=1)
    _op(predict, "AveragePool", ["cat"], ["gap"], global_pooling=1)
    _op(predict, "FC", ["gap", "fc_w", "fc_b"], ["fc"])
    _op(predict, "Softmax", ["fc"], ["prob"])
    predict.external_output.append("prob")
    paths = {}
    for name, net in (("predict_net.pb", predict), ("init_net.pb", init)):
        paths[name] = os.path.join(folder, name)
        with open(paths[name], "wb") as fh:
            fh.write(net.SerializeToString())
    return paths["predict_net.pb"], paths["init_net.pb"], weights


def reference(x, w):
    """The net in numpy, op by op."""
    def conv(x, k, b, stride, pad):
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = np.lib.stride_tricks.sliding_window_view(x, k.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
        y = np.einsum("nchwij,ocij->nohw", win, k)
        return y + (0 if b is None else b.reshape(1, -1, 1, 1))

    y = conv(x, w["conv1_w"], w["conv1_b"], 2, 1)
    c = (-1, 1, 1)
    y = (y - w["bn_m"].reshape(c)) / np.sqrt(w["bn_v"].reshape(c) + 1e-5) * w["bn_s"].reshape(c) + w["bn_b"].reshape(c)
    y = np.maximum(y, 0)
    n, ch, h, wd = y.shape
    pool = y.reshape(n, ch, h // 2, 2, wd // 2, 2).max(axis=(3, 5))
    gate = 1 / (1 + np.exp(-conv(pool, w["gate_w"], None, 1, 0)))
    cat = np.concatenate([pool, pool * gate], axis=1)
    fc = cat.mean(axis=(2, 3)) @ w["fc_w"].T + w["fc_b"]
    e = np.exp(fc - fc.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    return write_nets(str(tmp_path_factory.mktemp("caffe2")), np.random.default_rng(0))


def _run(graph, params, x, folder):
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.set_input("data", x)
    gm.run()
    return gm.get_output(0)


def test_small_net_matches_numpy(nets, tmp_path):
    predict, init, weights = nets
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32)
    graph, params = from_caffe2(predict, shape={"data": x.shape})
    ours = _run(graph, params, x, tmp_path)
    ref = reference(x.astype(np.float64), {k: v.astype(np.float64) for k, v in weights.items()})
    assert ours.shape == (2, 5)
    assert np.abs(ours - ref).max() / np.abs(ref).max() <= 1e-4


def test_detection_coverage_and_unsupported_ops(nets, tmp_path):
    predict, init, _ = nets
    assert detect.detect(predict).name == "Caffe2" and detect.detect(init).name == "Caffe2"
    rows = {r["op_type"]: r for r in op_coverage(init)}        # named by its init net: the predict net beside it
    assert all(r["covered"] for r in rows.values()) and rows["Conv"]["nodes"] == ["Conv_0", "Conv_4"]
    net = messages()["NetDef"]()
    net.ParseFromString(open(predict, "rb").read())
    net.op[3].type = "RoIAlign"
    net.op[2].arg.add(name="order", s=b"NHWC")
    net.op[2].type = "MaxPool"
    odd = tmp_path / "predict_net.pb"
    odd.write_bytes(net.SerializeToString())
    (tmp_path / "init_net.pb").write_bytes(open(init, "rb").read())
    with pytest.raises(UnsupportedOpError) as exc:
        to_onnx(str(odd))
    msg = str(exc.value)
    assert "\n" not in msg and "2 Caffe2 op(s)" in msg
    assert "RoIAlign (op RoIAlign_3" in msg and "MaxPool (op MaxPool_2, caffe2.OperatorDef: order NHWC" in msg


def test_missing_companion_and_cli(nets, tmp_path):
    predict, init, _ = nets
    lone = tmp_path / "model_predict.pb"
    lone.write_bytes(open(predict, "rb").read())
    with pytest.raises(InvalidInput, match="model_init.pb"):
        to_onnx(str(lone))
    runner = CliRunner()
    res = runner.invoke(cli, ["compile", predict, "--input-shape", "data:1,3,16,16", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["compile", "--check", predict])
    assert res.exit_code == 0 and "0 not covered" in res.output, res.output
    broken = tmp_path / "broken_init.pb"
    broken.write_bytes(open(init, "rb").read()[:777])
    res = runner.invoke(cli, ["compile", str(broken), "-o", str(tmp_path / "out2")])
    assert res.exit_code == 2 and "broken_init.pb" in res.output, res.output


@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_small_net(nets, emulated_devices, tmp_path):
    from tether import rpc

    predict, init, weights = nets
    device = emulated_devices.for_preset("rasp4b")
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    graph, params = from_caffe2(predict, init, shape={"data": x.shape})
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(data=x)
            ours = gm.get_output(0)
    ref = reference(x.astype(np.float64), {k: v.astype(np.float64) for k, v in weights.items()})
    assert np.abs(ours - ref).max() / np.abs(ref).max() <= 1e-4
