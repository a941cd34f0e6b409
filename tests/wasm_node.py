"""Run wasm32 modules in node through the JS runtime's tools (bindings/js/tools/run_kernel.js, run_model.js), for
the wasm32 tests; read a .wasm's sections.

Arrays travel to and from node in params files (docs/params.md, written and read by tether_rpc.params), so what is
tested is the runtime's own loader, argument packing and graph executor. Every run has a timeout.
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
from tether_rpc.params import load_params, save_params

ROOT = pathlib.Path(__file__).resolve().parent.parent
JS_TOOLS = ROOT / "bindings" / "js" / "tools"
NODE_TIMEOUT_S = 600


class NodeToolError(AssertionError):
    """A node tool exited non-zero; ``str()`` is its one-line error (the runtime's message)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def require_node() -> str:
    """node on PATH and the JS runtime's tools in the tree (a skip on a developer's machine, a failure under CI)."""
    node = require_tool("node", "apt-get install nodejs")
    for tool in ("run_kernel.js", "run_model.js"):
        if not (JS_TOOLS / tool).is_file():
            unavailable("the JS runtime's %s (bindings/js/tools)" % tool, "it is part of this repository")
    return node


def _run_tool(tool: str, *args: str) -> None:
    proc = subprocess.run([require_node(), str(JS_TOOLS / tool)] + list(args), capture_output=True, text=True,
                          timeout=NODE_TIMEOUT_S)
    if proc.returncode != 0:
        raise NodeToolError((proc.stderr or proc.stdout).strip()[-3000:], proc.returncode)


def run_kernel(wasm: str, func: str, args: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Call ``func`` of the module ``wasm`` in node with ``args`` (inputs then outputs, as tether.build ordered
    them); every argument after the call (outputs are written in place). Raises NodeToolError with the runtime's
    message when the call fails."""
    with tempfile.TemporaryDirectory(prefix="tether-wasm-") as tmp:
        inp, out = os.path.join(tmp, "args.params"), os.path.join(tmp, "out.params")
        with open(inp, "wb") as fh:
            fh.write(save_params({str(k): np.ascontiguousarray(a) for k, a in enumerate(args)}))
        _run_tool("run_kernel.js", os.path.abspath(wasm), func, inp, out)
        got = load_params(out)
        return [np.array(got[str(k)]) for k in range(len(args))]


def run_model(folder: str, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """Run the compiled model folder (deploy.json, deploy.wasm, deploy.params) in node with the JS runtime's
    GraphExecutor on ``feeds``; its outputs, in order."""
    with tempfile.TemporaryDirectory(prefix="tether-wasm-") as tmp:
        inp, out = os.path.join(tmp, "inputs.params"), os.path.join(tmp, "outputs.params")
        with open(inp, "wb") as fh:
            fh.write(save_params({k: np.ascontiguousarray(v) for k, v in feeds.items()}))
        _run_tool("run_model.js", os.path.abspath(folder), inp, out)
        got = load_params(out)
        return [np.array(got[str(k)]) for k in range(len(got))]


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
