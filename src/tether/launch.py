"""Start tether services (device server, tracker, emulated device) as child processes and wait until they listen.

Every service logs one line ``... listening on HOST:PORT`` when it is ready; waiting for that line (with a deadline)
is how callers know it is up, never a fixed sleep. Processes are stopped by their own PID: terminate, wait, kill.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import TetherError, TetherTimeout

LISTEN_RE = re.compile(r"listening on \[?([0-9A-Za-z.:-]+?)\]?:(\d+)")


class ServiceError(TetherError):
    """A child service exited or misbehaved before it was ready."""


class ServiceProcess:
    """A child process that announces ``listening on HOST:PORT``; a context manager that stops it on exit."""

    def __init__(self, argv: Sequence[str], *, name: str = "service", env: Optional[Dict[str, str]] = None,
                 start_timeout: float = 30.0, log_path: Optional[pathlib.Path] = None,
                 cwd: Optional[str] = None):
        self.name = name
        self.argv = list(argv)
        if log_path is None:
            fd, path = tempfile.mkstemp(prefix="tether-%s-" % name, suffix=".log")
            os.close(fd)
            log_path = pathlib.Path(path)
        self.log_path = pathlib.Path(log_path)
        self._log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=cwd)
        self.pid = self.proc.pid
        try:
            self.host, self.port = self._wait_listening(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self, timeout: float) -> Tuple[str, int]:
        deadline = time.monotonic() + timeout
        delay = 0.002
        while True:
            m = LISTEN_RE.search(self.log_text())
            if m:
                return m.group(1), int(m.group(2))
            if self.proc.poll() is not None:
                raise ServiceError("%s exited with status %s before listening:\n%s"
                                   % (self.name, self.proc.returncode, self.log_text()[-4000:]))
            if time.monotonic() > deadline:
                raise TetherTimeout("%s did not report 'listening on' within %.0f s; its log:\n%s"
                                    % (self.name, timeout, self.log_text()[-4000:]))
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    @property
    def address(self) -> str:
        return "%s:%d" % (self.host, self.port)

    def log_text(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> Optional[int]:
        """Terminate, wait, then kill; idempotent. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServiceProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rpc_server_argv(*args: str, python: Optional[str] = None) -> List[str]:
    """argv for a device server from this checkout/installation (``python -m tether_rpc``)."""
    return [python or sys.executable, "-m", "tether_rpc", *args]


def start_rpc_server(*args: str, **kw) -> ServiceProcess:
    """Start ``python -m tether_rpc ARGS`` on loopback (defaults: 127.0.0.1, a free port from 9090)."""
    return ServiceProcess(rpc_server_argv(*args), name="rpc-server", **kw)


def start_tracker(*args: str, **kw) -> ServiceProcess:
    """Start ``rpc-tracker ARGS`` (``python -m tether.cli.tracker``) on loopback."""
    return ServiceProcess([sys.executable, "-m", "tether.cli.tracker", *args], name="rpc-tracker", **kw)
