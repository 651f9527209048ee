"""`python -m demo`: the flights demo (see `demo/__init__.py`); exit code 0 only when everything matched."""

from __future__ import annotations

import asyncio
import logging
import sys

import click
import uvloop
from rich.console import Console
from rich.logging import RichHandler

from demo.run import run_demo
from protocol.signing import Credentials


@click.command()
@click.option("--endpoint", metavar="HOST:PORT", default=None,
              help="Broker to use (must be listening). Default: 127.0.0.1:10911 if something listens there, "
                   "else a broker started for the run.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N flights.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Give up when not every flight was consumed within this many seconds.")
@click.option("--secure", is_flag=True, envvar="DEMO_SECURE",
              help="Authentication, authorization and TLS on: a broker started with them (mutual TLS, certificates "
                   "made for the run), one user per role with its ACL, the clients signing with their credentials "
                   "over TLS (make demo DEMO_SECURE=1).")
@click.option("--access-key", envvar="ROCKETQ_ACCESS_KEY", default=None,
              help="With --secure and --endpoint: a Super user of that broker (creates the topic and users).")
@click.option("--secret-key", envvar="ROCKETQ_SECRET_KEY", default=None, help="That user's password.")
@click.option("--ca-file", envvar="ROCKETQ_CA_FILE", default=None, type=click.Path(exists=True, dir_okay=False),
              help="With --endpoint: connect over TLS, verifying the broker against this PEM CA file.")
def main(endpoint: str | None, limit: int | None, timeout_s: float, secure: bool, access_key: str | None,
         secret_key: str | None, ca_file: str | None) -> None:
    """Replay the 336,776 NYC flights of 2013 through rocketq and check them per carrier."""
    admin = Credentials(access_key, secret_key) if secure and access_key and secret_key else None
    console = Console()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s",
                        handlers=[RichHandler(console=console, show_path=False)])
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(run_demo(endpoint=endpoint, limit=limit, timeout_s=timeout_s, console=console,
                                     secure=secure, admin=admin, ca_file=ca_file))
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
