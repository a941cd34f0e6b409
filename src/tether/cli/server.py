"""`rpc-server`: the device server as a click command (same flags and implementation as `python -m tether_rpc`)."""
from __future__ import annotations

from typing import Optional, Tuple

import click

from tether.cli.errors import TetherCommand


@click.command(name="rpc-server", cls=TetherCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=9090, show_default=True,
              help="First port to try (0 = any free port).")
@click.option("--port-end", type=click.IntRange(0, 65535), default=9199, show_default=True, help="Last port to try.")
@click.option("--tracker", metavar="HOST:PORT", help="Register with a tracker.")
@click.option("--key", help="Device key for the tracker, e.g. rasp4b.")
@click.option("--reverse", is_flag=True, help="Dial out to the tracker instead of listening.")
@click.option("--tracker-tls", is_flag=True,
              help="Speak TLS to the tracker (its certificate checked against the system's CAs, or --tracker-ca).")
@click.option("--tracker-ca", metavar="PEM", help="Trust this CA certificate for the tracker (implies TLS).")
@click.option("--tracker-token", envvar="TETHER_TRACKER_TOKEN",
              help="Prove this token to the tracker (env TETHER_TRACKER_TOKEN).")
@click.option("--tag", "tags", multiple=True, metavar="NAME=VALUE",
              help="Device tag for the tracker, repeatable (env TETHER_DEVICE_TAGS=a=b,c=d).")
@click.option("--advertise-host", metavar="HOST", help="Address the tracker hands to clients (default: as it sees us).")
@click.option("--token", envvar="TETHER_TOKEN", help="Require clients to prove this token (env TETHER_TOKEN).")
@click.option("--tls-cert", metavar="PEM", help="Serve TLS with this certificate (chain); see docs/tls.md.")
@click.option("--tls-key", metavar="PEM", help="The certificate's private key (default: in --tls-cert).")
@click.option("--insecure", is_flag=True, help="Allow listening beyond loopback without a token.")
@click.option("--session-timeout", type=float, default=3600.0, show_default=True, metavar="S",
              help="End sessions after S seconds.")
@click.option("--idle-timeout", type=float, default=300.0, show_default=True, metavar="S",
              help="End a session that sends nothing for S seconds, freeing the device (0 = never). "
                   "A running call does not count as idle.")
@click.option("--spin-us", type=float, default=100.0, show_default=True, metavar="US",
              help="After a reply, poll up to US microseconds for the next call before sleeping, while that "
                   "measures faster (0 = never poll).")
@click.option("--session-memory", metavar="SIZE",
              help="Device memory one session's arrays may hold, e.g. 512MB or 2GiB [default: 3/4 of RAM; 0 = no "
                   "limit].")
@click.option("--session-disk", metavar="SIZE", help="Bytes one session may upload [default: 4GiB; 0 = no limit].")
@click.option("--session-handles", type=int, metavar="N",
              help="Objects (arrays, modules, functions) one session may hold [default: 65536; 0 = no limit].")
@click.option("--call-timeout", type=float, metavar="S",
              help="Abort a call that runs longer than S seconds, ending its session [default: 1800; 0 = no limit].")
@click.option("--handshake-timeout", type=float, default=5.0, show_default=True, metavar="S",
              help="Close a connection that has not completed its handshake within S seconds.")
@click.option("--functions", "functions", multiple=True, type=click.Path(dir_okay=False, exists=True),
              metavar="FILE.py", help="Run FILE.py at start (repeatable): the host functions it registers with "
              "register_func are offered to clients and modules. This runs its code on the device.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Where session folders are created.")
@click.option("-v", "--verbose", count=True, help="-vv: debug log (the default log level is info).")
def main(host: str, port: int, port_end: int, tracker: Optional[str], key: Optional[str], reverse: bool,
         tracker_tls: bool, tracker_ca: Optional[str], tracker_token: Optional[str], tags: Tuple[str, ...],
         advertise_host: Optional[str],
         token: Optional[str], tls_cert: Optional[str], tls_key: Optional[str], insecure: bool,
         session_timeout: float, idle_timeout: float,
         spin_us: float, session_memory: Optional[str], session_disk: Optional[str],
         session_handles: Optional[int], call_timeout: Optional[float], handshake_timeout: float,
         functions: Tuple[str, ...], workdir: Optional[str], verbose: int) -> None:
    """Serve sessions to tether clients: upload modules, run and time kernels, one session at a time."""
    from tether_rpc.host_functions import load_file
    from tether_rpc.server import run

    for path in functions:
        try:
            load_file(path)
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes, i.e. a binary file
            # the file is not Python at all; an error its code raises while running keeps its traceback
            where = " (line %s)" % exc.lineno if getattr(exc, "lineno", None) else ""
            raise click.BadParameter("%s is not valid Python: %s%s" % (path, getattr(exc, "msg", None) or exc, where),
                                     param_hint="--functions") from None
    raise SystemExit(run(host=host, port=port, port_end=port_end, tracker=tracker, key=key, token=token,
                         insecure=insecure, session_timeout=session_timeout, workdir=workdir, reverse=reverse,
                         handshake_timeout=handshake_timeout, verbose=verbose, tracker_token=tracker_token,
                         tags=list(tags), advertise_host=advertise_host, idle_timeout=idle_timeout,
                         spin_us=spin_us, session_memory=session_memory, session_disk=session_disk,
                         session_handles=session_handles, call_timeout=call_timeout, tls_cert=tls_cert,
                         tls_key=tls_key, tracker_tls=tracker_tls, tracker_ca=tracker_ca))


command = main
