"""A Keras model's config, walked as Keras rebuilds it: a Sequential chains its layers, a Functional model
calls each layer on the tensors its inbound nodes name, a model used as a layer is walked inside the outer one
(its weights under its name), and a layer called several times (shared) converts once per call with the same
weights.

Every layer converts, or is recorded as refused, before anything raises: the one UnsupportedOpError names every
layer the model needs that tether does not convert (class, layer name, Keras version), and a layer fed by a
refused one is skipped. ``coverage`` lists the same by class without converting.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Tuple

from onnx import TensorProto, helper

from tether.errors import InvalidInput, UnsupportedOpError
from tether.frontend.keras import activations, attention, conv, core, norm, operations, recurrent, wrappers
from tether.frontend.keras.archive import KerasFile
from tether.frontend.keras.builder import Builder, Value
from tether.frontend.keras.layer import Call, Converter, merge_tables

FAMILIES = (core, conv, norm, recurrent, attention, wrappers, operations)
LAYERS: Dict[str, Converter] = merge_tables([f.LAYERS for f in FAMILIES])
MODELS = ("Functional", "Sequential", "Model")     # a model used as a layer: walked, not converted
STRUCTURE = MODELS + ("InputLayer",)

DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT, "bfloat16": TensorProto.FLOAT,
          "float64": TensorProto.FLOAT, "int32": TensorProto.INT32, "int64": TensorProto.INT64,
          "uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "bool": TensorProto.BOOL}

Ref = Tuple[str, int, int]      # (layer name, node index, tensor index): Keras' keras_history
FAILED = None                   # the value of a tensor whose layer was refused


def _layer_name(layer: Dict[str, Any]) -> str:
    return str(layer.get("name") or (layer.get("config") or {}).get("name"))


def _is_tensor(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__"


def _tensor_ref(obj: Dict[str, Any]) -> Tuple[Ref, Optional[Tuple]]:
    cfg = obj.get("config", {})
    hist = cfg.get("keras_history")
    shape = cfg.get("shape")
    return (str(hist[0]), int(hist[1]), int(hist[2])), (tuple(shape) if shape is not None else None)


def _flat_tensors(obj: Any) -> Iterator[Tuple[Ref, Optional[Tuple]]]:
    if _is_tensor(obj):
        yield _tensor_ref(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _flat_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _flat_tensors(item)


def _refs(spec: Any) -> List[Ref]:
    """``input_layers``/``output_layers``: one [name, node, tensor], or a list or dict of them."""
    if not spec:
        return []
    if isinstance(spec, dict):          # a model called on a dict of inputs
        spec = list(spec.values())
    if isinstance(spec[0], str):
        return [(str(spec[0]), int(spec[1]), int(spec[2]))]
    return [(str(s[0]), int(s[1]), int(s[2])) for s in spec]


@dataclasses.dataclass
class NodeCall:
    """One inbound node: the tensors it passes positionally and by keyword, and its other arguments."""

    args: List[Tuple[Ref, Optional[Tuple]]]
    tensor_kwargs: Dict[str, Any]       # name -> (ref, shape) or a list of them
    kwargs: Dict[str, Any]
    raw_args: List[Any] = dataclasses.field(default_factory=list)    # the positional arguments as saved


def parse_node(node: Any) -> NodeCall:
    if isinstance(node, dict):          # Keras 3: {"args": [...], "kwargs": {...}}
        tkw: Dict[str, Any] = {}
        kw: Dict[str, Any] = {}
        for k, v in (node.get("kwargs") or {}).items():
            found = list(_flat_tensors(v))
            if found:
                tkw[k] = found if isinstance(v, (list, tuple)) else found[0]
            elif v is not None:
                kw[k] = v
        raw = list(node.get("args") or [])
        return NodeCall(list(_flat_tensors(raw)), tkw, kw, raw)
    args, kw = [], {}                   # Keras 2: [[name, node, tensor, kwargs], ...]
    for entry in node:
        args.append(((str(entry[0]), int(entry[1]), int(entry[2])), None))
        if len(entry) > 3 and isinstance(entry[3], dict):
            kw.update(entry[3])
    return NodeCall(args, {}, kw, [{"class_name": "__keras_tensor__", "config": {"keras_history": list(r)}}
                                   for r, _ in args])


def input_shape(layer: Dict[str, Any]) -> Optional[List[Optional[int]]]:
    cfg = layer.get("config", {})
    for key in ("batch_shape", "batch_input_shape"):
        if cfg.get(key) is not None:
            return list(cfg[key])
    build = layer.get("build_config") or {}
    return list(build["input_shape"]) if build.get("input_shape") is not None else None


def layer_key(layer: Dict[str, Any]) -> str:
    """The converter table's key of a saved layer: its class, or ``ops.<class>`` for a keras.ops operation
    (``x + 3.0`` on a Keras tensor saves an ``Add`` of module keras.src.ops.numpy, not the Add layer)."""
    cls = str(layer.get("class_name"))
    module = layer.get("module")
    if module is not None:
        return "ops." + cls if str(module).startswith("keras.src.ops") else cls
    # the legacy .h5 config drops the module: an operation's config has no "trainable" (nor have a few layers')
    config = layer.get("config") or {}
    if cls in STRUCTURE or "trainable" in config or "ops." + cls not in LAYERS:
        return cls
    return "ops." + cls


def unsupported(cls: str, name: str, version: str) -> str:
    return "Keras layer %s %r (Keras %s): not a layer tether converts" % (cls, name, version)


class Translator:
    def __init__(self, kf: KerasFile) -> None:
        self.kf = kf
        self.b = Builder(str(kf.config.get("config", {}).get("name") or "keras"))
        self.refused: List[str] = []

    def refuse(self, message: str) -> None:
        if message not in self.refused:
            self.refused.append(message)

    # ---- graph inputs and outputs
    def graph_input(self, layer: Dict[str, Any]) -> Value:
        shape = input_shape(layer)
        name = _layer_name(layer)
        if shape is None:
            raise InvalidInput("%s: input %r of the Keras model has no recorded shape; expected a built model"
                               % (self.kf.path, name))
        dtype = str((layer.get("config") or {}).get("dtype") or "float32")
        dtype = dtype if dtype in DTYPES else "float32"
        onnx_name = self.b.add_input(name, shape, DTYPES[dtype])
        return Value(onnx_name, len(shape), False, tuple(shape))

    def translate(self):
        top = self.kf.config
        if top.get("class_name") not in MODELS:
            raise InvalidInput("%s holds a Keras %s, not a Sequential or Functional model; expected one of those "
                               "(a subclassed model's call is Python code, which the file does not hold)"
                               % (self.kf.path, top.get("class_name")))
        for layer in walk(top):          # named even when a refused layer upstream keeps it from being called
            cls = layer_key(layer)
            if cls not in LAYERS and cls not in STRUCTURE:
                self.refuse(unsupported(cls, _layer_name(layer), self.kf.version))
        outputs = self.model(top, (), None)
        out_names = [ref[0] for ref in _refs((top.get("config") or {}).get("output_layers"))]
        if self.refused:
            raise UnsupportedOpError("%s: %d Keras layer call(s) tether does not convert: %s"
                                     % (self.kf.path, len(self.refused), "; ".join(self.refused)))
        for k, v in enumerate(outputs):       # each output named after the Keras layer that computes it
            name = out_names[k] if k < len(out_names) else "output_%d" % k
            self.b.nodes.append(helper.make_node("Identity", [self.b.keras_order(v)], [self.b.fresh(name)],
                                                 name=self.b.fresh(name + "/output")))
            self.b.add_output(self.b.nodes[-1].output[0])
        return self.b.model(self.kf.version)

    # ---- models
    def model(self, cfg: Dict[str, Any], path: Tuple[str, ...], inputs: Optional[List[Value]]) -> List[Value]:
        layers = (cfg.get("config") or {}).get("layers") or []
        if cfg.get("class_name") == "Sequential":
            return self.sequential(cfg, layers, path, inputs)
        return self.functional(cfg, layers, path, inputs)

    def sequential(self, cfg, layers, path, inputs) -> List[Value]:
        if inputs is None:
            first = layers[0] if layers else {}
            if first.get("class_name") != "InputLayer":
                shape = input_shape(first) or (cfg.get("config") or {}).get("build_input_shape")
                first = {"class_name": "InputLayer", "config": {"name": "input", "batch_shape": shape}}
            inputs = [self.graph_input(first)]
        values: List[Optional[Value]] = list(inputs)
        for layer in layers:
            if layer.get("class_name") == "InputLayer":
                continue
            if values and values[0] is FAILED:
                return [FAILED]
            values = self.call(layer, path, NodeCall([], {}, {}), list(values[:1]))
        return values

    def functional(self, cfg, layers, path, inputs) -> List[Value]:
        c = cfg.get("config") or {}
        by_name = {_layer_name(la): la for la in layers}
        # Keras 2 numbers a nested model's calls from 1 everywhere (its node 0 is its own graph); Keras 3 does so
        # only for a Functional model in output_layers, and numbers the calls in inbound nodes from 0
        legacy = any(isinstance(n, list) for la in layers for n in la.get("inbound_nodes") or [])

        def key(ref: Ref, listed: bool) -> Ref:
            cls = by_name.get(ref[0], {}).get("class_name")
            shifted = cls in MODELS if legacy else (listed and cls in ("Functional", "Model"))
            return (ref[0], ref[1] - 1, ref[2]) if shifted else ref

        values: Dict[Ref, Optional[Value]] = {}
        in_refs = [key(r, True) for r in _refs(c.get("input_layers"))]
        if inputs is not None and len(inputs) != len(in_refs):
            raise InvalidInput("%s: model %r is called on %d tensors but has %d inputs"
                               % (self.kf.path, "/".join(path), len(inputs), len(in_refs)))
        for k, ref in enumerate(in_refs):
            values[ref] = self.graph_input(by_name.get(ref[0], {})) if inputs is None else inputs[k]
        pending = []
        for layer in layers:
            if layer.get("class_name") == "InputLayer":
                continue
            for k, node in enumerate(layer.get("inbound_nodes") or []):
                call = parse_node(node)
                call.args = [(key(r, False), s) for r, s in call.args]
                pending.append((layer, k, call))
        for _ in range(len(pending) + 1):       # config order is nearly always topological: one pass
            waiting = []
            for layer, index, node in pending:
                needed = [r for r, _ in node.args] + [r for r, _ in self._kw_refs(node)]
                if not all(r in values for r in needed):
                    waiting.append((layer, index, node))
                    continue
                if any(values[r] is FAILED for r in needed):
                    outs: List[Optional[Value]] = [FAILED]
                else:
                    args = [self._with_shape(values[r], s) for r, s in node.args]
                    outs = self.call(layer, path, node, args, values)
                for t, v in enumerate(outs):
                    values[(_layer_name(layer), index, t)] = v
            if len(waiting) == len(pending):
                break
            pending = waiting
        result = []
        for ref in _refs(c.get("output_layers")):
            ref = key(ref, True)
            if ref not in values:
                if self.refused:            # not computed because a layer was refused: reported already
                    result.append(FAILED)
                    continue
                raise InvalidInput("%s: the Keras model's output %s is not computed by its layers; expected a "
                                   "consistent model config" % (self.kf.path, list(ref)))
            result.append(values[ref])
        return result

    @staticmethod
    def _kw_refs(node: NodeCall) -> List[Tuple[Ref, Optional[Tuple]]]:
        out = []
        for v in node.tensor_kwargs.values():
            out += v if isinstance(v, list) else [v]
        return out

    @staticmethod
    def _with_shape(v: Optional[Value], shape: Optional[Tuple]) -> Optional[Value]:
        if v is FAILED or shape is None or v.shape is not None or len(shape) != v.rank:
            return v
        return dataclasses.replace(v, shape=shape)

    # ---- one call of one layer
    def call(self, layer: Dict[str, Any], path: Tuple[str, ...], node: NodeCall, args: List[Value],
             values: Optional[Dict[Ref, Optional[Value]]] = None) -> List[Optional[Value]]:
        cls = layer_key(layer)
        name = _layer_name(layer)
        if cls in MODELS:
            return self.model(layer, path + (name,), args)
        tkw: Dict[str, Any] = {}
        for k, v in node.tensor_kwargs.items():
            if isinstance(v, list):
                tkw[k] = [self._with_shape(values[r], s) for r, s in v] if values is not None else []
            else:
                tkw[k] = self._with_shape(values[v[0]], v[1]) if values is not None else None
        flat = iter(args)

        def operand(obj: Any) -> Any:       # the saved arguments with each tensor replaced by its value, in order
            if _is_tensor(obj):
                return next(flat)
            if isinstance(obj, (list, tuple)):
                return [operand(o) for o in obj]
            return obj

        operands = [operand(a) for a in node.raw_args] if len(list(_flat_tensors(node.raw_args))) == len(args) \
            else list(args)
        c = Call(self.b, layer_key(layer), name, layer.get("config") or {}, args, dict(node.kwargs), tkw,
                 path + (name,), self.kf.weights, self.kf.version, self.dispatch, operands)
        try:
            return self.dispatch(c)
        except UnsupportedOpError as exc:
            msg = str(exc)
            self.refuse(msg if msg.startswith("Keras layer") else str(c.refuse(msg)))
            return [FAILED]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidInput):
                raise
            self.refuse(str(c.refuse("its config or weights do not fit (%s: %s)" % (type(exc).__name__, exc))))
            return [FAILED]

    def dispatch(self, c: Call) -> List[Value]:
        if c.class_name in MODELS:          # a wrapper's model (TimeDistributed): walked, weights under the wrapper
            return self.model({"class_name": c.class_name, "config": c.config}, c.path, c.inputs)
        if c.class_name not in LAYERS:
            raise UnsupportedOpError(unsupported(c.class_name, c.name, c.version))
        return LAYERS[c.class_name](c)


def to_onnx(kf: KerasFile):
    """The Keras model as an ONNX ModelProto (opset 17, batch size 1 where the file leaves it open)."""
    return Translator(kf).translate()


def walk(cfg: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """Every layer config in a model config, nested models' and wrappers' layers included."""
    for layer in (cfg.get("config") or {}).get("layers") or []:
        yield layer
        inner = layer
        while isinstance((inner.get("config") or {}).get("layer"), dict):     # TimeDistributed, Bidirectional
            inner = inner["config"]["layer"]
            yield inner
        if inner.get("class_name") in MODELS:
            yield from walk(inner)


def coverage(kf: KerasFile) -> List[Dict[str, Any]]:
    """One row per layer class (and per activation tether lacks): whether a converter covers it."""
    rows: Dict[str, Dict[str, Any]] = {}
    for layer in walk(kf.config):
        cls = layer_key(layer)
        entries = [(cls, cls in LAYERS or cls in STRUCTURE)]
        for key in ("activation", "recurrent_activation"):
            spec = (layer.get("config") or {}).get(key)
            if spec is not None and not activations.is_covered(spec):
                entries.append(("activation %s" % activations.activation_name(spec), False))
        for op, covered in entries:
            row = rows.setdefault(op, {"op_type": op, "domain": "Keras", "opset": kf.version,
                                       "covered": covered, "nodes": []})
            row["nodes"].append(_layer_name(layer))
    return list(rows.values())
