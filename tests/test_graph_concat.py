"""Concats as views, end to end: real ONNX graphs compiled with build_graph, run by the device runtime's graph
executor and compared with onnxruntime. Eligible concats have no kernel and their inputs are entries at byte
offsets; ineligible ones keep their concat kernel. Offsets are deliberately not multiples of 16 or 64 bytes
(7x7 and 5x5 planes, odd channel counts), so vector kernels read and write unaligned slices."""
import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx

RNG = np.random.default_rng(7)


class _Builder:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base):
        self.n += 1
        return "%s%d" % (base, self.n)

    def const(self, arr):
        nm = self.name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), nm))
        return nm

    def op(self, op_type, inputs, **attrs):
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x, cin, cout, k=3):
        w = self.const(RNG.standard_normal((cout, cin, k, k)) * (1.0 / np.sqrt(cin * k * k)))
        b = self.const(RNG.standard_normal(cout) * 0.1)
        return self.op("Conv", [x, w, b], pads=[k // 2] * 4)

    def bn_relu(self, x, c):
        args = [self.const(RNG.uniform(0.5, 1.5, c)), self.const(RNG.standard_normal(c) * 0.1),
                self.const(RNG.standard_normal(c) * 0.1), self.const(RNG.uniform(0.5, 1.5, c))]
        return self.op("Relu", [self.op("BatchNormalization", [x] + args, epsilon=1e-5)])

    def model(self, inputs, outputs):
        g = helper.make_graph(self.nodes, "concats",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def densenet_like(hw=7, c0=5, growth=3, layers=4):
    """stem -> [bn/relu -> conv -> concat(everything so far)] x layers -> bn/relu -> 1x1 conv; the first concat
    is read again at the end (a GlobalAveragePool), so its bytes must survive the whole block."""
    b = _Builder()
    prev, ch = b.conv("x", 3, c0), c0
    first = None
    for _ in range(layers):
        new = b.conv(b.bn_relu(prev, ch), ch, growth)
        prev = b.op("Concat", [prev, new], axis=1)
        first = first or prev
        ch += growth
    y = b.conv(b.bn_relu(prev, ch), ch, 4, k=1)
    late = b.op("GlobalAveragePool", [first])
    return b.model([("x", [1, 3, hw, hw])], [y, late])


def inception_like(hw=5):
    """Two inception blocks (1x1, 1x1->3x3, 1x1->5x5, pool->1x1, concatenated along channels); the second
    block's concat is a graph output, the first feeds four branches and a pool."""
    b = _Builder()
    x = b.op("Relu", [b.conv("x", 3, 6)])

    def block(x, cin):
        outs = [b.op("Relu", [b.conv(x, cin, 3, k=1)]),
                b.op("Relu", [b.conv(b.op("Relu", [b.conv(x, cin, 2, k=1)]), 2, 5)]),
                b.op("Relu", [b.conv(b.op("Relu", [b.conv(x, cin, 2, k=1)]), 2, 1, k=5)]),
                b.op("Relu", [b.conv(b.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1] * 4), cin, 4, k=1)])]
        return b.op("Concat", outs, axis=1), 3 + 5 + 1 + 4
    c1, ch = block(x, 6)
    c2, ch = block(c1, ch)
    pooled = b.op("MaxPool", [c1], kernel_shape=[2, 2], strides=[2, 2])
    return b.model([("x", [1, 3, hw, hw])], [c2, pooled])


def fallback_model(hw=5):
    """A concat reading the graph input keeps its kernel; its output is a slice of the next (free) concat;
    a value in two concats and a concat reading one value twice keep their kernels too."""
    b = _Builder()
    a = b.op("Relu", [b.conv("x", 3, 3)])
    k1 = b.op("Concat", ["x", a], axis=1)                     # graph input: kernel
    d = b.op("Sigmoid", [b.conv(k1, 6, 2)])
    v1 = b.op("Concat", [k1, d], axis=1)                      # free: k1's kernel writes into v1's first slice
    e = b.op("Tanh", [b.conv(v1, 8, 3)])
    k2 = b.op("Concat", [e, e], axis=1)                       # e read twice: kernel
    f = b.op("Relu", [b.conv(v1, 8, 2)])
    g = b.op("Sigmoid", [b.conv(v1, 8, 1)])
    k3 = b.op("Concat", [f, g], axis=1)                       # f and g are in two concats: kernels
    k4 = b.op("Concat", [g, f], axis=1)
    return b.model([("x", [1, 3, hw, hw])], [v1, k2, k3, k4])


def _build(model, tmp_path, opt_level=3):
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="host", opt_level=opt_level)
    factory.export(str(tmp_path))
    return json.loads((tmp_path / "deploy.json").read_text())


def _check_against_onnxruntime(model, folder, shape):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    gm = graph_executor.load(str(folder))
    for _ in range(2):      # a second run on other data: no stale bytes survive from the first
        x = RNG.standard_normal(shape).astype(np.float32)
        ref = sess.run(None, {"x": x})
        gm.run(x=x)
        assert gm.get_num_outputs() == len(ref)
        for k, want in enumerate(ref):
            np.testing.assert_allclose(gm.get_output(k), want, rtol=1e-4, atol=1e-5, err_msg="output %d" % k)


def _concat_nodes(doc):
    return [n for n in doc["nodes"] if "concat" in n["ops"].split("+")]


def test_densenet_like_chain_is_one_storage_without_concat_kernels(tmp_path):
    model = densenet_like()
    doc = _build(model, tmp_path)
    assert doc["version"] == 2
    assert _concat_nodes(doc) == []
    by_name = {e["name"]: e for e in doc["entries"]}
    concats = [n.output[0] for n in model.graph.node if n.op_type == "Concat"]
    stores = {by_name[c]["storage"] for c in concats}
    assert len(stores) == 1
    assert all(by_name[c].get("offset", 0) == 0 for c in concats)       # prefixes of the last one
    plane = 7 * 7 * 4
    offsets = sorted(e["offset"] for e in doc["entries"] if e.get("offset"))
    assert offsets == [5 * plane, 8 * plane, 11 * plane, 14 * plane]    # each new layer's slice
    assert any(o % 16 for o in offsets)                                 # unaligned slices are exercised
    _check_against_onnxruntime(model, tmp_path, (1, 3, 7, 7))


def test_inception_like_blocks_and_a_concat_output(tmp_path):
    model = inception_like()
    doc = _build(model, tmp_path)
    assert _concat_nodes(doc) == []
    assert sum(1 for e in doc["entries"] if e.get("offset")) == 6       # three non-first branches per block
    out0 = doc["entries"][doc["outputs"][0]]
    assert out0["storage"] not in {doc["entries"][i]["storage"] for i in doc["params"] + doc["inputs"]}
    _check_against_onnxruntime(model, tmp_path, (1, 3, 5, 5))


def test_ineligible_concats_keep_their_kernels(tmp_path):
    model = fallback_model()
    doc = _build(model, tmp_path)
    # k1 (graph input), k2 (one value twice), k3 and k4 (sharing inputs) run kernels; v1 is free
    assert len(_concat_nodes(doc)) == 4
    names = [n.output[0] for n in model.graph.node if n.op_type == "Concat"]
    by_name = {e["name"]: e for e in doc["entries"]}
    k1, v1 = by_name[names[0]], by_name[names[1]]
    assert k1["storage"] == v1["storage"] and k1.get("offset", 0) == 0
    _check_against_onnxruntime(model, tmp_path, (1, 3, 5, 5))


@pytest.mark.parametrize("opt_level", [0, 1])
def test_low_opt_levels_still_match(tmp_path, opt_level):
    """Level 0 keeps every concat kernel; level 1 (no fusion) has the views: both must agree with ort."""
    model = densenet_like(hw=5, layers=2)
    doc = _build(model, tmp_path, opt_level=opt_level)
    assert (len(_concat_nodes(doc)) == 2) == (opt_level == 0)
    _check_against_onnxruntime(model, tmp_path, (1, 3, 5, 5))


def test_executor_reads_version_1_and_checks_offsets(tmp_path):
    from tether_rpc.graph_executor import GraphExecutor
    from tether_rpc.module import load_module
    from tether_rpc.params import load_params

    model = densenet_like(hw=5, layers=2)
    new, old = tmp_path / "v2", tmp_path / "v1"
    new.mkdir()
    old.mkdir()
    doc = _build(model, new)
    # a version-1 file (no offsets anywhere: level 0 keeps concat kernels) still loads and runs
    v1 = _build(model, old, opt_level=0)
    assert not any("offset" in e for e in v1["entries"])
    v1["version"] = 1
    gm = GraphExecutor(v1, load_module(str(old / "deploy.so")), load_params(str(old / "deploy.params")))
    x = RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)
    gm.run(x=x)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(gm.get_output(0), ref[0], rtol=1e-4, atol=1e-5)

    module = load_module(str(new / "deploy.so"))
    with pytest.raises(ValueError, match="version 4.*reads versions 1, 2, 3"):
        GraphExecutor(dict(doc, version=4), module)
    bad = json.loads(json.dumps(doc))
    e = next(e for e in bad["entries"] if e.get("offset"))
    e["offset"] += 2
    with pytest.raises(ValueError, match="offset %d is not a multiple of its element size 4" % e["offset"]):
        GraphExecutor(bad, module)
    e["offset"] = bad["storages"][e["storage"]]
    with pytest.raises(ValueError, match="needs bytes %d\\.\\." % e["offset"]):
        GraphExecutor(bad, module)


@pytest.mark.emulated
def test_emulated_arm_writes_unaligned_slices(emulated_target_device, tmp_path):
    """The same views on emulated aarch64 / armv7 (NEON kernels writing and reading slices that start at
    4-byte but not 16-byte boundaries), through a real device server."""
    from tether import rpc
    from tether.rpc.graph_client import RemoteGraphExecutor

    host, port = emulated_target_device.address
    with rpc.connect(host, port, timeout=120) as sess:
        for k, (model, shape) in enumerate([(densenet_like(), (1, 3, 7, 7)), (inception_like(), (1, 3, 5, 5))]):
            folder = tmp_path / ("m%d" % k)
            graph, params = from_onnx(model)
            tether.build_graph(graph, params, target=emulated_target_device.preset).export(str(folder))
            doc = json.loads((folder / "deploy.json").read_text())
            assert _concat_nodes(doc) == [] and any(e.get("offset", 0) % 16 for e in doc["entries"])
            x = RNG.standard_normal(shape).astype(np.float32)
            ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
                None, {"x": x})
            with RemoteGraphExecutor(sess, str(folder), prefix="m%d_" % k) as gm:
                gm.run(x=x)
                for i, want in enumerate(ref):
                    np.testing.assert_allclose(gm.get_output(i), want, rtol=1e-4, atol=1e-5,
                                               err_msg="%s output %d" % (emulated_target_device.preset, i))
