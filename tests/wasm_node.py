"""Run wasm32 modules in node through the JS runtime (bindings/js), for the wasm32 tests; read a .wasm's sections.

Each run writes a job (JSON plus raw little-endian tensor files) into a temporary folder and starts one node
process on a small ES-module driver that imports bindings/js/src/runtime.js (and graph.js for whole models), so
what is tested is the runtime's own loader, argument packing and graph executor. Every run has a timeout.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
from fixtures.prereq import require_tool, unavailable

ROOT = pathlib.Path(__file__).resolve().parent.parent
JS_SRC = ROOT / "bindings" / "js" / "src"
NODE_TIMEOUT_S = 600

_KERNEL_DRIVER = r"""
import fs from "node:fs";
const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const rt = await import(job.runtime);
const result = {calls: []};
try {
  const mod = await rt.loadModule(new Uint8Array(fs.readFileSync(job.wasm)), {name: job.name});
  result.metadata = mod.metadata;
  result.functions = mod.functions;
  for (const call of job.calls) {
    const arrays = call.args.map((a) => {
      const x = rt.empty(a.shape, a.dtype);
      if (a.file) x.copyFrom(new Uint8Array(fs.readFileSync(a.file)));
      return x;
    });
    try {
      mod.getFunction(call.func)(...arrays);
      call.args.forEach((a, i) => { if (a.out) fs.writeFileSync(a.out, arrays[i].bytes()); });
      result.calls.push({ok: true});
    } catch (e) {
      result.calls.push({error: String(e && e.message || e)});
    }
  }
} catch (e) {
  result.error = String(e && e.message || e);
}
fs.writeFileSync(job.result, JSON.stringify(result));
"""

_MODEL_DRIVER = r"""
import fs from "node:fs";
const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const rt = await import(job.runtime);
const {GraphExecutor} = await import(job.graph);
const result = {};
try {
  const json = fs.readFileSync(job.folder + "/deploy.json", "utf8");
  const lib = JSON.parse(json).lib;
  const mod = await rt.loadModule(new Uint8Array(fs.readFileSync(job.folder + "/" + lib)), {name: lib});
  const params = new Uint8Array(fs.readFileSync(job.folder + "/deploy.params"));
  const gx = new GraphExecutor(json, mod, params);
  for (const inp of job.inputs) {
    const x = rt.empty(inp.shape, inp.dtype);
    x.copyFrom(new Uint8Array(fs.readFileSync(inp.file)));
    gx.setInput(inp.name, x);
  }
  gx.run();
  result.outputs = [];
  for (let i = 0; i < gx.numOutputs; i++) {
    const out = gx.getOutput(i);
    const file = job.prefix + i + ".bin";
    fs.writeFileSync(file, out.bytes());
    result.outputs.push({file, shape: Array.from(out.shape, Number), dtype: out.dtype});
  }
} catch (e) {
  result.error = String(e && e.stack || e);
}
fs.writeFileSync(job.result, JSON.stringify(result));
"""


def require_node() -> str:
    """node on PATH and the JS runtime in the tree (a skip on a developer's machine, a failure under CI)."""
    node = require_tool("node", "apt-get install nodejs")
    if not (JS_SRC / "runtime.js").is_file() or not (JS_SRC / "graph.js").is_file():
        unavailable("the JS runtime (bindings/js/src/runtime.js, graph.js)", "it is part of this repository")
    return node


def _run_driver(source: str, job: Dict[str, Any], folder: str) -> Dict[str, Any]:
    node = require_node()
    driver = os.path.join(folder, "driver.mjs")
    with open(driver, "w", encoding="utf-8") as fh:
        fh.write(source)
    job = dict(job, runtime=(JS_SRC / "runtime.js").as_uri(), graph=(JS_SRC / "graph.js").as_uri(),
               result=os.path.join(folder, "result.json"))
    job_path = os.path.join(folder, "job.json")
    with open(job_path, "w", encoding="utf-8") as fh:
        json.dump(job, fh)
    proc = subprocess.run([node, driver, job_path], capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    if proc.returncode != 0 or not os.path.isfile(job["result"]):
        raise AssertionError("node failed (exit %d):\n%s" % (proc.returncode, (proc.stderr or proc.stdout)[-3000:]))
    with open(job["result"], encoding="utf-8") as fh:
        return json.load(fh)


def _tensor_file(folder: str, name: str, a: np.ndarray) -> Dict[str, Any]:
    path = os.path.join(folder, name + ".bin")
    np.ascontiguousarray(a).tofile(path)
    return {"file": path, "shape": [int(d) for d in a.shape], "dtype": str(a.dtype)}


def run_kernels(wasm: str, calls: Sequence[Tuple[str, Sequence[np.ndarray], Sequence[Tuple[tuple, str]]]]
                ) -> Tuple[Dict[str, Any], List[Any]]:
    """Load ``wasm`` in node and make ``calls``: (function, input arrays, output (shape, dtype)s). Returns the
    runtime's view of the module (metadata, functions, or error) and per call the output arrays or the error
    text the runtime raised."""
    with tempfile.TemporaryDirectory(prefix="tether-wasm-") as tmp:
        job_calls, outs = [], []
        for c, (func, inputs, out_specs) in enumerate(calls):
            args = [_tensor_file(tmp, "c%di%d" % (c, k), a) for k, a in enumerate(inputs)]
            specs = []
            for k, (shape, dtype) in enumerate(out_specs):
                path = os.path.join(tmp, "c%do%d.bin" % (c, k))
                args.append({"out": path, "shape": [int(d) for d in shape], "dtype": dtype})
                specs.append((path, tuple(shape), dtype))
            job_calls.append({"func": func, "args": args})
            outs.append(specs)
        res = _run_driver(_KERNEL_DRIVER, {"wasm": os.path.abspath(wasm), "name": os.path.basename(wasm),
                                           "calls": job_calls}, tmp)
        results: List[Any] = []
        for call, specs in zip(res.get("calls", []), outs):
            if "error" in call:
                results.append(call["error"])
            else:
                results.append([np.fromfile(p, dtype=np.dtype(d)).reshape(s) for p, s, d in specs])
        return res, results


def run_model(folder: str, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """Run the compiled model folder (deploy.json, deploy.wasm, deploy.params) in node with the JS runtime's
    GraphExecutor on ``feeds``; its outputs, in order."""
    with tempfile.TemporaryDirectory(prefix="tether-wasm-") as tmp:
        inputs = [dict(_tensor_file(tmp, "in%d" % k, a), name=name) for k, (name, a) in enumerate(feeds.items())]
        res = _run_driver(_MODEL_DRIVER, {"folder": os.path.abspath(folder), "inputs": inputs,
                                          "prefix": os.path.join(tmp, "out")}, tmp)
        if "error" in res:
            raise AssertionError("the JS graph executor failed: %s" % res["error"])
        return [np.fromfile(o["file"], dtype=np.dtype(o["dtype"])).reshape(o["shape"]) for o in res["outputs"]]


# ---- the binary (a reader independent of the JS runtime, for the contract's structural checks) ----------------
def _uleb(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _name(data: bytes, pos: int) -> Tuple[str, int]:
    n, pos = _uleb(data, pos)
    return data[pos:pos + n].decode("utf-8"), pos + n


def wasm_sections(data: bytes) -> List[Tuple[int, str, bytes]]:
    """(section id, custom section name or "", payload) of every section of a WebAssembly binary."""
    assert data[:8] == b"\0asm\x01\0\0\0", "not a WebAssembly 1.0 binary: %r" % data[:8]
    pos, out = 8, []
    while pos < len(data):
        sid = data[pos]
        size, pos = _uleb(data, pos + 1)
        body = data[pos:pos + size]
        assert len(body) == size, "truncated section %d" % sid
        name = ""
        if sid == 0:
            name, start = _name(body, 0)
            body = body[start:]
        out.append((sid, name, body))
        pos += size
    return out


def wasm_imports_and_exports(data: bytes) -> Tuple[List[str], Dict[str, int]]:
    """The imports ("module.name") and the exports (name -> kind: 0 function, 2 memory, 3 global) of a binary."""
    imports: List[str] = []
    exports: Dict[str, int] = {}
    for sid, _, body in wasm_sections(data):
        if sid == 2:
            n, pos = _uleb(body, 0)
            for _ in range(n):
                mod, pos = _name(body, pos)
                name, pos = _name(body, pos)
                imports.append("%s.%s" % (mod, name))
                break   # (the kinds' descriptions vary in length; that there is one is what counts)
        elif sid == 7:
            n, pos = _uleb(body, 0)
            for _ in range(n):
                name, pos = _name(body, pos)
                kind = body[pos]
                _, pos = _uleb(body, pos + 1)
                exports[name] = kind
    return imports, exports


def wasm_metadata(data: bytes) -> Dict[str, Any]:
    (meta,) = [body for sid, name, body in wasm_sections(data) if sid == 0 and name == "tether_meta"]
    assert b"\0" not in meta
    return json.loads(meta.decode("utf-8"))
