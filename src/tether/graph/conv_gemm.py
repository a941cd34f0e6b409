"""Single-image convolutions as GEMMs (opt_level 3): which convs qualify, the argument views their kernel takes,
and weights packed into panels once at build time.

Convolutions of one image run as matrix products with output channels as the vector axis: pointwise ones as
a plain matmul (weights (oc, ic) x input (ic, h*w)), the others as an implicit GEMM over flattened output pixels
(ops.conv2d_pixels). Both fill whole vectors at any output width, where the row-vectorized direct convolution
wastes most lanes of a 13- to 55-wide row: measured 1.3-3x on squeezenet/resnet layers.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from tether import ops
from tether.graph import op_info
from tether.graph.ir import Graph, TensorType
from tether.ops import common as c
from tether.target import has_half_arithmetic

# A pointwise conv with at most this many output channels runs as conv2d_pixels rather than a matmul (in
# squeezenet's and mobilenet_v2's 1x1 layers 1.2-1.5x faster at 16..64 channels; slower when expanding to
# 96..576, where the matmul's packed activations pay off).
POINTWISE_PIXELS_MAX_CHANNELS = 64
# float16 (NEON): pointwise convs run as the matmul (above POINTWISE_PIXELS_MAX_CHANNELS outputs) only with at
# most this many input channels on maps of at least this many pixels (pointwise_pixels_max)
HALF_MATMUL_MAX_REDUCE = 32
HALF_MATMUL_MIN_PIXELS = 64


def pointwise_pixels_max(target, dtype: str = "float32", in_channels: int = 0, pixels: int = 0) -> Optional[int]:
    """The widest pointwise conv (output channels) that runs as conv2d_pixels on `target`; None: every one.

    AVX-512 (16 lanes, 12-pixel blocks): conv2d_pixels ran every pointwise layer of mobilenet_v2 and squeezenet
    as fast or faster than the matmul, most where the matmul's 16-pixel panels fit the map worst (960->160 @7x7:
    72 -> 111 GFLOP/s, 576->96 @14x14: 83 -> 109; scripts/bench_conv_layers.py, thread CPU time); the matmul
    also packs the activations on every run. float16 on NEON (half arithmetic, ``in_channels`` and ``pixels``
    of the conv): every one but the short reductions over large maps (HALF_MATMUL_*); the matmul, vectorized along
    the pixels, fills few of the 8 lanes on small maps and broadcasts its packed activations with an address add
    per ld1r, while conv2d_pixels transposes each block on the way out, which only a short reduction does not
    pay for (mobilenet_v2 at 64x64 on the A76, instructions, before acc + x*y became llvm.fma: 960->160 @2x2
    0.99M -> 0.29M as conv2d_pixels, 16->96 @32x32 0.52M as the matmul against 0.80M). Elsewhere the threshold
    stays where it was measured."""
    if target is not None and target.arch == "x86_64" and target.vector_lanes(32) >= 16:
        return None
    if target is not None and dtype == "float16" and has_half_arithmetic(target):
        matmul = pixels >= HALF_MATMUL_MIN_PIXELS and in_channels <= HALF_MATMUL_MAX_REDUCE
        return POINTWISE_PIXELS_MAX_CHANNELS if matmul else None
    return POINTWISE_PIXELS_MAX_CHANNELS


# AVX-512: a pointwise conv with few input channels on a large map runs as a matmul reading its input in place
# (weights (oc, ic) broadcast, 32 pixels = two zmm per row, 12 rows: 24 accumulators) and writing the NCHW output
# rows directly. As conv2d_pixels its (pixels x channels) block is transposed on the way out, which with a short
# reduction costs more than the FMAs (mobilenet_v2's 16->96 @112x112: 632 shuffles per 12x32 block; 902 -> 473 us,
# 24->144 @56x56 278 -> 165 us, onnxruntime 1000 and 420). Not on small maps, where the 32-pixel rows fit badly
# (32->192 @28x28: 104 -> 122 us).
DIRECT_POINTWISE_BLOCK = (12, 32)
DIRECT_POINTWISE_MAX_INPUT_CHANNELS = 48
# ... and up to this many on maps of whole 32-pixel blocks (no partial column block): resnet50's 256->64 @56x56
# 1549 -> 1188 us, 256->128 3097 -> 2433, mobilenet_v2's 96->24 @56x56 207 -> 106, 144->24 341 -> 224; with a
# partial block it lost (squeezenet's 128->16 @55x55: 158 -> 227 us)
DIRECT_POINTWISE_MAX_INPUT_CHANNELS_WHOLE = 256
DIRECT_POINTWISE_MIN_PIXELS = 2048


def pointwise_direct(target, in_channels: int, pixels: int, out_channels: int = 0) -> bool:
    """Whether a pointwise conv (groups 1) runs as the in-place matmul of DIRECT_POINTWISE_BLOCK on `target`
    (``out_channels`` 0: not known, the partial-block rule below does not apply)."""
    if not (target is not None and target.arch == "x86_64" and target.vector_lanes(32) >= 16):
        return False
    if pointwise_direct_partial(in_channels, pixels, out_channels):
        return True
    return (pixels >= DIRECT_POINTWISE_MIN_PIXELS
            and in_channels <= (DIRECT_POINTWISE_MAX_INPUT_CHANNELS_WHOLE if pixels % DIRECT_POINTWISE_BLOCK[1] == 0
                                else DIRECT_POINTWISE_MAX_INPUT_CHANNELS))


# ---------------------------------------------------------------- pointwise: in place with a partial block
# A map that is not whole 32-pixel blocks (a detector's 608-wide input: 50x38 = 1900, 100x76 = 7600 and 25x19 =
# 475 pixels) ran its pointwise convs as conv2d_pixels, whose 12 pixels read per reduction step lie one input row
# (a page or more) apart. The in-place matmul reads input rows as vectors, and its last column tile is shifted
# back to whole vectors (ops/schedules.py _tile_shifted; it was a scalar tail, why partial blocks lost before).
# Measured (AVX-512, 1 thread, interleaved, thread CPU time, + activation), conv2d_pixels -> in place:
# 256->256 @50x38 2030 -> 1607 us, 128->128 @100x76 2314 -> 1899, 512->512 @25x19 1752 -> 1453, 128->37 @50x38
# 216 -> 134, 32->192 @28x28 97 -> 55, 512->128 @28x28 772 -> 579, 128->16 @55x55 131 -> 112, 512->128
# @25x19 419 -> 357; 2 threads 0.58-0.71x on these. Not where the reduction is much longer than the map
# (384->96 @14x14 83 -> 88 us, 960->160 @7x7 89 -> 102, 576->160 @7x7 55 -> 66) nor on maps under
# DIRECT_PARTIAL_MIN_PIXELS (too few column tiles to share between threads: 96->576 @14x14 at 2 threads 77 -> 101
# us).
DIRECT_PARTIAL_MIN_PIXELS = 400
DIRECT_PARTIAL_MIN_OUTPUT_CHANNELS = 16
DIRECT_PARTIAL_MAX_INPUT_CHANNELS = 512


def pointwise_direct_partial(in_channels: int, pixels: int, out_channels: int) -> bool:
    """The partial-block rule of pointwise_direct (AVX-512): maps of at least DIRECT_PARTIAL_MIN_PIXELS, at
    least DIRECT_PARTIAL_MIN_OUTPUT_CHANNELS output channels, and input channels at most 5/4 of the pixels (512
    at 25x19 = 475) and at most DIRECT_PARTIAL_MAX_INPUT_CHANNELS."""
    return (pixels >= DIRECT_PARTIAL_MIN_PIXELS and out_channels >= DIRECT_PARTIAL_MIN_OUTPUT_CHANNELS
            and in_channels <= min(DIRECT_PARTIAL_MAX_INPUT_CHANNELS, pixels * 5 // 4))


# Arm: a conv into at most this many channels takes a panel this wide (two q registers of float32), where a 16-wide
# one multiplied half its lanes by padding (a 3 -> 8 stem conv at 16x16 on the A72: see panel_width)
ARM_SMALL_PANEL = 8


# A grouped conv whose groups' output channels fill no 16-wide panel but 8-wide ones runs as conv2d_pixels on these
# (wav2vec2's positional conv: 16 groups of 24 channels, a 128-tap kernel over 49 frames, ran as the direct conv at
# 15 GFLOP/s against onnxruntime's 42)
GROUP_NARROW_PANEL = 8


def group_panel(out_channels: int, groups: int) -> Optional[int]:
    """The panel width of a grouped conv2d_pixels kernel: ops.linear.PANEL or GROUP_NARROW_PANEL, whichever
    divides each group's output channels (a panel must lie in one group), else None (no such kernel)."""
    ocg = out_channels // groups
    return next((w for w in (ops.linear.PANEL, GROUP_NARROW_PANEL) if ocg % w == 0), None)


def panel_width(target, out_channels: int, groups: int, dtype: str = "float32") -> int:
    """Output channels per weight panel of a conv2d_pixels kernel on `target` for weights of ``dtype`` (the
    schedule's register block is a few output pixels by one panel).

    AVX-512: 32 (two zmm), so the block is 12 pixels x 32 channels, 24 of the 32 registers: the 16-wide panel's 12
    accumulators did 13 loads per 12 FMAs (the load ports, not the FMAs, bound it): mobilenet_v2's deep pointwise
    layers went from 110 to 140-155 GFLOP/s, onnxruntime's speed. float16 on NEON (8 lanes): 32 too, four q
    registers per pixel row, since each pixel's input costs a load (and then, before acc + x*y became llvm.fma,
    an address add) that 16 channels would share between only two fmla .8h (mobilenet_v2 at 64x64 on the A76:
    11.0 -> 9.3M instructions, measured then). Not where 32-wide panels would pad the channels by more than
    16-wide ones plus 1/16 (48 -> 64 is a third more work; 1000 -> 1024 is not), nor for grouped convs (a panel
    must lie in one group). Elsewhere ops.linear.PANEL, as measured there."""
    narrow = ops.linear.PANEL
    if groups > 1:
        return group_panel(out_channels, groups) or narrow
    if target is not None and target.arch in ("aarch64", "armv7") and out_channels <= ARM_SMALL_PANEL:
        return ARM_SMALL_PANEL
    wide = target is not None and ((target.arch == "x86_64" and target.vector_lanes(32) >= 16)
                                   or (dtype == "float16" and has_half_arithmetic(target)))
    if wide and groups == 1 and -(-out_channels // 32) * 32 * 16 <= -(-out_channels // narrow) * narrow * 17:
        return 32
    return narrow


def gemm_plan(body: List, params: List[str], types: dict, panel_weights: Optional[dict] = None,
              pixels_max: Optional[int] = POINTWISE_PIXELS_MAX_CHANNELS):
    """Kernel-argument shapes for running a conv2d(+elementwise epilogue) body as a GEMM, or None.
    ``panel_weights`` maps weights already packed into panels (pack_conv_weights) to their conv shapes: a
    pointwise conv whose weight was packed runs as conv2d_pixels whatever its width. ``pixels_max``: the widest
    other pointwise conv that does (pointwise_pixels_max; None: no limit)."""
    ci = conv_index(body)
    if ci is None:
        return None
    conv = body[ci]
    panel_weights = panel_weights or {}
    wname = conv.inputs[1]
    ws = panel_weights.get(wname) or types[wname].shape
    n, ic, h, w = conv_input_geometry(conv, types)
    oc, _, kh, kw = ws
    oh, ow = conv_output_size(conv, types, ws)
    g = conv.attrs["groups"]
    if conv.attrs.get("channels_last_in") and not conv.attrs.get("channels_last_out"):
        return None     # (float_layout.py makes both: the NHWC input is read through kernels/core_te.py's view)
    if conv.attrs.get("channels_last_out"):
        return _channels_last_plan(body, ci, ws, types, (oh, ow))
    pointwise = (kh, kw) == (1, 1) and list(conv.attrs["strides"]) == [1, 1] and not any(conv.attrs["pads"])
    # a pointwise conv is a plain matrix product (a grouped one a batch of them, one per group); with few input
    # channels conv2d_pixels runs it faster (no per-run packing of the activations)
    # a weight pack_conv_weights left 2-D (oc, ic): the in-place matmul (pointwise_direct)
    direct = pointwise and g == 1 and wname in panel_weights and len(types[wname].shape) == 2
    as_matmul = pointwise and (g != 1 or direct or (pixels_max is not None and oc > pixels_max
                                                    and wname not in panel_weights))
    # a grouped conv runs as conv2d_pixels when every group's output channels fill whole panels
    grouped_pixels = g != 1 and not pointwise and group_panel(oc, g) is not None
    if conv.inputs[0] == conv.inputs[1] or (g != 1 and not pointwise and not grouped_pixels):
        return None
    # a batch (a video net's frames as images) runs as conv2d_pixels over all the images' pixels, without a
    # prologue; the matmul forms take one image
    if n != 1 and (ci != 0 or as_matmul):
        return None
    batch = (n,) if n != 1 else ()
    data = conv.inputs[0] if ci == 0 else _prologue_input(body[:ci], conv.inputs[0], params, types)
    if data is None:
        return None
    if grouped_pixels:
        shapes = {conv.inputs[0]: batch + (ic, h, w),
                  wname: types[wname].shape if wname in panel_weights else (oc, ic // g * kh * kw)}
        lead, rows = (), oc
    elif g == 1:
        shapes = {conv.inputs[0]: (ic, h * w) if as_matmul else batch + (ic, h, w),
                  wname: types[wname].shape if wname in panel_weights else (oc, ic * kh * kw)}
        lead, rows = (), oc
    else:
        shapes = {conv.inputs[0]: (g, ic // g, h * w), conv.inputs[1]: (g, oc // g, ic // g)}
        lead, rows = (g,), oc // g
    # a prologue (elementwise ops on the conv's input: a pre-activation batch norm + relu) runs on the input's view,
    # its per-channel operands as (channels, 1[, 1])
    view = shapes.pop(conv.inputs[0])
    shapes[data] = view
    for node in body[:ci]:
        for v in node.inputs:
            if v != data and v in params and v not in shapes:
                per_channel = int(np.prod(types[v].shape, dtype=np.int64)) == ic
                shapes[v] = (ic if per_channel else 1,) + (1,) * (len(view) - 1)
    for node in body[ci + 1:]:
        if op_info.pattern(node.op) != "elemwise":
            return None
        for v in node.inputs:
            if v in shapes or v not in params:
                continue
            t = (1,) * (4 - len(types[v].shape)) + tuple(types[v].shape)
            if len(t) != 4 or t[0] not in (1, n) or t[1] not in (1, oc) or t[2:] not in ((oh, ow), (1, 1)):
                return None
            if not lead:
                # (per image: the batch's output is (N, O, OH*OW))
                shapes[v] = (t[0], t[1], t[2] * t[3]) if t[0] != 1 else (t[1], t[2] * t[3])
            elif t[1] == 1:
                shapes[v] = (1, 1, t[2] * t[3])
            else:
                shapes[v] = (g, oc // g, t[2] * t[3])
    if any(p in (conv.inputs[0], conv.inputs[1], data) for node in body[ci + 1:] for p in node.inputs):
        return None
    shapes["__out__"] = batch + lead + (rows, oh * ow)
    shapes["__data__"] = data
    return shapes


def conv_input_geometry(conv, types: dict) -> tuple:
    """(N, C, H, W) of a conv2d node's input, which is (N, H, W, C) with ``channels_last_in``."""
    shape = tuple(types[conv.inputs[0]].shape)
    if conv.attrs.get("channels_last_in"):
        n, h, w, ch = shape
        return n, ch, h, w
    return shape


def conv_output_size(conv, types: dict, ws=None) -> tuple:
    """(OH, OW) of a conv2d node (its output may be the (OH*OW, O) pixels of ``channels_last_out``)."""
    from tether.kernels.core import conv_out_size

    _, _, h, w = conv_input_geometry(conv, types)
    _, _, kh, kw = ws or types[conv.inputs[1]].shape
    s, d, p = conv.attrs["strides"], conv.attrs["dilations"], conv.attrs["pads"]
    return (conv_out_size(h, kh, s[0], d[0], p[0], p[2]), conv_out_size(w, kw, s[1], d[1], p[1], p[3]))


def _channels_last_plan(body: List, ci: int, ws: tuple, types: dict, out_hw: tuple):
    """gemm_plan of a conv2d writing (OH*OW, O) (``channels_last_out``, graph/passes/float_layout.py): always
    conv2d_pixels (one image, groups 1), its epilogue's operands as they are ((O,) constants broadcast along the
    channels, (OH*OW, O) values), or None."""
    conv = body[ci]
    n, ic, h, w = conv_input_geometry(conv, types)
    oc, _, kh, kw = ws
    if ci != 0 or n != 1 or conv.attrs["groups"] != 1 or conv.inputs[0] == conv.inputs[1]:
        return None
    pixels = out_hw[0] * out_hw[1]
    for node in body[1:]:
        if op_info.pattern(node.op) != "elemwise":
            return None
        for v in node.inputs:
            if v in (conv.inputs[0], conv.inputs[1]):
                return None
            shape = tuple(types[v].shape)
            if v not in {o for b in body for o in b.outputs} and shape not in ((), (1,), (oc,), (pixels, oc)):
                return None
    wname = conv.inputs[1]
    view = (h, w, ic) if conv.attrs.get("channels_last_in") else (ic, h, w)
    return {conv.inputs[0]: view, wname: types[wname].shape if len(types[wname].shape) == 3
            else (oc, ic * kh * kw), "__out__": (pixels, oc), "__data__": conv.inputs[0]}


def conv_index(body: List) -> Optional[int]:
    """Where the body's conv2d is: first, or after an elementwise prologue (fuse_prologues), else None."""
    for k, node in enumerate(body):
        if node.op == "conv2d":
            return k if len(node.inputs) == 2 else None
        if op_info.pattern(node.op) != "elemwise":
            return None
    return None


def _prologue_input(prologue: List, conv_input: str, params: List[str], types: dict) -> Optional[str]:
    """The one full-size kernel argument an elementwise prologue maps to the conv's input, when every other
    operand is per channel ((1, C, 1, 1) or a scalar), else None."""
    full = tuple(types[conv_input].shape)
    internal = {o for node in prologue for o in node.outputs}
    if prologue[-1].outputs != [conv_input]:
        return None
    data = None
    for node in prologue:
        if tuple(types[node.outputs[0]].shape) != full:
            return None
        for v in node.inputs:
            if v in internal:
                continue
            if v not in params:
                return None
            shape = tuple(types[v].shape)
            if shape == full:
                if data not in (None, v):
                    return None
                data = v
            elif not (len(shape) <= 4 and all(d == 1 for i, d in enumerate((1,) * (4 - len(shape)) + shape)
                                                  if i != 1) and (shape[-3:-2] or (1,))[0] in (1, full[1])):
                return None
    return data


def conv_as_gemm(conv, x, w, ws, prepacked: bool):
    """The te tensor of `conv` run as a GEMM on the argument views gemm_plan chose (`ws`: the weight's conv shape;
    `prepacked`: the weight arrives packed into panels)."""
    oc, _, kh, kw = ws
    if len(c.shape_of(w)) == 3 and not prepacked:     # grouped pointwise: (g, ocg, icg) x (g, icg, h*w)
        return ops.batch_matmul(w, x)
    if len(c.shape_of(x)) == 2:     # pointwise: the input already is the (ic, h*w) column matrix
        # a build-time 2-D weight (pack_conv_weights, pointwise_direct): the in-place register block
        return ops.matmul(w, x, block=DIRECT_POINTWISE_BLOCK if prepacked else None)
    pads = conv.attrs["pads"]
    groups = conv.attrs["groups"]
    panel = group_panel(oc, groups) if groups > 1 else ops.linear.PANEL
    return ops.conv2d_pixels(x, w, (kh, kw), conv.attrs["strides"], (pads[0], pads[1], pads[2], pads[3]),
                             conv.attrs["dilations"], out_channels=oc, groups=groups, name="conv2d", panel=panel,
                             channels_last_out=bool(conv.attrs.get("channels_last_out")),
                             channels_last_in=bool(conv.attrs.get("channels_last_in")))


def pack_conv_weights(graph: Graph, params: Dict[str, np.ndarray], target=None) -> Dict[str, tuple]:
    """Pack the constant weights of convs that run as ops.conv2d_pixels into its panels once, at build time,
    instead of in every run (a pass over all the weights per call: about 1 ms on resnet50's 512-channel layers).
    Rewrites ``params`` and ``graph.types`` in place and returns {weight name: its conv shape (O, C, KH, KW)}
    for to_te.lower_kernel. A weight read by more than one node keeps its layout. Which pointwise convs run as
    conv2d_pixels and the panel width depend on ``target`` (pointwise_pixels_max, panel_width)."""
    uses: Dict[str, int] = {}
    for node in graph.nodes:
        for v in set(node.inputs):
            uses[v] = uses.get(v, 0) + 1
    packed: Dict[str, tuple] = {}
    for node in graph.nodes:
        body = node.body()
        ci = conv_index(body)
        if ci is None:
            continue
        conv = body[ci]
        wname = conv.inputs[1]
        if wname not in params or uses.get(wname) != 1 or wname in graph.outputs or wname in packed:
            continue
        in_channels = int(conv_input_geometry(conv, graph.types)[1])
        oh, ow = conv_output_size(conv, graph.types)
        pixels_max = pointwise_pixels_max(target, graph.types[wname].dtype, in_channels, oh * ow)
        plan = gemm_plan(body, node.body_params(), graph.types, pixels_max=pixels_max)
        if plan is None or len(plan[wname]) != 2:
            continue
        w = np.asarray(params[wname])
        last_in = bool(conv.attrs.get("channels_last_in"))
        if (not last_in and w.shape[2:] == (1, 1) and list(conv.attrs["strides"]) == [1, 1]
                and not any(conv.attrs["pads"]) and conv.attrs["groups"] == 1
                and not conv.attrs.get("channels_last_out")
                and pointwise_direct(target, w.shape[1], oh * ow, w.shape[0])):
            # marked as the in-place matmul by its 2-D (oc, ic) weight in panel_weights (gemm_plan reads it so)
            params[wname] = np.ascontiguousarray(w.reshape(w.shape[0], -1))
            graph.types[wname] = TensorType(params[wname].shape, str(w.dtype))
            packed[wname] = tuple(w.shape)
            continue
        if len(plan[plan["__data__"]]) == 2:
            continue      # not run as conv2d_pixels: a pointwise conv as a matmul on the (ic, h*w) columns
        width = panel_width(target, w.shape[0], conv.attrs["groups"], str(w.dtype))
        # (ops.conv2d_pixels reduces a channels-last input over (KH, KW, C))
        rows = w.transpose(0, 2, 3, 1) if last_in else w
        params[wname] = ops.linear.pack_panels_array(np.ascontiguousarray(rows).reshape(w.shape[0], -1), width)
        graph.types[wname] = TensorType(params[wname].shape, str(w.dtype))
        packed[wname] = tuple(w.shape)
    return packed


# ---------------------------------------------------------------------------------------------------------------
# the channel panel of a tuning config (schedules.Family.conv_panel)

def panel_weight(node, panel_weights: Dict[str, tuple]) -> Optional[str]:
    """The build-time packed weight (pack_conv_weights) that `node`'s conv2d_pixels kernel reads, or None."""
    ci = conv_index(node.body())
    if ci is None:
        return None
    wname = node.body()[ci].inputs[1]
    return wname if wname in panel_weights else None


def panel_type(types: Dict[str, TensorType], wname: str, out_channels: int, width: int) -> TensorType:
    """The type of weight `wname` (packed, out_channels rows) when packed into `width`-wide panels instead."""
    _, k, _ = types[wname].shape
    return TensorType((-(-out_channels // width), k, width), types[wname].dtype)


def repack_conv_weight(node, graph: Graph, params: Dict[str, np.ndarray], panel_weights: Dict[str, tuple],
                       width: int) -> None:
    """Repack the build-time packed weight of `node`'s conv into `width`-wide panels (a tuned config's
    ``conv_panel``), in ``params`` and ``graph.types``; a no-op when it has that width or is not packed."""
    wname = panel_weight(node, panel_weights)
    if wname is None or not width or params[wname].ndim != 3 or int(params[wname].shape[2]) == width:
        return
    oc = panel_weights[wname][0]
    params[wname] = ops.linear.pack_panels_array(ops.linear.unpack_panels_array(np.asarray(params[wname]), oc),
                                                 width)
    graph.types[wname] = panel_type(graph.types, wname, oc, width)
