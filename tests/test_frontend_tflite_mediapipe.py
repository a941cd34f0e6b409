"""MediaPipe's own models (the .tflite files of the mediapipe 0.10.14 wheel, fetched by scripts/test.sh into
$TETHER_MEDIAPIPE_MODELS) against LiteRT on the same input, and MediaPipe's custom ops that LiteRT's XNNPACK
delegate runs itself (``Convolution2DTransposeBias``, ``MaxPoolingWithArgmax2D``, ``MaxUnpooling2D``) on
hand-written models over their padding and stride cases; where XNNPACK does not run a case (overlapping pooling
windows) or encodes an output its own way (the argmax indices), against MediaPipe's kernel transcribed in numpy.
The face mesh with attention and its three custom ops (``Landmarks2TransformMatrix``, ``TransformTensorBilinear``,
``TransformLandmarks``), which LiteRT cannot run, against MediaPipe's own runtime (mediapipe 0.10.14 in a venv
scripts/test.sh makes; fixtures/mediapipe_runtime.py), and their version 1, which that runtime does not register,
against its kernel transcribed in numpy.

Float error reading: max |tether - LiteRT| / max |LiteRT| per output. The bound is 1e-4, except where LiteRT's two
kernel sets (XNNPACK and its reference kernels) already differ by more on the same input: there tether must stay
within that difference."""
from __future__ import annotations

import os
import struct
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from fixtures.prereq import require_module, unavailable
from fixtures.tflite_models import Op, T, write_tflite

import tether
from tether import graph_executor
from tether.errors import UnsupportedOpError
from tether.frontend import from_tflite
from tether.frontend.tflite import read_model

MODELS_ENV = "TETHER_MEDIAPIPE_MODELS"
# the models compared with LiteRT; the face mesh with attention, whose custom ops only MediaPipe runs, is compared
# with MediaPipe's runtime further below
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


# ---- the face mesh with attention's custom ops, against MediaPipe's own runtime ------------------------------
# Landmarks2TransformMatrix, TransformTensorBilinear and TransformLandmarks: LiteRT cannot run them, MediaPipe's
# CPU op resolver runs version 2 of each (fixtures/mediapipe_runtime.py, in the venv scripts/test.sh makes).
# Version 1 (MediaPipe's GPU delegate only) is compared with its kernel transcribed in numpy below.
MEDIAPIPE_PYTHON_ENV = "TETHER_MEDIAPIPE_PYTHON"
ATTENTION_OUTPUTS = ["output_mesh_identity", "output_lips", "output_left_eye", "output_right_eye",
                     "output_left_iris", "output_right_iris", "conv_faceflag"]


@pytest.fixture(scope="module")
def mediapipe_python() -> str:
    python = os.environ.get(MEDIAPIPE_PYTHON_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tether", "mediapipe-0.10.14-venv",
        "bin", "python")
    if not os.path.isfile(python):
        unavailable("MediaPipe's runtime (mediapipe 0.10.14 in %s)" % python,
                    "scripts/test.sh (it makes that venv)")
    return python


def _mediapipe(python: str, path: str, inputs, out_shapes, folder):
    """The model's outputs from MediaPipe's runtime, its custom ops in MediaPipe's own kernels."""
    runtime = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "mediapipe_runtime.py")
    os.makedirs(str(folder), exist_ok=True)
    ins, outs = os.path.join(str(folder), "inputs.npz"), os.path.join(str(folder), "outputs.npz")
    np.savez(ins, **{"x%d" % k: x for k, x in enumerate(inputs)})
    # the venv's own packages only: this process's PYTHONPATH could shadow its numpy or protobuf
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([python, runtime, str(path), ins, outs, str(len(out_shapes))], capture_output=True,
                         text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    with np.load(outs) as data:
        return [data["y%d" % k].reshape(shape) for k, shape in enumerate(out_shapes)]


def test_face_mesh_with_attention_matches_mediapipe(models_dir, mediapipe_python, tmp_path):
    path = os.path.join(models_dir, "face_landmark_with_attention.tflite")
    sg = read_model(path).subgraphs[0]
    assert sorted({op.custom_code for op in sg.operators if op.op == "CUSTOM"}) == [
        "Landmarks2TransformMatrix", "TransformLandmarks", "TransformTensorBilinear"]
    shapes = [list(sg.tensors[t].shape) for t in sg.outputs]
    x = np.random.default_rng(0).uniform(0.0, 1.0, sg.tensors[sg.inputs[0]].shape).astype(np.float32)
    refs = _mediapipe(mediapipe_python, path, [x], shapes, tmp_path / "mediapipe")
    outs = _tether(path, tmp_path / "out", [x])
    assert [sg.tensors[t].name for t in sg.outputs] == ATTENTION_OUTPUTS
    for name, out, ref in zip(ATTENTION_OUTPUTS, outs, refs):
        assert out.shape == ref.shape and np.isfinite(ref).all(), (name, out.shape, ref.shape)
        assert _rel(out, ref) <= 1e-4, (name, _rel(out, ref))


def _flex(**options) -> bytes:
    """Custom options as MediaPipe's models hold them: a FlexBuffer map, integer lists as typed vectors."""
    from flatbuffers import flexbuffers

    b = flexbuffers.Builder()
    with b.Map():
        for key, value in options.items():
            b.Key(key)
            if isinstance(value, (list, tuple)):
                b.TypedVectorFromElements(list(value), element_type=flexbuffers.Type.INT)
            elif isinstance(value, str):
                b.String(value)
            elif isinstance(value, float):
                b.Float(value)
            else:
                b.Int(value)
    return bytes(b.Finish())


def _custom_model(path, code, inputs, out_shape, options, version=2):
    """One custom op over run-time inputs ``[(name, shape)...]``; returns the path."""
    tensors = [T(name, shape) for name, shape in inputs] + [T("y", out_shape)]
    n = len(inputs)
    write_tflite(path, tensors, [Op("CUSTOM", list(range(n)), [n], custom_code=code, custom_options=options,
                                    version=version)], list(range(n)), [n])
    return str(path)


def _landmarks(rng, n, spread=60.0):
    """Face-like landmarks: a cloud around a centre of a 192-pixel crop, z small."""
    xy = 96.0 + rng.standard_normal((1, n, 2)) * spread
    return np.concatenate([xy, rng.standard_normal((1, n, 1)) * 5], axis=2).astype(np.float32)


def _similarity(angle, scale, shift):
    m = np.eye(4, dtype=np.float64)
    m[:2, :2] = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    m[:2, 3] = shift
    return m.astype(np.float32).reshape(1, 4, 4)


L2TM_V2_CASES = [
    # the model's own options (lips), its subset cut short
    dict(left_rotation_idx=61, right_rotation_idx=291, target_rotation_radians=0.0, output_height=16,
         output_width=16, scale_x=1.5, scale_y=1.5, subset_idxs=[61, 146, 91, 181, 84, 17, 314, 405, 321, 375]),
    # a target rotation, an odd subset (its last index paired with itself), other sizes and scales
    dict(left_rotation_idx=3, right_rotation_idx=250, target_rotation_radians=0.7, output_height=24,
         output_width=12, scale_x=2.0, scale_y=0.8, subset_idxs=[5, 9, 400, 33, 120, 7, 467]),
    # both rotation landmarks the same point: atan2(0, 0)
    dict(left_rotation_idx=10, right_rotation_idx=10, target_rotation_radians=-1.2, output_height=8,
         output_width=8, scale_x=1.0, scale_y=1.0, subset_idxs=[1, 2, 3, 4]),
]


@pytest.mark.parametrize("case", range(len(L2TM_V2_CASES)))
def test_landmarks_to_transform_matrix_matches_mediapipe(case, mediapipe_python, tmp_path):
    path = _custom_model(tmp_path / "l2tm.tflite", "Landmarks2TransformMatrix", [("landmarks", (1, 468, 3))],
                         (1, 4, 4), _flex(**L2TM_V2_CASES[case]))
    x = _landmarks(np.random.default_rng(case), 468)
    (ref,) = _mediapipe(mediapipe_python, path, [x], [(1, 4, 4)], tmp_path / "mediapipe")
    (out,) = _tether(path, tmp_path / "out", [x])
    assert _rel(out, ref) <= 1e-5, (out, ref)


@pytest.mark.parametrize("in_hw,out_hw,angle,scale,shift", [
    ((48, 48), (16, 16), 0.3, 1.4, (10.0, 5.0)),        # inside the map, rotated
    ((9, 13), (7, 5), -0.8, 2.5, (-3.0, 4.0)),          # partly outside: zeros there
    ((6, 6), (11, 11), 0.0, 0.5, (0.0, 0.0)),           # pixel centres on the last row and column
])
def test_transform_tensor_bilinear_matches_mediapipe(in_hw, out_hw, angle, scale, shift, mediapipe_python,
                                                     tmp_path):
    c = 5
    path = _custom_model(tmp_path / "ttb.tflite", "TransformTensorBilinear",
                         [("x", (1, *in_hw, c)), ("matrix", (1, 4, 4))], (1, *out_hw, c),
                         _flex(output_height=out_hw[0], output_width=out_hw[1]))
    x = np.random.default_rng(4).standard_normal((1, *in_hw, c)).astype(np.float32)
    m = _similarity(angle, scale, shift)
    (ref,) = _mediapipe(mediapipe_python, path, [x, m], [(1, *out_hw, c)], tmp_path / "mediapipe")
    assert np.count_nonzero(ref) > 0
    (out,) = _tether(path, tmp_path / "out", [x, m])
    # tether's code contracts the sample point's m0 x + m1 y + m3 into FMAs, MediaPipe's does not: the point moves
    # by an ulp, which this map's unit gradients show as up to 3e-6 (a numpy float32 transcription of the kernel
    # is 8e-8 from MediaPipe)
    assert _rel(out, ref) <= 1e-5, _rel(out, ref)


@pytest.mark.parametrize("n,dims", [(80, 2), (71, 3)])
def test_transform_landmarks_matches_mediapipe(n, dims, mediapipe_python, tmp_path):
    path = _custom_model(tmp_path / "tl.tflite", "TransformLandmarks", [("landmarks", (1, n, dims)),
                                                                         ("matrix", (1, 4, 4))], (1, n, dims), b"")
    x = _landmarks(np.random.default_rng(5), n)[:, :, :dims].copy()
    m = np.random.default_rng(6).standard_normal((1, 4, 4)).astype(np.float32)
    (ref,) = _mediapipe(mediapipe_python, path, [x, m], [(1, n, dims)], tmp_path / "mediapipe")
    (out,) = _tether(path, tmp_path / "out", [x, m])
    assert _rel(out, ref) <= 1e-6, _rel(out, ref)



# ---- version 1: MediaPipe's GPU delegate runs it, its CPU op resolver does not register it --------------------
# The kernels of mediapipe/util/tflite/operations (landmarks_to_transform_matrix.cc, transform_tensor_bilinear.cc,
# transform_landmarks.cc: namespace v1), transcribed in float32 step for step.
def _mediapipe_l2tm_v1(landmarks, o):
    f = np.float32
    data = landmarks.reshape(-1)

    def xy(i):
        return data[i * 3], data[i * 3 + 1]

    (lx, ly), (rx, ry) = xy(o["left_rotation_idx"]), xy(o["right_rotation_idx"])
    alpha = -np.arctan((ry - ly) / (rx - lx))
    subset = list(o["subset"]) + ([o["subset"][-1]] if len(o["subset"]) % 2 else [])
    hi, lo = [f(-100000), f(-100000)], [f(100000), f(100000)]
    for i in subset:
        x, y = xy(i)
        rot = (x * np.cos(alpha) - y * np.sin(alpha), x * np.sin(alpha) + y * np.cos(alpha))
        hi = [max(hi[k], rot[k]) for k in range(2)]
        lo = [min(lo[k], rot[k]) for k in range(2)]
    bbox = [(hi[k] - lo[k]) * f(o["bbox_size_multiplier"]) for k in range(2)]
    rng = f(o["landmarks_range"])
    scale = np.array([[bbox[0] / rng, 0, 0], [0, bbox[1] / rng, 0], [0, 0, 1]], f)
    mx, my = (hi[0] + lo[0]) / f(2), (hi[1] + lo[1]) / f(2)
    ca, sa = np.cos(-alpha), np.sin(-alpha)
    rmx, rmy = mx * ca - my * sa, mx * sa + my * ca
    rotation = np.array([[ca, -sa, f((rmx / rng) * 2.0 - 1.0)], [sa, ca, f((rmy / rng) * 2.0 - 1.0)], [0, 0, 1]], f)
    (ih, iw), (oh, ow) = o["input_hw"], o["output_hw"]
    to_relative = np.array([[2.0 / (ow - 1.0), 0, -1], [0, 2.0 / (oh - 1.0), -1], [0, 0, 1]], f)
    to_absolute = np.array([[(iw - 1.0) / 2.0, 0, (iw - 1.0) / 2.0], [0, (ih - 1.0) / 2.0, (ih - 1.0) / 2.0],
                            [0, 0, 1]], f)
    itm = ((to_absolute @ rotation) @ scale) @ to_relative
    return np.array([[itm[0, 0], itm[0, 1], 0, itm[0, 2]], [itm[1, 0], itm[1, 1], 0, itm[1, 2]],
                     [itm[2, 0], itm[2, 1], itm[2, 2], 0], [0, 0, 0, 1]], f).reshape(1, 4, 4)


def _mediapipe_transform_tensor_v1(x, matrix, out_hw):
    f = np.float32
    _, h, w, c = x.shape
    m = matrix.reshape(-1)
    out = np.zeros((1, *out_hw, c), f)
    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            tx = m[0] * f(ox) + m[1] * f(oy) + m[2] * f(0) + m[3] * f(1)
            ty = m[4] * f(ox) + m[5] * f(oy) + m[6] * f(0) + m[7] * f(1)
            if tx < 0 or tx > w - 1 or ty < 0 or ty > h - 1:
                continue

            def read(yy, xx):
                return x[0, yy, xx] if 0 <= yy < h and 0 <= xx < w else np.zeros(c, f)

            fy, fx = int(np.floor(ty)), int(np.floor(tx))
            right, lower = tx - f(fx), ty - f(fy)
            upper = (f(1) - right) * read(fy, fx) + right * read(fy, fx + 1)
            below = (f(1) - right) * read(fy + 1, fx) + right * read(fy + 1, fx + 1)
            out[0, oy, ox] = lower * below + (f(1) - lower) * upper
    return out


def _mediapipe_transform_landmarks_v1(x, matrix, dims, scale):
    f = np.float32
    m = matrix.reshape(-1)
    out = x.copy()
    points = out.reshape(-1, dims)
    for p in points:
        px, py = p[0], p[1]
        p[0] = m[0] * px + m[1] * py + m[2] * f(0) + (m[3] * f(scale)) * f(1)
        p[1] = m[4] * px + m[5] * py + m[6] * f(0) + (m[7] * f(scale)) * f(1)
    return out


L2TM_V1_CASES = [
    dict(left_rotation_idx=33, right_rotation_idx=263, subset=[33, 263, 1, 61, 291, 199, 10, 152], dimensions=3,
         landmarks_range=192, bbox_size_multiplier=1.5, input_hw=[48, 48], output_hw=[16, 16]),
    dict(left_rotation_idx=5, right_rotation_idx=40, subset=[7, 8, 9, 300, 200], dimensions=3,
         landmarks_range=256, bbox_size_multiplier=0.9, input_hw=[30, 20], output_hw=[12, 8]),
]


@pytest.mark.parametrize("case", range(len(L2TM_V1_CASES)))
def test_landmarks_to_transform_matrix_v1_matches_mediapipe_kernel(case, tmp_path):
    o = L2TM_V1_CASES[case]
    path = _custom_model(tmp_path / "l2tm1.tflite", "Landmarks2TransformMatrix", [("landmarks", (1, 1, 1, 1404))],
                         (1, 4, 4), _flex(**o), version=1)
    x = _landmarks(np.random.default_rng(10 + case), 468).reshape(1, 1, 1, 1404)
    ref = _mediapipe_l2tm_v1(x, o)
    (out,) = _tether(path, tmp_path / "out", [x])
    assert _rel(out, ref) <= 1e-5, (out, ref)


@pytest.mark.parametrize("in_hw,out_hw,angle,scale,shift,options", [
    ((9, 13), (7, 5), -0.8, 2.5, (-3.0, 4.0), dict(mode="bilinear", output_size=[7, 5])),
    ((6, 6), (11, 11), 0.0, 0.5, (0.0, 0.0), {}),
])
def test_transform_tensor_bilinear_v1_matches_mediapipe_kernel(in_hw, out_hw, angle, scale, shift, options,
                                                               tmp_path):
    path = _custom_model(tmp_path / "ttb1.tflite", "TransformTensorBilinear",
                         [("x", (1, *in_hw, 3)), ("matrix", (1, 4, 4))], (1, *out_hw, 3),
                         _flex(**options) if options else b"", version=1)
    x = np.random.default_rng(7).standard_normal((1, *in_hw, 3)).astype(np.float32)
    m = _similarity(angle, scale, shift)
    ref = _mediapipe_transform_tensor_v1(x, m, out_hw)
    assert np.count_nonzero(ref) > 0
    (out,) = _tether(path, tmp_path / "out", [x, m])
    assert _rel(out, ref) <= 1e-5, _rel(out, ref)


@pytest.mark.parametrize("shape,options,dims,scale", [((1, 2, 3, 12), {}, 3, 1.0),
                                                      ((1, 1, 1, 10), dict(dimensions=2, scale=0.25), 2, 0.25)])
def test_transform_landmarks_v1_matches_mediapipe_kernel(shape, options, dims, scale, tmp_path):
    path = _custom_model(tmp_path / "tl1.tflite", "TransformLandmarks", [("landmarks", shape), ("matrix", (1, 4, 4))],
                         shape, _flex(**options) if options else b"", version=1)
    x = np.random.default_rng(8).uniform(0, 192, shape).astype(np.float32)
    m = np.random.default_rng(9).standard_normal((1, 4, 4)).astype(np.float32)
    ref = _mediapipe_transform_landmarks_v1(x, m, dims, scale)
    (out,) = _tether(path, tmp_path / "out", [x, m])
    assert _rel(out, ref) <= 1e-6, _rel(out, ref)


_L2TM_GOOD = L2TM_V2_CASES[0]


@pytest.mark.parametrize("code,inputs,out_shape,options,version,named", [
    ("Landmarks2TransformMatrix", [("l", (1, 468, 3))], (1, 4, 4), _flex(**dict(_L2TM_GOOD, scale_x=0.0)), 2,
     "scale_x=0"),
    ("Landmarks2TransformMatrix", [("l", (1, 468, 3))], (1, 4, 4), _flex(**dict(_L2TM_GOOD, subset_idxs=[3, 468])),
     2, "'subset_idxs'"),
    ("Landmarks2TransformMatrix", [("l", (1, 468, 3))], (1, 4, 4),
     _flex(**{k: v for k, v in _L2TM_GOOD.items() if k != "output_width"}), 2, "output_width=0"),
    ("Landmarks2TransformMatrix", [("l", (1, 468, 3))], (1, 4, 4), _flex(**_L2TM_GOOD), 3, "version 3"),
    ("Landmarks2TransformMatrix", [("l", (1, 468, 3))], (1, 4, 4), b"\x01\x02\x03", 2, "FlexBuffer"),
    ("TransformTensorBilinear", [("x", (1, 8, 8, 2)), ("m", (1, 4, 4))], (1, 4, 4, 2),
     _flex(output_height=4, output_width=5), 2, "[4, 5]"),
    ("TransformTensorBilinear", [("x", (1, 8, 8, 2)), ("m", (1, 4, 4))], (1, 4, 4, 2), _flex(mode="nearest"), 1,
     "'nearest'"),
    ("TransformLandmarks", [("l", (1, 5, 4)), ("m", (1, 4, 4))], (1, 5, 4), b"", 2, "2 or 3 coordinates"),
    ("TransformLandmarks", [("l", (1, 1, 1, 10)), ("m", (1, 4, 4))], (1, 1, 1, 10), _flex(dimensions=3), 1,
     "dimensions=3"),
    ("TransformLandmarks", [("l", (2, 5, 2)), ("m", (1, 4, 4))], (2, 5, 2), b"", 2, "batch 1"),
])
def test_attention_ops_with_bad_options_are_one_line(code, inputs, out_shape, options, version, named, tmp_path):
    from tether.cli.main import cli

    path = _custom_model(tmp_path / "bad.tflite", code, inputs, out_shape, options, version)
    with pytest.raises(UnsupportedOpError) as info:
        from_tflite(path)
    msg = str(info.value)
    assert code in msg and named in msg and "\n" not in msg, msg
    res = CliRunner().invoke(cli, ["compile", path, "-o", str(tmp_path / "out")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and named in lines[0], res.output
    assert not (tmp_path / "out").exists()
