"""Core ML frontend: models converted with coremltools from Keras (NeuralNetwork .mlmodel, ML Program .mlpackage in
fp32 and fp16) match the Keras model they were converted from; legacy NeuralNetwork layers built with coremltools'
NeuralNetworkBuilder match a numpy/TensorFlow reference; a classifier with image preprocessing; the unsupported-op
report; bad files; the CLI; one model on the emulated aarch64 device. coremltools cannot predict on Linux, so the
reference is always the source framework."""
import os
import pathlib
import shutil

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
tf = pytest.importorskip("tensorflow")

import tether  # noqa: E402
from tether import graph_executor, rpc  # noqa: E402
from tether.errors import InvalidInput, UnsupportedOpError  # noqa: E402
from tether.frontend import detect, from_coreml  # noqa: E402
from tether.frontend.coreml import op_coverage, to_onnx  # noqa: E402
from tether.graph import reference  # noqa: E402

K = tf.keras.layers
RNG = np.random.default_rng(7)
FP32_TOL = 1e-4      # max |tether - reference| / max |reference|
FP16_TOL = 5e-3      # fp16 weights (coremltools' default ML Program precision), computed in fp32 by tether


def _gelu_tanh(t):
    return tf.nn.gelu(t, approximate=True)


def _cnn():
    inp = tf.keras.Input((16, 16, 3), batch_size=1, name="image")
    a = K.Conv2D(8, 3, padding="same", activation="relu")(inp)
    a = K.BatchNormalization()(a)
    b = K.DepthwiseConv2D(3, padding="same", dilation_rate=2)(a)
    b = K.LeakyReLU(0.1)(b)
    c = K.Conv2D(8, 3, strides=2, padding="same", activation="elu")(a)
    c = K.Conv2DTranspose(8, 3, strides=2, padding="same", activation="sigmoid")(c)
    d = K.Multiply()([K.Add()([b, c]), K.Activation("tanh")(a)])
    e = K.Concatenate()([K.MaxPooling2D(2)(d), K.AveragePooling2D(3, strides=2, padding="same")(d)])
    e = K.ZeroPadding2D(((1, 0), (0, 1)))(e)
    e = K.Conv2D(12, 2, padding="valid", activation="swish")(e)
    u = K.Concatenate()([K.UpSampling2D(2, interpolation="bilinear")(e), K.UpSampling2D(2)(e)])
    h = K.Lambda(_gelu_tanh)(K.Dense(16)(K.GlobalAveragePooling2D()(u)))
    model = tf.keras.Model(inp, K.Dense(5, activation="softmax")(h))
    for layer in model.layers:
        if isinstance(layer, K.BatchNormalization):
            layer.set_weights([RNG.uniform(0.5, 1.5, 8), RNG.normal(0, 0.1, 8), RNG.normal(0, 0.1, 8),
                               RNG.uniform(0.5, 2, 8)])
    return model


def _attention():
    """A transformer block: layer norms, q/k/v projections, softmax(q k^T) v, a GELU MLP, residuals."""
    inp = tf.keras.Input((8, 16), batch_size=1, name="tokens")
    x = K.LayerNormalization()(inp)
    q, k, v = K.Dense(16)(x), K.Dense(16)(x), K.Dense(16)(x)
    att = K.Lambda(lambda t: tf.nn.softmax(tf.matmul(t[0], t[1], transpose_b=True) / 4.0, axis=-1))([q, k])
    y = K.Add()([inp, K.Lambda(lambda t: tf.matmul(t[0], t[1]))([att, v])])
    mlp = K.Dense(16)(K.Lambda(_gelu_tanh)(K.Dense(32)(K.LayerNormalization()(y))))
    y = K.Reshape((4, 32))(K.Add()([y, mlp]))
    y = K.Lambda(lambda t: tf.reduce_mean(tf.transpose(t, [0, 2, 1]), axis=-1))(y)
    return tf.keras.Model(inp, y)


def _convert(model, shape, name, path, **kw):
    @tf.function(input_signature=[tf.TensorSpec(shape, tf.float32, name=name)])
    def fn(t):
        return model(t)
    ct_shape = tuple(ct.RangeDim(1, 64, default=4) if d is None else d for d in shape)
    ml = ct.convert([fn.get_concrete_function()], source="tensorflow",
                    inputs=[ct.TensorType(shape=ct_shape, name=name)], **{k: v for k, v in kw.items() if v is not None})
    ml.save(str(path))
    return path


VARIANTS = {"mlmodel": dict(convert_to="neuralnetwork"),
            "mlpackage-fp32": dict(convert_to="mlprogram", compute_precision=ct.precision.FLOAT32),
            "mlpackage-fp16": dict(convert_to="mlprogram")}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{(model, variant): (path, input name, input, Keras output)}"""
    d = tmp_path_factory.mktemp("coreml")
    out = {}
    for model_name, build, shape, in_name in (("cnn", _cnn, (1, 16, 16, 3), "image"),
                                              ("attention", _attention, (1, 8, 16), "tokens")):
        model = build()
        x = RNG.standard_normal(shape).astype(np.float32)
        ref = model(x).numpy()
        for variant, kw in VARIANTS.items():
            ext = "mlmodel" if variant == "mlmodel" else "mlpackage"
            path = _convert(model, shape, in_name, d / ("%s_%s.%s" % (model_name, variant, ext)), **kw)
            out[(model_name, variant)] = (str(path), in_name, x, ref)
    return out


def _rel_err(y, ref):
    y, ref = np.asarray(y).reshape(-1), np.asarray(ref).reshape(-1)
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def _compile_and_run(path, feeds, tmp_path):
    graph, params = from_coreml(path)
    tether.build_graph(graph, params, target="host").export(str(tmp_path))
    gm = graph_executor.load(str(tmp_path))
    gm.run(**feeds)
    return gm.get_output(0)


@pytest.mark.parametrize("variant", ["mlmodel", "mlpackage-fp32"])
def test_converted_cnn_compiles_and_matches_keras(converted, variant, tmp_path):
    path, name, x, ref = converted[("cnn", variant)]
    y = _compile_and_run(path, {name: x}, tmp_path)
    assert y.shape[-1] == ref.shape[-1]
    assert _rel_err(y, ref) <= FP32_TOL


@pytest.mark.parametrize("variant", ["mlmodel", "mlpackage-fp32"])
def test_converted_attention_block_matches_keras(converted, variant):
    path, name, x, ref = converted[("attention", variant)]
    graph, params = from_coreml(path)
    (y,) = reference.run(graph, params, {name: x})
    assert _rel_err(y, ref) <= FP32_TOL


@pytest.mark.parametrize("model_name", ["cnn", "attention"])
def test_fp16_ml_program_matches_keras_within_fp16_weight_rounding(converted, model_name):
    path, name, x, ref = converted[(model_name, "mlpackage-fp16")]
    graph, params = from_coreml(path)
    (y,) = reference.run(graph, params, {name: x})
    assert _rel_err(y, ref) <= FP16_TOL


def test_the_ops_of_each_format_are_reported_in_core_ml_terms(converted):
    nn_rows = {r["op_type"]: r for r in op_coverage(converted[("cnn", "mlmodel")][0])}
    assert {"convolution", "batchnorm", "pooling", "activation", "upsample"} <= set(nn_rows)
    assert all(r["covered"] and r["domain"] == "CoreML" for r in nn_rows.values())
    assert len(nn_rows["convolution"]["nodes"]) == 5         # conv, depthwise, strided, transposed, valid
    mil_rows = {r["op_type"]: r for r in op_coverage(converted[("cnn", "mlpackage-fp16")][0])}
    assert {"conv", "conv_transpose", "batch_norm", "max_pool", "avg_pool", "upsample_bilinear", "const",
            "cast"} <= set(mil_rows)
    assert all(r["covered"] for r in mil_rows.values())
    assert str(mil_rows["conv"]["opset"]).startswith("CoreML")


def _volume():
    """Video layers: 3-D convolutions (SAME, strided VALID, transposed), 3-D max and average pooling."""
    inp = tf.keras.Input((4, 8, 8, 2), batch_size=1, name="clip")
    x = K.Conv3D(4, 3, padding="same", activation="relu")(inp)
    x = K.MaxPooling3D((1, 2, 2))(x)
    x = K.Conv3D(4, (2, 3, 3), strides=(2, 1, 1), padding="valid")(x)
    x = K.Conv3DTranspose(3, 2, strides=2, padding="same")(x)
    x = K.AveragePooling3D(2)(x)
    return tf.keras.Model(inp, K.Dense(3)(K.GlobalAveragePooling3D()(x)))


@pytest.mark.parametrize("variant", ["mlmodel", "mlpackage-fp32"])
def test_converted_3d_cnn_matches_keras(variant, tmp_path):
    model = _volume()
    x = RNG.standard_normal((1, 4, 8, 8, 2)).astype(np.float32)
    ext = "mlmodel" if variant == "mlmodel" else "mlpackage"
    path = str(_convert(model, (1, 4, 8, 8, 2), "clip", tmp_path / ("volume." + ext), **VARIANTS[variant]))
    ops = {r["op_type"]: r for r in op_coverage(path)}
    assert ({"convolution3d", "pooling3d"} if variant == "mlmodel" else {"conv", "conv_transpose"}) <= set(ops), ops
    assert all(r["covered"] for r in ops.values())
    y = _compile_and_run(path, {"clip": x}, tmp_path / "out")
    assert _rel_err(y, model(x).numpy()) <= FP32_TOL


def test_both_formats_are_detected_from_content(converted):
    assert detect.detect(converted[("cnn", "mlmodel")][0]).name == "CoreML"
    assert detect.detect(converted[("cnn", "mlpackage-fp32")][0]).name == "CoreML package"


# -- a classifier with an image input ----------------------------------------------------------------------------

@pytest.mark.parametrize("convert_to", ["neuralnetwork", "mlprogram"])
def test_image_classifier_with_preprocessing_returns_the_probabilities(tmp_path, convert_to):
    inp = tf.keras.Input((12, 12, 3), batch_size=1, name="img")
    x = K.GlobalMaxPooling2D()(K.Conv2D(4, 3, activation="relu")(inp))
    model = tf.keras.Model(inp, K.Dense(3, activation="softmax")(x))

    @tf.function(input_signature=[tf.TensorSpec((1, 12, 12, 3), tf.float32, name="img")])
    def fn(t):
        return model(t)
    bias = [-1.0, -0.5, 0.25]
    extra = {"compute_precision": ct.precision.FLOAT32} if convert_to == "mlprogram" else {}
    ml = ct.convert([fn.get_concrete_function()], source="tensorflow", convert_to=convert_to,
                    inputs=[ct.ImageType(shape=(1, 12, 12, 3), name="img", scale=1 / 127.5, bias=bias,
                                         color_layout=ct.colorlayout.BGR)],
                    classifier_config=ct.ClassifierConfig(["a", "b", "c"]), **extra)
    path = tmp_path / ("cls." + ("mlmodel" if convert_to == "neuralnetwork" else "mlpackage"))
    ml.save(str(path))
    probs_name = ml.get_spec().description.predictedProbabilitiesName
    graph, params = from_coreml(str(path))
    # the image input: float32 [1, C, H, W] pixel values, channels in the image's order (BGR here)
    assert list(graph.types["img"].shape) == [1, 3, 12, 12]
    assert graph.outputs == [probs_name]
    img = RNG.uniform(0, 255, (1, 3, 12, 12)).astype(np.float32)
    (y,) = reference.run(graph, params, {"img": img})
    pre = img / 127.5 + np.asarray(bias, np.float32).reshape(1, 3, 1, 1)
    ref = model(np.transpose(pre, (0, 2, 3, 1))).numpy()
    assert _rel_err(y, ref) <= FP32_TOL


# -- legacy layers from NeuralNetworkBuilder, against numpy -------------------------------------------------------

def _caffe_pool(x, k, s, p, kind):
    """Core ML's includeLastPixel pooling (Caffe's rule) on [C, H, W]."""
    c, h, w = x.shape

    def out_size(n):
        o = int(np.ceil((n + 2 * p - k) / s)) + 1
        return o - 1 if p and (o - 1) * s >= n + p else o
    oh, ow = out_size(h), out_size(w)
    y = np.zeros((c, oh, ow), np.float32)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s - p, j * s - p
            h1, w1 = min(h0 + k, h + p), min(w0 + k, w + p)
            area = (h1 - h0) * (w1 - w0)
            win = x[:, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)]
            y[:, i, j] = win.max(axis=(1, 2)) if kind == "MAX" else win.sum(axis=(1, 2)) / area
    return y


def _legacy_model(path):
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

    c, h, w = 4, 10, 10
    W = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    slopes = RNG.uniform(0.05, 0.3, 6).astype(np.float32)
    fc = RNG.standard_normal((5, c * h * w)).astype(np.float32) * 0.05
    q = RNG.integers(0, 256, (3, 5)).astype(np.uint8)
    qscale = RNG.uniform(0.01, 0.02, 3).astype(np.float32)
    qbias = RNG.uniform(-1, 1, 3).astype(np.float32)
    scale = RNG.uniform(0.5, 2, c).astype(np.float32)
    shift = RNG.standard_normal(c).astype(np.float32)
    outs = ["conv", "avgpool", "maxpool", "acts", "rsqrt", "up", "pad", "norm", "probs", "d2s"]
    builder = NeuralNetworkBuilder([("data", datatypes.Array(c, h, w))],
                                   [(o, None) for o in outs])
    builder.add_convolution("conv0", kernel_channels=2, output_channels=6, height=3, width=3, stride_height=2,
                            stride_width=2, border_mode="same", groups=2, W=W.transpose(2, 3, 1, 0), b=b,
                            has_bias=True, input_name="data", output_name="conv0",
                            same_padding_asymmetry_mode="TOP_LEFT_HEAVY")
    builder.add_activation("prelu", "PRELU", "conv0", "conv", params=slopes)
    builder.add_pooling("avg", 3, 3, 2, 2, "AVERAGE", "INCLUDE_LAST_PIXEL", "data", "avgpool",
                        exclude_pad_area=False, padding_top=1, padding_bottom=1, padding_left=1,
                        padding_right=1)
    builder.add_pooling("max", 3, 3, 2, 2, "MAX", "INCLUDE_LAST_PIXEL", "data", "maxpool",
                        padding_top=1, padding_bottom=1, padding_left=1, padding_right=1)
    builder.add_activation("stanh", "SCALED_TANH", "data", "a1", params=[1.5, 0.7])
    builder.add_activation("hsig", "SIGMOID_HARD", "a1", "a2", params=[0.3, 0.4])
    builder.add_activation("lin", "LINEAR", "a2", "acts", params=[2.0, -0.5])
    builder.add_unary("abs", "data", "abs", mode="abs")
    builder.add_unary("rsqrt", "abs", "rsqrt", mode="rsqrt", shift=2.0, scale=0.5, epsilon=1e-3)
    builder.add_upsample("up", 2, 2, "data", "up", mode="BILINEAR", linear_upsample_mode="ALIGN_CORNERS_TRUE")
    builder.add_padding("pad", left=1, right=2, top=2, bottom=0, input_name="data", output_name="pad",
                        padding_type="reflection")
    builder.add_scale("scale", W=scale, b=shift, has_bias=True, input_name="data", output_name="scaled",
                      shape_scale=[c], shape_bias=[c])
    builder.add_l2_normalize("l2", "scaled", "norm", epsilon=1e-6)
    builder.add_flatten("flat", 1, "data", "flat")                   # CHANNEL_LAST
    builder.add_inner_product("fc", W=fc, b=None, input_channels=c * h * w, output_channels=5, has_bias=False,
                              input_name="flat", output_name="fc")
    builder.add_inner_product("fcq", W=q.tobytes(), b=None, input_channels=5, output_channels=3, has_bias=False,
                              input_name="fc", output_name="fcq", is_quantized_weight=True, nbits=8,
                              quantization_type="linear", quant_scale=qscale, quant_bias=qbias)
    builder.add_softmax("softmax", "fcq", "probs")
    builder.add_reorganize_data("d2s", "data", "d2s", mode="DEPTH_TO_SPACE", block_size=2)
    spec = builder.spec
    # store the first inner product's weights as float16, as quantize_weights(nbits=16) does
    ip = next(layer for layer in spec.neuralNetwork.layers if layer.name == "fc").innerProduct
    ip.weights.float16Value = fc.astype(np.float16).tobytes()
    del ip.weights.floatValue[:]
    ct.models.MLModel(spec).save(str(path))

    def ref(x):
        xp = np.pad(x, ((0, 0), (1, 0), (1, 0)))           # SAME, stride 2 on 10: one pad, top-left heavy
        conv = tf.nn.conv2d(np.transpose(xp, (1, 2, 0))[None][..., :2], np.transpose(W[:3], (2, 3, 1, 0)), 2,
                            "VALID").numpy()
        conv2 = tf.nn.conv2d(np.transpose(xp, (1, 2, 0))[None][..., 2:], np.transpose(W[3:], (2, 3, 1, 0)), 2,
                             "VALID").numpy()
        conv = np.transpose(np.concatenate([conv, conv2], -1)[0], (2, 0, 1)) + b.reshape(6, 1, 1)
        conv = np.where(conv >= 0, conv, conv * slopes.reshape(6, 1, 1))
        acts = np.clip(0.3 * (1.5 * np.tanh(0.7 * x)) + 0.4, 0, 1) * 2.0 - 0.5
        up = tf.compat.v1.image.resize_bilinear(np.transpose(x, (1, 2, 0))[None], (2 * h, 2 * w),
                                                align_corners=True).numpy()[0].transpose(2, 0, 1)
        scaled = x * scale.reshape(c, 1, 1) + shift.reshape(c, 1, 1)
        fc_out = np.transpose(x, (1, 2, 0)).reshape(-1) @ fc.astype(np.float16).astype(np.float32).T
        wq = q.astype(np.float32) * qscale.reshape(3, 1) + qbias.reshape(3, 1)
        logits = fc_out @ wq.T
        d2s = tf.nn.depth_to_space(np.transpose(x, (1, 2, 0))[None], 2).numpy()[0].transpose(2, 0, 1)
        return {
            "conv": conv, "avgpool": _caffe_pool(x, 3, 2, 1, "AVERAGE"), "maxpool": _caffe_pool(x, 3, 2, 1, "MAX"),
            "acts": acts, "rsqrt": 1 / np.sqrt(0.5 * np.abs(x) + 2.0 + 1e-3), "up": up,
            "pad": np.pad(x, ((0, 0), (2, 0), (1, 2)), mode="reflect"),
            "norm": scaled / np.sqrt((scaled ** 2).sum() + 1e-6),
            "probs": np.exp(logits) / np.exp(logits).sum(), "d2s": d2s,
        }
    return ref


def test_legacy_layers_match_numpy(tmp_path):
    path = tmp_path / "legacy.mlmodel"
    ref = _legacy_model(path)
    x = RNG.standard_normal((4, 10, 10)).astype(np.float32)
    graph, params = from_coreml(str(path))
    ys = reference.run(graph, params, {"data": x})
    want = ref(x)
    for name, y in zip(graph.outputs, ys):
        r = want[name]
        assert np.asarray(y).size == r.size, name
        assert _rel_err(y, r) <= FP32_TOL, (name, _rel_err(y, r))


# -- refusals ------------------------------------------------------------------------------------------------------

def _unsupported_model(path):
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

    builder = NeuralNetworkBuilder([("data", datatypes.Array(2, 3, 3))], [("out", None)])
    builder.add_activation("relu", "RELU", "data", "r")
    builder.add_permute("perm", (1, 0, 2, 3), "r", "p")                # moves the sequence axis: refused
    builder.add_sequence_repeat("rep", 2, "r", "q")                      # no converter
    builder.add_elementwise("sum", ["p", "q"], "out", "ADD")
    ct.models.MLModel(builder.spec).save(str(path))
    return path


def test_every_unsupported_layer_is_named_in_one_error(tmp_path):
    path = _unsupported_model(tmp_path / "unsupported.mlmodel")
    with pytest.raises(UnsupportedOpError) as err:
        to_onnx(str(path))
    msg = str(err.value)
    assert "\n" not in msg
    assert "sequenceRepeat (layer rep, spec version" in msg and "permute (layer perm, spec version" in msg
    rows = {r["op_type"]: r for r in op_coverage(str(path))}
    assert not rows["sequenceRepeat"]["covered"] and rows["sequenceRepeat"]["nodes"] == ["rep"]


def test_corrupt_files_are_invalid_input(converted, tmp_path):
    data = pathlib.Path(converted[("cnn", "mlmodel")][0]).read_bytes()
    cut = tmp_path / "cut.mlmodel"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(InvalidInput, match="cut.mlmodel"):
        to_onnx(str(cut))
    pkg = tmp_path / "pkg.mlpackage"
    shutil.copytree(converted[("cnn", "mlpackage-fp16")][0], pkg)
    weights = pkg / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(InvalidInput, match="weight.bin"):
        to_onnx(str(pkg))
    (pkg / "Manifest.json").write_text("{}")
    with pytest.raises(InvalidInput, match="Manifest.json"):
        to_onnx(str(pkg))


# -- the command line ----------------------------------------------------------------------------------------------

def test_cli_compiles_and_checks_core_ml_files(converted, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    runner = CliRunner()
    out = tmp_path / "out"
    res = runner.invoke(cli, ["compile", converted[("cnn", "mlmodel")][0], "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "deploy.json").exists() and (out / "deploy.so").exists()
    res = runner.invoke(cli, ["compile", "--check", converted[("attention", "mlpackage-fp16")][0]])
    assert res.exit_code == 0, res.output
    assert "matmul" in res.output and "CoreML" in res.output and "0 not covered" in res.output


def test_cli_names_every_unsupported_layer_in_one_line(tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    path = _unsupported_model(tmp_path / "unsupported.mlmodel")
    res = CliRunner().invoke(cli, ["compile", str(path), "-o", str(tmp_path / "o")])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "sequenceRepeat (layer rep" in lines[0] and "permute (layer perm" in lines[0]


def test_cli_refuses_a_corrupt_mlmodel_in_one_line(converted, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    data = pathlib.Path(converted[("cnn", "mlmodel")][0]).read_bytes()
    bad = tmp_path / "broken.mlmodel"
    bad.write_bytes(data[:len(data) // 3])
    res = CliRunner().invoke(cli, ["compile", str(bad), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "broken.mlmodel" in lines[0] and "Traceback" not in res.output
    assert "not a valid Core ML model" in lines[0]
    assert not (tmp_path / "o").exists()


# -- the emulated aarch64 device -----------------------------------------------------------------------------------

@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_runs_a_converted_core_ml_cnn(emulated_devices, converted, tmp_path):
    device = emulated_devices.for_preset("rasp4b")
    path, name, x, ref = converted[("cnn", "mlmodel")]
    graph, params = from_coreml(path)
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(**{name: x})
            assert _rel_err(gm.get_output(0), ref) <= FP32_TOL


def test_package_weights_stay_in_the_package(converted):
    """The blob consts read weight.bin beside the spec: a package moved elsewhere still reads."""
    path = converted[("cnn", "mlpackage-fp32")][0]
    assert os.path.isfile(os.path.join(path, "Data", "com.apple.CoreML", "weights", "weight.bin"))
    model = to_onnx(path)
    assert sum(np.prod(t.dims) for t in model.graph.initializer) > 1000
    # a coremltools MLModel object reads the same weights
    _, name, x, ref = converted[("cnn", "mlpackage-fp32")]
    (y,) = reference.run(*from_coreml(ct.models.MLModel(path, skip_model_load=True)), {name: x})
    assert _rel_err(y, ref) <= FP32_TOL


# -- ML Program operations from coremltools' MIL builder, against numpy ------------------------------------------------

def _np_conv(x, w, stride, dil, pads, groups):
    """NCHW convolution; pads (top, bottom, left, right)."""
    x = np.pad(x, ((0, 0), (0, 0), pads[:2], pads[2:]))
    n, c, h, wd = x.shape
    co, ci, kh, kw = w.shape
    oh = (h - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (wd - (kw - 1) * dil[1] - 1) // stride[1] + 1
    y = np.zeros((n, co, oh, ow), np.float64)
    per = co // groups
    for gi in range(groups):
        xs = x[:, gi * ci:(gi + 1) * ci]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dil[0]:i * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                           j * dil[1]:j * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
                y[:, gi * per:(gi + 1) * per] += np.einsum("nchw,oc->nohw", patch, w[gi * per:(gi + 1) * per, :, i, j])
    return y


def _np_avg_pool_ceil(x, k, s):
    """Average pooling with ceil_mode, padding excluded from the average (windows clipped to the input)."""
    n, c, h, w = x.shape
    oh, ow = -(-(h - k[0]) // s[0]) + 1, -(-(w - k[1]) // s[1]) + 1
    y = np.zeros((n, c, oh, ow), np.float32)
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = x[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].mean(axis=(2, 3))
    return y


def test_ml_program_operations_match_numpy(tmp_path):
    from coremltools.converters.mil import Builder as mb

    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    wt = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    gamma = np.arange(1, 5, dtype=np.float32)
    slopes = np.array([0.1, 0.2, 0.3, 0.4], np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4, 7, 9))], opset_version=ct.target.iOS16)
    def prog(x):
        return (
            mb.conv(x=x, weight=w, pad_type="custom", pad=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2], groups=2,
                    name="conv"),
            mb.conv_transpose(x=x, weight=wt, pad_type="same", strides=[2, 2], name="conv_t"),
            mb.upsample_nearest_neighbor(x=x, scale_factor_height=2, scale_factor_width=3, name="up"),
            mb.resize_bilinear(x=x, target_size_height=5, target_size_width=13, sampling_mode="UNALIGN_CORNERS",
                               name="resize"),
            mb.upsample_bilinear(x=x, scale_factor_height=2.0, scale_factor_width=2.0, align_corners=False,
                                 half_pixel_centers=False, name="up_bilinear"),
            mb.instance_norm(x=x, gamma=gamma, beta=np.ones(4, np.float32), epsilon=1e-5, name="inorm"),
            mb.layer_norm(x=x, axes=[1, 3], epsilon=1e-5, name="lnorm"),
            mb.slice_by_index(x=x, begin=[0, 1, 0, 8], end=[1, 4, 7, 0], stride=[1, 2, -2, -3],
                              begin_mask=[False, False, True, False], end_mask=[False, False, True, True],
                              squeeze_mask=[True, False, False, False], name="sliced"),
            mb.split(x=x, split_sizes=[1, 3], axis=1, name="split")[1],
            mb.pad(x=x, pad=[1, 2, 2, 1], mode="reflect", name="padded"),
            mb.gather(x=x, indices=np.array([2, 0], np.int32), axis=3, name="gathered"),
            mb.clip(x=x, alpha=-0.5, beta=0.7, name="clipped"),
            mb.reduce_max(x=x, axes=[2], keep_dims=False, name="rmax"),
            mb.reduce_argmax(x=x, axis=1, keep_dims=True, name="argmax"),
            mb.cast(x=mb.mul(x=x, y=3.0), dtype="int32", name="as_int"),
            mb.max_pool(x=x, kernel_sizes=[3, 3], strides=[2, 2], pad_type="same", name="maxpool"),
            mb.avg_pool(x=x, kernel_sizes=[2, 3], strides=[2, 2], pad_type="valid", ceil_mode=True,
                        exclude_padding_from_average=True, name="avgpool"),
            mb.squeeze(x=mb.expand_dims(x=x, axes=[0]), axes=[0], name="same"),
            mb.softmax(x=x, axis=2, name="softmax"),
            mb.thresholded_relu(x=x, alpha=0.3, name="trelu"),
            mb.prelu(x=x, alpha=slopes, name="prelu"),
        )
    ml = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
                    compute_precision=ct.precision.FLOAT32)
    path = tmp_path / "ops.mlpackage"
    ml.save(str(path))
    x = RNG.standard_normal((1, 4, 7, 9)).astype(np.float32)
    nhwc = np.transpose(x, (0, 2, 3, 1))
    mean = x.mean(axis=(1, 3), keepdims=True)
    var = x.var(axis=(1, 3), keepdims=True)
    e = np.exp(x - x.max(axis=2, keepdims=True))
    want = {
        "conv": _np_conv(x, w, (2, 1), (1, 2), (1, 0, 2, 1), 2),
        "conv_t": tf.nn.conv2d_transpose(nhwc, np.transpose(wt, (2, 3, 1, 0)), (1, 14, 18, 3), 2, "SAME").numpy()
        .transpose(0, 3, 1, 2),
        "up": np.repeat(np.repeat(x, 2, axis=2), 3, axis=3),
        "resize": tf.image.resize(nhwc, (5, 13), "bilinear").numpy().transpose(0, 3, 1, 2),
        "up_bilinear": tf.compat.v1.image.resize_bilinear(nhwc, (14, 18), align_corners=False,
                                                          half_pixel_centers=False).numpy().transpose(0, 3, 1, 2),
        "inorm": (x - x.mean(axis=(2, 3), keepdims=True)) / np.sqrt(x.var(axis=(2, 3), keepdims=True) + 1e-5)
        * gamma.reshape(1, 4, 1, 1) + 1,
        "lnorm": (x - mean) / np.sqrt(var + 1e-5),
        "sliced": x[0, 1:4:2, ::-2, 8::-3],
        "split_1": x[:, 1:],
        "padded": np.pad(x, ((0, 0), (0, 0), (1, 2), (2, 1)), mode="reflect"),
        "gathered": x[..., [2, 0]],
        "clipped": np.clip(x, -0.5, 0.7),
        "rmax": x.max(axis=2),
        "argmax": x.argmax(axis=1)[:, None].astype(np.int32),
        "as_int": np.trunc(x * 3).astype(np.int32),
        "maxpool": tf.nn.max_pool2d(nhwc, 3, 2, "SAME").numpy().transpose(0, 3, 1, 2),
        "avgpool": _np_avg_pool_ceil(x, (2, 3), (2, 2)),
        "same": x,
        "softmax": e / e.sum(axis=2, keepdims=True),
        "trelu": np.where(x > 0.3, x, 0),
        "prelu": np.where(x >= 0, x, x * slopes.reshape(1, 4, 1, 1)),
    }
    graph, params = from_coreml(str(path))
    assert set(graph.outputs) == set(want)
    for name, y in zip(graph.outputs, reference.run(graph, params, {"x": x})):
        ref = want[name]
        assert np.asarray(y).shape == ref.shape, name
        if ref.dtype.kind == "i":
            np.testing.assert_array_equal(y, ref, err_msg=name)
        else:
            assert _rel_err(y, ref) <= FP32_TOL, (name, _rel_err(y, ref))


# -- compressed weights ----------------------------------------------------------------------------------------------

def _small_convnet():
    inp = tf.keras.Input((8, 8, 3), batch_size=1, name="x")
    y = K.Conv2D(16, 3, activation="relu")(inp)
    return tf.keras.Model(inp, K.Dense(8)(K.Flatten()(y)))


def test_compressed_ml_program_weights_decompress_as_coremltools_does(tmp_path):
    """constexpr ops (affine dequantize, lookup tables, blockwise shift-scale incl. int4 blobs) against the same
    model after coremltools' own decompress_weights."""
    import coremltools.optimize.coreml as cto

    model = _small_convnet()
    x = RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    cases = {
        (ct.target.iOS16, "affine"): (cto.linear_quantize_weights, cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", weight_threshold=10)),
        (ct.target.iOS16, "lut"): (cto.palettize_weights, cto.OpPalettizerConfig(
            mode="kmeans", nbits=4, weight_threshold=10)),
        (ct.target.iOS18, "blockwise"): (cto.linear_quantize_weights, cto.OpLinearQuantizerConfig(
            mode="linear", granularity="per_block", block_size=8, weight_threshold=10)),
        (ct.target.iOS18, "int4"): (cto.linear_quantize_weights, cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int4", granularity="per_block", block_size=16, weight_threshold=10)),
        (ct.target.iOS18, "grouped-lut"): (cto.palettize_weights, cto.OpPalettizerConfig(
            mode="kmeans", nbits=3, granularity="per_grouped_channel", group_size=4, weight_threshold=10)),
    }
    sources = {}
    for (target, name), (compress, op_config) in cases.items():
        if target not in sources:
            sources[target] = _convert(model, (1, 8, 8, 3), "x", tmp_path / ("src%s.mlpackage" % target.value),
                                       convert_to="mlprogram", minimum_deployment_target=target,
                                       compute_precision=ct.precision.FLOAT32)
        compressed = compress(ct.models.MLModel(str(sources[target]), skip_model_load=True),
                              cto.OptimizationConfig(global_config=op_config))
        paths = [tmp_path / (name + ".mlpackage"), tmp_path / (name + "-dense.mlpackage")]
        compressed.save(str(paths[0]))
        cto.decompress_weights(compressed).save(str(paths[1]))
        assert any(r["op_type"].startswith("constexpr_") for r in op_coverage(str(paths[0]))), name
        y, dense = (reference.run(*from_coreml(str(p)), {"x": x})[0] for p in paths)
        assert _rel_err(y, dense) <= 1e-6, name


def test_quantized_neural_network_weights(converted, tmp_path):
    """fp16, 8- and 4-bit linear and 4-bit lookup-table weights (quantization_utils.quantize_weights) against the
    Keras model, within each width's rounding."""
    from coremltools.models.neural_network import quantization_utils

    path, name, x, ref = converted[("cnn", "mlmodel")]
    source = ct.models.MLModel(path, skip_model_load=True)
    for bits, mode, tol in ((16, "linear", FP16_TOL), (8, "linear", 1e-2), (4, "linear", 5e-2),
                            (4, "linear_lut", 5e-2)):
        q = tmp_path / ("q%d%s.mlmodel" % (bits, mode))
        quantization_utils.quantize_weights(source, nbits=bits, quantization_mode=mode).save(str(q))
        (y,) = reference.run(*from_coreml(str(q)), {name: x})
        assert _rel_err(y, ref) <= tol, (bits, mode, _rel_err(y, ref))


# -- ND layers (exact shape mapping) from NeuralNetworkBuilder, against numpy ---------------------------------------

def test_nd_layers_match_numpy(tmp_path):
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder
    from scipy.special import erf

    shape = (2, 3, 4, 5)
    wmat = RNG.standard_normal((5, 6)).astype(np.float32)
    bias = RNG.standard_normal(6).astype(np.float32)
    gamma = RNG.uniform(0.5, 1.5, 5).astype(np.float32)
    beta = RNG.standard_normal(5).astype(np.float32)
    table = RNG.standard_normal((4, 7)).astype(np.float32)      # [embedding size, vocab], as Core ML stores it
    mean, var = RNG.standard_normal(3).astype(np.float32), RNG.uniform(0.5, 2, 3).astype(np.float32)
    outs = ["sliced", "split1", "cat", "gathered", "squeezed", "rsum", "argmax", "where", "clipped", "lnorm",
            "gelu", "embedded", "tiled", "stacked", "matmul", "bmm", "flat2d", "cpad", "reversed", "cumsum",
            "onehot", "mod", "fdiv", "tril", "softmax", "reshaped", "topk_v", "topk_i", "minimum", "bnorm", "inorm",
            "mvn", "lrn", "crop", "creduce", "clamped", "erf"]
    builder = NeuralNetworkBuilder([("x", datatypes.Array(*shape)), ("ids", datatypes.Array(3, 1)),
                                    ("y", datatypes.Array(*shape))],
                                   [(o, None) for o in outs], disable_rank5_shape_mapping=True)
    builder.add_slice_static("slice", "x", "sliced", begin_ids=[1, 0, 3, 0], end_ids=[2, 3, 0, 5],
                             strides=[1, 2, -1, 2], begin_masks=[False, True, False, False],
                             end_masks=[False, False, True, False], squeeze_masks=[True, False, False, False])
    builder.add_split_nd("split", "x", ["split0", "split1"], axis=3, split_sizes=[2, 3])
    builder.add_concat_nd("cat", ["x", "y"], "cat", axis=-2)
    builder.add_load_constant_nd("idx", "idx", np.array([3, 0, 3], np.float32), shape=[3])
    builder.add_gather("gather", ["x", "idx"], "gathered", axis=2)
    builder.add_slice_static("first", "x", "first", begin_ids=[0, 0, 0, 0], end_ids=[1, 3, 4, 1],
                             strides=[1, 1, 1, 1], begin_masks=[True] * 4, end_masks=[False] * 4)
    builder.add_squeeze("squeeze", "first", "squeezed", axes=[0, 3])
    builder.add_reduce_sum("rsum", "x", "rsum", axes=[1, 3], keepdims=False)
    builder.add_argmax("argmax", "x", "argmax", axis=2, keepdims=False)
    builder.add_greater_than("gt", ["x", "y"], "gt")
    builder.add_where_broadcastable("where", ["gt", "x", "y"], "where")
    builder.add_clip("clip", "x", "clipped", min_value=-0.3, max_value=0.6)
    builder.add_layer_normalization("lnorm", "x", "lnorm", normalized_shape=[5], gamma=gamma, beta=beta, eps=1e-5)
    builder.add_gelu("gelu", "x", "gelu", mode="EXACT")
    builder.add_embedding_nd("embed", "ids", "embedded", vocab_size=7, embedding_size=4, W=table)
    builder.add_tile("tile", "x", "tiled", reps=[1, 2, 1, 3])
    builder.add_stack("stack", ["x", "y"], "stacked", axis=1)
    builder.add_batched_mat_mul("matmul", ["x"], "matmul", weight_matrix_rows=5, weight_matrix_columns=6, W=wmat,
                                bias=bias)
    builder.add_batched_mat_mul("bmm", ["x", "y"], "bmm", transpose_b=True)
    builder.add_flatten_to_2d("flat", "x", "flat2d", axis=2)
    builder.add_constant_pad("cpad", ["x"], "cpad", value=1.5, pad_amounts=[0, 0, 1, 0, 2, 1, 0, 3])
    builder.add_reverse("reverse", "x", "reversed", reverse_dim=[False, True, False, True])
    builder.add_cumsum("cumsum", ["x"], "cumsum", axis=2, reverse=True, exclusive=True)
    builder.add_one_hot("onehot", ["ids"], "onehot", one_hot_vector_size=7, axis=-1, on_value=2.0, off_value=-1.0)
    builder.add_mod_broadcastable("mod", ["x", "y"], "mod")
    builder.add_floor_div_broadcastable("fdiv", ["x", "y"], "fdiv")
    builder.add_lower_triangular("tril", "x", "tril", k=1)
    builder.add_softmax_nd("softmax", "x", "softmax", axis=1)
    builder.add_rank_preserving_reshape("reshape", "x", "reshaped", output_shape=[0, -1, 2, 5])
    builder.add_topk("topk", ["x"], ["topk_v", "topk_i"], k=2, axis=3, use_bottom_k=True)
    builder.add_elementwise("min", ["x", "y"], "minimum", "MIN")
    builder.add_batchnorm("bn", 3, np.ones(3, np.float32), np.zeros(3, np.float32), mean, var, "x", "bnorm")
    builder.add_batchnorm("in", 3, np.full(3, 2.0, np.float32), np.ones(3, np.float32), input_name="x",
                          output_name="inorm", compute_mean_var=True, instance_normalization=True)
    builder.add_mvn("mvn", "x", "mvn", across_channels=False, normalize_variance=True, epsilon=1e-5)
    builder.add_lrn("lrn", "x", "lrn", alpha=0.3, beta=0.75, local_size=3, k=2.0)
    builder.add_crop("crop", left=1, right=2, top=0, bottom=1, offset=[], input_names=["x"], output_name="crop")
    builder.add_reduce("creduce", "x", "creduce", axis="C", mode="L2")
    builder.add_clamped_relu("clamped", "x", "clamped", alpha=0.2, beta=0.5)
    builder.add_erf("erf", "x", "erf")
    path = tmp_path / "nd.mlmodel"
    ct.models.MLModel(builder.spec).save(str(path))

    x = RNG.standard_normal(shape).astype(np.float32)
    y = RNG.standard_normal(shape).astype(np.float32)
    y = np.where(np.abs(y) < 0.2, 0.5, y).astype(np.float32)          # no division by ~0 in mod and floor_div
    ids = np.array([[1], [6], [3]], np.float32)
    mu, sd = x.mean(-1, keepdims=True), x.std(-1, keepdims=True)
    e = np.exp(x - x.max(1, keepdims=True))
    sq = np.pad(x ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    lrn_sum = sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:]
    order = np.argsort(x, axis=3, kind="stable")[..., :2]
    m_hw, v_hw = x.mean((2, 3), keepdims=True), x.var((2, 3), keepdims=True)
    want = {
        "sliced": x[1, :3:2, 3::-1, 0:5:2], "split1": x[..., 2:], "cat": np.concatenate([x, y], -2),
        "gathered": x[:, :, [3, 0, 3]], "squeezed": x[0, :, :, 0], "rsum": x.sum((1, 3)),
        "argmax": x.argmax(2).astype(np.float32), "where": np.where(x > y, x, y), "clipped": np.clip(x, -0.3, 0.6),
        "lnorm": (x - mu) / np.sqrt(sd ** 2 + 1e-5) * gamma + beta, "gelu": 0.5 * x * (1 + erf(x / np.sqrt(2))),
        "embedded": table.T[ids[:, 0].astype(int)], "tiled": np.tile(x, (1, 2, 1, 3)),
        "stacked": np.stack([x, y], 1), "matmul": x @ wmat + bias, "bmm": x @ np.swapaxes(y, -1, -2),
        "flat2d": x.reshape(6, 20), "cpad": np.pad(x, ((0, 0), (1, 0), (2, 1), (0, 3)), constant_values=1.5),
        "reversed": x[:, ::-1, :, ::-1], "cumsum": np.flip(np.cumsum(np.flip(x, 2), 2), 2) - x,
        "onehot": np.where(np.arange(7) == ids[..., None], 2.0, -1.0), "mod": x - np.floor(x / y) * y,
        "fdiv": np.floor(x / y), "tril": np.tril(x, 1), "softmax": e / e.sum(1, keepdims=True),
        "reshaped": x.reshape(2, 6, 2, 5), "topk_v": np.take_along_axis(x, order, 3),
        "topk_i": order.astype(np.float32), "minimum": np.minimum(x, y),
        "bnorm": (x - mean.reshape(3, 1, 1)) / np.sqrt(var.reshape(3, 1, 1) + 1e-5),
        "inorm": (x - m_hw) / np.sqrt(v_hw + 1e-5) * 2 + 1, "mvn": (x - m_hw) / np.sqrt(v_hw + 1e-5),
        "lrn": x / (2.0 + 0.3 / 3 * lrn_sum) ** 0.75, "crop": x[:, :, 0:3, 1:3],
        "creduce": np.sqrt((x ** 2).sum(1, keepdims=True)), "clamped": np.minimum(np.where(x >= 0, x, 0.2 * x), 0.5),
        "erf": erf(x),
    }
    graph, params = from_coreml(str(path))
    assert set(graph.outputs) == set(want)
    results = reference.run(graph, params, {"x": x, "y": y, "ids": ids})
    for name, got in zip(graph.outputs, results):
        ref = np.asarray(want[name], np.float32)
        assert np.asarray(got).shape == ref.shape, (name, np.asarray(got).shape, ref.shape)
        assert _rel_err(got, ref) <= FP32_TOL, (name, _rel_err(got, ref))


@pytest.mark.parametrize("convert_to", ["neuralnetwork", "mlprogram"])
def test_flexible_input_shapes_take_the_shape_given(tmp_path, convert_to):
    inp = tf.keras.Input((None, 16), batch_size=1, name="tokens")
    model = tf.keras.Model(inp, K.Dense(8, activation="relu")(inp))
    ext = "mlmodel" if convert_to == "neuralnetwork" else "mlpackage"
    precision = ct.precision.FLOAT32 if convert_to == "mlprogram" else None
    path = _convert(model, (1, None, 16), "tokens", tmp_path / ("flex." + ext), convert_to=convert_to,
                    compute_precision=precision)
    for length in (4, 9):                     # the model's default, and another length in its range
        x = RNG.standard_normal((1, length, 16)).astype(np.float32)
        graph, params = from_coreml(str(path), shape={"tokens": [1, length, 16]})
        (y,) = reference.run(graph, params, {"tokens": x})
        assert _rel_err(y, model(x).numpy()) <= FP32_TOL


def test_ml_program_attention_crop_and_argsort_match_numpy(tmp_path):
    from coremltools.converters.mil import Builder as mb

    mask = RNG.uniform(size=(5, 6)) > 0.3
    mask[:, 0] = True

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 5, 8)), mb.TensorSpec(shape=(2, 6, 8)),
                             mb.TensorSpec(shape=(2, 6, 4))], opset_version=ct.target.iOS18)
    def prog(q, k, v):
        return (mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=mask, name="att"),
                mb.crop(x=q, crop_height=[1, 2], crop_width=[0, 3], name="cropped"),
                mb.argsort(x=q, axis=1, ascending=True, name="order"))
    path = tmp_path / "attention.mlpackage"
    ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
               compute_precision=ct.precision.FLOAT32).save(str(path))
    q, k, v = (RNG.standard_normal(s).astype(np.float32) for s in ((2, 5, 8), (2, 6, 8), (2, 6, 4)))
    graph, params = from_coreml(str(path))
    got = dict(zip(graph.outputs, reference.run(graph, params, {"q": q, "k": k, "v": v})))
    scores = np.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(8), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    assert _rel_err(got["att"], (weights / weights.sum(-1, keepdims=True)) @ v) <= FP32_TOL
    np.testing.assert_array_equal(got["cropped"], q[:, 1:3, 0:5])
    np.testing.assert_array_equal(got["order"], np.argsort(q, axis=1, kind="stable"))


def test_ml_program_lstm_and_gru_match_core_ml_formulas(tmp_path):
    """The recurrences as coremltools' runtime-checked op tests write them: LSTM gates (input, forget, output, cell)
    with peepholes (the output gate's on the new cell state); GRU gates (reset, output, update) with the reset
    gate scaling the state before its matmul."""
    from coremltools.converters.mil import Builder as mb

    steps, batch, n_in, hidden = 5, 2, 3, 4

    def u(*shape):
        return RNG.uniform(-0.5, 0.5, shape).astype(np.float32)
    wx, wh, bias, peep = u(4 * hidden, n_in), u(4 * hidden, hidden), u(4 * hidden), u(3 * hidden)
    gx, gh, gbias = u(3 * hidden, n_in), u(3 * hidden, hidden), u(3 * hidden)
    h0, c0 = u(batch, hidden), u(batch, hidden)

    @mb.program(input_specs=[mb.TensorSpec(shape=(steps, batch, n_in))], opset_version=ct.target.iOS16)
    def prog(x):
        y, h, c = mb.lstm(x=x, initial_h=h0, initial_c=c0, weight_ih=wx, weight_hh=wh, bias=bias, peephole=peep,
                          output_sequence=True, name="lstm")
        gy, gh_last = mb.gru(x=x, initial_h=h0, weight_ih=gx, weight_hh=gh, bias=gbias, name="gru")
        return y, h, c, gy, gh_last
    path = tmp_path / "rnn.mlpackage"
    ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
               compute_precision=ct.precision.FLOAT32).save(str(path))
    x = RNG.standard_normal((steps, batch, n_in)).astype(np.float32)

    def sig(v):
        return 1 / (1 + np.exp(-v))
    (wi, wf, wo, wg), (ri, rf, ro, rg) = np.split(wx, 4), np.split(wh, 4)
    (bi, bf, bo, bg), (pi, pf, po) = np.split(bias, 4), np.split(peep, 3)
    h, c, ys = h0, c0, []
    for t in range(steps):
        i = sig(x[t] @ wi.T + h @ ri.T + bi + c * pi)
        f = sig(x[t] @ wf.T + h @ rf.T + bf + c * pf)
        c = f * c + i * np.tanh(x[t] @ wg.T + h @ rg.T + bg)
        h = sig(x[t] @ wo.T + h @ ro.T + bo + c * po) * np.tanh(c)
        ys.append(h)
    (gr, go, gz), (hr, ho, hz), (br, bo2, bz) = np.split(gx, 3), np.split(gh, 3), np.split(gbias, 3)
    hg = h0
    for t in range(steps):
        z = sig(x[t] @ gz.T + hg @ hz.T + bz)
        r = sig(x[t] @ gr.T + hg @ hr.T + br)
        hg = (1 - z) * np.tanh(x[t] @ go.T + (hg * r) @ ho.T + bo2) + z * hg
    graph, params = from_coreml(str(path))
    got = reference.run(graph, params, {"x": x})
    for y, ref in zip(got, (np.stack(ys), h, c, hg[None], hg)):
        assert np.asarray(y).shape == ref.shape
        assert _rel_err(y, ref) <= FP32_TOL


def test_neural_network_recurrent_layers_match_numpy(tmp_path):
    """uni- and biDirectionalLSTM (peepholes, cell state clipped), gru and simpleRecurrent on
    [Seq, Batch, C, 1, 1]."""
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

    steps, n_in, hidden, clip = 4, 3, 5, 0.3

    def u(*shape):
        return RNG.uniform(-0.5, 0.5, shape).astype(np.float32)
    lx, lh, lb, peep = [u(hidden, n_in) for _ in range(4)], [u(hidden, hidden) for _ in range(4)], \
        [u(hidden) for _ in range(4)], [u(hidden) for _ in range(3)]      # gates i, f, o, z
    gx, gh, gb = [u(hidden, n_in) for _ in range(3)], [u(hidden, hidden) for _ in range(3)], \
        [u(hidden) for _ in range(3)]                                     # gates z, r, o
    rx, rh, rb = u(hidden, n_in), u(hidden, hidden), u(hidden)
    bx, bh, bb = [u(hidden, n_in) for _ in range(4)], [u(hidden, hidden) for _ in range(4)], \
        [u(hidden) for _ in range(4)]                                     # the backward LSTM's
    builder = NeuralNetworkBuilder([("x", datatypes.Array(steps, 1, n_in, 1, 1))],
                                   [(o, None) for o in ("y", "h", "c", "gru_last", "rnn_seq", "bi")],
                                   disable_rank5_shape_mapping=True)
    builder.add_bidirlstm("bilstm", W_h=lh, W_x=lx, b=lb, W_h_back=bh, W_x_back=bx, b_back=bb, hidden_size=hidden,
                          input_size=n_in, input_names=["x"], output_names=["bi", "bhf", "bcf", "bhb", "bcb"],
                          output_all=True)
    builder.add_unilstm("lstm", W_h=lh, W_x=lx, b=lb, hidden_size=hidden, input_size=n_in, input_names=["x"],
                        output_names=["y", "h", "c"], peep=peep, output_all=True, cell_clip_threshold=clip)
    builder.add_gru("gru", W_h=gh, W_x=gx, b=gb, hidden_size=hidden, input_size=n_in, input_names=["x"],
                    output_names=["gru_last", "gru_h"], inner_activation="SIGMOID")
    builder.add_simple_rnn("rnn", W_h=rh, W_x=rx, b=rb, hidden_size=hidden, input_size=n_in, activation="TANH",
                           input_names=["x"], output_names=["rnn_seq", "rnn_h"], output_all=True)
    path = tmp_path / "recurrent.mlmodel"
    ct.models.MLModel(builder.spec).save(str(path))
    x = RNG.standard_normal((steps, 1, n_in, 1, 1)).astype(np.float32)
    xs = x.reshape(steps, n_in)

    def sig(v):
        return 1 / (1 + np.exp(-v))
    h, c, ys = np.zeros(hidden), np.zeros(hidden), []
    for t in range(steps):
        i = sig(lx[0] @ xs[t] + lh[0] @ h + lb[0] + peep[0] * c)
        f = sig(lx[1] @ xs[t] + lh[1] @ h + lb[1] + peep[1] * c)
        c = np.clip(f * c + i * np.tanh(lx[3] @ xs[t] + lh[3] @ h + lb[3]), -clip, clip)
        h = sig(lx[2] @ xs[t] + lh[2] @ h + lb[2] + peep[2] * c) * np.tanh(c)
        ys.append(h)
    hg, hr, rs = np.zeros(hidden), np.zeros(hidden), []
    for t in range(steps):
        z = sig(gx[0] @ xs[t] + gh[0] @ hg + gb[0])
        r = sig(gx[1] @ xs[t] + gh[1] @ hg + gb[1])
        hg = (1 - z) * np.tanh(gx[2] @ xs[t] + gh[2] @ (hg * r) + gb[2]) + z * hg
        hr = np.tanh(rx @ xs[t] + rh @ hr + rb)
        rs.append(hr)
    def lstm(wx_, wh_, b_, seq, clip_=None, peep_=None):
        h_, c_, out = np.zeros(hidden), np.zeros(hidden), []
        p_ = peep_ or [np.zeros(hidden)] * 3
        for xt in seq:
            i_ = sig(wx_[0] @ xt + wh_[0] @ h_ + b_[0] + p_[0] * c_)
            f_ = sig(wx_[1] @ xt + wh_[1] @ h_ + b_[1] + p_[1] * c_)
            c_ = f_ * c_ + i_ * np.tanh(wx_[3] @ xt + wh_[3] @ h_ + b_[3])
            c_ = np.clip(c_, -clip_, clip_) if clip_ else c_
            h_ = sig(wx_[2] @ xt + wh_[2] @ h_ + b_[2] + p_[2] * c_) * np.tanh(c_)
            out.append(h_)
        return out
    # each time step pairs the forward output with the backward one of the same input position
    bi = np.concatenate([np.stack(lstm(lx, lh, lb, xs)), np.stack(lstm(bx, bh, bb, xs[::-1])[::-1])], axis=-1)
    want = {"y": np.stack(ys).reshape(steps, 1, hidden, 1, 1), "h": h.reshape(1, 1, hidden, 1, 1),
            "c": c.reshape(1, 1, hidden, 1, 1), "gru_last": hg.reshape(1, 1, hidden, 1, 1),
            "rnn_seq": np.stack(rs).reshape(steps, 1, hidden, 1, 1), "bi": bi.reshape(steps, 1, 2 * hidden, 1, 1)}
    graph, params = from_coreml(str(path))
    for name, y in zip(graph.outputs, reference.run(graph, params, {"x": x})):
        assert np.asarray(y).shape == want[name].shape, name
        assert _rel_err(y, want[name]) <= FP32_TOL, (name, _rel_err(y, want[name]))
