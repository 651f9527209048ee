"""Command line: `rocketq controller start`, and `mqcontroller` / `python -m controller` for the same.

Settings, lowest first: defaults, `ROCKETQ_CONTROLLER__*` environment variables, `--set key=value`,
then the options (`--listen-host`, `--listen-port`, `--peers`, `--node-id`, `--data-dir`)."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from typing import Any

import click

from broker.cli import LOG_FORMAT, event_loop_factory, parse_sets, serve_until_signalled
from conf import ConfigError, load
from conf.controller import ENV_PREFIX, ControllerConfig

_CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_ABOUT = ("Brokers report with --set controller_addr=HOST:PORT[;HOST:PORT]. With --peers, Raft among the "
          "controllers uses each peer's port + raft_port_offset (1). Stop with SIGTERM or Ctrl-C (graceful).")
_START_EXAMPLE = ("\b\nExample:\n  rocketq controller start --listen-port 9878 "
                  "--peers c1=127.0.0.1:9878,c2=127.0.0.1:9880,c3=127.0.0.1:9882")
_MQCONTROLLER_EXAMPLE = "\b\nExample:\n  mqcontroller --listen-port 9878 --set broker_lease_ms=3000"


def _options(command: Any) -> Any:
    for option in reversed([
        click.option("--listen-host", metavar="HOST", help="Address brokers reach this controller on."),
        click.option("--listen-port", metavar="PORT", type=click.IntRange(0, 65534),
                     help=f"TCP port for brokers. [default: {ControllerConfig().listen_port}]"),
        click.option("--peers", metavar="ID=HOST:PORT,...", help="Every controller of the group (3), this one too."),
        click.option("--node-id", metavar="ID", help="This controller's id in --peers [default: the entry with "
                                                     "--listen-port]."),
        click.option("--data-dir", metavar="PATH", help="Raft journal and snapshot [default: memory only]."),
        click.option("--set", "sets", metavar="KEY=VALUE", multiple=True,
                     help="Any config key, e.g. --set broker_lease_ms=3000. Repeatable."),
    ]):
        command = option(command)
    return command


def _start(listen_host: str | None, listen_port: int | None, peers: str | None, node_id: str | None,
           data_dir: str | None, sets: tuple[str, ...]) -> None:
    try:
        config = load(ControllerConfig, file=None, env=os.environ, overrides=parse_sets(sets),
                      env_prefix=ENV_PREFIX)
        given: dict[str, Any] = {"listen_host": listen_host, "listen_port": listen_port, "peers": peers,
                                 "node_id": node_id, "data_dir": data_dir}
        config = replace(config, **{key: value for key, value in given.items() if value is not None})
        loop_factory = event_loop_factory(config.event_loop)  # type: ignore[arg-type]
    except (ConfigError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    from controller.server import Controller

    controller = Controller(config)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        code = runner.run(serve_until_signalled(
            controller, lambda err: f"controller could not start: {err}",
            lambda: f"rocketq controller listening on {controller.address}", "controller",
            config.graceful_shutdown_timeout_ms))
    click.get_current_context().exit(code)


@click.group("controller", context_settings=_CONTEXT_SETTINGS)
def controller_group() -> None:
    """Run a controller (elects the master of each replica set; docs/ha.md)."""


@controller_group.command("start", epilog=f"{_ABOUT}\n\n{_START_EXAMPLE}")
@_options
def start(**options: Any) -> None:
    """Start a controller in the foreground and serve until stopped."""
    _start(**options)


@click.command("mqcontroller", context_settings=_CONTEXT_SETTINGS, epilog=f"{_ABOUT}\n\n{_MQCONTROLLER_EXAMPLE}")
@_options
def mqcontroller(**options: Any) -> None:
    """Start a controller in the foreground (same as `rocketq controller start`)."""
    _start(**options)
