"""`tether targets`' int8 column (tether.target.int8_instructions) names what the int8 code of each target really
contains: every instruction it lists for a preset (and a few x86 CPUs) shows in the disassembly of that target's
te.dot4 kernels and widened byte_of products (codegen/int8dot.py), the load-time ones of android-arm64 included,
and none it omits does."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tether
from tether.target import PRESET_NAMES, int8_instructions

# instruction text of the column -> what its presence looks like in the assembly
PATTERNS = {
    "vpdpbusd (AVX512-VNNI)": [r"\bvpdpbusd\b[^\n]*%zmm"],
    "vpdpbusd (AVX-VNNI)": [r"\{vex\}\s*vpdpbusd\b"],
    "vpmaddwd (AVX512BW)": [r"\bvpmaddwd\b[^\n]*%zmm"],
    "vpmaddwd (AVX2)": [r"\bvpmaddwd\b[^\n]*%ymm"],
    "pmaddwd (SSE2)": [r"\bv?pmaddwd\b[^\n]*%xmm"],
    "sdot/udot (dotprod)": [r"\bsdot\s+v\d+\.4s", r"\budot\s+v\d+\.4s"],
    "smull/umull+saddlp/uaddlp (NEON)": [r"\bsmull2?\s+v\d+\.8h", r"\bumull2?\s+v\d+\.8h", r"\bsaddlp\s+v\d+\.4s",
                                          r"\buaddlp\s+v\d+\.4s"],
    "smlal by element (NEON; dot4: smull/umull+saddlp/uaddlp)": [r"\bsmlal2?\s+v\d+\.4s, v\d+\.[48]h, v\d+\.h\[\d\]",
                                                                  r"\bsmull2?\s+v\d+\.8h", r"\bsaddlp\s+v\d+\.4s"],
    "ushll/sshll+mul+saddlp (NEON, u8 x s8)": [r"\bushll\s+v\d+\.8h", r"\bsshll\s+v\d+\.8h", r"\bmul\s+v\d+\.8h",
                                               r"\bsaddlp\s+v\d+\.4s"],
    "vmull+vpaddl (NEON)": [r"\bvmull\.s8\b", r"\bvmull\.u8\b", r"\bvpaddl\.[su]16\b"],
    "i16x8.extend+i32x4.dot_i16x8_s (SIMD128)": [r"\bi16x8\.extend_(?:low|high)_i8x16_[su]\b",
                                                 r"\bi32x4\.dot_i16x8_s\b"],
    "mul/add (scalar)": [],
}
X86_CPUS = ("x86_64-linux-gnu -mcpu=icelake-server", "x86_64-linux-gnu -mcpu=alderlake",
            "x86_64-linux-gnu -mcpu=skylake-avx512")


def _dot4_asm(target: str) -> str:
    from test_int8_dot import _reduction, _widened_case
    funcs = [tether.lower(*_reduction(kind, 32, 9, factor), name="r_%s_%d" % (kind, factor))
             for kind in ("u8s8", "s8s8", "u8u8") for factor in (16, 4, 2, 1)]
    funcs.append(tether.lower(*_widened_case(False, 32, 9, 16, np.random.default_rng(0))[:2], name="widened"))
    return tether.build(funcs, target=target, name="col", jobs=1).get_source("asm")


@pytest.mark.parametrize("target", PRESET_NAMES + X86_CPUS)
def test_every_instruction_of_the_int8_column_is_in_the_code(target):
    listed = [insns for insns, _ in int8_instructions(target)]
    asm = _dot4_asm(target)
    for insns in listed:
        for pattern in PATTERNS[insns]:
            assert re.search(pattern, asm), (target, insns, pattern)
    # and what the column does not list is not there
    if not any(i.startswith("vpdpbusd") for i in listed):
        assert "vpdpbusd" not in asm
    if not any(i.startswith("sdot") for i in listed):
        assert not re.search(r"\b[su]dot\b", asm)
    assert not re.search(r"\bv?pmaddubsw\b", asm)
