"""Byte relay between a client and a reverse-mode device: two pumps, closed together."""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

CHUNK = 1 << 20


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            # drain only when the kernel pushes back, so small frames are not delayed by a scheduling round
            if writer.transport.get_write_buffer_size() > 4 * CHUNK:
                await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def relay(client: "tuple[asyncio.StreamReader, asyncio.StreamWriter]",
                device: "tuple[asyncio.StreamReader, asyncio.StreamWriter]") -> int:
    """Copy bytes both ways until both directions end (or one side breaks); closes both connections."""
    up = asyncio.ensure_future(_pump(client[0], device[1]))
    down = asyncio.ensure_future(_pump(device[0], client[1]))
    try:
        done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        # a session ends when either side closes; give the other direction a moment to flush its tail
        await asyncio.wait(pending, timeout=2.0)
        for task in pending:
            task.cancel()
    finally:
        for _, writer in (client, device):
            writer.close()
    return 0
