"""MXNet models (prefix-symbol.json + prefix-NNNN.params) read without mxnet (retired in 2023): a small net whose
symbol JSON and NDArray-list .params are written at test time, compiled by tether and compared with a numpy
implementation of the same ops (MXNet's documented semantics and defaults)."""
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import tether
from tether import graph_executor
from tether.cli.main import cli
from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend import detect, from_mxnet
from tether.frontend.mxnet import op_coverage, to_onnx
from tether.frontend.mxnet.params import read_params, write_params


def _symbol(ops):
    """A symbol JSON from (op, name, attrs, input names) rows, variables first where first named."""
    nodes, index = [], {}

    def ref(name):
        if name not in index:
            index[name] = len(nodes)
            nodes.append({"op": "null", "name": name, "inputs": []})
        return [index[name], 0, 0]

    for op, name, attrs, inputs in ops:
        refs = [ref(i) for i in inputs]
        index[name] = len(nodes)
        nodes.append({"op": op, "name": name, "attrs": {k: str(v) for k, v in attrs.items()}, "inputs": refs})
    return {"nodes": nodes, "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"],
            "heads": [[len(nodes) - 1, 0, 0]], "attrs": {"mxnet_version": ["int", 10901]}}


OPS = [
    ("Convolution", "conv0", {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "num_filter": 8},
     ["data", "conv0_weight", "conv0_bias"]),
    ("BatchNorm", "bn0", {"eps": 1e-5, "fix_gamma": False},
     ["conv0", "bn0_gamma", "bn0_beta", "bn0_moving_mean", "bn0_moving_var"]),
    ("Activation", "relu0", {"act_type": "relu"}, ["bn0"]),
    ("Pooling", "pool0", {"kernel": (3, 3), "stride": (2, 2), "pool_type": "max", "pooling_convention": "full"},
     ["relu0"]),
    ("BatchNorm", "bn1", {}, ["pool0", "bn1_gamma", "bn1_beta", "bn1_moving_mean", "bn1_moving_var"]),
    ("LeakyReLU", "leaky1", {"act_type": "leaky", "slope": 0.2}, ["bn1"]),
    ("elemwise_add", "add1", {}, ["pool0", "leaky1"]),
    ("Concat", "cat", {"dim": 1}, ["pool0", "add1"]),
    ("Pooling", "gap", {"kernel": (1, 1), "global_pool": True, "pool_type": "avg"}, ["cat"]),
    ("Flatten", "flat", {}, ["gap"]),
    ("FullyConnected", "fc", {"num_hidden": 5}, ["flat", "fc_weight", "fc_bias"]),
    ("SoftmaxOutput", "softmax", {}, ["fc", "softmax_label"]),
]


def _params(rng):
    return {
        "conv0_weight": ("arg", rng.normal(0, 0.3, (8, 3, 3, 3))), "conv0_bias": ("arg", rng.normal(0, 0.1, 8)),
        "bn0_gamma": ("arg", rng.uniform(0.5, 1.5, 8)), "bn0_beta": ("arg", rng.normal(0, 0.1, 8)),
        "bn0_moving_mean": ("aux", rng.normal(0, 0.1, 8)), "bn0_moving_var": ("aux", rng.uniform(0.5, 1.5, 8)),
        "bn1_gamma": ("arg", rng.uniform(0.5, 1.5, 8)), "bn1_beta": ("arg", rng.normal(0, 0.1, 8)),
        "bn1_moving_mean": ("aux", rng.normal(0, 0.1, 8)), "bn1_moving_var": ("aux", rng.uniform(0.5, 1.5, 8)),
        "fc_weight": ("arg", rng.normal(0, 0.3, (5, 16))), "fc_bias": ("arg", rng.normal(0, 0.1, 5)),
    }


def reference(x, p):
    """The net in numpy, op by op, with MXNet's defaults (bn1: eps 1e-3 and gamma fixed at 1)."""
    w = {k: v[1].astype(np.float64) for k, v in p.items()}
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    y = np.einsum("nchwij,ocij->nohw", win, w["conv0_weight"]) + w["conv0_bias"].reshape(1, -1, 1, 1)
    c = (-1, 1, 1)
    y = (y - w["bn0_moving_mean"].reshape(c)) / np.sqrt(w["bn0_moving_var"].reshape(c) + 1e-5) \
        * w["bn0_gamma"].reshape(c) + w["bn0_beta"].reshape(c)
    y = np.maximum(y, 0)
    # "full" convention: ceil((8 - 3) / 2) + 1 = 4 windows, the last one past the edge
    yp = np.pad(y, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)
    pool = np.lib.stride_tricks.sliding_window_view(yp, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(4, 5))
    b = (pool - w["bn1_moving_mean"].reshape(c)) / np.sqrt(w["bn1_moving_var"].reshape(c) + 1e-3) \
        + w["bn1_beta"].reshape(c)
    leaky = np.where(b > 0, b, 0.2 * b)
    cat = np.concatenate([pool, pool + leaky], axis=1)
    fc = cat.mean(axis=(2, 3)) @ w["fc_weight"].T + w["fc_bias"]
    e = np.exp(fc - fc.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("mxnet")
    params = {k: (kind, v.astype(np.float32)) for k, (kind, v) in _params(np.random.default_rng(0)).items()}
    (d / "net-symbol.json").write_text(json.dumps(_symbol(OPS), indent=2))
    write_params(str(d / "net-0003.params"), {k: (kind, v * 0) for k, (kind, v) in params.items()})
    write_params(str(d / "net-0010.params"), params)       # the latest epoch is the one read
    return str(d / "net-symbol.json"), str(d / "net-0010.params"), params


def _run(graph, params, x, folder):
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.set_input("data", x)
    gm.run()
    return gm.get_output(0)


def test_small_net_matches_numpy(model, tmp_path):
    symbol, params_path, params = model
    assert sorted(read_params(params_path)) == sorted(params)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32)
    graph, prm = from_mxnet(symbol, shape={"data": x.shape})
    ours = _run(graph, prm, x, tmp_path)
    ref = reference(x.astype(np.float64), params)
    assert ours.shape == (2, 5)
    assert np.abs(ours - ref).max() / np.abs(ref).max() <= 1e-4


def test_detection_coverage_unsupported_and_missing(model, tmp_path):
    symbol, params_path, _ = model
    assert detect.detect(symbol).name == "MXNet" and detect.detect(params_path).name == "MXNet"
    rows = {r["op_type"]: r for r in op_coverage(params_path)}     # the .params names its symbol file
    assert all(r["covered"] for r in rows.values()) and rows["BatchNorm"]["nodes"] == ["bn0", "bn1"]
    odd = [(op, name, dict(attrs), inputs) for op, name, attrs, inputs in OPS]
    odd[6] = ("ROIPooling", "add1", {}, ["pool0", "leaky1"])
    odd[5] = ("LeakyReLU", "leaky1", {"act_type": "celu"}, ["bn1"])
    (tmp_path / "odd-symbol.json").write_text(json.dumps(_symbol(odd)))
    (tmp_path / "odd-0000.params").write_bytes(open(params_path, "rb").read())
    with pytest.raises(UnsupportedOpError) as exc:
        to_onnx(str(tmp_path / "odd-symbol.json"))
    msg = str(exc.value)
    assert "\n" not in msg and "2 MXNet op(s)" in msg and "mxnet 10901" in msg
    assert "ROIPooling (node 'add1'" in msg and "LeakyReLU (node 'leaky1', mxnet 10901: act_type=celu)" in msg
    (tmp_path / "lone-symbol.json").write_text(json.dumps(_symbol(OPS)))
    with pytest.raises(InvalidInput, match="lone-NNNN.params"):
        to_onnx(str(tmp_path / "lone-symbol.json"))
    (tmp_path / "lone-0001.params").write_bytes(open(params_path, "rb").read()[:900])
    with pytest.raises(InvalidInput, match="truncated"):
        to_onnx(str(tmp_path / "lone-symbol.json"))


def test_cli_compile_and_check(model, tmp_path):
    symbol, params_path, _ = model
    runner = CliRunner()
    res = runner.invoke(cli, ["compile", params_path, "-s", "data:1,3,16,16", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert os.path.isfile(tmp_path / "out" / "deploy.so")
    res = runner.invoke(cli, ["compile", "--check", symbol])
    assert res.exit_code == 0 and "0 not covered" in res.output, res.output


@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_small_net(model, emulated_devices, tmp_path):
    from tether import rpc

    symbol, params_path, params = model
    device = emulated_devices.for_preset("rasp4b")
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    graph, prm = from_mxnet(symbol, params_path, shape={"data": x.shape})
    tether.build_graph(graph, prm, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(data=x)
            ours = gm.get_output(0)
    ref = reference(x.astype(np.float64), params)
    assert np.abs(ours - ref).max() / np.abs(ref).max() <= 1e-4
