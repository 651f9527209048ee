"""broker.cli: help, config resolution and errors, and a real broker served from the command line."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.cli import (
    ShutdownSignals,
    event_loop_factory,
    main,
    mqbroker,
    parse_sets,
    resolve_config,
)
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf import BrokerConfig, ConfigError, LongPollingConfig, StoreConfig
from tests.helpers import pull_header, send

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def in_empty_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("ROCKETQ_")]:
        monkeypatch.delenv(name)
    return tmp_path


# --- help ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["broker", "start", "--help"], ["broker", "start", "-h"]])
def test_start_help_explains_every_option(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0
    for text in ("--config", "--listen-host", "--listen-port", "--store-dir", "--set", "10911",
                 "127.0.0.1", "ROCKETQ_LONG_POLLING__ENABLE", "long_polling.enable=false"):
        assert text in result.output


def test_group_help_lists_commands() -> None:
    assert "broker" in CliRunner().invoke(main, ["--help"]).output
    result = CliRunner().invoke(main, ["broker", "--help"])
    assert result.exit_code == 0 and "start" in result.output


def test_mqbroker_has_the_same_options() -> None:
    result = CliRunner().invoke(mqbroker, ["--help"])
    assert result.exit_code == 0
    assert all(o in result.output for o in ("--config", "--listen-port", "--store-dir", "--set"))


def test_python_dash_m_broker_is_mqbroker() -> None:
    result = subprocess.run([sys.executable, "-m", "broker", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0 and "Usage: python -m broker" in result.stdout
    assert "--listen-port" in result.stdout


# --- config errors on the command line -----------------------------------------------------------


def test_unknown_set_key_is_a_usage_error_listing_valid_keys(in_empty_dir: Path) -> None:
    result = CliRunner().invoke(main, ["broker", "start", "--set", "long_polling.enabel=false"])
    assert result.exit_code == 2
    assert "unknown config key 'long_polling.enabel'" in result.output
    assert "long_polling.enable" in result.output and "long_polling.check_interval_ms" in result.output
    assert "Traceback" not in result.output


def test_set_without_equals_is_a_usage_error(in_empty_dir: Path) -> None:
    result = CliRunner().invoke(mqbroker, ["--set", "long_polling.enable"])
    assert result.exit_code == 2 and "expected SECTION.KEY=VALUE" in result.output


def test_unknown_env_key_and_bad_file_value_are_usage_errors(in_empty_dir: Path) -> None:
    result = CliRunner(env={"ROCKETQ_LISTEN_PROT": "1"}).invoke(mqbroker, [])
    assert result.exit_code == 2 and "ROCKETQ_LISTEN_PROT" in result.output and "listen_port" in result.output
    (in_empty_dir / "bad.toml").write_text("listen_port = 'x'\n")
    result = CliRunner().invoke(mqbroker, ["--config", "bad.toml"])
    assert result.exit_code == 2 and "expected int, got str" in result.output


def test_missing_config_file_is_a_usage_error(in_empty_dir: Path) -> None:
    result = CliRunner().invoke(mqbroker, ["--config", "nope.toml"])
    assert result.exit_code == 2 and "nope.toml" in result.output


# --- resolve_config ------------------------------------------------------------------------------


def test_defaults_without_a_config_file(in_empty_dir: Path) -> None:
    assert resolve_config(None, None, None, None, [], {}) == BrokerConfig()


def test_conf_broker_toml_in_the_working_directory_is_the_default(in_empty_dir: Path) -> None:
    (in_empty_dir / "conf").mkdir()
    (in_empty_dir / "conf" / "broker.toml").write_text("broker_name = 'b'\n")
    assert resolve_config(None, None, None, None, [], {}).broker_name == "b"
    (in_empty_dir / "other.toml").write_text("broker_name = 'c'\n")
    assert resolve_config(Path("other.toml"), None, None, None, [], {}).broker_name == "c"


def test_options_override_set_override_env_override_file(in_empty_dir: Path) -> None:
    file = in_empty_dir / "c.toml"
    file.write_text("listen_host = 'file'\nlisten_port = 1\nbroker_name = 'file'\n"
                    "[store]\npath = 'file'\nflush_interval_ms = 1\n")
    env = {"ROCKETQ_LISTEN_PORT": "2", "ROCKETQ_BROKER_NAME": "env", "ROCKETQ_STORE__PATH": "env"}
    sets = ["listen_port=3", "store.path=set", "store.flush_disk_type=ASYNC_FLUSH", "event_loop=asyncio"]
    assert resolve_config(file, None, None, None, [], {}) == BrokerConfig(
        listen_host="file", listen_port=1, broker_name="file",
        store=StoreConfig(path=Path("file"), flush_interval_ms=1))
    assert resolve_config(file, None, None, None, [], env) == BrokerConfig(
        listen_host="file", listen_port=2, broker_name="env",
        store=StoreConfig(path=Path("env"), flush_interval_ms=1))
    assert resolve_config(file, None, None, None, sets, env) == BrokerConfig(
        listen_host="file", listen_port=3, broker_name="env", event_loop="asyncio",
        store=StoreConfig(path=Path("set"), flush_interval_ms=1, flush_disk_type="ASYNC_FLUSH"))
    assert resolve_config(file, "0.0.0.0", 4, Path("opt"), sets, env) == BrokerConfig(
        listen_host="0.0.0.0", listen_port=4, broker_name="env", event_loop="asyncio",
        store=StoreConfig(path=Path("opt"), flush_interval_ms=1, flush_disk_type="ASYNC_FLUSH"))


def test_later_set_wins_and_value_may_contain_equals() -> None:
    assert parse_sets(["broker_name=a", "broker_name=b=c", " cluster_name =", "x.y="]) == {
        "broker_name": "b=c", "cluster_name": "", "x.y": ""}
    with pytest.raises(ConfigError):
        parse_sets(["=x"])


def test_long_polling_can_be_switched_off(in_empty_dir: Path) -> None:
    config = resolve_config(None, None, None, None, ["long_polling.enable=false"], {})
    assert config.long_polling == LongPollingConfig(enable=False)


# --- event loop ----------------------------------------------------------------------------------


def test_event_loop_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    assert event_loop_factory("asyncio") is asyncio.new_event_loop
    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("uvloop") is uvloop.new_event_loop
    monkeypatch.setitem(sys.modules, "uvloop", None)  # makes `import uvloop` raise ImportError
    assert event_loop_factory("auto") is asyncio.new_event_loop
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        event_loop_factory("uvloop")


# --- running -------------------------------------------------------------------------------------


def test_second_sigint_forces_exit_and_sigterm_only_once() -> None:
    stops: list[None] = []
    forced: list[int] = []
    signals = ShutdownSignals(lambda: stops.append(None), forced.append)
    signals.on_signal(signal.SIGTERM)
    signals.on_signal(signal.SIGTERM)
    assert stops == [None] and forced == []
    signals.on_signal(signal.SIGINT)
    assert stops == [None] and forced == [1]


def _start_broker(*args: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m broker ARGS` in a subprocess; returns it with the address it logged."""
    proc = subprocess.Popen([sys.executable, "-m", "broker", "--set", "metrics_port=0", "--set", "grpc_port=0",
                             *args], cwd=REPO,
                            text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    for _ in range(200):
        line = proc.stderr.readline()
        assert line, "the broker exited before listening"
        if "listening on " in line:
            return proc, line.split("listening on ")[1].split()[0]
    raise AssertionError("no 'listening on' line")


async def _send_and_pull(address: str) -> bytes:
    remoting = RemotingClient()
    try:
        api = ClientAPI(remoting)
        await send(api, address, "cli", b"through the cli")
        result = await api.pull_message(address, pull_header(topic="cli"), 3_000)
        return result.messages[0].body
    finally:
        await remoting.close()


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_start_serves_until_sigterm_then_exits_0(tmp_path: Path, event_loop: str) -> None:
    store = tmp_path / "s"
    proc, address = _start_broker("--listen-port", "0", "--store-dir", str(store), "--set",
                                  f"event_loop={event_loop}", "--set", "store.commit_log_segment_bytes=1048576")
    try:
        assert asyncio.run(_send_and_pull(address)) == b"through the cli"
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=15)
        assert proc.returncode == 0, log
        assert "stopped" in log
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    assert not (store / "abort").exists(), "a graceful stop removes the crash marker"


def test_port_in_use_is_one_line_and_exit_code_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "broker", "--set", "metrics_port=0", "--set", "grpc_port=0",
                                 "--listen-port",
                                 str(port), "--store-dir", str(tmp_path / "s")],
                                cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert (f"rocketq: cannot listen on 127.0.0.1:{port}: address already in use "
            "(another broker running? pick another --listen-port)") in result.stderr
