"""Ahead-of-time model modules: a built model as one C function, ``<prefix>_run(inputs, outputs, workspace)``.

    factory = tether.build_graph(graph, params, target="rasp4b", executor="aot", name="model")
    factory.export("out/")     # out/model.h, out/libmodel.so, out/libmodel.a (+ out/model.params if external)

The graph JSON that ``build_graph`` writes for the Python executor (storages, entries at offsets, nodes with
their argument entries, per-node ``shapes`` and ``when`` guards) becomes generated C instead: one DLTensor per
node argument at the JSON's storage offsets, one direct call per kernel in the JSON's order, the run-time If
guards as plain ``if``s. The same memory plan and the same kernels (the very object of the graph build) run, so
the outputs equal the executor's bit for bit.

Why generated C and not LLVM IR: the entry is glue (tables, copies, a few ifs) that a reader of the generated
file should be able to follow, and C is what the header a user compiles against already is. It is compiled
freestanding (``-ffreestanding -nostdlib``, no libc, no compiler runtime) with ``zig cc`` (``tether.cc``) and
merged with the kernels' object, which already carries everything freestanding code needs (memcpy/memset, the
armv7 ``__aeabi_*`` helpers, the native thread pool), so the AOT library is as self-contained as the kernels'
.so: firmware or any libc links it. Every symbol but the API is then renamed ``<prefix>__...`` (``rename_symbols``)
so that two models link into one program, and the shared library exports the API only.

Memory: params live in one read-only blob (embedded in .rodata via ``.incbin``, or a file the caller maps and
hands to ``<prefix>_load_params``, checked by size and checksum); everything else in one workspace of
``<PREFIX>_WORKSPACE_SIZE`` bytes: a header, the DLTensor and argument tables (filled once per workspace and params
blob), then the storages at 64-byte aligned offsets. The workspace is the caller's (``<prefix>_workspace_init``
checks size and alignment) or, built with ``workspace="static"``, a static buffer used when the caller passes
NULL. A run allocates nothing.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tether_rpc.dtypes import DTYPES, storage_of

from tether import cc, link
from tether.errors import CompileError, UnsupportedOpError
from tether.graph import numpy_nodes
from tether.target import Target

PARAMS_MODES = ("embedded", "external")
WORKSPACE_MODES = ("static", "caller")
ALIGN = 64
HEADER_BYTES = 64
_MAGIC = 0x5445544845524157       # "TETHERAW": a workspace that <prefix>_workspace_init prepared

# error codes of every AOT library (the header's TETHER_AOT_* enum), with the message <prefix>_error_message gives
ERRORS: Tuple[Tuple[str, str], ...] = (
    ("OK", "ok"),
    ("NULL_ARGUMENT", "a required pointer argument is NULL"),
    ("WORKSPACE_UNINITIALIZED", "the workspace was not prepared by <prefix>_workspace_init (or was moved)"),
    ("WORKSPACE_TOO_SMALL", "the workspace is smaller than <PREFIX>_WORKSPACE_SIZE"),
    ("WORKSPACE_MISALIGNED", "the workspace is not aligned to <PREFIX>_WORKSPACE_ALIGN (64) bytes"),
    ("NO_WORKSPACE", "no workspace given and the library was built without a static one"),
    ("PARAMS_MISSING", "no params loaded: call <prefix>_load_params with the model's params file first"),
    ("PARAMS_SIZE", "the params blob has the wrong size (not this model's params file)"),
    ("PARAMS_CHECKSUM", "the params blob fails its checksum (corrupt, or another build's params file)"),
    ("PARAMS_MISALIGNED", "the params blob is not aligned to 8 bytes"),
    ("INPUT_SIZE", "an input buffer has the wrong size in bytes"),
    ("INPUT_SHAPE", "an input shape does not match the model's"),
    ("OUTPUT_SIZE", "an output buffer has the wrong size in bytes"),
    ("BAD_INDEX", "input or output index out of range"),
    ("KERNEL", "a kernel failed (see <prefix>_failed_node and <prefix>_kernel_code)"),
)

_C_TYPES = {"bool": "uint8_t", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
            "int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t",
            "float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float", "float64": "double"}


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def c_identifier(name: str) -> str:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return ident if ident and not ident[0].isdigit() else "_" + ident


def _c_string(s: str) -> str:
    return '"%s"' % "".join(c if 32 <= ord(c) < 127 and c not in '"\\?' else "\\%03o" % b
                            for c in s for b in (c.encode("utf-8") if ord(c) >= 127 else [ord(c)]))


def params_checksum(blob: bytes) -> int:
    """The checksum a params blob must have: sum of its little-endian 64-bit words times 2i+1, mod 2**64 (every
    changed word changes it; cheap on a board, vectorised here)."""
    words = np.frombuffer(blob, dtype="<u8")
    mult = np.arange(words.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int((words * mult).sum(dtype=np.uint64))


# ---------------------------------------------------------------------------------------------------- layout
@dataclass
class Layout:
    """Where every value lives: ``place[entry] = (in_params, byte offset)`` in the params blob or the workspace."""

    place: List[Tuple[bool, int]]
    params_blob: bytes
    workspace_size: int
    tensors_at: int
    values_at: int
    args: List[Tuple[int, Tuple[int, ...]]] = field(default_factory=list)   # (entry, kernel-view shape)


def plan_layout(graph_json: Dict[str, Any], params: Dict[str, np.ndarray], pointer_bytes: int) -> Layout:
    """The params blob and the workspace layout of ``graph_json`` (the storages and offsets of its memory plan)."""
    entries = graph_json["entries"]
    param_storages = {entries[i]["storage"] for i in graph_json["params"]}
    args: List[Tuple[int, Tuple[int, ...]]] = []
    for node in graph_json["nodes"]:
        shapes = node.get("shapes") or [None] * len(node["args"])
        for e, shp in zip(node["args"], shapes):
            shape = tuple(int(d) for d in (shp if shp is not None else entries[e]["shape"])) or (1,)
            args.append((e, shape))
    dltensor = 48 if pointer_bytes == 8 else 40
    tensors_at = HEADER_BYTES
    values_at = tensors_at + dltensor * len(args)
    pos = _align(values_at + 8 * len(args))
    storage_at: Dict[int, Tuple[bool, int]] = {}
    blob = bytearray()
    for sid, size in enumerate(graph_json["storages"]):
        if sid in param_storages:
            storage_at[sid] = (True, len(blob))
            blob += bytes(_align(int(size)))
        else:
            storage_at[sid] = (False, pos)
            pos += _align(max(int(size), 1))
    for i in graph_json["params"]:
        e = entries[i]
        at = storage_at[e["storage"]][1] + int(e.get("offset", 0))
        raw = np.ascontiguousarray(storage_of(np.asarray(params[e["name"]]))).tobytes()
        blob[at:at + len(raw)] = raw
    place = [(storage_at[e["storage"]][0], storage_at[e["storage"]][1] + int(e.get("offset", 0))) for e in entries]
    return Layout(place, bytes(blob), pos, tensors_at, values_at, args)


def _nbytes(entry: Dict[str, Any]) -> int:
    return int(np.prod(entry["shape"], dtype=np.int64)) * DTYPES[entry["dtype"]].bits // 8


# ---------------------------------------------------------------------------------------------------- checks
_NUMPY_REFUSAL = ("node %r (%s) runs as numpy on the device and cannot be compiled ahead of time: use the graph "
                  "executor (executor=\"graph\") for this model")


def check_aot_nodes(graph: Any) -> None:
    """Refuse a graph with numpy nodes before anything is compiled (``check_aot_graph`` checks the build too)."""
    for node in graph.nodes:
        if numpy_nodes.is_numpy(node):
            raise UnsupportedOpError(_NUMPY_REFUSAL % (node.name, node.op))


def check_aot_graph(graph_json: Dict[str, Any], metadata: Dict[str, Any]) -> None:
    """Refuse what generated code cannot run: numpy nodes, data-dependent shapes, host callbacks."""
    for node in graph_json["nodes"]:
        if "numpy" in node:
            raise UnsupportedOpError(_NUMPY_REFUSAL % (node.get("name"), node["numpy"]))
    dynamic = [e["name"] for e in graph_json["entries"] if e.get("dynamic")]
    if dynamic:
        raise UnsupportedOpError("value %r has a data-dependent shape and cannot be compiled ahead of time"
                                 % dynamic[0])
    if metadata.get("host_functions"):
        raise UnsupportedOpError("the model's kernels call host functions %s, which an ahead-of-time module has no "
                                 "host to call" % ", ".join(metadata["host_functions"]))


# ---------------------------------------------------------------------------------------------------- C sources
def _io(graph_json: Dict[str, Any], ids: Sequence[int]) -> List[Dict[str, Any]]:
    seen: Dict[str, int] = {}
    out = []
    for i in ids:
        e = graph_json["entries"][i]
        field_name = c_identifier(e["name"])
        if field_name in seen:
            seen[field_name] += 1
            field_name = "%s_%d" % (field_name, seen[field_name])
        else:
            seen[field_name] = 0
        out.append({"entry": i, "name": e["name"], "field": field_name, "shape": [int(d) for d in e["shape"]],
                    "dtype": e["dtype"], "nbytes": _nbytes(e), "ctype": _C_TYPES[e["dtype"]]})
    return out


def generate_header(prefix: str, graph_json: Dict[str, Any], layout: Layout, params_mode: str,
                    workspace_mode: str, target: Target) -> str:
    P, p = prefix.upper(), prefix
    ins, outs = _io(graph_json, graph_json["inputs"]), _io(graph_json, graph_json["outputs"])
    L: List[str] = [
        "/* %s.h: the ahead-of-time model %r for %s, generated by tether (docs/deploy.md)."
        % (p, graph_json["name"], target.preset or target.triple),
        " *",
        " *     static %s_inputs in = {...};  %s_outputs out = {...};" % (p, p),
        " *     int rc = %s_run(&in, &out, NULL);   // NULL: %s" % (
            p, "the library's static workspace" if workspace_mode == "static" else "refused, this build has no "
                                                                                  "static workspace"),
        " *     if (rc) fprintf(stderr, \"%%s\\n\", %s_error_message(rc));" % p,
        " *",
        " * Params: %s. Workspace: %s." % (
            "embedded in the library" if params_mode == "embedded" else
            "the file %s.params, mapped or read by the caller and passed to %s_load_params before the first run"
            % (p, p),
            "the caller's (%s_workspace_init) or, with NULL, a static buffer in the library" % p
            if workspace_mode == "static" else "the caller's, prepared by %s_workspace_init" % p),
        " * Not thread-safe on one workspace: concurrent runs need one workspace each. */",
        "#ifndef %s_AOT_H_" % P, "#define %s_AOT_H_" % P, "", "#include <stdint.h>", "",
        "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
        "#ifndef TETHER_AOT_ERRORS_", "#define TETHER_AOT_ERRORS_",
        "/* return codes of every tether AOT library */",
        "enum {",
    ]
    L += ["  TETHER_AOT_%s = %d," % (name, k) for k, (name, _) in enumerate(ERRORS)]
    L += ["};", "#endif", ""]
    L += ["#define %s_NUM_INPUTS %d" % (P, len(ins)), "#define %s_NUM_OUTPUTS %d" % (P, len(outs)),
          "#define %s_WORKSPACE_SIZE %dull" % (P, layout.workspace_size), "#define %s_WORKSPACE_ALIGN %d" % (P, ALIGN),
          "#define %s_PARAMS_SIZE %dull" % (P, len(layout.params_blob)),
          "#define %s_PARAMS_CHECKSUM 0x%016xull" % (P, params_checksum(layout.params_blob)),
          "#define %s_PARAMS_EXTERNAL %d" % (P, params_mode == "external"),
          "#define %s_STATIC_WORKSPACE %d" % (P, workspace_mode == "static"), ""]
    for kind, items in (("INPUT", ins), ("OUTPUT", outs)):
        for k, io in enumerate(items):
            L += ["/* %s %d: %s %s %s */" % (kind.lower(), k, io["name"], io["dtype"], io["shape"]),
                  "#define %s_%s%d_NAME %s" % (P, kind, k, _c_string(io["name"])),
                  "#define %s_%s%d_DTYPE \"%s\"" % (P, kind, k, io["dtype"]),
                  "#define %s_%s%d_NDIM %d" % (P, kind, k, len(io["shape"])),
                  "#define %s_%s%d_SHAPE {%s}" % (P, kind, k, ", ".join(str(d) for d in io["shape"]) or "1"),
                  "#define %s_%s%d_SIZE %d  /* elements */" % (P, kind, k, max(1, int(np.prod(io["shape"])))),
                  "#define %s_%s%d_NBYTES %d" % (P, kind, k, io["nbytes"])]
    L += ["", "/* one pointer per input / output, in the model's order (float16/bfloat16 as uint16_t bits) */",
          "typedef struct {"] + ["  const %s* %s;" % (io["ctype"], io["field"]) for io in ins] + (
        ["  char unused_;"] if not ins else []) + ["} %s_inputs;" % p, "typedef struct {"] + [
        "  %s* %s;" % (io["ctype"], io["field"]) for io in outs] + (["  char unused_;"] if not outs else []) + [
        "} %s_outputs;" % p, ""]
    L += [
        "/* Run the model: copies the inputs in, runs every kernel, copies the outputs out. workspace: one prepared",
        " * by %s_workspace_init, or NULL for the static one (if built with it). 0 or a TETHER_AOT_* code. */" % p,
        "int %s_run(const %s_inputs* inputs, %s_outputs* outputs, void* workspace);" % (p, p, p),
        "/* The same with arrays of pointers in the model's order; with non-NULL byte-size arrays every buffer's",
        " * size is checked first (TETHER_AOT_INPUT_SIZE / TETHER_AOT_OUTPUT_SIZE). */",
        "int %s_run_arrays(const void* const* inputs, const uint64_t* input_nbytes, void* const* outputs," % p,
        "                  const uint64_t* output_nbytes, void* workspace);",
        "/* Check `size` bytes at `memory` (aligned to %s_WORKSPACE_ALIGN, at least %s_WORKSPACE_SIZE) and prepare" % (
            P, P),
        " * them as a workspace. The memory stays the caller's; nothing is allocated. */",
        "int %s_workspace_init(void* memory, uint64_t size);" % p,
        "uint64_t %s_workspace_size(void);" % p,
        "/* Use the params blob at `data` (%s.params, %s bytes, 8-byte aligned: mmap or read it) from now on; it" % (
            p, P + "_PARAMS_SIZE"),
        " * must stay valid while the model runs. Checked by size and checksum. */",
        "int %s_load_params(const void* data, uint64_t size);" % p,
        "/* A readable message for a return code (never NULL). */",
        "const char* %s_error_message(int code);" % p,
        "/* After TETHER_AOT_KERNEL: the node whose kernel failed, and the kernel's code (docs/abi.md). */",
        "const char* %s_failed_node(void);" % p,
        "int32_t %s_kernel_code(void);" % p,
        "/* Threads: n > 1 lets the kernels' parallel loops use the native pool, whose workers are threads the",
        " * caller owns: each calls %s_thread_worker(), which serves until %s_threads_stop(). n <= 1: serial." % (
            p, p),
        " * threads_stop stops the workers inside thread_worker at that moment: wait for %s_num_workers() to count" % p,
        " * them first (a thread that enters later serves on). */",
        "int %s_set_num_threads(int n);" % p,
        "void %s_thread_worker(void);" % p,
        "void %s_threads_stop(void);" % p,
        "int %s_num_workers(void);  /* threads currently inside %s_thread_worker */" % (p, p),
        "/* Introspection, for generic callers (C FFIs of Rust, Go, Python...) */",
        "int %s_num_inputs(void);" % p, "int %s_num_outputs(void);" % p,
        "const char* %s_input_name(int index);" % p, "const char* %s_output_name(int index);" % p,
        "const char* %s_input_dtype(int index);" % p, "const char* %s_output_dtype(int index);" % p,
        "int %s_input_ndim(int index);" % p, "int %s_output_ndim(int index);" % p,
        "const int64_t* %s_input_shape(int index);" % p, "const int64_t* %s_output_shape(int index);" % p,
        "uint64_t %s_input_nbytes(int index);" % p, "uint64_t %s_output_nbytes(int index);" % p,
        "/* 0 when `shape` (ndim dims) fits input `index` (the same element count and the same dims, size-1 dims",
        " * aside), else TETHER_AOT_INPUT_SHAPE (or TETHER_AOT_BAD_INDEX / TETHER_AOT_NULL_ARGUMENT). */",
        "int %s_check_input_shape(int index, const int64_t* shape, int ndim);" % p,
        "", "#ifdef __cplusplus", "}", "#endif", "#endif /* %s_AOT_H_ */" % P, ""]
    return "\n".join(L)


def api_symbols(prefix: str) -> List[str]:
    """The functions every AOT library exports (and nothing else)."""
    names = ["run", "run_arrays", "workspace_init", "workspace_size", "load_params", "error_message", "failed_node",
             "kernel_code", "set_num_threads", "thread_worker", "threads_stop", "num_workers", "num_inputs",
             "num_outputs", "input_name", "output_name", "input_dtype", "output_dtype", "input_ndim", "output_ndim",
             "input_shape", "output_shape", "input_nbytes", "output_nbytes", "check_input_shape"]
    return ["%s_%s" % (prefix, n) for n in names]


def _flag_test(in_params: bool, offset: int, dtype: str, truth: bool) -> str:
    base = "params" if in_params else "ws"
    ctype = _C_TYPES[dtype]
    if dtype == "float16":   # the executor reads bool(value): -0.0 is false
        value = "((*(const uint16_t*)(%s + %d) & 0x7fffu) != 0)" % (base, offset)
    else:                    # bfloat16 entries are uint16 bit patterns to the executor too
        value = "(*(const %s*)(%s + %d) != 0)" % (ctype, base, offset)
    return value if truth else "!" + value


def generate_source(prefix: str, graph_json: Dict[str, Any], layout: Layout, params_mode: str,
                    workspace_mode: str, params_path: Optional[str], pointer_bytes: int) -> str:
    p = prefix
    entries = graph_json["entries"]
    ins, outs = _io(graph_json, graph_json["inputs"]), _io(graph_json, graph_json["outputs"])
    funcs = sorted({n["func"] for n in graph_json["nodes"]})
    shape_pool: List[int] = []
    shape_at: Dict[Tuple[int, ...], int] = {}

    def shape_index(shape: Sequence[int]) -> int:
        key = tuple(int(d) for d in shape)
        if key not in shape_at:
            shape_at[key] = len(shape_pool)
            shape_pool.extend(key)
        return shape_at[key]

    arg_rows = []
    for e, shape in layout.args:
        in_params, off = layout.place[e]
        dt = DTYPES[entries[e]["dtype"]]
        arg_rows.append("  {%dull, %d, %d, %d, %d, %d}," % (off, shape_index(shape), int(in_params), len(shape),
                                                              dt.dl_code, dt.bits))
    io_shapes = {}
    for io in ins + outs:
        io_shapes[(io["entry"], len(io["shape"]))] = shape_index(io["shape"] or [1])
    max_args = max([len(n["args"]) for n in graph_json["nodes"]] + [1])
    L: List[str] = [
        "/* Generated by tether for the ahead-of-time model %r (%s.h). Freestanding: no libc. */" % (
            graph_json["name"], p),
        "#include <stddef.h>", "#include <stdint.h>", '#include "tether_module.h"', '#include "%s.h"' % p, "",
        "_Static_assert(sizeof(DLTensor) == %d, \"DLTensor layout\");" % (48 if pointer_bytes == 8 else 40),
        "_Static_assert(sizeof(TetherValue) == 8, \"TetherValue layout\");", "",
        "#define NUM_ARGS %d" % len(layout.args), "#define TENSORS_AT %d" % layout.tensors_at,
        "#define VALUES_AT %d" % layout.values_at,
        "#define MAGIC 0x%xull" % _MAGIC, "",
    ]
    L += ["int32_t %s(const TetherValue* args, const int32_t* type_codes, int32_t num_args);" % f for f in funcs]
    L += ["", "typedef struct { uint64_t offset; uint32_t shape; uint8_t in_params, ndim, code, bits; } arg_desc;",
          "static const arg_desc ARGS[%d] = {" % max(1, len(arg_rows))] + (arg_rows or ["  {0, 0, 0, 0, 0, 0},"]) + [
          "};", "static const int64_t SHAPES[%d] = {%s};" % (max(1, len(shape_pool)),
                                                             ", ".join(str(d) for d in shape_pool) or "0"),
          "static const int32_t CODES[%d] = {%s};" % (max_args, ", ".join(["TETHER_DLTENSOR"] * max_args)), ""]
    # params
    if params_mode == "embedded":
        L += ["/* the params blob, %d bytes, straight from the build's file */" % len(layout.params_blob),
              "extern const uint8_t params_blob_[] __attribute__((visibility(\"hidden\")));",
              "__asm__(\".section .rodata.tether_params,\\\"a\\\"\\n.balign 64\\n.globl params_blob_\\n"
              ".hidden params_blob_\\nparams_blob_:\\n.incbin %s\\n.byte 0\\n.text\\n\");"
              % _c_string(params_path).replace("\\", "\\\\").replace('"', '\\"'),
              "static const uint8_t* g_params = params_blob_;"]
    else:
        L += ["static const uint8_t* g_params = 0;"]
    if workspace_mode == "static":
        L += ["static uint8_t g_static_ws[%d] __attribute__((aligned(%d)));" % (layout.workspace_size, ALIGN)]
    L += ["static const char* g_failed_node = \"\";", "static int32_t g_kernel_code = 0;", ""]
    L += ["static const char* const ERRORS[%d] = {" % len(ERRORS)] + [
        "  %s," % _c_string(msg.replace("<prefix>", p).replace("<PREFIX>", p.upper())) for _, msg in ERRORS] + ["};"]
    L += ["const char* %s_error_message(int code) {" % p,
          "  if (code >= 0 && code < %d) return ERRORS[code];" % len(ERRORS),
          "  return \"unknown error code\";", "}",
          "const char* %s_failed_node(void) { return g_failed_node; }" % p,
          "int32_t %s_kernel_code(void) { return g_kernel_code; }" % p,
          "uint64_t %s_workspace_size(void) { return %dull; }" % (p, layout.workspace_size), ""]
    # io tables
    for kind, items in (("input", ins), ("output", outs)):
        n = len(items)
        L += ["static const char* const %s_NAMES[%d] = {%s};" % (kind.upper(), max(n, 1), ", ".join(
                  _c_string(io["name"]) for io in items) or "0"),
              "static const char* const %s_DTYPES[%d] = {%s};" % (kind.upper(), max(n, 1), ", ".join(
                  '"%s"' % io["dtype"] for io in items) or "0"),
              "static const int32_t %s_NDIM[%d] = {%s};" % (kind.upper(), max(n, 1), ", ".join(
                  str(len(io["shape"])) for io in items) or "0"),
              "static const uint32_t %s_SHAPE[%d] = {%s};" % (kind.upper(), max(n, 1), ", ".join(
                  str(io_shapes[(io["entry"], len(io["shape"]))]) for io in items) or "0"),
              "static const uint64_t %s_NBYTES[%d] = {%s};" % (kind.upper(), max(n, 1), ", ".join(
                  "%dull" % io["nbytes"] for io in items) or "0"),
              "static const uint64_t %s_AT[%d] = {%s};" % (kind.upper(), max(n, 1), ", ".join(
                  "%dull" % layout.place[io["entry"]][1] for io in items) or "0"),
              "static const uint8_t %s_IN_PARAMS[%d] = {%s};" % (kind.upper(), max(n, 1), ", ".join(
                  str(int(layout.place[io["entry"]][0])) for io in items) or "0"),
              "int %s_num_%ss(void) { return %d; }" % (p, kind, n),
              "const char* %s_%s_name(int i) { return i >= 0 && i < %d ? %s_NAMES[i] : 0; }" % (p, kind, n,
                                                                                               kind.upper()),
              "const char* %s_%s_dtype(int i) { return i >= 0 && i < %d ? %s_DTYPES[i] : 0; }" % (p, kind, n,
                                                                                                 kind.upper()),
              "int %s_%s_ndim(int i) { return i >= 0 && i < %d ? %s_NDIM[i] : -1; }" % (p, kind, n, kind.upper()),
              "const int64_t* %s_%s_shape(int i) { return i >= 0 && i < %d ? SHAPES + %s_SHAPE[i] : 0; }" % (
                  p, kind, n, kind.upper()),
              "uint64_t %s_%s_nbytes(int i) { return i >= 0 && i < %d ? %s_NBYTES[i] : 0; }" % (p, kind, n,
                                                                                               kind.upper()), ""]
    L += [
        "int %s_check_input_shape(int index, const int64_t* shape, int ndim) {" % p,
        "  if (index < 0 || index >= %d) return TETHER_AOT_BAD_INDEX;" % len(ins),
        "  if (!shape && ndim > 0) return TETHER_AOT_NULL_ARGUMENT;",
        "  const int64_t* want = SHAPES + INPUT_SHAPE[index];",
        "  int wn = INPUT_NDIM[index], i = 0, j = 0;",
        "  for (;;) {  /* the same dims, size-1 dims aside (the executor's rule) */",
        "    while (i < ndim && shape[i] == 1) i++;",
        "    while (j < wn && want[j] == 1) j++;",
        "    if (i == ndim || j == wn) return i == ndim && j == wn ? TETHER_AOT_OK : TETHER_AOT_INPUT_SHAPE;",
        "    if (shape[i] != want[j]) return TETHER_AOT_INPUT_SHAPE;",
        "    i++; j++;", "  }", "}", "",
        "static void copy_bytes(uint8_t* dst, const uint8_t* src, uint64_t n) {",
        "  for (uint64_t i = 0; i < n; i++) dst[i] = src[i];", "}", "",
        "typedef struct { uint64_t magic; void* self; const uint8_t* params; uint64_t size; } ws_header;", "",
        "/* the DLTensor and argument tables of `ws` for the params at g_params */",
        "static void fill_tables(uint8_t* ws) {",
        "  DLTensor* t = (DLTensor*)(ws + TENSORS_AT);",
        "  TetherValue* v = (TetherValue*)(ws + VALUES_AT);",
        "  for (int k = 0; k < NUM_ARGS; k++) {",
        "    const arg_desc* a = &ARGS[k];",
        "    t[k].data = (void*)((a->in_params ? (uint8_t*)g_params : ws) + a->offset);",
        "    t[k].device.device_type = kDLCPU; t[k].device.device_id = 0;",
        "    t[k].ndim = a->ndim;",
        "    t[k].dtype.code = a->code; t[k].dtype.bits = a->bits; t[k].dtype.lanes = 1;",
        "    t[k].shape = (int64_t*)(SHAPES + a->shape);",
        "    t[k].strides = 0; t[k].byte_offset = 0;",
        "    v[k].v_handle = &t[k];", "  }",
        "  ((ws_header*)ws)->params = g_params;", "}", "",
        "int %s_workspace_init(void* memory, uint64_t size) {" % p,
        "  if (!memory) return TETHER_AOT_NULL_ARGUMENT;",
        "  if ((uintptr_t)memory %% %d) return TETHER_AOT_WORKSPACE_MISALIGNED;" % ALIGN,
        "  if (size < %dull) return TETHER_AOT_WORKSPACE_TOO_SMALL;" % layout.workspace_size,
        "  uint8_t* ws = (uint8_t*)memory;",
        "  for (uint64_t i = 0; i < %dull; i++) ws[i] = 0;  /* storages start zeroed, as the executor's */" % (
            layout.workspace_size),
        "  ws_header* h = (ws_header*)ws;",
        "  h->magic = MAGIC; h->self = ws; h->size = size;",
        "  fill_tables(ws);",
        "  return TETHER_AOT_OK;", "}", "",
        "static int prepare(void* workspace, uint8_t** out) {",
    ]
    if workspace_mode == "static":
        L += ["  if (!workspace) {",
              "    workspace = g_static_ws;",
              "    if (((ws_header*)workspace)->magic != MAGIC) {",
              "      int rc = %s_workspace_init(workspace, sizeof g_static_ws);" % p,
              "      if (rc) return rc;", "    }", "  }"]
    else:
        L += ["  if (!workspace) return TETHER_AOT_NO_WORKSPACE;"]
    L += ["  if ((uintptr_t)workspace %% %d) return TETHER_AOT_WORKSPACE_MISALIGNED;" % ALIGN,
          "  ws_header* h = (ws_header*)workspace;",
          "  if (h->magic != MAGIC || h->self != workspace) return TETHER_AOT_WORKSPACE_UNINITIALIZED;",
          "  if (h->size < %dull) return TETHER_AOT_WORKSPACE_TOO_SMALL;" % layout.workspace_size,
          "  if (!g_params) return TETHER_AOT_PARAMS_MISSING;",
          "  if (h->params != g_params) fill_tables((uint8_t*)workspace);",
          "  *out = (uint8_t*)workspace;", "  return TETHER_AOT_OK;", "}", "",
          "int %s_load_params(const void* data, uint64_t size) {" % p,
          "  if (!data) return TETHER_AOT_NULL_ARGUMENT;",
          "  if ((uintptr_t)data % 8) return TETHER_AOT_PARAMS_MISALIGNED;",
          "  if (size != %s_PARAMS_SIZE) return TETHER_AOT_PARAMS_SIZE;" % p.upper(),
          "  const uint64_t* w = (const uint64_t*)data;",
          "  uint64_t sum = 0;",
          "  for (uint64_t i = 0; i < size / 8; i++) sum += w[i] * (2 * i + 1);",
          "  if (sum != %s_PARAMS_CHECKSUM) return TETHER_AOT_PARAMS_CHECKSUM;" % p.upper(),
          "  g_params = (const uint8_t*)data;",
          "  return TETHER_AOT_OK;", "}", "",
          "int %s_set_num_threads(int n) {" % p,
          "  tether_set_parallel_launcher(n > 1 ? tether_pool_launch : 0);",
          "  return TETHER_AOT_OK;", "}",
          "void %s_thread_worker(void) { tether_pool_worker(); }" % p,
          "void %s_threads_stop(void) { tether_pool_shutdown(); }" % p,
          "int %s_num_workers(void) { return tether_pool_num_workers(); }" % p, "",
          "static int failed(const char* node, int32_t rc) {",
          "  g_failed_node = node; g_kernel_code = rc;", "  return TETHER_AOT_KERNEL;", "}", "",
          "/* the graph's nodes in order: one kernel call each, the run-time If guards as ifs */",
          "static int run_nodes(uint8_t* ws) {",
          "  const TetherValue* v = (const TetherValue*)(ws + VALUES_AT);",
          "  const uint8_t* params = g_params;", "  (void)params;", "  int32_t rc;"]
    k = 0
    for node in graph_json["nodes"]:
        call = "if ((rc = %s(v + %d, CODES, %d)) != 0) return failed(%s, rc);" % (
            node["func"], k, len(node["args"]), _c_string(node.get("name", node["func"])))
        k += len(node["args"])
        when = node.get("when")
        if when:
            cond = " && ".join(_flag_test(layout.place[e][0], layout.place[e][1], entries[e]["dtype"], bool(t))
                               for e, t in when)
            L += ["  if (%s) {" % cond, "    " + call, "  }"]
        else:
            L.append("  " + call)
    L += ["  return TETHER_AOT_OK;", "}", "",
          "int %s_run_arrays(const void* const* inputs, const uint64_t* input_nbytes, void* const* outputs," % p,
          "                  const uint64_t* output_nbytes, void* workspace) {",
          "  uint8_t* ws;",
          "  int rc = prepare(workspace, &ws);", "  if (rc) return rc;",
          "  if ((%d && !inputs) || (%d && !outputs)) return TETHER_AOT_NULL_ARGUMENT;" % (len(ins), len(outs)),
          "  for (int i = 0; i < %d; i++) {" % len(ins),
          "    if (!inputs[i]) return TETHER_AOT_NULL_ARGUMENT;",
          "    if (input_nbytes && input_nbytes[i] != INPUT_NBYTES[i]) return TETHER_AOT_INPUT_SIZE;", "  }",
          "  for (int i = 0; i < %d; i++) {" % len(outs),
          "    if (!outputs[i]) return TETHER_AOT_NULL_ARGUMENT;",
          "    if (output_nbytes && output_nbytes[i] != OUTPUT_NBYTES[i]) return TETHER_AOT_OUTPUT_SIZE;", "  }",
          "  for (int i = 0; i < %d; i++)" % len(ins),
          "    copy_bytes(ws + INPUT_AT[i], (const uint8_t*)inputs[i], INPUT_NBYTES[i]);",
          "  rc = run_nodes(ws);", "  if (rc) return rc;",
          "  for (int i = 0; i < %d; i++)" % len(outs),
          "    copy_bytes((uint8_t*)outputs[i], (OUTPUT_IN_PARAMS[i] ? g_params : ws) + OUTPUT_AT[i], "
          "OUTPUT_NBYTES[i]);",
          "  return TETHER_AOT_OK;", "}", "",
          "int %s_run(const %s_inputs* inputs, %s_outputs* outputs, void* workspace) {" % (p, p, p),
          "  if (!inputs || !outputs) return TETHER_AOT_NULL_ARGUMENT;",
          "  const void* in[%d] = {%s};" % (max(1, len(ins)), ", ".join(
              "inputs->%s" % io["field"] for io in ins) or "0"),
          "  void* out[%d] = {%s};" % (max(1, len(outs)), ", ".join(
              "outputs->%s" % io["field"] for io in outs) or "0"),
          "  return %s_run_arrays(in, 0, out, 0, workspace);" % p, "}", ""]
    return "\n".join(L)


# ---------------------------------------------------------------------------------------------------- building
def _entry_target(tgt: Target) -> List[str]:
    """zig cc target arguments for the freestanding entry: the kernels' architecture and float ABI (any libc
    name does: nothing of it is used)."""
    if not tgt.is_android:
        return cc.zig_target(tgt, "musl")
    if tgt.arch == "aarch64":
        return ["-target", "aarch64-linux-musl"]
    return ["-target", "arm-linux-musleabi", "-mcpu=generic+v7a+vfp3d16"]


# freestanding: no libc, no stack protector or sanitizer runtime, no unwind tables (armv7 EHABI would want
# __aeabi_unwind_cpp_pr0 from a C runtime), no debug info (zig cc's default)
ENTRY_FLAGS = ("-O2", "-g0", "-ffreestanding", "-fno-builtin", "-nostdlib", "-fno-stack-protector",
               "-fno-sanitize=undefined", "-fno-unwind-tables", "-fno-asynchronous-unwind-tables", "-fPIC", "-std=c11",
               "-Wall", "-Werror", "-Wno-unused-function", "-Wno-unused-const-variable")


def compile_entry(source: str, header: str, prefix: str, tgt: Target, folder: str) -> bytes:
    """The generated C compiled freestanding into an object for `tgt` (zig cc)."""
    src = os.path.join(folder, "%s_aot.c" % prefix)
    with open(src, "w", encoding="utf-8") as fh:
        fh.write(source)
    with open(os.path.join(folder, "%s.h" % prefix), "w", encoding="utf-8") as fh:
        fh.write(header)
    out = os.path.join(folder, "%s_aot.o" % prefix)
    include = os.path.dirname(os.path.abspath(link.__file__))
    argv = [cc.find_zig(), "cc"] + _entry_target(tgt) + list(ENTRY_FLAGS) + [
        "-I" + folder, "-I" + os.path.join(include, "include"), "-c", src, "-o", out]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=cc.CC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CompileError("zig cc did not compile the AOT entry of %s within %.0fs" % (prefix, cc.CC_TIMEOUT_S)) \
            from None
    if proc.returncode != 0:
        raise CompileError("compiling the AOT entry of %s failed: %s\n%s" % (prefix, " ".join(argv),
                                                                            (proc.stderr or proc.stdout).strip()))
    with open(out, "rb") as fh:
        return fh.read()


@dataclass
class AotModule:
    """An ahead-of-time model: the header, one relocatable object (entry + kernels, internal symbols renamed), the
    shared library linked from it and, for external params, the params blob."""

    prefix: str
    target: Target
    header: str
    source: str
    object_bytes: bytes
    shared_bytes: bytes
    params_blob: bytes
    params_mode: str
    workspace_mode: str
    workspace_size: int
    graph_factory: Any                 # the graph build it was generated from (same kernels, same memory plan)

    @property
    def graph(self) -> Any:
        return self.graph_factory.graph

    @property
    def params(self) -> Dict[str, np.ndarray]:
        return self.graph_factory.params

    @property
    def kernel_count(self) -> int:
        return self.graph_factory.kernel_count

    @property
    def timings(self) -> Dict[str, float]:
        return self.graph_factory.timings

    def export(self, folder: str) -> Dict[str, str]:
        """Write ``<prefix>.h``, ``lib<prefix>.so``, ``lib<prefix>.a`` and, for external params,
        ``<prefix>.params`` into `folder` (created if needed)."""
        os.makedirs(folder, exist_ok=True)
        p = self.prefix
        paths = {"header": os.path.join(folder, "%s.h" % p), "so": os.path.join(folder, "lib%s.so" % p),
                 "static": os.path.join(folder, "lib%s.a" % p)}
        with open(paths["header"], "w", encoding="utf-8") as fh:
            fh.write(self.header)
        with open(paths["so"], "wb") as fh:
            fh.write(self.shared_bytes)
        member = (p[:13] if len(p) <= 13 else "model") + ".o"
        link.write_archive([(member, self.object_bytes, api_symbols(p))], paths["static"])
        if self.params_mode == "external":
            paths["params"] = os.path.join(folder, "%s.params" % p)
            with open(paths["params"], "wb") as fh:
                fh.write(self.params_blob)
        return paths


def build_aot(factory: Any, params_mode: str = "embedded", workspace_mode: str = "static") -> AotModule:
    """The AOT module of a graph build (``graph.build.build_graph``'s GraphFactory): its prefix is the build's
    name. UnsupportedOpError for what only the graph executor runs (numpy nodes)."""
    if params_mode not in PARAMS_MODES:
        raise ValueError("AOT params must be one of %s, got %r" % (", ".join(PARAMS_MODES), params_mode))
    if workspace_mode not in WORKSPACE_MODES:
        raise ValueError("AOT workspace must be one of %s, got %r" % (", ".join(WORKSPACE_MODES), workspace_mode))
    graph_json, tgt, lib = factory.graph_json, factory.target, factory.lib
    prefix = graph_json["lib"][:-len(".so")]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix):
        raise ValueError("an AOT model's name is its C prefix and must be a C identifier, got %r" % prefix)
    check_aot_graph(graph_json, lib.metadata)
    layout = plan_layout(graph_json, factory.params, tgt.pointer_bytes)
    header = generate_header(prefix, graph_json, layout, params_mode, workspace_mode, tgt)
    with tempfile.TemporaryDirectory(prefix="tether-aot-") as tmp:
        blob_path = os.path.join(tmp, "params.bin")
        with open(blob_path, "wb") as fh:
            fh.write(layout.params_blob)
        source = generate_source(prefix, graph_json, layout, params_mode, workspace_mode, blob_path,
                                 tgt.pointer_bytes)
        entry = compile_entry(source, header, prefix, tgt, tmp)
        merged = link.link_relocatable([lib.object_bytes, entry], tgt)
        keep = api_symbols(prefix)
        obj, undefined = link.rename_symbols(merged, keep, prefix + "__")
        undefined = [u for u in undefined if u != "_GLOBAL_OFFSET_TABLE_"]
        if undefined:
            raise CompileError("the AOT object of %s needs %s, which nothing defines (it must be self-contained)"
                               % (prefix, ", ".join(sorted(undefined))))
        script = os.path.join(tmp, "exports.map")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write("{\n  global:\n%s\n  local: *;\n};\n" % "\n".join("    %s;" % s for s in keep))
        so_path = link.link_shared([obj], tgt, os.path.join(tmp, "lib%s.so" % prefix),
                                   flags=["--version-script", script])
        with open(so_path, "rb") as fh:
            shared = fh.read()
    return AotModule(prefix, tgt, header, source, obj, shared, layout.params_blob, params_mode, workspace_mode,
                     layout.workspace_size, factory)
