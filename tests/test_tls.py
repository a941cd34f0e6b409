"""Optional TLS (docs/tls.md): a real forked device server with --tls-cert/--tls-key over loopback, clients with
tls=/ca=. The certificates are made here with the `cryptography` package (a dependency of paramiko): a CA, and a
server certificate it signs for 127.0.0.1 and localhost."""
from __future__ import annotations

import datetime
import ipaddress

import numpy as np
import pytest

from tether import rpc
from tether.errors import AuthenticationError, ConnectionClosed, ProtocolError, TetherError, TetherTimeout

TIMEOUT = 30.0


def _make_certs(folder):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def pem_key(key):
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def cert(subject, issuer, key, signer, ca, san=None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(signer, hashes.SHA256())

    out = {}
    for name in ("ca", "other_ca"):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tether test " + name)])
        out[name] = (key, subject, cert(subject, subject, key, key, True))
        (folder / (name + ".pem")).write_bytes(out[name][2].public_bytes(serialization.Encoding.PEM))
    ca_key, ca_name, _ = out["ca"]
    key = ec.generate_private_key(ec.SECP256R1())
    server = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name, key, ca_key, False,
                  [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    (folder / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(pem_key(key))
    return folder / "ca.pem", folder / "other_ca.pem", folder / "server.pem", folder / "server.key"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return _make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory, certs):
    from fixtures.rpc import start_server
    ca, _, cert, key = certs
    server = start_server(tmp_path_factory.mktemp("tls-server"), "--tls-cert", str(cert), "--tls-key", str(key),
                          "--token", "s3cret")
    yield server
    server.stop()


def test_calls_uploads_and_bulk_copies_over_tls(tls_server, certs, tmp_path):
    ca = str(certs[0])
    blob = tmp_path / "blob.bin"
    blob.write_bytes(np.random.default_rng(3).bytes(3 << 20))          # > one TLS record, > one sendfile piece
    x = np.random.default_rng(4).standard_normal(1 << 20).astype("float32")
    with rpc.connect(tls_server.host, tls_server.port, ca=ca, token="s3cret", timeout=TIMEOUT) as remote:
        for i in range(200):                                           # the small-call path, many frames
            assert remote.get_function("tether.echo")(i, "x") == [i, "x"]
        remote.upload(str(blob))                                       # from a file (sendfile falls back to send)
        assert remote.download("blob.bin") == blob.read_bytes()
        remote.upload(blob.read_bytes()[:1000], "small.bin")           # from memory
        a = remote.array(x)
        np.testing.assert_array_equal(a.numpy(), x)
        b = remote.empty(x.shape, "float32")
        b.copyfrom(x * 2)
        np.testing.assert_array_equal(b.numpy(), x * 2)
        assert sorted(remote.listdir()) == ["blob.bin", "small.bin"]
    assert tls_server.alive


def test_call_timeout_reaches_a_tls_client(make_rpc_server, certs, tmp_path):
    """Over TLS the worker itself reports a call past --call-timeout (the server's parent cannot write there)."""
    from test_limits import _spin_module
    ca, _, cert, key = (str(c) for c in certs)
    server = make_rpc_server("--tls-cert", cert, "--tls-key", key, "--call-timeout", "1")
    path = _spin_module(tmp_path / "spin.so")
    with rpc.connect(server.host, server.port, ca=ca, timeout=TIMEOUT) as remote:
        remote.upload(str(path))
        spin = remote.load_module("spin.so")["spin"]
        for i in range(50):                                  # calls within the limit: the timer is re-armed each time
            assert remote.get_function("tether.echo")(i) == i
        with pytest.raises(TetherTimeout, match="call timeout of 1.0 s.*--call-timeout"):   # the server's timer
            spin()
    with rpc.connect(server.host, server.port, ca=ca, timeout=TIMEOUT) as remote:
        assert remote.get_function("tether.echo")("after") == "after"
    assert server.alive


def test_token_is_still_checked_inside_tls(tls_server, certs):
    with pytest.raises(AuthenticationError):
        rpc.connect(tls_server.host, tls_server.port, ca=str(certs[0]), token="wrong", timeout=TIMEOUT)
    with rpc.connect(tls_server.host, tls_server.port, ca=str(certs[0]), token="s3cret", timeout=TIMEOUT) as r:
        assert r.get_function("tether.echo")("ok") == "ok"


def test_untrusted_certificate_and_plain_clients_are_refused(tls_server, certs):
    with pytest.raises(AuthenticationError, match="does not trust"):
        rpc.connect(tls_server.host, tls_server.port, ca=str(certs[1]), token="s3cret", timeout=TIMEOUT)
    with pytest.raises(AuthenticationError, match="does not trust"):   # the system CAs do not know ours
        rpc.connect(tls_server.host, tls_server.port, tls=True, token="s3cret", timeout=TIMEOUT)
    # plain TCP to a TLS server: refused by the server (a wait running out would be a TetherTimeout)
    with pytest.raises((ConnectionClosed, ProtocolError)):
        rpc.connect(tls_server.host, tls_server.port, token="s3cret", timeout=TIMEOUT)
    with rpc.connect(tls_server.host, tls_server.port, ca=str(certs[0]), token="s3cret", timeout=TIMEOUT) as r:
        assert r.get_function("tether.echo")(7) == 7                   # the server goes on
    assert tls_server.alive


def test_tls_client_to_a_plain_server_gets_a_clear_error(rpc_server, certs):
    with pytest.raises(TetherError, match="TLS handshake.*--tls-cert"):
        rpc.connect(rpc_server.host, rpc_server.port, ca=str(certs[0]), timeout=TIMEOUT)
    with rpc.connect(rpc_server.host, rpc_server.port, timeout=TIMEOUT) as r:
        assert r.get_function("tether.echo")(1) == 1


def test_bad_certificate_files_stop_the_server_with_a_message(tmp_path, certs):
    from tether_rpc.config import ServerConfigError, config_from_options
    with pytest.raises(ServerConfigError, match="cannot load the TLS certificate"):
        config_from_options(tls_cert=str(tmp_path / "missing.pem"))
    with pytest.raises(ServerConfigError, match="--tls-key needs --tls-cert"):
        config_from_options(tls_key=str(certs[3]))


# ---------------------------------------------------------------------------------------------------------------
# the tracker over TLS: rpc-tracker --tls-cert, a device registering with --tracker-ca, connect_tracker(ca=)

def _start(cmd, log_path, env=None):
    import os
    import subprocess
    log = open(log_path, "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ)), log


def test_tracker_and_device_registration_over_tls(tmp_path, certs):
    import os
    import sys

    from fixtures.children import stop_process
    from fixtures.polling import wait_until
    from tether.rpc.tracker_client import connect_tracker
    ca, _, cert, key = (str(c) for c in certs)
    ready = tmp_path / "tracker.port"
    env = dict(os.environ, TETHER_TRACKER_TOKEN="trk")
    tracker, tlog = _start([sys.executable, "-m", "tether.cli.tracker", "--port", "0", "--ready-file", str(ready),
                            "--tls-cert", cert, "--tls-key", key, "-v"], tmp_path / "tracker.log", env)
    procs = [(tracker, tlog)]
    try:
        wait_until(lambda: ready.exists() or tracker.poll() is not None, 20, "the TLS tracker to listen")
        port = int(ready.read_text())
        device, dlog = _start([sys.executable, "-m", "tether_rpc", "--port", "0", "--tracker", "127.0.0.1:%d" % port,
                               "--key", "tlsdev", "--tracker-ca", ca, "--tls-cert", cert, "--tls-key", key,
                               "--workdir", str(tmp_path)], tmp_path / "device.log", env)
        procs.append((device, dlog))

        def registered() -> bool:
            with connect_tracker("127.0.0.1", port, token="trk", ca=ca, timeout=10) as t:
                return any(d["key"] == "tlsdev" for d in t.summary()["devices"])
        wait_until(registered, 30, "the device to register over TLS")
        with connect_tracker("127.0.0.1", port, token="trk", ca=ca, timeout=10) as t:
            with t.request("tlsdev", wait_timeout=20, ca=ca, timeout=TIMEOUT) as remote:   # the session: TLS too
                x = np.arange(1000, dtype="float32")
                np.testing.assert_array_equal(remote.array(x).numpy(), x)
        with pytest.raises((ConnectionClosed, ProtocolError, TetherError)):
            connect_tracker("127.0.0.1", port, token="trk", timeout=5)          # plain TCP to a TLS tracker
        with pytest.raises(AuthenticationError, match="does not trust"):
            connect_tracker("127.0.0.1", port, token="trk", ca=str(certs[1]), timeout=5)
        assert tracker.poll() is None and device.poll() is None
    finally:
        for proc, log in procs:
            stop_process(proc)
            log.close()


def test_reverse_mode_cannot_use_a_tls_tracker(certs):
    from tether_rpc.config import ServerConfigError, config_from_options
    with pytest.raises(ServerConfigError, match="--reverse cannot be combined with a TLS tracker"):
        config_from_options(tracker="127.0.0.1:9190", key="k", reverse=True, tracker_ca=str(certs[0]))
