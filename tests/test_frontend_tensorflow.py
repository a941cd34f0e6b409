"""The TensorFlow frontend: frozen GraphDefs and SavedModels made by TensorFlow at test time, read without it,
compiled by tether and compared with TensorFlow on the same input."""
import os

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import tether  # noqa: E402
from tether import graph_executor, rpc  # noqa: E402
from tether.errors import InvalidInput, UnsupportedOpError  # noqa: E402
from tether.frontend import from_tensorflow  # noqa: E402
from tether.frontend.detect import detect  # noqa: E402
from tether.frontend.tensorflow import to_onnx  # noqa: E402

REL_TOL = 1e-4        # max |tether - tensorflow| relative to max |tensorflow|


def _tf():
    import tensorflow as tf
    return tf


def _randomize_batch_norms(model, rng):
    """Random statistics and affine terms, so a batch norm is no identity and a layout slip shows."""
    tf = _tf()
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, c), rng.normal(0, 0.2, c), rng.normal(0, 0.2, c),
                               rng.uniform(0.5, 1.5, c)])


def _small_resnet(tf):
    """The ResNet-50 bottleneck block (1x1, 3x3, 1x1 convolutions, batch norms, a projection shortcut, the add)
    in two stages behind ResNet's stem, at a size this box compiles quickly."""
    layers = tf.keras.layers

    def block(x, filters, stride):
        shortcut = layers.Conv2D(4 * filters, 1, strides=stride)(x)
        shortcut = layers.BatchNormalization(epsilon=1.001e-5)(shortcut)
        x = layers.Conv2D(filters, 1, strides=stride)(x)
        x = layers.Activation("relu")(layers.BatchNormalization(epsilon=1.001e-5)(x))
        x = layers.Conv2D(filters, 3, padding="same")(x)
        x = layers.Activation("relu")(layers.BatchNormalization(epsilon=1.001e-5)(x))
        x = layers.BatchNormalization(epsilon=1.001e-5)(layers.Conv2D(4 * filters, 1)(x))
        return layers.Activation("relu")(layers.Add()([shortcut, x]))

    inp = layers.Input((32, 32, 3))
    x = layers.ZeroPadding2D(3)(inp)
    x = layers.Conv2D(16, 7, strides=2)(x)
    x = layers.Activation("relu")(layers.BatchNormalization(epsilon=1.001e-5)(x))
    x = layers.MaxPooling2D(3, strides=2)(layers.ZeroPadding2D(1)(x))
    x = block(x, 8, 1)
    x = block(x, 16, 2)
    x = layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inp, layers.Dense(10)(x))


def _keras_layers(tf):
    """Keras layers whose TensorFlow graphs take patterns of their own: a dilated separable convolution
    (SpaceToBatchND, depthwise, BatchToSpaceND), transposed convolutions whose output size is packed from the
    run-time batch size, upsampling (nearest and bilinear), layer norm, PReLU, exact GELU (Erfc), pools, dense."""
    L = tf.keras.layers
    inp = L.Input((16, 16, 3))
    x = L.Conv2D(8, 3, padding="same", activation="swish")(inp)
    x = L.SeparableConv2D(8, 3, padding="same", dilation_rate=2)(x)
    x = L.LayerNormalization()(x)
    y = L.Conv2DTranspose(6, 3, strides=2, padding="same")(x)
    y2 = L.Conv2DTranspose(6, 3, strides=2, padding="valid")(x)
    z = L.Concatenate()([y, L.UpSampling2D(2)(x), L.UpSampling2D(2, interpolation="bilinear")(x)])
    z = L.PReLU(shared_axes=[1, 2])(z)
    z = L.DepthwiseConv2D(3, strides=2, padding="same")(z)
    z = L.Activation("gelu")(L.BatchNormalization()(z))
    h = L.Concatenate()([L.GlobalMaxPooling2D()(z), L.Flatten()(L.AveragePooling2D(2)(z)),
                         L.GlobalAveragePooling2D()(y2)])
    h = L.Dropout(0.5)(L.Dense(16, activation="tanh")(h))
    out = L.Softmax()(L.Dense(5)(h) * L.Dense(5, activation="sigmoid")(h))
    return tf.keras.Model(inp, out)


def _freeze(tf, fn, specs):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(fn.get_concrete_function(*specs))
    return frozen.graph.as_graph_def().SerializeToString(), [t.name for t in frozen.outputs], \
        [t.name.split(":")[0] for t in frozen.inputs]


@pytest.fixture(scope="module")
def keras_models(tmp_path_factory):
    """MobileNet (alpha 0.25, 64x64), a small ResNet and a model of many Keras layers: each frozen to a .pb and
    saved as a SavedModel, with one input and TensorFlow's output for it."""
    tf = _tf()
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("tf-keras")
    tf.keras.utils.set_random_seed(0)
    models = {
        "mobilenet": tf.keras.applications.MobileNet(weights=None, alpha=0.25, input_shape=(64, 64, 3),
                                                     classifier_activation=None),
        "resnet": _small_resnet(tf),
        "layers": _keras_layers(tf),
    }
    out = {}
    for name, model in models.items():
        _randomize_batch_norms(model, rng)
        shape = (1,) + tuple(model.input_shape[1:])
        x = rng.standard_normal(shape).astype(np.float32)
        ref = model(x, training=False).numpy()
        pb, _, _ = _freeze(tf, tf.function(lambda t, m=model: m(t, training=False)),
                           [tf.TensorSpec(shape, tf.float32)])
        (folder / (name + ".pb")).write_bytes(pb)
        tf.saved_model.save(model, str(folder / (name + "_saved")))
        out[name] = {"pb": str(folder / (name + ".pb")), "saved": str(folder / (name + "_saved")), "x": x,
                     "ref": ref}
    return out


def _run_host(graph, params, feeds, folder):
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    for k, v in feeds.items():
        gm.set_input(k, v)
    gm.run()
    return [gm.get_output(i) for i in range(gm.get_num_outputs())]


def _rel_err(got, ref):
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


@pytest.mark.parametrize("name,kind", [("mobilenet", "pb"), ("mobilenet", "saved"), ("resnet", "pb"),
                                       ("resnet", "saved"), ("layers", "saved")])
def test_keras_model_matches_tensorflow(keras_models, name, kind, tmp_path):
    m = keras_models[name]
    graph, params = from_tensorflow(m[kind])
    feeds = {graph.inputs[0]: m["x"]}
    got = _run_host(graph, params, feeds, tmp_path)[0]
    err = _rel_err(got, m["ref"])
    print("%s %s: max rel err %.2e" % (name, kind, err))
    assert err <= REL_TOL


def test_conv_chain_keeps_nchw_between_convolutions(keras_models):
    """NHWC is transposed to NCHW once at the input and back once before the head's reshape: no Transpose pairs
    inside the chain of convolutions, batch norms, activations and pads."""
    for kind in ("pb", "saved"):
        model = to_onnx(keras_models["mobilenet"][kind])
        ops = [n.op_type for n in model.graph.node]
        assert ops.count("Conv") == 28
        assert ops.count("Transpose") <= 2, ops
        produced = {o: n.op_type for n in model.graph.node for o in n.output}
        for n in model.graph.node:
            if n.op_type == "Transpose":
                assert produced.get(n.input[0]) != "Transpose"


def test_formats_are_detected_and_coverage_is_complete(keras_models):
    from tether.frontend.model_file import op_coverage

    m = keras_models["resnet"]
    assert detect(m["pb"]).name == "TensorFlow GraphDef"
    assert detect(m["saved"]).name == "TensorFlow SavedModel"
    for kind in ("pb", "saved"):
        rows = op_coverage(m[kind])
        assert rows and all(r["covered"] for r in rows), [r for r in rows if not r["covered"]]
        assert {"Conv2D", "MaxPool", "Relu", "AddV2"} <= {r["op_type"] for r in rows}
        assert all(r["domain"] == "TensorFlow" for r in rows)


# -- one model of many op families --------------------------------------------------------------------------
def _op_family_function(tf):
    rng = np.random.default_rng(3)
    w = lambda *s: tf.constant(rng.standard_normal(s).astype(np.float32) * 0.3)  # noqa: E731
    k1, kd, kt, kw = w(3, 3, 4, 6), w(3, 3, 4, 2), w(3, 3, 6, 5), w(96, 7)
    scale, offset, mean, var = w(6), w(6), w(6), tf.constant(rng.uniform(0.5, 1.5, 6).astype(np.float32))

    @tf.function
    def f(x, v):
        # x: [1, 8, 8, 4] NHWC, v: [2, 3, 4]
        c = tf.nn.conv2d(x, k1, strides=2, padding="SAME")                            # Conv2D
        c = tf.nn.bias_add(c, w(6))                                                   # BiasAdd
        c, _, _ = tf.compat.v1.nn.fused_batch_norm(c, scale, offset, mean, var, epsilon=1e-3, is_training=False)
        c = tf.nn.relu6(c) + tf.nn.elu(c) * tf.nn.selu(c) - tf.nn.leaky_relu(c, 0.1)
        c = c * tf.sigmoid(c) + tf.tanh(c) + tf.nn.softplus(c)                        # swish-style Mul
        d = tf.nn.depthwise_conv2d(x, kd, strides=[1, 1, 1, 1], padding="VALID")      # DepthwiseConv2dNative
        d = tf.nn.max_pool2d(d, 2, 2, "VALID") + tf.nn.avg_pool2d(d, 3, 2, "SAME")    # MaxPool, AvgPool
        e = tf.nn.conv2d(x, k1, strides=1, padding=[[0, 0], [1, 2], [0, 1], [0, 0]])   # explicit padding
        t = tf.nn.conv2d_transpose(tf.nn.relu(c[..., :5]), kt, [1, 8, 8, 6], 2, "SAME")  # Conv2DBackpropInput
        r1 = tf.compat.v1.image.resize_bilinear(c, [7, 5], align_corners=True)
        r2 = tf.compat.v1.image.resize_bilinear(c, [9, 6], half_pixel_centers=True)
        r3 = tf.compat.v1.image.resize_nearest_neighbor(c, [8, 8], half_pixel_centers=True)
        r4 = tf.compat.v1.image.resize_nearest_neighbor(c, [7, 7], align_corners=True)
        r5 = tf.compat.v1.image.resize_bilinear(c, [6, 6])
        red = (tf.reduce_mean(c, [1, 2]) + tf.reduce_sum(d, [1, 2])[:, :6] + tf.reduce_max(c, [1, 2])
               + tf.reduce_min(e, [1, 2]) + tf.reduce_prod(tf.sigmoid(c), [1, 2]))
        red = tf.concat([red, tf.reduce_mean(e, [1], keepdims=True)[:, 0, 0, :]], axis=1)  # ConcatV2, keep_dims
        flat = tf.reshape(tf.transpose(c, [0, 3, 1, 2]), [1, -1])                      # Transpose, Reshape
        dense = tf.matmul(flat, kw) + tf.matmul(red, w(7, 12), transpose_b=True)[:, :7]  # MatMul
        a = tf.math.rsqrt(tf.abs(v) + 1) + tf.sqrt(tf.square(v)) - tf.exp(-v) + tf.math.log(tf.abs(v) + 2)
        a = tf.maximum(a, -v) / tf.minimum(tf.abs(v) + 1, 2.0) + tf.pow(tf.abs(v), 1.5)
        a = a + tf.math.squared_difference(v, 0.5) + tf.math.erf(v) + tf.negative(v)
        a = tf.where(v > 0, a, tf.zeros_like(a)) + tf.ones_like(v) + tf.math.floormod(v, 0.7)
        a = tf.math.floordiv(v, 0.3) + a
        bm = tf.linalg.matmul(a, v, adjoint_b=True)                                   # BatchMatMulV2, adj_y
        es = tf.einsum("bij,bkj->bik", a, v)                                          # Einsum
        p = tf.pad(v, [[0, 0], [1, 2], [2, 1]], constant_values=0.5)                  # PadV2
        mp = tf.pad(v, [[0, 0], [1, 1], [2, 1]], mode="REFLECT") + tf.pad(v, [[0, 0], [1, 1], [2, 1]],
                                                                          mode="SYMMETRIC")
        parts = tf.split(v, 2, axis=2)                                                # Split
        sv = tf.split(v, [1, -1], axis=1)                                             # SplitV
        un = tf.unstack(v, axis=1)                                                    # Unpack
        st = tf.stack([parts[0], parts[1]], axis=1)                                   # Pack
        sl = v[:, ::-1, 1:3] + v[..., tf.newaxis, 2:][..., 0, :] + tf.slice(v, [0, 1, 1], [-1, 2, 2])[:, :1, :1]
        g = tf.gather(v, [2, 0, 1, 1], axis=1) + tf.gather(tf.reshape(v, [-1]), [[3]])[0]
        sq = tf.squeeze(tf.expand_dims(v, 0), [0])
        shp = tf.cast(tf.shape(v), tf.float32)
        fi = tf.fill([3, 3], 1.5) + tf.tile(v[:, :, :1], [1, 1, 3])[0]
        rg = tf.cast(tf.range(0, 8, 2), tf.float32) * tf.cast(tf.argmax(v, axis=2), tf.float32)[0, :1]
        sm = tf.nn.softmax(v) + tf.nn.softmax(c)[0, 0, 0, :4]
        # ops that keep a convolution's NCHW result as it is, addressing its axes where they lie
        cc = tf.concat([c, tf.nn.relu(e[:, 1::2, ::2, :])], axis=3)                 # [1, 4, 4, 12]
        c1, c2 = tf.split(cc, 2, axis=-1)
        k = tf.pad(c1, [[0, 0], [1, 0], [0, 2], [1, 1]]) * tf.constant(np.arange(8, dtype=np.float32))
        k = tf.slice(k, [0, 1, 0, 2], [-1, 3, 4, -1]) + tf.tile(tf.reduce_mean(c2, axis=1, keepdims=True),
                                                               [1, 3, 1, 1])   # [1, 3, 4, 6]
        h = tf.reduce_sum(k, axis=1) + tf.cast(tf.cast(k[:, 0] * 4, tf.int32), tf.float32)  # [1, 4, 6]
        h = tf.nn.bias_add(h, tf.constant(np.linspace(-1, 1, 6, dtype=np.float32))) * tf.reduce_max(k, axis=[1, 2])
        bn = tf.compat.v1.nn.fused_batch_norm(tf.nn.relu(k), scale, offset, mean, var, is_training=False)[0]
        return [c, d, e, t, r1, r2, r3, r4, r5, dense, bm, es, p, mp, st, sv[1], un[2], sl, g, sq + shp[2],
                fi, rg, sm, tf.identity_n([a, v])[0], h, bn]

    return f


@pytest.fixture(scope="module")
def op_family(tmp_path_factory):
    tf = _tf()
    f = _op_family_function(tf)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 8, 4)).astype(np.float32)
    v = rng.standard_normal((2, 3, 4)).astype(np.float32)
    pb, outputs, inputs = _freeze(tf, f, [tf.TensorSpec(x.shape, tf.float32), tf.TensorSpec(v.shape, tf.float32)])
    path = tmp_path_factory.mktemp("tf-ops") / "ops.pb"
    path.write_bytes(pb)
    refs = [r.numpy() for r in f(x, v)]
    return {"path": str(path), "outputs": outputs, "feeds": dict(zip(inputs, (x, v))), "refs": refs}


def test_op_families_match_tensorflow(op_family, tmp_path):
    graph, params = from_tensorflow(op_family["path"], outputs=op_family["outputs"])
    got = _run_host(graph, params, op_family["feeds"], tmp_path)
    assert len(got) == len(op_family["refs"])
    for i, (g, r) in enumerate(zip(got, op_family["refs"])):
        err = _rel_err(g, r)
        assert err <= REL_TOL, "output %d (%s): max rel err %.2e" % (i, op_family["outputs"][i], err)


def test_more_op_families_match_tensorflow(tmp_path):
    tf = _tf()
    rng = np.random.default_rng(6)

    @tf.function
    def f(x, v):
        # x: [1, 6, 5, 8] NHWC, v: [3, 4]
        c = tf.nn.conv2d(x, tf.constant(rng.standard_normal((1, 1, 8, 8)).astype(np.float32)), 1, "SAME")
        lrn = tf.nn.local_response_normalization(c, depth_radius=2, bias=1.5, alpha=0.3, beta=0.75)
        # sizes whose sampling fractions fall on TensorFlow's table of cubic weights (steps of 1/1024)
        b1 = tf.compat.v1.image.resize_bicubic(c, [12, 10], half_pixel_centers=True)
        b2 = tf.compat.v1.image.resize_bicubic(c, [11, 9], align_corners=True)
        b3 = tf.compat.v1.image.resize_bicubic(c, [12, 20])
        cs = tf.math.cumsum(c, axis=3) + tf.math.cumsum(c, axis=1, exclusive=True, reverse=True)
        rv = tf.reverse(c, [1, 3]) + tf.reverse(x, [2])
        u = tf.sigmoid(v) * 0.9                              # in (0, 0.9): inside every domain below
        trig = (tf.tan(v * 0.5) + tf.asin(u) + tf.acos(u) + tf.atan(v) + tf.sinh(v) + tf.cosh(v) + tf.asinh(v)
                + tf.acosh(u + 1) + tf.atanh(u * 0.9))
        nums = tf.math.log1p(tf.abs(v)) + tf.math.expm1(v) + tf.math.rint(v * 3)
        mods = tf.truncatemod(v, 0.4) + tf.cast(tf.truncatediv(tf.cast(v * 10, tf.int32), 3), tf.float32)
        bad = tf.math.log(v)                                 # NaN where v < 0
        flags = tf.cast(tf.math.is_nan(bad), tf.float32) + tf.cast(tf.math.is_finite(bad), tf.float32) * 2
        bt = tf.broadcast_to(v[:1], [3, 4]) + tf.broadcast_to(v[:, :1], [3, 4])
        idx = tf.cast(tf.abs(v * 2), tf.int32) % 4
        onehot = tf.one_hot(idx, 5, on_value=2.0, off_value=-1.0, axis=1)
        topv, topi = tf.math.top_k(v, 2)
        gnd = tf.gather_nd(v, [[0, 1], [2, 3], [1, 0]])
        d2s = tf.nn.depth_to_space(c, 2)
        s2d = tf.nn.space_to_depth(c[:, :6, :4], 2)
        logic = tf.logical_or(tf.logical_and(v > 0, tf.not_equal(v, 0.5)), tf.logical_not(v <= -0.5))
        anyall = tf.cast(tf.reduce_any(v > 1, axis=1), tf.float32) + tf.cast(tf.reduce_all(v > -1, axis=0)[:3],
                                                                                tf.float32)
        misc = (tf.round(v * 2) + tf.sign(v) + tf.sin(v) + tf.cos(v) + tf.nn.softsign(v) + tf.math.reciprocal(v + 3)
                + tf.clip_by_value(v, -0.5, 0.7) + tf.add_n([v, v * 2, tf.abs(v)]) + tf.nn.log_softmax(v)
                + tf.cast(tf.equal(v, v), tf.float32) + tf.cast(tf.math.greater_equal(v, 0.1), tf.float32)
                + tf.cast(tf.argmin(v, axis=1), tf.float32)[:, None] + tf.cast(tf.size(v), tf.float32)
                + tf.cast(tf.rank(v), tf.float32))
        sel = tf.compat.v1.where(tf.constant([True, False, True]), v, -v)          # Select: rows by a vector
        se = tf.reshape(tf.reduce_mean(c, [1, 2]), [-1, 1, 1, 8])                  # squeeze and excite
        se = c * tf.sigmoid(tf.nn.conv2d(se, tf.constant(rng.standard_normal((1, 1, 8, 8)).astype(np.float32)), 1,
                                         "VALID")) + tf.reshape(se, [1, 8])[:, None, None, :]
        s8 = tf.constant(rng.uniform(0.5, 1.5, 8).astype(np.float32))
        train_bn = tf.compat.v1.nn.fused_batch_norm(c, s8, s8 - 1, is_training=True)[0]   # this batch's statistics
        return [lrn, b1, b2, b3, cs, rv, trig, nums, mods, flags, bt, train_bn, onehot, topv, topi, gnd, d2s, s2d,
                logic, anyall, misc, sel, se]

    x = rng.standard_normal((1, 6, 5, 8)).astype(np.float32)
    v = rng.standard_normal((3, 4)).astype(np.float32)
    pb, outputs, inputs = _freeze(tf, f, [tf.TensorSpec(x.shape, tf.float32), tf.TensorSpec(v.shape, tf.float32)])
    path = tmp_path / "ops2.pb"
    path.write_bytes(pb)
    refs = [r.numpy() for r in f(x, v)]
    graph, params = from_tensorflow(str(path), outputs=outputs)
    got = _run_host(graph, params, dict(zip(inputs, (x, v))), tmp_path / "out")
    assert len(got) == len(refs)
    from tether.frontend.tensorflow import coverage

    ops = {r["op_type"] for r in coverage(str(path))}
    assert {"OneHot", "TopKV2", "GatherNd", "DepthToSpace", "SpaceToDepth", "Select", "AddN", "All", "Any",
            "LRN", "ResizeBicubic", "Cumsum", "ReverseV2", "BroadcastTo", "IsNan"} <= ops, ops
    for i, (g, r) in enumerate(zip(got, refs)):
        assert g.dtype == r.dtype, (i, g.dtype, r.dtype)
        err = _rel_err(g, r) if r.dtype != np.bool_ else float((g != r).any())
        assert err <= REL_TOL, "output %d (%s): max rel err %.2e" % (i, outputs[i], err)


def test_3d_convolutions_and_pools_match_tensorflow(tmp_path):
    """Video and volume ops (NDHWC): Conv3D strided, dilated and SAME/VALID with a bias, Conv3DBackpropInputV2
    (conv3d_transpose), MaxPool3D and AvgPool3D, and a layout-agnostic op between them."""
    tf = _tf()
    rng = np.random.default_rng(8)
    w1 = tf.constant(rng.standard_normal((3, 3, 3, 3, 6)).astype(np.float32))
    w2 = tf.constant(rng.standard_normal((1, 3, 3, 6, 4)).astype(np.float32))
    w3 = tf.constant(rng.standard_normal((2, 2, 2, 5, 4)).astype(np.float32))
    bias = tf.constant(rng.standard_normal(6).astype(np.float32))

    @tf.function
    def f(x):
        c = tf.nn.relu(tf.nn.bias_add(tf.nn.conv3d(x, w1, [1, 1, 1, 1, 1], "SAME"), bias))
        d = tf.nn.conv3d(c, w2, [1, 1, 2, 2, 1], "VALID")
        e = tf.nn.conv3d(c, w2, [1, 1, 1, 1, 1], "SAME", dilations=[1, 2, 1, 2, 1])
        m = tf.nn.max_pool3d(e, [1, 2, 2, 2, 1], [1, 2, 2, 2, 1], "SAME")
        a = tf.nn.avg_pool3d(e, [1, 3, 3, 3, 1], [1, 1, 2, 2, 1], "SAME")
        up = tf.nn.conv3d_transpose(m, w3, [1, 6, 8, 10, 5], [1, 2, 2, 2, 1], "SAME")
        upv = tf.nn.conv3d_transpose(d, w3, [1, 7, 7, 9, 5], [1, 1, 2, 2, 1], "VALID")
        return [d, tf.reduce_mean(e, axis=[1, 2, 3]), m, a, tf.sigmoid(up), upv]

    x = rng.standard_normal((1, 6, 8, 10, 3)).astype(np.float32)
    pb, outputs, inputs = _freeze(tf, f, [tf.TensorSpec(x.shape, tf.float32)])
    path = tmp_path / "volume.pb"
    path.write_bytes(pb)
    refs = [r.numpy() for r in f(x)]
    graph, params = from_tensorflow(str(path), outputs=outputs)
    got = _run_host(graph, params, {inputs[0]: x}, tmp_path / "out")
    from tether.frontend.tensorflow import coverage

    ops = {r["op_type"] for r in coverage(str(path))}
    assert {"Conv3D", "Conv3DBackpropInputV2", "MaxPool3D", "AvgPool3D"} <= ops, ops
    assert len(got) == len(refs)
    for i, (g, r) in enumerate(zip(got, refs)):
        assert g.shape == r.shape, (i, g.shape, r.shape)
        err = _rel_err(g, r)
        assert err <= REL_TOL, "output %d (%s): max rel err %.2e" % (i, outputs[i], err)


def test_tensorflow1_switch_and_merge_with_a_constant_predicate(tmp_path):
    """A frozen TensorFlow 1 conditional (a learning phase frozen to False): the branch the predicate takes is
    translated, the other is dropped."""
    tf = _tf()
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        for pred, name in ((False, "y_false"), (True, "y_true")):
            p = tf.constant(pred, name="pred_" + name)
            off, on = tf.raw_ops.Switch(data=x, pred=p)
            merged = tf.raw_ops.Merge(inputs=[tf.nn.relu(off) * 3.0, tf.math.lgamma(on)])
            tf.identity(merged.output + 1.0, name=name)
        feed = np.random.default_rng(7).standard_normal((2, 3)).astype(np.float32)
        with tf.compat.v1.Session(graph=g) as sess:
            ref = sess.run("y_false:0", {x: feed})
        pb = g.as_graph_def().SerializeToString()
    path = tmp_path / "switch.pb"
    path.write_bytes(pb)
    graph, params = from_tensorflow(str(path), outputs=["y_false"])
    got = _run_host(graph, params, {"x": feed}, tmp_path / "out")[0]
    assert _rel_err(got, ref) <= REL_TOL
    with pytest.raises(UnsupportedOpError, match="Lgamma"):          # the taken branch holds an op tether lacks
        to_onnx(str(path), outputs=["y_true"])


def test_nchw_data_format_matches_the_nhwc_computation(tmp_path):
    """Ops written with data_format NCHW (TensorFlow runs them on GPUs only): the graph is built, not run, and
    compared with the same computation in NHWC run by TensorFlow."""
    tf = _tf()
    rng = np.random.default_rng(9)
    k, kd = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((3, 3, 4, 6), (3, 3, 6, 2)))
    bias, scale, offset, mean = (rng.standard_normal(6).astype(np.float32) for _ in range(4))
    var = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    x = rng.standard_normal((1, 4, 9, 8)).astype(np.float32)            # NCHW

    def net(t, fmt):
        strides = [1, 1, 2, 2] if fmt == "NCHW" else [1, 2, 2, 1]
        c = tf.nn.conv2d(t, k, strides, "SAME", data_format=fmt)
        c = tf.nn.bias_add(c, bias, data_format=fmt)
        c = tf.compat.v1.nn.fused_batch_norm(c, scale, offset, mean, var, epsilon=1e-3, data_format=fmt,
                                             is_training=False)[0]
        d = tf.nn.depthwise_conv2d(tf.nn.relu(c), kd, [1, 1, 1, 1], "VALID", data_format=fmt)
        window = [1, 1, 2, 2] if fmt == "NCHW" else [1, 2, 2, 1]
        return (tf.nn.max_pool2d(d, window, window, "VALID", data_format=fmt)
                + tf.nn.avg_pool2d(d, window, window, "SAME", data_format=fmt))

    ref = np.transpose(net(tf.constant(np.transpose(x, (0, 2, 3, 1))), "NHWC").numpy(), (0, 3, 1, 2))
    with tf.Graph().as_default() as g:
        net(tf.compat.v1.placeholder(tf.float32, x.shape, name="x"), "NCHW")
        pb = g.as_graph_def().SerializeToString()
    path = tmp_path / "nchw.pb"
    path.write_bytes(pb)
    model = to_onnx(str(path))
    assert not [n for n in model.graph.node if n.op_type == "Transpose"]
    graph, params = from_tensorflow(str(path))
    got = _run_host(graph, params, {"x": x}, tmp_path / "out")[0]
    assert _rel_err(got, ref) <= REL_TOL


def test_keras_recurrent_layers_unrolled(tmp_path):
    """LSTM, GRU and a bidirectional SimpleRNN: each a While loop over TensorLists, unrolled over its 5 steps.
    A GraphDef frozen with its loops kept functional translates too; one whose loops were lowered to TensorFlow 1
    control flow (a cycle through Switch, Merge, NextIteration) is refused in one line."""
    tf = _tf()
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    L = tf.keras.layers
    tf.keras.utils.set_random_seed(1)
    inp = L.Input((5, 4))
    x = L.GRU(6, return_sequences=True)(L.LSTM(8, return_sequences=True)(inp))
    model = tf.keras.Model(inp, L.Dense(2)(L.Bidirectional(L.SimpleRNN(3))(x)))
    x = np.random.default_rng(10).standard_normal((1, 5, 4)).astype(np.float32)
    ref = model(x).numpy()
    folder = str(tmp_path / "rnn_saved")
    tf.saved_model.save(model, folder)
    fn = tf.function(lambda t: model(t)).get_concrete_function(tf.TensorSpec(x.shape, tf.float32))
    for lower in (False, True):
        graph_def = convert_variables_to_constants_v2(fn, lower_control_flow=lower).graph.as_graph_def()
        (tmp_path / ("rnn_lowered%d.pb" % lower)).write_bytes(graph_def.SerializeToString())
    graph, params = from_tensorflow(folder)
    assert _rel_err(_run_host(graph, params, {"inputs": x}, tmp_path / "out")[0], ref) <= REL_TOL
    import onnxruntime as ort

    model_pb = to_onnx(str(tmp_path / "rnn_lowered0.pb"))
    got = ort.InferenceSession(model_pb.SerializeToString()).run(None, {model_pb.graph.input[0].name: x})
    assert len(got) == 1 and _rel_err(got[0], ref) <= REL_TOL
    with pytest.raises(UnsupportedOpError, match="cycle") as info:
        to_onnx(str(tmp_path / "rnn_lowered1.pb"))
    assert len(str(info.value).splitlines()) == 1


def test_functional_conditional_with_a_constant_predicate(tmp_path):
    tf = _tf()
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    flag = tf.constant(False)

    @tf.function
    def f(x):
        y = tf.cond(flag, lambda: tf.math.lgamma(x), lambda: tf.nn.relu(x) * 2.0)
        return tf.cond(tf.shape(x)[0] > 1, lambda: y + 1.0, lambda: y - 1.0)

    x = np.random.default_rng(11).standard_normal((2, 3)).astype(np.float32)
    fn = f.get_concrete_function(tf.TensorSpec(x.shape, tf.float32))
    graph_def = convert_variables_to_constants_v2(fn, lower_control_flow=False).graph.as_graph_def()
    assert {"If", "StatelessIf"} & {n.op for n in graph_def.node}
    path = tmp_path / "cond.pb"
    path.write_bytes(graph_def.SerializeToString())
    graph, params = from_tensorflow(str(path))
    got = _run_host(graph, params, {graph.inputs[0]: x}, tmp_path / "out")[0]
    assert _rel_err(got, f(x).numpy()) <= REL_TOL


def test_graphdef_bytes_and_user_shape(keras_models):
    """The API takes a GraphDef's bytes, and ``shape`` fixes an input the SavedModel leaves open."""
    with open(keras_models["resnet"]["pb"], "rb") as fh:
        model = to_onnx(fh.read())
    assert [i.name for i in model.graph.input] == ["t"]     # the traced function's argument
    model = to_onnx(keras_models["resnet"]["saved"], shape={"inputs": [2, 32, 32, 3]})
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 32, 32, 3]
    with pytest.raises(InvalidInput, match="does not fit"):
        to_onnx(keras_models["resnet"]["saved"], shape={"inputs": [1, 31, 32, 3]})


def test_input_of_any_size_with_a_shape_given(tmp_path):
    """A fully convolutional SavedModel (input [?, ?, ?, 3]): the upsampling size and the transposed
    convolution's output size are computed from the input's size, which ``shape`` fixes."""
    tf = _tf()
    L = tf.keras.layers
    inp = L.Input((None, None, 3))
    x = L.Conv2D(4, 3, padding="same", activation="relu")(inp)
    x = L.Conv2DTranspose(4, 3, strides=2, padding="same")(L.UpSampling2D(2)(x))
    model = tf.keras.Model(inp, L.Conv2D(2, 1)(L.MaxPooling2D(2)(x)))
    x = np.random.default_rng(8).standard_normal((1, 12, 10, 3)).astype(np.float32)
    ref = model(x).numpy()
    folder = str(tmp_path / "fcn_saved")
    tf.saved_model.save(model, folder)
    with pytest.raises(UnsupportedOpError, match="give the input shapes"):
        to_onnx(folder)
    graph, params = from_tensorflow(folder, shape={"inputs": [1, 12, 10, 3]})
    got = _run_host(graph, params, {"inputs": x}, tmp_path / "out")[0]
    assert _rel_err(got, ref) <= REL_TOL


def test_unsupported_ops_are_named_in_one_error(tmp_path):
    tf = _tf()

    @tf.function
    def f(x):
        return tf.math.cumprod(tf.signal.rfft(x), axis=0), tf.math.lgamma(x) + tf.math.cumprod(x)

    pb, outputs, _ = _freeze(tf, f, [tf.TensorSpec([8], tf.float32)])
    path = tmp_path / "unsupported.pb"
    path.write_bytes(pb)
    with pytest.raises(UnsupportedOpError) as info:
        to_onnx(str(path))
    msg = str(info.value)
    assert len(msg.splitlines()) == 1
    for op in ("RFFT", "Lgamma", "Cumprod (nodes Cumprod, Cumprod_1)"):
        assert op in msg
    assert "producer" in msg and str(path) in msg


def test_corrupt_files_are_invalid_input(keras_models, tmp_path):
    data = open(keras_models["resnet"]["pb"], "rb").read()
    cut = tmp_path / "cut.pb"
    cut.write_bytes(data[:len(data) // 3])
    with pytest.raises(InvalidInput, match="cut.pb"):
        to_onnx(str(cut))
    # a GraphDef that parses but lost a node another one reads
    tf = _tf()
    graph_def = tf.compat.v1.GraphDef.FromString(data)
    del graph_def.node[len(graph_def.node) // 2]
    holed = tmp_path / "holed.pb"
    holed.write_bytes(graph_def.SerializeToString())
    with pytest.raises(InvalidInput, match="holed.pb: node .* which no node of the graph produces"):
        to_onnx(str(holed))
    # a SavedModel whose checkpoint was lost
    import shutil
    broken = tmp_path / "broken_saved"
    shutil.copytree(keras_models["resnet"]["saved"], broken)
    os.remove(broken / "variables" / "variables.index")
    with pytest.raises(InvalidInput, match="variables.index"):
        to_onnx(str(broken))
    (broken / "variables" / "variables.index").write_bytes(b"\x00" * 100)
    with pytest.raises(InvalidInput, match="not a valid tensor bundle index"):
        to_onnx(str(broken))


# -- the command line ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["pb", "saved"])
def test_cli_compile_and_check(keras_models, kind, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    path = keras_models["mobilenet"][kind]
    result = CliRunner().invoke(cli, ["compile", "--check", path])
    assert result.exit_code == 0, result.output
    assert "DepthwiseConv2dNative" in result.output and "0 not covered" in result.output
    if kind == "pb":
        result = CliRunner().invoke(cli, ["compile", path, "-o", str(tmp_path / "out")])
        assert result.exit_code == 0, result.output
        assert os.path.isfile(tmp_path / "out" / "deploy.json")


def test_cli_corrupt_pb_is_one_line_exit_2(keras_models, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    data = open(keras_models["mobilenet"]["pb"], "rb").read()
    path = tmp_path / "truncated.pb"
    path.write_bytes(data[:len(data) // 2])
    for argv in (["compile", str(path), "-o", str(tmp_path / "out")], ["compile", "--check", str(path)]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "truncated.pb" in lines[0] and "Traceback" not in result.output, result.output
    assert not os.path.exists(tmp_path / "out")


# -- the emulated aarch64 board ------------------------------------------------------------------------------
@pytest.mark.emulated
@pytest.mark.slow
def test_saved_model_on_emulated_aarch64(emulated_devices, keras_models, tmp_path):
    device = emulated_devices.for_preset("rasp4b")
    m = keras_models["mobilenet"]
    graph, params = from_tensorflow(m["saved"])
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(**{graph.inputs[0]: m["x"]})
            err = _rel_err(gm.get_output(0), m["ref"])
    assert err <= REL_TOL


def test_cli_untranslated_ops_are_one_line(tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    tf = _tf()

    @tf.function
    def f(x):
        return tf.math.lgamma(x) + tf.math.cumprod(x)

    pb, _, _ = _freeze(tf, f, [tf.TensorSpec([8], tf.float32)])
    path = tmp_path / "lgamma.pb"
    path.write_bytes(pb)
    result = CliRunner().invoke(cli, ["compile", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Lgamma (node Lgamma)" in lines[0] and "Cumprod (node Cumprod)" in lines[0]


# -- constants and TensorFlow 1 files ------------------------------------------------------------------------
_VALUE_FIELDS = {np.float16: "half_val", np.float32: "float_val", np.float64: "double_val", np.int32: "int_val",
                 np.int8: "int_val", np.int64: "int64_val", np.bool_: "bool_val", np.object_: "string_val"}


@pytest.mark.parametrize("value", [
    np.arange(6, dtype=np.float16).reshape(2, 3) / 4,
    np.array([[True, False, True]]),
    np.array([b"ab", b"", b"\xffz"], dtype=object),
    np.full((2, 2), 7, dtype=np.int64),
    np.linspace(-1, 1, 12, dtype=np.float64).reshape(3, 4),
    np.linspace(-1, 1, 6, dtype=np.float32),
    np.array(3, dtype=np.int32),
    np.arange(-3, 3, dtype=np.int8),
], ids=["half", "bool", "string", "int64", "double", "float", "scalar", "int8"])
def test_tensor_protos_read_as_tensorflow_reads_them(value):
    """Each way TensorFlow writes a constant: raw tensor_content, the repeated field of the dtype (half as bit
    patterns), and one value for a whole tensor (a splat)."""
    tf = _tf()
    from tether.frontend.tensorflow import protos
    from tether.frontend.tensorflow.tensors import tensor_value

    field = _VALUE_FIELDS[value.dtype.type]
    repeated = tf.make_tensor_proto(value)
    if repeated.tensor_content:
        repeated.ClearField("tensor_content")
        flat = value.reshape(-1)
        getattr(repeated, field).extend(flat.view(np.uint16).tolist() if field == "half_val" else flat.tolist())
    cases = [tf.make_tensor_proto(value), repeated,
             tf.make_tensor_proto(value.reshape(-1)[0], dtype=value.dtype if value.dtype != object else tf.string,
                                  shape=value.shape)]
    for proto in cases:
        got = tensor_value(protos.TensorProto.FromString(proto.SerializeToString()), "test")
        ref = tf.make_ndarray(proto)
        assert got.dtype == ref.dtype and got.shape == ref.shape, (got, ref, proto)
        assert (got == ref).all(), (got, ref, proto)


def test_tensorflow1_saved_model_with_ref_and_resource_variables(tmp_path):
    tf = _tf()
    rng = np.random.default_rng(5)
    folder = str(tmp_path / "tf1_saved")
    x = rng.standard_normal((1, 4)).astype(np.float32)
    with tf.Graph().as_default():
        ph = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=rng.standard_normal((4, 3)).astype(np.float32))
        b = tf.compat.v1.Variable(rng.standard_normal(3).astype(np.float32), name="b", use_resource=False)
        y = tf.nn.relu6(tf.matmul(ph, w) + b, name="y")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            ref = sess.run(y, {ph: x})
            tf.compat.v1.saved_model.simple_save(sess, folder, {"x": ph}, {"y": y})
    from tether.frontend.tensorflow import coverage

    assert {"VariableV2", "VarHandleOp"} <= {r["op_type"] for r in coverage(folder)}
    graph, params = from_tensorflow(folder)
    assert graph.inputs == ["x"]
    got = _run_host(graph, params, {"x": x}, tmp_path / "out")[0]
    assert _rel_err(got, ref) <= REL_TOL
