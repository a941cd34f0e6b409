"""CLOSE in the middle of a running call frees the device at once (docs/protocol.md, "Calls").

Real server processes, a real gcc-built kernel that spins for minutes, raw sockets that keep the connection open
after CLOSE (so it is the CLOSE, not a hang-up, that ends the session), and the next client's real work checked
against numpy.
"""
from __future__ import annotations

import os
import socket

import numpy as np

from fixtures.polling import HANG_S, wait_until
from tether import rpc
from tether_rpc import handshake, protocol as p, transport
from tether_rpc.watchdog import queued_close

LONG = 1 << 40  # spin iterations: minutes of work


def session_dirs(server):
    return os.listdir(server.log_path.parent / (server.log_path.stem + "-sessions"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (0 once it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_spin_session(server, misc_so):
    """A raw session with misc.so loaded: (sock, reader, spin function handle)."""
    sock = socket.create_connection((server.host, server.port), timeout=10)
    transport.configure_socket(sock)
    reader = transport.FrameReader(sock)
    sock.sendall(p.encode_frame(p.MsgType.HELLO, 0, handshake.hello_payload()))
    while True:  # the previous test's session may still be ending: wait in the queue
        msg_type, _, payload = reader.read_frame()
        if msg_type == p.MsgType.WELCOME:
            break
        assert (msg_type, payload["kind"]) == (p.MsgType.EVENT, "queued")
    transport.send_frame(sock, p.MsgType.CALL, 1, {"fn": "tether.upload", "args": ["misc.so"]},
                         bulk=misc_so.read_bytes())
    assert reader.read_frame()[0] == p.MsgType.RETURN
    sock.sendall(p.encode_frame(p.MsgType.CALL, 2, {"fn": "tether.module.load", "args": ["misc.so"]}))
    module = reader.read_frame()[2]["value"]["handle"]
    sock.sendall(p.encode_frame(p.MsgType.CALL, 3, {"fn": "tether.module.get_function", "args": [module, "spin"]}))
    return sock, reader, reader.read_frame()[2]["value"]["handle"]


def wait_for_running_kernel(server) -> int:
    (worker,) = wait_until(server.worker_pids, HANG_S, "the session worker")
    start = cpu_seconds(worker)
    wait_until(lambda: cpu_seconds(worker) - start >= 0.2, HANG_S, "the kernel to burn 0.2 s of CPU")
    return worker


def closed_without_answer(sock) -> None:
    """The server closes the connection; fails if any frame (EVENT, RETURN, ERROR) arrives first. The kernels run
    for minutes (LONG), so a close seen within HANG_S is one that did not wait for them."""
    sock.settimeout(HANG_S)
    data = sock.recv(4096)
    assert data == b"", "the aborted call still answered: %r" % data[:60]


def next_client_works(server, vadd_so):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(1024).astype("float32"), rng.standard_normal(1024).astype("float32")
    with rpc.connect(server.host, server.port, timeout=10, wait=False) as remote:
        assert remote.listdir() == []  # a fresh session folder
        remote.upload(vadd_so)
        c = np.zeros(1024, "float32")
        remote.load_module("vadd.so")["vadd"](a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_close_mid_kernel_frees_the_device(rpc_server, rpc_kernels):
    sock, reader, spin = open_spin_session(rpc_server, rpc_kernels["misc"])
    try:
        sock.sendall(p.encode_frame(p.MsgType.CALL, 4, {"fn": spin, "args": [LONG]}))
        worker = wait_for_running_kernel(rpc_server)
        sock.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {"reason": "test"}))
        closed_without_answer(sock)  # the server closes the connection once it has reaped the worker
        assert worker not in rpc_server.worker_pids()
    finally:
        sock.close()
    wait_until(lambda: session_dirs(rpc_server) == [], HANG_S, "the session folder to be deleted")
    next_client_works(rpc_server, rpc_kernels["vadd"])
    assert rpc_server.alive


def test_close_behind_pipelined_calls_aborts_them_all(rpc_server, rpc_kernels):
    # CALL spin, then (pipelined, before any answer) a CALL with bulk bytes and an echo, then CLOSE: the watchdog
    # finds the CLOSE behind them, bulk skipped, and none of the three calls answers.
    sock, reader, spin = open_spin_session(rpc_server, rpc_kernels["misc"])
    try:
        sock.sendall(p.encode_frame(p.MsgType.CALL, 4, {"fn": spin, "args": [LONG]}))
        wait_for_running_kernel(rpc_server)
        junk = bytes(range(256)) * 64  # bulk bytes that are not frames
        sock.sendall(p.encode_frame(p.MsgType.CALL, 5, {"fn": "tether.upload", "args": ["x.bin"],
                                                        "nbytes": len(junk)}) + junk
                     + p.encode_frame(p.MsgType.CALL, 6, {"fn": "tether.echo", "args": [1]})
                     + p.encode_frame(p.MsgType.CLOSE, 0, {}))
        closed_without_answer(sock)
    finally:
        sock.close()
    next_client_works(rpc_server, rpc_kernels["vadd"])


def test_close_between_calls_still_ends_the_session_normally(rpc_server, rpc_kernels):
    # A short call before CLOSE is answered in full: only a call still running when CLOSE arrives is aborted.
    sock, reader, spin = open_spin_session(rpc_server, rpc_kernels["misc"])
    try:
        sock.sendall(p.encode_frame(p.MsgType.CALL, 4, {"fn": spin, "args": [1000]}))
        assert reader.read_frame()[:2] == (p.MsgType.RETURN, 4)
        sock.sendall(p.encode_frame(p.MsgType.CLOSE, 0, {}))
        closed_without_answer(sock)
    finally:
        sock.close()
    wait_until(lambda: not rpc_server.worker_pids(), HANG_S, "the worker to exit")


# -- the scan itself (sans-IO) ----------------------------------------------------------------------------------
def test_queued_close_scans_frames_and_skips_bulk_bytes():
    close = p.encode_frame(p.MsgType.CLOSE, 0, {})
    call = p.encode_frame(p.MsgType.CALL, 9, {"fn": "tether.echo", "args": [1]})
    # bulk bytes that hold a CLOSE frame's bytes must be skipped, not read as a CLOSE
    bulk_call = p.encode_frame(p.MsgType.CALL, 10, {"fn": "tether.upload", "args": ["a"], "nbytes": len(close)})
    assert queued_close(close)
    assert queued_close(call + call + close)
    assert not queued_close(call)
    assert not queued_close(bulk_call + close)              # the CLOSE is the upload's content
    assert queued_close(bulk_call + close + close)
    assert not queued_close((call + close)[:len(call) + 3])  # cut short: not (yet) a CLOSE
    assert not queued_close(b"\xff\xff\xff\xff" + close)     # an oversized header stops the scan
    assert not queued_close(p.HEADER.pack(3) + b"\xc1\xc1\xc1" + close)  # so does an undecodable body
