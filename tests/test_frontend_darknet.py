"""Darknet models (.cfg + .weights) read without darknet, compiled by tether and compared with OpenCV's dnn module
(its Darknet importer, in OpenCV 4: the test extra pins it below 5, which dropped it) on the same input:
a YOLOv4-tiny-structured detector at 128x128, a YOLOv2-style one and a small classifier, all with random weights
written in darknet's format at test time."""
import os

import numpy as np
import pytest
from click.testing import CliRunner

import tether
from tether import graph_executor
from tether.cli.main import cli
from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend import detect, from_darknet
from tether.frontend.darknet import op_coverage, to_onnx



def _conv(filters, size=3, stride=1, act="leaky", bn=1):
    return "[convolutional]\nbatch_normalize=%d\nfilters=%d\nsize=%d\nstride=%d\npad=1\nactivation=%s\n" % (
        bn, filters, size, stride, act)


def _csp(filters, act="leaky"):
    """YOLOv4-tiny's CSP block: conv, half the channels through two convs, joined, 1x1, joined, max-pooled."""
    return "".join([_conv(filters, act=act), "[route]\nlayers=-1\ngroups=2\ngroup_id=1\n",
                    _conv(filters // 2, act=act), _conv(filters // 2, act=act), "[route]\nlayers=-1,-2\n",
                    _conv(filters, 1, act=act), "[route]\nlayers=-6,-1\n", "[maxpool]\nsize=2\nstride=2\n"])


YOLO = "[yolo]\nmask=%s\nanchors=10,14, 23,27, 37,58, 81,82, 135,169, 344,319\nclasses=2\nnum=6\nscale_x_y=1.05\n"

# yolov4-tiny.cfg's layers with 1/8 of its filters, 2 classes and a 128x128 input; mish, swish and logistic
# stand in for leaky in places, and a 2x2 stride-1 max pool (darknet's asymmetric padding) is added
YOLOV4_TINY = "".join([
    "[net]\nbatch=64\nwidth=128\nheight=128\nchannels=3\n# comment\n\n",
    _conv(4, stride=2), _conv(8, stride=2, act="mish"),                           # 0, 1
    _csp(8), _csp(16, act="swish"), _csp(32),                                     # 2-9, 10-17, 18-25
    _conv(64), "[maxpool]\nsize=2\nstride=1\n",                                   # 26, 27
    _conv(32, 1), _conv(64, act="logistic"),                                      # 28, 29
    _conv(21, 1, act="linear", bn=0), YOLO % "3,4,5",                               # 30, 31
    "[route]\nlayers = -4\n", _conv(16, 1), "[upsample]\nstride=2\n",             # 32-34
    "[route]\nlayers = -1, 23\n", _conv(32), _conv(21, 1, act="logistic", bn=0),  # 35-37
    YOLO % "1,2,3" + "new_coords=1\n",                                           # 38: scaled-YOLOv4's decoding
])

CLASSIFIER = "".join([
    "[net]\nwidth=32\nheight=32\nchannels=3\n",
    _conv(8, stride=2), "[maxpool]\nsize=3\nstride=2\n",                          # 0, 1
    _conv(8, act="mish"), _conv(8, 1, act="linear"), "[shortcut]\nfrom=-3\nactivation=leaky\n",   # 2-4
    "[convolutional]\nfilters=16\nsize=3\nstride=1\npad=1\ngroups=2\nactivation=logistic\n",    # 5
    "[avgpool]\n", "[connected]\noutput=10\nactivation=linear\n", "[dropout]\nprobability=.5\n",  # 6-8
    "[softmax]\ngroups=1\n",                                                      # 9
])


def _weights(cfg_text, rng, version=(0, 2, 5)):
    """darknet's .weights for ``cfg_text``: header, then per conv / connected layer biases, batch-norm scales,
    means and variances, weights (a connected layer keeps its batch norm after the weights)."""
    from tether.frontend.darknet.cfg import parse_cfg

    net = parse_cfg(cfg_text, "test.cfg")
    c = net.net.int("channels", 3)
    size = (net.net.int("height", 0), net.net.int("width", 0))
    chans, sizes, chunks = [], [], []
    for s in net.layers:
        if s.type == "convolutional":
            f, k, g, st = s.int("filters", 1), s.int("size", 1), s.int("groups", 1), s.int("stride", 1)
            chunks.append(rng.normal(0, 0.1, f))
            if s.int("batch_normalize", 0):
                chunks += [rng.uniform(0.5, 1.5, f), rng.normal(0, 0.1, f), rng.uniform(0.5, 1.5, f)]
            chunks.append(rng.normal(0, 1.0 / np.sqrt(c // g * k * k), f * (c // g) * k * k))
            c, size = f, (size[0] // st, size[1] // st)
        elif s.type == "connected":
            n_in = c * size[0] * size[1]
            c, size = s.int("output", 1), (1, 1)
            chunks += [rng.normal(0, 0.1, c), rng.normal(0, 1.0 / np.sqrt(n_in), c * n_in)]
        elif s.type == "route":
            refs = [r if r >= 0 else s.index + r for r in s.ints("layers")]
            c = sum(chans[r] for r in refs) // s.int("groups", 1)
            size = sizes[refs[0]]
        elif s.type == "maxpool":
            st = s.int("stride", 1)
            size = (size[0] // st, size[1] // st)
        elif s.type == "upsample":
            size = (size[0] * 2, size[1] * 2)
        elif s.type == "avgpool":
            size = (1, 1)
        chans.append(c)
        sizes.append(size)
    header = np.array(version, np.int32).tobytes() + np.array([12345], np.uint64).tobytes()
    return header + np.concatenate(chunks).astype(np.float32).tobytes()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("darknet")
    rng = np.random.default_rng(0)
    out = {}
    for name, text in (("yolov4-tiny", YOLOV4_TINY), ("classifier", CLASSIFIER)):
        (d / (name + ".cfg")).write_text(text)
        (d / (name + ".weights")).write_bytes(_weights(text, rng))
        out[name] = (str(d / (name + ".cfg")), str(d / (name + ".weights")))
    return out


def _cv2():
    """OpenCV 4's dnn module, the reference (the test extra pins it: OpenCV 5 dropped its Darknet importer)."""
    import cv2
    if not hasattr(cv2.dnn, "readNetFromDarknet"):
        pytest.fail("the reference needs OpenCV 4's Darknet importer (OpenCV 5 dropped it): "
                    "pip install 'opencv-python-headless<5'")
    return cv2


def _opencv(cfg, weights, x):
    cv2 = _cv2()
    net = cv2.dnn.readNetFromDarknet(cfg, weights)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setInput(x)
    return net.forward(net.getUnconnectedOutLayersNames())


def _tether(cfg, x, folder, weights=None):
    graph, params = from_darknet(cfg, weights, shape={"data": x.shape})
    tether.build_graph(graph, params, target="host").export(str(folder))
    gm = graph_executor.load(str(folder))
    gm.set_input("data", x)
    gm.run()
    return [gm.get_output(i) for i in range(len(graph.outputs))]


def _assert_close(ours, ref, thresh=None):
    """max |ours - ref| <= 1e-4 max |ref|. A [yolo] class score is zeroed when not above its threshold, a step
    that float rounding may cross: scores within 1e-4 of the threshold are left out."""
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    keep = np.ones(ref.shape, bool)
    if thresh is not None:
        near = (np.abs(ref[:, 5:] - thresh) < 1e-4) | (np.abs(ours[:, 5:] - thresh) < 1e-4)
        keep[:, 5:] = ~near
    err = np.abs(ours - ref)[keep].max() / np.abs(ref).max()
    assert err <= 1e-4, err
    return err


def test_yolov4_tiny_matches_opencv(models, tmp_path):
    cfg, weights = models["yolov4-tiny"]
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, 128, 128)).astype(np.float32)
    ref = _opencv(cfg, weights, x)
    ours = _tether(cfg, x, tmp_path)
    assert [o.shape for o in ours] == [(4 * 4 * 3, 7), (8 * 8 * 3, 7)]
    for o, r in zip(ours, ref):
        _assert_close(o, r, thresh=0.2)
    # the class scores are neither all zero nor all kept: the threshold took part
    assert 0 < np.count_nonzero(ref[0][:, 5:]) < ref[0][:, 5:].size


def test_classifier_matches_opencv_from_the_weights_file(models, tmp_path):
    cfg, weights = models["classifier"]
    x = np.random.default_rng(2).uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)
    (ref,) = _opencv(cfg, weights, x)
    (ours,) = _tether(weights, x, tmp_path)        # named by its .weights: the .cfg beside it is found
    assert ours.shape == (1, 10)
    _assert_close(ours, ref)
    x2 = np.random.default_rng(7).uniform(0, 1, (3, 3, 32, 32)).astype(np.float32)     # another batch size
    (ref,) = _opencv(cfg, weights, x2)
    (ours,) = _tether(cfg, x2, tmp_path / "batch3")
    _assert_close(ours, ref)


YOLOV2 = "".join([
    "[net]\nwidth=64\nheight=64\nchannels=3\n",
    _conv(8, stride=2), "[maxpool]\nsize=2\nstride=2\n", _conv(16), "[reorg]\nstride=2\n", _conv(16),
    _conv(5 * (5 + 3), 1, act="linear", bn=0),
    "[region]\nanchors=1.08,1.19, 3.42,4.41, 6.63,11.38, 9.42,5.11, 16.62,10.52\nclasses=3\nnum=5\nsoftmax=1\n",
])


def test_yolov2_reorg_and_region_match_opencv(tmp_path):
    """[reorg] (darknet's own index shuffle) and [region] with softmax. OpenCV suppresses overlapping boxes inside
    its Region layer; darknet's layer does not, so the class scores OpenCV keeps must be ours, and the boxes and
    objectness all match."""
    rng = np.random.default_rng(5)
    chunks = []
    for n_in, n_out, k, bn in ((3, 8, 3, 1), (8, 16, 3, 1), (64, 16, 3, 1), (16, 40, 1, 0)):
        chunks.append(rng.normal(0, 0.1, n_out))
        if bn:
            chunks += [rng.uniform(0.5, 1.5, n_out), rng.normal(0, 0.1, n_out), rng.uniform(0.5, 1.5, n_out)]
        chunks.append(rng.normal(0, 1.0 / np.sqrt(n_in * k * k), n_out * n_in * k * k))
    cfg, weights = tmp_path / "yolov2.cfg", tmp_path / "yolov2.weights"
    cfg.write_text(YOLOV2)
    weights.write_bytes(np.array([0, 1, 0, 0], np.int32).tobytes()       # version 0.1: a 32-bit "seen"
                        + np.concatenate(chunks).astype(np.float32).tobytes())
    x = np.random.default_rng(6).uniform(0, 1, (1, 3, 64, 64)).astype(np.float32)
    (ref,) = _opencv(str(cfg), str(weights), x)
    (ours,) = _tether(str(cfg), x, tmp_path / "out")
    _assert_close(ours[:, :5], ref[:, :5])
    kept = ref[:, 5:] > 0
    assert kept.any()
    assert np.abs(ours[:, 5:][kept] - ref[:, 5:][kept]).max() <= 1e-4 * np.abs(ref).max()


def test_detect_and_coverage(models):
    cfg, weights = models["yolov4-tiny"]
    assert detect.detect(cfg).name == "Darknet" and detect.detect(weights).name == "Darknet"
    rows = {r["op_type"]: r for r in op_coverage(cfg)}
    assert all(r["covered"] for r in rows.values())
    assert rows["route"]["nodes"][:2] == ["layer 3", "layer 6"] and rows["yolo"]["domain"] == "Darknet"
    assert {"activation=mish", "activation=swish", "activation=leaky"} <= set(rows)


def test_unsupported_layers_are_all_named_in_one_error(models, tmp_path):
    cfg = tmp_path / "odd.cfg"
    cfg.write_text("[net]\nwidth=16\nheight=16\nchannels=3\n" + _conv(7, act="linear") + "[crnn]\nhidden=4\n"
                   + "[local_avgpool]\n[route]\nlayers=0\n" + _conv(4, act="hardmish") + "[route]\nlayers=0\n"
                   + YOLO % "0" + "nms_threshold=0.4\n")
    (tmp_path / "odd.weights").write_bytes(np.array([0, 2, 0, 0, 0], np.int32).tobytes() + bytes(4 * 1000))
    with pytest.raises(UnsupportedOpError) as exc:
        to_onnx(str(cfg))
    msg = str(exc.value)
    assert "\n" not in msg and "4 Darknet layer(s)" in msg
    for part in ("crnn (layer 1", "local_avgpool (layer 2", "activation=hardmish (layer 4", "weights 0.2.0",
                 "yolo nms_threshold=0.4 (layer 6"):
        assert part in msg, msg
    rows = {r["op_type"]: r["covered"] for r in op_coverage(str(cfg))}
    assert rows["crnn"] is False and rows["activation=hardmish"] is False and rows["convolutional"] is True


def test_missing_or_truncated_companion_is_invalid_input(models, tmp_path):
    cfg, weights = models["classifier"]
    lone = tmp_path / "lone.cfg"
    lone.write_text(open(cfg).read())
    with pytest.raises(InvalidInput, match="lone.weights"):
        to_onnx(str(lone))
    (tmp_path / "lone.weights").write_bytes(open(weights, "rb").read()[:300])
    with pytest.raises(InvalidInput, match="truncated"):
        to_onnx(str(lone))


def test_cli_compile_and_check(models, tmp_path):
    cfg, weights = models["classifier"]
    runner = CliRunner()
    res = runner.invoke(cli, ["compile", cfg, "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert os.path.isfile(tmp_path / "out" / "deploy.so")
    res = runner.invoke(cli, ["compile", "--check", weights])
    assert res.exit_code == 0, res.output
    assert "connected" in res.output and "0 not covered" in res.output


def test_cli_corrupt_weights_exit_2_one_line(models, tmp_path):
    import subprocess
    import sys

    cfg, weights = models["yolov4-tiny"]
    bad = tmp_path / "bad.cfg"
    bad.write_text(open(cfg).read())
    (tmp_path / "bad.weights").write_bytes(open(weights, "rb").read()[:1000])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, "src"), os.path.join(root, "rpc_server"),
                                                      os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tether.cli.main", "compile", str(bad), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=600)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "bad.weights" in err, err


@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_aarch64_yolov4_tiny(models, emulated_devices, tmp_path):
    from tether import rpc

    cfg, weights = models["yolov4-tiny"]
    device = emulated_devices.for_preset("rasp4b")
    x = np.random.default_rng(3).uniform(0, 1, (1, 3, 128, 128)).astype(np.float32)
    ref = _opencv(cfg, weights, x)
    graph, params = from_darknet(cfg)
    tether.build_graph(graph, params, target="rasp4b").export(str(tmp_path))
    with rpc.connect(*device.address, timeout=300) as sess:
        with sess.graph_executor(str(tmp_path)) as gm:
            gm.run(data=x)
            ours = [gm.get_output(i) for i in range(len(ref))]
    for o, r in zip(ours, ref):
        _assert_close(o, r, thresh=0.2)
