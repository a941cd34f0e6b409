"""The entry points: `from_onnx` (model -> graph, params), `unsupported_ops` and `op_coverage`."""
from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.graph.ir import Graph, TensorType
from tether.frontend.onnx import half, sequence
from tether.frontend.onnx.external_data import initializer_array, load_model
from tether.frontend.onnx.functions import convert_node, has_function_body
from tether.frontend.onnx.importer import (CONVERTERS, KERNEL_DTYPES, ONNX_DTYPES, Importer, converter_key,
                                           onnx_type_name)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- entry point
def _model_opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)


def _covered(node, opset: int) -> bool:
    # no converter but a function body in the spec: the node converts through its body (functions.py)
    return converter_key(node) in CONVERTERS or (
        node.domain in ("", "ai.onnx") and has_function_body(node.op_type, opset))


def unsupported_ops(model) -> Dict[str, List[str]]:
    """Every ONNX op type in `model` with no converter (and no function body to expand), with its nodes' names."""
    missing: Dict[str, List[str]] = {}
    opset = _model_opset(model)
    for i, node in enumerate(model.graph.node):
        if not _covered(node, opset):
            missing.setdefault(node.op_type, []).append(node.name or "#%d" % i)
    return missing


def op_coverage(model) -> List[dict]:
    """Per (domain, op type) of ``model``: its opset, whether a converter covers it, and its nodes' names, in
    order of first use. Covered means there is a converter or a function body in the spec to convert through;
    either may still refuse an attribute value, a dtype or an op inside the body when the model is imported."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    opset = _model_opset(model)
    rows: Dict[Tuple[str, str], dict] = {}
    for i, node in enumerate(model.graph.node):
        domain = node.domain or "ai.onnx"
        key = (domain, node.op_type)
        if key not in rows:
            rows[key] = {"domain": domain, "op_type": node.op_type, "opset": opsets.get(domain),
                         "covered": _covered(node, opset), "nodes": []}
        rows[key]["nodes"].append(node.name or "#%d" % i)
    return list(rows.values())


def _value_info_type(vi) -> Tuple[Tuple[Optional[int], ...], str]:
    tt = vi.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return dims, ONNX_DTYPES.get(tt.elem_type, "elem_type_%d" % tt.elem_type)


def from_onnx(model, shape: Optional[Mapping[str, Sequence[int]]] = None,
              dtype: Optional[Mapping[str, str]] = None,
              constants: Optional[Mapping[str, np.ndarray]] = None,
              base_dir: Optional[str] = None) -> Tuple[Graph, Dict[str, np.ndarray]]:
    """Import an ONNX ModelProto (or a path) as (graph, params).

    ``shape`` fixes input shapes (needed for inputs with symbolic dimensions); ``constants`` binds run-time
    inputs to fixed values (e.g. an int64 shape input), which then fold like initializers. Weights in external
    data files are read from the model's folder when ``model`` is a path, else from ``base_dir``.
    """
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model, base_dir = load_model(model)
    missing = unsupported_ops(model)
    if missing:
        listing = "; ".join("%s (%s)" % (op, ", ".join(names[:8]) + (" ..." if len(names) > 8 else ""))
                            for op, names in sorted(missing.items()))
        raise UnsupportedOpError("the model uses %d unsupported op type(s): %s" % (len(missing), listing))
    im = Importer(_model_opset(model))
    im.reserved = {v for n in model.graph.node for v in list(n.input) + list(n.output)} | \
        {v.name for v in list(model.graph.input) + list(model.graph.output)}
    shape = dict(shape or {})
    dtype = dict(dtype or {})
    constants = dict(constants or {})
    for init in model.graph.initializer:
        im.add_const(initializer_array(init, base_dir), name=init.name)
    inputs: List[str] = []
    runtime = [vi.name for vi in model.graph.input if vi.name not in im.consts and vi.name not in constants]
    unknown = set(shape) - set(runtime)
    if unknown:
        raise ValueError("shape given for %s, which are not run-time inputs of the model (inputs: %s)"
                         % (sorted(unknown), runtime))
    for vi in model.graph.input:
        if vi.name in im.consts:
            continue
        if sequence.is_container_input(vi):     # a sequence or optional: its elements are the tensor inputs
            for name, dims, dt in sequence.bind_graph_input(im, vi, shape.get(vi.name), vi.name in shape):
                if dt not in KERNEL_DTYPES:
                    raise UnsupportedOpError("input %r has element type %s, which tether's kernels do not "
                                             "implement (they take %s)" % (name, dt, ", ".join(KERNEL_DTYPES)))
                im.types[name] = TensorType(dims, dt)
                inputs.append(name)
            continue
        dims, dt = _value_info_type(vi)
        dt = dtype.get(vi.name, dt)
        if vi.name in constants:
            im.add_const(np.asarray(constants[vi.name], dtype=dt), name=vi.name)
            continue
        if vi.name in shape:
            dims = tuple(int(d) for d in shape[vi.name])
        if any(d is None for d in dims):
            raise ValueError("input %r has a symbolic shape %s: fix it with from_onnx(..., shape={%r: (...)}) "
                             "(CLI: --input-shape %s:D0,D1,...)" % (vi.name, dims, vi.name, vi.name))
        if dt not in KERNEL_DTYPES:
            raise UnsupportedOpError("input %r has element type %s, which tether's kernels do not implement "
                                     "(they take %s)" % (vi.name, onnx_type_name(vi), ", ".join(KERNEL_DTYPES)))
        im.types[vi.name] = TensorType(dims, dt)
        inputs.append(vi.name)
    declared = half.DeclaredTypes(model)    # ONNX shape inference's value types, computed on the first float16 node
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = "%s_%d" % (node.op_type, i)
        convert_node(im, node, declared)
    outputs = sequence.bind_graph_outputs(im, [o.name for o in model.graph.output])
    graph = Graph(inputs, outputs, im.nodes, im.types, name=model.graph.name or "main")
    used = {i for n in graph.nodes for i in n.inputs} | set(outputs)
    params = {k: v for k, v in im.consts.items() if k in used}
    graph.types = {k: v for k, v in graph.types.items() if k in used or k in inputs
                   or any(k in n.outputs for n in graph.nodes)}
    graph.validate(params)
    log.info("imported %s: %d nodes, %d params", graph.name, len(graph.nodes), len(params))
    return graph, params
