"""Command line: `rocketq namesrv start`, and `mqnamesrv` / `python -m namesrv` for the same thing.

Configuration as the broker's (`conf/namesrv.toml`, then `ROCKETQ_NAMESRV__<KEY>` environment
variables, then `--set key=value`, then `--listen-host` / `--listen-port`); the signal handling and
graceful stop are the broker's (`broker.cli.serve_until_signalled`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import click

from broker.cli import (
    LOG_FORMAT,
    describe_start_failure,
    event_loop_factory,
    insecure_option,
    parse_sets,
    serve_until_signalled,
    with_options,
)
from conf import ConfigError, load
from conf.namesrv import ENV_PREFIX, NamesrvConfig

DEFAULT_CONFIG_PATH = Path("conf/namesrv.toml")
_CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_F = TypeVar("_F", bound=Callable[..., Any])
_PRECEDENCE = (
    "Settings are taken, lowest first, from built-in defaults, the config file, ROCKETQ_NAMESRV__* "
    "environment variables (ROCKETQ_NAMESRV__LISTEN_PORT=9877), --set, and finally --listen-host and "
    "--listen-port. Unknown keys are an error. Brokers find it with --namesrv-addr HOST:PORT and clients "
    "with endpoints=HOST:PORT. Stop with SIGTERM or Ctrl-C (graceful)."
)
_START_EXAMPLE = "\b\nExample:\n  rocketq namesrv start --config conf/namesrv.toml --listen-port 9876"
_MQNAMESRV_EXAMPLE = "\b\nExample:\n  mqnamesrv --listen-port 9877 --set broker_channel_expired_time_ms=30000"


def resolve_namesrv_config(config_path: Path | None, listen_host: str | None, listen_port: int | None,
                           sets: Sequence[str], env: Mapping[str, str]) -> NamesrvConfig:
    """Defaults < `config_path` (or conf/namesrv.toml in the working directory when None and it
    exists) < `env` (`ROCKETQ_NAMESRV__*`) < `sets` < the options. Raises `ConfigError`."""
    if config_path is None and DEFAULT_CONFIG_PATH.is_file():
        config_path = DEFAULT_CONFIG_PATH
    config = load(NamesrvConfig, file=config_path, env=env, overrides=parse_sets(sets), env_prefix=ENV_PREFIX)
    if listen_host is not None:
        config = replace(config, listen_host=listen_host)
    if listen_port is not None:
        config = replace(config, listen_port=listen_port)
    return config


def run_namesrv(config: NamesrvConfig, loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> int:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    from namesrv.namesrv import NameServer

    namesrv = NameServer(config)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve_until_signalled(
            namesrv, lambda err: describe_start_failure(config, err, "name server"),
            lambda: f"rocketq name server listening on {namesrv.address}", "name server",
            config.graceful_shutdown_timeout_ms))


def _start_options(command: _F) -> _F:
    defaults = NamesrvConfig()
    options = [
        click.option("--config", "config_path", metavar="PATH",
                     type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help=f"TOML config file (every key with comments: conf/namesrv.toml). "
                          f"[default: {DEFAULT_CONFIG_PATH} if it exists, else built-in defaults]"),
        click.option("--listen-host", metavar="HOST",
                     help=f"Address to accept brokers and clients on. [default: {defaults.listen_host}]"),
        click.option("--listen-port", metavar="PORT", type=click.IntRange(0, 65535),
                     help=f"TCP port; 0 picks a free one (the log shows which). [default: {defaults.listen_port}]"),
        click.option("--set", "sets", metavar="KEY=VALUE", multiple=True,
                     help="Set any config key, e.g. --set broker_channel_expired_time_ms=30000. Repeatable."),
        insecure_option("brokers and clients", "a name server"),
    ]
    return with_options(command, options)


def _start(config_path: Path | None, listen_host: str | None, listen_port: int | None,
           sets: tuple[str, ...], insecure: bool) -> None:
    try:
        config = resolve_namesrv_config(config_path, listen_host, listen_port, sets, os.environ)
        if insecure:
            config = replace(config, protected_mode=False)
        loop_factory = event_loop_factory(config.event_loop)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    click.get_current_context().exit(run_namesrv(config, loop_factory))


@click.group("namesrv", context_settings=_CONTEXT_SETTINGS)
def namesrv_group() -> None:
    """Run a name server (brokers register with it; clients ask it for routes)."""


@namesrv_group.command("start", epilog=f"{_PRECEDENCE}\n\n{_START_EXAMPLE}")
@_start_options
def start(config_path: Path | None, listen_host: str | None, listen_port: int | None,
          sets: tuple[str, ...], insecure: bool) -> None:
    """Start a name server in the foreground and serve until stopped."""
    _start(config_path, listen_host, listen_port, sets, insecure)


@click.command("mqnamesrv", context_settings=_CONTEXT_SETTINGS, epilog=f"{_PRECEDENCE}\n\n{_MQNAMESRV_EXAMPLE}")
@_start_options
def mqnamesrv(config_path: Path | None, listen_host: str | None, listen_port: int | None,
              sets: tuple[str, ...], insecure: bool) -> None:
    """Start a name server in the foreground (same as `rocketq namesrv start`)."""
    _start(config_path, listen_host, listen_port, sets, insecure)
