"""The controller over TCP: BROKER_HEARTBEAT elects the first master, a silent master is replaced by
a live in-sync replica at epoch + 1, CONTROLLER_ALTER_SYNC_STATE_SET is fenced by the epoch, a
follower redirects to the leader (3 controllers), and hostile requests are answered, not fatal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from broker.broker import Broker
from chaos.ha_cluster import free_port_pair
from conf.auth import AuthConfig
from conf.controller import ControllerConfig
from controller.server import Controller
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.remoting_client import RemotingClient
from protocol.signing import Credentials
from tests.conftest import broker_config


async def call(client: RemotingClient, address: str, code: int, fields: dict[str, Any]) -> RemotingCommand:
    return await client.invoke(address, request(code, fields), 3_000)


def beat(broker_id: int, offset: int = 0, *, master: bool = False, name: str = "a") -> dict[str, Any]:
    return {"broker_name": name, "broker_id": broker_id, "broker_addr": f"127.0.0.1:{1000 + broker_id}",
            "ha_addr": f"127.0.0.1:{2000 + broker_id}", "max_offset": offset, "prefers_master": master}


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_election_failover_and_fencing() -> None:
    config = ControllerConfig(listen_port=0, broker_lease_ms=600, scan_interval_ms=50)
    async with Controller(config) as controller:
        await until(lambda: controller.is_leader)
        client = RemotingClient()
        try:
            address = controller.address
            slave_first = await call(client, address, RequestCode.BROKER_HEARTBEAT, beat(1))
            assert slave_first.code == ResponseCode.SUCCESS and slave_first.fields["master_id"] == -1
            first = await call(client, address, RequestCode.BROKER_HEARTBEAT, beat(0, master=True))
            assert first.fields["master_id"] == 0 and first.fields["epoch"] == 1
            assert first.fields["master_ha_addr"] == "127.0.0.1:2000"
            grown = await call(client, address, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                               {"broker_name": "a", "master_id": 0, "epoch": 1, "sync_state_set": [0, 1]})
            assert grown.fields["sync_state_set"] == [0, 1]
            # the master stops reporting; the slave goes on: elected at epoch 2
            deadline = asyncio.get_running_loop().time() + 5
            while True:
                answer = await call(client, address, RequestCode.BROKER_HEARTBEAT, beat(1, 500))
                if answer.fields["master_id"] == 1:
                    break
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            assert answer.fields["epoch"] == 2 and answer.fields["sync_state_set"] == [1]
            # the old master comes back: it learns it is deposed; its in-sync report is fenced
            back = await call(client, address, RequestCode.BROKER_HEARTBEAT, beat(0, 900, master=True))
            assert back.fields["master_id"] == 1 and back.fields["epoch"] == 2
            fenced = await call(client, address, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                                {"broker_name": "a", "master_id": 0, "epoch": 1, "sync_state_set": [0]})
            assert fenced.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
            info = await call(client, address, RequestCode.CONTROLLER_GET_REPLICA_INFO, {})
            sets = msgpack.unpackb(info.body_bytes())["sets"]
            assert [s["master_id"] for s in sets] == [1]
        finally:
            await client.close()


@pytest.mark.parametrize("fields", [
    {}, {"broker_name": 5, "broker_id": 0, "broker_addr": "x", "max_offset": 0},
    {"broker_name": "a", "broker_id": -1, "broker_addr": "x", "max_offset": 0},
    {"broker_name": "a" * 10_000, "broker_id": 0, "broker_addr": "x", "max_offset": 0},
    {"broker_name": "a", "broker_id": 0, "broker_addr": "x", "max_offset": (1 << 64) - 1},
])
async def test_hostile_requests_are_refused(fields: dict[str, Any]) -> None:
    async with Controller(ControllerConfig(listen_port=0)) as controller:
        await until(lambda: controller.is_leader)
        client = RemotingClient()
        try:
            for code in (RequestCode.BROKER_HEARTBEAT, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, 12345):
                answer = await call(client, controller.address, code, fields)
                assert answer.code != ResponseCode.SUCCESS
            ok = await call(client, controller.address, RequestCode.BROKER_HEARTBEAT, beat(0, master=True))
            assert ok.code == ResponseCode.SUCCESS
        finally:
            await client.close()


def free_ports(count: int) -> list[int]:
    """Ports p with p + 1 (Raft) free too, below the kernel's ephemeral range (`free_port_pair`)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port_pair()
        if port not in ports and port + 1 not in ports and port - 1 not in ports:
            ports.append(port)
    return ports


async def test_three_controllers_redirect_to_the_leader() -> None:
    ports = free_ports(3)
    peers = ",".join(f"c{i}=127.0.0.1:{port}" for i, port in enumerate(ports))
    controllers = [Controller(ControllerConfig(listen_port=port, peers=peers)) for port in ports]
    for controller in controllers:
        await controller.start()
    client = RemotingClient()
    try:
        await until(lambda: sum(c.is_leader for c in controllers) == 1 and all(c.leader_address() for c in controllers))
        leader = next(c for c in controllers if c.is_leader)
        follower = next(c for c in controllers if not c.is_leader)
        redirected = await call(client, follower.address, RequestCode.BROKER_HEARTBEAT, beat(0, master=True))
        assert redirected.code == ResponseCode.CONTROLLER_NOT_LEADER
        assert redirected.fields["leader_addr"] == leader.address
        answer = await call(client, leader.address, RequestCode.BROKER_HEARTBEAT, beat(0, master=True))
        assert answer.fields["master_id"] == 0
        await until(lambda: follower.raft is not None and follower.raft.get("a") is not None
                    and follower.raft.get("a").master_id == 0)    # type: ignore[union-attr]
        # the leader stops: another takes over and still knows the master
        await leader.stop()
        rest = [c for c in controllers if c is not leader]
        await until(lambda: any(c.is_leader for c in rest), 15)
        new_leader = next(c for c in rest if c.is_leader)
        again = await call(client, new_leader.address, RequestCode.BROKER_HEARTBEAT, beat(0, master=True))
        assert again.fields["master_id"] == 0 and again.fields["epoch"] == 1
    finally:
        await client.close()
        for controller in controllers:
            await controller.stop()


async def test_with_authentication_only_signed_reports_count(tmp_path: Path) -> None:
    """Auth on: an unsigned or wrongly signed heartbeat is NO_PERMISSION; a broker signing with
    its `auth.inner_credentials` (a user of the controller) is elected master over TCP."""
    auth = AuthConfig(authentication_enabled=True, init_user="inner:s3cret")
    config = ControllerConfig(listen_port=0, config_dir=str(tmp_path / "controller"), auth=auth)
    async with Controller(config) as controller:
        await until(lambda: controller.is_leader)
        anonymous, forger = RemotingClient(), RemotingClient(credentials=Credentials("inner", "wrong"))
        try:
            for client in (anonymous, forger):
                refused = await call(client, controller.address, RequestCode.BROKER_HEARTBEAT, beat(0, master=True))
                assert refused.code == ResponseCode.NO_PERMISSION
        finally:
            await anonymous.close()
            await forger.close()
        broker_config_ = broker_config(tmp_path / "a0", controller_addr=controller.address,
                                       controller_heartbeat_interval_ms=50, broker_role="SYNC_MASTER",
                                       auth=AuthConfig(inner_credentials="inner:s3cret"))
        async with Broker(broker_config_) as broker:
            agent = broker.controller_agent
            assert agent is not None
            await until(lambda: agent.master_id == 0)
            await until(lambda: broker.replication is not None and broker.replication.is_master)
            assert broker.replication is not None and broker.replication.epochs is not None
            assert broker.replication.epochs.entries == [(1, 0)]


# pysyncobj 0.3 leaves its journal's meta file open once read (its leak, not ours)
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_restarted_controller_remembers_epochs_with_a_data_dir(tmp_path: Path) -> None:
    config = ControllerConfig(listen_port=0, data_dir=str(tmp_path / "raft"), config_dir=str(tmp_path / "cfg"))
    client = RemotingClient()
    try:
        async with Controller(config) as controller:
            await until(lambda: controller.is_leader)
            first = await call(client, controller.address, RequestCode.BROKER_HEARTBEAT, beat(0, master=True))
            assert first.fields["epoch"] == 1
        async with Controller(config) as controller:
            await until(lambda: controller.is_leader)
            info = await call(client, controller.address, RequestCode.CONTROLLER_GET_REPLICA_INFO, {})
            sets = msgpack.unpackb(info.body_bytes())["sets"]
            assert [(s["master_id"], s["epoch"]) for s in sets] == [(0, 1)]
    finally:
        await client.close()
