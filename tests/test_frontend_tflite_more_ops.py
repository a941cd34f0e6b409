"""More TFLite builtins, each compared with LiteRT on the same input: the one-step recurrent cells (LSTM, RNN,
SVDF: written op by op with LiteRT's schema, as the TF converter no longer emits them), BUCKETIZE and RFFT2D read
through COMPLEX_ABS / REAL / IMAG (made with the TF converter; one RFFT2D written op by op), DILATE and
REDUCE_WINDOW (written op by op), resource variables with their CALL_ONCE init (a tf.Module's state, converted;
LiteRT's first invoke), and refused variants (the BASIC LSTM kernel, a spectrum read by another op, a window past
the input's end, a variable read before any assignment).

Helpers (model writing, LiteRT and tether runs, the error reading) are test_frontend_tflite_ops's."""

import numpy as np
import pytest

from tether.errors import UnsupportedOpError
from tether.frontend import from_tflite

from test_frontend_tflite_ops import _Flatbuffer, assert_match, convert, feeds_for, litert_outputs, tether_outputs

tf = pytest.importorskip("tensorflow")
S = tf.TensorSpec


def _check(path, tmp_path, int_ranges=None, scale=1.0):
    inputs = [x * scale if x.dtype.kind == "f" else x for x in feeds_for(path, int_ranges or {})]
    assert_match(tether_outputs(path, tmp_path / "out", inputs), litert_outputs(path, inputs), path.stem)


# ---------------------------------------------------------------- one-step recurrent cells
def make_lstm_cell(path, cifg=False, peephole=False, projection=0, layer_norm=False, cell_clip=0.0, proj_clip=0.0,
                   relu=False, basic=False, batch=2, features=3, hidden=4):
    """The full LSTM kernel's 24 inputs (a (batch, features) input, per-gate weights, state variables)."""
    rng = np.random.default_rng(len(path.name))
    fb = _Flatbuffer()
    S_ = fb.schema
    units = projection or hidden
    x = fb.tensor("x", (batch, features))
    ids = [x]
    for kind, shape in (("w", (hidden, features)), ("r", (hidden, units))):
        ids += [-1 if cifg and g == "i" else fb.tensor(kind + g, shape, rng.standard_normal(shape) * 0.5)
                for g in "ifco"]
    ids += [-1 if not peephole or (cifg and g == "i") else
            fb.tensor("p" + g, (hidden,), rng.standard_normal(hidden) * 0.5) for g in "ifo"]
    ids += [-1 if cifg and g == "i" else fb.tensor("b" + g, (hidden,), rng.standard_normal(hidden) * 0.5)
            for g in "ifco"]
    ids += [fb.tensor("pw", (units, hidden), rng.standard_normal((units, hidden)) * 0.5),
            fb.tensor("pb", (units,), rng.standard_normal(units) * 0.1)] if projection else [-1, -1]
    ids += [fb.tensor("h", (batch, units), variable=True), fb.tensor("c", (batch, hidden), variable=True)]
    ids += [-1 if cifg and g == "i" else fb.tensor("ln" + g, (hidden,), 1 + rng.standard_normal(hidden) * 0.2)
            for g in "ifco"] if layer_norm else [-1] * 4
    y = fb.tensor("y", (batch, units))
    o = S_.LSTMOptionsT()
    o.fusedActivationFunction = S_.ActivationFunctionType.RELU if relu else S_.ActivationFunctionType.TANH
    o.cellClip, o.projClip = cell_clip, proj_clip
    o.kernelType = S_.LSTMKernelType.BASIC if basic else S_.LSTMKernelType.FULL
    fb.op(S_.BuiltinOperator.LSTM, ids, [y], S_.BuiltinOptions.LSTMOptions, o)
    fb.save(path, [x], [y])


def make_rnn_cell(path, activation="TANH", batch=2, features=3, hidden=5):
    rng = np.random.default_rng(4)
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", (batch, features))
    ins = [x] + [fb.tensor(n, shape, rng.standard_normal(shape) * 0.5)
                 for n, shape in (("w", (hidden, features)), ("r", (hidden, hidden)), ("b", (hidden,)))]
    ins.append(fb.tensor("h", (batch, hidden), variable=True))
    y = fb.tensor("y", (batch, hidden))
    o = S_.RNNOptionsT()
    o.fusedActivationFunction = getattr(S_.ActivationFunctionType, activation)
    fb.op(S_.BuiltinOperator.RNN, ins, [y], S_.BuiltinOptions.RNNOptions, o)
    fb.save(path, [x], [y])


def make_svdf(path, rank=2, activation="RELU", bias=True, batch=2, features=3, units=4, memory=5):
    rng = np.random.default_rng(5)
    fb = _Flatbuffer()
    S_ = fb.schema
    filters = units * rank
    x = fb.tensor("x", (batch, features))
    ins = [x, fb.tensor("wf", (filters, features), rng.standard_normal((filters, features)) * 0.5),
           fb.tensor("wt", (filters, memory), rng.standard_normal((filters, memory)) * 0.5),
           fb.tensor("b", (units,), rng.standard_normal(units)) if bias else -1,
           fb.tensor("s", (batch, filters * memory), variable=True)]
    y = fb.tensor("y", (batch, units))
    o = S_.SVDFOptionsT()
    o.rank, o.fusedActivationFunction = rank, getattr(S_.ActivationFunctionType, activation)
    fb.op(S_.BuiltinOperator.SVDF, ins, [y], S_.BuiltinOptions.SVDFOptions, o)
    fb.save(path, [x], [y])


CELLS = {"lstm": (make_lstm_cell, {}),
         "lstm_cifg_peephole": (make_lstm_cell, dict(cifg=True, peephole=True)),
         "lstm_relu": (make_lstm_cell, dict(relu=True)),
         "lstm_projection_clips": (make_lstm_cell, dict(projection=3, cell_clip=0.8, proj_clip=0.5, peephole=True)),
         "lstm_layer_norm": (make_lstm_cell, dict(layer_norm=True)),
         "rnn_tanh": (make_rnn_cell, {}), "rnn_relu": (make_rnn_cell, dict(activation="RELU")),
         "rnn_none": (make_rnn_cell, dict(activation="NONE")),
         "svdf_rank2_relu": (make_svdf, {}), "svdf_rank1": (make_svdf, dict(rank=1, activation="NONE")),
         "svdf_tanh_no_bias": (make_svdf, dict(activation="TANH", bias=False))}


@pytest.mark.parametrize("case", sorted(CELLS))
def test_recurrent_cells_match_litert(case, tmp_path):
    make, kwargs = CELLS[case]
    path = tmp_path / (case + ".tflite")
    make(path, **kwargs)
    _check(path, tmp_path)


def test_basic_lstm_kernel_is_refused(tmp_path):
    path = tmp_path / "basic.tflite"
    make_lstm_cell(path, basic=True)
    with pytest.raises(UnsupportedOpError) as err:
        from_tflite(str(path))
    msg = str(err.value)
    assert "\n" not in msg and "LSTM v1 (node 0:y)" in msg and "BASIC kernel type (expected the FULL" in msg


# ---------------------------------------------------------------- made with the TF converter
CONVERTED = {
    "bucketize": (lambda x, i, d: [tf.raw_ops.Bucketize(input=x, boundaries=[-1.0, 0.0, 0.5, 0.5, 2.0]),
                                   tf.raw_ops.Bucketize(input=i, boundaries=[-3.0, 0.0, 2.5, 7.0]),
                                   tf.raw_ops.Bucketize(input=d, boundaries=[-0.25, 1.0])],
                  [S((3, 4), tf.float32), S((5,), tf.int32), S((2, 1, 3, 2), tf.float64)], {1: (-6, 9)}),
    # fft_length as the input (8 x 4 -> 8 x 3 frequencies), cropped rows and padded columns (the converter pads
    # with a PAD before the RFFT2D), padded rows and cropped columns, two readers of one spectrum
    "rfft2d": (lambda x: [tf.abs(tf.signal.rfft2d(x)), tf.math.real(tf.signal.rfft2d(x, [4, 8])),
                          tf.math.imag(tf.signal.rfft2d(x, [16, 2])),
                          tf.abs(tf.signal.rfft2d(x, [8, 2])) + tf.math.real(tf.signal.rfft2d(x, [8, 2]))],
               [S((2, 8, 4), tf.float32)], {}),
    "rfft2d_4d": (lambda x: [tf.abs(tf.signal.rfft2d(x, [16, 16])), tf.math.imag(tf.signal.rfft2d(x, [16, 16]))],
                  [S((1, 2, 16, 16), tf.float32)], {}),
}


@pytest.mark.parametrize("case", sorted(CONVERTED))
def test_converted_models_match_litert(case, tmp_path):
    fn, specs, int_ranges = CONVERTED[case]
    path = tmp_path / (case + ".tflite")
    path.write_bytes(convert(fn, specs))
    _check(path, tmp_path, int_ranges, scale=2.0)


# ---------------------------------------------------------------- DILATE (written op by op)
def make_dilate(path, shape, dilations, dtype="float32", pad_input=True):
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", shape, dtype=dtype)
    d = fb.tensor("dilations", (len(shape),), np.array(dilations, np.int32), dtype="int32")
    pad = fb.tensor("pad", (), None if pad_input else np.array(-7, dtype), dtype=dtype)
    y = fb.tensor("y", [(n - 1) * k + 1 for n, k in zip(shape, dilations)], dtype=dtype)
    fb.op(S_.BuiltinOperator.DILATE, [x, d, pad], [y], 0, None)     # its options (none) would be builtin_options_2
    fb.save(path, [x, pad] if pad_input else [x], [y])


DILATE = {"dilate_float": dict(shape=(2, 3, 4), dilations=[1, 2, 3]),
          "dilate_4d": dict(shape=(1, 3, 3, 2), dilations=[2, 3, 2, 1]),
          "dilate_int_const_pad": dict(shape=(3, 4), dilations=[3, 2], dtype="int32", pad_input=False)}


@pytest.mark.parametrize("case", sorted(DILATE))
def test_dilate_matches_litert(case, tmp_path):
    path = tmp_path / (case + ".tflite")
    make_dilate(path, **DILATE[case])
    _check(path, tmp_path, {0: (-50, 50)})


def test_rfft2d_read_by_another_op_is_refused(tmp_path):
    path = tmp_path / "fft_mul.tflite"
    path.write_bytes(convert(lambda x: [tf.abs(tf.signal.rfft2d(x) * tf.signal.rfft2d(x))], [S((4, 8), tf.float32)]))
    with pytest.raises(UnsupportedOpError) as err:
        from_tflite(str(path))
    msg = str(err.value)
    assert "\n" not in msg and "its complex output is read by MUL" in msg and "expected COMPLEX_ABS, REAL, IMAG" in msg


# ---------------------------------------------------------------- REDUCE_WINDOW (written op by op)
def make_reduce_window(path, function, shape, window, strides, dilations, dtype="float32", init=None):
    """``init``: a constant init value, else a graph input."""
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", shape, dtype=dtype)
    init_t = fb.tensor("init", (), None if init is None else np.array(init, dtype), dtype=dtype)
    params = [fb.tensor(n, (len(shape),), np.array(v, np.int64), dtype="int64")
              for n, v in (("window", window), ("strides", strides), ("dilations", dilations))]
    out = [(n - (k - 1) * d - 1) // s + 1 for n, k, s, d in zip(shape, window, strides, dilations)]
    y = fb.tensor("y", out, dtype=dtype)
    fb.op(S_.BuiltinOperator.REDUCE_WINDOW, [x, init_t] + params, [y], 0, None)
    o = S_.ReduceWindowOptionsT()
    o.reduceFunction = getattr(S_.ReduceWindowFunction, function)
    fb.g.operators[-1].builtinOptions2Type, fb.g.operators[-1].builtinOptions2 = \
        S_.BuiltinOptions2.ReduceWindowOptions, o
    fb.save(path, [x] if init is not None else [x, init_t], [y])


WINDOWS = {"reduce_window_add": dict(function="ADD", shape=(4, 7, 6), window=[2, 3, 1], strides=[2, 2, 1],
                                     dilations=[1, 2, 1]),
           "reduce_window_max_4d": dict(function="MAXIMUM", shape=(1, 6, 6, 3), window=[1, 3, 3, 1],
                                        strides=[1, 1, 3, 1], dilations=[1, 1, 1, 1], init=-1e30),
           "reduce_window_min": dict(function="MINIMUM", shape=(5, 4), window=[3, 2], strides=[1, 2],
                                     dilations=[2, 1], init=0.25),
           "reduce_window_mul": dict(function="MUL", shape=(3, 8), window=[1, 4], strides=[1, 4],
                                     dilations=[1, 1], init=1.0),
           "reduce_window_max_int": dict(function="MAXIMUM", shape=(7, 5), window=[2, 2], strides=[2, 3],
                                         dilations=[2, 1], dtype="int32"),
           "reduce_window_any": dict(function="ANY", shape=(4, 6), window=[2, 3], strides=[2, 3], dilations=[1, 1],
                                     dtype="bool", init=False),
           "reduce_window_all": dict(function="ALL", shape=(4, 6), window=[3, 2], strides=[1, 2], dilations=[1, 3],
                                     dtype="bool", init=True)}


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_reduce_window_matches_litert(case, tmp_path):
    path = tmp_path / (case + ".tflite")
    make_reduce_window(path, **WINDOWS[case])
    _check(path, tmp_path, {0: (-50, 50), 1: (-20, 20)})


def test_reduce_window_past_the_end_is_refused(tmp_path):
    path = tmp_path / "window_past_end.tflite"
    make_reduce_window(path, "ADD", (5, 4), [2, 1], [2, 1], [1, 1], init=0.0)
    with pytest.raises(UnsupportedOpError, match="REDUCE_WINDOW v1 .*window 2, stride 2, dilation 1 over 5 "
                                                 "elements on axis 0 .expected windows that tile the axis"):
        from_tflite(str(path))


# ---------------------------------------------------------------- resource variables (a streaming model's state)
class _Stateful(tf.Module):
    """State initialised in a CALL_ONCE subgraph, read, updated and read again within the call."""

    def __init__(self):
        self.s = tf.Variable(np.arange(8, dtype=np.float32).reshape(2, 4) * 0.1)
        self.n = tf.Variable(tf.constant(3, tf.int32))

    @tf.function(input_signature=[S((2, 4), tf.float32)])
    def __call__(self, x):
        y = x * 2.0 + self.s
        self.s.assign(y)
        self.n.assign_add(1)
        return {"y": y, "again": self.s * 3.0 - x, "n": self.n.read_value()}


def test_resource_variables_first_call_matches_litert(tmp_path):
    m = _Stateful()
    path = tmp_path / "stateful.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([m.__call__.get_concrete_function()], m)
                     .convert())
    _check(path, tmp_path)


def test_variable_read_before_assignment_is_refused(tmp_path):
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", (2,))
    handle = fb.tensor("handle", (), dtype="resource")
    v, y = fb.tensor("v", (2,)), fb.tensor("y", (2,))
    o = S_.VarHandleOptionsT()
    o.sharedName = b"state"
    fb.op(S_.BuiltinOperator.VAR_HANDLE, [], [handle], S_.BuiltinOptions.VarHandleOptions, o)
    fb.op(S_.BuiltinOperator.READ_VARIABLE, [handle], [v], 0, None)
    fb.op(S_.BuiltinOperator.ADD, [x, v], [y], 0, None)
    path = tmp_path / "unset.tflite"
    fb.save(path, [x], [y])
    with pytest.raises(UnsupportedOpError) as err:
        from_tflite(str(path))
    msg = str(err.value)
    assert "\n" not in msg and "READ_VARIABLE v1" in msg and "variable 'state' is read before a value is" in msg


def test_rfft2d_zero_pads_a_short_input_as_litert(tmp_path):
    """Written op by op: the TF converter pads a short input with a PAD first, LiteRT's kernel pads it itself."""
    fb = _Flatbuffer()
    S_ = fb.schema
    x = fb.tensor("x", (2, 3, 5))
    length = fb.tensor("fft_length", (2,), np.array([4, 8], np.int32), dtype="int32")
    spectrum = fb.tensor("spectrum", (2, 4, 5), dtype="complex64")
    outs = [fb.tensor(n, (2, 4, 5)) for n in ("abs", "re", "im")]
    fb.op(S_.BuiltinOperator.RFFT2D, [x, length], [spectrum], 0, None)
    for op, out in zip((S_.BuiltinOperator.COMPLEX_ABS, S_.BuiltinOperator.REAL, S_.BuiltinOperator.IMAG), outs):
        fb.op(op, [spectrum], [out], 0, None)
    path = tmp_path / "rfft2d_short.tflite"
    fb.save(path, [x], outs)
    _check(path, tmp_path)
