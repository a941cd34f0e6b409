#!/usr/bin/env python3
"""Model families a new user tries, exported from PyTorch with random weights: tether's compile time, its latency
against onnxruntime at 1 and 2 threads, each runtime timed alone in a process of its own, and its max relative
error against onnxruntime.

    python scripts/bench_families.py [--models efficientnet_b0,mobilenet_v3_large,mobilevit,wav2vec2,crnn_dynquant]
                                     [--min-rounds 5] [--max-rounds 25] [--tolerance 0.02] [--number N]
                                     [--profile N] [--json out.json]

The families (deterministic random weights, no download):

- ``efficientnet_b0``, ``mobilenet_v3_large``: torchvision's, 1x3x224x224 (SiLU / hard-swish, squeeze-excite,
  3x3 and 5x5 depthwise convolutions);
- ``mobilevit``: transformers' MobileViTForImageClassification in its xx-small configuration, 1x3x256x256
  (convolutions, then patches unfolded into attention and folded back);
- ``wav2vec2``: transformers' Wav2Vec2Model, its feature encoder (seven strided 1-D convolutions, group norm) and
  four 256-wide attention layers, on one second of 16 kHz audio (1x16000);
- ``crnn_dynquant``: a text-line CRNN (three conv blocks, a bidirectional LSTM, a per-step classifier) on 1x1x32x128,
  quantized dynamically by onnxruntime's ``quantize_dynamic`` (DynamicQuantizeLinear, ConvInteger, MatMulInteger).

torch, torchvision, onnxscript and transformers (the extra ``tether[pytorch]``) are installed with pip when
missing. Each model is exported with the TorchScript exporter (opset 17), compiled at opt_level 3 (compile
time = from_onnx + build_graph, object cache off unless TETHER_OBJECT_CACHE is set) and timed as
scripts/bench_model_kinds.py times a kind (bench_models.time_alone: rounds until the ratio tether / onnxruntime
is stable, lower is better; a ratio still moving is marked ``*``).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Tuple

import numpy as np

from _alone import comparison_parser, parse_comparison, table_header, table_row
from _rows import write_rows
from bench_model_kinds import measure
from bench_models import run_table
from bench_pytorch import TORCH_PINS, ensure_torch

MODULES = ("torch", "torchvision", "onnxscript", "transformers")
PINS = TORCH_PINS + ["transformers==5.25.0"]
FAMILIES = ["efficientnet_b0", "mobilenet_v3_large", "mobilevit", "wav2vec2", "crnn_dynquant"]


def _torchvision(name: str) -> Tuple[Any, Any]:
    import torch
    import torchvision

    return getattr(torchvision.models, name)(weights=None), torch.rand(1, 3, 224, 224)


def _mobilevit() -> Tuple[Any, Any]:
    import torch
    from transformers import MobileViTConfig, MobileViTForImageClassification

    config = MobileViTConfig(image_size=256, hidden_sizes=[64, 80, 96], neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320],
                             expand_ratio=2.0, num_labels=1000, attn_implementation="eager")
    return MobileViTForImageClassification(config), torch.rand(1, 3, 256, 256)


def _wav2vec2() -> Tuple[Any, Any]:
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                            feat_extract_norm="group", do_stable_layer_norm=False, attn_implementation="eager")
    return Wav2Vec2Model(config), torch.randn(1, 16000)


def _crnn() -> Tuple[Any, Any]:
    import torch
    from torch import nn

    class CRNN(nn.Module):
        def __init__(self, classes: int = 37):
            super().__init__()
            self.convs = nn.Sequential(
                nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)))
            self.rnn = nn.LSTM(128 * 4, 128, bidirectional=True, batch_first=True)
            self.head = nn.Linear(256, classes)

        def forward(self, x):
            f = self.convs(x)                                   # (1, 128, 4, 32)
            seq = f.permute(0, 3, 1, 2).flatten(2)              # (1, 32, 512): one step per column
            out, _ = self.rnn(seq)
            return self.head(out).log_softmax(-1)

    return CRNN(), torch.rand(1, 1, 32, 128)


BUILDERS: Dict[str, Callable[[], Tuple[Any, Any]]] = {
    "efficientnet_b0": lambda: _torchvision("efficientnet_b0"),
    "mobilenet_v3_large": lambda: _torchvision("mobilenet_v3_large"),
    "mobilevit": _mobilevit,
    "wav2vec2": _wav2vec2,
    "crnn_dynquant": _crnn,
}


def export(name: str, folder: str):
    """(the family's ONNX model, its feeds): exported with random weights (seed 0), crnn_dynquant then quantized."""
    import onnx
    import torch

    torch.manual_seed(0)
    module, x = BUILDERS[name]()
    module = module.eval()
    path = os.path.join(folder, name + "_fp32.onnx")
    torch.onnx.export(module, (x,), path, dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["output"])
    if name == "crnn_dynquant":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantized = os.path.join(folder, name + ".onnx")
        quantize_dynamic(path, quantized, op_types_to_quantize=["Conv", "MatMul"], weight_type=QuantType.QInt8)
        path = quantized
    return onnx.load(path), {"input": x.numpy().astype(np.float32)}


def bench(name: str, folder: str, target: str, compare: dict, profile: int) -> dict:
    """One family's row (bench_model_kinds.measure)."""
    if name not in BUILDERS:
        raise SystemExit("unknown family %r (choose from %s)" % (name, ", ".join(FAMILIES)))
    model, feeds = export(name, folder)
    return measure({"model": name}, name, model, feeds, folder, target, compare, profile)


def main() -> None:
    ap = comparison_parser(__doc__.split("\n")[0], FAMILIES)
    ap.add_argument("--profile", type=int, default=0, help="print the N slowest kernels at 1 thread")
    args, compare = parse_comparison(ap)
    os.environ.setdefault("TETHER_OBJECT_CACHE", "0")
    ensure_torch(MODULES, PINS)

    def show(name: str, row: Dict[str, Any]) -> None:
        print(table_row(18, name, row, "ort", "max_rel_err"))
        for p in row.get("profile", []):
            print("    %8.3fms  %-40s %s" % (p["ms"], p["func"][:40], p["ops"][:80]))

    rows = run_table(args.models, table_header(18, "ort"),
                     lambda name, folder: bench(name, folder, args.target, compare, args.profile), show)
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
