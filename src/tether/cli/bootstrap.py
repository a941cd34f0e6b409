"""`tether bootstrap pi@raspberrypi.local`: put the device server on a board over SSH and tunnel to it."""
from __future__ import annotations

import os
import signal
import threading
from typing import Optional

import click

DEFAULT_FORWARD_PORT = 9090


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@click.command(name="bootstrap", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("destination", metavar="[USER@]HOST")
@click.option("--port", "ssh_port", type=int, default=22, show_default=True, help="SSH port of the device.")
@click.option("--identity", "-i", type=click.Path(exists=True, dir_okay=False),
              help="SSH private key (default: agent, ~/.ssh keys)")
@click.option("--password-env", metavar="VAR", help="Read the SSH password from environment variable VAR.")
@click.option("--known-hosts", type=click.Path(dir_okay=False), help="known_hosts file [default: ~/.ssh/known_hosts].")
@click.option("--accept-new-host-key", is_flag=True,
              help="Trust and remember the device's host key on first contact (a changed key is still refused).")
@click.option("--python", "python", default="python3", show_default=True, help="Python interpreter on the device.")
@click.option("--remote-dir", default="~/.cache/tether", show_default=True,
              help="Where the zipapp, log and PID file live on the device.")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address the server listens on, on the device (beyond loopback needs --token).")
@click.option("--remote-port", type=int, default=9090, show_default=True,
              help="First port the server tries on the device (0: any free port).")
@click.option("--token", envvar="TETHER_TOKEN", help="Require clients to prove this token (env TETHER_TOKEN).")
@click.option("--tracker", metavar="HOST:PORT", help="Register the device with this tracker (as the device sees it).")
@click.option("--key", help="Device key for the tracker, e.g. rasp4b.")
@click.option("--tracker-token", envvar="TETHER_TRACKER_TOKEN", help="The tracker's token (env TETHER_TRACKER_TOKEN).")
@click.option("--forward", "forward_port", type=int, metavar="LOCAL_PORT",
              help="Tunnel 127.0.0.1:LOCAL_PORT here to the server over SSH and keep running "
                   "(default %d when the server binds loopback and no tracker is given)." % DEFAULT_FORWARD_PORT)
@click.option("--no-forward", is_flag=True, help="Only start the server; do not tunnel.")
@click.option("--check-only", is_flag=True, help="Only check the device (python, numpy, msgpack, arch).")
@click.option("--stop", is_flag=True, help="Stop the server started earlier (by the PID it recorded).")
@click.option("--restart", is_flag=True, help="Restart the server even if it runs with the same settings.")
@click.option("--timeout", type=float, default=15.0, show_default=True, help="Seconds for each network step.")
@click.option("--start-timeout", type=float, default=30.0, show_default=True,
              help="Seconds to wait for the server to listen.")
def command(destination: str, ssh_port: int, identity: Optional[str], password_env: Optional[str],
            known_hosts: Optional[str], accept_new_host_key: bool, python: str, remote_dir: str, bind: str,
            remote_port: int, token: Optional[str], tracker: Optional[str], key: Optional[str],
            tracker_token: Optional[str], forward_port: Optional[int], no_forward: bool, check_only: bool,
            stop: bool, restart: bool, timeout: float, start_timeout: float) -> None:
    """Start the device server on a board over SSH and tunnel to it.

    The server listens on the device's loopback; this command then keeps an SSH tunnel from 127.0.0.1:LOCAL_PORT
    here to it until Ctrl-C (the server keeps running; `--stop` ends it). With --tracker the device registers
    with the tracker instead.
    """
    from tether import ssh
    from tether.errors import TetherError

    password = None
    if password_env:
        password = os.environ.get(password_env)
        if password is None:
            raise click.BadParameter("environment variable %s is not set" % password_env, param_hint="--password-env")
    if sum((check_only, stop)) > 1:
        raise click.UsageError("--check-only and --stop exclude each other")
    if forward_port is not None and no_forward:
        raise click.UsageError("--forward and --no-forward exclude each other")
    conn_args = dict(port=ssh_port, identity=identity, password=password, known_hosts=known_hosts,
                     accept_new_host_key=accept_new_host_key, timeout=timeout)
    try:
        if check_only or stop:
            with ssh.connect(destination, **conn_args) as conn:
                if stop:
                    click.echo("device server on %s: %s" % (conn.host, ssh.stop_server(conn, remote_dir)))
                    return
                check = ssh.check_device(conn, python)
            click.echo(check.summary())
            if not check.ok:
                raise click.ClickException("the device is not ready: install on it: %s" % check.install_hint)
            click.echo("device ready")
            return
        boot = ssh.bootstrap(destination, **conn_args, python=python, remote_dir=remote_dir, bind=bind,
                             remote_port=remote_port, token=token, tracker=tracker, key=key,
                             tracker_token=tracker_token, restart=restart, start_timeout=start_timeout)
    except ssh.DeviceNotReady as exc:
        click.echo(exc.check.summary(), err=True)
        raise click.ClickException("the device is not ready: install on it: %s" % exc.check.install_hint)
    except TetherError as exc:
        raise click.ClickException(str(exc))

    with boot:
        click.echo(boot.check.summary().splitlines()[0])
        click.echo("zipapp %s; device server %s (pid %d) on %s:%d of %s; log %s" % (
            "uploaded" if boot.uploaded else "unchanged", "reused" if boot.reused else "started", boot.pid,
            boot.remote_host, boot.remote_port, boot.host, boot.paths.log))
        if tracker:
            click.echo("registered with tracker %s under key %s" % (tracker, key))
        wants_forward = forward_port is not None or (not no_forward and not tracker and bind in ssh.LOOPBACK_HOSTS)
        if not wants_forward:
            click.echo("stop it with: tether bootstrap %s --stop" % destination)
            return
        try:
            local = boot.forward(DEFAULT_FORWARD_PORT if forward_port is None else forward_port)
        except ssh.BootstrapError:
            if forward_port is not None:
                raise
            local = boot.forward(0)  # the default port is taken here: any free port will do
        click.echo("SSH tunnel 127.0.0.1:%d -> %s:%d on %s; connect with:" % (local, boot.remote_host,
                                                                             boot.remote_port, boot.host))
        click.echo('    rpc.connect("127.0.0.1", %d%s)' % (local, ", token=..." if token else ""))
        click.echo("Ctrl-C ends the tunnel (the server keeps running; --stop ends it)", err=True)
        stopped = threading.Event()
        previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is \
            threading.main_thread() else None
        try:
            while boot.conn.transport.is_active():
                stopped.wait(0.5)
            raise click.ClickException("the SSH connection to %s dropped" % boot.host)
        except KeyboardInterrupt:
            click.echo("tunnel closed", err=True)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
