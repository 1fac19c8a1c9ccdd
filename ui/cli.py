"""``dafka ui`` (and ``dafka_ui``): the web console."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from dafka.cli.common import (CONTEXT_SETTINGS, EXIT_FAILURE, TowerWatch, common_options, load_config, say,
                              setup_logging)


@click.command("ui", context_settings=CONTEXT_SETTINGS)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, metavar="PORT",
              help="The port the console listens on (0: any free port; the line it prints says which).")
@click.option("--address", default="127.0.0.1", show_default=True, metavar="ADDRESS",
              help="The interface it listens on. The console has no login: give another address (0.0.0.0) only "
                   "behind something that has one.")
@click.option("--allow-produce", is_flag=True,
              help="Show the Produce page: anyone who can open the console can then send records (from the "
                   "console's own producer, one partition a topic).")
@common_options(
    pub_help="The tower's XPUB: beacon/pub_address (default tcp://127.0.0.1:5557).",
    sub_help="The tower's XSUB: beacon/sub_address (default tcp://127.0.0.1:5556).",
)
def ui(port: int, address: str, allow_produce: bool, config_path: str | None, pub: str | None, sub: str | None,
       sets: list, verbose: bool, tower_timeout_ms: int) -> None:
    """Serve a web console of the cluster: live peers, stores, topics and their partitions, records (browse,
    search, follow live), consumer groups and their lag, mirrors and CDC connectors.

    The console joins the cluster as a peer with the same configuration as any other (towers, CURVE keys:
    -c FILE). It listens to the cluster only while a page is open, and never joins a consumer group.

    \b
    Examples:
      dafka ui                                   # http://127.0.0.1:8080/
      dafka ui --port 9000 --pub tcp://10.0.0.5:5557 --sub tcp://10.0.0.5:5556
      dafka ui -c site.cfg --allow-produce
    """
    config = load_config(
        config_path, sets,
        {"beacon/pub_address": ("--pub", pub), "beacon/sub_address": ("--sub", sub)},
        verbose_keys=("beacon/verbose",), verbose=verbose,
    )
    setup_logging(verbose)
    try:
        import uvicorn

        from .app import Console
        from .peer import ConsolePeer
    except ImportError as exc:
        say(f"the console needs its extra: pip install 'dafka[ui]' ({exc})")
        sys.exit(EXIT_FAILURE)
    peer = ConsolePeer(config).start()
    watch = TowerWatch(lambda: peer.tower_connected, config["beacon/pub_address"], tower_timeout_ms).start()
    console = Console(peer, allow_produce=allow_produce)
    server = _server_class(uvicorn)(uvicorn.Config(
        console.app, host=address, port=port, log_level="warning", access_log=verbose, lifespan="on",
        timeout_graceful_shutdown=2))
    try:
        server.run()
    except SystemExit:  # uvicorn exits (with its own code) when it cannot listen; it said why
        pass
    finally:
        watch.cancel()
        peer.stop()
    if not server.started:
        say(f"cannot serve the console on {address}:{port}")
        sys.exit(EXIT_FAILURE)


def _server_class(uvicorn: Any) -> Any:
    """uvicorn's server, saying where it listens once it has bound the port (``--port 0``), and waking once
    a second instead of ten times: uvicorn's loop ticks every 0.1 s to notice a signal and to refresh its Date
    header, which was most of an idle console's CPU (a wake-up costs about 0.1 ms on a small VM).  A Ctrl-C is
    then noticed within a second."""

    class ConsoleServer(uvicorn.Server):  # type: ignore[misc, name-defined]
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, bound = sock.getsockname()[:2]
                    click.echo(f"dafka console at http://{host}:{bound}/ (Ctrl-C stops it)", err=True)

        async def main_loop(self) -> None:
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 10) % 864000  # on_tick counts tenths of a second
                await asyncio.sleep(1.0)
                should_exit = await self.on_tick(counter)

    return ConsoleServer


main = ui
