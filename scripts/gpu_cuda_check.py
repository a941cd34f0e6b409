#!/usr/bin/env python3
"""The check of tether's CUDA path on a machine with an NVIDIA GPU: PTX from tether.codegen.ptx, loaded and run
by tether_rpc.gpu.cuda.CudaDevice, results compared with numpy; prints one row per kernel, exits 1 on a mismatch.

A GPU machine may have no network and no llvmlite, so the PTX can be built beforehand where tether is installed:

    python scripts/gpu_cuda_check.py --prepare build/gpu_cuda_check        # here: writes PTX + launch info
    python scripts/gpu_cuda_check.py --ptx-dir build/gpu_cuda_check        # there: python3 + numpy only

Without ``--ptx-dir`` it builds the PTX in process (needs tether and llvmlite). ``--arch`` picks the PTX target
(default sm_80; the driver JIT-compiles PTX for its own GPU, a newer one included).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "rpc_server")]

MATH = ("exp", "tanh", "erf", "sigmoid", "sin", "log")
_erf = np.vectorize(math.erf)


def _math_ref(x):
    return np.concatenate([np.exp(x), np.tanh(x), _erf(x), 1 / (1 + np.exp(-x)), np.sin(x), np.log(np.abs(x))])


# name -> params (name, shape, dtype, input generator or None for an output), scalars, reference of the outputs
SPECS = {
    "vadd": dict(params=[("A", (1024,), "float32", "normal"), ("B", (1024,), "float32", "normal"),
                         ("C", (1024,), "float32", None)], scalars=[1000],
                 ref=lambda a, b: {"C": np.concatenate([a[:1000] + b[:1000], np.zeros(24, np.float32)])}),
    "block_sum": dict(params=[("A", (1024,), "float32", "normal"), ("R", (4,), "float32", None)], scalars=[],
                      ref=lambda a: {"R": a.reshape(4, 256).sum(1, dtype=np.float64)}),
    "matmul_tiled": dict(params=[("A", (64 * 64,), "float32", "normal"), ("B", (64 * 64,), "float32", "normal"),
                                 ("C", (64 * 64,), "float32", None)], scalars=[],
                         ref=lambda a, b: {"C": (a.reshape(64, 64).astype(np.float64)
                                                 @ b.reshape(64, 64).astype(np.float64)).ravel()}),
    "math": dict(params=[("X", (256,), "float32", "wide"), ("Y", (256 * len(MATH),), "float32", None)],
                 scalars=[], ref=lambda x: {"Y": _math_ref(x.astype(np.float64))}),
    "int_ops": dict(params=[("A", (256,), "int32", "ints"), ("F", (256,), "float32", "wide"),
                            ("O", (256 * 3,), "int32", None)], scalars=[7],
                    ref=lambda a, f: {"O": np.concatenate([a // 7, a % 7, np.trunc(f).astype(np.int32)])}),
}


def build_kernel(name: str):
    """The DeviceKernel of one check (imports tether: only where the PTX is built)."""
    from tether.tir import (Allocate, Binary, Buffer, Call, Cast, Compare, Const, For, IfThenElse, Load, Store, Var,
                            seq)
    from tether.tir.device import Barrier, DeviceKernel

    def c(v):
        return Const(v, "int32")

    def add(a, b):
        return Binary("add", a, b)

    def mul(a, b):
        return Binary("mul", a, b)

    bufs = [Buffer(p, shape, dt) for p, shape, dt, _ in SPECS[name]["params"]]
    bx, by, tx, ty = Var("bx"), Var("by"), Var("tx"), Var("ty")
    f32 = "float32"
    if name == "vadd":
        A, B, C = bufs
        n = Var("n")
        i = add(mul(bx, c(128)), tx)
        body = IfThenElse(Compare("lt", i, n), Store(C, i, Binary("add", Load(A, i), Load(B, i))))
        return DeviceKernel(name, bufs, body, {bx: "blockIdx.x", tx: "threadIdx.x"}, (8, 1, 1), (128, 1, 1), [n])
    if name == "block_sum":
        A, R = bufs
        S = Buffer("S", (256,), f32, "shared")
        steps = [Store(S, tx, Load(A, add(mul(bx, c(256)), tx))), Barrier()]
        for half in (128, 64, 32, 16, 8, 4, 2, 1):
            steps += [IfThenElse(Compare("lt", tx, c(half)),
                                 Store(S, tx, Binary("add", Load(S, tx), Load(S, add(tx, c(half)))))), Barrier()]
        steps.append(IfThenElse(Compare("eq", tx, c(0)), Store(R, bx, Load(S, c(0)))))
        return DeviceKernel(name, bufs, Allocate(S, seq(*steps)), {bx: "blockIdx.x", tx: "threadIdx.x"},
                            (4, 1, 1), (256, 1, 1))
    if name == "matmul_tiled":
        A, B, C = bufs
        As, Bs = Buffer("As", (256,), f32, "shared"), Buffer("Bs", (256,), f32, "shared")
        acc = Buffer("acc", (1,), f32, "local")
        t, k = Var("t"), Var("k")
        row, col = add(mul(by, c(16)), ty), add(mul(bx, c(16)), tx)
        tile = seq(Store(As, add(mul(ty, c(16)), tx), Load(A, add(mul(row, c(64)), add(mul(t, c(16)), tx)))),
                   Store(Bs, add(mul(ty, c(16)), tx), Load(B, add(mul(add(mul(t, c(16)), ty), c(64)), col))),
                   Barrier(),
                   For(k, c(0), c(16), "serial", Store(acc, c(0), Binary("add", Load(acc, c(0)), Binary(
                       "mul", Load(As, add(mul(ty, c(16)), k)), Load(Bs, add(mul(k, c(16)), tx)))))),
                   Barrier())
        body = Allocate(As, Allocate(Bs, Allocate(acc, seq(
            Store(acc, c(0), Const(0.0, f32)), For(t, c(0), c(4), "serial", tile),
            Store(C, add(mul(row, c(64)), col), Load(acc, c(0)))))))
        return DeviceKernel(name, bufs, body, {bx: "blockIdx.x", by: "blockIdx.y", tx: "threadIdx.x",
                                               ty: "threadIdx.y"}, (4, 4, 1), (16, 16, 1))
    if name == "math":
        X, Y = bufs
        x = Load(X, tx)
        args = {"log": Call("abs", [x], f32)}
        body = seq(*[Store(Y, add(tx, c(256 * j)), Call(fn, [args.get(fn, x)], f32)) for j, fn in enumerate(MATH)])
        return DeviceKernel(name, bufs, body, {tx: "threadIdx.x"}, (1, 1, 1), (256, 1, 1))
    if name == "int_ops":
        A, F, O = bufs
        d = Var("d")
        body = seq(Store(O, tx, Binary("floordiv", Load(A, tx), d)),
                   Store(O, add(tx, c(256)), Binary("floormod", Load(A, tx), d)),
                   Store(O, add(tx, c(512)), Cast("int32", Load(F, tx))))
        return DeviceKernel(name, bufs, body, {tx: "threadIdx.x"}, (1, 1, 1), (256, 1, 1), [d])
    raise KeyError(name)


def build_all(arch: str):
    """name -> (PTX text, launch_info) for every check."""
    from tether.codegen.ptx import ptx_module

    out = {}
    for name in SPECS:
        k = build_kernel(name)
        out[name] = (ptx_module([k], arch=arch), k.launch_info())
    return out


def inputs(name: str):
    rng = np.random.default_rng(0)
    gen = {"normal": lambda s, dt: rng.standard_normal(s).astype(dt),
           "wide": lambda s, dt: rng.uniform(-6, 6, s).astype(dt),
           "ints": lambda s, dt: rng.integers(-50, 50, s).astype(dt)}
    return [(p, gen[g](shape, dt) if g else np.zeros(shape, dt)) for p, shape, dt, g in SPECS[name]["params"]]


def run(built, device) -> bool:
    ok_all = True
    print("%-14s %-10s %-12s %-10s" % ("kernel", "result", "max error", "device ms"))
    for name, (ptx, info) in built.items():
        spec = SPECS[name]
        arrays = inputs(name)
        try:
            program = device.load(ptx.encode("utf-8"), [info])
            bufs = []
            for _, a in arrays:
                b = device.alloc(a.nbytes)
                device.upload(b, a)
                bufs.append(b)
            args = bufs + list(spec["scalars"])
            device.launch(program, name, args, tuple(info["grid"]), tuple(info["block"]))
            device.synchronize()
            seconds = device.timed(program, name, args, tuple(info["grid"]), tuple(info["block"]))
            want = spec["ref"](*[a for (_, a), p in zip(arrays, spec["params"]) if p[3] is not None])
            worst = 0.0
            for (pname, a), b in zip(arrays, bufs):
                if pname not in want:
                    continue
                got = np.empty_like(a)
                device.download(b, got)
                exp = want[pname]
                err = float(np.max(np.abs(got.astype(np.float64) - exp) / (1 + np.abs(exp))))
                worst = max(worst, err)
            for b in bufs:
                device.free(b)
            ok = worst <= (0 if arrays[-1][1].dtype.kind == "i" else 5e-5)
            print("%-14s %-10s %-12.3g %-10.4f" % (name, "ok" if ok else "MISMATCH", worst, seconds * 1e3))
        except Exception as exc:   # one row per kernel: the table goes on after a failure
            ok = False
            print("%-14s %-10s %-12s %-10s %s" % (name, "ERROR", "-", "-", str(exc).splitlines()[0][:200]))
        ok_all &= ok
    return ok_all


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_80")
    ap.add_argument("--prepare", metavar="DIR", help="only build the PTX into DIR (no GPU needed)")
    ap.add_argument("--ptx-dir", metavar="DIR", help="run the PTX prepared in DIR instead of building it")
    ap.add_argument("--device", type=int, default=0)
    opts = ap.parse_args()
    if opts.prepare:
        os.makedirs(opts.prepare, exist_ok=True)
        table = {}
        for name, (ptx, info) in build_all(opts.arch).items():
            with open(os.path.join(opts.prepare, name + ".ptx"), "w") as f:
                f.write(ptx)
            table[name] = info
        with open(os.path.join(opts.prepare, "kernels.json"), "w") as f:
            json.dump({"arch": opts.arch, "kernels": table}, f, indent=1)
        print("wrote %d kernels for %s to %s" % (len(table), opts.arch, opts.prepare))
        return 0
    if opts.ptx_dir:
        with open(os.path.join(opts.ptx_dir, "kernels.json")) as f:
            table = json.load(f)["kernels"]
        built = {}
        for name, info in table.items():
            with open(os.path.join(opts.ptx_dir, name + ".ptx")) as f:
                built[name] = (f.read(), info)
    else:
        built = build_all(opts.arch)
    from tether_rpc.gpu.cuda import CudaDevice

    t0 = time.time()
    device = CudaDevice(opts.device)
    try:
        info = device.info()
        print("device: %s (%s, %s, %d SMs, %.1f GiB)" % (info["name"], info["arch"], info["driver"],
                                                         info["compute_units"], info["memory_bytes"] / 2 ** 30))
        ok = run(built, device)
    finally:
        device.close()
    print("%s in %.1f s" % ("all kernels match numpy" if ok else "MISMATCHES", time.time() - t0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
