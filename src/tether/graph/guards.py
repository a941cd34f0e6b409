"""Run-time branch guards: which kernels the graph executor may skip.

A run-time ONNX ``If`` is imported as both branches plus ``where(flag, then, else)`` per output
(frontend/onnx/control_flow.py), which is correct when every node runs. Each branch node also carries
``attrs[GUARD_ATTR] = [[flag, taken], ...]``: it is needed only when every ``flag`` equals ``taken``. This module
turns those marks into the guards ``deploy.json`` gives the executor (a node's ``"when"``), keeping one rule:
**a node that runs never reads a value a skipped node should have written**, except an unfused ``where`` reading
its two choices (it selects the taken one, whatever bytes the other holds), fused or not. So:
- a fused node's guard is what all its members share (a mixed group runs always);
- walking back from the outputs, a producer keeps only the guards all its readers have (a value read by an
  unguarded node is always computed); graph outputs are always computed;
- a guard whose flag is not a value of its own in the graph (fused away) is dropped.
Dropping guards only means more kernels run: an executor that ignores ``"when"`` (the Go one) gives the same
results.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, List, Set, Tuple

from tether.graph.ir import Graph

GUARD_ATTR = "_when"
Guard = Tuple[str, bool]


def node_guards(graph: Graph, params) -> List[FrozenSet[Guard]]:
    """Per node of ``graph`` (in order), the (flag value, required truth) pairs that must all hold for it to run."""
    nodes = graph.nodes
    values: Set[str] = set(graph.inputs) | set(params) | {o for n in nodes for o in n.outputs}
    guards: List[FrozenSet[Guard]] = []
    for n in nodes:
        sets = [frozenset((str(v), bool(t)) for v, t in b.attrs.get(GUARD_ATTR, [])) for b in n.body()]
        common = frozenset.intersection(*sets) if sets else frozenset()
        guards.append(frozenset(g for g in common if g[0] in values))
    producer: Dict[str, int] = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    for o in graph.outputs:
        if o in producer:
            guards[producer[o]] = frozenset()
    # consumers come after producers: one backward pass settles every producer after all its readers
    for k in range(len(nodes) - 1, -1, -1):
        n = nodes[k]
        choices = _choices_only(n)
        for v in n.inputs:
            p = producer.get(v)
            if p is None or v in choices:
                continue
            narrowed = guards[p] & guards[k]
            if narrowed != guards[p]:
                guards[p] = narrowed
    return guards


def _choices_only(node) -> Set[str]:
    """Values the node reads only as a ``where``'s choices (inputs 1 and 2), never otherwise."""
    readers: Dict[str, List[Tuple[str, int]]] = {}
    for b in node.body():
        for pos, v in enumerate(b.inputs):
            readers.setdefault(v, []).append((b.op, pos))
    return {v for v, rs in readers.items() if all(op == "where" and pos in (1, 2) for op, pos in rs)}
