"""Host-side errors: everything in ``tether_rpc.errors`` plus the compiler's own.

    TetherError
    ├── ... (see tether_rpc.errors)
    ├── CompileError             lowering or LLVM code generation failed
    │   ├── ScheduleError        an illegal schedule; the message says why
    │   └── UnsupportedOpError   an op / dtype / target combination tether cannot compile (also NotImplementedError)
    ├── LinkerNotFound           no ld.lld: install the ziglang wheel (pip install ziglang) or a system lld
    └── InvalidInput             a file, folder or value the user gave is not what tether expects (also ValueError);
                                 the message names it and says what was expected; the CLI prints it as one line
                                 and exits with status 2
"""
from tether_rpc.errors import *  # noqa: F401,F403 - one tree for host and device
from tether_rpc.errors import TetherError


class CompileError(TetherError):
    pass


class ScheduleError(CompileError):
    pass


class UnsupportedOpError(CompileError, NotImplementedError):
    pass


class LinkerNotFound(TetherError):
    pass


class InvalidInput(TetherError, ValueError):
    """A file, folder or value given to tether is not what was expected (a foreign model format, a truncated file,
    an unknown target). The message is one line that names the thing and says what was expected."""
