"""The model graph: IR (``ir``), op definitions (``ops``), a numpy reference interpreter (``reference``),
optimisation passes (``passes``), batch-1 convs as GEMMs (``conv_gemm``), node -> te kernels (``to_te``) and the
model build (``build``, which is ``tether.build_graph``). Each module imports only ones listed before it."""
from tether.graph.ir import Graph, Node, TensorType

__all__ = ["Graph", "Node", "TensorType"]
