"""The table of TensorFlow ops the frontend translates: op name -> converter, filled from each family's module;
an op claimed by two modules is refused."""
from __future__ import annotations

from typing import Dict

from tether.frontend.tensorflow import loops, ops_array, ops_math, ops_nn
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
add_converters(loops.CONVERTERS)

# ops the translation itself handles: graph inputs are bound before it, control-only ops are pruned, and
# TensorFlow 1's Switch and Merge are followed when their predicate is a constant
STRUCTURAL = frozenset({"Placeholder", "NoOp", "Switch", "Merge"})
