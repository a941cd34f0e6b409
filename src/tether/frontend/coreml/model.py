"""A Core ML model (NeuralNetwork, NeuralNetworkClassifier/Regressor or ML Program) as an ONNX ModelProto.

Inputs keep their Core ML names and shapes. An image input becomes a float32 tensor ``[1, C, H, W]`` of pixel
values (0..255) in the image's channel order (RGB, BGR, or one gray channel), to which the model's preprocessing
(scale and per-channel biases, or a mean image) is applied inside the graph. A classifier's output is its class
probabilities tensor, under the name of the probabilities output; the predicted label is not an output (it is the
argmax of the probabilities over the class labels in the spec).

The translation runs over the whole model before it raises, so the UnsupportedOpError names every layer or
operation not covered: its type, node name and version (the spec version for NeuralNetwork layers, the opset of
the function for ML Program operations).
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from onnx import TensorProto

from tether.errors import UnsupportedOpError
from tether.frontend.coreml import neuralnetwork, recurrent
from tether.frontend.coreml.features import input_feature
from tether.frontend.coreml.onnx_graph import OnnxGraph
from tether.frontend.coreml.spec import CoreMLSource, load

DOMAIN = "CoreML"


def _layer_table() -> Dict[str, neuralnetwork.Converter]:
    """Every NeuralNetwork layer converter, by the layer's oneof name; a layer in two tables is a bug."""
    table: Dict[str, neuralnetwork.Converter] = {}
    for part in (neuralnetwork.LAYERS, recurrent.LAYERS):
        for name, convert in part.items():
            if name in table:
                raise ValueError("Core ML layer %r has two converters" % name)
            table[name] = convert
    return table


LAYERS = _layer_table()
_NN_KINDS = ("neuralNetwork", "neuralNetworkClassifier", "neuralNetworkRegressor")

# FeatureTypes.proto ArrayDataType -> ONNX element type of the input tensor


def _source(model) -> CoreMLSource:
    """A path, a ``Model_pb2.Model``, or a coremltools ``MLModel`` (its spec, and the weights folder an ML
    Program's blob values are read from)."""
    if hasattr(model, "WhichOneof"):
        return load("", spec=model)
    if hasattr(model, "get_spec"):
        weights = getattr(model, "weights_dir", None)
        return load(os.path.dirname(weights) if weights else "", spec=model.get_spec())
    return load(model)


def _kind(src: CoreMLSource) -> str:
    kind = src.spec.WhichOneof("Type")
    if kind not in _NN_KINDS and kind != "mlProgram":
        raise UnsupportedOpError("%s: Core ML model type %r (spec version %d) is not supported; tether reads "
                                 "NeuralNetwork models (plain, classifier, regressor) and ML Programs"
                                 % (src.path or "model", kind, src.spec.specificationVersion))
    return kind


# -- NeuralNetwork ----------------------------------------------------------------------------------------------

def _preprocess(g: OnnxGraph, nn, name: str, x: str, feature) -> str:
    """The NeuralNetwork preprocessing of image input ``name``: channelScale * x + bias per channel, or x minus
    the mean image."""
    for pre in nn.preprocessing:
        if pre.featureName not in ("", name):
            continue
        kind = pre.WhichOneof("preprocessor")
        if kind == "scaler":
            s = pre.scaler
            color = feature.type.imageType.colorSpace if feature.type.WhichOneof("Type") == "imageType" else 20
            bias = {20: [s.redBias, s.greenBias, s.blueBias], 30: [s.blueBias, s.greenBias, s.redBias]}.get(
                color, [s.grayBias])
            y = g.node("Mul", [x, g.scalar(s.channelScale)], name + "_scaled")
            return g.node("Add", [y, g.const(np.asarray(bias, np.float32).reshape(-1, 1, 1), name + "_bias")],
                          name + "_preprocessed")
        if kind == "meanImage":
            c, h, w = g.shape(x)[-3:]
            mean = np.asarray(pre.meanImage.meanImage, np.float32).reshape(c, h, w)
            return g.node("Sub", [x, g.const(mean, name + "_mean")], name + "_preprocessed")
    return x


def _nn_inputs(g: OnnxGraph, ctx: neuralnetwork.Context, spec, nn, shape) -> None:
    rank5 = ctx.rank5        # RANK5_ARRAY_MAPPING, the legacy default
    for feature in spec.description.input:
        kind, elem, dims = input_feature(feature, shape)
        x = g.add_input(feature.name, elem, dims)
        if elem != TensorProto.FLOAT:
            x = g.node("Cast", [x], feature.name + "_float", to=TensorProto.FLOAT)
        if kind == "array" and rank5 and len(dims) == 1:
            # the legacy mapping reads a vector as [C, 1, 1]
            x = g.reshape(x, [dims[0], 1, 1], feature.name + "_chw")
        if kind == "image":
            x = _preprocess(g, nn, feature.name, x, feature)
        ctx.env[feature.name] = x


def _nn_outputs(g: OnnxGraph, ctx: neuralnetwork.Context, spec, kind: str, nn) -> None:
    for feature in spec.description.output:
        name = feature.name
        which = feature.type.WhichOneof("Type")
        if kind == "neuralNetworkClassifier" and which != "dictionaryType" and \
                name == spec.description.predictedFeatureName:
            continue                          # the label: not an output (see the module's doc)
        source = name
        if which == "dictionaryType":         # the classifier's probabilities
            source = nn.labelProbabilityLayerName or (name if name in ctx.env else nn.layers[-1].output[0])
        if source not in ctx.env:
            continue                          # produced by a layer that could not be translated (reported)
        y = ctx.env[source]
        declared = [int(d) for d in feature.type.multiArrayType.shape] if which == "multiArrayType" else []
        have = g.shape(y)
        if declared and have is not None and list(have) != declared and int(np.prod(have)) == int(
                np.prod(declared)):
            y = g.reshape(y, declared, name + "_declared")
        elif which == "dictionaryType" and have is not None and len(have) > 2:
            y = g.reshape(y, [int(np.prod(have))], name + "_flat")
        g.node("Identity", [y], outputs=[name])
        g.add_output(name)


def _translate_nn(src: CoreMLSource, kind: str, shape) -> Tuple[OnnxGraph, List[str]]:
    spec = src.spec
    nn = getattr(spec, kind)
    g = OnnxGraph("coreml")
    g.reserve([f.name for f in spec.description.input] + [f.name for f in spec.description.output])
    ctx = neuralnetwork.Context(g, rank5=nn.arrayInputShapeMapping == 0)
    _nn_inputs(g, ctx, spec, nn, shape)
    errors: List[str] = []
    for i, layer in enumerate(nn.layers):
        ltype = layer.WhichOneof("layer")
        node = layer.name or "#%d" % i
        convert = LAYERS.get(ltype)
        if convert is None:
            errors.append("%s (layer %s, spec version %d)" % (ltype, node, spec.specificationVersion))
            continue
        if any(name not in ctx.env for name in layer.input):
            continue                          # downstream of a layer already reported
        try:
            outs = convert(ctx, layer, getattr(layer, ltype))
        except UnsupportedOpError as exc:
            errors.append("%s (layer %s, spec version %d): %s" % (ltype, node, spec.specificationVersion, exc))
            continue
        for coreml_name, onnx_name in zip(layer.output, outs):
            ctx.env[coreml_name] = onnx_name
    _nn_outputs(g, ctx, spec, kind, nn)
    return g, errors


# -- entry points ---------------------------------------------------------------------------------------------------

def to_onnx(model, shape: Optional[Mapping[str, Sequence[int]]] = None):
    """The Core ML model ``model`` (a path to an ``.mlmodel`` or ``.mlpackage``, a ``Model_pb2.Model``, or a
    coremltools ``MLModel``) as an ONNX ModelProto. ``shape``: input name -> shape, for inputs with flexible shapes."""
    src = _source(model)
    kind = _kind(src)
    if kind == "mlProgram":
        from tether.frontend.coreml import mlprogram

        g, errors = mlprogram.translate(src, shape)
    else:
        g, errors = _translate_nn(src, kind, shape)
    if errors:
        raise UnsupportedOpError("%s: %d Core ML op(s) not supported: %s"
                                 % (src.path or "Core ML model", len(errors), "; ".join(errors)))
    return g.model()


def op_coverage(model) -> List[Dict]:
    """Per layer type (NeuralNetwork) or operation type (ML Program) of ``model``: its version, whether tether
    translates it, and its nodes. Covered means a converter exists; it may still refuse a parameter value."""
    src = _source(model)
    kind = _kind(src)
    rows: Dict[str, Dict] = {}
    if kind == "mlProgram":
        from tether.frontend.coreml import mlprogram

        items = mlprogram.op_list(src)
    else:
        nn = getattr(src.spec, kind)
        version = src.spec.specificationVersion
        items = [(layer.WhichOneof("layer"), layer.name or "#%d" % i, version,
                  layer.WhichOneof("layer") in LAYERS) for i, layer in enumerate(nn.layers)]
    for op, node, version, covered in items:
        row = rows.setdefault(op, {"op_type": op, "domain": DOMAIN, "opset": version, "covered": covered,
                                   "nodes": []})
        row["nodes"].append(node)
    return list(rows.values())
