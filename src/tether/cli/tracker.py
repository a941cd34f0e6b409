"""`rpc-tracker`: run the device tracker (a pool of device servers with queues, grants and a byte relay)."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from typing import Optional, Tuple

import click

from tether.cli.errors import TetherCommand
from tether_rpc.tracker_protocol import DEFAULT_PORT


@click.command("rpc-tracker", cls=TetherCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Use 0.0.0.0 only on a trusted network, and with --token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port (0 picks a free one).")
@click.option("--token", default=None, envvar="TETHER_TRACKER_TOKEN",
              help="Shared secret every device and client must prove it knows (env TETHER_TRACKER_TOKEN).")
@click.option("--grant-timeout", default=1.0, show_default=True, type=float,
              help="Seconds a granted device waits for its client before it returns to the pool.")
@click.option("--heartbeat", default=1.0, show_default=True, type=float, help="Seconds between device heartbeats.")
@click.option("--dead-after", default=3.0, show_default=True, type=float,
              help="Seconds of silence after which a device is removed.")
@click.option("--ready-file", default=None, type=click.Path(dir_okay=False),
              help="Write the bound port to this file once listening (for scripts and tests).")
@click.option("--state", "state_file", default=None, type=click.Path(dir_okay=False),
              help="Keep queued requests' places in line and device holds in this JSON file, so that they survive "
                   "a tracker restart (docs/tracker.md says what survives).")
@click.option("--tls-cert", metavar="PEM", help="Serve TLS with this certificate (chain); see docs/tls.md.")
@click.option("--tls-key", metavar="PEM", help="The certificate's private key (default: in --tls-cert).")
@click.option("--insecure", is_flag=True, help="Allow listening beyond loopback without a token.")
@click.option("--http", "http_port", default=None, type=click.IntRange(0, 65535), metavar="PORT",
              help="Serve the dashboard (devices, queues, load, bench results; docs/tracker.md) on this port.")
@click.option("--http-host", default="127.0.0.1", show_default=True,
              help="Address of the dashboard; beyond loopback only with --token. With a token the page asks for it.")
@click.option("--web", "web_port", default=None, type=click.IntRange(0, 65535), metavar="PORT",
              help="Also serve the browser device page and its WebSocket relay on this port (docs/web_device.md).")
@click.option("--web-host", default="127.0.0.1", show_default=True,
              help="Address of the --web relay. Beyond loopback it needs --token.")
@click.option("--web-origin", multiple=True, metavar="ORIGIN",
              help="Another page origin allowed to open the relay's WebSocket (default: the relay's own).")
@click.option("--web-ready-file", default=None, type=click.Path(dir_okay=False),
              help="Write the --web relay's bound port to this file once listening.")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(host: str, port: int, token: Optional[str], grant_timeout: float, heartbeat: float, dead_after: float,
         ready_file: Optional[str], state_file: Optional[str], tls_cert: Optional[str], tls_key: Optional[str],
         insecure: bool, http_port: Optional[int], http_host: str, web_port: Optional[int], web_host: str,
         web_origin: Tuple[str, ...], web_ready_file: Optional[str], verbose: int) -> None:
    """Run the tether tracker: devices register, clients request them by key or tag."""
    from tether.tracker import TrackerServer
    from tether_rpc.config import is_loopback

    if not token and not insecure and not is_loopback(host):
        raise click.UsageError("refusing to listen on %s without --token: anyone who can reach it could register "
                               "fake devices or take real ones. Pass --token SECRET (devices set "
                               "TETHER_TRACKER_TOKEN), or --insecure on a trusted network." % host)

    if http_port is not None:
        from tether.tracker.dashboard import DashboardConfigError, check_access
        try:
            check_access(http_host, token)
        except DashboardConfigError as exc:
            raise click.UsageError(str(exc))

    if web_port is not None and not token and not is_loopback(web_host):
        # the relay hands out tracker connections: beyond loopback only a token keeps strangers from using them
        raise click.UsageError("refusing to serve the web relay on %s without --token: anyone who can reach it "
                               "could register devices or take them. Pass --token SECRET (the page takes it as "
                               "#token=...), or keep --web-host 127.0.0.1." % web_host)
    if web_port is not None and (tls_cert or tls_key):
        raise click.UsageError("--web relays raw tracker bytes and cannot be combined with --tls-cert "
                               "(reverse-mode devices cannot use a TLS tracker)")
    for path, option in ((ready_file, "--ready-file"), (state_file, "--state"), (web_ready_file, "--web-ready-file")):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise click.BadParameter("%s: its folder does not exist" % path, param_hint=option)
    ssl_context = None
    if tls_cert or tls_key:
        from tether_rpc.tls import TLSError, server_context
        if not tls_cert:
            raise click.UsageError("--tls-key needs --tls-cert (the certificate that goes with the key)")
        try:
            ssl_context = server_context(tls_cert, tls_key)
        except TLSError as exc:
            raise click.UsageError(str(exc))

    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        server = TrackerServer(host, port, token=token, grant_timeout=grant_timeout, heartbeat=heartbeat,
                               dead_after=dead_after, ssl_context=ssl_context, state_file=state_file)
        await server.start()
        # A full collection walks every live object (with a thousand devices, their connections' objects) and
        # stalls every request meanwhile: start-up objects stay out of it for good, and it comes 100x less often
        # than by default (minutes apart under a lab's load). Young collections keep their small default sizes.
        gc.freeze()
        gc.set_threshold(700, 10, 1000)
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        click.echo("tether tracker listening on %s:%d%s" % (host, server.port, " (token required)" if token else ""))
        dashboard = None
        if http_port is not None:
            from tether.tracker.dashboard import Dashboard
            dashboard = Dashboard(server, http_host, http_port, token=token)
            try:
                await dashboard.start()
            except OSError as exc:
                server.close()
                raise click.ClickException("the dashboard cannot listen on %s:%d: %s"
                                           % (http_host, http_port, exc.strerror or exc)) from None
            click.echo("tether tracker dashboard on %s" % dashboard.url)
        relay = None
        if web_port is not None:
            from tether.tracker.web_relay import WebRelay

            relay = WebRelay("127.0.0.1" if host in ("0.0.0.0", "") else host, server.port, web_host, web_port,
                             origins=web_origin)
            try:
                await relay.start()
            except OSError as exc:
                if dashboard is not None:
                    dashboard.close()
                server.close()
                raise click.ClickException("the web relay cannot listen on %s:%d: %s"
                                           % (web_host, web_port, exc.strerror or exc)) from None
            click.echo("browser device page: %s#key=browser%s" % (relay.page_url, "&token=..." if token else ""))
        for path, bound in ((ready_file, server.port), (web_ready_file, relay.port if relay else None)):
            if path and bound is not None:
                tmp = path + ".tmp"
                with open(tmp, "w") as f:
                    f.write("%d\n" % bound)
                os.replace(tmp, path)
        try:
            await stop
        finally:
            if dashboard is not None:
                dashboard.close()
            if relay is not None:
                relay.close()
            server.close()

    asyncio.run(run())


command = main

if __name__ == "__main__":
    main()
