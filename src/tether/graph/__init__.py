"""The model graph: IR (``ir``), op definitions (``ops``), a numpy reference interpreter and optimisation
passes (``passes``)."""
from tether.graph.ir import Graph, Node, TensorType

__all__ = ["Graph", "Node", "TensorType"]
