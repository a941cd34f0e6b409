"""Model files as PyTorch's two exporters write them, loaded from their path (no torch in CI; scripts/
bench_pytorch.py exports the real torchvision CNNs and nn.TransformerEncoder). tests/test_onnx_exporters.py covers
the dynamo exporter's op patterns as in-memory protos; this file covers what the files add:

- the TorchScript exporter's transformer encoder layer (opset 17) as written, with its shape subgraphs: the
  in-projection reshaped to a shape built by Shape/Slice/Mod/Concat, the attention scale computed from the head
  size by Shape/Slice/Cast/Sqrt/Div/Cast/Sqrt, Constant nodes, initializers aliased by Identity, bias-first Add and
  the Div-by-sqrt(2) Erf GELU; and its CNN (Clip bounds from Constant nodes, GlobalAveragePool, Flatten). Saved
  with one external data file per tensor, named after it, as that exporter writes a model over 2 GB;
- the dynamo exporter's resnet (bias-free Conv, MaxPool, residual Add, ReduceMean pooling with axes as an input,
  Reshape allowzero, Gemm transB) saved as it writes every model: one ``model.onnx.data`` with the weights
  back to back at offsets, small tensors inline, and one initializer used by several nodes;
- several data files, each holding several tensors at aligned offsets with gaps between them.

Each model is run by onnxruntime from the same path and must match: max relative error (max |tether - ort| /
max |ort|) <= 1e-4."""
import os

import numpy as np
import onnx
from fixtures.onnx_struct_compare import erf_gelu_nodes, make_graph_model
from onnx import helper, numpy_helper

import tether
from tether import graph_executor
from tether.frontend import from_onnx

RNG = np.random.default_rng(17)
INT64_MAX = np.iinfo(np.int64).max


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _i64(*values):
    return np.array(values, np.int64)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _external(path):
    """{initializer name: its external data fields} of the model file at ``path`` (inline ones left out)."""
    stored = onnx.load(path, load_external_data=False)
    return {t.name: {e.key: e.value for e in t.external_data} for t in stored.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL}


def _compare_from_path(path, feeds, out_dir):
    import onnxruntime as ort

    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    graph, params = from_onnx(path)
    tether.build_graph(graph, params, target="host", opt_level=3).export(str(out_dir))
    gm = graph_executor.load(str(out_dir))
    for k, v in feeds.items():
        gm.set_input(k, v)
    gm.run()
    got = [gm.get_output(i) for i in range(gm.get_num_outputs())]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        assert np.isfinite(r).all()
        rel = float(np.abs(g.astype(np.float64) - r).max() / max(np.abs(r).max(), 1e-30))
        assert rel <= 1e-4, rel


def _save_per_tensor(model, folder):
    """One data file per tensor of at least 1 KB, named after it, as the TorchScript exporter writes >2 GB."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=1024)
    return path


# ---------------------------------------------------------------- TorchScript exporter, opset 17
SEQ, D, HEADS, FF = 6, 16, 2, 64
DH = D // HEADS


def _torchscript_encoder_layer():
    inits = {"w_in": _w(D, 3 * D), "b_in": _w(3 * D), "w_out": _w(D, D), "b_out": _w(D),
             "g1": 1 + _w(D), "b1n": _w(D), "g2": 1 + _w(D),
             "w1": _w(D, FF), "b1": _w(FF), "w2": _w(FF, D), "b2": _w(D)}
    nodes = [helper.make_node("Identity", ["b_out"], ["b2n"]),     # an initializer equal to another, aliased
             _const("c_two", _i64(2)), _const("c_three", _i64(3)), _const("c_zero", _i64(0)),
             _const("c_one", _i64(1)), _const("c_end", _i64(INT64_MAX)), _const("c_3d", _i64(3, D)),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),                       # (SEQ, 1, D)
             helper.make_node("MatMul", ["xt", "w_in"], ["mm"]),
             helper.make_node("Add", ["b_in", "mm"], ["proj"]),
             # the reshape target [SEQ, 1, 3, D] from the projection's own shape
             helper.make_node("Mod", ["c_two", "c_three"], ["split_dim"]),
             helper.make_node("Shape", ["proj"], ["shp"]),
             helper.make_node("Reshape", ["split_dim", "c_one"], ["sd1"]),
             helper.make_node("Slice", ["shp", "c_zero", "sd1"], ["head_dims"]),
             helper.make_node("Add", ["split_dim", "c_one"], ["after0"]),
             helper.make_node("Reshape", ["after0", "c_one"], ["after"]),
             helper.make_node("Slice", ["shp", "after", "c_end"], ["tail_dims"]),
             helper.make_node("Concat", ["head_dims", "c_3d", "tail_dims"], ["qkv_shape"], axis=0),
             helper.make_node("Reshape", ["proj", "qkv_shape"], ["qkv2"]),
             helper.make_node("Unsqueeze", ["qkv2", "c_zero"], ["qkv3"]),
             helper.make_node("Transpose", ["qkv3"], ["qkv4"], perm=[3, 1, 2, 0, 4]),
             helper.make_node("Squeeze", ["qkv4", "c_three"], ["qkv5"]),                        # (3, SEQ, 1, D)
             _const("heads", _i64(SEQ, HEADS, DH)), _const("bh", _i64(1, HEADS, SEQ, DH))]
    for n, i in (("q", 0), ("k", 1), ("v", 2)):
        nodes += [_const(n + "_idx", np.array(i, np.int64)),
                  helper.make_node("Gather", ["qkv5", n + "_idx"], [n + "0"], axis=0),
                  helper.make_node("Reshape", [n + "0", "heads"], [n + "1"]),
                  helper.make_node("Transpose", [n + "1"], [n + "2"], perm=[1, 0, 2]),
                  helper.make_node("Reshape", [n + "2", "bh"], [n + "3"])]                      # (1, H, SEQ, DH)
    # scale = sqrt(1 / sqrt(DH)) from q's last dimension, applied to q and to k^T
    nodes += [_const("c_last", _i64(-1)), _const("f_one", np.array([1.0], np.float32)),
              helper.make_node("Shape", ["q3"], ["qshape"]),
              helper.make_node("Slice", ["qshape", "c_last", "c_end"], ["dh"]),
              helper.make_node("Cast", ["dh"], ["dh_f"], to=onnx.TensorProto.FLOAT),
              helper.make_node("Sqrt", ["dh_f"], ["sqrt_dh"]),
              helper.make_node("Div", ["f_one", "sqrt_dh"], ["inv"]),
              helper.make_node("Cast", ["inv"], ["inv_f"], to=onnx.TensorProto.FLOAT),
              helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("Sqrt", ["inv_f"], ["sq1"]),
              helper.make_node("Mul", ["q3", "sq1"], ["qs"]),
              helper.make_node("Sqrt", ["inv_f"], ["sq2"]),
              helper.make_node("Mul", ["kt", "sq2"], ["ks"]),
              helper.make_node("MatMul", ["qs", "ks"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["attn"], axis=-1),
              helper.make_node("MatMul", ["attn", "v3"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx1"], perm=[2, 0, 1, 3]),
              _const("merge", _i64(SEQ, D)), _const("back", _i64(SEQ, 1, D)),
              helper.make_node("Reshape", ["ctx1", "merge"], ["ctx2"]),
              helper.make_node("Gemm", ["ctx2", "w_out", "b_out"], ["o0"], alpha=1.0, beta=1.0, transB=1),
              helper.make_node("Reshape", ["o0", "back"], ["o1"]),
              helper.make_node("Transpose", ["o1"], ["o2"], perm=[1, 0, 2]),
              helper.make_node("Add", ["x", "o2"], ["r1"]),
              helper.make_node("LayerNormalization", ["r1", "g1", "b1n"], ["h1"], axis=-1, epsilon=1e-5),
              helper.make_node("MatMul", ["h1", "w1"], ["f0"]),
              helper.make_node("Add", ["b1", "f0"], ["f1"]),
              _const("sqrt2", np.array(np.sqrt(2.0), np.float32)),
              _const("one", np.array(1.0, np.float32)), _const("half", np.array(0.5, np.float32)),
              helper.make_node("Div", ["f1", "sqrt2"], ["e0"]),
              *erf_gelu_nodes("f1", "e0", "f2"),
              helper.make_node("MatMul", ["f2", "w2"], ["f3"]),
              helper.make_node("Add", ["b2", "f3"], ["f4"]),
              helper.make_node("Add", ["h1", "f4"], ["r2"]),
              helper.make_node("LayerNormalization", ["r2", "g2", "b2n"], ["y"], axis=-1, epsilon=1e-5)]
    x = RNG.standard_normal((1, SEQ, D)).astype(np.float32)
    inits["w_out"] = np.ascontiguousarray(inits["w_out"].T)
    return make_graph_model(nodes, {"x": x}, ["y"], inits, opset=17), {"x": x}


def test_torchscript_encoder_layer_with_one_data_file_per_tensor(tmp_path):
    model, feeds = _torchscript_encoder_layer()
    path = _save_per_tensor(model, str(tmp_path / "onnx"))
    external = _external(path)
    assert set(external) == {"w_in", "w_out", "w1", "w2"}      # the matrices; vectors stay inline
    assert len({f["location"] for f in external.values()}) == 4
    _compare_from_path(path, feeds, tmp_path / "out")


def test_torchscript_cnn_with_one_data_file_per_tensor(tmp_path):
    """mobilenet_v2 as the TorchScript exporter writes it: Clip bounds as Constant nodes, weights aliased by
    Identity, GlobalAveragePool and Flatten before the Gemm."""
    inits = {"w1": _w(32, 3, 3, 3), "b1": _w(32), "wd": _w(32, 1, 3, 3), "bd": _w(32),
             "wp": _w(16, 32, 1, 1), "bp": _w(16), "wf": _w(10, 16), "bf": _w(10)}
    nodes = [_const("lo", np.array(0, np.float32)), _const("hi", np.array(6, np.float32)),
             helper.make_node("Identity", ["bp"], ["bp_alias"]),
             helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2],
                              kernel_shape=[3, 3], dilations=[1, 1], group=1),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"]),
             helper.make_node("Conv", ["a1", "wd", "bd"], ["c2"], pads=[1, 1, 1, 1], kernel_shape=[3, 3],
                              group=32),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["a2"]),
             helper.make_node("Conv", ["a2", "wp", "bp_alias"], ["c3"], kernel_shape=[1, 1]),
             helper.make_node("GlobalAveragePool", ["c3"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"], axis=1),
             helper.make_node("Gemm", ["flat", "wf", "bf"], ["y"], alpha=1.0, beta=1.0, transB=1)]
    x = RNG.uniform(0, 1, (1, 3, 24, 24)).astype(np.float32)
    path = _save_per_tensor(make_graph_model(nodes, {"x": x}, ["y"], inits, opset=17), str(tmp_path / "onnx"))
    assert set(_external(path)) == {"w1", "wd", "wp"}
    _compare_from_path(path, {"x": x}, tmp_path / "out")


# ---------------------------------------------------------------- dynamo exporter: one model.onnx.data
def _dynamo_resnet():
    """resnet's structure as the dynamo exporter writes it (BatchNorm folded into bias-free convs); the two
    blocks' second convs share one initializer, as the exporter stores identical weights once."""
    inits = {"stem": _w(8, 3, 7, 7, scale=0.1), "c1a": _w(8, 8, 3, 3, scale=0.15), "shared": _w(8, 8, 3, 3, scale=0.15),
             "c2a": _w(8, 8, 3, 3, scale=0.15), "axes": _i64(-1, -2), "flat": _i64(1, 8),
             "fc_w": _w(10, 8), "fc_b": _w(10)}
    conv = dict(pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], kernel_shape=[3, 3], group=1,
                auto_pad="NOTSET")
    nodes = [helper.make_node("Conv", ["x", "stem"], ["s0"], pads=[3, 3, 3, 3], strides=[2, 2], dilations=[1, 1],
                              kernel_shape=[7, 7], group=1, auto_pad="NOTSET"),
             helper.make_node("Relu", ["s0"], ["s1"]),
             helper.make_node("MaxPool", ["s1"], ["p0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              dilations=[1, 1], ceil_mode=0, storage_order=0, auto_pad="NOTSET")]
    prev = "p0"
    for blk, first in (("b1", "c1a"), ("b2", "c2a")):
        nodes += [helper.make_node("Conv", [prev, first], [blk + "c0"], **conv),
                  helper.make_node("Relu", [blk + "c0"], [blk + "r0"]),
                  helper.make_node("Conv", [blk + "r0", "shared"], [blk + "c1"], **conv),
                  helper.make_node("Add", [blk + "c1", prev], [blk + "s"]),
                  helper.make_node("Relu", [blk + "s"], [blk + "o"])]
        prev = blk + "o"
    nodes += [helper.make_node("ReduceMean", [prev, "axes"], ["mean"], keepdims=1, noop_with_empty_axes=0),
              helper.make_node("Reshape", ["mean", "flat"], ["view"], allowzero=1),
              helper.make_node("Gemm", ["view", "fc_w", "fc_b"], ["y"], alpha=1.0, beta=1.0, transA=0, transB=1)]
    x = RNG.uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)
    return make_graph_model(nodes, {"x": x}, ["y"], inits, opset=18), {"x": x}


def test_dynamo_resnet_with_one_data_file_at_offsets(tmp_path):
    model, feeds = _dynamo_resnet()
    folder = tmp_path / "onnx"
    folder.mkdir()
    path = str(folder / "model.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
              size_threshold=1024)
    external = _external(path)
    assert set(external) == {"stem", "c1a", "shared", "c2a"}
    assert {f["location"] for f in external.values()} == {"model.onnx.data"}
    assert len({int(f.get("offset", 0)) for f in external.values()}) == 4
    _compare_from_path(path, feeds, tmp_path / "out")


# ---------------------------------------------------------------- several files, several tensors each
def _write_external(model, folder, layout, align=4096):
    """Move the initializers named in ``layout`` ({file name: [tensor names]}) into those files, each tensor at
    the next multiple of ``align`` (zero bytes between them), its location/offset/length in the model."""
    by_name = {t.name: t for t in model.graph.initializer}
    for location, names in layout.items():
        with open(os.path.join(folder, location), "wb") as fh:
            for name in names:
                t = by_name[name]
                data = numpy_helper.to_array(t).astype("<" + numpy_helper.to_array(t).dtype.str[1:]).tobytes()
                offset = -(-fh.tell() // align) * align
                fh.write(b"\0" * (offset - fh.tell()))
                fh.write(data)
                t.ClearField("raw_data")
                t.ClearField("float_data")
                t.data_location = onnx.TensorProto.EXTERNAL
                del t.external_data[:]
                for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(data)))):
                    t.external_data.add(key=key, value=value)
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as fh:
        fh.write(model.SerializeToString())
    return path


def test_several_data_files_with_several_aligned_tensors_each(tmp_path):
    model, feeds = _dynamo_resnet()
    folder = tmp_path / "onnx"
    folder.mkdir()
    path = _write_external(model, str(folder), {"stem_and_head.bin": ["fc_w", "stem", "fc_b"],
                                                "blocks.bin": ["c2a", "shared", "c1a"]})
    external = _external(path)
    assert {f["location"] for f in external.values()} == {"stem_and_head.bin", "blocks.bin"}
    assert sorted(int(external[n]["offset"]) for n in ("c2a", "shared", "c1a")) == [0, 4096, 8192]
    _compare_from_path(path, feeds, tmp_path / "out")
