"""tether_rpc.gpu.cuda without an NVIDIA GPU: a device with no libcuda, or with a library that is not the CUDA
driver, says so in one line (GpuUnavailable), lists no CUDA device and is not broken by the import. Each case runs
in a fresh interpreter, since the module keeps the driver it loaded. Running kernels is
scripts/gpu_cuda_check.py's job on a machine with a GPU (docs/gpu.md "CUDA (PTX)")."""
from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r"""
import json, sys
from tether_rpc.gpu.api import GpuUnavailable
from tether_rpc.gpu.cuda import CudaDevice
from tether_rpc.gpu.devices import open_device
out = {"available": CudaDevice.available()}
for what, make in (("direct", lambda: CudaDevice(0)), ("open_device", lambda: open_device("cuda:0"))):
    try:
        make()
        out[what] = "opened"
    except GpuUnavailable as exc:
        out[what] = str(exc)
print(json.dumps(out))
"""


def probe(library):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "rpc_server"))
    env.pop("TETHER_CUDA_LIBRARY", None)
    if library is not None:
        env["TETHER_CUDA_LIBRARY"] = library
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_missing_library_named_by_the_override(tmp_path):
    missing = str(tmp_path / "libcuda.so.1")
    out = probe(missing)
    assert out["available"] == []
    want = "this device has no CUDA: %s not found (TETHER_CUDA_LIBRARY)" % missing
    assert out["direct"] == want and out["open_device"] == want


def test_no_driver_on_this_machine():
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver (libcuda); scripts/gpu_cuda_check.py checks it")
    out = probe(None)
    assert out == {"available": [], "direct": "this device has no CUDA: libcuda.so.1 not found",
                   "open_device": "this device has no CUDA: libcuda.so.1 not found"}


def test_a_library_that_is_not_the_driver():
    libm = ctypes.util.find_library("m")
    assert libm, "libm not found"
    out = probe(libm)
    assert out["available"] == []
    assert out["direct"].startswith("this device has no usable CUDA: %s lacks cuInit" % libm), out
