"""A Keras model's weights by layer: ``arrays(path)`` is the list of one layer's variables, in the order the
layer creates them (trainable first), as float32 arrays. ``path`` is the layer's name, preceded by the names of
the models it is nested in.

The ``.keras`` weights file keeps each layer's own variables under ``layers/<key>/vars/<i>`` and its sublayers
(an RNN's cell, a wrapper's layer, attention's projections) under the attribute that holds them; the key is the
snake-cased class name made unique in the container's order, and Keras 3 also writes the layer's name as an
attribute of ``vars``. The legacy ``.h5`` file keeps them under ``model_weights/<layer name>``, listed in order
by the group's ``weight_names`` attribute; a nested model's group lists its inner layers' weights, each under
the inner layer's name.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import InvalidInput

Path = Tuple[str, ...]

# a layer's sublayers in the order the layer creates its variables (the file's groups are sorted by name)
SUBLAYER_ORDER = ("cell", "forward_layer", "backward_layer", "query_dense", "key_dense", "value_dense",
                  "output_dense", "layer")


def snake_case(name: str) -> str:
    """Keras' name for a class in a weights file: ``PReLU`` -> ``p_re_lu``, ``Conv2D`` -> ``conv2d``."""
    name = re.sub(r"\W+", "", name)
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def _float32(path: str, where: str, dataset: Any) -> np.ndarray:
    try:
        array = np.asarray(dataset[()])
    except (OSError, KeyError, TypeError) as exc:
        raise InvalidInput("%s: weight %s cannot be read (%s); the file is truncated or corrupt"
                           % (path, where, exc)) from None
    return array.astype(np.float32) if array.dtype.kind == "f" else array


class WeightStore:
    path: str

    def arrays(self, layer: Path) -> List[np.ndarray]:
        raise NotImplementedError


def _layers_of(config: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    layers = config.get("config", {}).get("layers") if isinstance(config.get("config"), dict) else None
    return layers if isinstance(layers, list) else None


def _name_of(layer: Dict[str, Any]) -> str:
    return str(layer.get("name") or layer.get("config", {}).get("name"))


class ZipWeights(WeightStore):
    """The ``model.weights.h5`` of a ``.keras`` zip."""

    def __init__(self, path: str, h5: Any, config: Dict[str, Any]) -> None:
        self.path = path
        self.groups: Dict[Path, Any] = {}
        self._index(h5, config, ())

    def _index(self, group: Any, config: Dict[str, Any], prefix: Path) -> None:
        layers = _layers_of(config)
        if layers is None or "layers" not in group:
            return
        by_key: Dict[str, Dict[str, Any]] = {}
        used: Dict[str, int] = {}
        for layer in layers:
            key = snake_case(str(layer.get("class_name", "")))
            if key in used:
                used[key] += 1
                key = "%s_%d" % (key, used[key])
            else:
                used[key] = 0
            by_key[key] = layer
        by_name = {_name_of(la): la for la in layers}
        for key in group["layers"]:
            child = group["layers"][key]
            name = child["vars"].attrs.get("name") if "vars" in child else None
            name = name.decode() if isinstance(name, bytes) else name
            layer = by_name.get(name) if name else by_key.get(key)
            if layer is None:
                continue
            self.groups[prefix + (_name_of(layer),)] = child
            self._index(child, layer, prefix + (_name_of(layer),))
            wrapped = (layer.get("config") or {}).get("layer")
            if "layer" in child and isinstance(wrapped, dict):     # a wrapper's model: its layers under "layer"
                self._index(child["layer"], wrapped, prefix + (_name_of(layer),))

    def arrays(self, layer: Path) -> List[np.ndarray]:
        group = self.groups.get(tuple(layer))
        if group is None:
            return []
        out: List[np.ndarray] = []
        self._flatten(group, "/".join(layer), out)
        return out

    def _flatten(self, group: Any, where: str, out: List[np.ndarray]) -> None:
        if "vars" in group:
            own = group["vars"]
            for k in sorted(own, key=lambda s: int(s) if s.isdigit() else 1 << 30):
                out.append(_float32(self.path, "%s/%s" % (where, k), own[k]))
        children = [k for k in group if k not in ("vars", "layers")]
        order = {k: i for i, k in enumerate(SUBLAYER_ORDER)}
        for k in sorted(children, key=lambda s: (order.get(s, len(order)), s)):
            if hasattr(group[k], "keys"):
                self._flatten(group[k], "%s/%s" % (where, k), out)


class H5Weights(WeightStore):
    """The ``model_weights`` group of a legacy ``.h5`` model."""

    def __init__(self, path: str, group: Any) -> None:
        self.path = path
        self.group = group

    def arrays(self, layer: Path) -> List[np.ndarray]:
        if not layer or layer[0] not in self.group:
            return []
        g = self.group[layer[0]]
        names: Sequence[Any] = list(g.attrs.get("weight_names", []))
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        if len(layer) > 1:          # an inner layer of a nested model: the weights created under its name
            names = [n for n in names if layer[-1] in n.split("/")[:-1]]
        out = []
        for n in names:
            if n not in g:
                raise InvalidInput("%s: weight %s/%s listed but missing; the file is truncated or corrupt"
                                   % (self.path, layer[0], n))
            out.append(_float32(self.path, "%s/%s" % (layer[0], n), g[n]))
        return out
