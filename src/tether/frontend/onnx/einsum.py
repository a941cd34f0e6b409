"""Einsum as the ops exporters' equations reduce to: per operand, a sum over the letters nothing else needs;
per pair of operands, one batched matmul (batch letters, free letters of each side, contracted letters) between
transposes and reshapes; a final transpose to the output order. Operands are folded left to right. A letter
repeated within one operand takes the diagonal first (merge the two axes, step by n + 1). Letters whose sizes
differ between operands (broadcasting) are refused."""
from __future__ import annotations

import string
from typing import List, Tuple

import numpy as np

from tether.errors import UnsupportedOpError
from tether.frontend.onnx.importer import ConverterTable, emit_reshape, node_output, require_dtype, str_attr

CONVERTERS = ConverterTable(__name__)

_LETTERS = string.ascii_letters


def _parse(node, eq: str, ranks: List[int]) -> Tuple[List[str], str]:
    eq = eq.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise UnsupportedOpError("node %s: Einsum equation %r names %d operands, the node has %d"
                                 % (node.name, eq, len(terms), len(ranks)))
    used = set(eq) - set(".,->")
    spare = [c for c in _LETTERS if c not in used]
    ell_rank = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = "".join(spare[:ell_rank])
    expanded = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            n = r - len(t.replace("...", ""))
            t = t.replace("...", ell[ell_rank - n:] if n else "")
        if len(t) != r or not all(c in _LETTERS for c in t):
            raise UnsupportedOpError("node %s: Einsum term %r does not match an operand of rank %d"
                                     % (node.name, t, r))
        if any(t.count(c) > 2 for c in t):
            raise UnsupportedOpError("node %s: Einsum equation %r repeats a letter more than twice in one operand"
                                     % (node.name, eq))
        expanded.append(t)
    if arrow:
        out = out.replace("...", ell)
    else:   # implicit output: the ellipsis, then the letters used once, in alphabetical order
        counts = {}
        for t in expanded:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    if len(set(out)) != len(out) or any(c not in "".join(expanded) for c in out):
        raise UnsupportedOpError("node %s: Einsum output %r" % (node.name, out))
    return expanded, out


def _diagonals(im, node, x: str, term: str) -> Tuple[str, str]:
    """Take the diagonal of every letter ``term`` repeats: move the two axes last, merge them, step by n + 1."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) == 2)
        i, j = term.index(c), term.rindex(c)
        shape = im.type(x).shape
        n = shape[i]
        if shape[j] != n:
            raise UnsupportedOpError("node %s: Einsum diagonal of %r over sizes %d and %d"
                                     % (node.name, c, n, shape[j]))
        rest = [k for k in range(len(term)) if k not in (i, j)]
        x = _permute(im, x, term, "".join(term[k] for k in rest) + c + c) if rest + [i, j] != list(range(len(term))) \
            else x
        lead = tuple(shape[k] for k in rest)
        flat = emit_reshape(im, x, lead + (n * n,))
        x = im.emit("strided_slice", [flat], {"begin": (0,) * len(lead) + (0,), "end": lead + (n * n,),
                                              "step": (1,) * len(lead) + (n + 1,)})
        term = "".join(term[k] for k in rest) + c
    return x, term


def _sum_out(im, x: str, term: str, keep: str) -> Tuple[str, str]:
    axes = [i for i, c in enumerate(term) if c not in keep]
    if not axes:
        return x, term
    kept = "".join(c for c in term if c in keep)
    # kernels never write rank-0 tensors: a sum over every axis keeps them, then drops them by a reshape
    y = im.emit("reduce", [x], {"kind": "sum", "axes": axes, "keepdims": not kept})
    return (emit_reshape(im, y, ()) if not kept else y), kept


def _permute(im, x: str, term: str, order: str) -> str:
    if term == order:
        return x
    # positions, not letters: a term with a repeated letter (a diagonal still to take) maps each occurrence once
    left = list(term)
    axes = []
    for c in order:
        k = left.index(c)
        axes.append(k)
        left[k] = None
    return im.emit("transpose", [x], {"axes": tuple(axes)})


def _pair(im, a: str, ta: str, b: str, tb: str, keep: str) -> Tuple[str, str]:
    """a (letters ta) times b (letters tb), summing the shared letters not in ``keep``."""
    sizes = dict(zip(ta, im.type(a).shape))
    sizes.update(zip(tb, im.type(b).shape))
    batch = "".join(c for c in ta if c in tb and c in keep)
    contract = "".join(c for c in ta if c in tb and c not in keep)
    free_a = "".join(c for c in ta if c not in tb)
    free_b = "".join(c for c in tb if c not in ta)

    def size(letters):
        return int(np.prod([sizes[c] for c in letters], dtype=np.int64))

    A = emit_reshape(im, _permute(im, a, ta, batch + free_a + contract), (size(batch), size(free_a), size(contract)))
    B = emit_reshape(im, _permute(im, b, tb, batch + contract + free_b), (size(batch), size(contract), size(free_b)))
    y = im.emit("batch_matmul", [A, B])
    term = batch + free_a + free_b
    return emit_reshape(im, y, tuple(sizes[c] for c in term)), term


@CONVERTERS.register("Einsum")
def _einsum(im, node, ins, a):
    dt = require_dtype(im, node, ins[0], ("float32", "float64"))
    for x in ins[1:]:
        if str(im.type(x).dtype) != dt:
            raise UnsupportedOpError("node %s: Einsum of mixed dtypes" % node.name)
    terms, out = _parse(node, str_attr(a, "equation", ""), [len(im.type(x).shape) for x in ins])
    sizes = {}
    for x, t in zip(ins, terms):
        for c, d in zip(t, im.type(x).shape):
            if sizes.setdefault(c, d) != d:
                raise UnsupportedOpError("node %s: Einsum letter %r is %d in one operand, %d in another "
                                         "(broadcasting is not implemented)" % (node.name, c, sizes[c], d))
    acc, term = None, ""
    for k, (x, t) in enumerate(zip(ins, terms)):
        x, t = _diagonals(im, node, x, t)
        terms[k] = t
        later = out + "".join(terms[k + 1:])
        x, t = _sum_out(im, x, t, later + (term if acc is not None else ""))
        if acc is None:
            acc, term = x, t
        else:
            acc, term = _pair(im, acc, term, x, t, later)
    acc, term = _sum_out(im, acc, term, out)
    acc = _permute(im, acc, term, out)
    im.emit("reshape", [acc], {"shape": tuple(sizes[c] for c in out)}, node.name, node_output(node))
