"""conv2d / depthwise conv2d against numpy; pooling against onnxruntime (the semantics the ONNX frontend needs)."""
import numpy as np
import pytest

from tether import ops, te

from fixtures.conv_ref import conv_ref


CONV_CASES = [
    # (N, C, H, W), (O, KH, KW), stride, padding, dilation, groups
    ((1, 3, 9, 11), (5, 3, 3), 1, 1, 1, 1),
    ((2, 4, 10, 13), (6, 3, 3), 2, (1, 1, 0, 2), 1, 1),
    ((1, 6, 12, 12), (4, 3, 3), 1, 2, 2, 2),
    ((1, 8, 7, 19), (16, 1, 1), 1, 0, 1, 1),
    ((1, 5, 6, 6), (7, 2, 3), (1, 2), (0, 1), 1, 1),
    # widths that are multiples of the aligned padding block (8): the block-clamped padding path
    ((1, 4, 6, 16), (5, 3, 3), 1, (1, 2, 0, 1), 1, 1),
    ((1, 3, 9, 8), (4, 3, 3), 1, 2, 2, 1),
    ((1, 2, 5, 8), (3, 3, 5), 1, (0, 9, 1, 3), 1, 1),
]


@pytest.mark.parametrize("xs,wk,stride,padding,dilation,groups", CONV_CASES)
def test_conv2d(run_ops, rng, xs, wk, stride, padding, dilation, groups):
    oc, kh, kw = wk
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal((oc, xs[1] // groups, kh, kw)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(w.shape, "float32", name="W")
    (out,) = run_ops([(X, x), (W, w)], [ops.conv2d(X, W, stride, padding, dilation, groups)])
    st = stride if isinstance(stride, tuple) else (stride, stride)
    dl = (dilation, dilation)
    p = padding
    pad4 = (p,) * 4 if isinstance(p, int) else (p[0], p[1], p[0], p[1]) if len(p) == 2 else p
    np.testing.assert_allclose(out, conv_ref(x, w, st, pad4, dl, groups), rtol=1e-4, atol=1e-4)


PIXEL_CASES = [
    # (C, H, W), (O, KH, KW), stride, padding (top, left, bottom, right), dilation
    ((16, 13, 13), (32, 3, 3), 1, (1, 1, 1, 1), 1),     # 169 pixels: a partial last pixel block
    ((3, 23, 21), (20, 3, 3), 2, (0, 1, 1, 0), 1),      # stride 2, asymmetric padding, channels not a panel multiple
    ((5, 12, 11), (16, 3, 5), (1, 2), (2, 1, 2, 3), 2),  # dilation, unequal strides
    ((4, 9, 9), (7, 7, 7), 2, (3, 3, 3, 3), 1),         # a 7x7 stem-like kernel, fewer channels than a vector
]


@pytest.mark.parametrize("prepacked", [False, True], ids=["packed-per-call", "prepacked"])
@pytest.mark.parametrize("xs,wk,stride,padding,dilation", PIXEL_CASES)
def test_conv2d_pixels_with_epilogue(run_ops, rng, xs, wk, stride, padding, dilation, prepacked):
    """The implicit-GEMM conv over flattened pixels (what models use), with a fused bias + relu write-back; the
    weights packed by the kernel or ahead of time (what build_graph does with constant weights)."""
    from tether.ops.linear import pack_panels_array

    oc, kh, kw = wk
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal((oc, xs[0], kh, kw)).astype("float32")
    bias = rng.standard_normal((oc, 1)).astype("float32")
    wk_arr = pack_panels_array(w.reshape(oc, -1)) if prepacked else w.reshape(oc, -1)
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(wk_arr.shape, "float32", name="W")
    B = te.placeholder(bias.shape, "float32", name="B")
    conv = ops.conv2d_pixels(X, W, (kh, kw), stride, padding, dilation, out_channels=oc if prepacked else None)
    (out,) = run_ops([(X, x), (W, wk_arr), (B, bias)], [ops.relu(ops.add(conv, B))])
    st = stride if isinstance(stride, tuple) else (stride, stride)
    ref = conv_ref(x[None], w, st, padding, (dilation, dilation), 1)[0]
    ref = np.maximum(ref + bias[:, :, None], 0)
    np.testing.assert_allclose(out, ref.reshape(oc, -1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last_out", [False, True], ids=["nchw-out", "nhwc-out"])
@pytest.mark.parametrize("xs,wk,stride,padding,dilation", PIXEL_CASES + [((64, 1, 41), (24, 1, 3), (1, 2), 0, 1),
                                                                       ((40, 1, 30), (48, 1, 5), 1, (0, 2, 0, 2), 1)])
def test_conv2d_pixels_reads_channels_last(run_ops, rng, xs, wk, stride, padding, dilation, channels_last_out):
    """The same conv on the NHWC image (H, W, C), its weights packed from (O, KH, KW, C): what a 1-D conv runs as
    (graph/passes/float_layout.py), checked on 2-D windows, strides, dilation and padding as well."""
    from tether.ops.linear import pack_panels_array

    oc, kh, kw = wk
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal((oc, xs[0], kh, kw)).astype("float32")
    packed = pack_panels_array(np.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(oc, -1))
    nhwc = np.ascontiguousarray(x.transpose(1, 2, 0))
    X = te.placeholder(nhwc.shape, "float32", name="X")
    W = te.placeholder(packed.shape, "float32", name="W")
    conv = ops.conv2d_pixels(X, W, (kh, kw), stride, padding, dilation, out_channels=oc, channels_last_in=True,
                             channels_last_out=channels_last_out)
    (out,) = run_ops([(X, nhwc), (W, packed)], [conv])
    st = stride if isinstance(stride, tuple) else (stride, stride)
    pad4 = padding if isinstance(padding, tuple) else (padding,) * 4
    ref = conv_ref(x[None], w, st, pad4, (dilation, dilation), 1)[0].reshape(oc, -1)
    np.testing.assert_allclose(out, ref.T if channels_last_out else ref, rtol=1e-4, atol=1e-4)


def test_grouped_conv2d_pixels(run_ops, rng):
    """Groups whose output channels fill whole panels (alexnet's two-group layers): each panel reads its group."""
    from tether.ops.linear import pack_panels_array

    groups, ch, oc, kh, kw = 2, 6, 32, 3, 3
    x = rng.standard_normal((ch, 9, 10)).astype("float32")
    w = rng.standard_normal((oc, ch // groups, kh, kw)).astype("float32")
    packed = pack_panels_array(w.reshape(oc, -1))
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(packed.shape, "float32", name="W")
    (out,) = run_ops([(X, x), (W, packed)], [ops.conv2d_pixels(X, W, (kh, kw), 1, 1, out_channels=oc,
                                                                  groups=groups)])
    ref = conv_ref(x[None], w, (1, 1), (1, 1, 1, 1), (1, 1), groups)[0]
    np.testing.assert_allclose(out, ref.reshape(oc, -1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="whole 16-wide panels"):
        ops.conv2d_pixels(X, te.placeholder((1, 27, 16), "float32"), (kh, kw), out_channels=8, groups=2)


def test_grouped_conv2d_pixels_on_8_wide_panels(run_ops, rng):
    """Groups of 24 output channels (wav2vec2's positional conv) on 8-wide panels, a 1-D window of 9 taps."""
    from tether.ops.linear import pack_panels_array

    groups, ch, oc, kw = 4, 12, 96, 9
    x = rng.standard_normal((ch, 1, 21)).astype("float32")
    w = rng.standard_normal((oc, ch // groups, 1, kw)).astype("float32")
    packed = pack_panels_array(w.reshape(oc, -1), 8)
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(packed.shape, "float32", name="W")
    (out,) = run_ops([(X, x), (W, packed)], [ops.conv2d_pixels(X, W, (1, kw), 1, (0, 4, 0, 4), out_channels=oc,
                                                                  groups=groups)])
    ref = conv_ref(x[None], w, (1, 1), (0, 4, 0, 4), (1, 1), groups)[0]
    np.testing.assert_allclose(out, ref.reshape(oc, -1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,k,stride,padding,mult", [((1, 8, 13, 15), 3, 1, 1, 1), ((2, 3, 11, 10), 3, 2, 1, 2),
                                                      ((1, 5, 9, 21), 5, 1, 2, 1), ((2, 3, 7, 16), 3, 1, 1, 1),
                                                      ((1, 2, 4, 8), 3, 1, 1, 3)])
def test_depthwise_conv2d_with_bias_relu6(run_ops, rng, xs, k, stride, padding, mult):
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal((xs[1] * mult, 1, k, k)).astype("float32")
    bias = rng.standard_normal(xs[1] * mult).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(w.shape, "float32", name="W")
    Bs = te.placeholder(bias.shape, "float32", name="bias")
    plain, fused = run_ops([(X, x), (W, w), (Bs, bias)],
                           [ops.depthwise_conv2d(X, W, stride, padding),
                            ops.relu6(ops.conv2d(X, W, stride, padding, groups=xs[1], bias=Bs))])
    ref = conv_ref(x, w, (stride, stride), (padding,) * 4, (1, 1), xs[1])
    np.testing.assert_allclose(plain, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fused, np.clip(ref + bias[None, :, None, None], 0, 6), rtol=1e-4, atol=1e-4)


def test_conv2d_bias(run_ops, rng):
    x = rng.standard_normal((1, 4, 8, 9)).astype("float32")
    w = rng.standard_normal((6, 4, 3, 3)).astype("float32")
    bias = rng.standard_normal(6).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(w.shape, "float32", name="W")
    Bs = te.placeholder(bias.shape, "float32", name="bias")
    (out,) = run_ops([(X, x), (W, w), (Bs, bias)], [ops.relu(ops.conv2d(X, W, padding=1, bias=Bs))])
    ref = np.maximum(conv_ref(x, w, (1, 1), (1,) * 4, (1, 1), 1) + bias[None, :, None, None], 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


# ---- pooling against onnxruntime ------------------------------------------------------------------------------

def _ort_pool(op_type, x, **attrs):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node(op_type, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


POOL_CASES = [
    # kernel, stride, pads (t, l, b, r), ceil_mode
    ((3, 3), (2, 2), (1, 1, 1, 1), 0),
    ((2, 2), (2, 2), (0, 0, 0, 0), 1),
    ((3, 3), (2, 2), (1, 0, 1, 0), 1),
    ((3, 2), (1, 1), (0, 0, 0, 0), 0),
    ((3, 3), (1, 1), (1, 1, 1, 1), 0),
    ((3, 3), (2, 2), (0, 0, 0, 0), 0),     # strided, unpadded: the window reads the input's columns strided
    ((2, 2), (2, 2), (0, 0, 0, 0), 0),
]


@pytest.mark.parametrize("kernel,stride,pads,ceil_mode", POOL_CASES)
@pytest.mark.parametrize("width", [10, 16])
def test_max_pool(run_ops, rng, kernel, stride, pads, ceil_mode, width):
    x = rng.standard_normal((1, 3, 11, width)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    (out,) = run_ops([(X, x)], [ops.max_pool2d(X, kernel, stride, pads, ceil_mode=bool(ceil_mode))])
    ref = _ort_pool("MaxPool", x, kernel_shape=list(kernel), strides=list(stride),
                    pads=[pads[0], pads[1], pads[2], pads[3]], ceil_mode=ceil_mode)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


@pytest.mark.parametrize("kernel,stride,pads,ceil_mode", POOL_CASES)
@pytest.mark.parametrize("width", [10, 16])
def test_avg_pool(run_ops, rng, kernel, stride, pads, ceil_mode, width):
    x = rng.standard_normal((2, 3, 11, width)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    outs = run_ops([(X, x)], [ops.avg_pool2d(X, kernel, stride, pads, ceil_mode=bool(ceil_mode),
                                             count_include_pad=bool(cip)) for cip in (0, 1)])
    for cip, out in zip((0, 1), outs):
        ref = _ort_pool("AveragePool", x, kernel_shape=list(kernel), strides=list(stride), pads=list(pads),
                        ceil_mode=ceil_mode, count_include_pad=cip)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=f"count_include_pad={cip}")


@pytest.mark.parametrize("kernel,stride,width", [(3, 2, 111), (3, 2, 113), (2, 2, 56), (3, 3, 50), (5, 5, 61)])
def test_unpadded_strided_pools_on_wide_rows(run_ops, rng, kernel, stride, width):
    """A strided pool that needs no padding (squeezenet's 3x3 s2 over 111 columns) reads the input directly, each
    vector of output columns from one load of the span and a shuffle, not from a column-phase copy of the input
    (which strides over ops.pooling.STRIDED_READ_MAX keep)."""
    from tether.ops.pooling import STRIDED_READ_MAX

    x = rng.standard_normal((1, 4, 9, width)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    mx = ops.max_pool2d(X, kernel, stride)
    av = ops.avg_pool2d(X, kernel, stride)
    reads = [t.op.name for t in mx.op.input_tensors + av.op.input_tensors[0].op.input_tensors]
    assert any("phases" in r for r in reads) == (stride > STRIDED_READ_MAX), reads
    got_max, got_avg = run_ops([(X, x)], [mx, av])
    np.testing.assert_allclose(got_max, _ort_pool("MaxPool", x, kernel_shape=[kernel] * 2, strides=[stride] * 2),
                               rtol=1e-6)
    np.testing.assert_allclose(got_avg, _ort_pool("AveragePool", x, kernel_shape=[kernel] * 2,
                                                  strides=[stride] * 2), rtol=1e-5, atol=1e-6)


def test_global_pools(run_ops, rng):
    x = rng.standard_normal((2, 5, 7, 9)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    avg, mx = run_ops([(X, x)], [ops.global_avg_pool2d(X), ops.global_max_pool2d(X)])
    np.testing.assert_allclose(avg, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mx, x.max(axis=(2, 3), keepdims=True), rtol=1e-6)


def test_conv_group_mismatch_error():
    X = te.placeholder((1, 6, 8, 8), "float32", name="X")
    W = te.placeholder((4, 4, 3, 3), "float32", name="W")
    with pytest.raises(ValueError, match="groups"):
        ops.conv2d(X, W, groups=2)


def test_tiny_outputs_and_dilated_pool(run_ops, rng):
    """1x1 outputs (a one-lane column block) and a dilated max pool."""
    x = rng.standard_normal((1, 4, 3, 3)).astype("float32")
    w = rng.standard_normal((5, 4, 3, 3)).astype("float32")
    wd = rng.standard_normal((4, 1, 3, 3)).astype("float32")
    xb = rng.standard_normal((1, 2, 9, 12)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    W = te.placeholder(w.shape, "float32", name="W")
    WD = te.placeholder(wd.shape, "float32", name="WD")
    XB = te.placeholder(xb.shape, "float32", name="XB")
    conv, dw, mp, dil = run_ops([(X, x), (W, w), (WD, wd), (XB, xb)],
                                [ops.conv2d(X, W), ops.conv2d(X, WD, groups=4), ops.max_pool2d(X, 3),
                                 ops.max_pool2d(XB, 2, 1, 1, dilation=2)])
    np.testing.assert_allclose(conv, conv_ref(x, w, (1, 1), (0,) * 4, (1, 1), 1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, conv_ref(x, wd, (1, 1), (0,) * 4, (1, 1), 4), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mp, x.max(axis=(2, 3), keepdims=True), rtol=1e-6)
    ref = _ort_pool("MaxPool", xb, kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[2, 2])
    np.testing.assert_allclose(dil, ref, rtol=1e-6)
