"""The device runtime, re-exported for host use: load and call modules built for this machine.

    from tether import runtime
    m = runtime.load_module("vadd.so")
    m["vadd"](a, b, c)                      # numpy arrays (zero-copy) or runtime.NDArray
The implementation lives in ``tether_rpc`` (it is the same code the device server runs).
"""
from tether_rpc.device_info import device_info  # noqa: F401
from tether_rpc.host_functions import get_func, list_funcs, register_func, remove_func  # noqa: F401
from tether_rpc.module import Module, PackedFunc, inspect_module, load_module, read_metadata  # noqa: F401
from tether_rpc.ndarray import NDArray, empty, from_numpy  # noqa: F401
from tether_rpc.parallel import get_num_threads, set_num_threads  # noqa: F401
from tether_rpc.timing import time_evaluator  # noqa: F401

__all__ = ["load_module", "inspect_module", "read_metadata", "Module", "PackedFunc", "NDArray", "empty", "from_numpy",
           "time_evaluator", "device_info", "set_num_threads", "get_num_threads", "register_func", "get_func",
           "list_funcs", "remove_func"]
