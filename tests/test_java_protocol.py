"""The Java implementation of the protocol (android_app/protocol) against the shared vectors and a real server.

The Java sources are compiled with ``javac --release 8`` (what the Android app needs) into a temporary folder, and
two Java mains are run with ``java``:

* ``VectorsRunner`` round-trips every frame of ``tests/vectors/frames.json``, plus edge-of-limit frames built
  here whose verdicts come from the Python implementation, so both sides enforce the same limits;
* ``InteropRunner`` drives real ``python -m tether_rpc`` servers (with and without a token) with the Java client:
  echo of every value kind and a float32 tensor, device_info, remote exceptions, bulk both ways, a gcc-built
  vadd kernel, sample EVENTs from time_evaluator, and the busy/queued paths.

Without a JDK the module is skipped, except under CI (env ``CI`` set), where a missing JDK is a failure.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import threading
import time

import msgpack
import pytest
from fixtures.android_build import android_toolchain_missing, build_apk
from fixtures.prereq import require_tool, unavailable

from tether_rpc import dtypes, handshake, protocol as p, transport
from tether_rpc.errors import FrameTooLarge, ProtocolError

ROOT = pathlib.Path(__file__).resolve().parent.parent
JAVA_ROOT = ROOT / "android_app" / "protocol"
VECTORS = ROOT / "tests" / "vectors" / "frames.json"
SUMMARY_RE = re.compile(r"^(\d+) passed, (\d+) failed$", re.M)
TIMEOUT = 120


def _jdk():
    hint = "apt-get install default-jdk-headless"  # what scripts/test.sh installs
    return require_tool("javac", hint), require_tool("java", hint)


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory):
    """Compile the library and the runners exactly as the Android build does (Java 8 bytecode)."""
    javac, java = _jdk()
    out = tmp_path_factory.mktemp("java-classes")
    sources = sorted(str(s) for s in JAVA_ROOT.rglob("*.java"))
    assert sources, "no Java sources under %s" % JAVA_ROOT
    # -options: newer JDKs warn that release 8 is obsolete, which says nothing about the code
    proc = subprocess.run([javac, "--release", "8", "-Xlint:all,-options", "-encoding", "UTF-8", "-d", str(out),
                           *sources], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, "javac failed:\n%s" % proc.stderr
    assert "warning" not in proc.stderr, proc.stderr
    return java, out


def run_java(java_classes, main: str, *args: str) -> subprocess.CompletedProcess:
    java, classes = java_classes
    return subprocess.run([java, "-Xmx512m", "-cp", str(classes), "dev.tether.rpc.tools." + main, *args],
                          capture_output=True, text=True, timeout=TIMEOUT)


def summary(proc: subprocess.CompletedProcess):
    m = SUMMARY_RE.search(proc.stdout)
    assert m, "no summary line in the output:\n%s\n%s" % (proc.stdout, proc.stderr)
    return int(m.group(1)), int(m.group(2))


# ------------------------------------------------------------------------------------------------------------
# test vectors

def test_shared_vectors_round_trip(java_classes):
    doc = json.loads(VECTORS.read_text())
    proc = run_java(java_classes, "VectorsRunner", str(VECTORS))
    passed, failed = summary(proc)
    assert proc.returncode == 0 and failed == 0, proc.stdout + proc.stderr
    # one check per valid and invalid frame, per message type, per auth exchange, the version and the
    # byte-by-byte stream
    assert doc["auth_exchanges"]
    assert passed == (len(doc["valid"]) + len(doc["invalid"]) + len(doc["msg_types"]) + len(doc["auth_exchanges"])
                      + 2)


def test_vectors_runner_reports_a_broken_vector(java_classes, tmp_path):
    """The runner must notice a frame whose bytes and meaning disagree (so a passing run means something)."""
    doc = json.loads(VECTORS.read_text())
    bad = doc["valid"][5]
    bad["meaning"]["payload"]["args"] = [2]  # the bytes still say 1
    doc["invalid"][0]["error"] = "FrameTooLarge"  # it is a ProtocolError
    doc["auth_exchanges"][0]["token"] += "x"  # the MACs no longer follow from the token
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(doc))
    proc = run_java(java_classes, "VectorsRunner", str(path))
    passed, failed = summary(proc)
    assert proc.returncode == 1
    assert failed == 3, proc.stdout
    assert "FAIL %s" % doc["auth_exchanges"][0]["name"] in proc.stdout
    assert "FAIL %s" % bad["name"] in proc.stdout and "FAIL %s" % doc["invalid"][0]["name"] in proc.stdout


def _frame(body: bytes) -> bytes:
    return p.HEADER.pack(len(body)) + body


def _call(*args) -> bytes:
    return msgpack.packb([5, 1, {"fn": "tether.echo", "args": list(args)}], use_bin_type=True)


def _raw_call(arg: bytes) -> bytes:
    """A CALL body whose single argument is the given raw msgpack bytes."""
    return bytes.fromhex("930501") + bytes.fromhex("82a2666eab") + b"tether.echo" + bytes.fromhex("a46172677391") + arg


def _tensor_ext(ndim: int) -> bytes:
    data = bytes((7,)) + b"float32" + bytes((ndim,)) + b"\x00\x00\x00\x00\x00\x00\x00\x01" * ndim + b"\x00\x00\x80\x3f"
    return bytes((0xc8,)) + len(data).to_bytes(2, "big") + bytes((1,)) + data  # ext 16


def _nested(levels: int) -> dict:
    """A payload nesting ``levels`` containers deep (the payload map itself is level 1)."""
    value: object = 0
    for _ in range(levels - 1):
        value = [value]
    return {"a": value}


def _edge_cases():
    lim = p.DEFAULT_LIMITS
    big_str = "s" * lim.max_str
    return [
        ("str_at_limit", _frame(_call(big_str))),
        ("str_over_limit", _frame(_call(big_str + "s"))),
        ("str32_claims_4g", _frame(_raw_call(bytes.fromhex("dbffffffff") + b"x"))),
        ("bin_over_limit_header_only", _frame(_raw_call(bytes.fromhex("c6") + (lim.max_bin + 1).to_bytes(4, "big")))),
        ("array_at_limit", _frame(_call(list(range(100)) + [0] * (lim.max_array - 100)))),
        ("array_over_limit", _frame(_call([0] * (lim.max_array + 1)))),
        ("array32_claims_4g", _frame(_raw_call(bytes.fromhex("ddffffffff00")))),
        ("map_at_limit", _frame(_call({"k%d" % i: i for i in range(lim.max_map)}))),
        ("map_over_limit", _frame(_call({"k%d" % i: i for i in range(lim.max_map + 1)}))),
        ("map32_claims_4g", _frame(_raw_call(bytes.fromhex("dfffffffffa16b00")))),
        ("depth_at_limit", _frame(msgpack.packb([5, 1, _nested(lim.max_depth)]))),
        ("depth_over_limit", _frame(msgpack.packb([5, 1, _nested(lim.max_depth + 1)]))),
        ("tensor_ndim_at_limit", _frame(_raw_call(_tensor_ext(lim.max_ndim)))),
        ("tensor_ndim_over_limit", _frame(_raw_call(_tensor_ext(lim.max_ndim + 1)))),
        ("tensor_huge_dim_times_zero", _frame(_raw_call(bytes.fromhex("c71501") + b"\x05uint8\x02" + b"\xff" * 8
                                                        + b"\x00" * 8))),
        ("ext32_claims_4g", _frame(_raw_call(bytes.fromhex("c9ffffffff01")))),
        ("handle_ext_7_bytes", _frame(_raw_call(bytes.fromhex("c70702") + b"\x00" * 7))),
        ("frame_over_limit", p.HEADER.pack(lim.max_frame + 1) + b"\x93"),
        ("frame_at_limit_incomplete", p.HEADER.pack(lim.max_frame) + b"\x93"),
        ("invalid_utf8_str", _frame(_raw_call(bytes.fromhex("a2c328")))),
        ("never_used_byte_c1", _frame(_raw_call(bytes.fromhex("c1")))),
        ("msg_type_zero", _frame(msgpack.packb([0, 1, {}]))),
        ("msg_type_256", _frame(msgpack.packb([256, 1, {}]))),
        ("request_id_negative", _frame(msgpack.packb([5, -1, {}]))),
        ("uint64_max_value", _frame(_call((1 << 64) - 1, -(1 << 63), 1 << 63))),
        ("float32_value", _frame(_raw_call(bytes.fromhex("ca3fc00000")))),
        ("bin32_and_str16", _frame(_call(b"\x01" * 70000, "t" * 300))),
        # outside the wire format although msgpack itself has them (docs/protocol.md, "Extension types")
        ("timestamp_ext_minus_1", _frame(_raw_call(bytes.fromhex("d6ff00000001")))),
        ("bin_map_key", _frame(msgpack.packb([5, 1, {b"k": 1}], use_bin_type=True))),
    ]


def python_verdict(data: bytes) -> str:
    buf = p.FrameBuffer(p.DEFAULT_LIMITS)
    buf.feed(data)
    try:
        frame = buf.next_frame()
    except FrameTooLarge:
        return "FrameTooLarge"
    except ProtocolError:
        return "ProtocolError"
    return "ok" if frame is not None else "Incomplete"


def test_limits_agree_with_python(java_classes, tmp_path):
    """Frames at and just over every limit: Java decodes what Python decodes and refuses the rest the same way."""
    valid, invalid = [], []
    for name, data in _edge_cases():
        verdict = python_verdict(data)
        if verdict == "ok":
            valid.append({"name": name, "hex": data.hex()})
        else:
            invalid.append({"name": name, "hex": data.hex(), "error": verdict})
    # the "at limit" cases are the ones that must pass, or the comparison says little
    assert {v["name"] for v in valid} >= {"str_at_limit", "array_at_limit", "map_at_limit", "depth_at_limit",
                                          "tensor_ndim_at_limit", "uint64_max_value"}
    assert {v["name"] for v in invalid} >= {"str_over_limit", "array_over_limit", "map_over_limit",
                                            "depth_over_limit", "tensor_ndim_over_limit", "frame_over_limit",
                                            "timestamp_ext_minus_1", "bin_map_key"}
    path = tmp_path / "edges.json"
    path.write_text(json.dumps({"valid": valid, "invalid": invalid}))
    proc = run_java(java_classes, "VectorsRunner", str(path))
    passed, failed = summary(proc)
    assert proc.returncode == 0 and failed == 0, proc.stdout + proc.stderr
    assert passed == len(valid) + len(invalid) + 1  # + the byte-by-byte stream of the valid ones


def test_java_tensor_dtypes_are_the_wire_dtypes():
    """Tensor.java keeps its own copy of the wire dtype table (Java cannot read tether_rpc.dtypes): same names and
    item sizes as WIRE_DTYPES."""
    source = (JAVA_ROOT / "src" / "dev" / "tether" / "rpc" / "Tensor.java").read_text()
    names = re.findall(r'"(\w+)"', re.search(r"String\[\] DTYPES = \{(.*?)\};", source, re.S).group(1))
    sizes = [int(x) for x in re.findall(r"\d+", re.search(r"int\[\] ITEMSIZES = \{(.*?)\};", source, re.S).group(1))]
    assert sorted(names) == sorted(dtypes.WIRE_DTYPES)
    assert sizes == [dtypes.DTYPES[name].itemsize for name in names]


# ------------------------------------------------------------------------------------------------------------
# a real device server

@pytest.fixture
def device_server(tmp_path):
    """Start ``python -m tether_rpc --host 127.0.0.1 --port 0`` (optionally with a token); stopped by PID."""
    from tether.launch import start_rpc_server

    started = []

    def start(*flags: str):
        env = dict(os.environ)
        env.pop("TETHER_TOKEN", None)
        workdir = tmp_path / ("sessions%d" % len(started))
        workdir.mkdir()
        server = start_rpc_server("--host", "127.0.0.1", "--port", "0", "--workdir", str(workdir), *flags, env=env,
                                  log_path=tmp_path / ("server%d.log" % len(started)))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _facts(stdout: str) -> dict:
    return dict(line[5:].split("=", 1) for line in stdout.splitlines() if line.startswith("fact "))


def run_interop(java_classes, args: list, checks: int, peer: str, peer_log) -> str:
    """Runs InteropRunner, asserts it passed exactly ``checks`` checks and none failed, returns its stdout.

    A failure shows the runner's output and the tail of ``peer_log()`` (the server's or tracker's log)."""
    proc = run_java(java_classes, "InteropRunner", *args)
    passed, failed = summary(proc)
    detail = proc.stdout + proc.stderr + "\n%s log:\n%s" % (peer, peer_log()[-3000:])
    assert proc.returncode == 0 and failed == 0, detail
    assert passed == checks, detail
    return proc.stdout


@pytest.mark.parametrize("token", [None, "j4va-t0ken"], ids=["no-token", "token"])
def test_java_client_against_real_server(java_classes, device_server, rpc_kernels, token):
    from tether_rpc import device_info

    server = device_server(*(["--token", token] if token else []))
    args = ["--host", server.host, "--port", str(server.port), "--vadd", str(rpc_kernels["vadd"])]
    if token:
        args += ["--token", token]
    # with a token: two refused-token checks instead of one "server cannot prove"
    stdout = run_interop(java_classes, args, 24 if token else 23, "server", server.log_text)
    facts = _facts(stdout)
    assert facts["device_info.arch"] == device_info.device_info()["arch"]
    assert facts["server"].startswith("tether-rpc/")
    assert server.alive(), "the server died during the Java session:\n" + server.log_text()[-3000:]


@pytest.mark.parametrize("token", [None, "trk-t0ken"], ids=["no-token", "token"])
def test_java_tracker_client(java_classes, tracker_lab, token):
    """Summary, a direct and a relayed (reverse-mode) device session through a real tracker, one-time matches."""
    tracker = tracker_lab.tracker(token=token)
    tracker_lab.device(tracker, "java-direct")
    tracker_lab.device(tracker, "java-reverse", reverse=True)
    args = ["--host", "127.0.0.1", "--port", str(tracker.port), "--tracker-key", "java-direct",
            "--tracker-key", "java-reverse"]
    if token:
        args += ["--tracker-token", token]
    facts = _facts(run_interop(java_classes, args, 7 if token else 5, "tracker", tracker.log))
    assert facts["grant.java-direct"] == "direct" and facts["grant.java-reverse"] == "relay"


# ------------------------------------------------------------------------------------------------------------
# the APK (offline only: it runs when the Android toolchain is already on this machine)

def test_apk_builds_offline(tmp_path):
    missing = android_toolchain_missing()
    if missing:
        unavailable("the Android build tools", missing)
    apk = tmp_path / "tether.apk"
    proc = build_apk(tmp_path / "build", apk, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    badging = subprocess.run(["aapt", "dump", "badging", str(apk)], capture_output=True, text=True, timeout=60).stdout
    assert "package: name='dev.tether.app'" in badging
    assert "launchable-activity: name='dev.tether.app.MainActivity'" in badging
    assert "uses-permission: name='android.permission.INTERNET'" in badging
    import zipfile

    with zipfile.ZipFile(apk) as z:
        dex = z.read("classes.dex")
    assert dex.startswith(b"dex\n035")
    for cls in (b"Ldev/tether/app/MainActivity;", b"Ldev/tether/rpc/TetherClient;", b"Ldev/tether/rpc/TrackerClient;"):
        assert cls in dex
    verify = subprocess.run(["apksigner", "verify", str(apk)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr


# ------------------------------------------------------------------------------------------------------------
# the Java client against a misbehaving server (a real loopback socket playing a script)

class ScriptedServer:
    """Answers one client on 127.0.0.1 with ``script(conn, reader)`` in a thread; every wait is bounded."""

    def __init__(self, script):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.sock.settimeout(15)
        self.port = self.sock.getsockname()[1]
        self.error = None
        self._script = script
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(15)
                self._script(conn, transport.FrameReader(conn))
                _until_closed(conn)
        except Exception as exc:  # reported by the test
            self.error = exc

    def close(self):
        self.sock.close()
        self.thread.join(20)
        assert not self.thread.is_alive()


def _until_closed(conn):
    """Wait (bounded by the socket timeout) for the client to hang up, discarding what it sends."""
    for _ in range(10000):
        try:
            if not conn.recv(65536):
                return
        except OSError:
            return


def _welcome(conn, reader):
    msg_type, _, _ = reader.read_frame()
    assert msg_type == p.MsgType.HELLO
    conn.sendall(p.encode_frame(p.MsgType.WELCOME, 0, {"version": 1, "caps": [], "server": "scripted",
                                                       "session": 1}))


def _after_call(reply):
    """A script: WELCOME, wait for the CALL, then ``reply(conn, request_id)``."""
    def script(conn, reader):
        _welcome(conn, reader)
        msg_type, rid, payload = reader.read_frame()
        assert msg_type == p.MsgType.CALL and payload["fn"] == "tether.echo"
        reply(conn, rid)
    return script


def _hello_then(data: bytes):
    def script(conn, reader):
        reader.read_frame()
        if data:
            conn.sendall(data)
    return script


def _hang_up(conn, reader):
    reader.read_frame()
    conn.shutdown(socket.SHUT_RDWR)


def _bad_proof(conn, reader):
    reader.read_frame()
    conn.sendall(p.encode_frame(p.MsgType.CHALLENGE, 0, {"algo": "hmac-sha256", "nonce": b"\x01" * 32}))
    msg_type, _, auth = reader.read_frame()
    assert msg_type == p.MsgType.AUTH and len(auth["mac"]) == 32
    # the mac is right, but this server does not know the token: its proof is wrong
    assert handshake.macs_equal(auth["mac"], handshake.client_mac("tok", b"\x01" * 32, auth["nonce"]))
    conn.sendall(p.encode_frame(p.MsgType.WELCOME, 0, {"version": 1, "caps": [], "server": "x", "session": 1,
                                                       "proof": b"\x00" * 32}))


def _events_then_return(conn, rid):
    for i in range(3):
        conn.sendall(p.encode_frame(p.MsgType.EVENT, rid, {"kind": "log", "stream": "stdout", "line": str(i)}))
    conn.sendall(p.encode_frame(p.MsgType.RETURN, rid, {"value": "probe"}))


def _stops_reading(conn, reader):
    """WELCOME, then read nothing more for 3 s (bounded): a client's large send fills the buffers and blocks."""
    _welcome(conn, reader)
    time.sleep(3)


HOSTILE = {
    # name: (script, probe flags, expected "error: ..." / "result: ..." prefix, closed afterwards)
    "oversized_frame": (_hello_then(p.HEADER.pack(0x7fffffff) + b"\x93"), [], "error: FrameTooLargeException", True),
    "garbage_body": (_hello_then(_frame(b"\xc1")), [], "error: ProtocolException", True),
    "silent_server": (_hello_then(b""), [], "error: TetherException: timed out", True),
    "hang_up": (_hang_up, [], "error: ConnectionClosedException", True),
    "welcome_version_2": (_hello_then(p.encode_frame(p.MsgType.WELCOME, 0, {"version": 2})), [],
                          "error: VersionMismatchException", True),
    "challenge_without_token": (_hello_then(p.encode_frame(p.MsgType.CHALLENGE, 0, {
        "algo": "hmac-sha256", "nonce": b"\x00" * 32})), [], "error: AuthenticationException", True),
    "server_without_proof": (_bad_proof, ["--token", "tok"], "error: AuthenticationException", True),
    "bulk_of_1_tib": (_after_call(lambda c, rid: c.sendall(p.encode_frame(
        p.MsgType.RETURN, rid, {"value": None, "nbytes": 1 << 40}))), ["--call"], "error: FrameTooLargeException",
        True),
    "str_claiming_4_gib": (_after_call(lambda c, rid: c.sendall(_frame(
        bytes.fromhex("9306") + msgpack.packb(rid) + bytes.fromhex("81a576616c7565dbffffffff") + b"x"))),
        ["--call"], "error: ProtocolException", True),
    "reply_for_another_request": (_after_call(lambda c, rid: c.sendall(p.encode_frame(
        p.MsgType.RETURN, rid + 98, {"value": 1}))), ["--call"], "error: ProtocolException", True),
    "session_crashed": (_after_call(lambda c, rid: c.sendall(p.encode_frame(p.MsgType.ERROR, 0, {
        "type": "SessionCrashed", "message": "signal 11", "traceback": ""}))), ["--call"],
        "error: RemoteException: SessionCrashed", True),
    "remote_error_keeps_session": (_after_call(lambda c, rid: c.sendall(p.encode_frame(p.MsgType.ERROR, rid, {
        "type": "TypeError", "message": "no", "traceback": "Traceback ..."}))), ["--call"],
        "error: RemoteException: TypeError", False),
    "events_then_return": (_after_call(_events_then_return), ["--call"], 'result: "probe"', False),
    "server_stops_reading": (_stops_reading, ["--upload-mb", "64"], "error: TetherException: timed out after 1000 ms "
                             "sending", True),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_java_client_against_misbehaving_server(java_classes, name):
    script, flags, expected, closed = HOSTILE[name]
    server = ScriptedServer(script)
    try:
        proc = run_java(java_classes, "ClientProbe", "--port", str(server.port), "--timeout-ms", "1000", *flags)
    finally:
        server.close()
    out = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcome = "result: " + out["result"] if "result" in out else "error: " + out.get("error", "?")
    assert outcome.startswith(expected), proc.stdout
    assert out["closed"] == ("true" if closed else "false"), proc.stdout
    # every refusal but the two timeouts is prompt: it is the named error, not the probe's 1 s timeout
    if name in ("silent_server", "server_stops_reading"):
        assert int(out["elapsed_ms"]) >= 900
    if name == "events_then_return":
        assert out["events"] == "3"
    assert server.error is None, "the scripted server failed: %r" % (server.error,)
