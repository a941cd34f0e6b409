"""In-process execution with the same API as a remote session (the embedded default, host target).

:class:`LocalSession` drives the very ``SessionHandler`` the device server's workers use, without sockets or
frames, so code written against a RemoteSession runs unchanged on the host. Differences: a crashing kernel takes
the calling process with it (there is no worker to sacrifice), and exceptions arrive as their original classes
rather than as RemoteError.
"""
from __future__ import annotations

import shutil
import tempfile
from typing import Any, Callable, Dict, List, Optional

from tether_rpc.errors import ConnectionClosed
from tether_rpc.transport import byte_view
from tether_rpc.session import BulkIn, SessionHandler

from .client import FileSource, Progress, SessionAPI


class LocalSession(SessionAPI):
    """A session in this process; its folder is a fresh temporary directory removed by ``close()``."""

    def __init__(self, *, on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
                 on_log: Optional[Callable[[str, str], None]] = None,
                 on_sample: Optional[Callable[[int, float], None]] = None):
        super().__init__(on_event=on_event, on_log=on_log, on_sample=on_sample)
        self.folder = tempfile.mkdtemp(prefix="tether-local-")
        self._handler = SessionHandler(self.folder)

    def _emit(self, kind: str, fields: Dict[str, Any], defer: bool = False) -> None:
        self._dispatch_event(fields)

    def _call(self, fn: Any, args: List[Any], bulk: Any = None, into: Optional[memoryview] = None,
              progress: Optional[Progress] = None) -> Dict[str, Any]:
        if self.closed:
            raise ConnectionClosed("the local session is closed")
        if bulk is None:
            reply = self._handler.call(fn, args, None, self._emit)
        elif isinstance(bulk, FileSource):
            with open(bulk.path, "rb") as fh:
                reply = self._handler.call(fn, args, _file_bulk(fh, bulk.size, progress), self._emit)
        else:
            source = BulkIn.from_buffer(bulk)
            reply = self._handler.call(fn, args, source, self._emit)
            if progress is not None:
                progress(source.nbytes, source.nbytes)
        payload = reply.payload()
        if reply.has_bulk:
            if reply.buffer is not None:
                data = byte_view(reply.buffer)
                if into is not None:
                    if data.nbytes:
                        into[:] = data
                    payload["data"] = into
                else:
                    payload["data"] = bytearray(data)
            else:
                with reply.file as fh:
                    payload["data"] = bytearray(fh.read())
                if progress is not None:
                    progress(reply.size, reply.size)
        return payload

    def close(self) -> None:
        """Free everything and delete the session folder. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._handler.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __repr__(self) -> str:
        return "LocalSession(%s%s)" % (self.folder, ", closed" if self.closed else "")


def _file_bulk(fh: Any, size: int, progress: Optional[Progress]) -> BulkIn:
    done = {"n": 0}

    def readinto(view: memoryview) -> None:
        pos = 0
        while pos < len(view):
            n = fh.readinto(view[pos:])
            if not n:
                raise ConnectionClosed("file shrank while uploading")
            pos += n
        done["n"] += len(view)
        if progress is not None:
            progress(done["n"], size)

    return BulkIn(size, readinto)
