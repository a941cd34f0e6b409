"""ONNX LSTM, GRU and RNN (opsets 7..22): the input projection of all time steps and directions as one GEMM
(``dense`` + the additive biases), then one ``recurrent`` op (kernels/recurrent_op.py) whose kernel loops over time.

Every attribute of the spec is implemented: direction (forward, reverse, bidirectional), ``sequence_lens``,
``initial_h``/``initial_c``, peepholes ``P``, ``clip``, ``activations`` with ``activation_alpha``/``_beta``,
``input_forget`` (LSTM), ``linear_before_reset`` (GRU), ``layout`` 0 and 1, any output omitted. W, R and B may
be run-time tensors (the ONNX node cases feed them as inputs); constants fold at import.

Activation parameters are consumed as onnxruntime does: in order, only by the functions that take them. Where a
function's missing parameter has no default both the spec and onnxruntime agree on (Affine, ScaledTanh,
ThresholdedRelu), the node is refused rather than computed with a guess.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, Importer, emit_reshape, require_dtype, str_attr
from tether.kernels.recurrent_op import ACTIVATION_COUNT, GATES, NP_ACTIVATIONS

CONVERTERS = ConverterTable(__name__)

DEFAULT_ACTS = {"lstm": ["sigmoid", "tanh", "tanh"], "gru": ["sigmoid", "tanh"], "rnn": ["tanh"]}
# name -> (takes alpha, takes beta, default alpha, default beta); None: no agreed default, must be given
ACT_PARAMS = {
    "relu": (False, False, None, None), "tanh": (False, False, None, None), "sigmoid": (False, False, None, None),
    "affine": (True, True, None, None), "leakyrelu": (True, False, 0.01, None),
    "thresholdedrelu": (True, False, None, None), "scaledtanh": (True, True, None, None),
    "hardsigmoid": (True, True, 0.2, 0.5), "elu": (True, False, 1.0, None),
    "softsign": (False, False, None, None), "softplus": (False, False, None, None),
}
DIRECTIONS = {"forward": ["forward"], "reverse": ["reverse"], "bidirectional": ["forward", "reverse"]}


def optional_input(ins: List[str], k: int) -> Optional[str]:
    """Input ``k`` of a node, or None when it is absent or empty."""
    return ins[k] if len(ins) > k and ins[k] else None


def activation_functions(node, cell: str, a: dict, ndir: int) -> List[list]:
    """The activations of a recurrent node's directions from its ``activations``/``activation_alpha``/``_beta``
    attributes (the spec's defaults when absent), checked against the cell kind."""
    names = [n.decode() if isinstance(n, bytes) else n for n in a.get("activations", [])]
    count = ACTIVATION_COUNT[cell]
    if not names:
        names = DEFAULT_ACTS[cell] * ndir
    if len(names) != count * ndir:
        raise UnsupportedOpError("node %s: %s lists %d activations; %d directions take %d"
                                 % (node.name, node.op_type, len(names), ndir, count * ndir))
    alphas, betas = list(a.get("activation_alpha", [])), list(a.get("activation_beta", []))
    acts = []
    for name in names:
        key = name.lower()
        if key not in ACT_PARAMS or key not in NP_ACTIVATIONS:
            raise UnsupportedOpError("node %s: %s activation %r is not one of the spec's (%s)"
                                     % (node.name, node.op_type, name, ", ".join(sorted(ACT_PARAMS))))
        takes_a, takes_b, da, db = ACT_PARAMS[key]
        vals = []
        for takes, pool, default, what in ((takes_a, alphas, da, "activation_alpha"),
                                           (takes_b, betas, db, "activation_beta")):
            if not takes:
                vals.append(0.0)
            elif pool:
                vals.append(float(pool.pop(0)))
            elif default is not None:
                vals.append(default)
            else:
                raise UnsupportedOpError("node %s: %s activation %s without its %s value (the spec and onnxruntime "
                                         "disagree on the default; give it explicitly)"
                                         % (node.name, node.op_type, name, what))
        acts.append([key] + vals)
    return [acts[d * count:(d + 1) * count] for d in range(ndir)]


def _convert(cell: str):
    def conv(im: Importer, node, ins: List[str], a: dict) -> None:
        if im.opset < 7:
            raise UnsupportedOpError("node %s: %s before opset 7 (model opset %d)" % (node.name, node.op_type,
                                                                                        im.opset))
        x, w, r = ins[0], ins[1], ins[2]
        for v in (x, w, r):
            require_dtype(im, node, v, ("float32",))
        direction = str_attr(a, "direction", "forward")
        if direction not in DIRECTIONS:
            raise UnsupportedOpError("node %s: %s direction %r" % (node.name, node.op_type, direction))
        dirs = DIRECTIONS[direction]
        ndir, g = len(dirs), GATES[cell]
        layout = int(a.get("layout", 0))
        if layout not in (0, 1):
            raise UnsupportedOpError("node %s: %s layout %d" % (node.name, node.op_type, layout))
        wt, rt_ = im.type(w), im.type(r)
        hid = int(a.get("hidden_size", rt_.shape[-1]))
        if wt.shape[0] != ndir or wt.shape[1] != g * hid or rt_.shape != (ndir, g * hid, hid):
            raise UnsupportedOpError("node %s: %s weights W %s / R %s do not fit direction %s and hidden_size %d"
                                     % (node.name, node.op_type, wt, rt_, direction, hid))
        if cell == "lstm" and int(a.get("input_forget", 0)) not in (0, 1):
            raise UnsupportedOpError("node %s: LSTM input_forget %r" % (node.name, a["input_forget"]))
        lbr = int(a.get("linear_before_reset", 0)) if cell == "gru" else 0
        if "output_sequence" in a:
            raise UnsupportedOpError("node %s: %s output_sequence (opset < 7)" % (node.name, node.op_type))
        acts = activation_functions(node, cell, a, ndir)
        if layout == 1:
            x = im.emit("transpose", [x], {"axes": (1, 0, 2)})
        seq, batch, nin = im.type(x).shape
        gh = g * hid

        # the input projection: every step and direction in one GEMM, with the additive biases
        xw = im.emit("dense", [emit_reshape(im, x, (seq * batch, nin)), emit_reshape(im, w, (ndir * gh, nin))])
        bias = optional_input(ins, 3)
        rbh = None
        if bias is not None:
            require_dtype(im, node, bias, ("float32",))
            wb = im.emit("strided_slice", [bias], {"begin": [0, 0], "end": [ndir, gh], "step": [1, 1]})
            rb = im.emit("strided_slice", [bias], {"begin": [0, gh], "end": [ndir, 2 * gh], "step": [1, 1]})
            if lbr:
                keep = np.concatenate([np.ones(2 * hid), np.zeros(hid)]).astype(np.float32)
                rbh = im.emit("strided_slice", [bias], {"begin": [0, gh + 2 * hid], "end": [ndir, 2 * gh],
                                                        "step": [1, 1]})
                rb = im.emit("mul", [rb, im.add_const(keep)])
            total = emit_reshape(im, im.emit("add", [wb, rb]), (ndir * gh,))
        else:
            # a zero bias all the same: the dense kernel with an epilogue takes the local-block schedule, measured
            # 2-4x faster than the epilogue-free one at 40x512x2048 (the CRNN layer of scripts/bench_rnn.py)
            total = im.add_const(np.zeros(ndir * gh, np.float32))
        xw = im.emit("add", [xw, total])
        xw = emit_reshape(im, xw, (seq, batch, ndir * gh))
        rt = im.emit("transpose", [r], {"axes": (0, 2, 1)})

        def state(k: int) -> str:
            v = optional_input(ins, k)
            if v is None:
                return im.add_const(np.zeros((ndir, batch, hid), np.float32))
            require_dtype(im, node, v, ("float32",))
            return im.emit("transpose", [v], {"axes": (1, 0, 2)}) if layout == 1 else v
        inputs = [xw, rt, state(5)]
        attrs = {"cell": cell, "hidden": hid, "directions": dirs, "acts": acts,
                 "clip": float(a["clip"]) if "clip" in a else None,
                 "input_forget": int(a.get("input_forget", 0)) if cell == "lstm" else 0,
                 "linear_before_reset": lbr, "has_peephole": 0, "has_seq_lens": 0}
        if cell == "lstm":
            inputs.append(state(6))
            p = optional_input(ins, 7)
            if p is not None:
                require_dtype(im, node, p, ("float32",))
                inputs.append(p)
                attrs["has_peephole"] = 1
        if rbh is not None:
            inputs.append(rbh)
        lens = optional_input(ins, 4)
        if lens is not None:
            const = im.const(lens)
            if const is not None and np.all(np.asarray(const) == seq):
                pass    # every row runs the whole sequence: no mask
            else:
                require_dtype(im, node, lens, ("int32",))
                if const is not None and (np.any(const < 0) or np.any(const > seq)):
                    raise UnsupportedOpError("node %s: sequence_lens %s outside [0, %d]" % (node.name,
                                                                                             const.tolist(), seq))
                inputs.append(lens)
                attrs["has_seq_lens"] = 1
        n_out = 3 if cell == "lstm" else 2
        onnx_outs = [node.output[k] if len(node.output) > k and node.output[k] else None for k in range(n_out)]
        direct = [o if (o is not None and layout == 0) else im.fresh(node.name + "_out") for o in onnx_outs]
        im.emit("recurrent", inputs, attrs, node.name, direct)
        if layout == 1:
            perms = [(2, 0, 1, 3), (1, 0, 2), (1, 0, 2)]
            for k, o in enumerate(onnx_outs):
                if o is not None:
                    im.emit("transpose", [direct[k]], {"axes": perms[k]}, outputs=[o])
    return conv


CONVERTERS.add("LSTM", _convert("lstm"))
CONVERTERS.add("GRU", _convert("gru"))
CONVERTERS.add("RNN", _convert("rnn"))
