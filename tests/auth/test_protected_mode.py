"""Protected mode on a broker and a name server listening on every address with authentication
off: loopback clients are served, a client from another address (this machine's own non-loopback
address, so its connection does not come from loopback) gets one NO_PERMISSION frame saying what
to do and is closed; `protected_mode = false` / `--insecure`, or authentication on, serve it."""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from auth.protected import is_loopback
from broker.address import advertised_host
from broker.broker import Broker
from broker.process import BrokerSubprocess, cli_command
from client.api import ClientAPI
from conf.auth import AuthConfig
from conf.namesrv import NamesrvConfig
from namesrv.namesrv import NameServer
from protocol.errors import ConnectionClosed
from tests.auth.servers import ROOT, SECURED, admin_as
from tests.conftest import broker_config


def _local_address() -> str | None:
    """A non-loopback IPv4 address of this machine that a socket can bind, or None."""
    host = advertised_host("0.0.0.0")
    if is_loopback(host):
        return None
    try:
        with socket.socket() as probe:
            probe.bind((host, 0))
    except OSError:
        return None
    return host


LOCAL = _local_address()
needs_address = pytest.mark.skipif(LOCAL is None, reason="this machine has no non-loopback IPv4 address")


@asynccontextmanager
async def server(kind: str, tmp_path: Path, *, protected_mode: bool = True,
                 auth: AuthConfig | None = None) -> AsyncIterator[int]:
    """A broker or name server on 0.0.0.0:0; its port."""
    auth = auth or AuthConfig()
    if kind == "broker":
        async with Broker(broker_config(tmp_path, listen_host="0.0.0.0", protected_mode=protected_mode,
                                        auth=auth)) as broker:
            yield broker.port
    else:
        async with NameServer(NamesrvConfig(listen_host="0.0.0.0", listen_port=0, protected_mode=protected_mode,
                                            config_dir=str(tmp_path), auth=auth)) as namesrv:
            yield namesrv.port


async def _cluster_info(address: str, api: ClientAPI | None = None) -> None:
    if api is not None:
        await api.get_broker_cluster_info(address)
        return
    async with admin_as(None) as anonymous:
        await anonymous.get_broker_cluster_info(address)


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "localhost", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "", "::", "10.0.0.1", "192.0.2.2", "example.com"]))


@needs_address
@pytest.mark.parametrize("kind", ["broker", "name server"])
async def test_a_protected_server_serves_loopback_and_refuses_other_addresses_with_a_remark(
        kind: str, tmp_path: Path) -> None:
    async with server(kind, tmp_path) as port:
        await _cluster_info(f"127.0.0.1:{port}")
        with pytest.raises(ConnectionClosed) as refused:
            await _cluster_info(f"{LOCAL}:{port}")
    remark = str(refused.value)
    assert f"this {kind} is in protected mode" in remark
    for advice in ("auth.authentication_enabled = true", "127.0.0.1", "--insecure", "protected_mode = false"):
        assert advice in remark


@needs_address
@pytest.mark.parametrize("kind", ["broker", "name server"])
async def test_without_protected_mode_or_with_authentication_other_addresses_are_served(
        kind: str, tmp_path: Path) -> None:
    async with server(kind, tmp_path / "open", protected_mode=False) as port:
        await _cluster_info(f"{LOCAL}:{port}")
    async with server(kind, tmp_path / "secured", auth=SECURED) as port, admin_as(ROOT) as root:
        await _cluster_info(f"{LOCAL}:{port}", root)


@needs_address
@pytest.mark.parametrize("kind", ["broker", "namesrv"])
async def test_the_start_commands_insecure_flag_turns_protected_mode_off(kind: str, tmp_path: Path) -> None:
    command = cli_command()
    if kind == "namesrv":
        command = [command[0], "namesrv", "start"] if command[1:] == ["broker", "start"] else [sys.executable, "-m",
                                                                                                 "namesrv"]
    for flags, served in (([], False), (["--insecure"], True)):
        process = BrokerSubprocess(tmp_path / "store" if kind == "broker" else None,
                                   command=[*command, "--listen-host", "0.0.0.0", *flags])
        async with process:
            port = process.address.rpartition(":")[2]
            await _cluster_info(f"127.0.0.1:{port}")
            if served:
                await _cluster_info(f"{LOCAL}:{port}")
            else:
                with pytest.raises(ConnectionClosed, match="protected mode"):
                    await _cluster_info(f"{LOCAL}:{port}")
