"""The translation state of one TFLite subgraph into ONNX: the converters' whole API (``Context``).

TFLite activations are NHWC; the ONNX graph holds rank-4 activations NCHW, so that convolutions and pools
take them as they are. Each TFLite tensor is bound to one ONNX value and the layout it is held in:

- ``NATIVE``: TFLite's own layout (every tensor of rank other than 4, and rank-4 values not yet converted);
- ``NCHW``: a rank-4 NHWC tensor held transposed, ``onnx = tflite.transpose(0, 3, 1, 2)``.

A converter asks for an input in the layout it needs: ``ctx.nchw(t)`` (convolutions, pools, resize) or
``ctx.nhwc(t)`` (reshape, matmul, gather... anything that reads positions). Each makes at most one Transpose
per tensor and layout, cached, and a constant is transposed as data, so a chain of layout-agnostic ops stays
NCHW with no Transpose in between. ``ctx.held(t)`` gives a value as it is held, for ops that work in either
layout (elementwise ops, activations, concat, pad, reduce: they remap their axes with ``nchw_axis``).
A converter binds each output with ``ctx.set_output(t, name, layout)`` or ``ctx.set_const(t, array)``.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.tflite.flatbuffer import Operator, Subgraph, Tensor

NATIVE = "native"
NCHW = "nchw"

TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)


def nchw_axis(axis: int, rank: int = 4) -> int:
    """The NCHW axis of a rank-4 NHWC tensor's ``axis`` (negative allowed)."""
    axis = axis + rank if axis < 0 else axis
    return (0, 2, 3, 1)[axis] if rank == 4 else axis


def onnx_dtype(dtype: str) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class Context:
    """What converters see of the translation: the TFLite tensors, their ONNX values, and the nodes emitted."""

    def __init__(self, subgraph: Subgraph) -> None:
        from onnx import helper, numpy_helper

        self._helper = helper
        self._numpy_helper = numpy_helper
        self.subgraph = subgraph
        self.nodes: List[Any] = []           # onnx NodeProto, in order
        self.initializers: List[Any] = []    # onnx TensorProto
        self.op: Optional[Operator] = None   # the operator being converted
        self._values: Dict[int, Tuple[str, str]] = {}            # tensor index -> (onnx name, layout)
        self._consts: Dict[int, np.ndarray] = {}                 # tensor index -> value, TFLite layout
        self._views: Dict[Tuple[int, str], str] = {}             # (tensor, layout) -> onnx name, cached
        self._names: set = set()
        # set by the translation for control-flow ops, which translate the subgraphs they name: the whole model
        # and the converter lookup (passed in, as the converter tables include those ops)
        self.model: Optional[Any] = None
        self.converter_for: Optional[Callable[..., Any]] = None
        # resource variables by (container, shared_name): the value the translation has reached so far, a
        # constant (numpy) or an ONNX value as ``(name, layout)`` (``variables``)
        self.variables: Dict[Tuple[str, str], Any] = {}

    # -- tensors -------------------------------------------------------------------------------------------

    def tensor(self, index: int) -> Tensor:
        return self.subgraph.tensors[index]

    def shape(self, index: int) -> List[int]:
        """The tensor's shape as the file states it (TFLite's layout)."""
        return list(self.subgraph.tensors[index].shape)

    def rank(self, index: int) -> int:
        if index in self._consts:
            return self._consts[index].ndim
        return len(self.subgraph.tensors[index].shape)

    def const(self, index: int) -> Optional[np.ndarray]:
        """The tensor's constant value in TFLite's layout (weights, folded values), or None."""
        if index < 0:
            return None
        if index in self._consts:
            return self._consts[index]
        t = self.subgraph.tensors[index]
        if t.data is not None and t.sparsity is None and not t.is_variable:
            return t.data
        return None

    def layout(self, index: int) -> str:
        if index in self._values:
            return self._values[index][1]
        return NATIVE

    def bound(self, index: int) -> bool:
        return index in self._values or self.const(index) is not None

    # -- names and nodes -----------------------------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        """A value name not used yet, readable from ``hint``."""
        base = re.sub(r"\s+", "_", hint) or "v"
        name, k = base, 1
        while name in self._names:
            name, k = "%s_%d" % (base, k), k + 1
        self._names.add(name)
        return name

    def reserve(self, name: str) -> None:
        self._names.add(name)

    def add_const(self, value: np.ndarray, hint: str = "const") -> str:
        """An initializer holding ``value``; returns its name."""
        name = self.fresh(hint)
        value = np.asarray(value)
        # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
        self.initializers.append(self._numpy_helper.from_array(value if value.flags.c_contiguous else value.copy(),
                                                               name))
        return name

    def emit(self, op_type: str, inputs: Sequence[str], hint: str = "", outputs: int = 1, domain: str = "",
             **attrs) -> List[str]:
        """Append an ONNX node; returns its output names (fresh, from ``hint`` or the current op's output)."""
        hint = hint or self._default_hint()
        outs = [self.fresh(hint if outputs == 1 else "%s_%d" % (hint, i)) for i in range(outputs)]
        node = self._helper.make_node(op_type, list(inputs), outs, name=self.fresh("%s_%s" % (op_type, hint)),
                                      domain=domain or None, **attrs)
        self.nodes.append(node)
        return outs

    def emit1(self, op_type: str, inputs: Sequence[str], hint: str = "", **attrs) -> str:
        return self.emit(op_type, inputs, hint, 1, **attrs)[0]

    def _default_hint(self) -> str:
        if self.op is not None and self.op.outputs:
            t = self.subgraph.tensors[self.op.outputs[0]]
            return t.name or "t%d" % t.index
        return "v"

    # -- reading inputs ------------------------------------------------------------------------------------

    def held(self, index: int) -> Tuple[str, str]:
        """The tensor's ONNX value as it is held now, and its layout (a constant is NATIVE)."""
        if index in self._values:
            return self._values[index]
        return self.nhwc(index), NATIVE

    def nhwc(self, index: int) -> str:
        """The tensor in TFLite's own layout (one cached Transpose if it is held NCHW)."""
        key = (index, NATIVE)
        if key in self._views:
            return self._views[key]
        const = self.const(index)
        if index not in self._values and const is not None:
            name = self.add_const(const, self._hint(index))
        elif index not in self._values:
            raise KeyError("tensor %d (%s) has no value yet" % (index, self.tensor(index).name))
        else:
            name, layout = self._values[index]
            if layout == NCHW:
                name = self._relayout(index, name, TO_NHWC, "_nhwc")
        self._views[key] = name
        return name

    def _relayout(self, index: int, name: str, perm: Sequence[int], suffix: str) -> str:
        """``name`` permuted by ``perm``: a Reshape when the permutation moves only unit dims (H = W = 1 or
        C = 1, statically: global pools, 1x1 feature maps), else a Transpose."""
        t = self.tensor(index)
        sig = t.shape_signature if t.shape_signature else t.shape
        if len(t.shape) == 4 and len(sig) == 4 and all(d >= 0 for d in sig[1:]):
            _, h, w, c = t.shape
            if (h == 1 and w == 1) or c == 1:
                nhwc_dims = [0, h, w, c]                 # 0: the batch, copied (it may be set at import)
                dims = [nhwc_dims[TO_NCHW[a]] if perm == TO_NCHW else nhwc_dims[a] for a in range(4)]
                return self.emit1("Reshape", [name, self.add_const(np.array(dims, np.int64), "shape")],
                                  self._hint(index) + suffix)
        return self.emit1("Transpose", [name], self._hint(index) + suffix, perm=list(perm))

    def nchw(self, index: int) -> str:
        """A rank-4 tensor held NCHW (one cached Transpose if it is held in TFLite's layout)."""
        key = (index, NCHW)
        if key in self._views:
            return self._views[key]
        if self.rank(index) != 4:
            raise ValueError("tensor %d (%s) has rank %d, not 4: it has no NCHW view"
                             % (index, self.tensor(index).name, self.rank(index)))
        const = self.const(index)
        if index in self._values and self._values[index][1] == NCHW:
            name = self._values[index][0]
        elif index not in self._values and const is not None:
            name = self.add_const(np.transpose(const, TO_NCHW), self._hint(index) + "_nchw")
        else:
            name = self._relayout(index, self.nhwc(index), TO_NCHW, "_nchw")
        self._views[key] = name
        return name

    def aligned(self, indices: Sequence[int]) -> Tuple[List[str], str]:
        """Inputs of a broadcasting op in one common layout: NCHW when every run-time input has rank 4 and one is
        held NCHW (a lower-rank constant is broadcast to rank 4 as TFLite would, then permuted as data), else
        TFLite's own layout. Returns the ONNX names and that layout, which is the output's."""
        runtime = [i for i in indices if self.const(i) is None]
        if runtime and all(self.rank(i) == 4 for i in runtime) and any(self.layout(i) == NCHW for i in runtime) \
                and all(self.rank(i) <= 4 for i in indices):
            names = []
            for i in indices:
                const = self.const(i)
                if const is not None and 0 < const.ndim < 4:
                    key = (i, NCHW)
                    if key not in self._views:
                        full = const.reshape((1,) * (4 - const.ndim) + const.shape)
                        self._views[key] = self.add_const(np.transpose(full, TO_NCHW), self._hint(i) + "_nchw")
                    names.append(self._views[key])
                elif const is not None and const.ndim == 0:
                    names.append(self.nhwc(i))
                else:
                    names.append(self.nchw(i))
            return names, NCHW
        return [self.nhwc(i) for i in indices], NATIVE

    def transposed_const(self, index: int, perm: Sequence[int], hint: str = "") -> str:
        """A weight tensor permuted (``perm`` as numpy's): as data when constant, else one Transpose node."""
        const = self.const(index)
        if const is not None:
            return self.add_const(np.transpose(const, perm), hint or self._hint(index))
        return self.emit1("Transpose", [self.nhwc(index)], hint or self._hint(index), perm=list(perm))

    def _hint(self, index: int) -> str:
        t = self.subgraph.tensors[index]
        return t.name or "t%d" % index

    def int_list(self, index: int, what: str) -> List[int]:
        """A constant integer input (axes, paddings, sizes) as a flat list; refuses a run-time value."""
        const = self.const(index)
        if const is None:
            raise UnsupportedOpError("%s: its %s (tensor %d %r) is computed at run time; tether needs a constant"
                                     % (self.where(), what, index, self.tensor(index).name))
        return [int(v) for v in np.asarray(const).reshape(-1)]

    def where(self) -> str:
        """The current op, as error messages name it: ``CONV_2D v1 (node 12, output 'name')``."""
        op = self.op
        if op is None:
            return "the model"
        out = self.subgraph.tensors[op.outputs[0]].name if op.outputs else ""
        return "%s v%d (node %d, output %r)" % (op.op, op.version, op.index, out)

    # -- binding outputs -----------------------------------------------------------------------------------

    def set_output(self, index: int, name: str, layout: str = NATIVE) -> None:
        """Bind tensor ``index`` to the ONNX value ``name``, held in ``layout`` (NCHW only for rank 4)."""
        if layout == NCHW and len(self.tensor(index).shape) not in (0, 4):
            raise ValueError("tensor %d (%s) of rank %d cannot be held NCHW"
                             % (index, self.tensor(index).name, len(self.tensor(index).shape)))
        self._values[index] = (name, layout)
        self._views = {k: v for k, v in self._views.items() if k[0] != index}
        if layout == NCHW:
            self._views[(index, NCHW)] = name
        else:
            self._views[(index, NATIVE)] = name

    def set_const(self, index: int, value: np.ndarray) -> None:
        """Bind tensor ``index`` to a value computed now (a folded dequantize, a densified weight)."""
        self._consts[index] = np.asarray(value)
        self._values.pop(index, None)
        self._views = {k: v for k, v in self._views.items() if k[0] != index}

    def rename(self, old: str, new: str) -> None:
        """Call the ONNX value ``old`` ``new`` everywhere: in the nodes and in the bindings (graph outputs)."""
        for node in self.nodes:
            for seq in (node.input, node.output):
                for k, v in enumerate(seq):
                    if v == old:
                        seq[k] = new
        self._views = {k: (new if v == old else v) for k, v in self._views.items()}
        self._values = {k: ((new if v == old else v), lay) for k, (v, lay) in self._values.items()}

    def produced(self, name: str) -> bool:
        """Whether a node emitted so far writes ``name`` (not a graph input or an initializer)."""
        return any(name in n.output for n in self.nodes)
