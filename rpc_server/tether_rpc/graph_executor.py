"""The graph executor: runs a compiled model (graph JSON + module + params) on the device.

One code path for every caller: ``tether.graph_executor.load("out/")`` on the host uses this class directly,
and the RPC session exposes it through the built-ins in ``BUILTINS`` (``tether.graph.create``, ...).

The graph JSON (written by ``tether.build_graph``, described in docs/graph.md) lists storages (byte sizes),
entries (a typed view of a storage: name, shape, dtype, storage id and, from version 2, a byte offset), the
input/output/param entries and the nodes (a packed function of the module and its argument entries, inputs
then output). Entries at offsets are how a concat costs nothing: its inputs are slices of its output. At creation
every node is bound once to numpy views of its storages (``PackedFunc.bind``), so ``run()`` is one ctypes call per node.

A GPU module's graph (a module with a ``gpu`` program) keeps its activations in device memory as well
(``gpu/graph_memory.py``): GPU nodes are bound to device buffers, the nodes the host runs (CPU kernels, numpy
nodes) to the host arrays, params are uploaded once when loaded, and a run copies its inputs in, its outputs out,
and the values that cross between a GPU node and a host node, as planned at creation (docs/gpu.md "Models on GPUs").
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, Union

import numpy as np

from . import numpy_ops
from . import params as params_format
from .dtypes import WIRE_DTYPES, bfloat16_bits, bfloat16_to_float32, for_host, name_of, numpy_dtype, storage_of
from . import timing

log = logging.getLogger(__name__)

GRAPH_FORMAT = "tether-graph"
GRAPH_VERSION = 2
# versions this runtime reads: 1 (every entry at the start of its storage), 2 (entries may carry "offset"),
# 3 (numpy nodes and data-dependent entries: numpy_ops.py)
GRAPH_VERSIONS = (1, 2, 3)
#: The most memory a graph's storages may claim together (deploy.json is uploaded, so it is checked before any
#: allocation): 4 GiB, the bulk limit, far above what a model for a small board needs.
MAX_STORAGE_BYTES = 4 << 30
ALIGN = 64


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(max(nbytes, 1) + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + max(nbytes, 1)]


def _kernel_view(arr: np.ndarray) -> np.ndarray:
    # kernels never take rank-0 tensors: a scalar travels as shape (1,)
    return arr.reshape(1) if arr.ndim == 0 else arr


def _bfloat16_source(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """What ``set_input`` copies into a bfloat16 entry: bfloat16 (tagged or ml_dtypes) and uint16 arrays as bit
    patterns, float arrays rounded to nearest even. Into any other entry a bfloat16 array goes as its float32
    values (never as the bit patterns' integers)."""
    if name_of(dst.dtype) != "bfloat16":
        return bfloat16_to_float32(src) if name_of(src.dtype) == "bfloat16" else src
    if src.dtype.kind == "f" and name_of(src.dtype) != "bfloat16":
        return bfloat16_bits(src)
    src = storage_of(src)
    if src.dtype != np.uint16:
        raise ValueError("a bfloat16 input takes bfloat16, uint16 bit patterns or float values, got %s"
                         % name_of(src.dtype))
    return src


class GraphExecutor:
    """A model ready to run: set_input / run / get_output, plus benchmark and per-node profile."""

    def __init__(self, graph: Union[str, bytes, Dict[str, Any]], module: Any,
                 params: Union[None, bytes, str, Mapping[str, np.ndarray]] = None, max_bytes: int = MAX_STORAGE_BYTES):
        """Check the graph (JSON text or its decoded dict) against ``module`` and allocate its storages (at most
        ``max_bytes`` together). A malformed graph raises ValueError; a node whose arrays do not fit its function,
        KernelError (from the module)."""
        try:
            self._setup(graph, module, max_bytes)
        except (KeyError, IndexError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            # the graph is untrusted input (an uploaded deploy.json): any shape it has must end in one error type
            raise ValueError("malformed graph JSON: %s: %s" % (type(exc).__name__, exc)) from exc
        if params is not None:
            self.load_params(params)

    def _setup(self, graph: Union[str, bytes, Dict[str, Any]], module: Any, max_bytes: int) -> None:
        if isinstance(graph, (bytes, str)):
            graph = json.loads(graph)
        if not isinstance(graph, dict) or graph.get("format") != GRAPH_FORMAT:
            raise ValueError("not a tether graph JSON (format %r)" % (graph.get("format") if isinstance(graph, dict)
                                                                      else type(graph).__name__))
        if graph.get("version") not in GRAPH_VERSIONS:
            raise ValueError("graph JSON version %r; this runtime reads versions %s (update the device runtime)"
                             % (graph.get("version"), ", ".join(str(v) for v in GRAPH_VERSIONS)))
        self.graph = graph
        self.module = module
        self.owns_module = False
        sizes = [int(n) for n in graph["storages"]]
        if any(n < 0 for n in sizes) or sum(sizes) > max_bytes:
            raise ValueError("graph storages of %s bytes: sizes must be >= 0 and total at most %d"
                             % (sizes[:8], max_bytes))
        self._storages = [_aligned(n) for n in sizes]
        self._entries: List[np.ndarray] = []
        # entry id -> the array a numpy node last produced, for entries whose shape is data-dependent
        self._dynamic: Dict[int, np.ndarray] = {}
        for k, e in enumerate(graph["entries"]):
            if e["dtype"] not in WIRE_DTYPES:
                raise ValueError("graph entry %d has dtype %.40r (allowed: %s)"
                                 % (k, e["dtype"], ", ".join(sorted(WIRE_DTYPES))))
            dt = numpy_dtype(e["dtype"])     # bfloat16: tagged uint16 bit patterns
            shape = tuple(int(d) for d in e["shape"])
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            store = self._storages[int(e["storage"])]
            offset = int(e.get("offset", 0))
            # kernels assume element alignment only (docs/abi.md), so an offset must be a whole element
            if offset < 0 or offset % dt.itemsize:
                raise ValueError("graph entry %d (%s): offset %d is not a multiple of its element size %d"
                                 % (k, e.get("name"), offset, dt.itemsize))
            if offset + nbytes > store.nbytes:
                raise ValueError("graph entry %d (%s) needs bytes %d..%d, its storage has %d"
                                 % (k, e.get("name"), offset, offset + nbytes, store.nbytes))
            self._entries.append(store[offset:offset + nbytes].view(dt).reshape(shape))
            if e.get("dynamic"):
                self._dynamic[k] = np.zeros((0,) * len(shape), dt)
        self.input_names = [graph["entries"][i]["name"] for i in graph["inputs"]]
        self.output_names = [graph["entries"][i]["name"] for i in graph["outputs"]]
        self._param_index = {graph["entries"][i]["name"]: i for i in graph["params"]}
        self._nodes: List[Dict[str, Any]] = []
        self._calls: List[Callable[[], None]] = []
        self._whens: List[Optional[List[Tuple[np.ndarray, bool]]]] = []
        self._device_memory: Any = None
        self._after_run: List[Tuple[str, int]] = []
        self._inputs_read_on_host: Set[int] = set()
        if getattr(module, "gpu", None) is not None:
            self._setup_gpu(graph, module, sizes)
            self._steps = list(zip(self._calls, self._whens))
            return
        for node in graph["nodes"]:
            if "numpy" in node:
                self._nodes.append(node)
                self._calls.append(numpy_ops.bind_node(node, self._entries, self._dynamic))
                self._whens.append(self._guard(node))
                continue
            func = module[node["func"]]
            args = [_kernel_view(self._entries[i]) for i in node["args"]]
            if "shapes" in node:    # same bytes, the kernel's view (e.g. NCHW conv input as a matrix)
                args = [a.reshape(tuple(int(d) for d in shp)) for a, shp in zip(args, node["shapes"])]
            self._nodes.append(node)
            self._calls.append(func.bind(*args))
            self._whens.append(self._guard(node))
        self._steps = self._sequenced(module)

    def _sequenced(self, module: Any) -> List[Tuple[Callable[[], None], Optional[List[Tuple[np.ndarray, bool]]]]]:
        """What a run does, in order: each stretch of unguarded kernel calls as one native call of the module's
        call list (Module.sequence), numpy nodes and guarded nodes on their own. Per kernel that saves the
        interpreter's loop and a ctypes call, more than a small kernel's own work on a board's core."""
        steps: List[Tuple[Callable[[], None], Optional[List[Tuple[np.ndarray, bool]]]]] = []
        stretch: List[Callable[[], None]] = []
        sequence = getattr(module, "sequence", None)
        for node, call, when in zip(self._nodes, self._calls, self._whens):
            if sequence is not None and when is None and "numpy" not in node:
                stretch.append(call)
                continue
            if stretch:
                steps.append((sequence(stretch), None))
                stretch = []
            steps.append((call, when))
        if stretch:
            steps.append((sequence(stretch), None))
        return steps

    def _setup_gpu(self, graph: Dict[str, Any], module: Any, sizes: List[int]) -> None:
        """Bind a GPU module's nodes: GPU functions to device views of the storages, host functions and numpy
        nodes to the host arrays, each node preceded by its planned copies (its guard tested after them)."""
        from .gpu.graph_memory import DeviceStorages, bind_launches, node_access, plan_copies

        gpu_functions = module.gpu.functions
        on_gpu = [("numpy" not in node and node["func"] in gpu_functions) for node in graph["nodes"]]
        used = {int(graph["entries"][int(i)]["storage"]) for node, gpu in zip(graph["nodes"], on_gpu) if gpu
                for i in node["args"]}
        mem = DeviceStorages(module.gpu.device, sizes, self._entries, graph["entries"], sorted(used))
        self._device_memory = mem
        before, self._after_run = plan_copies(graph["nodes"], on_gpu, mem.storage_of, graph["inputs"],
                                              graph["params"], graph["outputs"], list(self._dynamic))
        self._copies_before = before
        # inputs a host node (or the caller, as an output) reads: a device array set there comes down too
        host_reads = set()
        for node, gpu in zip(graph["nodes"], on_gpu):
            reads = node_access(node)[0]
            flags = len(node.get("when") or [])    # (a guard's flags are tested on the host)
            host_reads.update(int(i) for i in (reads if not gpu else reads[len(reads) - flags:] if flags else []))
        # (by storage: a node may read an input through a reshape, a view of the same bytes)
        storage = mem.storage_of
        on_host = {storage[e] for e in host_reads} | {storage[int(o)] for o in graph["outputs"]}
        self._inputs_read_on_host = {int(e) for e in graph["inputs"] if storage[int(e)] in on_host}
        for node, gpu, copies in zip(graph["nodes"], on_gpu, before):
            if "numpy" in node:
                call = numpy_ops.bind_node(node, self._entries, self._dynamic)
            elif gpu:
                ids = [int(i) for i in node["args"]]
                if any(i in self._dynamic for i in ids):
                    raise ValueError("graph node %s: a GPU kernel cannot take a data-dependent entry"
                                     % node.get("name"))
                shapes = node.get("shapes") or [None] * len(ids)
                call = bind_launches(module.gpu, node["func"], [mem.view(i, s) for i, s in zip(ids, shapes)],
                                     mem.temporaries)
            else:
                args = [_kernel_view(self._entries[i]) for i in node["args"]]
                if "shapes" in node:
                    args = [a.reshape(tuple(int(d) for d in shp)) for a, shp in zip(args, node["shapes"])]
                call = module[node["func"]].bind(*args)
            self._nodes.append(node)
            # (the guard's flags may be copied down first: it is tested inside the call, after the copies)
            self._calls.append(self._with_copies(mem, copies, call, self._guard(node)))
            self._whens.append(None)

    def _finish_gpu_run(self) -> None:
        """The outputs GPU kernels wrote come down (each download waits for the kernels before it); a run of a
        GPU module returns only when its kernels are done."""
        mem = self._device_memory
        mem.run_copies(self._after_run)
        mem.device.synchronize()

    def _synchronized(self, call: Callable[[], None]) -> Callable[[], None]:
        device = self._device_memory.device

        def run_and_wait() -> None:
            call()
            device.synchronize()
        return run_and_wait

    def planned_copies(self) -> Dict[str, Any]:
        """A GPU module's copies between host and device memory in one run: ``{"nodes": [{"node", "device",
        "copies": [[kind, entry name], ...]}, ...] (the nodes with copies before them, in order), "after_run":
        [[kind, entry name], ...]}``; kind is "upload" or "download". Empty lists for a CPU module."""
        if self._device_memory is None:
            return {"nodes": [], "after_run": []}
        names = [e["name"] for e in self.graph["entries"]]
        nodes = [{"node": node.get("name", ""), "device": node.get("device", ""),
                  "copies": [[kind, names[e]] for kind, e in copies]}
                 for node, copies in zip(self.graph["nodes"], self._copies_before) if copies]
        return {"nodes": nodes, "after_run": [[kind, names[e]] for kind, e in self._after_run]}

    def _with_copies(self, mem: Any, copies: List[Tuple[str, int]], call: Callable[[], None],
                     when: Optional[List[Tuple[np.ndarray, bool]]]) -> Callable[[], None]:
        if not copies and when is None:
            return call

        def run_node() -> None:
            mem.run_copies(copies)
            if when is None or self._holds(when):
                call()
        return run_node

    # -- files -----------------------------------------------------------------------------------------------
    @classmethod
    def from_files(cls, graph_path: str, lib_path: str, params_path: Optional[str],
                   load_module: Optional[Callable[[str], Any]] = None) -> "GraphExecutor":
        if load_module is None:
            from .module import load_module as load_module_
            load_module = load_module_
        with open(graph_path, "r", encoding="utf-8") as fh:
            graph = json.load(fh)
        module = load_module(lib_path)
        params = params_format.load_params(params_path) if params_path and os.path.exists(params_path) else None
        return cls(graph, module, params)

    @classmethod
    def from_folder(cls, folder: str, load_module: Optional[Callable[[str], Any]] = None) -> "GraphExecutor":
        """deploy.json + deploy.so + deploy.params in `folder` (names as the JSON's "lib" says)."""
        with open(os.path.join(folder, "deploy.json"), "r", encoding="utf-8") as fh:
            lib = json.load(fh).get("lib", "deploy.so")
        return cls.from_files(os.path.join(folder, "deploy.json"), os.path.join(folder, lib),
                              os.path.join(folder, "deploy.params"), load_module)

    # -- inputs and params ------------------------------------------------------------------------------------
    def _input_entry(self, key: Union[int, str]) -> int:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= int(key) < len(self.input_names):
                raise IndexError("input index %d out of range: the model has %d input(s) %s"
                                 % (key, len(self.input_names), self.input_names))
            return self.graph["inputs"][int(key)]
        if key in self.input_names:
            return self.graph["inputs"][self.input_names.index(key)]
        if key in self._param_index:
            return self._param_index[key]
        raise KeyError("the model has no input %r (inputs: %s)" % (key, ", ".join(self.input_names)))

    def set_input(self, key: Union[int, str, None] = None, value: Any = None, **named: Any) -> None:
        """set_input("data", x), set_input(0, x) or set_input(data=x, ...): copies into the input buffer. A device
        array (tether_rpc.gpu.array) of the model's own GPU is copied device to device where GPU nodes read the
        input; any other comes down first."""
        items = list(named.items())
        if key is not None:
            items.insert(0, (key, value))
        for k, v in items:
            idx = self._input_entry(k)
            dst = self._entries[idx]
            if hasattr(v, "device_spec") and hasattr(v, "buffer"):
                if self._device_input(k, idx, v):
                    continue
                v = v.numpy()
            if self._device_memory is not None:
                self._device_memory.host_written(idx)
            src = _bfloat16_source(np.asarray(v), dst)
            if src.size != dst.size:
                raise ValueError("input %r: got shape %s, the model expects %s %s"
                                 % (k, src.shape, dst.dtype, dst.shape))
            if src.shape != dst.shape and src.squeeze().shape != dst.squeeze().shape:
                raise ValueError("input %r: got shape %s, the model expects %s" % (k, src.shape, dst.shape))
            if src.dtype != dst.dtype and not np.can_cast(src.dtype, dst.dtype, casting="same_kind"):
                raise ValueError("input %r: got %s, the model expects %s" % (k, src.dtype, dst.dtype))
            np.copyto(dst, src.reshape(dst.shape), casting="unsafe")

    def _device_input(self, key: Any, idx: int, array: Any) -> bool:
        """Set input entry `idx` from a device array without a round trip through the host, where it can be: the
        array is on the model's device, the entry has a device buffer, and shapes and dtypes agree."""
        mem = self._device_memory
        dst = self._entries[idx]
        if mem is None or array.device is not mem.device or not mem.on_device(idx):
            return False
        if array.size != dst.size or (tuple(array.shape) != dst.shape and
                                      tuple(d for d in array.shape if d != 1) != tuple(d for d in dst.shape if d != 1)):
            raise ValueError("input %r: got shape %s, the model expects %s %s" % (key, tuple(array.shape), dst.dtype,
                                                                                   dst.shape))
        if array.dtype != self.graph["entries"][idx]["dtype"]:
            raise ValueError("input %r: got a %s device array, the model expects %s (a device array is copied as "
                             "is, never converted)" % (key, array.dtype, self.graph["entries"][idx]["dtype"]))
        mem.copy_in(idx, array)
        if idx in self._inputs_read_on_host:
            mem.download(idx)
        return True

    def get_input(self, key: Union[int, str]) -> np.ndarray:
        idx = self._input_entry(key)
        mem = self._device_memory
        if mem is not None and mem.device_is_current(idx) and idx not in self._inputs_read_on_host:
            mem.download(idx)    # (set from a device array: the host copy is brought up to date on demand)
        return self._entries[idx].copy()

    def load_params(self, params: Union[bytes, bytearray, str, Mapping[str, np.ndarray]]) -> None:
        if not isinstance(params, Mapping):
            params = params_format.load_params(params)
        missing = [n for n in self._param_index if n not in params]
        if missing:
            raise KeyError("params lack %d tensor(s) the graph needs: %s" % (len(missing), ", ".join(missing[:10])))
        for name, idx in self._param_index.items():
            dst = self._entries[idx]
            src = storage_of(np.asarray(params[name]))
            if src.shape != dst.shape or src.dtype != dst.dtype or name_of(src.dtype) != name_of(dst.dtype):
                raise ValueError("param %r is %s %s, the graph expects %s %s"
                                 % (name, name_of(src.dtype), src.shape, name_of(dst.dtype), dst.shape))
            np.copyto(dst, src)
            if self._device_memory is not None and self._device_memory.on_device(idx):
                self._device_memory.upload(idx)    # (params GPU nodes read live on the device from now on)

    # -- running -----------------------------------------------------------------------------------------------
    def run(self, **inputs: Any) -> None:
        if inputs:
            self.set_input(**inputs)
        for call, when in self._steps:
            if when is None or self._holds(when):
                call()
        if self._device_memory is not None:
            self._finish_gpu_run()

    # -- run-time branches: a node with "when" [[entry, truth], ...] runs only if every flag entry has its truth
    def _guard(self, node: Dict[str, Any]) -> Optional[List[Tuple[np.ndarray, bool]]]:
        when = node.get("when")
        if not when:
            return None
        guard = []
        for item in when:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                    and 0 <= item[0] < len(self._entries) and isinstance(item[1], bool)):
                raise ValueError("node %s: malformed \"when\" item %r (expected [entry id, true|false])"
                                 % (node.get("name"), item))
            flag = self._entries[item[0]]
            if flag.size != 1:
                raise ValueError("node %s: \"when\" flag entry %d has %d elements (one expected)"
                                 % (node.get("name"), item[0], flag.size))
            guard.append((flag.reshape(-1), item[1]))
        return guard

    @staticmethod
    def _holds(when: List[Tuple[np.ndarray, bool]]) -> bool:
        for flag, truth in when:
            if bool(flag[0]) != truth:
                return False
        return True

    @property
    def num_outputs(self) -> int:
        return len(self.output_names)

    def get_num_outputs(self) -> int:
        return self.num_outputs

    def get_num_inputs(self) -> int:
        return len(self.input_names)

    def get_output(self, index: Union[int, str] = 0) -> np.ndarray:
        if isinstance(index, str):
            if index not in self.output_names:
                raise KeyError("the model has no output %r (outputs: %s)" % (index, ", ".join(self.output_names)))
            index = self.output_names.index(index)
        if not 0 <= int(index) < self.num_outputs:
            raise IndexError("output index %d out of range: the model has %d output(s)" % (index, self.num_outputs))
        entry = self.graph["outputs"][int(index)]
        return for_host((self._dynamic[entry] if entry in self._dynamic else self._entries[entry]).copy())

    def info(self) -> Dict[str, Any]:
        def describe(ids):
            return [{"name": self.graph["entries"][i]["name"], "shape": list(self.graph["entries"][i]["shape"]),
                     "dtype": self.graph["entries"][i]["dtype"]} for i in ids]
        gpu = getattr(self.module, "gpu", None)
        device = "%s:%d" % (gpu.device.name, gpu.device.index) if gpu is not None else "cpu"
        return {"inputs": describe(self.graph["inputs"]), "outputs": describe(self.graph["outputs"]),
                "nodes": len(self._nodes), "storage_bytes": int(sum(s.nbytes for s in self._storages)),
                "device": device, "calls_per_run": len(self._steps)}

    # -- timing --------------------------------------------------------------------------------------------------
    def benchmark(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0, warmup: int = 1,
                  cooldown_ms: float = 0, on_sample: Optional[Callable[..., None]] = None) -> Dict[str, Any]:
        """Whole-model timing: ``{"samples": [seconds per run], "number", "median_ms", "mean_ms", "min_ms"}``."""
        # (run itself: an untaken branch's nodes are skipped in a timed run as in any other)
        res = timing.time_evaluator(self.run, (), number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                    warmup=warmup, cooldown_ms=cooldown_ms, on_sample=on_sample)
        return _summarize(res)

    def profile(self, number: int = 5, repeat: int = 1, warmup: int = 1,
                on_node: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """Per-node timings in execution order; ``on_node(record)`` is called as each node is measured (the RPC
        built-in streams these as events)."""
        self.run()   # intermediates hold real values, so every node sees realistic data
        records = []
        t_start = time.perf_counter()
        for k, (node, call, when) in enumerate(zip(self._nodes, self._calls, self._whens)):
            rec = {"index": k, "name": node.get("name", ""), "func": node.get("func", "numpy:%s" % node.get("numpy")),
                   "ops": node.get("ops", ""), "seconds": 0.0}
            if when is not None and not self._holds(when):
                rec["skipped"] = True       # an untaken branch: its inputs were never computed
            else:
                if self._device_memory is not None:   # (a GPU node only queues its kernels: time until done)
                    call = self._synchronized(call)
                res = timing.time_evaluator(call, (), number=number, repeat=repeat, warmup=warmup)
                rec["seconds"] = float(sorted(res["samples"])[len(res["samples"]) // 2])
            records.append(rec)
            if on_node is not None:
                on_node(rec)
        total = sum(r["seconds"] for r in records)
        return {"nodes": records, "total_seconds": total, "wall_seconds": time.perf_counter() - t_start}

    def close(self) -> None:
        """Free the device memory and, when the executor owns its module (the RPC's create loaded it for this
        executor alone), the module (idempotent)."""
        self._calls = []
        self._steps = []
        self._nodes = []
        if self._device_memory is not None:
            self._device_memory.free()
            self._device_memory = None
        if self.owns_module:
            self.owns_module = False
            self.module.close()

    def __enter__(self) -> "GraphExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _summarize(res: Dict[str, Any]) -> Dict[str, Any]:
    samples = [float(s) for s in res["samples"]]
    ordered = sorted(samples)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
    return {"samples": samples, "number": int(res["number"]), "median_ms": median * 1e3,
            "mean_ms": sum(samples) / len(samples) * 1e3, "min_ms": ordered[0] * 1e3}


# ---------------------------------------------------------------------------------------------------------------
# RPC built-ins. Each is ``fn(session, ctx, *args)``, where `session` is a tether_rpc.session.SessionHandler
# (object table: _put/_get; files: .folder) and `ctx` its CallContext (ctx.emit streams events).
KIND_GRAPH = "graph"


def _graph_create(session: Any, ctx: Any, graph_name: str = "deploy.json", lib_name: Optional[str] = None,
                  params_name: Optional[str] = "deploy.params", device: Optional[str] = None) -> Dict[str, Any]:
    """`device` ("opencl:1") picks the GPU of a GPU model; default: device 0 of its API."""
    from .module import load_module

    if device is not None and not isinstance(device, str):
        raise TypeError("device must be a string like 'opencl:0', got %s" % type(device).__name__)
    graph_path = session.folder.existing(graph_name)
    with open(graph_path, "r", encoding="utf-8") as fh:
        graph = json.load(fh)
    lib_path = session.folder.existing(lib_name or graph.get("lib", "deploy.so"))
    params = params_format.load_params(session.folder.existing(params_name)) if params_name else None
    # the session's own device, as for tether.module.load: the model and the session's device arrays (inputs,
    # copy_output targets) share one context, and the device closes with the session
    module = load_module(lib_path, device=lambda api: session.device(device or api + ":0"))
    try:
        gm = GraphExecutor(graph, module, params)
    except BaseException:
        module.close()
        raise
    gm.owns_module = True
    handle = session._put(KIND_GRAPH, gm)
    return dict(gm.info(), handle=handle)


def _array_value(session: Any, value: Any) -> Any:
    """A tensor, or a device-array handle: large inputs travel as device arrays (bulk copy, no frame limit)."""
    from .protocol import RemoteHandle
    if isinstance(value, RemoteHandle):
        arr = session._get(value, "array")
        # a GPU array goes as it is: the executor copies it device to device, or down where it must
        return arr if hasattr(arr, "device_spec") else arr.array
    return value


def _graph_set_input(session: Any, ctx: Any, handle: Any, key: Any, value: Any) -> None:
    session._get(handle, KIND_GRAPH).set_input(key, _array_value(session, value))


def _graph_set_inputs(session: Any, ctx: Any, handle: Any, values: Any) -> None:
    gm = session._get(handle, KIND_GRAPH)
    for k, v in dict(values).items():
        gm.set_input(k, _array_value(session, v))


def _graph_load_params(session: Any, ctx: Any, handle: Any, params_name: str) -> None:
    session._get(handle, KIND_GRAPH).load_params(params_format.load_params(session.folder.existing(params_name)))


def _graph_run(session: Any, ctx: Any, handle: Any) -> None:
    session._get(handle, KIND_GRAPH).run()


def _graph_get_output(session: Any, ctx: Any, handle: Any, index: Any = 0) -> np.ndarray:
    return session._get(handle, KIND_GRAPH).get_output(index)


def _graph_copy_output(session: Any, ctx: Any, handle: Any, index: Any, array_handle: Any) -> None:
    """Copy output `index` into a device array (how large outputs leave: then a bulk copy_out)."""
    out = session._get(handle, KIND_GRAPH).get_output(index)
    session._get(array_handle, "array").copyfrom(out)


def _graph_info(session: Any, ctx: Any, handle: Any) -> Dict[str, Any]:
    return session._get(handle, KIND_GRAPH).info()


_BENCH_OPTIONS = ("number", "repeat", "min_repeat_ms", "warmup", "cooldown_ms")


def _graph_benchmark(session: Any, ctx: Any, handle: Any, options: Any = None) -> Dict[str, Any]:
    opts = dict(options or {})
    unknown = set(opts) - set(_BENCH_OPTIONS)
    if unknown:
        raise TypeError("unknown benchmark options: %s (allowed: %s)" % (", ".join(sorted(unknown)),
                                                                        ", ".join(_BENCH_OPTIONS)))

    def on_sample(index: int, seconds: float, number: int) -> None:
        ctx.emit("sample", index=int(index), seconds=float(seconds), number=int(number))

    return session._get(handle, KIND_GRAPH).benchmark(on_sample=on_sample, **opts)


def _graph_profile(session: Any, ctx: Any, handle: Any, options: Any = None) -> Dict[str, Any]:
    opts = dict(options or {})
    unknown = set(opts) - {"number", "repeat", "warmup"}
    if unknown:
        raise TypeError("unknown profile options: %s (allowed: number, repeat, warmup)" % ", ".join(sorted(unknown)))

    def on_node(rec: Dict[str, Any]) -> None:
        ctx.emit("node", **rec)

    return session._get(handle, KIND_GRAPH).profile(on_node=on_node, **opts)


BUILTINS: Dict[str, Callable[..., Any]] = {
    "tether.graph.create": _graph_create,
    "tether.graph.set_input": _graph_set_input,
    "tether.graph.set_inputs": _graph_set_inputs,
    "tether.graph.load_params": _graph_load_params,
    "tether.graph.run": _graph_run,
    "tether.graph.get_output": _graph_get_output,
    "tether.graph.copy_output": _graph_copy_output,
    "tether.graph.info": _graph_info,
    "tether.graph.benchmark": _graph_benchmark,
    "tether.graph.profile": _graph_profile,
}


def register_builtins(session: Any, table: Optional[Dict[str, Callable[..., Any]]] = None) -> None:
    """Add the graph built-ins to a SessionHandler: ``table`` (default ``session._builtins``) maps each name to
    a ``fn(ctx, *args)`` bound to `session`. Graph objects live in the session's object table (kind "graph"),
    so ``tether.free`` releases them like any other handle."""
    if table is None:
        table = session._builtins
    for name, fn in BUILTINS.items():
        table[name] = (lambda f: lambda ctx, *args: f(session, ctx, *args))(fn)
