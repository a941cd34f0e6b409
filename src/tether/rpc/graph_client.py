"""The remote graph executor: ``remote.graph_executor("out/")`` on any session (RemoteSession, LocalSession).

It uploads deploy.so / deploy.json / deploy.params (unless told the files are already on the device), creates
the executor on the device with the ``tether.graph.*`` built-ins and offers the same methods as the local
executor. Outputs come back as numpy arrays; ``benchmark`` and ``profile`` stream their samples as events.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import numpy as np
from tether_rpc.dtypes import numpy_dtype
from tether_rpc.protocol import RemoteHandle

log = logging.getLogger(__name__)

DEPLOY_FILES = ("deploy.json", "deploy.so", "deploy.params")
# Tensors above this travel through a temporary device array (bulk bytes) instead of inside one frame.
INLINE_LIMIT = 4 << 20


class RemoteGraphExecutor:
    """A graph executor living in a remote session; close() frees it on the device."""

    def __init__(self, session: Any, folder: Optional[str] = None, *, uploaded: bool = False,
                 prefix: str = "", graph_name: str = "deploy.json", lib_name: Optional[str] = None,
                 params_name: Optional[str] = "deploy.params", device: Optional[str] = None):
        """``device`` ("opencl:1") picks the device's GPU for a GPU model (default: device 0 of the model's API);
        ``self.device`` says where the model runs ("opencl:0", "vulkan:0" or "cpu")."""
        self.session = session
        names = {"deploy.json": prefix + graph_name, "deploy.params": prefix + (params_name or "")}
        if folder is not None:
            with open(os.path.join(folder, "deploy.json"), "r", encoding="utf-8") as fh:
                local_lib = json.load(fh).get("lib", "deploy.so")
            names["deploy.so"] = prefix + (lib_name or local_lib)
            if not uploaded:
                for local, remote in (("deploy.json", names["deploy.json"]), (local_lib, names["deploy.so"])) + \
                        ((("deploy.params", names["deploy.params"]),) if params_name else ()):
                    session.upload(os.path.join(folder, local), name=remote)
        else:
            names["deploy.so"] = prefix + lib_name if lib_name else None
        files = [names["deploy.json"], names["deploy.so"], names["deploy.params"] if params_name else None]
        if device is not None:     # (only then: servers that predate the argument still take the other three)
            files.append(str(device))
        value = session._call("tether.graph.create", files)["value"]
        self.handle = value["handle"]
        self.inputs: List[Dict[str, Any]] = value["inputs"]
        self.outputs: List[Dict[str, Any]] = value["outputs"]
        self.input_names = [i["name"] for i in self.inputs]
        self.output_names = [o["name"] for o in self.outputs]
        # (servers that predate GPU models do not say: they run every model on their CPU)
        self.device: str = value.get("device", "cpu")
        self._closed = False

    def _call(self, name: str, *args: Any) -> Any:
        if self._closed:
            raise ValueError("this remote graph executor was closed")
        return self.session._call(name, [self.handle] + list(args))["value"]

    def set_input(self, key: Union[int, str, None] = None, value: Any = None, **named: Any) -> None:
        """Each value: a numpy array (anything ``np.asarray`` takes) or a RemoteArray of this session, in its host
        memory or on a GPU."""
        items = list(named.items())
        if key is not None:
            items.insert(0, (key, value))
        for k, v in items:
            key = int(k) if isinstance(k, (int, np.integer)) else k
            handle = getattr(v, "handle", None)
            if isinstance(handle, RemoteHandle):   # a RemoteArray, in the session's memory or GPU: no bytes travel
                self._call("tether.graph.set_input", key, handle)
                continue
            arr = np.asarray(v, order="C")
            if arr.nbytes <= INLINE_LIMIT:
                self._call("tether.graph.set_input", key, arr)
                continue
            with self.session.array(arr) as tmp:
                self._call("tether.graph.set_input", key, tmp.handle)

    def run(self, **inputs: Any) -> None:
        if inputs:
            self.set_input(**inputs)
        self._call("tether.graph.run")

    def get_output(self, index: Union[int, str] = 0) -> np.ndarray:
        i = self.output_names.index(index) if isinstance(index, str) else int(index)
        if not 0 <= i < len(self.outputs):
            raise IndexError("output index %d out of range: the model has %d output(s)" % (i, len(self.outputs)))
        info = self.outputs[i]
        nbytes = int(np.prod(info["shape"], dtype=np.int64)) * numpy_dtype(info["dtype"]).itemsize
        if nbytes <= INLINE_LIMIT:
            return np.asarray(self._call("tether.graph.get_output", i))
        with self.session.empty(info["shape"], info["dtype"]) as tmp:
            self._call("tether.graph.copy_output", i, tmp.handle)
            return tmp.numpy()

    def get_num_outputs(self) -> int:
        return len(self.outputs)

    def get_num_inputs(self) -> int:
        return len(self.inputs)

    @contextlib.contextmanager
    def _events(self, kind: str, callback: Optional[Callable[[Dict[str, Any]], None]]) -> Iterator[None]:
        if callback is None:
            yield
            return
        previous = self.session.on_event

        def on_event(payload: Dict[str, Any]) -> None:
            if payload.get("kind") == kind:
                callback(payload)
            if previous is not None:
                previous(payload)

        self.session.on_event = on_event
        try:
            yield
        finally:
            self.session.on_event = previous

    def benchmark(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0, warmup: int = 1,
                  cooldown_ms: float = 0, on_sample: Optional[Callable[[Dict[str, Any]], None]] = None
                  ) -> Dict[str, Any]:
        """Whole-model timing measured on the device (no network in the timed loop)."""
        opts = {"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms, "warmup": warmup,
                "cooldown_ms": cooldown_ms}
        with self._events("sample", on_sample):
            return self._call("tether.graph.benchmark", opts)

    def profile(self, number: int = 5, repeat: int = 1, warmup: int = 1,
                on_node: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """Per-node timings; each node's record arrives as an event while the device measures the next."""
        with self._events("node", on_node):
            return self._call("tether.graph.profile", {"number": number, "repeat": repeat, "warmup": warmup})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not getattr(self.session, "closed", False):
            try:
                self.session._call("tether.free", [self.handle])
            except Exception as exc:  # the session may be going away; nothing to keep then
                log.debug("freeing remote graph executor: %s", exc)

    def __enter__(self) -> "RemoteGraphExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def graph_executor(session: Any, folder: Optional[str] = None, **kwargs: Any) -> RemoteGraphExecutor:
    """What ``RemoteSession.graph_executor`` / ``LocalSession.graph_executor`` should do (the lead attaches it)."""
    return RemoteGraphExecutor(session, folder, **kwargs)
