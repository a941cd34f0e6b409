"""ONNX MaxPool's Indices output (the flat index of each window's first maximum; storage_order 0 and 1) against
onnxruntime, with ties, padding, strides and dilations; and its numpy meaning against the kernel's."""
import numpy as np
import pytest
from fixtures.onnx_struct_compare import make_model

from tether.graph import op_info

RNG = np.random.default_rng(17)


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 5, 5), {"kernel_shape": [2, 2]}),
    ((1, 1, 7, 6), {"kernel_shape": [3, 2], "dilations": [2, 1], "storage_order": 1}),
    ((2, 2, 5, 6), {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0], "storage_order": 1}),
    ((1, 2, 9), {"kernel_shape": [3], "strides": [2]}),
])
def test_max_pool_indices(onnx_compare, shape, attrs):
    x = RNG.integers(-3, 3, shape).astype(np.float32)       # ties: the first maximum in scan order wins
    onnx_compare(make_model("MaxPool", {"x": x}, attrs, opset=12, n_outputs=2), {"x": x})


def test_numpy_meaning_is_row_major_first_maximum():
    x = np.array([[[[1, 5, 5], [5, 0, 2]]]], np.float32)
    attrs = {"kernel": [2, 2], "strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "ceil_mode": 0}
    (idx,) = op_info.evaluate("max_pool_indices", attrs, [x])
    assert idx.tolist() == [[[[1, 1]]]]
    (idx,) = op_info.evaluate("max_pool_indices", dict(attrs, storage_order=1), [x])
    assert idx.tolist() == [[[[2, 2]]]]      # element (0, 1) numbered column-major over (H=2, W=3)
