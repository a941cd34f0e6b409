"""What a WebAssembly binary's functions are made of: each function body decoded instruction by instruction
(the MVP, bulk memory, SIMD and relaxed SIMD, atomics and exception handling), counted by kind, so a benchmark can
say whether a kernel is vector code (``f32x4.mul``/``f32x4.add``) or scalar (``f32.mul``/``f32.add``).

    python scripts/wasm_bench/wasm_ops.py deploy.wasm [--top 20]

Names come from the exports, then from the ``name`` custom section. Standard library only.
"""
from __future__ import annotations

import argparse
import collections
import sys
from typing import Dict, List, Tuple

F32X4_ARITH = set(range(0xE0, 0xEC)) | set(range(0x67, 0x6B)) | {0x105, 0x106}   # abs..pmax, ceil..nearest, madd
F32X4_MUL_ADD = {0xE4, 0xE6, 0x105}                                               # add, mul, relaxed_madd
SIMD_MEMORY = set(range(0, 12)) | set(range(84, 94))                              # v128 loads/stores, lanes
F32_SCALAR_ARITH = set(range(0x8B, 0x99))                                          # f32.abs .. f32.copysign
F32_MUL_ADD = {0x92, 0x94}
VALTYPES = {0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F, 0x40}


class WasmFormatError(ValueError):
    pass


class _Reader:
    def __init__(self, data: bytes, pos: int = 0, end: int = -1):
        self.data, self.pos, self.end = data, pos, len(data) if end < 0 else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise WasmFormatError("unexpected end at byte %d" % self.pos)
        b = self.data[self.pos]
        self.pos += 1
        return b

    def u32(self) -> int:
        result, shift = 0, 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise WasmFormatError("LEB128 too long at byte %d" % self.pos)

    sleb = u32                      # only skipped here: the value is never needed, only its length

    def skip(self, n: int) -> None:
        self.pos += n
        if self.pos > self.end:
            raise WasmFormatError("unexpected end at byte %d" % self.pos)

    def name(self) -> str:
        n = self.u32()
        s = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.skip(n)
        return s


def _memarg(r: _Reader) -> None:
    align = r.u32()
    if align & 0x40:                # multi-memory: a memory index follows
        r.u32()
    r.u32()


def _blocktype(r: _Reader) -> None:
    if r.data[r.pos] in VALTYPES:
        r.pos += 1
    else:
        r.sleb()


def _count_body(r: _Reader, counts: collections.Counter) -> None:
    """Every instruction of one function body (up to r.end) into ``counts``: keys are opcodes (ints) for one-byte
    ones and (prefix, subopcode) for prefixed ones."""
    while r.pos < r.end:
        op = r.byte()
        if op in (0xFC, 0xFD, 0xFE):
            sub = r.u32()
            counts[(op, sub)] += 1
            if op == 0xFD:
                if sub in SIMD_MEMORY:
                    _memarg(r)
                    if 84 <= sub <= 91:
                        r.skip(1)   # lane
                elif sub in (12, 13):
                    r.skip(16)      # v128.const, i8x16.shuffle
                elif 21 <= sub <= 34:
                    r.skip(1)       # extract/replace lane
            elif op == 0xFC:
                if sub == 8:
                    r.u32()
                    r.skip(1)
                elif sub == 10:
                    r.skip(2)
                elif sub == 11:
                    r.skip(1)
                elif sub in (12, 14):
                    r.u32()
                    r.u32()
                elif sub in (9, 13, 15, 16, 17):
                    r.u32()
            else:                   # atomics
                if sub == 3:
                    r.skip(1)
                else:
                    _memarg(r)
            continue
        counts[op] += 1
        if op in (0x02, 0x03, 0x04, 0x06):
            _blocktype(r)
        elif op in (0x0C, 0x0D, 0x10, 0x12, 0x07, 0x08, 0x09, 0x18, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0xD2):
            r.u32()
        elif op == 0x0E:
            for _ in range(r.u32() + 1):
                r.u32()
        elif op in (0x11, 0x13):
            r.u32()
            r.u32()
        elif op == 0x1C:
            r.skip(r.u32())
        elif 0x28 <= op <= 0x3E:
            _memarg(r)
        elif op in (0x3F, 0x40, 0xD0):
            r.skip(1)
        elif op in (0x41, 0x42):
            r.sleb()
        elif op == 0x43:
            r.skip(4)
        elif op == 0x44:
            r.skip(8)
        elif op == 0x1F:            # try_table: block type, then catch clauses
            _blocktype(r)
            for _ in range(r.u32()):
                kind = r.byte()
                if kind in (0, 1):
                    r.u32()
                r.u32()


def function_ops(data: bytes) -> List[Tuple[str, collections.Counter]]:
    """(name, instruction counts) of every function defined in the module, in index order."""
    if data[:4] != b"\0asm":
        raise WasmFormatError("not a WebAssembly binary (it starts with %r)" % data[:4])
    r = _Reader(data, 8)
    imported_funcs, names, bodies = 0, {}, []
    while r.pos < len(data):
        sid, size = r.byte(), r.u32()
        end = r.pos + size
        s = _Reader(data, r.pos, end)
        if sid == 2:                # imports: function indices start after the imported functions
            for _ in range(s.u32()):
                s.name()
                s.name()
                kind = s.byte()
                if kind == 0:
                    imported_funcs += 1
                    s.u32()
                elif kind == 1:     # table: reftype + limits
                    s.byte()
                    flags = s.byte()
                    s.u32()
                    if flags & 1:
                        s.u32()
                elif kind == 2:     # memory: limits
                    flags = s.byte()
                    s.u32()
                    if flags & 1:
                        s.u32()
                elif kind == 3:     # global: valtype + mut
                    s.skip(2)
                elif kind == 4:     # tag
                    s.byte()
                    s.u32()
        elif sid == 7:
            for _ in range(s.u32()):
                nm, kind, idx = s.name(), s.byte(), s.u32()
                if kind == 0:
                    names.setdefault(idx, nm)
        elif sid == 0 and s.name() == "name":
            while s.pos < end:
                sub, sub_size = s.byte(), s.u32()
                sub_end = s.pos + sub_size
                if sub == 1:
                    for _ in range(s.u32()):
                        idx, nm = s.u32(), s.name()
                        names.setdefault(idx, nm)
                s.pos = sub_end
        elif sid == 10:
            for _ in range(s.u32()):
                body_size = s.u32()
                bodies.append((s.pos, s.pos + body_size))
                s.pos += body_size
        r.pos = end
    out = []
    for k, (start, end) in enumerate(bodies):
        b = _Reader(data, start, end)
        for _ in range(b.u32()):    # local declarations
            b.u32()
            b.byte()
        counts: collections.Counter = collections.Counter()
        _count_body(b, counts)
        idx = imported_funcs + k
        if b.pos != end:            # a decoding slip would run past the body: never count garbage silently
            raise WasmFormatError("function %d: decoding ended at byte %d, its body ends at %d" % (idx, b.pos, end))
        out.append((names.get(idx, "func[%d]" % idx), counts))
    return out


def summarize(counts: collections.Counter) -> Dict[str, int]:
    """The counts a kernel's vectorization shows in: all instructions, SIMD ones, f32x4 arithmetic, f32x4 mul/add,
    v128 loads/stores, scalar f32 arithmetic and scalar f32 mul/add."""
    def total(pred) -> int:
        return sum(n for k, n in counts.items() if pred(k))
    simd = lambda k: isinstance(k, tuple) and k[0] == 0xFD            # noqa: E731
    return {
        "instructions": sum(counts.values()),
        "simd": total(simd),
        "f32x4_arith": total(lambda k: simd(k) and k[1] in F32X4_ARITH),
        "f32x4_mul_add": total(lambda k: simd(k) and k[1] in F32X4_MUL_ADD),
        "v128_memory": total(lambda k: simd(k) and k[1] in SIMD_MEMORY),
        "f32_arith": total(lambda k: isinstance(k, int) and k in F32_SCALAR_ARITH),
        "f32_mul_add": total(lambda k: isinstance(k, int) and k in F32_MUL_ADD),
    }


def module_summary(data: bytes) -> Dict[str, int]:
    total: collections.Counter = collections.Counter()
    funcs = function_ops(data)
    for _, c in funcs:
        total.update(c)
    return dict(summarize(total), functions=len(funcs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wasm")
    ap.add_argument("--top", type=int, default=20, help="list the N functions with the most f32 arithmetic")
    args = ap.parse_args()
    with open(args.wasm, "rb") as fh:
        data = fh.read()
    try:
        funcs = [(n, summarize(c)) for n, c in function_ops(data)]
    except WasmFormatError as exc:
        print("%s: %s" % (args.wasm, exc), file=sys.stderr)
        return 1
    print("%d functions; module: %s" % (len(funcs), module_summary(data)))
    print("%-48s %8s %7s %8s %8s %8s %8s" % ("function", "instrs", "simd", "f32x4 ar", "f32x4 ma", "f32 ar", "f32 ma"))
    for name, s in sorted(funcs, key=lambda f: -(f[1]["f32x4_arith"] + f[1]["f32_arith"]))[:args.top]:
        print("%-48s %8d %7d %8d %8d %8d %8d" % (name[:48], s["instructions"], s["simd"], s["f32x4_arith"],
                                                  s["f32x4_mul_add"], s["f32_arith"], s["f32_mul_add"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
