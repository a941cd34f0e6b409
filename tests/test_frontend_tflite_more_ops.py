"""More TFLite builtins, each compared with LiteRT on the same input: the one-step recurrent cells (LSTM, RNN,
SVDF: written op by op with LiteRT's schema, as the TF converter no longer emits them), BUCKETIZE, RFFT2D read
through COMPLEX_ABS / REAL / IMAG (made with the TF converter), DILATE (written op by op), and one refused variant.

Helpers (model writing, LiteRT and tether runs, the error reading) are test_frontend_tflite_ops's."""

import numpy as np
import pytest

from tether.errors import UnsupportedOpError
from tether.frontend import from_tflite

from test_frontend_tflite_ops import _Flatbuffer, assert_match, feeds_for, litert_outputs, tether_outputs

tf = pytest.importorskip("tensorflow")


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
