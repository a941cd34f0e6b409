"""Builds on a Ray cluster (the optional extra ``tether[ray]``): tuning candidates and whole models as Ray tasks,
their artifacts cached by the content hash of what went into them, so no build runs twice.

What travels: the tuning tasks (or a model file's bytes) go into Ray's object store once per run; a build task
gets that reference, a task index and a config (or the build options) and returns the artifact's bytes (a
candidate's one-kernel .so, a model folder's files) through the object store. Measurement never moves: the
artifacts come back to this process and the tracker's devices measure them as before.

Caching, by a key that hashes every input of a build (``artifact_key``: tether's and LLVM's versions, the full
target description, the kernel's signature and the config; for a model, its bytes and the build options):
- within a run, one Ray task per key: a second request for a key in flight waits for the same task;
- across runs on one cluster, a named actor (``ArtifactStore``) holds the artifacts by key; a build task asks it
  first and fills it after building;
- on this machine, the local object cache (``codegen.objcache``, ``TETHER_CACHE_DIR``) keeps them too: a key
  found there sends nothing to the cluster.

Failures: a node that dies takes its running builds with it; Ray runs them again on another node
(``max_retries``), so no result is lost and, builds being deterministic, the artifact is the same. A build that
fails (the schedule or compiler refused the config) is a result, cached like an artifact, never retried.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import itertools
import json
import logging
import os
import socket
import tempfile
import threading
import uuid
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import msgpack

from tether.codegen import objcache
from tether.errors import TetherError
from tether.tune.space import config_key

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'tether[ray]'"
NAMESPACE = "tether"
STORE_NAME = "tether-artifacts"
HEAD_RESOURCE = "node:__internal_head__"     # the resource only Ray's head node has
STORE_MAX_MB = 1024          # the cluster cache's size: past it the least recently used artifacts go
BUILD_RETRIES = 3            # runs of a build whose node died, on the other nodes, before it counts as failed
_KEY_MAGIC = "TETHER-RAY-ARTIFACT-1"
CANDIDATE_FILE = "candidate.so"     # a library's file name is its soname: one name, so one key gives one artifact


class RayUnavailable(TetherError):
    """--ray was asked for and Ray is not installed here."""


def import_ray() -> Any:
    """The ray module, or RayUnavailable naming the extra that installs it (one line, no traceback)."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray, which is not installed: %s" % INSTALL_HINT) from None
    return ray


HEAD_CONNECT_TIMEOUT = 10.0   # seconds to reach the head's port before Ray itself is asked (it waits minutes)


def connect(address: str) -> Any:
    """Join the Ray cluster at `address` (HOST:PORT of its head, or ray://HOST:PORT) as a driver."""
    ray = import_ray()
    if not ray.is_initialized():
        host, sep, port = address.split("://", 1)[-1].rpartition(":")
        if not sep or not host or not port.isdigit():
            raise TetherError("--ray %r: expected HOST:PORT of the Ray cluster's head (or ray://HOST:PORT)" % address)
        try:
            socket.create_connection((host, int(port)), timeout=HEAD_CONNECT_TIMEOUT).close()
        except OSError as exc:
            raise TetherError("cannot reach the Ray cluster's head at %s: %s (start it with `ray start --head`)"
                              % (address, exc)) from None
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise TetherError("cannot join the Ray cluster at %s: %s" % (address, str(exc).splitlines()[0])) from None
    return ray


def versions() -> Dict[str, str]:
    """What decides an artifact's bytes beside its inputs: tether's code and the LLVM that compiles it."""
    import llvmlite
    import llvmlite.binding as llvm

    from tether.version import __version__

    return {"tether": __version__, "llvmlite": llvmlite.__version__,
            "llvm": ".".join(map(str, llvm.llvm_version_info))}


def _digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in (_KEY_MAGIC, json.dumps(versions(), sort_keys=True)) + parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def artifact_key(task: Any, config: Dict[str, Any]) -> str:
    """The content key of a candidate's build: the same kernel, target, config and compiler -> the same .so."""
    return _digest("candidate", str(task.target), task.signature, config_key(config))


def model_key(model_bytes: bytes, suffix: str, options: Dict[str, Any]) -> str:
    """The content key of a model's build: the file's bytes (and kind), the build options and the compiler."""
    return _digest("model", suffix, json.dumps(options, sort_keys=True), model_bytes)


# ---------------------------------------------------------------------------------------------------------------
# the local cache: entries of the object cache (an artifact's bytes, or the build's error)

def _local_load(key: str) -> Optional[Dict[str, Any]]:
    hit = objcache.load(key)
    if hit is None:
        return None
    try:
        entry = msgpack.unpackb(hit[0], raw=False)
        return {"blob": entry["blob"], "error": entry["error"]}
    except (ValueError, KeyError, TypeError, msgpack.UnpackException):
        return None


def _local_store(key: str, blob: Optional[bytes], error: Optional[str]) -> None:
    objcache.store(key, msgpack.packb({"blob": blob, "error": error}, use_bin_type=True), "")


# ---------------------------------------------------------------------------------------------------------------
# what runs on the cluster

_REMOTE: Dict[str, Any] = {}
_TASKS_OF: Dict[str, Sequence[Any]] = {}     # per worker process: the tuning tasks of a run, by digest


class ArtifactStore:
    """A Ray actor: artifacts (or build errors) by content key, the least recently used dropped past
    `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: "OrderedDict[str, tuple]" = OrderedDict()
        self.size = 0
        # per node, the build tasks that asked (each asks as it starts; a retried one asks again) and that put
        self.started: Dict[str, int] = {}
        self.finished: Dict[str, int] = {}

    def get(self, key: str, node: str = "") -> Optional[tuple]:
        self.started[node] = self.started.get(node, 0) + 1
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key: str, blob: Optional[bytes], error: Optional[str], node: str = "") -> None:
        self.finished[node] = self.finished.get(node, 0) + 1
        if key in self.entries:
            return
        self.entries[key] = (blob, error)
        self.size += len(blob or b"")
        while self.size > self.max_bytes and len(self.entries) > 1:
            _, (old, _) = self.entries.popitem(last=False)
            self.size -= len(old or b"")

    def count(self) -> int:
        return len(self.entries)

    def activity(self) -> Dict[str, Dict[str, int]]:
        return {"started": dict(self.started), "finished": dict(self.finished)}


def _node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def build_candidate(store: Any, tasks_box: List[Any], digest: str, index: int, config: Dict[str, Any],
                    key: str) -> tuple:
    """A Ray task: (blob, error, seconds, node, cached): the candidate's .so bytes, or its build error."""
    import ray

    found = _store_get(ray, store, key)
    if found is not None:
        return found[0], found[1], 0.0, _node(), True
    tasks = load_tasks(tasks_box, digest)
    t0 = time.perf_counter()
    blob, error = None, None
    with tempfile.TemporaryDirectory(prefix="tether-ray-") as tmp:
        path = os.path.join(tmp, CANDIDATE_FILE)
        try:
            tasks[index].build(config).export_library(path)
            with open(path, "rb") as fh:
                blob = fh.read()
        except Exception as exc:   # noqa: BLE001 - any failure of a candidate's build is that config's result
            error = "%s: %s" % (type(exc).__name__, exc)
    _store_put(store, key, blob, error)
    return blob, error, time.perf_counter() - t0, _node(), False


def load_tasks(tasks_box: List[Any], digest: str) -> Sequence[Any]:
    """A run's tuning tasks in this worker process (fetched and unpickled once per run)."""
    tasks = _TASKS_OF.get(digest)
    if tasks is None:
        import ray

        _TASKS_OF.clear()            # an earlier run's tasks: its builds are over
        tasks = _TASKS_OF[digest] = ray.get(tasks_box[0])
    return tasks


def preload_tasks(tasks_box: List[Any], digest: str) -> str:
    """A Ray task: load a run's tasks on a node before its first build needs them; returns the node id."""
    load_tasks(tasks_box, digest)
    return _node()


def build_model(store: Any, name: str, model: bytes, options: Dict[str, Any], key: str) -> tuple:
    """A Ray task: (files, error, seconds, node, cached): the model folder's {name: bytes}, or the build's error."""
    import ray

    found = _store_get(ray, store, key)
    if found is not None:
        files = msgpack.unpackb(found[0], raw=False) if found[0] is not None else None
        return files, found[1], 0.0, _node(), True
    t0 = time.perf_counter()
    files, error = compile_model_file(name, model, options)
    _store_put(store, key, None if files is None else msgpack.packb(files, use_bin_type=True), error)
    return files, error, time.perf_counter() - t0, _node(), False


def node_versions() -> tuple:
    """A Ray task: (node id, versions()) of the node it runs on; it also imports the compiler there, so the first
    build on a node does not pay for it."""
    import tether.tune.tasks  # noqa: F401 - the warm-up: lowering, codegen and the op library

    return _node(), versions()


def _remote() -> Dict[str, Any]:
    """The Ray actor class and remote functions (module-level functions, so that Ray pickles them by name and
    every worker runs the installed tether's code)."""
    if not _REMOTE:
        ray = import_ray()
        _REMOTE.update(
            store=ray.remote(num_cpus=0, max_restarts=-1)(ArtifactStore),
            build_candidate=ray.remote(num_cpus=1, max_retries=BUILD_RETRIES)(build_candidate),
            build_model=ray.remote(num_cpus=1, max_retries=BUILD_RETRIES)(build_model),
            node_versions=ray.remote(num_cpus=1)(node_versions),
            preload_tasks=ray.remote(num_cpus=1)(preload_tasks))
    return _REMOTE


def _store_get(ray: Any, store: Any, key: str) -> Optional[tuple]:
    try:
        return ray.get(store.get.remote(key, _node()), timeout=60)
    except Exception as exc:   # noqa: BLE001 - a store that is gone (its node died) is a miss, not a failed build
        log.warning("the artifact store did not answer (%s): building", exc)
        return None


def _store_put(store: Any, key: str, blob: Optional[bytes], error: Optional[str]) -> None:
    try:
        store.put.remote(key, blob, error, _node())
    except Exception as exc:   # noqa: BLE001 - the artifact still goes back to the driver
        log.warning("the artifact store refused an entry (%s)", exc)


def compile_model_file(name: str, model: bytes, options: Dict[str, Any]) -> Tuple[Optional[Dict[str, bytes]],
                                                                                    Optional[str]]:
    """Build the model file `name` (its bytes) as `tether compile` does; ({file: bytes} of the folder, None) or
    (None, the error's one line)."""
    import tether
    from tether.frontend import from_onnx
    from tether.frontend.model_file import load_model_file

    shapes = {k: tuple(v) for k, v in (options.get("input_shapes") or {}).items()}
    with tempfile.TemporaryDirectory(prefix="tether-build-") as tmp:
        path = os.path.join(tmp, os.path.basename(name))
        with open(path, "wb") as fh:
            fh.write(model)
        try:
            proto, base_dir = load_model_file(path, shape=shapes)
            graph, params = from_onnx(proto, shape=shapes, base_dir=base_dir)
            factory = tether.build_graph(graph, params, target=options.get("target", "host"),
                                         opt_level=int(options.get("opt_level", 3)),
                                         fast_math=bool(options.get("fast_math", False)))
            out = os.path.join(tmp, "out")
            factory.export(out)
        except Exception as exc:   # noqa: BLE001 - any failure of a model's build is that model's result
            return None, "%s: %s" % (type(exc).__name__, exc)
        files = {}
        for entry in sorted(os.listdir(out)):
            with open(os.path.join(out, entry), "rb") as fh:
                files[entry] = fh.read()
        return files, None


# ---------------------------------------------------------------------------------------------------------------
# the driver side

class RayCluster:
    """This process's link to a Ray cluster: the artifact store and the nodes' CPUs and versions."""

    def __init__(self, address: str, store: str = STORE_NAME):
        self.ray = connect(address)
        self.remote = _remote()
        # on the head node: the cluster ends with it anyway, while a worker node may go at any time
        self.store = self.remote["store"].options(
            name=store, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            resources={HEAD_RESOURCE: 0.001}).remote(STORE_MAX_MB << 20)
        self.cpus = max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        self.check_versions()

    def on_every_node(self, name: str, *args: Any) -> List[Any]:
        """Run the remote function `name` once on every alive node with CPUs; its results."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in self.ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
        refs = [self.remote[name].options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(*args)
            for n in nodes]
        try:
            return self.ray.get(refs, timeout=300)
        except Exception as exc:   # noqa: BLE001 - Ray's error carries the node's traceback: one line of it here
            lines = [line for line in str(exc).splitlines() if line.strip()]
            raise TetherError("a Ray node cannot run tether's builds (install the same tether and llvmlite on "
                              "every node): %s" % (lines[-1] if lines else type(exc).__name__)) from None

    def check_versions(self) -> None:
        """Every node builds with this process's tether and LLVM, or the cached keys would lie: refuse a node that
        does not (one line naming it)."""
        mine = versions()
        for node, theirs in self.on_every_node("node_versions"):
            if theirs != mine:
                raise TetherError("Ray node %s builds with %s, this machine with %s: install the same tether and "
                                  "llvmlite on every node" % (node[:12], theirs, mine))

    def stored(self) -> int:
        """Artifacts in the cluster's store."""
        return int(self.ray.get(self.store.count.remote(), timeout=60))

    def activity(self) -> Dict[str, Dict[str, int]]:
        """Per node id, the build tasks that started with this store and those that finished (a build whose node
        died started, and started again elsewhere)."""
        return self.ray.get(self.store.activity.remote(), timeout=60)


class RayBuilder:
    """The tuner's Builder on a Ray cluster: the same ``submit(cand, done)`` / ``close()``; ``jobs`` is the
    cluster's CPUs. ``stats``: builds run on the cluster, hits in its store, in this run and in the local cache."""

    def __init__(self, tasks: Sequence[Any], workdir: str, address: str,
                 on_built: Optional[Callable[[Any, str], None]] = None, store: str = STORE_NAME,
                 task_options: Optional[Dict[str, Any]] = None):
        self.cluster = RayCluster(address, store)
        # Ray's options of every build task: e.g. resources={"builder": 1} to build only on the nodes started
        # with that custom resource, or another scheduling strategy. SPREAD by default: Ray's default policy
        # keeps a driver's tasks on its own node while that node keeps up, and a run's queue of builds then
        # drains there while other nodes wait
        self.task_options = {"scheduling_strategy": "SPREAD", **(task_options or {})}
        self.ray = self.cluster.ray
        self.tasks = tasks
        self.workdir = workdir
        self.jobs = self.cluster.cpus
        self.on_built = on_built           # (cand, node id) as each build comes back: tests kill that node
        self._seq = itertools.count()
        self._lock = threading.RLock()     # a Ray future that is already done runs its callback at once
        self._running: Dict[str, "cf.Future[tuple]"] = {}     # key -> the build's result, queued or running
        # builds wait here, not in Ray, while `jobs` run and one more waits: a Ray worker that finishes a task
        # takes the next one of its owner's queue, so a long queue held by Ray drains on the nodes that were first
        # while a node that frees up later waits; with one build waiting in Ray, the first node to finish takes it
        # at once and no node waits for a dispatch
        self._queue: "deque[tuple]" = deque()
        self._active = 0
        self.stats = {"built": 0, "cluster_hits": 0, "run_hits": 0, "local_hits": 0, "errors": 0}
        self._digest = uuid.uuid4().hex          # this run's tasks, as the workers keep them
        # in a list: Ray would otherwise hand every build the tasks themselves, unpickled again each time; the
        # workers keep them by digest instead
        self._tasks_box = [self.ray.put(list(tasks))]
        self.cluster.on_every_node("preload_tasks", self._tasks_box, self._digest)

    def submit(self, cand: Any, done: Callable[[Any, Optional[str]], None]) -> None:
        """Build `cand` (from a cache when its key is there); then `done(cand, error)` with cand.path set."""
        key = artifact_key(self.tasks[cand.task], cand.config)
        hit = _local_load(key)
        if hit is not None:
            with self._lock:
                self.stats["local_hits"] += 1
            self._deliver(cand, done, hit["blob"], hit["error"], 0.0)
            return
        with self._lock:
            fut = self._running.get(key)
            if fut is not None:
                self.stats["run_hits"] += 1
            else:
                fut = self._running[key] = cf.Future()
                fut.add_done_callback(lambda f, k=key: self._count(k, f))
                self._queue.append((key, cand, fut))

        def finished(f: "cf.Future[tuple]") -> None:
            try:
                blob, error, seconds, node, _ = f.result()
            except Exception as exc:   # noqa: BLE001 - every retry failed (nodes died): this build's error
                blob, error, seconds, node = None, "the build failed on the Ray cluster: %s" % (
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__), 0.0, ""
            if self.on_built is not None and node:
                self.on_built(cand, node)
            self._deliver(cand, done, blob, error, seconds)

        fut.add_done_callback(finished)
        self._pump()

    def _pump(self) -> None:
        """Send queued builds to the cluster while fewer than `jobs` + 1 are there."""
        with self._lock:
            while self._active < self.jobs + 1 and self._queue:
                key, cand, fut = self._queue.popleft()
                self._active += 1
                try:
                    ref = self.remote_build(key, cand)
                except Exception as exc:   # noqa: BLE001 - a cluster that refuses work: this build's error
                    self._active -= 1
                    fut.set_exception(exc)
                    continue
                ref.future().add_done_callback(lambda rf, f=fut: self._landed(rf, f))

    def _landed(self, ray_future: "cf.Future[tuple]", fut: "cf.Future[tuple]") -> None:
        with self._lock:
            self._active -= 1
        try:
            fut.set_result(ray_future.result())
        except Exception as exc:   # noqa: BLE001 - handed on to whoever waits for this build
            fut.set_exception(exc)
        self._pump()

    def remote_build(self, key: str, cand: Any) -> Any:
        fn = self.cluster.remote["build_candidate"].options(**self.task_options)
        return fn.remote(self.cluster.store, self._tasks_box, self._digest, cand.task, cand.config, key)

    def _count(self, key: str, fut: "cf.Future[tuple]") -> None:
        try:
            blob, error, _, _, cached = fut.result()
        except Exception:   # noqa: BLE001 - counted as the build's error where it is delivered
            with self._lock:
                self.stats["errors"] += 1
                self._running.pop(key, None)       # a later request may try again
            return
        with self._lock:
            self.stats["cluster_hits" if cached else "built"] += 1
        _local_store(key, blob, error)

    def _deliver(self, cand: Any, done: Callable[[Any, Optional[str]], None], blob: Optional[bytes],
                 error: Optional[str], seconds: float) -> None:
        cand.build_s = seconds
        if blob is None:
            cand.path = None
            done(cand, error or "the build returned nothing")
            return
        path = os.path.join(self.workdir, "c%d.so" % next(self._seq))
        with open(path, "wb") as fh:
            fh.write(blob)
        cand.path = path
        done(cand, None)

    def close(self) -> None:
        with self._lock:
            queued = [fut for _, _, fut in self._queue]
            self._queue.clear()
        for fut in queued:
            fut.cancel()


def build_models(address: str, models: Sequence[Tuple[str, bytes]], options: Dict[str, Any],
                 on_done: Optional[Callable[[str, Optional[Dict[str, bytes]], Optional[str], str], None]] = None,
                 store: str = STORE_NAME) -> List[Tuple[Optional[Dict[str, bytes]], Optional[str], str]]:
    """Build every (name, bytes) model on the cluster at `address` (the same model once), with `options` (target,
    opt_level, fast_math, input_shapes); per model ({file: bytes}, error, how: built | cluster | local)."""
    cluster = RayCluster(address, store)
    futures: Dict[str, Any] = {}
    out: List[Tuple[Optional[Dict[str, bytes]], Optional[str], str]] = []
    keys = []
    for name, data in models:
        key = model_key(data, os.path.splitext(name)[1].lower(), options)
        keys.append(key)
        if key in futures or _local_load(key) is not None:
            continue
        futures[key] = cluster.remote["build_model"].remote(cluster.store, os.path.basename(name), data, options,
                                                            key)
    fetched: Dict[str, tuple] = {}
    for key, ref in futures.items():
        try:
            files, error, _, _, cached = cluster.ray.get(ref)
        except Exception as exc:   # noqa: BLE001 - every retry failed: this model's error
            files, error, cached = None, "the build failed on the Ray cluster: %s" % str(exc).splitlines()[0], False
        else:
            _local_store(key, None if files is None else msgpack.packb(files, use_bin_type=True), error)
        fetched[key] = (files, error, "cluster" if cached else "built")
    for (name, _), key in zip(models, keys):
        if key in fetched:
            files, error, how = fetched[key]
        else:
            hit = _local_load(key) or {"blob": None, "error": "the local cache lost its entry"}
            files = msgpack.unpackb(hit["blob"], raw=False) if hit["blob"] is not None else None
            error, how = hit["error"], "local"
        if on_done is not None:
            on_done(name, files, error, how)
        out.append((files, error, how))
    return out
