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


@click.command()
@click.option("--endpoint", metavar="HOST:PORT", default=None,
              help="Broker to use (must be listening). Default: 127.0.0.1:10911 if something listens there, "
                   "else a broker started for the run.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N flights.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Give up when not every flight was consumed within this many seconds.")
def main(endpoint: str | None, limit: int | None, timeout_s: float) -> None:
    """Replay the 336,776 NYC flights of 2013 through rocketq and check them per carrier."""
    console = Console()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s",
                        handlers=[RichHandler(console=console, show_path=False)])
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(run_demo(endpoint=endpoint, limit=limit, timeout_s=timeout_s, console=console))
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
