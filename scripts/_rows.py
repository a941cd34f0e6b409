"""How the benchmark scripts hand on their rows: the ``--json`` option, the file it names, and the geometric mean
of a ratio that closes their tables."""
from __future__ import annotations

import argparse
import json
from typing import Iterable, List, Optional, Sequence

import numpy as np


def add_json_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", help="also write the rows as JSON here")


def write_rows(path: Optional[str], rows: list) -> None:
    """``rows`` as indented JSON in ``path``; nothing when no ``--json`` was given."""
    if path:
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=1)


def geometric_mean(ratios: Iterable[float]) -> float:
    """The mean of ratios (tether / a reference) that weighs a 2x gain and a 2x loss alike."""
    return float(np.exp(np.mean(np.log(list(ratios)))))


def print_ratio_means(rows: List[dict], threads: Sequence[int] = (1, 2)) -> None:
    """The closing lines of a tether-against-onnxruntime table: the geometric mean of each ``ratio_<N>t`` column."""
    if rows:
        for t in threads:
            print("geometric mean ratio at %d thread(s): %.2fx (tether / onnxruntime)"
                  % (t, geometric_mean(r["ratio_%dt" % t] for r in rows)))
