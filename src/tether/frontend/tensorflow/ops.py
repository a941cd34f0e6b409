"""The table of TensorFlow ops the frontend translates: op name -> converter, filled from each family's module;
an op claimed by two modules is refused."""
from __future__ import annotations

from typing import Dict

from tether.frontend.tensorflow import ops_array, ops_math, ops_nn
from tether.frontend.tensorflow.translate import Converter

CONVERTERS: Dict[str, Converter] = {}


def add_converters(table: Dict[str, Converter]) -> None:
    for op, convert in table.items():
        if op in CONVERTERS:
            raise ValueError("TensorFlow op %r has a converter already" % op)
        CONVERTERS[op] = convert


add_converters(ops_math.CONVERTERS)
add_converters(ops_nn.CONVERTERS)
add_converters(ops_array.CONVERTERS)

# ops that need no converter: graph inputs are bound before translation, control-only ops are pruned
STRUCTURAL = frozenset({"Placeholder", "NoOp"})
