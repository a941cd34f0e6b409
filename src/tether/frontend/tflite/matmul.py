"""BATCH_MATMUL: a matrix product over the last two axes with broadcast batch axes; ``adj_x``/``adj_y``
transpose an operand's last two axes first (real tensors: the adjoint is the transpose)."""
from __future__ import annotations

from tether.frontend.tflite.table import ConverterTable

CONVERTERS = ConverterTable("tflite matmul")


def _operand(ctx, index: int, adjoint: bool) -> str:
    name = ctx.nhwc(index)
    if not adjoint:
        return name
    rank = ctx.rank(index)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return ctx.emit1("Transpose", [name], perm=perm)


@CONVERTERS.register("BATCH_MATMUL")
def _batch_matmul(ctx, op) -> None:
    a, b = op.inputs[:2]
    x = _operand(ctx, a, bool(op.options.get("adj_x", False)))
    y = _operand(ctx, b, bool(op.options.get("adj_y", False)))
    ctx.set_output(op.outputs[0], ctx.emit1("MatMul", [x, y]))
