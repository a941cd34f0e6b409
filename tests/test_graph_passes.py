"""Each graph pass alone: the reference interpreter gives the same outputs before and after, and the pass
does what it claims (structure checks)."""
import numpy as np
import pytest

from tether.graph import reference
from tether.graph.ir import Graph, Node, TensorType
from tether.graph.passes import constant_fold, dce, fold_batchnorm, fuse, optimize, plan_memory

RNG = np.random.default_rng(0)


def _conv_bn_relu_graph():
    x = TensorType((1, 3, 8, 8), "float32")
    types = {"x": x, "c": TensorType((1, 4, 8, 8), "float32"), "b": TensorType((1, 4, 8, 8), "float32"),
             "y": TensorType((1, 4, 8, 8), "float32"), "dead": TensorType((1, 4, 8, 8), "float32")}
    params = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
              "gamma": RNG.uniform(0.5, 2, 4).astype(np.float32), "beta": RNG.standard_normal(4).astype(np.float32),
              "mean": RNG.standard_normal(4).astype(np.float32), "var": RNG.uniform(0.5, 2, 4).astype(np.float32)}
    for k, v in params.items():
        types[k] = TensorType(v.shape, v.dtype)
    conv = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 1}
    nodes = [Node("conv2d", "conv", ["x", "w"], ["c"], conv),
             Node("batch_norm", "bn", ["c", "gamma", "beta", "mean", "var"], ["b"], {"epsilon": 1e-5}),
             Node("relu", "relu", ["b"], ["y"]),
             Node("sigmoid", "unused", ["c"], ["dead"])]
    return Graph(["x"], ["y"], nodes, types, "cbr"), params


def _check_same(g1, p1, g2, p2):
    x = RNG.standard_normal(g1.types["x"].shape).astype(np.float32)
    for a, b in zip(reference.run(g1, p1, {"x": x}), reference.run(g2, p2, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_dce_drops_dead_nodes_and_params():
    g, p = _conv_bn_relu_graph()
    p["unused_param"] = np.zeros(3, np.float32)
    g2, p2 = dce(g, p)
    assert [n.name for n in g2.nodes] == ["conv", "bn", "relu"]
    assert "unused_param" not in p2 and len(g.nodes) == 4   # the input graph is untouched
    _check_same(g, p, g2, p2)


def test_fold_batchnorm_into_conv_weights():
    g, p = dce(*_conv_bn_relu_graph())
    g2, p2 = fold_batchnorm(g, p)
    assert g2.ops_used() == {"conv2d": 1, "add": 1, "relu": 1}, str(g2)
    _check_same(g, p, g2, p2)


def test_constant_fold_evaluates_constant_nodes():
    g, p = _conv_bn_relu_graph()
    g.types["w2"] = g.types["w"]
    g.nodes.insert(0, Node("mul", "scale_w", ["w", "two"], ["w2"]))
    g.nodes[1].inputs[1] = "w2"
    p["two"] = np.array(2.0, np.float32)
    g.types["two"] = TensorType((), "float32")
    g2, p2 = constant_fold(g, p)
    assert "scale_w" not in [n.name for n in g2.nodes]
    np.testing.assert_array_equal(p2["w2"], p["w"] * 2)
    _check_same(g, p, g2, p2)


def test_fuse_makes_conv_bias_relu_one_node():
    g, p = optimize(*_conv_bn_relu_graph(), opt_level=1)
    g2, p2 = fuse(g, p)
    assert len(g2.nodes) == 1 and g2.nodes[0].op == "fused"
    assert [n.op for n in g2.nodes[0].attrs["body"]] == ["conv2d", "add", "relu"]
    assert "fused[conv2d+add+relu]" in str(g2)
    _check_same(g, p, g2, p2)


def test_fuse_keeps_values_with_two_readers():
    g, p = _conv_bn_relu_graph()
    g.outputs = ["y", "dead"]     # c now feeds bn and sigmoid: neither may swallow the conv
    g2, _ = fuse(*optimize(g, p, opt_level=1))
    conv_nodes = [n for n in g2.nodes if n.op == "conv2d" or (n.op == "fused" and n.attrs["body"][0].op == "conv2d")]
    assert len(conv_nodes) == 1


def test_memory_plan_reuses_storage_along_a_chain():
    types = {"x": TensorType((1024,), "float32")}
    nodes = []
    prev = "x"
    for i in range(6):
        types["v%d" % i] = TensorType((1024,), "float32")
        nodes.append(Node("relu" if i % 2 else "sigmoid", "n%d" % i, [prev], ["v%d" % i]))
        prev = "v%d" % i
    g = Graph(["x"], [prev], nodes, types)
    plan = plan_memory(g, {})
    inter = {plan.storage_of["v%d" % i] for i in range(5)}
    assert len(inter) == 2          # ping-pong between two buffers
    assert plan.storage_of["v5"] not in inter and plan.storage_of["x"] not in inter
    for n in nodes:                 # a kernel never writes a buffer it reads
        assert plan.storage_of[n.inputs[0]] != plan.storage_of[n.outputs[0]]
    assert "memory plan:" in str(plan)
