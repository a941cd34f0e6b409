"""Graph node -> te tensors of one kernel, through the ops' te strategies (``tether.kernels``).

``lower_kernel(node, types)`` lowers a whole node (a fused one by walking its body in order), each op with its
``TeLowering`` for the target kind, so conv2d -> add -> relu becomes one te expression tree whose elementwise tail
``ops.schedule`` inlines into the conv's write-back. With ``conv_gemm`` single-image convolutions run as GEMMs
(``graph/conv_gemm.py``).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from tether import ops, te
from tether.errors import UnsupportedOpError
from tether.graph.conv_gemm import conv_as_gemm, conv_index, gemm_plan
from tether.graph.ir import Node, TensorType
from tether.kernels.registry import TeLowering, kernel_shape
from tether.kernels.table import OPS
from tether.ops import common as c


def lower_node(op: str, attrs: dict, inputs: Sequence["te.Tensor"], kind: str = "cpu") -> "te.Tensor":
    strategy = OPS.strategy(op, kind)
    if not isinstance(strategy, TeLowering):
        raise UnsupportedOpError("graph op %r has no lowering to te" % op)
    return strategy.lower(attrs, *inputs)


def lower_kernel(node: Node, types: Dict[str, TensorType], conv_gemm: bool = True,
                 panel_weights: Optional[Dict[str, tuple]] = None, kind: str = "cpu") -> tuple:
    """The kernel of `node`: placeholders for its ``body_params()`` (in order), the te tensor of the body's last
    output, and the kernel's argument shapes (params then output) when they differ from the graph's (None
    otherwise). ``conv_gemm`` allows running single-image convolutions as GEMMs (docs/graph.md);
    ``panel_weights`` comes from conv_gemm.pack_conv_weights; ``kind``: the target kind whose strategies apply."""
    body, params = node.body(), node.body_params()
    plan = gemm_plan(body, params, types, panel_weights) if conv_gemm else None
    env = {}
    placeholders = []
    for k, name in enumerate(params):
        t = types[name]
        shape = plan[name] if plan is not None and name in plan else kernel_shape(t.shape)
        ph = te.placeholder(shape, t.dtype, name="in%d" % k)
        env[name] = ph
        placeholders.append(ph)
    planned = body[conv_index(body)] if plan is not None else None
    for b in body:
        if b is planned:
            wname = b.inputs[1]
            packed_shape = (panel_weights or {}).get(wname)
            env[b.outputs[0]] = conv_as_gemm(b, env[b.inputs[0]], env[wname], packed_shape or types[wname].shape,
                                             packed_shape is not None)
            continue
        if b.op == "reshape":
            env[b.outputs[0]] = ops.reshape(env[b.inputs[0]], kernel_shape(b.attrs["shape"]))
            continue
        env[b.outputs[0]] = lower_node(b.op, b.attrs, [env[i] for i in b.inputs], kind)
    out = env[body[-1].outputs[0]]
    shapes = None
    if plan is not None:
        shapes = [list(c.shape_of(ph)) for ph in placeholders] + [list(c.shape_of(out))]
    return placeholders, out, shapes
