"""MediaPipe's own models (the .tflite files of the mediapipe 0.10.14 wheel, fetched by scripts/test.sh into
$TETHER_MEDIAPIPE_MODELS) against LiteRT on the same input, and MediaPipe's custom ops that LiteRT's XNNPACK
delegate runs itself (``Convolution2DTransposeBias``, ``MaxPoolingWithArgmax2D``, ``MaxUnpooling2D``) on
hand-written models over their padding and stride cases; where XNNPACK does not run a case (overlapping pooling
windows) or encodes an output its own way (the argmax indices), against MediaPipe's kernel transcribed in numpy.

Float error reading: max |tether - LiteRT| / max |LiteRT| per output. The bound is 1e-4, except where LiteRT's two
kernel sets (XNNPACK and its reference kernels) already differ by more on the same input: there tether must stay
within that difference."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from fixtures.prereq import require_module, unavailable
from fixtures.tflite_models import Op, T, write_tflite

import tether
from tether import graph_executor
from tether.errors import UnsupportedOpError
from tether.frontend import from_tflite

MODELS_ENV = "TETHER_MEDIAPIPE_MODELS"
# the models compared; the face mesh with attention is refused instead (its custom ops are MediaPipe's
# own, which LiteRT cannot run either)
MODELS = ["selfie_segmentation", "selfie_segmentation_landscape", "hand_landmark_lite", "palm_detection_lite",
          "pose_detection", "hand_recrop", "pose_landmark_full", "face_detection_full_range_sparse", "iris_landmark"]


@pytest.fixture(scope="module")
def models_dir() -> str:
    folder = os.environ.get(MODELS_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tether", "mediapipe-0.10.14-models")
    if not os.path.isfile(os.path.join(folder, "selfie_segmentation.tflite")):
        unavailable("MediaPipe's models in %s" % folder, "scripts/test.sh (it fetches them into the cache)")
    return folder


def _litert(path: str, inputs, reference: bool = False):
    litert = require_module("ai_edge_litert.interpreter", "pip install ai-edge-litert")
    kind = litert.OpResolverType.BUILTIN_REF if reference else litert.OpResolverType.AUTO
    it = litert.Interpreter(model_path=str(path), experimental_op_resolver_type=kind)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def _tether(path: str, folder, inputs):
    graph, params = from_tflite(str(path))
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.run(**dict(zip(graph.inputs, inputs)))
    return [gm.get_output(i) for i in range(len(graph.outputs))]


def _inputs(path: str, seed: int = 0):
    litert = require_module("ai_edge_litert.interpreter", "pip install ai-edge-litert")
    it = litert.Interpreter(model_path=str(path))
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.0, 1.0, d["shape"]).astype(d["dtype"]) for d in it.get_input_details()]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(float(np.abs(b).max()), 1e-6))


@pytest.mark.parametrize("name", MODELS)
def test_mediapipe_model_matches_litert(models_dir, name, tmp_path):
    path = os.path.join(models_dir, name + ".tflite")
    inputs = _inputs(path)
    refs = _litert(path, inputs)
    outs = _tether(path, tmp_path / name, inputs)
    assert len(outs) == len(refs)
    for k, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape and out.dtype == ref.dtype, (k, out.shape, ref.shape)
        err = _rel(out, ref)
        if err > 1e-4:     # the model's own conditioning: LiteRT's kernel sets disagree this much as well
            spread = _rel(_litert(path, inputs, reference=True)[k], ref)
            assert err <= max(1e-4, 1.5 * spread), (name, k, err, spread)


def test_face_mesh_with_attention_is_refused_naming_its_custom_ops(models_dir, tmp_path):
    from tether.cli.main import cli

    path = os.path.join(models_dir, "face_landmark_with_attention.tflite")
    with pytest.raises(UnsupportedOpError) as info:
        from_tflite(path)
    assert "Landmarks2TransformMatrix" in str(info.value)
    res = CliRunner().invoke(cli, ["compile", path, "-o", str(tmp_path / "out")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and "Landmarks2TransformMatrix" in lines[0], res.output
    assert not (tmp_path / "out").exists()


# ---- the custom op alone, on hand-written models -----------------------------------------------------------
def _transpose_conv_bias_model(path, in_hw, kernel, strides, padding, cin=3, cout=5, options=None, seed=0):
    """input (1, H, W, cin) -> Convolution2DTransposeBias(weights OHWI, bias) -> output, sized as MediaPipe's
    kernel sizes it."""
    rng = np.random.default_rng(seed)
    (h, w), (kh, kw), (sh, sw) = in_hw, kernel, strides
    pad_h = max(0, kh - (h - 1) % sh - 1) if padding == 1 else 0
    pad_w = max(0, kw - (w - 1) % sw - 1) if padding == 1 else 0
    out_hw = (sh * (h - 1) + kh - pad_h, sw * (w - 1) + kw - pad_w)
    tensors = [T("x", (1, h, w, cin)),
               T("w", (cout, kh, kw, cin), data=rng.standard_normal((cout, kh, kw, cin)).astype(np.float32)),
               T("b", (cout,), data=rng.standard_normal(cout).astype(np.float32)),
               T("y", (1, *out_hw, cout))]
    raw = struct.pack("<3i", padding, sw, sh) if options is None else options
    write_tflite(path, tensors, [Op("CUSTOM", [0, 1, 2], [3], custom_code="Convolution2DTransposeBias",
                                    custom_options=raw)], [0], [3])
    return out_hw


@pytest.mark.parametrize("in_hw,kernel,strides,padding", [
    ((8, 8), (4, 4), (2, 2), 1), ((7, 5), (3, 3), (2, 2), 1), ((6, 9), (2, 3), (2, 1), 1), ((5, 5), (3, 3), (1, 1), 1),
    ((4, 6), (3, 2), (3, 2), 1), ((6, 4), (4, 4), (2, 2), 2), ((5, 3), (3, 1), (1, 2), 2)])
def test_transpose_conv_bias_matches_litert(in_hw, kernel, strides, padding, tmp_path):
    path = str(tmp_path / "tcb.tflite")
    out_hw = _transpose_conv_bias_model(path, in_hw, kernel, strides, padding)
    x = np.random.default_rng(1).standard_normal((1, *in_hw, 3)).astype(np.float32)
    (ref,) = _litert(path, [x])
    assert ref.shape == (1, *out_hw, 5)
    (out,) = _tether(path, tmp_path / "out", [x])
    assert out.shape == ref.shape and _rel(out, ref) <= 1e-5, _rel(out, ref)


@pytest.mark.parametrize("options,named", [(b"\x01\x00\x00\x00", "12 bytes"),
                                           (struct.pack("<3i", 3, 2, 2), "padding=3"),
                                           (struct.pack("<3i", 1, 0, 2), "positive strides")])
def test_transpose_conv_bias_with_bad_options_is_one_line(options, named, tmp_path):
    path = str(tmp_path / "bad.tflite")
    _transpose_conv_bias_model(path, (4, 4), (3, 3), (2, 2), 1, options=options)
    with pytest.raises(UnsupportedOpError) as info:
        from_tflite(path)
    msg = str(info.value)
    assert "Convolution2DTransposeBias" in msg and named in msg and "\n" not in msg, msg


def _pool_options(padding, stride, filt, activation=0) -> bytes:
    """TfLitePoolParams: padding, stride w/h, filter w/h, activation, then the padding the kernel computes."""
    return struct.pack("<10i", padding, stride[1], stride[0], filt[1], filt[0], activation, 0, 0, 0, 0)


def _mediapipe_argmax_pool(x, padding, stride, filt):
    """MediaPipe's MaxPoolingWithArgmax2D kernel, transcribed loop for loop: the first maximum of each window and
    its window position as the float ``y * filter_w + x + 0.1``."""
    n, h, w, c = x.shape
    (sh, sw), (fh, fw) = stride, filt
    oh, ow = ((-(-h // sh), -(-w // sw)) if padding == 1 else ((h - fh + sh) // sh, (w - fw + sw) // sw))
    top = max(((oh - 1) * sh + fh - h) // 2, 0)
    left = max(((ow - 1) * sw + fw - w) // 2, 0)
    values, index = np.zeros((n, oh, ow, c), np.float32), np.zeros((n, oh, ow, c), np.float32)
    for b in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for ch in range(c):
                    y0, x0 = oy * sh - top, ox * sw - left
                    best, at = np.float32(np.finfo(np.float32).min), (0, 0)
                    for fy in range(max(0, -y0), min(fh, h - y0)):
                        for fx in range(max(0, -x0), min(fw, w - x0)):
                            if x[b, y0 + fy, x0 + fx, ch] > best:
                                best, at = x[b, y0 + fy, x0 + fx, ch], (fy, fx)
                    values[b, oy, ox, ch] = best
                    index[b, oy, ox, ch] = np.float32(at[0] * fw + at[1]) + np.float32(0.1)
    return values, index


@pytest.mark.parametrize("in_hw,filt,padding", [((8, 8), (2, 2), 2), ((7, 9), (2, 2), 1), ((9, 7), (3, 3), 2),
                                                ((6, 10), (2, 5), 1)])
def test_argmax_pooling_and_unpooling_match_litert(in_hw, filt, padding, tmp_path):
    """Windows that tile the map (what LiteRT's XNNPACK runs): the pooled values and the unpooled map match LiteRT
    exactly (VALID; XNNPACK's unpooling takes no other padding), the indices MediaPipe's kernel (XNNPACK keeps its
    own integer encoding in the float tensor)."""
    h, w = in_hw
    oh, ow = ((-(-h // filt[0]), -(-w // filt[1])) if padding == 1 else (h // filt[0], w // filt[1]))
    path = str(tmp_path / "argmax.tflite")
    tensors = [T("x", (1, h, w, 4)), T("v", (1, oh, ow, 4)), T("i", (1, oh, ow, 4))]
    ops = [Op("CUSTOM", [0], [1, 2], custom_code="MaxPoolingWithArgmax2D",
              custom_options=_pool_options(padding, filt, filt))]
    outputs = [1, 2]
    if padding == 2:
        tensors.append(T("u", (1, oh * filt[0], ow * filt[1], 4)))
        ops.append(Op("CUSTOM", [1, 2], [3], custom_code="MaxUnpooling2D",
                      custom_options=_pool_options(padding, filt, filt)))
        outputs.append(3)
    write_tflite(path, tensors, ops, [0], outputs)
    x = np.random.default_rng(2).standard_normal((1, h, w, 4)).astype(np.float32)
    refs = _litert(path, [x])
    outs = _tether(path, tmp_path / "out", [x])
    np.testing.assert_array_equal(outs[0], refs[0])
    values, index = _mediapipe_argmax_pool(x, padding, filt, filt)
    np.testing.assert_array_equal(outs[0], values)
    np.testing.assert_array_equal(outs[1], index)
    if padding == 2:
        np.testing.assert_array_equal(outs[2], refs[2])
        assert np.count_nonzero(outs[2]) == values.size      # one value per window, each where its maximum was


@pytest.mark.parametrize("stride,filt,padding,activation", [((2, 2), (3, 3), 1, 0), ((1, 2), (2, 3), 2, 3),
                                                            ((3, 2), (2, 2), 1, 1)])
def test_argmax_pooling_with_overlapping_windows_matches_mediapipe(stride, filt, padding, activation, tmp_path):
    """Strides other than the filter (XNNPACK refuses them; MediaPipe's kernel takes them): against the kernel's
    own loop, with a fused RELU/RELU6 on the values."""
    path = str(tmp_path / "argmax.tflite")
    x = np.random.default_rng(3).standard_normal((1, 7, 8, 2)).astype(np.float32) * 4
    values, index = _mediapipe_argmax_pool(x, padding, stride, filt)
    write_tflite(path, [T("x", x.shape), T("v", values.shape), T("i", index.shape)],
                 [Op("CUSTOM", [0], [1, 2], custom_code="MaxPoolingWithArgmax2D",
                     custom_options=_pool_options(padding, stride, filt, activation))], [0], [1, 2])
    outs = _tether(path, tmp_path / "out", [x])
    clip = {0: (None, None), 1: (0, None), 3: (0, 6)}[activation]
    np.testing.assert_array_equal(outs[0], np.clip(values, *clip) if activation else values)
    np.testing.assert_array_equal(outs[1], index)


def test_unpooling_with_overlapping_windows_is_refused_in_one_line(tmp_path):
    path = str(tmp_path / "unpool.tflite")
    write_tflite(path, [T("v", (1, 3, 3, 2)), T("i", (1, 3, 3, 2)), T("u", (1, 9, 9, 2))],
                 [Op("CUSTOM", [0, 1], [2], custom_code="MaxUnpooling2D",
                     custom_options=_pool_options(2, (2, 2), (3, 3)))], [0, 1], [2])
    with pytest.raises(UnsupportedOpError) as info:
        from_tflite(path)
    msg = str(info.value)
    assert "MaxUnpooling2D" in msg and "strides (2, 2)" in msg and "\n" not in msg, msg
