"""Whole models on GPUs: compiled with `tether.build_graph` for `opencl` (run on pocl) and `vulkan` (run on Mesa's
lavapipe), run by the graph executor with their activations in device memory, against onnxruntime (every output
with onnxruntime's dtype and shape and a max relative error <= 1e-4, as tests/wasm_cases.compare_model).

The models: mobilenet_v2 and the YOLOv8-style detector, the CRNN text recognizer (whose two LSTMs run on the
host's CPU: the copies around them), the transformer encoder and the voice-activity detector (LSTMs with state
inputs, a run-time If: guarded nodes whose flags a GPU kernel computes) of tests/wasm_cases.MODELS, and resnet50 at its
full width on a 32x32 image with 10 classes (tests/test_c_runtime.py's variant: pocl on two cores runs the 224x224
one too slowly for a test). Each model is built once per target (module-scoped caches).
"""
from __future__ import annotations

import json
from typing import Dict

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from fixtures.gpu_models import APIS, GPU_MODELS, ON_CPU
from fixtures.gpu_models import require_api as _require
from wasm_cases import CASES, MODELS, compare_model, ort_reference

import tether
from tether.frontend import from_onnx
from tether.graph.plan import plan_kernels
from tether.kernels.registry import TeLowering
from tether.kernels.table import OPS
from tether_rpc.graph_executor import GraphExecutor

def _run(ge: GraphExecutor, feeds: Dict[str, np.ndarray]) -> list:
    ge.run(**feeds)
    return [ge.get_output(i) for i in range(ge.num_outputs)]


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("name", [n for n in GPU_MODELS if n != "lstm"])
def test_model_on_gpu_matches_onnxruntime(gpu_built, name, api):
    _require(api)
    folder = gpu_built.folder(name, api)
    model, feeds, ref = gpu_built.model(name)
    deploy = json.loads(open(folder + "/deploy.json", encoding="utf-8").read())
    assert deploy["target"]["gpu"] == api
    cpu = {}
    for node in deploy["nodes"]:
        assert node["device"] in ("gpu", "cpu")
        if node["device"] == "cpu":
            cpu[node.get("ops") or node.get("numpy")] = cpu.get(node.get("ops") or node.get("numpy"), 0) + 1
    assert cpu == ON_CPU.get(name, {})
    with GraphExecutor.from_folder(folder) as ge:
        assert ge.module.gpu is not None and ge.module.gpu.device.name == api
        compare_model(_run(ge, feeds), ref)
        # a model wholly on the GPU copies its inputs in and its outputs out, nothing else
        # (compared by storage: a kernel may read an input through a reshape, a view of the same bytes)
        copies = ge.planned_copies()
        entries = ge.graph["entries"]
        storage = {e["name"]: e["storage"] for e in entries}
        if not cpu:
            assert ({storage[c[1]] for n in copies["nodes"] for c in n["copies"]}
                    == {entries[i]["storage"] for i in ge.graph["inputs"]})
            assert all(c[0] == "upload" for n in copies["nodes"] for c in n["copies"])
        assert ({storage[c[1]] for c in copies["after_run"]} == {entries[i]["storage"] for i in ge.graph["outputs"]})
        assert all(c[0] == "download" for c in copies["after_run"])


@pytest.mark.parametrize("api", list(APIS))
def test_lstm_on_the_host_between_gpu_kernels(gpu_built, api):
    """The LSTM's input projection runs on the GPU, its recurrent kernel on the host's CPU: the projection is
    downloaded before it, and its result is the output (downloaded after the run, no device copy). A second run
    with other inputs gives onnxruntime's answer for those (inputs are uploaded on every run)."""
    _require(api)
    folder = gpu_built.folder("lstm", api)
    model, feeds, ref = gpu_built.model("lstm")
    with GraphExecutor.from_folder(folder) as ge:
        compare_model(_run(ge, feeds), ref)
        copies = ge.planned_copies()
        by_device = {n["device"]: n["copies"] for n in copies["nodes"]}
        assert [c[0] for c in by_device["gpu"]] == ["upload"]            # the input, into the projection
        assert [c[0] for c in by_device["cpu"]] == ["download"]          # the projection, into the recurrence
        assert copies["after_run"] == []                                  # the output was written on the host
        other = {k: np.random.default_rng(5).standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
        compare_model(_run(ge, other), ort_reference(model, other, threads=1))


def test_crnn_over_a_session(gpu_built):
    """The device server's path (tether.graph.* built-ins, here in a LocalSession): the same executor."""
    _require("opencl")
    from tether.rpc.local import LocalSession

    folder = gpu_built.folder("crnn_recognizer", "opencl")
    _, feeds, ref = gpu_built.model("crnn_recognizer")
    with LocalSession() as s:
        ge = s.graph_executor(folder)
        try:
            ge.set_input(**feeds)
            ge.run()
            compare_model([ge.get_output(i) for i in range(ge.get_num_outputs())], ref)
        finally:
            ge.close()


def test_gpu_plan_places_nodes_and_keeps_plain_layouts():
    """The kernel plan of a GPU target: no CPU GEMM panels, no concat views; loop-IR ops on the host's CPU with
    the reason; te ops with a GPU strategy registered per kind (a second one is refused)."""
    model, _ = MODELS["crnn_recognizer"]()
    graph, params = from_onnx(model)
    plan = plan_kernels(graph, params, "opencl")
    assert plan.panel_weights == {} and plan.kind == "opencl"
    cpu = [t for t in plan.tasks if t.device == "cpu"]
    assert [t.name for t in cpu] == ["recurrent"] and "has no opencl strategy" in cpu[0].cpu_reason
    assert all(t.device == "gpu" for t in plan.tasks if t not in cpu)
    host_plan = plan_kernels(graph, params, "host")
    assert all(t.device == "cpu" and not t.cpu_reason for t in host_plan.tasks)
    for kind in ("opencl", "vulkan", "cuda"):
        assert isinstance(OPS.strategy("conv2d", kind), TeLowering)
        assert isinstance(OPS.strategy("softmax", kind), TeLowering) and OPS.strategy("recurrent", kind) is None
    with pytest.raises(ValueError, match="second opencl strategy"):
        OPS.add_strategy("opencl", "conv2d", OPS.strategy("conv2d", "opencl"))


def test_compile_check_names_the_nodes_on_the_cpu(tmp_path):
    from tether.cli.main import cli

    model, _ = MODELS["crnn_recognizer"]()
    onnx.save(model, str(tmp_path / "crnn.onnx"))
    result = CliRunner().invoke(cli, ["compile", str(tmp_path / "crnn.onnx"), "--check", "-t", "vulkan"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "placement on vulkan: 18 node(s) on the GPU, 2 on the host's CPU" in lines
    cpu = [line for line in lines if line.startswith("cpu  ")]
    assert len(cpu) == 2 and all("(recurrent): op recurrent has no vulkan strategy" in line for line in cpu)
    host = CliRunner().invoke(cli, ["compile", str(tmp_path / "crnn.onnx"), "--check"])
    assert host.exit_code == 0 and "placement" not in host.output


def test_benchmark_and_profile_of_a_gpu_model(gpu_built):
    """benchmark and profile wait for the kernels (a GPU node only queues them); every node is timed."""
    _require("opencl")
    folder = gpu_built.folder("lstm", "opencl")
    _, feeds, ref = gpu_built.model("lstm")
    with GraphExecutor.from_folder(folder) as ge:
        ge.set_input(**feeds)
        res = ge.benchmark(number=2, repeat=2)
        assert len(res["samples"]) == 2 and res["min_ms"] > 0
        prof = ge.profile(number=2)
        assert [r["func"] for r in prof["nodes"]] == [n["func"] for n in ge.graph["nodes"]]
        assert all(r["seconds"] > 0 for r in prof["nodes"])
        compare_model([ge.get_output(i) for i in range(ge.num_outputs)], ref)


def test_crnn_for_cuda_builds_ptx_and_its_lstms_for_the_host(tmp_path):
    """A CUDA model (no NVIDIA GPU here): the device code is PTX, the LSTMs are the host library's functions; on a
    machine without CUDA, loading the model is refused in one line naming CUDA."""
    from tether_rpc.gpu.api import GpuUnavailable
    from tether_rpc.gpu.module import available_apis

    model, _ = MODELS["crnn_recognizer"]()
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target="cuda -arch=sm_80")
    lib = factory.lib
    assert lib.device["format"] == "ptx" and lib.device["api"] == "cuda"
    host_funcs = [f["name"] for f in lib.metadata["functions"]]
    assert len(host_funcs) == 1 and host_funcs[0].endswith("_recurrent")     # (one task: both LSTMs are alike)
    assert ".target sm_80" in lib.get_source("device")
    assert [n["func"] for n in factory.graph_json["nodes"] if n["device"] == "cpu"] == host_funcs * 2
    factory.export(str(tmp_path))
    if isinstance(available_apis()["cuda"], str):
        with pytest.raises(GpuUnavailable) as info:
            GraphExecutor.from_folder(str(tmp_path))
        assert "runs on CUDA" in str(info.value) and "\n" not in str(info.value)


def test_aot_refuses_gpu_targets_in_one_line():
    model, _ = CASES["lstm"]()
    graph, params = from_onnx(model)
    with pytest.raises(ValueError) as info:
        tether.build_graph(graph, params, target="vulkan", executor="aot")
    assert "GPU target vulkan" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("api", list(APIS))
def test_int8_mobilenet_v2_between_gpu_and_host(int8_model, tmp_path, api):
    """The QDQ int8 mobilenet_v2 (64x64): its int8 convs and requantizations run on the GPU, its channels-last
    depthwise convs and quantized adds (no GPU strategy yet) on the host's CPU, so values cross between the two at
    every block; within one output quantization step of onnxruntime, on three inputs."""
    from fixtures.int8_models import assert_within_one_step, output_step

    _require(api)
    path = int8_model("mobilenet_v2", "qdq", 64)
    model = onnx.load(path)
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target=api)
    devices = [n["device"] for n in factory.graph_json["nodes"]]
    assert devices.count("gpu") > 0 and devices.count("cpu") > 0
    factory.export(str(tmp_path))
    rng = np.random.default_rng(7)
    with GraphExecutor.from_folder(str(tmp_path)) as ge:
        crossings = ge.planned_copies()["nodes"]
        assert any(n["device"] == "cpu" for n in crossings) and any(n["device"] == "gpu" for n in crossings)
        for _ in range(3):
            x = rng.random((1, 3, 64, 64), dtype=np.float32)
            ge.run(input=x)
            assert_within_one_step(ge.get_output(0), ort_reference(model, {"input": x}, threads=1)[0],
                                   output_step(model))


def test_copy_plan_follows_where_each_value_lives():
    """plan_copies on a hand-written graph: input 0 and param 1 in storages 0 and 1; GPU node a writes entry 2
    (storage 2), host node b reads it (download) and writes 3 (storage 3), GPU node c reads 3 (upload) and 1 (a
    param: already there) and writes 4 (storage 2 again), a host numpy node reads 4 through entry 5, an alias of
    it (one download), then a GPU node guarded by flag 6, which a GPU node wrote (downloaded for the guard, not
    uploaded back); the output 7 written on the GPU comes down after the run, nothing else."""
    from tether_rpc.gpu.graph_memory import plan_copies

    storage_of = [0, 1, 2, 3, 2, 2, 4, 5, 6]
    nodes = [{"name": "a", "func": "fa", "args": [0, 2]},
             {"name": "b", "func": "fb", "args": [2, 3]},
             {"name": "c", "func": "fc", "args": [3, 1, 4]},
             {"name": "d", "numpy": "shape", "inputs": [5], "outputs": [8]},
             {"name": "f", "func": "ff", "args": [0, 6]},
             {"name": "g", "func": "fg", "args": [6, 7], "when": [[6, True]]}]
    before, after = plan_copies(nodes, [True, False, True, False, True, True], storage_of, inputs=[0], params=[1],
                                outputs=[7])
    assert before == [[("upload", 0)], [("download", 2)], [("upload", 3)], [("download", 5)], [],
                      [("download", 6)]]
    assert after == [("download", 7)]
    # a flag a host node wrote, read by a GPU kernel as data too: uploaded for the kernel, on the host for the guard
    flagged = [{"name": "h", "numpy": "shape", "inputs": [0], "outputs": [6]},
               {"name": "g", "func": "fg", "args": [6, 7], "when": [[6, False]]}]
    before, after = plan_copies(flagged, [False, True], storage_of, inputs=[0], params=[], outputs=[7])
    assert before == [[], [("upload", 6)]] and after == [("download", 7)]
    # a recurrent kernel writes its last num_outputs arguments: both are on the host afterwards
    rec = [{"name": "r", "func": "fr", "args": [0, 2, 3], "num_outputs": 2},
           {"name": "s", "func": "fs", "args": [2, 3, 7]}]
    before, after = plan_copies(rec, [False, True], storage_of, inputs=[0], params=[], outputs=[7])
    assert before == [[], [("upload", 2), ("upload", 3)]] and after == [("download", 7)]


@pytest.mark.parametrize("api", list(APIS))
def test_float16_model_kernels_needing_fp16_run_on_the_host(tmp_path, api):
    """A float16 model on a target that does not promise fp16: the SPIR-V of its casts would need it, so on Vulkan
    they run on the host (the reason names fp16); OpenCL C reads and writes halves without it: all on the GPU."""
    from wasm_cases import compare_case

    _require(api)
    model, feeds = CASES["float16_chain"]()
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target=api)
    cpu = [n["ops"] for n in factory.graph_json["nodes"] if n["device"] == "cpu"]
    assert cpu == ([] if api == "opencl" else ["cast", "cast"])
    if api == "vulkan":
        from tether.graph.gpu_graph import placement_report

        why = [r["why"] for r in placement_report(plan_kernels(graph, params, api)) if r["device"] == "cpu"]
        assert len(why) == 2 and all("needs fp16" in w and "-fp16=1" in w for w in why)
    factory.export(str(tmp_path))
    with GraphExecutor.from_folder(str(tmp_path)) as ge:
        compare_case("float16_chain", _run(ge, feeds), ort_reference(model, feeds, threads=1))


@pytest.mark.parametrize("api", list(APIS))
def test_device_array_inputs_are_copied_on_the_device(gpu_built, api, monkeypatch):
    """Inputs given as device arrays of the model's own GPU: copied device to device (no upload from the host at
    run time), except those a host node reads (the VAD's LSTM states), which come down too; a later host input
    takes over again; get_input returns the device array's values."""
    _require(api)
    from tether_rpc.gpu.array import DeviceArray

    folder = gpu_built.folder("vad", api)
    model, feeds, ref = gpu_built.model("vad")
    with GraphExecutor.from_folder(folder) as ge:
        device = ge.module.gpu.device
        arrays = {k: DeviceArray(device, v.shape, str(v.dtype)).copyfrom(v) for k, v in feeds.items()}
        mem = ge._device_memory
        inputs = {id(mem.buffers[mem.storage_of[i]]) for i in ge.graph["inputs"] if mem.on_device(i)}
        assert inputs
        uploaded = []                               # the device buffers uploaded into from the host
        real_upload = type(device).upload
        monkeypatch.setattr(type(device), "upload", lambda self, buf, a, offset=0: (uploaded.append(id(buf)),
                                                                                    real_upload(self, buf, a, offset)))
        for k, a in arrays.items():
            ge.set_input(k, a)
        for k, v in feeds.items():
            np.testing.assert_array_equal(ge.get_input(k), v)
        compare_model(_run(ge, {}), ref)
        assert uploaded and not inputs & set(uploaded)     # (the LSTMs' outputs go up; the inputs never)
        uploaded.clear()
        other = {k: np.random.default_rng(6).standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
        compare_model(_run(ge, other), ort_reference(model, other, threads=1))
        assert inputs <= set(uploaded)              # host inputs are uploaded again
        with pytest.raises(ValueError, match="device array is copied as is"):
            name = next(iter(feeds))
            ge.set_input(name, DeviceArray(device, feeds[name].shape, "int32"))
        for a in arrays.values():
            a.free()


def test_session_device_arrays_feed_a_gpu_model(gpu_built):
    """Over a session (the device server's path): remote.array(x, device=...) handles as graph inputs."""
    _require("opencl")
    from tether.rpc.local import LocalSession

    folder = gpu_built.folder("vad", "opencl")
    _, feeds, ref = gpu_built.model("vad")
    with LocalSession() as s:
        ge = s.graph_executor(folder, device="opencl:0")
        try:
            ge.set_input(**{k: s.array(v, device="opencl:0") for k, v in feeds.items()})
            ge.run()
            compare_model([ge.get_output(i) for i in range(ge.get_num_outputs())], ref)
        finally:
            ge.close()


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("name", ["r2plus1d_video", "unet3d"])
def test_volume_model_on_gpu_matches_onnxruntime(name, api, tmp_path):
    """3-D convolutions (a video classifier and a 3-D U-Net, tether.testing.volume_models) wholly on the GPU:
    their depth-tap gathers, the 2-D convs they become and the transposes back."""
    from tether.testing.volume_models import MODELS as VOLUME_MODELS

    _require(api)
    model, feeds = VOLUME_MODELS[name]("test")
    graph, params = from_onnx(model)
    factory = tether.build_graph(graph, params, target=api)
    devices = [n["device"] for n in factory.graph_json["nodes"]]
    assert devices and set(devices) == {"gpu"}, devices
    factory.export(str(tmp_path))
    with GraphExecutor.from_folder(str(tmp_path)) as ge:
        compare_model(_run(ge, feeds), ort_reference(model, feeds, threads=1))
