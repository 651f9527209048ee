"""`rocketq console start [--listen-host 127.0.0.1] [--listen-port 8080] --endpoints ...`: the web
console in the foreground until Ctrl-C or SIGTERM. `--endpoints` (a broker or a name server),
`--access-key`/`--secret-key`, `--tls`, `--ca-file` are the admin commands' (`admin.common`):
the console's own credentials, used for the background lag samples and, with authentication
off, for every page; with authentication on, each visitor logs in as a user of the cluster."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import click

from admin.base import CONTEXT_SETTINGS, example_epilog
from admin.common import EXIT_UNREACHABLE, current_connection, endpoints_option, fail, first_endpoint
from console.server import ConsoleServer
from console.state import ConsoleSettings


@click.group("console", context_settings=CONTEXT_SETTINGS)
def console_group() -> None:
    """The web console: cluster, topics, consumer groups and lag, messages, dead letters."""


@console_group.command("start", epilog=example_epilog(
    "rocketq console start --endpoints 127.0.0.1:9876 --listen-port 8080"))
@click.option("--listen-host", default="127.0.0.1", show_default=True,
              help="Address to serve on (only this host can open it unless told otherwise, e.g. 0.0.0.0).")
@click.option("--listen-port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to serve on (0: any free port, printed).")
@click.option("--sample-interval-ms", default=10_000, show_default=True, type=click.IntRange(1_000, 600_000),
              help="How often every group's lag is sampled for the last-hour charts.")
@endpoints_option
def start(listen_host: str, listen_port: int, sample_interval_ms: int, endpoints: str) -> None:
    """Serve the web console until Ctrl-C (or SIGTERM)."""
    settings = ConsoleSettings(endpoint=first_endpoint(endpoints), connection=current_connection(),
                               listen_host=listen_host, listen_port=listen_port,
                               sample_interval_ms=sample_interval_ms)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, stop.set)
        async with ConsoleServer(settings) as server:
            click.echo(f"rocketq console on {server.url} (cluster at {settings.endpoint}); Ctrl-C stops it")
            await stop.wait()

    try:
        asyncio.run(main())
    except OSError as exc:
        fail(f"cannot serve on {listen_host}:{listen_port}: {exc}", EXIT_UNREACHABLE)
