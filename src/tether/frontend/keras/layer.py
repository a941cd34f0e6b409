"""One call of a Keras layer, as its converter sees it, and the table of layer converters.

A converter takes a :class:`Call` (the layer's config, its input values, its weights) and returns the layer's
output values. Converters refuse what they do not implement with :meth:`Call.refuse`, which names the layer's
class, its name and the Keras version, so one error can list every layer a model needs that is missing.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.keras.builder import Builder, Value
from tether.frontend.keras.weights import WeightStore


@dataclasses.dataclass
class Call:
    b: Builder
    class_name: str
    name: str
    config: Dict[str, Any]
    inputs: List[Value]
    kwargs: Dict[str, Any]              # the call's other arguments (use_causal_mask, training...)
    tensor_kwargs: Dict[str, Any]       # tensors passed by keyword (query=, initial_state=[...]): Values
    path: Tuple[str, ...]               # the layer's weights, see weights.py
    store: WeightStore
    version: str
    dispatch: Callable[["Call"], List[Value]]   # converts another layer's call (a wrapper's inner layer)
    operands: List[Any] = dataclasses.field(default_factory=list)   # positional arguments, tensors as Values

    def weights(self, count: Optional[Sequence[int]] = None) -> List[np.ndarray]:
        """The layer's variables in creation order; ``count`` lists the acceptable numbers of them."""
        arrays = self.store.arrays(self.path)
        if count is not None and not arrays and 0 not in count:
            raise InvalidInput("%s: no weights for Keras layer %r; expected %s arrays (the weights do not belong to "
                               "this config, or the file is truncated)" % (self.store.path, "/".join(self.path),
                                                                          " or ".join(str(c) for c in count)))
        if count is not None and len(arrays) not in count:
            raise self.refuse("the file holds %d weight arrays for it, expected %s"
                              % (len(arrays), " or ".join(str(c) for c in count)))
        return arrays

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def refuse(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError("Keras layer %s %r (Keras %s): %s" % (self.class_name, self.name, self.version,
                                                                       what))

    @property
    def x(self) -> Value:
        if not self.inputs:
            raise self.refuse("called without an input tensor")
        return self.inputs[0]

    def hint(self, suffix: str = "") -> str:
        return self.name + suffix

    def with_config(self, class_name: str, config: Dict[str, Any], inputs: List[Value],
                    path: Tuple[str, ...]) -> "Call":
        """The same call for a wrapped layer (TimeDistributed's, Bidirectional's)."""
        return dataclasses.replace(self, class_name=class_name, config=config, inputs=inputs, path=path,
                                   operands=list(inputs),
                                   name=str(config.get("name", self.name)))


Converter = Callable[[Call], List[Value]]


class LayerTable(Dict[str, Converter]):
    """Keras class name -> converter; a class registered twice is an error."""

    def __init__(self, owner: str) -> None:
        super().__init__()
        self.owner = owner

    def register(self, *class_names: str) -> Callable[[Converter], Converter]:
        def deco(fn: Converter) -> Converter:
            for c in class_names:
                if c in self:
                    raise ValueError("%s: Keras layer %r is registered twice" % (self.owner, c))
                self[c] = fn
            return fn
        return deco


def merge_tables(tables: Sequence[LayerTable]) -> Dict[str, Converter]:
    merged: Dict[str, Converter] = {}
    for t in tables:
        for c, fn in t.items():
            if c in merged:
                raise ValueError("Keras layer %r is converted by both %s and another family" % (c, t.owner))
            merged[c] = fn
    return merged


def pair(value: Any, n: int = 2) -> List[int]:
    """A Keras size argument (an int or a tuple) as ``n`` ints."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)] * n
