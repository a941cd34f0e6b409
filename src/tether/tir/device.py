"""Device kernels: the part of a lowered kernel that runs on a GPU, in the form every GPU backend takes.

A te schedule binds loops to GPU thread indices (``s[C].bind(axis, te.thread_axis("blockIdx.x"))``); lowering
keeps those loops as ``For`` nodes of kind ``"thread"`` (the tag in ``For.thread_tag``), and the host/device split
turns each group of them into one :class:`DeviceKernel`: the loops disappear, their variables become the thread
indices (``thread_of``), and their extents become the launch's ``grid`` (work-groups, CUDA blocks) and ``block``
(threads per work-group). The backends (OpenCL C, SPIR-V for Vulkan, PTX for CUDA) translate a DeviceKernel;
the device runtimes launch it with the same argument order on every API:

- the ``params`` buffers first, in order: global memory pointers (OpenCL ``__global T*``, CUDA ``.param .u64``,
  Vulkan storage buffers at binding k of descriptor set 0);
- then the ``scalars``, each an int32 (OpenCL/CUDA kernel arguments, Vulkan push constants in order).

Memory scopes (``Buffer.scope``) inside the body: ``"param"`` (a kernel argument), ``"shared"`` (work-group
memory, OpenCL ``__local``, CUDA ``.shared``, Vulkan ``Workgroup``) and ``"local"`` (per-thread registers or
private memory). A :class:`Barrier` makes every thread of the work-group wait and the shared memory written
before it visible after it; it may only appear where every thread of the work-group reaches it.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, List, Sequence, Tuple

from tether.tir.buffer import Buffer
from tether.tir.dtype import bits
from tether.tir.expr import Var
from tether.tir.stmt import Allocate, Stmt
from tether.tir.visit import walk

#: the thread indices a loop can be bound to; "blockIdx" counts work-groups, "threadIdx" threads in one
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


def tag_dim(tag: str) -> int:
    """0, 1 or 2: the launch dimension of a thread tag (``"threadIdx.y"`` -> 1)."""
    return "xyz".index(tag[-1])


class Barrier(Stmt):
    """A work-group barrier with a shared-memory fence (OpenCL ``barrier(CLK_LOCAL_MEM_FENCE)``, CUDA
    ``__syncthreads()``, SPIR-V ``OpControlBarrier Workgroup``)."""

    def _lines(self, pad: str, out: List[str]) -> None:
        out.append(f"{pad}barrier()")


class DeviceKernel:
    """One GPU kernel and its launch: ``grid`` work-groups of ``block`` threads, per dimension x, y, z.

    ``thread_of`` maps the variables of the body that are thread indices to their tag; ``needs`` names the
    optional device features the code uses (``"fp16"``, ``"int8_dot"``, ``"subgroups"``), which a device without
    them refuses at load.
    """

    def __init__(self, name: str, params: Sequence[Buffer], body: Stmt, thread_of: Dict[Var, str],
                 grid: Tuple[int, int, int], block: Tuple[int, int, int], scalars: Sequence[Var] = (),
                 needs: FrozenSet[str] = frozenset()):
        self.name = name
        self.params = list(params)
        self.scalars = list(scalars)
        self.body = body
        self.thread_of = dict(thread_of)
        self.grid = tuple(int(g) for g in grid)
        self.block = tuple(int(b) for b in block)
        self.needs = frozenset(needs)

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def shared_bytes(self) -> int:
        """Work-group memory the body allocates (what the launch checks against the device's limit)."""
        return sum(s.buffer.size * max(bits(s.buffer.dtype) // 8, 1) for s in walk(self.body)
                   if isinstance(s, Allocate) and s.buffer.scope == "shared")

    def launch_info(self) -> Dict[str, object]:
        """What a module's metadata records for the runtime to launch this kernel."""
        return {"name": self.name, "grid": list(self.grid), "block": list(self.block),
                "params": [{"name": b.name, "dtype": b.dtype, "size": b.size} for b in self.params],
                "scalars": [v.name for v in self.scalars], "shared_bytes": self.shared_bytes(),
                "needs": sorted(self.needs)}

    def __str__(self) -> str:
        params = ", ".join(f"{b.name}: {b.dtype}[{b.size}]" for b in self.params)
        out = [f"kernel {self.name}({params}) grid={self.grid} block={self.block}"]
        out.extend(f"  # {v.name} = {tag}" for v, tag in self.thread_of.items())
        self.body._lines("  ", out)
        return "\n".join(out)

    __repr__ = __str__
