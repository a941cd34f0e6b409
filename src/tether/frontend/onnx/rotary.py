"""RotaryEmbedding (opset 23) as one kernel (``rotary_embedding``), after a gather of the cos/sin rows by
position_ids; dtypes other than float32 convert through the spec's function body."""
from __future__ import annotations

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.functions import expand_node
from tether.frontend.onnx.importer import ConverterTable, emit_reshape

CONVERTERS = ConverterTable(__name__)


def _opt(ins, k):
    return ins[k] if len(ins) > k and ins[k] else None


@CONVERTERS.register("RotaryEmbedding")
def _rotary(im, node, ins, a):
    x, cos, sin, pos = ins[0], ins[1], ins[2], _opt(ins, 3)
    if any(str(im.type(v).dtype) != "float32" for v in (x, cos, sin)):
        expand_node(im, node, ins)
        return
    shape = im.type(x).shape
    if len(shape) == 4:
        b, _, s, head = shape
        x4, seq_axis = x, 2
    elif len(shape) == 3:
        b, s, hidden = shape
        heads = int(a.get("num_heads", 0))
        if heads <= 0 or hidden % heads:
            raise UnsupportedOpError("node %s: RotaryEmbedding of a 3-D input %s needs num_heads dividing %d, got %d"
                                     % (node.name, shape, hidden, heads))
        head = hidden // heads
        x4, seq_axis = emit_reshape(im, x, (b, s, heads, head)), 1
    else:
        raise UnsupportedOpError("node %s: RotaryEmbedding of a rank-%d input" % (node.name, len(shape)))
    rd = int(a.get("rotary_embedding_dim", 0)) or head
    if rd % 2 or rd > head:
        raise UnsupportedOpError("node %s: RotaryEmbedding rotary_embedding_dim=%d with head size %d"
                                 % (node.name, rd, head))
    tables = []
    for t in (cos, sin):
        if pos is not None:
            if im.type(pos).shape != (b, s) or len(im.type(t).shape) != 2:
                raise UnsupportedOpError("node %s: RotaryEmbedding position_ids %s with a cache of shape %s"
                                         % (node.name, im.type(pos).shape, im.type(t).shape))
            t = im.emit("gather", [t, pos], {"axis": 0, "shape": [b, s, im.type(t).shape[1]]})
        if im.type(t).shape != (b, s, rd // 2):
            raise UnsupportedOpError("node %s: RotaryEmbedding cos/sin of shape %s, expected %s"
                                     % (node.name, im.type(t).shape, (b, s, rd // 2)))
        tables.append(t)
    y = im.emit("rotary_embedding", [x4] + tables,
                {"seq_axis": seq_axis, "rotary_dim": rd, "interleaved": int(a.get("interleaved", 0))}, node.name)
    emit_reshape(im, y, shape, node.name + "_out", node.output[0])
