"""Pack the constant weights of dense layers into the matmul's column panels once, at build time.

A dense kernel with enough rows packs its (N, K) weight into ``[ceil(N/16), K, 16]`` panels (ops.linear) so its
micro-kernel reads B contiguously; done in every run, that pass reads and writes the whole weight (6.8 MB for a
256 -> 6625 CTC classifier, about as long as the product itself). For a constant weight read by one dense node,
``pack_dense_weights`` stores the packed layout in ``params`` instead and marks the node (attribute
``packed_n``: the weight's N) so its lowering (to_te ``dense``) reads the panels directly.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from tether import ops
from tether.ops.schedules import family_of

from .ir import Graph, TensorType


def pack_dense_weights(graph: Graph, params: Dict[str, np.ndarray], target: Any = None) -> Dict[str, int]:
    """Rewrite ``params``, ``graph.types`` and the dense nodes' attributes in place (run it on a copy);
    returns {weight name: N} for the weights packed. ``target`` (a Target) may ask for wider panels and a larger
    register block (``panel_block``)."""
    uses: Dict[str, int] = {}
    for node in graph.nodes:
        for v in set(node.body_params()):
            uses[v] = uses.get(v, 0) + 1
    packed: Dict[str, int] = {}
    arm = target is not None and family_of(target).name in ("aarch64", "armv7")
    min_rows = ARM_PREPACK_MIN_ROWS if arm else PREPACK_MIN_ROWS
    for node in graph.nodes:
        for b in node.body():
            if b.op != "dense" or len(b.inputs) != 2 or "packed_n" in b.attrs:
                continue
            wname = b.inputs[1]
            w = params.get(wname)
            if (w is None or uses.get(wname) != 1 or wname in graph.outputs or wname in packed or w.ndim != 2
                    or str(w.dtype) not in ("float32", "float16")):
                continue
            xt = graph.types.get(b.inputs[0])
            # A single row reads the weight as it is (row dot products). The packing costs nothing at run time, so
            # a few rows and few columns take panels too: a pointwise conv on channels-last pixels
            # (passes/float_layout.py) into 8 channels ran as 32768 dot products of 16 terms (4096 pixels: 55 us;
            # in one padded panel 11 us), one over 3x3 pixels 160 -> 960 at 39 GFLOP/s (in panels: 150)
            if xt is None or len(xt.shape) != 2 or int(xt.shape[0]) < min_rows:
                continue
            width, block = panel_block(target, int(w.shape[0]), int(xt.shape[0]))
            params[wname] = ops.linear.pack_panels_array(np.asarray(w), width)
            graph.types[wname] = TensorType(params[wname].shape, str(w.dtype))
            b.attrs["packed_n"] = int(w.shape[0])
            if block is not None:
                b.attrs["packed_block"] = block
            packed[wname] = int(w.shape[0])
    return packed


# Rows of x from which a constant weight is packed (one row: the kernel reads the weight as it is) ...
PREPACK_MIN_ROWS = 2
# ... and on Arm (aarch64, armv7), where one row's product in panels is a multiply-add by element of each weight
# vector, where the row dot products loaded x and the weight per multiply-add and summed the partial vectors at
# the end: a 256-512-512-10 MLP counted 267,872 -> 203,163 instructions in its kernels on the emulated A72 (armv7:
# 570,467 -> 436,007). On x86 (AVX-512) the row dot products stay: 17.8 against 18.9 us for that MLP
ARM_PREPACK_MIN_ROWS = 1
# AVX-512's dense micro-kernel: panel width and (rows, columns) register block
WIDE_PANEL = 32
WIDE_BLOCK = (12, 32)


def panel_block(target: Any, n: int = 0, m: int = 0) -> Tuple[int, Optional[Tuple[int, int]]]:
    """(panel width, register block or None for the family's default) of a prepacked dense of ``m`` rows and
    ``n`` output columns (0: not known) on ``target``. AVX-512: 32-wide panels unless they would pad the columns
    by more than 16-wide ones plus 1/16 (48 -> 64 is a third more work), 8-wide (ymm) for 8 columns or fewer;
    12 rows, or all of them when there are fewer."""
    rows = min(12, m) if m else 12
    if target is not None:
        fam = family_of(target)
        if fam.name == "x86" and fam.lanes >= 16:
            if n and n <= 8:
                return 8, (rows, 8)
            if n and -(-n // WIDE_PANEL) * WIDE_PANEL * 16 > -(-n // 16) * 16 * 17:
                return 16, (rows, 16)
            return WIDE_PANEL, (rows, WIDE_BLOCK[1])
        if m and m < fam.mm_rows:
            return ops.linear.PANEL, (m, ops.linear.PANEL)
    return ops.linear.PANEL, None
