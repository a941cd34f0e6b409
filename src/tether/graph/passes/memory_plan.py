"""A simple static memory planner.

Every value gets a storage id. Graph inputs, outputs and params own their storage. A ``reshape`` (the only
``alias`` op) shares its input's storage. Every other intermediate takes the best-fitting free storage (the
smallest one large enough, else the largest one, grown), and gives it back after its last reader runs. Outputs
are allocated before the node's inputs are released, so a kernel never reads and writes the same buffer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from tether.graph import ops
from tether.graph.ir import Graph


@dataclass
class MemoryPlan:
    storage_of: Dict[str, int] = field(default_factory=dict)   # value name -> storage id
    sizes: List[int] = field(default_factory=list)             # storage id -> bytes
    naive_bytes: int = 0                                       # one buffer per intermediate value

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def __str__(self) -> str:
        lines = ["memory plan: %d storages, %.1f KiB (one buffer per value: %.1f KiB)"
                 % (len(self.sizes), self.total_bytes / 1024.0, self.naive_bytes / 1024.0)]
        by_sid: Dict[int, List[str]] = {}
        for v, s in self.storage_of.items():
            by_sid.setdefault(s, []).append(v)
        for s, size in enumerate(self.sizes):
            lines.append("  s%d %d B: %s" % (s, size, ", ".join(by_sid.get(s, []))))
        return "\n".join(lines)


def plan_memory(graph: Graph, params: Dict[str, np.ndarray]) -> MemoryPlan:
    plan = MemoryPlan()
    pinned = set()

    def new_storage(nbytes: int) -> int:
        plan.sizes.append(int(nbytes))
        return len(plan.sizes) - 1

    for name in list(graph.inputs) + sorted(params):
        plan.storage_of[name] = new_storage(graph.types[name].nbytes if name in graph.types else params[name].nbytes)
        pinned.add(plan.storage_of[name])
    # pending reads per storage, counting reads through aliases
    pending: Dict[int, int] = {}
    free: List[int] = []
    alias_root: Dict[str, str] = {}
    for node in graph.nodes:
        if ops.pattern(node.op) == "alias" if node.op != "fused" else False:
            alias_root[node.outputs[0]] = alias_root.get(node.inputs[0], node.inputs[0])
    reads: Dict[str, int] = {}
    for node in graph.nodes:
        for i in node.inputs:
            root = alias_root.get(i, i)
            reads[root] = reads.get(root, 0) + 1
    outputs_roots = {alias_root.get(o, o) for o in graph.outputs}

    for node in graph.nodes:
        is_alias = node.op != "fused" and ops.pattern(node.op) == "alias"
        for o in node.outputs:
            if is_alias:
                plan.storage_of[o] = plan.storage_of[node.inputs[0]]
                continue
            t = graph.types[o]
            plan.naive_bytes += t.nbytes
            if o in outputs_roots:
                sid = new_storage(t.nbytes)
                pinned.add(sid)
            else:
                fits = [s for s in free if plan.sizes[s] >= t.nbytes]
                if fits:
                    sid = min(fits, key=lambda s: plan.sizes[s])
                elif free:
                    sid = max(free, key=lambda s: plan.sizes[s])
                    plan.sizes[sid] = t.nbytes
                else:
                    sid = new_storage(t.nbytes)
                if sid in free:
                    free.remove(sid)
            plan.storage_of[o] = sid
            pending[sid] = pending.get(sid, 0) + reads.get(o, 0)
        for i in node.inputs:
            sid = plan.storage_of[i]
            if sid in pinned:
                continue
            pending[sid] -= 1
            if pending[sid] == 0:
                free.append(sid)
    # values nobody reads (dead outputs of multi-output nodes) still need a place to be written
    return plan
