"""`python -m tether_rpc` (or the zipapp): the device server, with argparse so the device needs no click.

Same flags and the same implementation (:func:`tether_rpc.server.run`) as the host's `rpc-server` command.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tether_rpc", description="tether device server (rpc-server)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=9090, help="first port to try (0 = any free port)")
    ap.add_argument("--port-end", type=int, default=9199, help="last port to try")
    ap.add_argument("--tracker", metavar="HOST:PORT", help="register with a tracker")
    ap.add_argument("--key", help="device key for the tracker, e.g. rasp4b")
    ap.add_argument("--reverse", action="store_true", help="dial out to the tracker instead of listening")
    ap.add_argument("--tracker-tls", action="store_true", help="speak TLS to the tracker (its certificate checked "
                    "against the system's CAs, or --tracker-ca)")
    ap.add_argument("--tracker-ca", metavar="PEM", help="trust this CA certificate for the tracker (implies TLS)")
    ap.add_argument("--tracker-token", help="prove this token to the tracker (or set TETHER_TRACKER_TOKEN)")
    ap.add_argument("--tag", action="append", metavar="NAME=VALUE",
                    help="device tag for the tracker, repeatable (or set TETHER_DEVICE_TAGS=a=b,c=d)")
    ap.add_argument("--advertise-host", metavar="HOST",
                    help="address the tracker hands to clients (default: the address it sees)")
    ap.add_argument("--token", help="require clients to prove this token (or set TETHER_TOKEN)")
    ap.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (chain); see docs/tls.md")
    ap.add_argument("--tls-key", metavar="PEM", help="the certificate's private key (default: in --tls-cert)")
    ap.add_argument("--insecure", action="store_true", help="allow listening beyond loopback without a token")
    ap.add_argument("--session-timeout", type=float, default=3600.0, metavar="S",
                    help="end sessions after S seconds (default 3600)")
    ap.add_argument("--idle-timeout", type=float, default=300.0, metavar="S",
                    help="end a session that sends nothing for S seconds, freeing the device (default 300; 0 = "
                         "never). A running call does not count as idle")
    ap.add_argument("--spin-us", type=float, default=100.0, metavar="US",
                    help="after a reply, poll up to US microseconds for the next call before sleeping, while that "
                         "measures faster (default 100; 0 = never poll)")
    ap.add_argument("--session-memory", metavar="SIZE",
                    help="device memory one session's arrays may hold, e.g. 512MB or 2GiB (default 3/4 of RAM; 0 = "
                         "no limit)")
    ap.add_argument("--session-disk", metavar="SIZE", help="bytes one session may upload (default 4GiB; 0 = no limit)")
    ap.add_argument("--session-handles", type=int, metavar="N",
                    help="objects (arrays, modules, functions) one session may hold (default 65536; 0 = no limit)")
    ap.add_argument("--call-timeout", type=float, metavar="S",
                    help="abort a call that runs longer than S seconds, ending its session (default 1800; 0 = no "
                         "limit)")
    ap.add_argument("--handshake-timeout", type=float, default=5.0, metavar="S",
                    help="close a connection that has not completed its handshake within S seconds (default 5)")
    ap.add_argument("--functions", action="append", metavar="FILE.py",
                    help="run FILE.py at start (repeatable): the host functions it registers with register_func are "
                         "offered to clients (remote.get_function) and to modules. This runs its code on the device")
    ap.add_argument("--workdir", help="where session folders are created (default: system temp)")
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="-vv: debug log (the default log level is info)")
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from .server import run

    if args.functions:
        from .host_functions import load_file
        for path in args.functions:
            load_file(path)
    return run(host=args.host, port=args.port, port_end=args.port_end, tracker=args.tracker, key=args.key,
               token=args.token, insecure=args.insecure, session_timeout=args.session_timeout,
               workdir=args.workdir, reverse=args.reverse, handshake_timeout=args.handshake_timeout,
               verbose=args.verbose, tracker_token=args.tracker_token, tags=args.tag,
               advertise_host=args.advertise_host, idle_timeout=args.idle_timeout, spin_us=args.spin_us,
               session_memory=args.session_memory, session_disk=args.session_disk,
               session_handles=args.session_handles, call_timeout=args.call_timeout, tls_cert=args.tls_cert,
               tls_key=args.tls_key, tracker_tls=args.tracker_tls, tracker_ca=args.tracker_ca)


if __name__ == "__main__":
    sys.exit(main())
