"""A model's activations in device memory: the graph executor's storages as device buffers, and the copies
between device and host memory that the nodes which run on the host need.

For a GPU module (a module with a ``gpu`` program, tether_rpc/gpu/module.py) the graph executor
(tether_rpc/graph_executor.py) keeps every storage of the memory plan twice: as the host array it always has and
as a device buffer of the module's device. GPU nodes take device views of the buffers (:class:`DeviceView`); the
nodes that run on the host (CPU kernels of the host library, numpy nodes) take the host arrays. Which copies a
run makes is planned once, at load, by following where each storage's current value lives (:func:`plan_copies`):

- params are uploaded once, when they are loaded;
- inputs are set in host memory and uploaded before the first GPU node that reads them;
- before a host node, each value it reads that a GPU node wrote is downloaded (and the flags of a node's run-time
  guard before the guard is tested); before a GPU node, each value it reads that a host node wrote is uploaded;
- after a run, the outputs a GPU node wrote are downloaded.

So a model that runs wholly on the GPU copies its inputs in and its outputs out, and nothing else. Every entry of a
GPU module's graph starts at its storage's start (a kernel binds whole buffers): the build makes no views at
offsets for GPU targets.

Only the standard library and numpy: this runs on the device.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..dtypes import numpy_dtype
from ..errors import KernelError, ModuleLoadError
from .api import DeviceAPI, DeviceBuffer

HOST = 1     # the host array holds the storage's current value
DEVICE = 2   # the device buffer does

#: one planned copy: ("upload" | "download", entry id)
Copy = Tuple[str, int]


class DeviceView:
    """One graph entry as a GPU function's argument: the storage's device buffer, read with the entry's shape."""

    __slots__ = ("buffer", "shape", "dtype")

    def __init__(self, buffer: DeviceBuffer, shape: Tuple[int, ...], dtype: str):
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype

    def __repr__(self) -> str:
        return "DeviceView(%s %s)" % (self.dtype, self.shape)


def node_access(node: Dict[str, Any]) -> Tuple[List[int], List[int]]:
    """(entries a graph JSON node reads, entries it writes): a kernel node's args are its inputs then its
    outputs ("num_outputs" of them, 1 if not given: a recurrent kernel writes three); a numpy node names both; a
    guard's flags are read too."""
    if "numpy" in node:
        reads, writes = [int(i) for i in node["inputs"]], [int(i) for i in node["outputs"]]
    else:
        args = [int(i) for i in node["args"]]
        n_out = int(node.get("num_outputs", 1))
        if not 1 <= n_out <= len(args):
            raise ValueError("graph node %s: num_outputs %r for %d arguments" % (node.get("name"), n_out, len(args)))
        reads, writes = args[:-n_out], args[-n_out:]
    for item in node.get("when") or []:
        reads.append(int(item[0]))
    return reads, writes


def plan_copies(nodes: Sequence[Dict[str, Any]], on_gpu: Sequence[bool], storage_of: Sequence[int],
                inputs: Sequence[int], params: Sequence[int], outputs: Sequence[int],
                host_only: Sequence[int] = ()) -> Tuple[List[List[Copy]], List[Copy]]:
    """(the copies before each node, the copies after a run) of a graph whose node k runs on the GPU where
    on_gpu[k]. The plan follows each storage: where its current value lives (HOST, DEVICE or both); a value is
    copied only where a node on the other side reads it. `host_only`: entries that never live on the device
    (data-dependent values of numpy nodes)."""
    where: Dict[int, int] = {}
    for e in inputs:
        where[storage_of[e]] = HOST
    for e in params:
        where[storage_of[e]] = HOST | DEVICE
    skip = set(host_only)
    before: List[List[Copy]] = []
    for node, gpu in zip(nodes, on_gpu):
        reads, writes = node_access(node)
        copies: List[Copy] = []
        n_flags = len(node.get("when") or [])
        data = reads[:len(reads) - n_flags]
        # (a guard's flags are tested on the host, after the copies; the data the node's kernel reads lives where
        # the node runs)
        needs = [(e, DEVICE if gpu else HOST) for e in data] + [(e, HOST) for e in reads[len(data):]]
        for e, need in needs:
            if e in skip:
                continue
            have = where.get(storage_of[e], 0)
            if have and not have & need:
                copies.append(("upload" if need == DEVICE else "download", e))
                where[storage_of[e]] = have | need
        for e in writes:
            if e not in skip:
                where[storage_of[e]] = DEVICE if gpu else HOST
        before.append(copies)
    after = [("download", e) for e in outputs if e not in skip and where.get(storage_of[e], 0) == DEVICE]
    return before, after


def bind_launches(program: Any, name: str, views: Sequence[DeviceView], temporaries: Dict[str, List[DeviceBuffer]]
                  ) -> Callable[[], None]:
    """A GPU function's kernels on these device views, launched without waiting: the queue runs them in order
    and a download waits for them, so a model waits only where the host needs a value. `temporaries` (function
    name -> its buffers) is shared by the nodes of one executor: they run one after another on one queue.
    Views that do not fit the function's arguments raise KernelError (one line)."""
    info = program.functions[name]
    specs = list(info.get("args") or [])
    if len(views) != len(specs):
        raise KernelError("%s takes %d arguments, the graph gives %d" % (name, len(specs), len(views)))
    for i, (v, spec) in enumerate(zip(views, specs)):
        if tuple(v.shape) != tuple(spec["shape"]) or v.dtype != spec["dtype"]:
            raise KernelError("%s: argument %d (%s) must be a %s array of shape %s, the graph gives %s %s" % (
                name, i, spec["name"], spec["dtype"], tuple(spec["shape"]), v.dtype, tuple(v.shape)))
    device = program.device
    if name not in temporaries:
        temporaries[name] = [device.alloc(max(int(t["size"]) * numpy_dtype(t["dtype"]).itemsize, 4))
                             for t in info.get("temporaries") or []]
    buffers = [v.buffer for v in views] + temporaries[name]
    launches = [(program.kernels[la["kernel"]], [buffers[j] for j in la["args"]]) for la in info["launches"]]
    steps = [(k["name"], args, tuple(k["grid"]), tuple(k["block"])) for k, args in launches]

    def launch() -> None:
        if program.program is None:
            raise ModuleLoadError("%s: module %s was closed" % (name, program.label))
        for kernel, args, grid, block in steps:
            device.launch(program.program, kernel, args, grid, block)
    return launch


class DeviceStorages:
    """The device buffers of a graph's storages (one per storage a GPU node uses, as large as the host one; a
    storage only host nodes use has none: an LSTM's weights stay in host memory), and the copies of entries
    between them and the host arrays."""

    def __init__(self, device: DeviceAPI, sizes: Sequence[int], host_entries: Sequence[np.ndarray],
                 entry_specs: Sequence[Dict[str, Any]], used: Optional[Sequence[int]] = None):
        self.device = device
        self._host = host_entries
        self._storage = [int(e["storage"]) for e in entry_specs]
        self._offset = [int(e.get("offset", 0)) for e in entry_specs]
        self._dtypes = [str(e["dtype"]) for e in entry_specs]
        self.buffers: List[Optional[DeviceBuffer]] = []
        self.temporaries: Dict[str, List[DeviceBuffer]] = {}   # GPU function -> its temporaries (bind_launches)
        # storages whose device copy is the current value (a device array set as an input): never uploaded over
        self._device_current: Set[int] = set()
        try:
            wanted = set(range(len(sizes)) if used is None else used)
            for s, n in enumerate(sizes):
                self.buffers.append(device.alloc(max(int(n), 4)) if s in wanted else None)
        except BaseException:
            self.free()
            raise

    @property
    def storage_of(self) -> List[int]:
        return list(self._storage)

    def on_device(self, entry: int) -> bool:
        """Whether `entry`'s storage has a device buffer (some GPU node uses it)."""
        return self.buffers[self._storage[entry]] is not None

    def _buffer(self, entry: int) -> DeviceBuffer:
        buf = self.buffers[self._storage[entry]]
        if buf is None:
            raise ValueError("graph entry %d: its storage %d has no device buffer (no GPU node uses it)"
                             % (entry, self._storage[entry]))
        return buf

    def view(self, entry: int, shape: Optional[Sequence[int]] = None) -> DeviceView:
        """Entry `entry` as a GPU function's argument (with `shape`, the kernel's view of the same bytes, if
        given)."""
        if self._offset[entry]:
            raise ValueError("graph entry %d lies at byte offset %d of its storage; a GPU kernel takes whole buffers "
                             "(rebuild the model with this tether: GPU builds make no views at offsets)"
                             % (entry, self._offset[entry]))
        host = self._host[entry]
        shp = tuple(int(d) for d in (shape if shape is not None else (host.shape or (1,))))
        return DeviceView(self._buffer(entry), shp, self._dtypes[entry])

    def upload(self, entry: int) -> None:
        host = self._host[entry]
        if host.nbytes == 0 or self._storage[entry] in self._device_current:
            return
        self.device.upload(self._buffer(entry), np.ascontiguousarray(host).reshape(-1).view(np.uint8),
                           self._offset[entry])

    def download(self, entry: int) -> None:
        host = self._host[entry]
        if host.nbytes == 0:
            return
        out = host.reshape(-1).view(np.uint8)
        self.device.download(self._buffer(entry), out, self._offset[entry])

    def copy_in(self, entry: int, source: Any) -> None:
        """Copy a device array of this device (same byte size) into `entry`'s device buffer, device to device;
        the entry's device copy is then its current value (device_is_current)."""
        self.device.copy(self._buffer(entry), source.buffer, source.nbytes, self._offset[entry], 0)
        self._device_current.add(self._storage[entry])

    def device_is_current(self, entry: int) -> bool:
        """Whether `entry`'s value was last set on the device (copy_in), not in its host array."""
        return self._storage[entry] in self._device_current

    def host_written(self, entry: int) -> None:
        """`entry`'s host array holds its value again (uploaded where a GPU node reads it)."""
        self._device_current.discard(self._storage[entry])

    def run_copies(self, copies: Sequence[Copy]) -> None:
        for kind, entry in copies:
            if kind == "upload":
                self.upload(entry)
            else:
                self.download(entry)

    def free(self) -> None:
        bufs, self.buffers = self.buffers, []
        for temps in self.temporaries.values():
            bufs.extend(temps)
        self.temporaries = {}
        for b in bufs:
            if b is None:
                continue
            try:
                self.device.free(b)
            except Exception:   # (a device closed under us: its buffers went with it)
                pass


__all__ = ["DeviceView", "DeviceStorages", "bind_launches", "plan_copies", "node_access", "HOST", "DEVICE"]
