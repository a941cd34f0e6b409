"""Put the device server on a board over SSH and reach it through an SSH tunnel (``tether bootstrap``).

One SSH connection (paramiko) does everything: it checks the device's Python, numpy and msgpack, uploads the
device zipapp over SFTP when its hash differs, starts the server detached and bound to the device's loopback,
and forwards a local port to it through ``direct-tcpip`` channels, so the server never listens beyond loopback.

    from tether import ssh, rpc
    with ssh.bootstrap("raspberrypi.local", user="pi") as boot:
        port = boot.forward()                       # 127.0.0.1:port on this host -> the device's server
        with rpc.connect("127.0.0.1", port) as remote:
            print(remote.device_info()["suggested_target"])

Host keys are checked against the user's known_hosts (paramiko's RejectPolicy) unless the caller explicitly
accepts a key never seen before (``accept_new_host_key``, like OpenSSH's ``StrictHostKeyChecking=accept-new``):
a host whose key *changed* is always refused. Every network step has a timeout.

Re-running is idempotent: the zipapp is uploaded only when its SHA-256 differs, and a server that is still
running the same zipapp with the same launch settings is reused (same PID, same port); anything else (new
zipapp, other flags, other token, ``restart=True``) stops the old server by its PID and starts a fresh one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
import posixpath
import re
import select
import shlex
import socket
import stat
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tether.errors import TetherError, TetherTimeout

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 9)
MIN_NUMPY = (1, 19)
MIN_MSGPACK = (1, 0)
DEFAULT_REMOTE_DIR = "~/.cache/tether"
BUNDLE_NAME = "tether-rpc.pyz"
LOG_NAME = "rpc-server.log"
PID_NAME = "rpc-server.pid"
STATE_NAME = "rpc-server.json"
DEBIAN_HINT = "sudo apt-get install python3-numpy python3-msgpack"
TERMUX_HINT = "pkg install python python-numpy && pip install msgpack"
LISTEN_RE = re.compile(r"listening on (\S+):(\d+)")
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
PIPE_SEND_TIMEOUT = 60.0


class BootstrapError(TetherError):
    """Setting up the device server over SSH failed; the message says which step and what to do."""


class HostKeyError(BootstrapError):
    """The device's SSH host key is unknown (and not accepted) or differs from the one in known_hosts."""


class DeviceNotReady(BootstrapError):
    """The device lacks Python >= 3.9, numpy >= 1.19 or msgpack >= 1.0; ``.check`` has the details."""

    def __init__(self, message: str, check: "DeviceCheck"):
        super().__init__(message)
        self.check = check


# ---------------------------------------------------------------------------------------------------------------
# the device check

# Runs under the device's python, which may be old: no f-strings, nothing beyond the stdlib.
_PROBE = r"""
import json, os, platform, struct, sys
r = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable,
     "machine": platform.machine(), "bits": struct.calcsize("P") * 8}
for name in ("numpy", "msgpack"):
    try:
        m = __import__(name)
        v = getattr(m, "__version__", None)
        if v is None and hasattr(m, "version"):
            v = ".".join(str(x) for x in m.version)
        r[name] = str(v)
    except Exception as e:
        r[name] = None
        r[name + "_error"] = "%s: %s" % (type(e).__name__, e)
keep = ("model name", "processor", "hardware", "cpu implementer", "cpu part")
try:
    with open("/proc/cpuinfo") as f:
        r["cpuinfo"] = "\n".join(l for l in f.read().splitlines() if l.split(":")[0].strip().lower() in keep)
except Exception:
    r["cpuinfo"] = None
r["android"] = bool(os.environ.get("ANDROID_ROOT") or os.environ.get("ANDROID_DATA")) or \
    os.path.exists("/system/build.prop") or hasattr(sys, "getandroidapilevel")
if len(sys.argv) > 1 and os.path.isfile(sys.argv[1]):  # the zipapp already there: its hash decides the upload
    import hashlib
    with open(sys.argv[1], "rb") as f:
        r["bundle_sha256"] = hashlib.sha256(f.read()).hexdigest()
sys.stdout.write(json.dumps(r) + "\n")
"""


def _version_tuple(text: Optional[str]) -> Tuple[int, ...]:
    """``"1.26.4"`` -> (1, 26, 4); leading digits of each part only (``"1.0.0rc1"`` -> (1, 0, 0))."""
    out = []
    for part in (text or "").split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def _tether_arch(machine: str, bits: int) -> str:
    # Same mapping as tether_rpc.elf.host_arch, but for another machine's uname and pointer size.
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "x64"):
        return "x86_64" if bits == 64 else "x86"
    if machine in ("aarch64", "arm64", "armv8l", "armv8b", "aarch64_be"):
        return "aarch64" if bits == 64 else "armv7"
    if machine.startswith("arm"):
        return "armv7"
    return machine or "unknown"


@dataclasses.dataclass
class DeviceCheck:
    """What the device offers, and what is missing (``problems`` empty means ready)."""

    machine: str                          # uname -m
    python: str                           # the interpreter command used on the device
    python_version: Optional[str] = None
    numpy: Optional[str] = None
    msgpack: Optional[str] = None
    android: bool = False
    arch: str = "unknown"                 # tether's arch name
    suggested_target: Optional[str] = None
    executable: Optional[str] = None      # the interpreter's full path (sys.executable)
    bundle_sha256: Optional[str] = None   # of the zipapp already on the device, when asked and present
    problems: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def install_hint(self) -> str:
        if self.android:
            return TERMUX_HINT
        if self.python_version is None or _version_tuple(self.python_version) < MIN_PYTHON:
            return DEBIAN_HINT.replace("install ", "install python3 ", 1) + \
                " (Debian 11 bullseye / Raspberry Pi OS 11 or newer has Python >= 3.9)"
        return DEBIAN_HINT

    def summary(self) -> str:
        lines = ["device: %s (tether arch %s), suggested target %s" % (self.machine, self.arch,
                                                                         self.suggested_target or "?"),
                 "python: %s (%s)" % (self.python_version or "missing", self.python),
                 "numpy: %s" % (self.numpy or "missing"),
                 "msgpack: %s" % (self.msgpack or "missing")]
        if self.problems:
            lines += ["problem: " + p for p in self.problems]
            lines.append("install on the device: " + self.install_hint)
        return "\n".join(lines)


def _evaluate(machine: str, python: str, probe: Optional[Dict[str, Any]], probe_error: str) -> DeviceCheck:
    from tether_rpc.device_info import parse_cpuinfo, suggest_target

    check = DeviceCheck(machine=machine, python=python)
    if probe is None:
        check.problems.append("no usable python at %r on the device (%s); Python >= %d.%d is needed"
                              % (python, probe_error.strip() or "it did not run", *MIN_PYTHON))
        check.arch = _tether_arch(machine, 64 if "64" in machine else 32)
        return check
    check.python_version, check.numpy, check.msgpack = probe.get("python"), probe.get("numpy"), probe.get("msgpack")
    check.android = bool(probe.get("android"))
    check.executable, check.bundle_sha256 = probe.get("executable") or None, probe.get("bundle_sha256")
    check.arch = _tether_arch(probe.get("machine") or machine, int(probe.get("bits") or 64))
    check.suggested_target = suggest_target(check.arch, parse_cpuinfo(probe.get("cpuinfo"))["cores"], check.android)
    for name, have, need in (("python", check.python_version, MIN_PYTHON), ("numpy", check.numpy, MIN_NUMPY),
                             ("msgpack", check.msgpack, MIN_MSGPACK)):
        if have is None:
            why = probe.get(name + "_error") or "not importable"
            check.problems.append("%s is missing on the device (%s); >= %s is needed"
                                  % (name, why, ".".join(map(str, need))))
        elif _version_tuple(have) < need:
            check.problems.append("%s %s is too old; >= %s is needed" % (name, have, ".".join(map(str, need))))
    return check


# ---------------------------------------------------------------------------------------------------------------
# the SSH connection

class _AcceptNewPolicy:
    """Accept and remember a host key never seen before (paramiko raises BadHostKeyException for a changed one
    before any policy is asked, so this never accepts a *changed* key)."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        directory = os.path.dirname(self.known_hosts)
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        client.save_host_keys(self.known_hosts)
        log.warning("accepted new %s host key for %s (%s), saved to %s", key.get_name(), hostname,
                    getattr(key, "fingerprint", key.get_base64()[:24]), self.known_hosts)


class DeviceConnection:
    """One authenticated SSH connection to the device, with SFTP and bounded command execution."""

    def __init__(self, host: str, user: Optional[str] = None, *, port: int = 22, identity: Optional[str] = None,
                 password: Optional[str] = None, known_hosts: Optional[str] = None,
                 accept_new_host_key: bool = False, timeout: float = 15.0):
        import paramiko

        if user is None and "@" in host:
            user, host = host.rsplit("@", 1)
        self.host, self.user, self.port, self.timeout = host, user, port, timeout
        self.known_hosts = os.path.expanduser(known_hosts or "~/.ssh/known_hosts")
        client = paramiko.SSHClient()
        if os.path.exists(self.known_hosts):
            client.load_host_keys(self.known_hosts)
        if accept_new_host_key:
            client.set_missing_host_key_policy(_AcceptNewPolicy(self.known_hosts))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        where = "%s@%s:%d" % (user or "(current user)", host, port)
        timeouts = dict(timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
        if "channel_timeout" in inspect.signature(client.connect).parameters:   # paramiko >= 3.1
            timeouts["channel_timeout"] = timeout
        try:
            client.connect(host, port=port, username=user, password=password,
                           key_filename=os.path.expanduser(identity) if identity else None,
                           look_for_keys=identity is None and password is None, allow_agent=identity is None,
                           **timeouts)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError("the SSH host key of %s CHANGED (got %s, %s has another): refusing to connect. If the "
                               "device was reinstalled, remove its old line from %s (ssh-keygen -R %s)"
                               % (where, exc.key.get_name(), self.known_hosts, self.known_hosts,
                                  host if port == 22 else "'[%s]:%d'" % (host, port))) from None
        except paramiko.SSHException as exc:
            transport = client.get_transport()
            got_banner = transport is not None and bool(getattr(transport, "remote_version", ""))
            client.close()
            if "not found in known_hosts" in str(exc):
                raise HostKeyError("the SSH host key of %s is not in %s: check it and add it (ssh %s%s once), or "
                                   "pass --accept-new-host-key to trust it on first contact"
                                   % (where, self.known_hosts, "-p %d " % port if port != 22 else "",
                                      "%s@%s" % (user, host) if user else host)) from None
            if not got_banner:
                raise TetherTimeout("SSH to %s: no SSH server answered within %.0f s (%s)"
                                    % (where, timeout, exc)) from None
            if isinstance(exc, paramiko.AuthenticationException) or "No existing session" in str(exc):
                # paramiko may report a refused key as "No existing session" when the server hangs up first
                raise BootstrapError("SSH login to %s failed: authentication failed (%s). Check --identity or "
                                     "--password-env, and that your public key is in the device's "
                                     "~/.ssh/authorized_keys" % (where, exc)) from None
            raise BootstrapError("SSH to %s failed: %s" % (where, exc)) from None
        except socket.timeout:
            client.close()
            raise TetherTimeout("SSH to %s: no answer within %.0f s" % (where, timeout)) from None
        except OSError as exc:
            client.close()
            raise BootstrapError("SSH to %s failed: %s" % (where, exc)) from None
        self.client = client
        self.transport = client.get_transport()
        self.transport.set_keepalive(15)
        self._sftp = None
        self._home: Optional[str] = None
        self.closed = False

    # --- commands ---------------------------------------------------------------------------------------------
    def run(self, command: str, *, stdin: bytes = b"", timeout: Optional[float] = None,
            check: bool = False) -> Tuple[int, str, str]:
        """Run ``command`` through the device's shell; (exit code, stdout, stderr). Bounded by ``timeout``."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        chan = self.transport.open_session(timeout=timeout)
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            while True:
                if chan.recv_ready():
                    out += chan.recv(65536)
                elif chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                elif chan.exit_status_ready():
                    while chan.recv_ready():
                        out += chan.recv(65536)
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(65536)
                    break
                else:
                    if time.monotonic() > deadline:
                        raise TetherTimeout("command on %s did not finish within %.0f s: %s"
                                            % (self.host, timeout, command[:200]))
                    select.select([chan], [], [], 0.05)
            code = chan.recv_exit_status()
        finally:
            chan.close()
        result = (code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        if check and code != 0:
            raise BootstrapError("command on %s failed (exit %d): %s\n%s" % (self.host, code, command[:200],
                                                                           result[2].strip()[-2000:]))
        return result

    # --- files ------------------------------------------------------------------------------------------------
    @property
    def sftp(self) -> Any:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
            self._sftp.get_channel().settimeout(self.timeout)
        return self._sftp

    def resolve(self, path: str) -> str:
        """An absolute device path: ``~/x`` and relative paths are taken from the login's home directory."""
        if self._home is None:
            self._home = self.sftp.normalize(".")
        if path == "~" or path.startswith("~/"):
            path = path[2:]
        return posixpath.normpath(posixpath.join(self._home, path))

    def makedirs(self, path: str) -> None:
        parts, current = path.strip("/").split("/"), ""
        for part in parts:
            current += "/" + part
            try:
                self.sftp.stat(current)
            except IOError:
                self.sftp.mkdir(current, 0o700)

    def read_text(self, path: str, limit: int = 1 << 20) -> Optional[str]:
        try:
            with self.sftp.open(path, "r") as f:
                size = f.stat().st_size
                if size > limit:
                    f.seek(size - limit)
                return f.read(limit).decode("utf-8", "replace")
        except IOError:
            return None

    def put_atomic(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Upload to a temporary sibling and rename it over ``path``: a reader sees the old file or the new one."""
        tmp = posixpath.join(posixpath.dirname(path), ".%s.%s.tmp" % (posixpath.basename(path), uuid.uuid4().hex))
        try:
            with self.sftp.open(tmp, "wb") as f:
                f.set_pipelined(True)
                f.write(data)
            self.sftp.chmod(tmp, mode)
            try:
                self.sftp.posix_rename(tmp, path)
            except IOError:  # a server without the posix-rename extension: plain SFTP rename refuses to overwrite
                try:
                    self.sftp.remove(path)
                except IOError:
                    pass
                self.sftp.rename(tmp, path)
        except BaseException:
            try:
                self.sftp.remove(tmp)
            except (IOError, OSError, EOFError):
                pass
            raise

    def is_file(self, path: str) -> bool:
        try:
            return stat.S_ISREG(self.sftp.stat(path).st_mode)
        except IOError:
            return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._sftp is not None:
            self._sftp.close()
        self.client.close()

    def __enter__(self) -> "DeviceConnection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_device(conn: DeviceConnection, python: str = "python3", bundle_path: Optional[str] = None) -> DeviceCheck:
    """Probe the device's ``uname -m``, python, numpy and msgpack (never raises for a missing package).

    With ``bundle_path`` the probe also hashes the zipapp there (one round trip instead of two).
    """
    marker = "--tether-probe--"
    command = "uname -m; echo %s; %s -c %s%s" % (marker, shlex.quote(python), shlex.quote(_PROBE),
                                                 " " + shlex.quote(bundle_path) if bundle_path else "")
    code, out, err = conn.run(command, check=False)
    head, _, tail = out.partition(marker + "\n")
    machine = head.strip() or "unknown"
    probe = None
    if code == 0:
        try:
            probe = json.loads(tail.strip().splitlines()[-1])
        except (ValueError, IndexError):
            err = "unreadable probe output: %r" % tail[-200:]
    check = _evaluate(machine, python, probe, err or tail)
    log.info("device %s: %s", conn.host, check.summary().replace("\n", "; "))
    return check


# ---------------------------------------------------------------------------------------------------------------
# starting and stopping the server

# Runs under the device's python: reads its launch request (argv, env, paths) from stdin so secrets never appear
# on a command line or in a file, starts the server in a new session (no SIGHUP when SSH goes away) with its
# output in the log, writes the PID file atomically and prints the PID.
_LAUNCHER = r"""
import json, os, sys
req = json.loads(sys.stdin.readline())
logfd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
rfd, wfd = os.pipe()  # close-on-exec: EOF tells the parent the exec happened; bytes carry an exec error
pid = os.fork()
if pid == 0:
    try:
        os.close(rfd)
        os.setsid()
        os.chdir(req["dir"])
        env = dict(os.environ)
        env.update(req["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        os.execve(req["argv"][0], req["argv"], env)
    except BaseException as e:
        os.write(wfd, ("%s: %s" % (type(e).__name__, e)).encode())
    finally:
        os._exit(127)
os.close(wfd)
error = os.read(rfd, 4096)
if error:
    sys.stderr.write("could not start %s: %s\n" % (req["argv"][0], error.decode("utf-8", "replace")))
    sys.exit(3)
tmp = req["pidfile"] + ".tmp"
with open(tmp, "w") as f:
    f.write("%d\n" % pid)
os.rename(tmp, req["pidfile"])
sys.stdout.write("%d\n" % pid)
"""

# Plain sh, so --stop works even when the python that started the server is gone. "Alive" means the PID's
# command line still names our zipapp: that guards against a recycled PID and ignores a zombie (empty cmdline).
_STOP_SH = r"""
f=%(pidfile)s; pyz=%(pyz)s
[ -f "$f" ] || { echo none; exit 0; }
pid=$(cat "$f")
alive() { tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null | grep -qF "$pyz"; }
if [ -n "$pid" ] && alive; then
  kill -TERM "$pid" 2>/dev/null; i=0
  while alive && [ $i -lt %(ticks)d ]; do sleep 0.1; i=$((i+1)); done
  if alive; then kill -KILL "$pid" 2>/dev/null; echo "killed $pid"; else echo "stopped $pid"; fi
else
  echo "stale $pid"
fi
rm -f "$f"
"""


@dataclasses.dataclass
class RemotePaths:
    dir: str
    bundle: str
    log: str
    pidfile: str
    state: str

    @classmethod
    def under(cls, directory: str) -> "RemotePaths":
        return cls(directory, posixpath.join(directory, BUNDLE_NAME), posixpath.join(directory, LOG_NAME),
                   posixpath.join(directory, PID_NAME), posixpath.join(directory, STATE_NAME))


def _running_pid(conn: DeviceConnection, paths: RemotePaths) -> Optional[int]:
    text = conn.read_text(paths.pidfile)
    if not text or not text.strip().isdigit():
        return None
    pid = int(text.strip())
    cmdline = conn.read_text("/proc/%d/cmdline" % pid)
    return pid if cmdline and paths.bundle in cmdline.replace("\0", " ") else None


def stop_server(conn: DeviceConnection, remote_dir: str = DEFAULT_REMOTE_DIR, timeout: float = 5.0) -> str:
    """Stop the server recorded in the PID file under ``remote_dir`` (TERM, then KILL after ``timeout``).

    Returns what happened: ``"stopped PID"``, ``"killed PID"``, ``"stale PID"`` (not running) or ``"none"``.
    """
    paths = RemotePaths.under(conn.resolve(remote_dir))
    script = _STOP_SH % {"pidfile": shlex.quote(paths.pidfile), "pyz": shlex.quote(paths.bundle),
                         "ticks": max(1, int(timeout * 10))}
    _, out, _ = conn.run(script, timeout=timeout + conn.timeout, check=True)
    try:
        conn.sftp.remove(paths.state)
    except IOError:
        pass
    result = out.strip() or "none"
    log.info("device server on %s: %s", conn.host, result)
    return result


def _fingerprint(argv: Sequence[str], env: Dict[str, str], bundle_sha: str, salt: str) -> str:
    # Salted so the state file (which says whether a running server matches) does not leak a weak token.
    blob = json.dumps({"argv": list(argv), "env": env, "bundle": bundle_sha}, sort_keys=True)
    return hashlib.sha256((salt + blob).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# the SSH tunnel

class _Forwarder:
    """127.0.0.1:local_port on this host -> (dest_host, dest_port) as seen by the device, over direct-tcpip."""

    def __init__(self, transport: Any, dest: Tuple[str, int], local_port: int = 0, timeout: float = 15.0):
        self.transport, self.dest, self.timeout = transport, dest, timeout
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind(("127.0.0.1", local_port))
        except OSError as exc:
            self.listener.close()
            raise BootstrapError("cannot listen on 127.0.0.1:%d for the SSH tunnel: %s (pick another --forward "
                                 "port, or 0 for any free one)" % (local_port, exc)) from None
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pipes: List[Tuple[socket.socket, Any, threading.Thread]] = []
        self._thread = threading.Thread(target=self._accept_loop, name="tether-ssh-forward-%d" % self.port,
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, peer = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            try:
                chan = self.transport.open_channel("direct-tcpip", self.dest, peer[:2], timeout=self.timeout)
            except Exception as exc:  # the device refused or SSH dropped: this client gets a closed socket
                log.warning("SSH tunnel to %s:%d on the device failed: %s", self.dest[0], self.dest[1], exc)
                sock.close()
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Bounds a send to a peer that stopped reading; idle waits (a long kernel call) are select()s, unbounded.
            sock.settimeout(PIPE_SEND_TIMEOUT)
            chan.settimeout(PIPE_SEND_TIMEOUT)
            thread = threading.Thread(target=self._pump, args=(sock, chan), daemon=True,
                                      name="tether-ssh-pipe-%d" % peer[1])
            with self._lock:
                self._pipes = [p for p in self._pipes if p[2].is_alive()]
                self._pipes.append((sock, chan, thread))
            thread.start()

    def _pump(self, sock: socket.socket, chan: Any) -> None:
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([sock, chan], [], [], 0.2)
                if sock in ready:
                    data = sock.recv(1 << 16)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(1 << 16)
                    if not data:
                        break
                    sock.sendall(data)
        except (OSError, EOFError) as exc:
            log.debug("SSH tunnel connection ended: %s", exc)
        finally:
            chan.close()
            sock.close()

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.listener.close()
        self._thread.join(2.0)
        with self._lock:
            pipes = list(self._pipes)
        for sock, chan, thread in pipes:
            thread.join(1.0)


# ---------------------------------------------------------------------------------------------------------------
# the whole bootstrap

class Bootstrap:
    """A device server started (or found running) over SSH. Context manager; ``close()`` is idempotent and ends
    the tunnels and the SSH connection but leaves the server running (``stop()`` ends it)."""

    def __init__(self, conn: DeviceConnection, check: DeviceCheck, paths: RemotePaths, pid: int,
                 remote_host: str, remote_port: int, uploaded: bool, reused: bool):
        self.conn, self.check, self.paths = conn, check, paths
        self.pid, self.remote_host, self.remote_port = pid, remote_host, remote_port
        self.uploaded, self.reused = uploaded, reused
        self._forwarders: List[_Forwarder] = []
        self.closed = False

    @property
    def host(self) -> str:
        return self.conn.host

    def forward(self, local_port: int = 0) -> int:
        """Tunnel 127.0.0.1:``local_port`` (0: any free port) here to the server on the device; returns the port."""
        if self.closed:
            raise BootstrapError("this bootstrap of %s is closed" % self.conn.host)
        dest_host = "127.0.0.1" if self.remote_host in ("0.0.0.0", "::", "") else self.remote_host
        fwd = _Forwarder(self.conn.transport, (dest_host, self.remote_port), local_port, self.conn.timeout)
        self._forwarders.append(fwd)
        log.info("forwarding 127.0.0.1:%d -> %s:%s:%d over SSH", fwd.port, self.conn.host, dest_host,
                 self.remote_port)
        return fwd.port

    def stop(self, timeout: float = 5.0) -> str:
        """Stop the device server by its PID (see :func:`stop_server`); the tunnels end with it."""
        for fwd in self._forwarders:
            fwd.close()
        return stop_server(self.conn, self.paths.dir, timeout)

    def log_text(self) -> str:
        return self.conn.read_text(self.paths.log) or ""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fwd in self._forwarders:
            fwd.close()
        self.conn.close()

    def __enter__(self) -> "Bootstrap":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<Bootstrap %s pid %d on %s:%d>" % (self.conn.host, self.pid, self.remote_host, self.remote_port)


def _wait_listening(conn: DeviceConnection, paths: RemotePaths, pid: int, timeout: float) -> Tuple[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        text = conn.read_text(paths.log) or ""
        found = LISTEN_RE.findall(text)
        if found:
            host, port = found[-1]
            return host, int(port)
        if _running_pid(conn, paths) != pid:
            raise BootstrapError("the device server on %s exited during start-up; its log (%s) ends with:\n%s"
                                 % (conn.host, paths.log, text.strip()[-3000:] or "(empty)"))
        if time.monotonic() > deadline:
            raise TetherTimeout("the device server on %s did not report 'listening on' within %.0f s; see %s:\n%s"
                                % (conn.host, timeout, paths.log, text.strip()[-2000:]))
        time.sleep(0.1)


def bootstrap(host: str, user: Optional[str] = None, *, port: int = 22, identity: Optional[str] = None,
              password: Optional[str] = None, known_hosts: Optional[str] = None, accept_new_host_key: bool = False,
              python: str = "python3", remote_dir: str = DEFAULT_REMOTE_DIR, bind: str = "127.0.0.1",
              remote_port: int = 9090, token: Optional[str] = None, tracker: Optional[str] = None,
              key: Optional[str] = None, reverse: Optional[bool] = None, tracker_token: Optional[str] = None,
              extra_args: Sequence[str] = (), restart: bool = False, timeout: float = 15.0,
              start_timeout: float = 30.0, bundle: Optional[bytes] = None) -> Bootstrap:
    """Connect over SSH, check the device, upload the zipapp if it changed, and start (or reuse) the server.

    ``host`` may be ``user@host``. ``bind`` is the address the server listens on *on the device* (loopback by
    default; anything else needs ``token``). With ``tracker`` (``HOST:PORT``, as the device sees it) and ``key``
    the server registers there; a loopback-bound server then dials out (``reverse``) unless told otherwise.
    ``bundle`` is the zipapp to install (default: :func:`tether.bundle.bundle_bytes` of this checkout).
    Raises :class:`DeviceNotReady` (with what to install), :class:`HostKeyError`, :class:`BootstrapError` or
    ``TetherTimeout``.
    """
    from tether.bundle import bundle_bytes

    if tracker and not key:
        raise BootstrapError("--tracker needs --key (the device key to register under, e.g. rasp4b)")
    if bind not in LOOPBACK_HOSTS and not token:
        raise BootstrapError("binding the device server to %s needs a token (--token): otherwise anyone who can "
                             "reach the device can run code on it" % bind)
    conn = DeviceConnection(host, user, port=port, identity=identity, password=password, known_hosts=known_hosts,
                            accept_new_host_key=accept_new_host_key, timeout=timeout)
    try:
        paths = RemotePaths.under(conn.resolve(remote_dir))
        check = check_device(conn, python, paths.bundle)
        if not check.ok:
            raise DeviceNotReady("the device %s cannot run the tether server yet:\n  %s\ninstall on the device: %s"
                                 % (conn.host, "\n  ".join(check.problems), check.install_hint), check)
        conn.makedirs(paths.dir)
        data = bundle_bytes() if bundle is None else bytes(bundle)
        sha = hashlib.sha256(data).hexdigest()
        uploaded = check.bundle_sha256 != sha
        if uploaded:
            conn.put_atomic(data, paths.bundle, 0o755)
            log.info("uploaded %s (%d bytes, sha256 %s) to %s:%s", BUNDLE_NAME, len(data), sha[:12], conn.host,
                     paths.bundle)
        else:
            log.info("%s on %s is up to date (sha256 %s)", BUNDLE_NAME, conn.host, sha[:12])
        # `python` may be a bare command: the launcher's execve needs the interpreter's own path.
        interpreter = check.executable or python
        if reverse is None:
            reverse = bool(tracker) and bind in LOOPBACK_HOSTS
        argv = [interpreter, paths.bundle, "--host", bind, "--port", str(remote_port)]
        if tracker:
            argv += ["--tracker", tracker, "--key", key]
            if reverse:
                argv.append("--reverse")
        argv += list(extra_args)
        env = {name: value for name, value in (("TETHER_TOKEN", token), ("TETHER_TRACKER_TOKEN", tracker_token))
               if value}

        state = None
        state_text = conn.read_text(paths.state)
        if state_text:
            try:
                state = json.loads(state_text)
            except ValueError:
                state = None
        running = _running_pid(conn, paths)
        reused = False
        if (running is not None and not uploaded and not restart and state and state.get("pid") == running
                and state.get("fingerprint") == _fingerprint(argv, env, sha, state.get("salt", ""))):
            pid, reused = running, True
            log.info("device server already running on %s (pid %d) with these settings: reusing it", conn.host, pid)
        else:
            if running is not None:
                log.info("restarting the device server on %s (pid %d): %s", conn.host, running,
                         "new zipapp" if uploaded else "restart requested" if restart else "other settings")
                stop_server(conn, remote_dir)
            request = {"argv": argv, "env": env, "dir": paths.dir, "log": paths.log, "pidfile": paths.pidfile}
            code, out, err = conn.run("%s -c %s" % (shlex.quote(interpreter), shlex.quote(_LAUNCHER)),
                                      stdin=(json.dumps(request) + "\n").encode(), check=True)
            pid = int(out.strip().splitlines()[-1])
            salt = uuid.uuid4().hex
            conn.put_atomic(json.dumps({"pid": pid, "salt": salt, "fingerprint": _fingerprint(argv, env, sha, salt),
                                        "started": time.time()}).encode(), paths.state, 0o600)
            log.info("started the device server on %s (pid %d), log %s", conn.host, pid, paths.log)
        remote_host, actual_port = _wait_listening(conn, paths, pid, start_timeout)
        return Bootstrap(conn, check, paths, pid, remote_host, actual_port, uploaded, reused)
    except BaseException:
        conn.close()
        raise


def connect(host: str, user: Optional[str] = None, **kwargs: Any) -> DeviceConnection:
    """An SSH connection to the device (same options as :func:`bootstrap`'s SSH part); for check/stop alone."""
    return DeviceConnection(host, user, **kwargs)
