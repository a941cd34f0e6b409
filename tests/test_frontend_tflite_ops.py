"""The TFLite frontend's long tail of ops: small models made with TensorFlow (tf.function ->
TFLiteConverter.from_concrete_functions), each family compared with LiteRT on the same input; the SSD
post-processing custom op (fast and regular NMS) on a Keras backbone with the op added to the flatbuffer; NMS
v4/v5; one model on the emulated aarch64 device; the CLI on one model and a corrupt file.

Float error reading: max |tether - LiteRT| / max |LiteRT| per output (<= 1e-4); integer and boolean outputs match
exactly."""

import numpy as np
import pytest

import tether
from tether import graph_executor, rpc
from tether.errors import UnsupportedOpError
from tether.frontend import from_tflite

tf = pytest.importorskip("tensorflow")
litert = pytest.importorskip("ai_edge_litert.interpreter")
pytest.importorskip("tflite")

S = tf.TensorSpec
RNG_WEIGHTS = np.random.default_rng(7)
CONV_W = RNG_WEIGHTS.standard_normal((3, 3, 3, 6)).astype(np.float32)
CONV3D_W = RNG_WEIGHTS.standard_normal((2, 3, 2, 3, 4)).astype(np.float32)
CONV3D_TW = RNG_WEIGHTS.standard_normal((2, 3, 2, 3, 4)).astype(np.float32)


def _conv(x):
    return tf.nn.conv2d(x, CONV_W, 1, "SAME")


# family -> (function, input specs, {input position: (low, high) for integer inputs})
FAMILIES = {
    "unary": (lambda x: [tf.abs(x), tf.exp(x * 0.5), tf.math.log(tf.abs(x) + 1), tf.sqrt(tf.abs(x)),
                         tf.math.rsqrt(tf.abs(x) + 0.5), tf.square(x), -x, tf.sin(x), tf.cos(x), tf.floor(x * 3),
                         tf.math.ceil(x * 3), tf.round(x * 4), tf.sign(x)],
              [S((2, 3, 4), tf.float32)], {}),
    "binary": (lambda x, y: [tf.math.floordiv(x, y), tf.math.floormod(x, y), tf.pow(tf.abs(x) + 0.1, y),
                             tf.maximum(x, y), tf.minimum(x, y), tf.math.squared_difference(x, y),
                             tf.math.atan2(x, x[::-1] - 0.2), tf.add_n([x, x * 2, x])],
               [S((2, 3, 4), tf.float32), S((3, 4), tf.float32)], {}),
    "integer": (lambda a, b: [tf.math.floordiv(a, b), tf.math.floormod(a, b), tf.math.floordiv(a, -b),
                              tf.math.floormod(a, -b), tf.maximum(a, b) * tf.abs(a)],
                [S((3, 5), tf.int32), S((5,), tf.int32)], {0: (-20, 20), 1: (1, 6)}),
    "compare": (lambda x, y, c: [tf.equal(x, y), tf.not_equal(x, y), x < y, x <= y, x > y, x >= y,
                                 tf.logical_and(x > 0, y > 0), tf.logical_or(x > 0, c), tf.logical_not(c),
                                 tf.where(x < y, x, y), tf.raw_ops.Select(condition=c[:, 0, 0], x=x, y=x * 2),
                                 tf.reduce_any(x > 0.5, axis=1), tf.reduce_all(x > -1.0, axis=[0, 2], keepdims=True)],
                [S((2, 3, 4), tf.float32), S((3, 4), tf.float32), S((2, 3, 4), tf.bool)], {}),
    "index": (lambda x, i: [tf.gather(x, i, axis=1), tf.gather(x, [2, 0], axis=-1), tf.gather_nd(x, [[0, 1], [1, 2]]),
                            tf.gather(x, tf.reshape(i, (2, 1)), axis=1, batch_dims=1),
                            x[:, 1:3, ::2], x[..., 1], x[:, None, 1, -3:], x[::-1, ::-2], x[1, ..., None, 1:],
                            tf.slice(x, [0, 1, 0], [2, 2, -1]), tf.reverse(x, [1, 2]), tf.tile(x, [1, 2, 1]),
                            tf.broadcast_to(x[:1], [3, 3, 4]), tf.one_hot(i, 4), tf.linalg.diag(x[0]),
                            tf.linalg.set_diag(x, x[:, 0, :3])],
              [S((2, 3, 4), tf.float32), S((2,), tf.int32)], {1: (0, 3)}),
    "split": (lambda x: [*tf.split(x, 2, axis=2), *tf.split(x, [1, -1], axis=1), tf.stack([x, x * 2], axis=1),
                         *tf.unstack(x, axis=1)], [S((2, 3, 4), tf.float32)], {}),
    "argtop": (lambda x: [tf.argmax(x, axis=1), tf.argmin(x, axis=-1, output_type=tf.int32), *tf.math.top_k(x, 2),
                          tf.cumsum(x, axis=2), tf.cumsum(x, axis=1, exclusive=True, reverse=True)],
               [S((2, 3, 4), tf.float32)], {}),
    "fill": (lambda v, x: [tf.fill([3, 4], v) + x, tf.raw_ops.ZerosLike(x=x * v) + 1.0,
                           tf.raw_ops.OnesLike(x=x * v) * 2.0],
             [S((), tf.float32), S((3, 4), tf.float32)], {}),
    "matmul": (lambda a, b: [tf.matmul(a, b), tf.matmul(b, a, adjoint_a=True, adjoint_b=True),
                             tf.matmul(a[0], b)],
               [S((2, 3, 4), tf.float32), S((2, 4, 3), tf.float32)], {}),
    "space": (lambda x: [tf.nn.space_to_depth(x, 2), tf.nn.depth_to_space(x, 2),
                         tf.space_to_batch_nd(x, [2, 2], [[0, 0], [1, 1]]),
                         tf.nn.local_response_normalization(x, 2, 1.0, 0.5, 0.75), tf.math.l2_normalize(x, -1)],
              [S((1, 4, 6, 8), tf.float32)], {}),
    "batch_to_space": (lambda x: [tf.batch_to_space(x, [2, 2], [[0, 0], [1, 1]])], [S((4, 3, 4, 2), tf.float32)], {}),
    "embed": (lambda i, x: [tf.nn.embedding_lookup(tf.constant(np.arange(20, dtype=np.float32).reshape(5, 4)), i) + x,
                            tf.scatter_nd(tf.constant([[1], [3], [1]]), x[:, :2], [5, 2])],
              [S((3,), tf.int32), S((3, 4), tf.float32)], {0: (0, 5)}),
    "nms": (lambda b, s: [*tf.raw_ops.NonMaxSuppressionV4(boxes=b, scores=s, max_output_size=5, iou_threshold=0.5,
                                                          score_threshold=0.1, pad_to_max_output_size=True),
                          *tf.image.non_max_suppression_with_scores(b, s, 6, 0.4, 0.2, 0.5),
                          *tf.image.non_max_suppression_with_scores(b, s, 8, 0.6, 0.0)],
            [S((12, 4), tf.float32), S((12,), tf.float32)], {}),
    "conv3d": (lambda x: [tf.nn.relu(tf.nn.conv3d(x, CONV3D_W, [1, 1, 2, 1, 1], "SAME")),
                          tf.nn.conv3d(x, CONV3D_W, [1, 2, 1, 1, 1], "VALID"),
                          tf.nn.conv3d(x, CONV3D_W, [1, 1, 1, 1, 1], "SAME", dilations=[1, 2, 1, 2, 1])],
               [S((1, 4, 5, 6, 3), tf.float32)], {}),
    # the filter is (depth, height, width, output channels, input channels)
    "conv3d_transpose": (lambda x: [tf.nn.relu(tf.nn.conv3d_transpose(x, CONV3D_TW, [1, 8, 10, 12, 3], 2, "SAME")),
                                    tf.nn.conv3d_transpose(x, CONV3D_TW, [1, 7, 9, 11, 3], 2, "SAME"),
                                    tf.nn.conv3d_transpose(x, CONV3D_TW, [1, 5, 7, 7, 3], 1, "VALID"),
                                    tf.nn.conv3d_transpose(x, CONV3D_TW, [1, 9, 16, 13, 3], [2, 3, 2], "VALID")],
                         [S((1, 4, 5, 6, 4), tf.float32)], {}),
    "segments": (lambda x, n: [tf.reverse_sequence(x, n, seq_axis=1, batch_axis=0),
                               tf.reverse_sequence(x, n, seq_axis=2, batch_axis=0),
                               tf.reverse_sequence(x, [3, 1], seq_axis=1, batch_axis=0),
                               tf.raw_ops.SparseToDense(sparse_indices=tf.constant([[0, 1], [2, 3], [4, 0]]),
                                                        output_shape=[5, 4], sparse_values=x[0, 0, :3],
                                                        default_value=0.5),
                               tf.math.unsorted_segment_sum(x, [0, 2], 4), tf.math.unsorted_segment_max(x, [1, 1], 3),
                               tf.math.unsorted_segment_min(x, [1, 0], 3), tf.math.unsorted_segment_prod(x, [0, 0], 2),
                               tf.math.segment_sum(x, [0, 1])],
                 [S((2, 3, 4), tf.float32), S((2,), tf.int32)], {1: (1, 4)}),
    "unique": (lambda x: [*tf.unique(x)], [S((10,), tf.int32)], {0: (0, 4)}),
    "bits": (lambda a, b, u: [tf.bitwise.bitwise_xor(a, b), tf.bitwise.right_shift(a, b),
                              tf.bitwise.right_shift(u, tf.cast(b, tf.uint8))],
             [S((3, 4), tf.int32), S((4,), tf.int32), S((3, 4), tf.uint8)], {0: (-999, 999), 1: (0, 40), 2: (0, 255)}),
    # ops on a convolution's output, which the frontend holds NCHW: their axes are remapped, not transposed
    "after_conv": (lambda x: [*tf.split(_conv(x), 2, axis=3), _conv(x)[:, 1:5, ::2, :], tf.reverse(_conv(x), [2, 3]),
                              tf.tile(_conv(x), [1, 1, 2, 1]), tf.cumsum(_conv(x), axis=3),
                              tf.argmax(_conv(x), axis=3), tf.argmax(_conv(x), axis=1),
                              tf.math.l2_normalize(_conv(x), -1), tf.reduce_any(_conv(x) > 0, axis=[1, 2]),
                              tf.gather(_conv(x), [1, 0, 5], axis=3), tf.nn.space_to_depth(_conv(x), 2),
                              tf.nn.local_response_normalization(_conv(x), 1, 0.5, 0.2, 0.6),
                              tf.maximum(_conv(x), 0.1), tf.where(_conv(x) > 0, _conv(x), -_conv(x)),
                              _conv(x)[:, :, :, 2], tf.math.squared_difference(_conv(x), x[..., :1])],
                   [S((1, 8, 8, 3), tf.float32)], {}),
}


def convert(fn, specs) -> bytes:
    f = tf.function(fn, input_signature=specs)
    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def feeds_for(path, int_ranges, seed=0):
    """Random inputs by position, as LiteRT lists them (its input order is the subgraph's)."""
    it = litert.Interpreter(model_path=str(path))
    rng = np.random.default_rng(seed)
    out = []
    for k, d in enumerate(it.get_input_details()):
        if d["dtype"] == np.bool_:
            out.append(rng.standard_normal(d["shape"]) > 0)
        elif np.issubdtype(d["dtype"], np.integer):
            lo, hi = int_ranges.get(k, (0, 3))
            out.append(rng.integers(lo, hi, d["shape"]).astype(d["dtype"]))
        else:
            out.append(rng.standard_normal(d["shape"]).astype(d["dtype"]))
    return out


def litert_outputs(path, inputs):
    it = litert.Interpreter(model_path=str(path))
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def tether_outputs(path, folder, inputs):
    graph, params = from_tflite(str(path))
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.run(**dict(zip(graph.inputs, inputs)))
    return [gm.get_output(i) for i in range(len(graph.outputs))]


def assert_match(outs, refs, what):
    assert len(outs) == len(refs), what
    worst = 0.0
    for k, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape, (what, k, out.shape, ref.shape)
        if ref.dtype.kind == "f":
            err = float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-30)) if ref.size else 0.0
            assert err <= 1e-4, (what, k, err)
            worst = max(worst, err)
        else:
            np.testing.assert_array_equal(out.astype(ref.dtype), ref, err_msg="%s output %d" % (what, k))
    return worst


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tflite-ops")
    paths = {}
    for name, (fn, specs, _) in FAMILIES.items():
        paths[name] = d / (name + ".tflite")
        paths[name].write_bytes(convert(fn, specs))
    return paths


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_litert(models, family, tmp_path):
    path = models[family]
    inputs = feeds_for(path, FAMILIES[family][2])
    assert_match(tether_outputs(path, tmp_path, inputs), litert_outputs(path, inputs), family)


# ---------------------------------------------------------------- SSD post-processing (a custom op)
def make_ssd(path, regular: bool, per_detection: int, score_threshold: float, int8: bool = False,
             num_classes: int = 4, max_detections: int = 10):
    """A small Keras SSD head (8x8 cells, 2 anchors each) converted to TFLite (``int8``: fully quantized, float
    outputs), with LiteRT's TFLite_Detection_PostProcess custom op appended on its box encodings and class
    scores."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema
    from flatbuffers import flexbuffers

    keras = tf.keras
    inp = keras.Input((16, 16, 3), batch_size=1)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inp)
    box = keras.layers.Reshape((128, 4))(keras.layers.Conv2D(8, 3, padding="same")(x))
    cls = keras.layers.Reshape((128, num_classes + 1))(keras.layers.Conv2D((num_classes + 1) * 2, 3,
                                                                           padding="same")(x))
    cls = keras.layers.Activation("sigmoid")(cls)
    converter = tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, [box, cls]))
    if int8:
        rng = np.random.default_rng(1)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([rng.standard_normal((1, 16, 16, 3)).astype(np.float32)]
                                                    for _ in range(8))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    model = schema.ModelT.InitFromPackedBuf(converter.convert(), 0)
    sg = model.subgraphs[0]
    yy, xx = np.meshgrid((np.arange(8) + 0.5) / 8, (np.arange(8) + 0.5) / 8, indexing="ij")
    anchors = np.stack([np.repeat(yy.reshape(-1), 2), np.repeat(xx.reshape(-1), 2), np.tile([0.2, 0.35], 64),
                        np.tile([0.2, 0.15], 64)], 1).astype(np.float32)

    def add_tensor(name, shape, data=None):
        t = schema.TensorT()
        t.name, t.shape, t.type = name.encode(), list(shape), schema.TensorType.FLOAT32
        b = schema.BufferT()
        if data is not None:
            b.data = np.frombuffer(data.tobytes(), np.uint8)
        model.buffers.append(b)
        t.buffer = len(model.buffers) - 1
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    box_t = next(i for i in sg.outputs if list(sg.tensors[i].shape)[-1] == 4)
    cls_t = next(i for i in sg.outputs if i != box_t)
    m = max_detections * per_detection
    outs = [add_tensor("detection_boxes", (1, m, 4)), add_tensor("detection_classes", (1, m)),
            add_tensor("detection_scores", (1, m)), add_tensor("num_detections", (1,))]
    fbb = flexbuffers.Builder()
    with fbb.Map():
        fbb.Int("max_detections", max_detections)
        fbb.Int("max_classes_per_detection", per_detection)
        fbb.Int("detections_per_class", 5)
        fbb.Bool("use_regular_nms", regular)
        fbb.Float("nms_score_threshold", score_threshold)
        fbb.Float("nms_iou_threshold", 0.5)
        fbb.Int("num_classes", num_classes)
        for key, value in (("y_scale", 10.0), ("x_scale", 10.0), ("h_scale", 5.0), ("w_scale", 5.0)):
            fbb.Float(key, value)
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM, schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = b"TFLite_Detection_PostProcess", 1
    model.operatorCodes.append(code)
    op = schema.OperatorT()
    op.opcodeIndex = len(model.operatorCodes) - 1
    op.inputs, op.outputs = [box_t, cls_t, add_tensor("anchors", anchors.shape, anchors)], outs
    op.customOptions = np.frombuffer(bytes(fbb.Finish()), np.uint8)
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    sg.operators.append(op)
    sg.outputs = outs
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.write_bytes(bytes(builder.Output()))


SSD_CASES = {"fast": (False, 1, 0.3, False), "fast_2_classes": (False, 2, 0.3, False), "regular": (True, 1, 0.3, False),
             "regular_few": (True, 1, 0.7, False), "fast_few": (False, 3, 0.75, False),
             "fast_int8_backbone": (False, 1, 0.3, True)}


@pytest.fixture(scope="module")
def ssd_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tflite-ssd")
    paths = {}
    for name, (regular, per, threshold, int8) in SSD_CASES.items():
        paths[name] = d / (name + ".tflite")
        make_ssd(paths[name], regular, per, threshold, int8)
    return paths


@pytest.mark.parametrize("case", sorted(SSD_CASES))
def test_detection_postprocess_matches_litert(ssd_models, case, tmp_path):
    path = ssd_models[case]
    per = SSD_CASES[case][1]
    for seed in (0, 1):
        inputs = feeds_for(path, {}, seed)
        refs = litert_outputs(path, inputs)
        outs = tether_outputs(path, tmp_path / str(seed), inputs)
        count = int(refs[3][0])
        assert outs[3][0] == count
        # LiteRT leaves the rows past the detections unwritten; tether zeroes them
        rows = count * per if not SSD_CASES[case][0] else count
        assert_match([o[:, :rows] for o in outs[:3]], [r[:, :rows] for r in refs[:3]], case)
        assert not outs[0][:, rows:].any() and not outs[2][:, rows:].any()


# ---------------------------------------------------------------- fused recurrent layers (built op by op)
class _Flatbuffer:
    """A one-subgraph TFLite model written with LiteRT's schema object API (float32 tensors)."""

    def __init__(self):
        from ai_edge_litert import schema_py_generated as schema

        self.schema = schema
        self.model = schema.ModelT()
        self.model.version, self.model.buffers, self.model.operatorCodes = 3, [schema.BufferT()], []
        self.g = schema.SubGraphT()
        self.g.tensors, self.g.operators = [], []
        self.model.subgraphs = [self.g]

    def tensor(self, name, shape, data=None, variable=False, dtype="float32"):
        t = self.schema.TensorT()
        t.name, t.shape, t.isVariable = name.encode(), list(shape), variable
        t.type = getattr(self.schema.TensorType, dtype.upper())
        b = self.schema.BufferT()
        if data is not None:
            b.data = np.frombuffer(np.ascontiguousarray(data, dtype).tobytes(), np.uint8)
        self.model.buffers.append(b)
        t.buffer = len(self.model.buffers) - 1
        self.g.tensors.append(t)
        return len(self.g.tensors) - 1

    def op(self, code, inputs, outputs, options_type, options):
        c = self.schema.OperatorCodeT()
        c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), 1
        self.model.operatorCodes.append(c)
        o = self.schema.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = len(self.model.operatorCodes) - 1, inputs, outputs
        o.builtinOptionsType, o.builtinOptions = options_type, options
        self.g.operators.append(o)

    def save(self, path, inputs, outputs):
        import flatbuffers

        self.g.inputs, self.g.outputs = inputs, outputs
        builder = flatbuffers.Builder(1024)
        builder.Finish(self.model.Pack(builder), file_identifier=b"TFL3")
        path.write_bytes(bytes(builder.Output()))


def make_lstm(path, cifg=False, peephole=False, time_major=False, bidirectional=False, merge=False,
              projection=0, layer_norm=False, cell_clip=0.0, proj_clip=0.0, relu=False,
              steps=5, batch=2, features=3, hidden=4):
    rng = np.random.default_rng(len(path.name))
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", (steps, batch, features) if time_major else (batch, steps, features))

    units = projection or hidden

    def direction(prefix):
        ids = []
        for kind, shape in (("w", (hidden, features)), ("r", (hidden, units))):
            ids += [-1 if cifg and g == "i" else fb.tensor(prefix + kind + g, shape, rng.standard_normal(shape) * 0.5)
                    for g in "ifco"]
        ids += [-1 if not peephole or (cifg and g == "i") else
                fb.tensor(prefix + "p" + g, (hidden,), rng.standard_normal(hidden) * 0.5) for g in "ifo"]
        ids += [-1 if cifg and g == "i" else fb.tensor(prefix + "b" + g, (hidden,), rng.standard_normal(hidden) * 0.5)
                for g in "ifco"]
        if projection:
            return ids + [fb.tensor(prefix + "pw", (units, hidden), rng.standard_normal((units, hidden)) * 0.5),
                          fb.tensor(prefix + "pb", (units,), rng.standard_normal(units) * 0.1)]
        return ids + [-1, -1]

    activation = S_.ActivationFunctionType.RELU if relu else S_.ActivationFunctionType.TANH

    lead = (steps, batch) if time_major else (batch, steps)
    if not bidirectional:
        norms = [-1 if cifg and g == "i" else fb.tensor("ln" + g, (hidden,), 1 + rng.standard_normal(hidden) * 0.2)
                 for g in "ifco"] if layer_norm else [-1] * 4
        ins = [x] + direction("") + [fb.tensor("h", (batch, units), variable=True),
                                     fb.tensor("c", (batch, hidden), variable=True)] + norms
        outs = [fb.tensor("y", lead + (units,))]
        o = S_.UnidirectionalSequenceLSTMOptionsT()
        o.fusedActivationFunction, o.timeMajor = activation, time_major
        o.cellClip, o.projClip = cell_clip, proj_clip
        fb.op(S_.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, outs,
              S_.BuiltinOptions.UnidirectionalSequenceLSTMOptions, o)
    else:
        ins = [x] + direction("f") + direction("b") + [fb.tensor(n, (batch, units if n.endswith("h") else hidden),
                                                                 variable=True)
                                                       for n in ("fh", "fc", "bh", "bc")] + [-1] * 9
        outs = [fb.tensor("y", lead + (2 * units,))] if merge else [fb.tensor("yf", lead + (units,)),
                                                                    fb.tensor("yb", lead + (units,))]
        o = S_.BidirectionalSequenceLSTMOptionsT()
        o.fusedActivationFunction, o.timeMajor, o.mergeOutputs = activation, time_major, merge
        o.cellClip, o.projClip = cell_clip, proj_clip
        fb.op(S_.BuiltinOperator.BIDIRECTIONAL_SEQUENCE_LSTM, ins, outs,
              S_.BuiltinOptions.BidirectionalSequenceLSTMOptions, o)
    fb.save(path, [x], outs)


def make_rnn(path, time_major=False, relu=False, steps=5, batch=2, features=3, hidden=4):
    rng = np.random.default_rng(1)
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", (steps, batch, features) if time_major else (batch, steps, features))
    ins = [x] + [fb.tensor(n, shape, rng.standard_normal(shape) * 0.5)
                 for n, shape in (("w", (hidden, features)), ("r", (hidden, hidden)), ("b", (hidden,)))]
    ins.append(fb.tensor("h", (batch, hidden), variable=True))
    y = fb.tensor("y", (steps, batch, hidden) if time_major else (batch, steps, hidden))
    o = S_.SequenceRNNOptionsT()
    o.timeMajor = time_major
    o.fusedActivationFunction = S_.ActivationFunctionType.RELU if relu else S_.ActivationFunctionType.TANH
    fb.op(S_.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_RNN, ins, [y], S_.BuiltinOptions.SequenceRNNOptions, o)
    fb.save(path, [x], [y])


def make_birnn(path, time_major=False, merge=False, steps=5, batch=2, features=3, hidden=4):
    rng = np.random.default_rng(2)
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", (steps, batch, features) if time_major else (batch, steps, features))
    ins = [x]
    for d in "fb":
        ins += [fb.tensor(d + n, shape, rng.standard_normal(shape) * 0.5)
                for n, shape in (("w", (hidden, features)), ("r", (hidden, hidden)), ("b", (hidden,)))]
        ins.append(fb.tensor(d + "h", (batch, hidden), variable=True))
    lead = (steps, batch) if time_major else (batch, steps)
    outs = [fb.tensor("y", lead + (2 * hidden,))] if merge else [fb.tensor("yf", lead + (hidden,)),
                                                                 fb.tensor("yb", lead + (hidden,))]
    o = S_.BidirectionalSequenceRNNOptionsT()
    o.timeMajor, o.mergeOutputs, o.fusedActivationFunction = time_major, merge, S_.ActivationFunctionType.TANH
    fb.op(S_.BuiltinOperator.BIDIRECTIONAL_SEQUENCE_RNN, ins + [-1, -1, -1], outs,
          S_.BuiltinOptions.BidirectionalSequenceRNNOptions, o)
    fb.save(path, [x], outs)


RECURRENT = {"lstm": (make_lstm, {}), "lstm_cifg_peephole": (make_lstm, dict(cifg=True, peephole=True)),
             "lstm_peephole_time_major": (make_lstm, dict(peephole=True, time_major=True)),
             "bilstm": (make_lstm, dict(bidirectional=True)),
             "bilstm_merged_time_major": (make_lstm, dict(bidirectional=True, merge=True, time_major=True)),
             "bilstm_cifg_peephole": (make_lstm, dict(bidirectional=True, cifg=True, peephole=True)),
             "lstm_projection_clips": (make_lstm, dict(projection=3, cell_clip=0.8, proj_clip=0.5, peephole=True)),
             "lstm_layer_norm": (make_lstm, dict(layer_norm=True, time_major=True)),
             "lstm_layer_norm_cifg_relu": (make_lstm, dict(layer_norm=True, cifg=True, peephole=True, relu=True)),
             # LiteRT's bidirectional layer with merged batch-major outputs and a clip, relu or projection gives
             # different outputs from one process to the next, so those are not compared
             "bilstm_relu": (make_lstm, dict(bidirectional=True, relu=True)),
             "bilstm_clip_time_major": (make_lstm, dict(bidirectional=True, time_major=True, cell_clip=0.5)),
             "birnn": (make_birnn, {}), "birnn_merged_time_major": (make_birnn, dict(time_major=True, merge=True)),
             "rnn": (make_rnn, {}), "rnn_relu_time_major": (make_rnn, dict(time_major=True, relu=True))}


@pytest.mark.parametrize("case", sorted(RECURRENT))
def test_recurrent_matches_litert(case, tmp_path):
    make, kwargs = RECURRENT[case]
    path = tmp_path / (case + ".tflite")
    make(path, **kwargs)
    inputs = feeds_for(path, {})
    assert_match(tether_outputs(path, tmp_path / "out", inputs), litert_outputs(path, inputs), case)


def make_fake_quant(path, lo, hi, bits, narrow):
    fb = _Flatbuffer()
    x, y = fb.tensor("x", (2, 3, 8)), fb.tensor("y", (2, 3, 8))
    o = fb.schema.FakeQuantOptionsT()
    o.min, o.max, o.numBits, o.narrowRange = lo, hi, bits, narrow
    fb.op(fb.schema.BuiltinOperator.FAKE_QUANT, [x], [y], fb.schema.BuiltinOptions.FakeQuantOptions, o)
    fb.save(path, [x], [y])


def make_dynamic_update_slice(path, start):
    fb = _Flatbuffer()
    x, u = fb.tensor("x", (4, 5, 3)), fb.tensor("u", (2, 3, 3))
    s = fb.tensor("start", (3,), np.array(start, np.int32), dtype="int32")
    y = fb.tensor("y", (4, 5, 3))
    fb.op(fb.schema.BuiltinOperator.DYNAMIC_UPDATE_SLICE, [x, u, s], [y], 0, None)
    fb.save(path, [x, u], [y])


SINGLE_OPS = {"fake_quant_8bit": (make_fake_quant, (-1.0, 1.5, 8, False)),
              "fake_quant_4bit": (make_fake_quant, (-0.3, 2.0, 4, False)),
              "dynamic_update_slice": (make_dynamic_update_slice, ([1, 1, 0],)),
              "dynamic_update_slice_clamped": (make_dynamic_update_slice, ([3, -2, 0],))}


@pytest.mark.parametrize("case", sorted(SINGLE_OPS))
def test_single_op_models_match_litert(case, tmp_path):
    make, args = SINGLE_OPS[case]
    path = tmp_path / (case + ".tflite")
    make(path, *args)
    inputs = [x * 2 for x in feeds_for(path, {})]
    assert_match(tether_outputs(path, tmp_path / "out", inputs), litert_outputs(path, inputs), case)


# ---------------------------------------------------------------- WHILE loops (Keras 3 recurrent layers)
KERAS_RNN = {"lstm": ("LSTM", False, True), "bilstm": ("LSTM", True, True), "gru_last": ("GRU", False, False),
             "simple_rnn": ("SimpleRNN", False, True)}


@pytest.mark.parametrize("case", sorted(KERAS_RNN))
def test_keras_recurrent_while_loops_match_litert(case, tmp_path):
    layer, bidirectional, sequences = KERAS_RNN[case]
    keras = tf.keras
    keras.utils.set_random_seed(3)
    inp = keras.Input((6, 3), batch_size=1)
    rnn = getattr(keras.layers, layer)(4, return_sequences=sequences)
    if bidirectional:
        rnn = keras.layers.Bidirectional(rnn)
    path = tmp_path / (case + ".tflite")
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, rnn(inp))).convert())
    inputs = feeds_for(path, {})
    assert_match(tether_outputs(path, tmp_path / "out", inputs), litert_outputs(path, inputs), case)


def test_if_runs_the_branch_the_condition_takes(tmp_path):
    path = tmp_path / "if.tflite"
    path.write_bytes(convert(lambda x, c: [tf.cond(c, lambda: x * 2.0 + 1.0, lambda: tf.nn.relu(x) - 3.0)],
                             [S((2, 3), tf.float32), S((), tf.bool)]))
    for c in (True, False):
        inputs = [np.array(c) if v.dtype == np.bool_ else v for v in feeds_for(path, {})]
        assert_match(tether_outputs(path, tmp_path / str(c), inputs), litert_outputs(path, inputs), "if %s" % c)


def test_while_loop_beyond_the_unroll_limit_is_refused(tmp_path):
    def count(x):
        return tf.while_loop(lambda i, v: i < 300, lambda i, v: (i + 1, v * 1.001), [tf.constant(0), x])[1]

    path = tmp_path / "long.tflite"
    path.write_bytes(convert(count, [S((2,), tf.float32)]))
    with pytest.raises(UnsupportedOpError, match="WHILE_LOOP_OF_MORE_THAN_256_ITERATIONS"):
        from_tflite(str(path))


def test_unsupported_ops_named_in_one_line(tmp_path):
    path = tmp_path / "where.tflite"
    path.write_bytes(convert(lambda x: [tf.where(x > 0.5), tf.signal.rfft2d(x)],
                             [S((2, 4), tf.float32)]))
    with pytest.raises(UnsupportedOpError) as err:
        from_tflite(str(path))
    msg = str(err.value)
    assert "\n" not in msg and "WHERE v" in msg and "RFFT2D v" in msg and "node" in msg


def test_cli_compile_check_and_corrupt_file(ssd_models, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    path = str(ssd_models["fast"])
    result = CliRunner().invoke(cli, ["compile", "--check", path])
    assert result.exit_code == 0, result.output
    assert "TFLite_Detection_PostProcess" in result.output
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["compile", path, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "graph.json").exists() or any(out.iterdir())
    bad = tmp_path / "cut.tflite"
    bad.write_bytes(open(path, "rb").read()[:300])
    result = CliRunner().invoke(cli, ["compile", str(bad), "-o", str(tmp_path / "bad_out")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line]
    assert len(lines) == 1 and "cut.tflite" in lines[0] and "Traceback" not in result.output


@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_ssd(emulated_devices, ssd_models, tmp_path):
    device = emulated_devices.for_preset("rasp4b")
    path = ssd_models["regular"]
    inputs = feeds_for(path, {})
    refs = litert_outputs(path, inputs)
    graph, params = from_tflite(str(path))
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(**dict(zip(graph.inputs, inputs)))
            outs = [gm.get_output(i) for i in range(4)]
    count = int(refs[3][0])
    assert outs[3][0] == count
    assert_match([o[:, :count] for o in outs[:3]], [r[:, :count] for r in refs[:3]], "ssd on rasp4b")
