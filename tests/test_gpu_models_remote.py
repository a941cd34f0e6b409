"""Whole models on a remote device's GPU, through a real rpc-tracker: the models of tests/test_gpu_models.py
(tests/fixtures/gpu_models.py) against onnxruntime, every output with onnxruntime's dtype and shape and a max
relative error <= 1e-4 (tests/wasm_cases.compare_model).

- On the host: a real forked device server (`python -m tether_rpc`) registered with a real rpc-tracker on loopback;
  the client requests it by key, `remote.graph_executor(folder)` uploads deploy.json, deploy.so and deploy.params
  and the device runs the model on its pocl (OpenCL) or lavapipe (Vulkan) device, the one the model was built for.
- On the emulated aarch64 device (qemu-user, the "opencl" userland: pocl in the guest), the same models built for
  `opencl -host=rasp4b`, through the tracker too. pocl compiles every kernel with clang under qemu: each model
  takes 14-45 s on two cores with the module's fresh pocl cache (the five about 2 min 15 s, the yolov8 detector the
  longest), a second or two once its kernels are cached. Emulated timings are no performance figures: none is
  asserted.
"""
from __future__ import annotations

import tempfile

import numpy as np
import pytest
from fixtures.emulated import GPU_SESSION_TIMEOUT, POCL_KEY
from fixtures.gpu_models import APIS, require_api
from fixtures.tracker import TrackerLab
from wasm_cases import compare_model, ort_reference

from tether import errors

MODELS = ("mobilenet_v2", "resnet50", "yolov8_detector", "crnn_recognizer", "transformer_encoder")
HOST_KEY = "host-gpu"
# the first run of a model compiles its kernels (pocl and lavapipe both compile on the device, at load)
HOST_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def host_tracker():
    """A real rpc-tracker and one real device server on this host (pocl and lavapipe both), as HOST_KEY."""
    with tempfile.TemporaryDirectory(prefix="tether-gpu-models-remote-") as workdir:
        lab = TrackerLab(workdir)
        try:
            tracker = lab.tracker()
            lab.device(tracker, HOST_KEY)
            yield tracker, lab.devices[0]
        finally:
            lab.close()


def _request(client, key: str, timeout: float):
    return client.request(key, wait_timeout=timeout, timeout=timeout)


def _outputs(ge) -> list:
    return [ge.get_output(i) for i in range(ge.get_num_outputs())]


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("name", MODELS)
def test_model_on_a_remote_gpu_through_the_tracker(gpu_built, host_tracker, name, api):
    require_api(api)
    tracker, device = host_tracker
    folder = gpu_built.folder(name, api)
    _, feeds, ref = gpu_built.model(name)
    with tracker.client() as client, _request(client, HOST_KEY, HOST_TIMEOUT) as remote:
        assert any(g["spec"] == api + ":0" for g in remote.device_info()["gpus"])
        with remote.graph_executor(folder) as ge:
            assert ge.device == api + ":0"
            ge.run(**feeds)
            compare_model(_outputs(ge), ref)
    assert device.proc.poll() is None, device.log()


def test_remote_gpu_model_takes_device_arrays_and_a_named_device(gpu_built, host_tracker):
    """Inputs already on the session's GPU (the model and the session's arrays share one device), then host
    inputs again; a device of the other API is refused in one line and the session goes on."""
    require_api("opencl")
    require_api("vulkan")
    tracker, device = host_tracker
    folder = gpu_built.folder("mobilenet_v2", "opencl")
    model, feeds, ref = gpu_built.model("mobilenet_v2")
    other = {k: np.random.default_rng(3).standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
    with tracker.client() as client, _request(client, HOST_KEY, HOST_TIMEOUT) as remote:
        with remote.graph_executor(folder, device="opencl:0") as ge:
            assert ge.device == "opencl:0"
            with remote.array(feeds["input"], device="opencl:0") as x:
                ge.run(input=x)
            compare_model(_outputs(ge), ref)
            ge.run(**other)
            compare_model(_outputs(ge), ort_reference(model, other, threads=1))
        with pytest.raises(errors.RemoteError) as info:
            remote.graph_executor(folder, uploaded=True, device="vulkan:0")
        message = str(info.value.args[0]) if info.value.args else ""
        assert "runs on OpenCL, not on vulkan device 0" in message and "\n" not in message, message
        assert remote.get_function("tether.echo")(5) == 5
    assert device.proc.poll() is None, device.log()


@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_on_the_emulated_devices_opencl_through_the_tracker(gpu_built, pocl_device, emulated_tracker, name):
    folder = gpu_built.folder(name, "opencl -host=rasp4b")
    _, feeds, ref = gpu_built.model(name)
    with emulated_tracker.client() as client, _request(client, POCL_KEY, GPU_SESSION_TIMEOUT) as remote:
        assert remote.device_info()["arch"] == "aarch64"
        with remote.graph_executor(folder) as ge:
            assert ge.device == "opencl:0"
            ge.run(**feeds)
            compare_model(_outputs(ge), ref)
    assert pocl_device.alive(), pocl_device.output
