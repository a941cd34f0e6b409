"""Caffe models (.prototxt + .caffemodel) read without caffe, compiled by tether and compared with OpenCV's dnn
module (its Caffe importer, in OpenCV 4: the test extra pins it below 5, which dropped it) on the same input: a
small classifier, a net of the other layer types and a V1-format net, their .caffemodel files written at test time
with tether's own caffe.proto descriptors."""
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from google.protobuf import text_format

import tether
from tether import graph_executor
from tether.cli.main import cli
from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend import detect, from_caffe
from tether.frontend.caffe import op_coverage, to_onnx
from tether.frontend.caffe.proto import messages


CLASSIFIER = """
name: "classifier"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 33 dim: 33 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 } convolution_param { num_output: 8 kernel_size: 3 stride: 2 pad: 1
        weight_filler { type: "xavier" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param { use_global_stats: true } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2a" type: "Convolution" bottom: "pool1" top: "conv2a"
        convolution_param { num_output: 8 kernel_size: 1 } }
layer { name: "relu2a" type: "ReLU" bottom: "conv2a" top: "conv2a" }
layer { name: "conv2b" type: "Convolution" bottom: "pool1" top: "conv2b"
        convolution_param { num_output: 8 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 group: 2 } }
layer { name: "prelu2b" type: "PReLU" bottom: "conv2b" top: "conv2b" }
layer { name: "sum2" type: "Eltwise" bottom: "conv2a" bottom: "conv2b" top: "sum2"
        eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "tanh2" type: "TanH" bottom: "conv2a" top: "tanh2" }
layer { name: "prod2" type: "Eltwise" bottom: "sum2" bottom: "tanh2" top: "prod2" eltwise_param { operation: PROD } }
layer { name: "cat" type: "Concat" bottom: "pool1" bottom: "prod2" top: "cat" }
layer { name: "norm" type: "LRN" bottom: "cat" top: "norm" lrn_param { local_size: 5 alpha: 0.001 beta: 0.75 } }
layer { name: "pool2" type: "Pooling" bottom: "norm" top: "pool2"
        pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "up" type: "Deconvolution" bottom: "pool2" top: "up"
        convolution_param { num_output: 4 kernel_size: 2 stride: 2 } }
layer { name: "elu" type: "ELU" bottom: "up" top: "up" elu_param { alpha: 0.5 } }
layer { name: "slice" type: "Slice" bottom: "up" top: "s0" top: "s1" slice_param { axis: 1 slice_point: 2 } }
layer { name: "sig" type: "Sigmoid" bottom: "s1" top: "s1" }
layer { name: "max" type: "Eltwise" bottom: "s0" bottom: "s1" top: "max" eltwise_param { operation: MAX } }
layer { name: "pow" type: "Power" bottom: "max" top: "pow" power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "drop" type: "Dropout" bottom: "pow" top: "pow" dropout_param { dropout_ratio: 0.5 } }
layer { name: "flat" type: "Flatten" bottom: "pow" top: "flat" }
layer { name: "fc" type: "InnerProduct" bottom: "flat" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""
TRAIN_ONLY = 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" ' \
             'include { phase: TRAIN } }\n'

# the blobs of each layer with weights, as Caffe stores them
BLOB_SHAPES = {
    "conv1": [(8, 3, 3, 3), (8,)],
    "bn1": [(8,), (8,), (1,)],
    "scale1": [(8,), (8,)],
    "conv2a": [(8, 8, 1, 1), (8,)],
    "conv2b": [(8, 4, 3, 1), (8,)],
    "prelu2b": [(8,)],
    "up": [(16, 4, 2, 2), (4,)],
    "fc": [(10, 2 * 10 * 10), (10,)],
}


def _blobs(name, rng):
    out = []
    for i, shape in enumerate(BLOB_SHAPES[name]):
        if name == "bn1":       # running mean, variance sums, and the scale factor they are divided by
            value = [rng.normal(0, 0.5, shape) * 4, rng.uniform(0.5, 2.0, shape) * 4, np.full(shape, 4.0)][i]
        elif len(shape) > 1:
            value = rng.normal(0, 1.0 / np.sqrt(np.prod(shape[1:])), shape)
        else:
            value = rng.normal(0, 0.3, shape)
        out.append(value.astype(np.float32))
    return out


def write_caffemodel(prototxt_text, path, rng):
    net = messages()["NetParameter"]()
    text_format.Parse(prototxt_text, net, allow_unknown_field=True)
    for layer in net.layer:
        if layer.name in BLOB_SHAPES:
            for arr in _blobs(layer.name, rng):
                blob = layer.blobs.add()
                blob.shape.dim.extend(arr.shape)
                blob.data.extend(arr.reshape(-1).tolist())
    with open(path, "wb") as fh:
        fh.write(net.SerializeToString())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("caffe")
    proto, weights = d / "classifier.prototxt", d / "classifier.caffemodel"
    proto.write_text(CLASSIFIER)
    write_caffemodel(CLASSIFIER, str(weights), np.random.default_rng(0))
    return str(proto), str(weights)


def _cv2():
    """OpenCV 4's dnn module, the reference (the test extra pins it: OpenCV 5 dropped its Caffe importer)."""
    import cv2
    if not hasattr(cv2.dnn, "readNetFromCaffe"):
        pytest.fail("the reference needs OpenCV 4's Caffe importer (OpenCV 5 dropped it): "
                    "pip install 'opencv-python-headless<5'")
    return cv2


def _opencv(proto, weights, x, outputs=None):
    cv2 = _cv2()
    net = cv2.dnn.readNetFromCaffe(proto, weights)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setInput(x)
    return net.forward(outputs) if outputs else net.forward()


def _tether_run(graph, params, x, folder):
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.set_input("data", x)
    gm.run()
    return gm.get_output(0)


def _rel_err(ours, ref):
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def test_classifier_matches_opencv(model, tmp_path):
    proto, weights = model
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 33, 33)).astype(np.float32)
    ref = _opencv(proto, weights, x)
    graph, params = from_caffe(proto)
    ours = _tether_run(graph, params, x, tmp_path)
    assert _rel_err(ours, ref) <= 1e-4
    x2 = np.random.default_rng(9).uniform(-1, 1, (2, 3, 33, 33)).astype(np.float32)   # another batch size
    graph, params = from_caffe(proto, shape={"data": x2.shape})
    assert _rel_err(_tether_run(graph, params, x2, tmp_path / "batch2"), _opencv(proto, weights, x2)) <= 1e-4


def test_intermediate_blobs_match_opencv(model):
    """The layers before the softmax, which would hide an error in its inputs: fc's logits, checked through
    onnxruntime on the translated graph (the same ONNX tether imports)."""
    import onnxruntime as ort

    proto, weights = model
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 33, 33)).astype(np.float32)
    ref = _opencv(proto, weights, x, ["fc", "pool2", "cat"])
    onnx_model = to_onnx(proto)
    for name in ("fc", "pool2", "cat"):
        onnx_model.graph.output.add(name=name)
    sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(["fc", "pool2", "cat"], {"data": x})
    for g, r in zip(got, ref):
        assert _rel_err(g, r) <= 1e-4

# the other layer types, on the deprecated input/input_dim fields: unary maths, a 4-bottom sum, LRN within
# channels, Scale by a second bottom from axis 0, Crop with offsets, Concat on the width, Permute, Reshape with 0
# and -1, InnerProduct from axis 2, Softmax over a middle axis (OpenCV reads Log without its base/scale/shift
# and has no Threshold or Bias layer, so those are left out)
ZOO = """
name: "zoo"
input: "data"
input_dim: 1 input_dim: 4 input_dim: 12 input_dim: 12
layer { name: "abs" type: "AbsVal" bottom: "data" top: "abs" }
layer { name: "bnll" type: "BNLL" bottom: "data" top: "bnll" }
layer { name: "exp" type: "Exp" bottom: "data" top: "exp" exp_param { base: 2 scale: 0.5 shift: 0.1 } }
layer { name: "log" type: "Log" bottom: "abs" top: "log" }
layer { name: "sum" type: "Eltwise" bottom: "abs" bottom: "bnll" bottom: "exp" bottom: "log"
        top: "sum" }
layer { name: "sum2" type: "Eltwise" bottom: "sum" bottom: "bnll" top: "sum2"
        eltwise_param { coeff: 0.5 coeff: 2 } }
layer { name: "lrn" type: "LRN" bottom: "sum2" top: "lrn"
        lrn_param { norm_region: WITHIN_CHANNEL local_size: 3 alpha: 0.1 beta: 0.75 } }
layer { name: "bias" type: "Scale" bottom: "lrn" top: "bias"
        scale_param { bias_term: true } }
layer { name: "gap" type: "Pooling" bottom: "bias" top: "gap"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "gflat" type: "Flatten" bottom: "gap" top: "gflat" }
layer { name: "gate" type: "Scale" bottom: "bias" bottom: "gflat" top: "gate" scale_param { axis: 0 } }
layer { name: "conv" type: "Convolution" bottom: "gate" top: "conv"
        convolution_param { num_output: 4 kernel_size: 5 } }
layer { name: "crop" type: "Crop" bottom: "gate" bottom: "conv" top: "crop"
        crop_param { axis: 2 offset: 1 offset: 2 } }
layer { name: "cat" type: "Concat" bottom: "crop" bottom: "conv" top: "cat" concat_param { axis: 3 } }
layer { name: "perm" type: "Permute" bottom: "cat" top: "perm"
        permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "resh" type: "Reshape" bottom: "perm" top: "resh"
        reshape_param { shape { dim: 0 dim: -1 dim: 32 } } }
layer { name: "ip" type: "InnerProduct" bottom: "resh" top: "ip"
        inner_product_param { num_output: 6 axis: 2 } }
layer { name: "sm" type: "Softmax" bottom: "ip" top: "sm" softmax_param { axis: 1 } }
"""
ZOO_BLOBS = {"conv": [(4, 4, 5, 5), (4,)], "bias": [(4,), (4,)], "ip": [(6, 32), (6,)]}

# a net in the V1 format of caffe before 2015: enum layer types, 4-D legacy blob shapes
V1_NET = """
name: "v1"
input: "data"
input_shape { dim: 1 dim: 3 dim: 10 dim: 10 }
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" convolution_param { num_output: 5 kernel_size: 3 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "pool" top: "ip" inner_product_param { num_output: 7 } }
layers { name: "prob" type: SOFTMAX bottom: "ip" top: "prob" }
"""
V1_BLOBS = {"conv": [(5, 3, 3, 3), (1, 1, 1, 5)], "ip": [(1, 1, 7, 80), (1, 1, 1, 7)]}


def write_net(text, blob_shapes, path, rng):
    """A .caffemodel of ``text`` with random blobs of ``blob_shapes`` (4-D legacy shapes for V1 layers)."""
    net = messages()["NetParameter"]()
    text_format.Parse(text, net, allow_unknown_field=True)
    for layer in list(net.layer) + list(net.layers):
        for shape in blob_shapes.get(layer.name, []):
            arr = rng.normal(0, 1.0 / np.sqrt(np.prod(shape[1:])) if len(shape) > 1 else 0.3, shape)
            blob = layer.blobs.add()
            if layer in net.layers:
                blob.num, blob.channels, blob.height, blob.width = shape
            else:
                blob.shape.dim.extend(shape)
            blob.data.extend(arr.astype(np.float32).reshape(-1).tolist())
    with open(path, "wb") as fh:
        fh.write(net.SerializeToString())


@pytest.mark.parametrize("case", ["zoo", "v1"])
def test_more_layer_types_match_opencv(case, tmp_path):
    import onnxruntime as ort

    text, blob_shapes, shape, out = {"zoo": (ZOO, ZOO_BLOBS, (1, 4, 12, 12), "sm"),
                                     "v1": (V1_NET, V1_BLOBS, (1, 3, 10, 10), "prob")}[case]
    proto, weights = tmp_path / (case + ".prototxt"), tmp_path / (case + ".caffemodel")
    proto.write_text(text)
    write_net(text, blob_shapes, str(weights), np.random.default_rng(7))
    x = np.random.default_rng(8).uniform(-1, 1, shape).astype(np.float32)
    net = messages()["NetParameter"]()
    text_format.Parse(text, net)
    blobs = [t for layer in list(net.layer) + list(net.layers) for t in layer.top]
    refs = _opencv(str(proto), str(weights), x, blobs)
    onnx_model = to_onnx(str(proto))      # every blob through onnxruntime: the translation of each layer
    names = {n for node in onnx_model.graph.node for n in node.output}
    checked = [b for b in blobs if b in names and b != out]
    for name in checked:
        onnx_model.graph.output.add(name=name)
    got = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        checked, {"data": x})
    for name, g in zip(checked, got):
        assert _rel_err(g, refs[blobs.index(name)].reshape(g.shape)) <= 1e-4, name
    assert len(checked) >= len(set(blobs)) - 2
    graph, params = from_caffe(str(proto))       # and the whole net compiled by tether
    assert _rel_err(_tether_run(graph, params, x, tmp_path / "out"), refs[blobs.index(out)]) <= 1e-4


def test_caffemodel_alone_and_detection(model, tmp_path):
    proto, weights = model
    assert detect.detect(proto).name == "Caffe prototxt" and detect.detect(weights).name == "Caffe"
    lone = tmp_path / "lone.caffemodel"      # no .prototxt beside it: the net inside the .caffemodel is used
    lone.write_bytes(open(weights, "rb").read())
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 33, 33)).astype(np.float32)
    ref = _opencv(proto, weights, x)
    graph, params = from_caffe(str(lone))
    assert _rel_err(_tether_run(graph, params, x, tmp_path / "out"), ref) <= 1e-4


def test_coverage_and_unsupported_layers_named_at_once(model, tmp_path):
    proto, _ = model
    train_val = tmp_path / "train_val.prototxt"      # a training-only layer is left out, as in Caffe's TEST phase
    train_val.write_text(CLASSIFIER + TRAIN_ONLY)
    rows = {r["op_type"]: r for r in op_coverage(str(train_val))}
    assert all(r["covered"] for r in rows.values()) and "SoftmaxWithLoss" not in rows
    assert rows["Convolution"]["nodes"] == ["conv1", "conv2a", "conv2b"] and rows["Eltwise"]["domain"] == "Caffe"
    odd = tmp_path / "odd.prototxt"
    odd.write_text(CLASSIFIER.replace('type: "LRN"', 'type: "SPP"').replace('type: "TanH"', 'type: "Swish"')
                   .replace('pool: MAX', 'pool: STOCHASTIC'))
    with pytest.raises(UnsupportedOpError) as exc:
        to_onnx(str(odd), model[1])
    msg = str(exc.value)
    assert "\n" not in msg and "3 Caffe layer(s)" in msg
    for part in ("Pooling (layer 'pool1', caffe.LayerParameter: STOCHASTIC pooling)", "Swish (layer 'tanh2'",
                 "SPP (layer 'norm'"):
        assert part in msg, msg
    rows = {r["op_type"]: r["covered"] for r in op_coverage(str(odd))}
    assert rows["SPP"] is False and rows["Pooling"] is False and rows["Convolution"] is True


def test_missing_or_corrupt_files_are_invalid_input(model, tmp_path):
    proto, weights = model
    lone = tmp_path / "lone.prototxt"
    lone.write_text(CLASSIFIER)
    with pytest.raises(InvalidInput, match="lone.caffemodel"):
        to_onnx(str(lone))
    (tmp_path / "lone.caffemodel").write_bytes(open(weights, "rb").read()[:700])
    with pytest.raises(InvalidInput, match="lone.caffemodel"):
        to_onnx(str(lone))
    bad = tmp_path / "bad.prototxt"
    bad.write_text('layer { name: "x" type: "ReLU" bottom: "nothing" top: "y" }\n')
    (tmp_path / "bad.caffemodel").write_bytes(open(weights, "rb").read())
    with pytest.raises(InvalidInput, match="nothing"):
        to_onnx(str(bad))


def test_cli_compile_check_and_corrupt_file(model, tmp_path):
    proto, weights = model
    runner = CliRunner()
    res = runner.invoke(cli, ["compile", weights, "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert os.path.isfile(tmp_path / "out" / "deploy.so")
    res = runner.invoke(cli, ["compile", "--check", proto])
    assert res.exit_code == 0, res.output
    assert "InnerProduct" in res.output and "0 not covered" in res.output
    broken = tmp_path / "broken.caffemodel"
    broken.write_bytes(open(weights, "rb").read()[:5000])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, "src"), os.path.join(root, "rpc_server"),
                                                      os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tether.cli.main", "compile", str(broken), "-o",
                           str(tmp_path / "out2")], capture_output=True, text=True, env=env, timeout=600)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "broken.caffemodel" in err, err


@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_classifier(model, emulated_devices, tmp_path):
    from tether import rpc

    proto, weights = model
    device = emulated_devices.for_preset("rasp4b")
    x = np.random.default_rng(4).uniform(-1, 1, (1, 3, 33, 33)).astype(np.float32)
    ref = _opencv(proto, weights, x)
    graph, params = from_caffe(proto, weights)
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(data=x)
            ours = gm.get_output(0)
    assert _rel_err(ours, ref) <= 1e-4
