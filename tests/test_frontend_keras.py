"""The Keras frontend: models made with Keras at test time, saved as .keras and .h5, read without Keras,
compiled by tether and compared with ``model.predict`` on the same input; the layout inside (no transposes
between convolutions), the CLI, a refused model and a corrupt file."""
import os
import zipfile

import numpy as np
import pytest

import tether
from tether import graph_executor, rpc
from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend import from_keras
from tether.frontend.keras import keras_coverage, read_keras

keras = pytest.importorskip("keras")
pytest.importorskip("h5py")
L = keras.layers
FORMATS = ("keras", "h5")
BATCH = 2


def _cnn():
    inp = keras.Input((16, 16, 3), name="image")
    x = L.Conv2D(8, 3, padding="same", activation="relu")(inp)
    x = L.BatchNormalization()(x)
    y = L.DepthwiseConv2D(3, padding="same", activation="relu6")(x)
    x = L.Add()([x, y])
    z = L.SeparableConv2D(8, 3, padding="same", activation="swish")(x)
    x = L.Concatenate()([x, z])
    x = L.MaxPooling2D()(x)
    x = L.Conv2D(8, 3, strides=2, padding="same", dilation_rate=1)(x)
    x = L.UpSampling2D(interpolation="bilinear")(x)
    x = L.CenterCrop(6, 6)(L.Resizing(10, 9, interpolation="nearest")(L.Resizing(7, 9)(x)))
    x = L.Conv2D(8, 3, padding="same", dilation_rate=2, activation="elu")(x)
    x = L.AveragePooling2D(2, padding="same")(x)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(5, activation="softmax")(x)
    return keras.Model(inp, x, name="cnn")


def _transformer():
    inp = keras.Input((6, 8), name="tokens")
    x = L.Dense(16)(inp)
    a = L.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=5)(x, x)
    x = L.LayerNormalization()(L.Add()([x, a]))
    f = L.Dense(32, activation="gelu")(x)
    f = L.Dense(16)(f)
    x = L.LayerNormalization(epsilon=1e-6)(L.Add()([x, f]))
    c = L.MultiHeadAttention(num_heads=2, key_dim=4)(x, x, use_causal_mask=True)
    x = L.GlobalAveragePooling1D()(L.Add()([x, c]))
    return keras.Model(inp, L.Dense(3)(x), name="transformer")


def _recurrent():
    inp = keras.Input((7, 4), name="sequence")
    x = L.LSTM(6, return_sequences=True)(inp)
    x = L.GRU(5, return_sequences=True, reset_after=False)(x)
    x = L.GRU(5, return_sequences=True, go_backwards=True)(x)
    x = L.Bidirectional(L.LSTM(3, return_sequences=True))(x)
    x = L.SimpleRNN(4, return_sequences=True)(x)
    y, h, c = L.LSTM(3, return_state=True)(x)
    z = L.Bidirectional(L.GRU(2), merge_mode="sum")(x)
    return keras.Model(inp, [y, c, z], name="recurrent")


def _composite():
    """A nested Sequential and Functional model, a shared layer, keras.ops arithmetic and reshaping layers."""
    from keras import ops

    block = keras.Sequential([keras.Input((6, 6, 4)), L.Conv2D(4, 3, padding="same"), L.BatchNormalization(),
                              L.ReLU(max_value=6.0)], name="block")
    vin = keras.Input((8,))
    vector = keras.Model(vin, L.Dense(4, activation="tanh", name="inner")(vin), name="vector")
    shared = L.Conv2D(4, 1, name="shared")
    a, b = keras.Input((6, 6, 4), name="a"), keras.Input((6, 6, 4), name="b")
    x = L.Add()([block(shared(a)), block(shared(b))])
    x = ops.clip(x * 0.5 + 1.0, -2.0, 2.0)
    x = L.ZeroPadding2D(((1, 0), (0, 1)))(x)
    x = L.Conv2DTranspose(4, 3, strides=2, padding="same", activation="hard_sigmoid")(x)
    x = L.Cropping2D(((1, 2), (0, 1)))(x)
    x = L.GroupNormalization(groups=2)(x)
    squeeze = L.Reshape((1, 1, 4))(L.GlobalAveragePooling2D()(x))
    x = L.Multiply()([x, L.Conv2D(4, 1, activation="sigmoid")(squeeze)])
    x = L.Conv2D(2, 2, strides=2, data_format="channels_first")(L.Permute((3, 1, 2))(x))
    v = vector(L.Dense(8)(L.Flatten()(x)))
    return keras.Model([a, b], [v, L.Dot(axes=1, normalize=True)([v, v])], name="composite")


def _attention():
    """Dot-product Attention, EinsumDense, and MultiHeadAttention under an attention_mask input."""
    q, v = keras.Input((5, 8), name="q"), keras.Input((4, 8), name="v")
    mask = keras.Input((5, 4), name="mask")
    x = L.Attention(use_scale=True)([q, v])
    x = L.EinsumDense("abc,cde->abde", output_shape=(None, 2, 4), bias_axes="de", activation="relu")(x)
    x = L.Reshape((5, 8))(x)
    y = L.MultiHeadAttention(2, 4)(x, v, attention_mask=mask)
    return keras.Model([q, v, mask], L.Add()([x, y]), name="attention")


ACTIVATIONS = ["relu", "relu6", "sigmoid", "hard_sigmoid", "tanh", "softmax", "swish", "silu", "gelu", "elu", "selu",
               "softplus", "softsign", "exponential", "linear", "mish", "hard_swish", "leaky_relu", "log_softmax"]


def _activations():
    """Every activation= a layer takes, the activation layers, and a 1-D conv stack with causal padding."""
    inp = keras.Input((6, 4), name="x")
    x = L.Conv1D(4, 3, padding="causal", dilation_rate=2)(inp)
    x = L.Conv1D(4, 2, padding="same", strides=2, groups=2)(x)
    outs = [L.Dense(3, activation=a)(x) for a in ACTIVATIONS]
    outs.append(L.Dense(3, activation=keras.activations.gelu)(x))
    for layer in (L.ReLU(max_value=0.5, negative_slope=0.1, threshold=0.2), L.ReLU(max_value=6.0), L.LeakyReLU(),
                  L.PReLU(), L.ELU(alpha=0.7), L.Softmax(axis=1), L.Activation("selu")):
        outs.append(layer(x))
    x = L.Concatenate()([L.Flatten()(o) for o in outs])
    return keras.Model(inp, x, name="activations")


def _volume():
    """Video and volume layers: 3-D convolutions (strided, dilated, transposed), pooling, padding, cropping and
    upsampling."""
    inp = keras.Input((6, 8, 8, 2), name="clip")
    x = L.Conv3D(4, 3, padding="same", activation="relu")(inp)
    x = L.BatchNormalization()(x)
    x = L.Conv3D(4, (1, 3, 3), strides=(1, 2, 2), padding="same")(x)
    x = L.Conv3D(4, (3, 1, 1), padding="same", dilation_rate=(2, 1, 1), activation="relu")(x)
    skip = x
    x = L.MaxPooling3D((1, 2, 2))(x)
    x = L.Conv3DTranspose(4, (1, 2, 2), strides=(1, 2, 2), activation="relu")(x)
    x = L.Add()([x, skip])
    x = L.ZeroPadding3D(((1, 0), (0, 1), (1, 1)))(x)
    x = L.Cropping3D(((0, 1), (1, 0), (1, 1)))(x)
    x = L.UpSampling3D((1, 2, 2))(x)
    x = L.AveragePooling3D(2, padding="same")(x)
    x = L.Conv3DTranspose(2, 3, strides=2, padding="same")(x)
    a = L.GlobalAveragePooling3D()(x)
    m = L.GlobalMaxPooling3D()(x)
    return keras.Model(inp, L.Dense(3)(L.Concatenate()([a, m])), name="volume")


def _conv_chain():
    inp = keras.Input((10, 10, 3))
    x = L.Conv2D(4, 3, padding="same")(inp)
    x = L.BatchNormalization()(x)
    x = L.ReLU()(x)
    x = L.DepthwiseConv2D(3, padding="same")(x)
    x = L.Conv2D(4, 1, activation="relu")(x)
    return keras.Model(inp, L.MaxPooling2D()(x), name="chain")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (keras model, {format: path}, inputs, reference outputs)."""
    folder = tmp_path_factory.mktemp("keras-models")
    rng = np.random.default_rng(0)
    out = {}
    for make in (_cnn, _transformer, _recurrent, _composite, _attention, _activations, _volume, _conv_chain):
        m = make()
        paths = {}
        for fmt in FORMATS:
            paths[fmt] = str(folder / ("%s.%s" % (m.name, fmt)))
            m.save(paths[fmt])
        xs = [rng.standard_normal((BATCH,) + tuple(i.shape[1:])).astype(np.float32) for i in m.inputs]
        xs = [(x > 0).astype(np.float32) if i.name == "mask" else x for i, x in zip(m.inputs, xs)]
        ref = m.predict(xs[0] if len(xs) == 1 else xs, verbose=0)
        out[m.name] = (m, paths, xs, ref if isinstance(ref, list) else [ref])
    return out


def _batch_shapes(path):
    proto = read_keras(path)
    return {i.name: (BATCH,) + tuple(d.dim_value for d in i.type.tensor_type.shape.dim[1:])
            for i in proto.graph.input}


def _run_host(path, xs, folder):
    graph, params = from_keras(path, shape=_batch_shapes(path))
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    for name, x in zip(graph.inputs, xs):
        gm.set_input(name, x)
    gm.run()
    return [gm.get_output(k) for k in range(gm.get_num_outputs())]


def _assert_matches(got, ref):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape, (g.shape, r.shape)
        err = np.abs(g - r).max() / max(np.abs(r).max(), 1e-12)
        assert err <= 1e-4, "max error %.3g relative to max|ref|" % err


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["cnn", "transformer", "recurrent", "composite", "attention", "activations",
                                  "volume"])
def test_model_matches_keras(models, name, fmt, tmp_path):
    _, paths, xs, ref = models[name]
    _assert_matches(_run_host(paths[fmt], xs, tmp_path), ref)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_conv_chain_transposes_only_at_its_edges(models, fmt):
    proto = read_keras(models["chain"][1][fmt])
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Transpose") == 2, ops
    assert ops.index("Transpose") < ops.index("Conv") and ops[::-1].index("Transpose") < ops[::-1].index("MaxPool")
    # the one CNN with pooling to a vector: only the input is transposed
    assert [n.op_type for n in read_keras(models["cnn"][1][fmt]).graph.node].count("Transpose") == 1


def test_the_batch_is_one_unless_fixed(models, tmp_path):
    _, paths, xs, ref = models["chain"]
    graph, _ = from_keras(paths["keras"])
    assert graph.types[graph.inputs[0]].shape == (1, 10, 10, 3)
    _assert_matches(_run_host(paths["keras"], xs, tmp_path), ref)


@pytest.mark.emulated
@pytest.mark.slow
def test_cnn_on_the_emulated_aarch64_device(models, emulated_devices, tmp_path):
    _, paths, xs, ref = models["cnn"]
    device = emulated_devices.for_preset("rasp4b")
    graph, params = from_keras(paths["keras"], shape=_batch_shapes(paths["keras"]))
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(**dict(zip(graph.inputs, xs)))
            _assert_matches([gm.get_output(0)], ref)


def test_cli_compiles_and_checks_a_keras_model(models, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    path = models["chain"][1]["h5"]
    res = CliRunner().invoke(cli, ["compile", path, "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(tmp_path / "out")) == ["deploy.json", "deploy.params", "deploy.so"]
    res = CliRunner().invoke(cli, ["compile", "--check", path])
    assert res.exit_code == 0, res.output
    assert "Conv2D" in res.output and "Keras" in res.output and "NOT COVERED" not in res.output


def test_a_corrupt_keras_file_is_one_line_and_exit_2(models, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    data = open(models["chain"][1]["keras"], "rb").read()
    broken = tmp_path / "broken.keras"
    broken.write_bytes(data[:len(data) // 2])
    no_weights = tmp_path / "no_weights.keras"
    with zipfile.ZipFile(models["chain"][1]["keras"]) as src, zipfile.ZipFile(no_weights, "w") as dst:
        for n in ("config.json", "metadata.json"):
            dst.writestr(n, src.read(n))
    for path in (broken, no_weights):
        res = CliRunner().invoke(cli, ["compile", str(path), "-o", str(tmp_path / "out")])
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and path.name in lines[0], res.output
        assert "Traceback" not in res.output
        with pytest.raises(InvalidInput, match=path.name):
            read_keras(str(path))


def _as_keras2(cfg, numbered_from_1=("Functional", "Sequential", "Model")):
    """A Keras 3 model config in the layout tf.keras 2 wrote: no module fields, batch_input_shape, inbound nodes
    as [[layer, node, tensor, kwargs], ...], and a nested model's calls numbered from 1 everywhere."""
    c = cfg["config"]
    cfg.pop("module", None)
    layers = c.get("layers", [])
    kinds = {la.get("name") or la["config"]["name"]: la["class_name"] for la in layers}

    def ref(hist, shift):
        return [hist[0], hist[1] + (1 if shift and kinds.get(hist[0]) in numbered_from_1 else 0), hist[2]]

    def tensors(obj):
        if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
            return [obj["config"]["keras_history"]]
        return [t for o in obj for t in tensors(o)] if isinstance(obj, list) else []

    for la in layers:
        la.pop("module", None)
        if la["class_name"] == "InputLayer":
            la["config"]["batch_input_shape"] = la["config"].pop("batch_shape")
        if "inbound_nodes" in la:
            la["inbound_nodes"] = [[ref(h, True) + [{}] for h in tensors(n["args"])] for n in la["inbound_nodes"]]
        if la["class_name"] in numbered_from_1:
            _as_keras2(la)
    if cfg["class_name"] != "Sequential":
        for key in ("input_layers", "output_layers"):
            spec = c[key] if isinstance(c[key][0], list) else [c[key]]
            # Keras 3 already numbers a Functional model from 1 here, not a Sequential one
            c[key] = [ref(h, kinds.get(h[0]) == "Sequential") for h in spec]


def test_a_keras2_h5_layout_reads_alike(tmp_path):
    """Old .h5 files: the same model rewritten as tf.keras 2 saved it (config layout, ':0' weight names)."""
    import json
    import shutil

    import h5py

    sub = keras.Sequential([keras.Input((5,)), L.Dense(5, activation="relu"), L.BatchNormalization()], name="sub")
    shared = L.Dense(5, name="shared")
    a, b = keras.Input((5,), name="a"), keras.Input((5,), name="b")
    model = keras.Model([a, b], L.Concatenate()([sub(shared(a)), sub(shared(b)), shared(b)]))
    path, old = str(tmp_path / "k3.h5"), str(tmp_path / "k2.h5")
    model.save(path)
    shutil.copy(path, old)
    with h5py.File(old, "r+") as f:
        cfg = json.loads(f.attrs["model_config"])
        _as_keras2(cfg)
        f.attrs["model_config"] = json.dumps(cfg)
        f.attrs["keras_version"] = "2.15.0"
        for group in f["model_weights"].values():
            names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
            for n in names:
                group.move(n, n + ":0")
            group.attrs["weight_names"] = [(n + ":0").encode() for n in names]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((BATCH, 5)).astype(np.float32) for _ in range(2)]
    ref = model.predict(xs, verbose=0)
    _assert_matches(_run_host(old, xs, tmp_path / "out"), [ref])


def test_unsupported_layers_are_named_together(tmp_path):
    inp = keras.Input((3, 4, 4, 2))
    x = L.ConvLSTM2D(2, 2, name="frames")(inp)
    x = L.Dense(2, activation="relu")(L.Flatten()(x))
    x = L.Discretization(bin_boundaries=[0.0], name="bins")(x)
    path = str(tmp_path / "unsupported.keras")
    keras.Model(inp, x).save(path)
    with pytest.raises(UnsupportedOpError) as info:
        read_keras(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1
    for part in ("ConvLSTM2D 'frames'", "Discretization 'bins'", "Keras %s" % keras.__version__):
        assert part in msg, msg
    rows = {r["op_type"]: r for r in keras_coverage(path)}
    assert not rows["ConvLSTM2D"]["covered"] and rows["ConvLSTM2D"]["nodes"] == ["frames"]
    assert rows["Dense"]["covered"] and rows["Dense"]["domain"] == "Keras"
