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
    fused = g2.nodes[0]
    assert [n.op for n in fused.body()] == ["conv2d", "add", "relu"] and fused.ops_label() == "conv2d+add+relu"
    # the kernel's arguments: what the body reads from outside, in order (the conv's data and weight, the bias)
    assert fused.body_params() == fused.inputs and fused.body_params()[:1] == [g.nodes[0].inputs[0]]
    assert "fused[conv2d+add+relu]" in str(g2)
    _check_same(g, p, g2, p2)


def test_a_single_node_is_its_own_body_and_reads_a_repeated_value_once():
    sq = Node("mul", "sq", ["x", "x"], ["y"])
    assert sq.body() == [sq] and sq.body_params() == ["x"] and sq.ops_label() == "mul"


def test_fuse_keeps_values_with_two_readers():
    g, p = _conv_bn_relu_graph()
    g.outputs = ["y", "dead"]     # c now feeds bn and sigmoid: neither may swallow the conv
    g2, _ = fuse(*optimize(g, p, opt_level=1))
    conv_nodes = [n for n in g2.nodes if n.body()[0].op == "conv2d"]
    assert len(conv_nodes) == 1


def _conv_then(act_nodes, extra_outputs=()):
    """conv 3->4 (3x3) + bias, then ``act_nodes`` reading its output "c" and writing "y"."""
    t = TensorType((1, 4, 8, 8), "float32")
    params = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
              "bias": RNG.standard_normal((1, 4, 1, 1)).astype(np.float32),
              "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32),
              "rt2": np.array(np.sqrt(2.0), np.float32)}
    types = {"x": TensorType((1, 3, 8, 8), "float32"), "c0": t, "c": t}
    types.update({k: TensorType(v.shape, v.dtype) for k, v in params.items()})
    for n in act_nodes:
        types[n.outputs[0]] = t
    conv = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 1}
    nodes = [Node("conv2d", "conv", ["x", "w"], ["c0"], conv), Node("add", "bias", ["c0", "bias"], ["c"])]
    return Graph(["x"], ["y"] + list(extra_outputs), nodes + list(act_nodes), types, "act"), params


SILU = [Node("sigmoid", "sig", ["c"], ["s"]), Node("mul", "silu", ["c", "s"], ["y"])]
GELU = [Node("div", "d", ["c", "rt2"], ["e0"]), Node("erf", "erf", ["e0"], ["e1"]),
        Node("add", "a1", ["e1", "one"], ["e2"]), Node("mul", "m1", ["c", "e2"], ["e3"]),
        Node("mul", "m2", ["e3", "half"], ["y"])]


@pytest.mark.parametrize("act", [SILU, GELU], ids=["silu", "gelu"])
def test_fuse_takes_an_activation_that_reads_its_input_twice_into_the_conv(act):
    """x * sigmoid(x) and GELU's erf form read the conv's output through two nodes: as one region they join the
    conv's kernel (not a kernel of their own, nor the next conv's prologue)."""
    g, p = _conv_then(act)
    g2, p2 = fuse(g, p)
    assert len(g2.nodes) == 1, str(g2)
    assert [n.op for n in g2.nodes[0].body()] == ["conv2d", "add"] + [n.op for n in act]
    _check_same(g, p, g2, p2)


def test_fuse_keeps_a_region_apart_when_an_inner_value_is_read_outside():
    g, p = _conv_then(SILU, extra_outputs=["s"])     # sigmoid(c) is also a graph output
    g2, p2 = fuse(g, p)
    assert len(g2.nodes) == 3, str(g2)
    _check_same(g, p, g2, p2)


def test_an_activation_after_a_1d_conv_joins_the_conv_across_its_reshape():
    """A 1-D conv runs as a 2-D conv over a height of one and is reshaped back: the elementwise ops after it
    (a per-channel scale, SiLU) run before that reshape, in the conv's kernel."""
    from tether.graph.passes import lift_over_unit_reshapes
    t4, t3 = TensorType((1, 4, 1, 16), "float32"), TensorType((1, 4, 16), "float32")
    params = {"w": RNG.standard_normal((4, 3, 1, 3)).astype(np.float32),
              "scale": RNG.standard_normal((4, 1)).astype(np.float32)}
    types = {"x": TensorType((1, 3, 1, 16), "float32"), "c4": t4, "c": t3, "m": t3, "s": t3, "y": t3}
    types.update({k: TensorType(v.shape, v.dtype) for k, v in params.items()})
    conv = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 1, 0, 1], "groups": 1}
    nodes = [Node("conv2d", "conv", ["x", "w"], ["c4"], conv),
             Node("reshape", "squeeze", ["c4"], ["c"], {"shape": (1, 4, 16)}),
             Node("mul", "scale", ["c", "scale"], ["m"]),
             Node("sigmoid", "sig", ["m"], ["s"]), Node("mul", "silu", ["m", "s"], ["y"])]
    g, p = Graph(["x"], ["y"], nodes, types, "conv1d"), params
    g2, p2 = lift_over_unit_reshapes(g, p)
    assert [n.op for n in g2.nodes] == ["conv2d", "mul", "sigmoid", "mul", "reshape"], str(g2)
    assert p2["scale_unit"].shape == (1, 4, 1, 1) and "scale" not in p2
    _check_same(g, p, g2, p2)
    g3, p3 = optimize(g, p, opt_level=2)
    assert [n.ops_label() for n in g3.nodes] == ["conv2d+mul+sigmoid+mul", "reshape"], str(g3)
    _check_same(g, p, g3, p3)


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


# ---------------------------------------------------------------- concat views + the memory plan
def _densenet_like_graph(c0=5, growth=3, layers=3, hw=7, late_reader=True):
    """stem -> [bn/relu -> conv -> concat with everything before] x layers, bn/relu on the last concat; with
    `late_reader`, the first concat is read again at the very end (its bytes must survive the whole block)."""
    types = {"x": TensorType((1, 2, hw, hw), "float32")}
    params = {}

    def p(name, arr):
        params[name] = arr.astype(np.float32)
        types[name] = TensorType(arr.shape, "float32")
        return name
    conv = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 1}
    nodes = [Node("conv2d", "stem", ["x", p("w_stem", RNG.standard_normal((c0, 2, 3, 3)))], ["s0"], conv)]
    types["s0"] = TensorType((1, c0, hw, hw), "float32")
    prev, ch = "s0", c0
    for k in range(layers):
        sc = p("sc%d" % k, RNG.uniform(0.5, 1.5, (1, ch, 1, 1)))
        nodes += [Node("mul", "bn%d" % k, [prev, sc], ["b%d" % k]),
                  Node("relu", "relu%d" % k, ["b%d" % k], ["r%d" % k]),
                  Node("conv2d", "conv%d" % k, ["r%d" % k, p("w%d" % k, RNG.standard_normal((growth, ch, 3, 3)))],
                       ["n%d" % k], conv),
                  Node("concat", "cat%d" % k, [prev, "n%d" % k], ["c%d" % k], {"axis": 1})]
        types["b%d" % k] = types["r%d" % k] = TensorType((1, ch, hw, hw), "float32")
        types["n%d" % k] = TensorType((1, growth, hw, hw), "float32")
        ch += growth
        types["c%d" % k] = TensorType((1, ch, hw, hw), "float32")
        prev = "c%d" % k
    nodes += [Node("mul", "bn_last", [prev, p("sc_last", RNG.uniform(0.5, 1.5, (1, ch, 1, 1)))], ["bl"]),
              Node("relu", "relu_last", ["bl"], ["y"])]
    types["bl"] = types["y"] = TensorType((1, ch, hw, hw), "float32")
    outputs = ["y"]
    if late_reader:
        nodes.append(Node("sigmoid", "late", ["c0"], ["late"]))
        types["late"] = types["c0"]
        outputs.append("late")
    return Graph(["x"], outputs, nodes, types, "dense"), params


def _run_planned(graph, params, plan, x):
    """Interpret `graph` with every value living in its planned bytes: a write lands in the storage, a read comes
    from it. A view (reshape, concat view) writes nothing; its bytes must already hold its value. So any
    clobbered or misplaced byte shows up as a wrong output or a failed view check."""
    from tether.graph.passes import is_concat_view
    stores = [np.full(n, 0xFF, np.uint8) for n in plan.sizes]    # NaN-filled: unwritten bytes are visible

    def view(v):
        t = graph.types[v] if v in graph.types else None
        shape, dtype = (t.shape, t.dtype) if t else (params[v].shape, params[v].dtype)
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        off = plan.offset_of.get(v, 0)
        return stores[plan.storage_of[v]][off:off + n].view(dtype).reshape(shape)
    for k, v in params.items():
        view(k)[...] = v
    view("x")[...] = x
    for node in graph.nodes:
        env = {i: view(i).copy() for i in node.inputs}
        reference.run_nodes([node], env)
        for o in node.outputs:
            if is_concat_view(node) or node.op == "reshape":
                np.testing.assert_array_equal(view(o), env[o], err_msg="view %s" % node.name)
            else:
                view(o)[...] = env[o]
    return [view(o).copy() for o in graph.outputs]


@pytest.mark.parametrize("opt_level", [1, 3])
def test_concat_views_chain_shares_one_storage_and_stays_correct(opt_level):
    g, p = _densenet_like_graph()
    g2, p2 = optimize(g, p, opt_level=opt_level)
    views = [n for n in g2.nodes if n.op == "concat"]
    assert len(views) == 3 and all(n.attrs.get("view") for n in views), str(g2)
    plan = plan_memory(g2, p2)
    # the stem, every new layer and every concat live in the last concat's storage, at their channel offsets
    sid = plan.storage_of["c2"]
    assert {plan.storage_of[v] for v in ("s0", "n0", "n1", "n2", "c0", "c1", "c2")} == {sid}
    plane = 7 * 7 * 4
    assert [plan.offset_of[v] for v in ("s0", "c0", "c1", "c2", "n0", "n1", "n2")] == \
        [0, 0, 0, 0, 5 * plane, 8 * plane, 11 * plane]
    assert plan.sizes[sid] >= g2.types["c2"].nbytes
    x = RNG.standard_normal((1, 2, 7, 7)).astype(np.float32)
    for got, want in zip(_run_planned(g2, p2, plan, x), reference.run(g, p, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_concat_views_split_a_fused_concat_head():
    """Without the late reader the last concat feeds only its bn: fuse makes concat+mul+relu one group, and the
    view pass splits it back into a free concat and a mul+relu kernel."""
    g, p = _densenet_like_graph(late_reader=False)
    fused, _ = fuse(*optimize(g, p, opt_level=1))
    assert any(n.op == "fused" and n.body()[0].op == "concat" for n in fused.nodes)
    g2, p2 = optimize(g, p, opt_level=3)
    assert not any(n.op == "fused" and n.body()[0].op == "concat" for n in g2.nodes), str(g2)
    assert sum(1 for n in g2.nodes if n.op == "concat" and n.attrs.get("view")) == 3
    _check_same(g, p, g2, p2)
    plan = plan_memory(g2, p2)
    x = RNG.standard_normal((1, 2, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(_run_planned(g2, p2, plan, x)[0], reference.run(g, p, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def _two_concat_graph(first_inputs, second_inputs, x_shape=(1, 4, 3, 3), axis=1):
    types = {"x": TensorType(x_shape, "float32")}
    nodes = [Node("relu", "ra", ["x"], ["a"]), Node("sigmoid", "sb", ["x"], ["b"]), Node("tanh", "tc", ["x"], ["c"])]
    for v in "abc":
        types[v] = types["x"]

    def cat_type(ins):
        shape = list(x_shape)
        shape[axis] *= len(ins)
        return TensorType(tuple(shape), "float32")
    nodes.append(Node("concat", "cat1", list(first_inputs), ["y1"], {"axis": axis}))
    types["y1"] = cat_type(first_inputs)
    outputs = ["y1"]
    if second_inputs:
        nodes.append(Node("concat", "cat2", list(second_inputs), ["y2"], {"axis": axis}))
        types["y2"] = cat_type(second_inputs)
        outputs.append("y2")
    return Graph(["x"], outputs, nodes, types, "cats"), {}


@pytest.mark.parametrize("case, viewed", [
    ((("a", "b", "c"), None, (1, 4, 3, 3), 1), {"cat1"}),            # graph output, three producers
    ((("a", "b"), ("b", "c"), (1, 4, 3, 3), 1), set()),              # b in two concats
    ((("a", "a"), None, (1, 4, 3, 3), 1), set()),                    # read twice by one concat
    ((("x", "a"), ("b", "c"), (1, 4, 3, 3), 1), {"cat2"}),           # a graph input falls back alone
    ((("a", "b"), None, (2, 4, 3, 3), 1), set()),                    # batch 2: slices are not contiguous
    ((("a", "b"), None, (2, 4, 3, 3), 0), {"cat1"}),                 # axis 0 always is
    ((("a", "b"), None, (1, 1, 3, 3), 2), {"cat1"}),                 # leading ones
    ((("a", "b"), None, (1, 2, 3, 3), 2), set()),
])
def test_concat_views_eligibility(case, viewed):
    g, p = _two_concat_graph(*case)
    g2, p2 = optimize(g, p, opt_level=3)
    assert {n.name for n in g2.nodes if n.op == "concat" and n.attrs.get("view")} == viewed, str(g2)
    plan = plan_memory(g2, p2)
    x = RNG.standard_normal(g.types["x"].shape).astype(np.float32)
    for got, want in zip(_run_planned(g2, p2, plan, x), reference.run(g, p, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_memory_plan_keeps_view_storage_until_the_last_view_is_read():
    """c0 (a prefix view of the block's storage) is read after the block: nothing else may take those bytes
    in between, although ping-pong buffers of the same size are free all along."""
    g, p = optimize(*_densenet_like_graph(late_reader=True), opt_level=3)
    plan = plan_memory(g, p)
    sid = plan.storage_of["c2"]
    order = {o: k for k, n in enumerate(g.nodes) for o in n.outputs}
    first, last = order["s0"], order["late"]
    for v, s in plan.storage_of.items():
        if s == sid and v in order:
            assert v in ("s0", "n0", "n1", "n2", "c0", "c1", "c2") or order[v] > last or order[v] < first, v


def test_concat_view_of_a_graph_output_pins_the_whole_tree():
    """An input of a view concat that is itself a graph output lives in the concat's storage, which no later
    value may reuse (a sigmoid of the same size runs after the concat's last reader)."""
    g, p = _two_concat_graph(("a", "b"), None)
    g.outputs = ["a"]                 # only the slice, not the concat, leaves the graph
    # z and u have two readers each (nothing fuses); u is allocated after y1's last read
    g.nodes += [Node("relu", "after", ["y1"], ["z"]), Node("sigmoid", "later", ["z"], ["u"]),
                Node("tanh", "t", ["u"], ["w1"]), Node("relu", "r", ["u"], ["w2"]),
                Node("add", "s", ["z", "u"], ["w3"])]
    for v in ("z", "u", "w1", "w2", "w3"):
        g.types[v] = g.types["y1"]
    g.outputs += ["w1", "w2", "w3"]
    g2, p2 = optimize(g, p, opt_level=3)
    assert next(n for n in g2.nodes if n.op == "concat").attrs.get("view")
    plan = plan_memory(g2, p2)
    assert plan.storage_of["a"] == plan.storage_of["b"] == plan.storage_of["y1"] and plan.offset_of["b"] == 36 * 4
    assert plan.storage_of["u"] != plan.storage_of["y1"] and "b@144" in str(plan)
    x = RNG.standard_normal(g.types["x"].shape).astype(np.float32)
    for got, want in zip(_run_planned(g2, p2, plan, x), reference.run(g, p, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-6)
