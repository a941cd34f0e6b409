"""Depthwise convs whose output width has no divisor near a vector (ops.conv.window_columns: 38 -> 48 computed
columns) cross-compiled for the emulated ARM devices (aarch64 and armv7, qemu-user) and run there, against
numpy: the width rounding is target-independent, so the NEON schedules take it too."""
import numpy as np
import pytest

import tether
from tether import ops
from test_window_channel_pads import _dw_ref
from test_window_wide_rows import _depthwise_inputs

SESSION_TIMEOUT = 120.0


@pytest.mark.parametrize("shape,k,stride,pad", [((1, 4, 12, 38), 5, 1, 2), ((1, 3, 10, 19), 3, 1, 1),
                                                ((1, 2, 20, 76), 5, 2, 2)])
def test_wide_depthwise_on_the_device(emulated_device, tmp_path, shape, k, stride, pad):
    from tether import rpc

    (x, X), (w, W), (bias, B) = _depthwise_inputs(np.random.default_rng(7), shape, k)
    out = ops.relu6(ops.depthwise_conv2d(X, W, stride, pad, bias=B))
    sch = ops.schedule(out, target=emulated_device.preset)
    lib = tether.build(sch, [X, W, B, out], target=emulated_device.preset, name="dw")
    path = tmp_path / "dw.so"
    lib.export_library(str(path))
    with rpc.connect(*emulated_device.address, timeout=SESSION_TIMEOUT) as remote:
        remote.upload(str(path))
        f = remote.load_module(path.name)["dw"]
        dev_out = remote.empty(tuple(int(d) for d in out.shape), "float32")
        f(remote.array(x), remote.array(w), remote.array(bias), dev_out)
        got = dev_out.numpy()
    ref = np.clip(_dw_ref(x, w, stride, pad, 1) + bias[None, :, None, None], 0, 6)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)
