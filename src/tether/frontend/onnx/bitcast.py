"""Converter of ONNX BitCast: the same bytes read as another type of the same width. A graph ``bitcast`` is an
alias like reshape: no kernel, the output is a view of the input's storage with its own dtype."""
from __future__ import annotations

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import KERNEL_DTYPES, ONNX_DTYPES, ConverterTable

CONVERTERS = ConverterTable(__name__)


@CONVERTERS.register("BitCast")
def _bitcast(im, node, ins, a):
    src = str(im.type(ins[0]).dtype)
    to = ONNX_DTYPES.get(int(a["to"]))
    if to is None or to not in KERNEL_DTYPES or src not in KERNEL_DTYPES:
        raise UnsupportedOpError("node %s: BitCast from %s to %s (tether implements %s)"
                                 % (node.name, src, to or "ONNX type %d" % int(a["to"]), ", ".join(KERNEL_DTYPES)))
    if np.dtype(to).itemsize != np.dtype(src).itemsize:
        raise UnsupportedOpError("node %s: BitCast from %s to %s changes the element width"
                                 % (node.name, src, to))
    im.emit("bitcast", ins[:1], {"to": to}, node.name, [node.output[0]])
