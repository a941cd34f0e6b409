"""A simple static memory planner.

Every value gets a storage id and a byte offset in it. Graph inputs, outputs and params own their storage. A
``reshape`` (the only ``alias`` op) shares its input's storage and offset. The inputs of a concat marked as a
view (``passes/concat_views.py``) live inside the concat's output at their offsets, nested concats too, so a
whole view tree is one storage the size of its root, allocated when its first member is written and kept until
the last read of any member (so nobody else writes it while a view is live). Every other intermediate takes the
best-fitting free storage (the smallest one large enough, else the largest one, grown), and gives it back after
its last reader runs. Outputs are allocated before the node's inputs are released, so a kernel never reads and
writes the same bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from tether.graph import op_info
from tether.graph.ir import Graph, Node
from tether.graph.passes.concat_views import is_concat_view, view_layout


@dataclass
class MemoryPlan:
    storage_of: Dict[str, int] = field(default_factory=dict)   # value name -> storage id
    offset_of: Dict[str, int] = field(default_factory=dict)    # value name -> byte offset in its storage
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
            off = self.offset_of.get(v, 0)
            by_sid.setdefault(s, []).append("%s@%d" % (v, off) if off else v)
        for s, size in enumerate(self.sizes):
            lines.append("  s%d %d B: %s" % (s, size, ", ".join(by_sid.get(s, []))))
        return "\n".join(lines)


def needs_kernel(node: Node) -> bool:
    """False for a node whose outputs are views of bytes its inputs already hold (a reshape, a concat marked by
    concat_views): the planner places those values, no kernel runs."""
    return not (op_info.is_alias(node) or is_concat_view(node))


def plan_memory(graph: Graph, params: Dict[str, np.ndarray]) -> MemoryPlan:
    plan = MemoryPlan()
    pinned = set()

    def new_storage(nbytes: int) -> int:
        plan.sizes.append(int(nbytes))
        return len(plan.sizes) - 1

    for name in list(graph.inputs) + sorted(params):
        plan.storage_of[name] = new_storage(graph.types[name].nbytes if name in graph.types else params[name].nbytes)
        plan.offset_of[name] = 0
        pinned.add(plan.storage_of[name])
    # home: value -> (the value that owns the bytes, offset in it). The owner's storage holds the value.
    home: Dict[str, Tuple[str, int]] = dict(view_layout(graph))
    for node in graph.nodes:
        if op_info.is_alias(node):
            home[node.outputs[0]] = home.get(node.inputs[0], (node.inputs[0], 0))
    # pending reads per storage, counting reads of every value that shares the owner's bytes
    reads: Dict[str, int] = {}
    for node in graph.nodes:
        for i in node.inputs:
            owner = home.get(i, (i, 0))[0]
            reads[owner] = reads.get(owner, 0) + 1
    output_owners = {home.get(o, (o, 0))[0] for o in graph.outputs}
    sid_of_owner: Dict[str, int] = {name: plan.storage_of[name] for name in plan.storage_of}
    pending: Dict[int, int] = {}
    free: List[int] = []

    for node in graph.nodes:
        free_view = not needs_kernel(node)
        for o in node.outputs:
            owner, offset = home.get(o, (o, 0))
            plan.offset_of[o] = offset
            if not op_info.is_alias(node):
                plan.naive_bytes += graph.types[o].nbytes
            if owner in sid_of_owner:       # a view of bytes that already have a place
                plan.storage_of[o] = sid_of_owner[owner]
                continue
            if free_view:
                raise ValueError("memory plan: %s (%s) is a view of %r, which has no storage yet"
                                 % (node.name, node.op, owner))
            nbytes = graph.types[owner].nbytes
            if owner in output_owners:
                sid = new_storage(nbytes)
                pinned.add(sid)
            else:
                fits = [s for s in free if plan.sizes[s] >= nbytes]
                if fits:
                    sid = min(fits, key=lambda s: plan.sizes[s])
                elif free:
                    sid = max(free, key=lambda s: plan.sizes[s])
                    plan.sizes[sid] = nbytes
                else:
                    sid = new_storage(nbytes)
                if sid in free:
                    free.remove(sid)
            sid_of_owner[owner] = sid
            plan.storage_of[o] = sid
            pending[sid] = pending.get(sid, 0) + reads.get(owner, 0)
        for i in node.inputs:
            sid = plan.storage_of[i]
            if sid in pinned:
                continue
            pending[sid] -= 1
            if pending[sid] == 0:
                free.append(sid)
    # values nobody reads (dead outputs of multi-output nodes) still need a place to be written
    return plan
