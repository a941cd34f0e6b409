"""A loopback device pool for the tuning scripts: one `rpc-tracker` and N `rpc-server`s registered under a key
(real processes, stopped by their PIDs)."""
from __future__ import annotations

import contextlib
import tempfile
import time
from typing import Dict, Iterator, Optional

from tether.launch import start_rpc_server, start_tracker
from tether.rpc.tracker_client import connect_tracker


@contextlib.contextmanager
def device_pool(n: int, key: str = "host", timeout: float = 60.0, env: Optional[Dict[str, str]] = None
                ) -> Iterator[str]:
    """Yields the tracker's HOST:PORT once `n` devices (environment `env`) are registered under `key`."""
    with tempfile.TemporaryDirectory(prefix="tether-tune-lab-") as workdir:
        with contextlib.ExitStack() as stack:
            tracker = stack.enter_context(start_tracker("--port", "0"))
            for i in range(n):
                stack.enter_context(start_rpc_server("--port", "0", "--tracker", tracker.address, "--key", key,
                                                     "--workdir", "%s/d%d" % (workdir, i), env=env))
            deadline = time.monotonic() + timeout
            while True:
                with connect_tracker(tracker.host, tracker.port) as tc:
                    have = sum(1 for d in tc.summary()["devices"] if d["key"] == key)
                if have >= n:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("only %d of %d devices registered within %.0f s" % (have, n, timeout))
                time.sleep(0.1)
            yield tracker.address
