"""A compiled model folder (deploy.json, its library, deploy.params, as ``tether compile`` writes them), checked
before anything loads or uploads it.

A folder that is not one, or whose files are broken (JSON that does not parse or lacks the graph's lists, a
truncated params file, a library that is missing, not ELF (nor a wasm32 module for a remote JS device), or built
for another machine), raises
:class:`tether.errors.InvalidInput` naming the file and saying what was expected, instead of the error of
whichever loader first trips over it.
"""
from __future__ import annotations

import os
from typing import Any, Dict

from tether.errors import InvalidInput
from tether.json_input import read_json_file
from tether_rpc.errors import ModuleLoadError
from tether_rpc.graph_executor import GRAPH_FORMAT, GRAPH_VERSIONS
from tether_rpc.params import ParamsFormatError, load_params

GRAPH_LISTS = ("nodes", "entries", "inputs", "outputs", "params", "storages")
WRITTEN_BY = "as `tether compile` writes it"


def _read_graph(path: str) -> Dict[str, Any]:
    graph = read_json_file(path, "expected the graph JSON " + WRITTEN_BY)
    if not isinstance(graph, dict) or graph.get("format") != GRAPH_FORMAT:
        raise InvalidInput("%s is not a tether graph JSON (no \"format\": %r); expected the graph JSON %s"
                           % (path, GRAPH_FORMAT, WRITTEN_BY))
    if graph.get("version") not in GRAPH_VERSIONS:
        raise InvalidInput("%s has graph version %r; this tether reads versions %s"
                           % (path, graph.get("version"), ", ".join(str(v) for v in GRAPH_VERSIONS)))
    broken = [k for k in GRAPH_LISTS if not isinstance(graph.get(k), list)]
    if broken:
        raise InvalidInput("%s lacks the graph's %s (lists); expected the graph JSON %s"
                           % (path, ", ".join(broken), WRITTEN_BY))
    entries = graph["entries"]
    if not all(isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("shape"), list)
               and isinstance(e.get("dtype"), str) for e in entries):
        raise InvalidInput("%s has an entry without a name, shape and dtype" % path)
    for key in ("inputs", "outputs", "params"):
        bad = [i for i in graph[key] if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(entries)]
        if bad:
            raise InvalidInput("%s: %s names entries %s, but the graph has %d" % (path, key, bad[:4], len(entries)))
    return graph


def _check_params(path: str, graph: Dict[str, Any]) -> None:
    try:
        params = load_params(path)
    except ParamsFormatError as exc:
        raise InvalidInput("%s is not a valid params file (%s); expected the deploy.params %s"
                           % (path, exc, WRITTEN_BY)) from None
    for i in graph["params"]:
        e = graph["entries"][i]
        have = params.get(e["name"])
        if have is None:
            raise InvalidInput("%s has no param %r, which the graph JSON needs" % (path, e["name"]))
        if list(have.shape) != [int(d) for d in e["shape"]]:
            raise InvalidInput("%s: param %r has shape %s; the graph JSON says %s"
                               % (path, e["name"], list(have.shape), e["shape"]))


def _check_library(path: str, local: bool) -> None:
    from tether_rpc.elf import WASM_MAGIC, ElfFile
    from tether_rpc.module import inspect_module

    if not os.path.isfile(path):
        raise InvalidInput("%s is missing; expected the model's shared library %s" % (path, WRITTEN_BY))
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic == WASM_MAGIC:
        if local:
            raise InvalidInput("%s is a WebAssembly module (wasm32), built for a JS runtime (bindings/js); this "
                               "Python runtime loads ELF shared libraries: compile the model for this machine's "
                               "target" % path)
        return      # a wasm32 model folder, for a JS device: the device checks it
    if magic != b"\x7fELF":
        raise InvalidInput("%s is not an ELF file (it starts with %r); expected the model's shared library %s"
                           % (path, magic, WRITTEN_BY))
    try:
        if local:               # also its architecture, CPU features and metadata, against this host
            inspect_module(path)
        else:
            with ElfFile(path, name=path) as elf:
                if not elf.is_shared_object:
                    raise ModuleLoadError("%s is an ELF file but not a shared library" % path)
    except ModuleLoadError as exc:
        text, name = str(exc), os.path.basename(path)
        if path not in text:    # the runtime names the library by its file name: name the folder too
            text = text.replace(name, path, 1) if name in text else "%s: %s" % (path, text)
        raise InvalidInput(text) from None


def check_model_folder(folder: str, local: bool = False) -> Dict[str, Any]:
    """The graph JSON of the compiled model in ``folder``, once its files are checked. ``local``: the library
    must also load on this host (on a device, the device checks its architecture)."""
    if not os.path.isdir(folder):
        raise InvalidInput("%s is not a folder; expected a compiled model folder %s" % (folder, WRITTEN_BY))
    graph_path = os.path.join(folder, "deploy.json")
    if not os.path.isfile(graph_path):
        raise InvalidInput("%s has no deploy.json; expected a compiled model folder %s" % (folder, WRITTEN_BY))
    graph = _read_graph(graph_path)
    lib = graph.get("lib", "deploy.so")
    if not isinstance(lib, str) or os.path.basename(lib) != lib or not lib:
        raise InvalidInput("%s: \"lib\" must name a file in the folder, got %r" % (graph_path, lib))
    _check_library(os.path.join(folder, lib), local)
    params_path = os.path.join(folder, "deploy.params")
    if not os.path.isfile(params_path):
        raise InvalidInput("%s has no deploy.params; expected a compiled model folder %s" % (folder, WRITTEN_BY))
    _check_params(params_path, graph)
    return graph
