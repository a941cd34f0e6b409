"""onnxruntime's float activation contrib ops (domain ``com.microsoft``) that its optimizers write into models,
also into quantized ones: QuickGelu, ``x * sigmoid(alpha * x)`` (alpha 1.702 by default),
computed as onnxruntime's kernel orders it: the product with alpha first (skipped at alpha 1), the sigmoid, then
the product with x."""
from __future__ import annotations

import numpy as np

from tether.frontend.onnx.importer import ConverterTable, node_output, require_dtype

CONVERTERS = ConverterTable(__name__)


def _quick_gelu(im, node, ins, a):
    x = ins[0]
    require_dtype(im, node, x, ("float32",))
    alpha = float(a.get("alpha", 1.702))
    z = x if alpha == 1.0 else im.emit("mul", [x, im.add_const(np.array(alpha, np.float32))])
    im.emit("mul", [x, im.emit("sigmoid", [z])], {}, node.name, node_output(node))


CONVERTERS.add("com.microsoft.QuickGelu", _quick_gelu)
