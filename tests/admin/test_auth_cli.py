"""`rocketq admin user ...` and `acl ...` end to end against real brokers and a real name server with
authentication and authorization on, and the connection options (`--access-key`, `--secret-key`,
their environment variables) of every admin command and of `rocketq top`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.broker import Broker
from broker.cli import resolve_config
from client import Credentials, Message, NoPermission, Producer
from conf.namesrv import NamesrvConfig
from namesrv.namesrv import NameServer
from rocketq.cli import main
from tests.admin.cli_runner import rocketq
from tests.helpers import pull_header, send
from tests.namesrv.test_namesrv import wait_route
from tests.security_helpers import ADMIN, SECURED, admin_api, secured_config

AS_ADMIN = {"ROCKETQ_ACCESS_KEY": ADMIN.access_key, "ROCKETQ_SECRET_KEY": ADMIN.secret_key}
NO_CREDENTIALS: dict[str, str | None] = {"ROCKETQ_ACCESS_KEY": None, "ROCKETQ_SECRET_KEY": None}


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(secured_config(tmp_path, lenient=True)) as running:
        async with admin_api() as api:
            await api.create_topic(running.address, "orders", queue_nums=2)
        yield running


async def admin(*args: str) -> tuple[int, str, str]:
    """`rocketq admin ARGS` as the Super user (from the environment): (exit code, stdout, stderr)."""
    result = await rocketq("admin", *args, env=AS_ADMIN)
    return result.exit_code, result.stdout, result.stderr


async def sends(address: str, credentials: Credentials, topic: str = "orders") -> bool:
    """Whether `credentials` may send to `topic` (False on NoPermission)."""
    async with Producer("cli-pg", address, credentials=credentials) as producer:
        try:
            await producer.send(Message(topic, b"x"))
        except NoPermission:
            return False
    return True


async def test_user_and_acl_commands_end_to_end(broker: Broker) -> None:
    ep = ("-n", broker.address)
    billing = Credentials("billing", "s3cret")
    code, out, err = await admin("user", "create", "--username", "billing", "--password", "s3cret",
                                 "--user-type", "Normal", *ep)
    assert code == 0, err
    assert out == f"created Normal user billing on endpoint {broker.address}\n" and "s3cret" not in out + err
    code, out, _ = await admin("user", "create", "-u", "billing", "-p", "again", *ep)
    assert code == 1 and "exists" in (await rocketq("admin", "createUser", "-u", "billing", "-p", "x", *ep,
                                                    env=AS_ADMIN)).stderr
    code, out, _ = await admin("user", "list", "--json", *ep)
    assert code == 0 and json.loads(out) == [
        {"username": "admin", "user_type": "Super", "user_status": "enable"},
        {"username": "billing", "user_type": "Normal", "user_status": "enable"}]
    code, out, _ = await admin("getUser", "-u", "billing", *ep)
    assert code == 0 and "billing" in out and "Normal" in out and "s3cret" not in out

    assert not await sends(broker.address, billing), "no ACL yet"
    code, out, err = await admin("acl", "create", "--subject", "User:billing", "--resources",
                                 "Topic:orders,Group:billing", "--actions", "Pub,Sub", "--decision", "Allow",
                                 "--source-ips", "127.0.0.0/8", *ep)
    assert code == 0, err
    assert "created ACL of User:billing: Allow Pub,Sub on Topic:orders,Group:billing" in out
    assert await sends(broker.address, billing)
    code, out, _ = await admin("acl", "get", "-s", "User:billing", "--json", *ep)
    assert code == 0
    assert {(e["resource"], e["actions"], e["decision"], e["source_ips"]) for e in json.loads(out)} == {
        ("Topic:orders", "Pub,Sub", "Allow", "127.0.0.0/8"), ("Group:billing", "Pub,Sub", "Allow", "127.0.0.0/8")}
    code, out, _ = await admin("listAcl", "--resource-filter", "orders", *ep)
    assert code == 0 and "Topic:orders" in out and "Group:billing" not in out

    code, _, err = await admin("updateAcl", "-s", "User:billing", "-r", "Topic:orders", "-a", "Pub", "-d", "Deny", *ep)
    assert code == 0, err
    assert not await sends(broker.address, billing), "Deny beats Allow"
    code, _, err = await admin("acl", "delete", "-s", "User:billing", "-r", "Topic:orders", *ep)
    assert code == 0, err
    code, out, _ = await admin("acl", "get", "-s", "User:billing", "--json", *ep)
    assert [e["resource"] for e in json.loads(out)] == ["Group:billing"]

    code, _, err = await admin("user", "update", "-u", "billing", "--user-status", "disable", *ep)
    assert code == 0, err
    code, _, err = await admin("acl", "update", "-s", "User:billing", "-r", "Topic:orders", "-a", "Pub", *ep)
    assert code == 0, err
    assert not await sends(broker.address, billing), "a disabled user is refused"
    code, _, err = await admin("user", "update", "-u", "billing", "-s", "enable", "-p", "n3w", *ep)
    assert code == 0, err
    assert not await sends(broker.address, billing), "the old password no longer signs"
    assert await sends(broker.address, Credentials("billing", "n3w"))

    code, _, err = await admin("deleteUser", "-u", "billing", *ep)
    assert code == 0, err
    code, out, err = await admin("user", "get", "-u", "billing", *ep)
    assert code == 1 and f"endpoint {broker.address}: refused: SYSTEM_ERROR" in err
    code, _, _ = await admin("acl", "delete", "-s", "User:billing", *ep)
    assert code == 1, "the user's ACL went with it"


async def test_the_password_is_asked_for_hidden_when_not_given(broker: Broker) -> None:
    runner = CliRunner()
    result = await asyncio.to_thread(runner.invoke, main, ["admin", "user", "create", "-u", "asked", "-n",
                                                           broker.address], input="pw\npw\n", env=AS_ADMIN)
    assert result.exit_code == 0, result.output
    assert "pw" not in result.output.replace("password", "")
    assert await sends(broker.address, Credentials("asked", "pw")) is False     # a user without an ACL ...
    async with admin_api() as api:
        assert (await api.get_user(broker.address, "asked")).user_type == "Normal"


async def test_connection_options_before_or_after_the_subcommand_and_from_the_environment(broker: Broker) -> None:
    ep = ("-n", broker.address)
    key, secret = ("--access-key", ADMIN.access_key), ("--secret-key", ADMIN.secret_key)
    for args, env in ((["admin", "user", "list", *ep], AS_ADMIN),
                      (["admin", *key, *secret, "user", "list", *ep], NO_CREDENTIALS),
                      (["admin", "user", "list", *ep, *key, *secret], NO_CREDENTIALS),
                      (["admin", *key, "topic", "list", *ep, *secret], NO_CREDENTIALS),
                      (["admin", "--access-key", "nobody", "topic", "list", *ep, *key], {
                          "ROCKETQ_SECRET_KEY": ADMIN.secret_key})):
        result = await rocketq(*args, env=env)
        assert result.exit_code == 0, (args, result.output)
    unsigned = await rocketq("admin", "topic", "list", *ep, env=NO_CREDENTIALS)
    assert unsigned.exit_code == 1 and unsigned.stdout == ""
    assert unsigned.stderr.strip() == (f"rocketq admin: the broker at {broker.address} refused: NO_PERMISSION: "
                                       "authentication failed for an unsigned request")
    wrong = await rocketq("admin", "topic", "list", *ep, *key, "--secret-key", "wrong", env=NO_CREDENTIALS)
    assert wrong.exit_code == 1 and "authentication failed for admin" in wrong.stderr
    half = await rocketq("admin", "topic", "list", *ep, *key, env=NO_CREDENTIALS)
    assert half.exit_code == 2 and "--access-key and --secret-key together" in half.stderr
    bad = await rocketq("admin", "acl", "create", "-s", "User:x", "-r", "Bogus:x", "-a", "Pub", *ep, env=AS_ADMIN)
    assert bad.exit_code == 2 and "Bogus:x" in bad.stderr, "checked before anything is sent"
    filtered = await rocketq("admin", "filter", "test", "-t", "orders", "-e", "a > 1", *ep, env=AS_ADMIN)
    assert filtered.exit_code == 0, filtered.output


async def test_a_normal_user_may_not_manage_users(broker: Broker) -> None:
    await admin("user", "create", "-u", "billing", "-p", "s3cret", "-n", broker.address)
    result = await rocketq("admin", "user", "create", "-u", "mallory", "-p", "x", "-n", broker.address,
                           env={"ROCKETQ_ACCESS_KEY": "billing", "ROCKETQ_SECRET_KEY": "s3cret"})
    assert result.exit_code == 1
    assert "User:billing has no permission to Update on Cluster" in result.stderr


@asynccontextmanager
async def secured_cluster(tmp_path: Path) -> AsyncIterator[tuple[NameServer, list[Broker]]]:
    """A name server and brokers broker-a, broker-b, all with authentication and authorization on
    and the same Super user; the brokers register with it as that user."""
    inner = replace(SECURED, inner_credentials=f"{ADMIN.access_key}:{ADMIN.secret_key}",
                    max_failures_per_address=1_000_000)
    async with AsyncExitStack() as stack:
        ns = await stack.enter_async_context(NameServer(NamesrvConfig(listen_port=0, config_dir=str(tmp_path / "ns"),
                                                                      auth=inner)))
        brokers = [await stack.enter_async_context(Broker(secured_config(
            tmp_path / name, broker_name=name, namesrv_addr=ns.address, register_name_server_period_ms=500,
            auth=inner))) for name in ("broker-a", "broker-b")]
        yield ns, brokers


async def test_cluster_and_namesrv_targets_change_every_broker_and_the_name_server(tmp_path: Path) -> None:
    async with secured_cluster(tmp_path) as (ns, brokers):
        async with admin_api() as api:
            for broker in brokers:
                await api.create_topic(broker.address, "orders", queue_nums=2)
            await wait_route(api, ns.address, "orders", ["broker-a", "broker-b"])
        targets = ("--cluster", "DefaultCluster", "--namesrv", "-n", ns.address)
        code, out, err = await admin("user", "create", "-u", "billing", "-p", "s3cret", *targets)
        assert code == 0, err
        assert out.splitlines() == [f"created Normal user billing on broker broker-a ({brokers[0].address})",
                                    f"created Normal user billing on broker broker-b ({brokers[1].address})",
                                    f"created Normal user billing on name server {ns.address}"]
        code, out, err = await admin("acl", "create", "-s", "User:billing", "-r", "Topic:orders", "-a", "Pub",
                                     *targets, "--json")
        assert code == 0, err
        assert [(o["address"], o["ok"]) for o in json.loads(out)] == [
            (brokers[0].address, True), (brokers[1].address, True), (ns.address, True)]
        billing = Credentials("billing", "s3cret")
        async with Producer("cli-pg", ns.address, credentials=billing) as producer:
            stored_on = {(await producer.send(Message("orders", b"x"))).broker_name
                         for _ in range(8)}
        assert stored_on == {"broker-a", "broker-b"}, "both brokers know billing and its ACL"

        code, out, _ = await admin("user", "list", *targets, "--json")
        assert code == 0
        assert sorted(row["at"] for row in json.loads(out) if row["username"] == "billing") == sorted([
            f"broker broker-a ({brokers[0].address})", f"broker broker-b ({brokers[1].address})",
            f"name server {ns.address}"])
        code, out, _ = await admin("user", "list", "-b", brokers[1].address, "--json")
        assert code == 0 and {row["username"] for row in json.loads(out)} == {"admin", "billing"}

        code, out, err = await admin("user", "create", "-u", "billing", "-p", "x", *targets)
        assert code == 1 and out == "" and err.count("already exists") == 3, err
        code, _, err = await admin("user", "delete", "-u", "billing", "-c", "DefaultCluster", "-n", ns.address)
        assert code == 0, err
        code, out, _ = await admin("user", "list", *targets, "--json")
        assert [row["at"] for row in json.loads(out) if row["username"] == "billing"] == [f"name server {ns.address}"]
        code, _, err = await admin("user", "list", "-c", "NoSuchCluster", "-n", ns.address)
        assert code == 1 and "no broker of cluster 'NoSuchCluster'" in err and "DefaultCluster" in err


async def test_top_with_credentials(broker: Broker) -> None:
    async with admin_api() as api:
        await send(api, broker.address, "orders", b"x")
        await api.pull_message(broker.address, pull_header(topic="orders", group="watchers"), 3_000)  # the group
        await api.update_consumer_offset(broker.address, "watchers", "orders", 0, 0)
    shown = await rocketq("top", "--iterations", "1", "-n", broker.address, env=AS_ADMIN)
    assert shown.exit_code == 0, shown.output
    assert "watchers" in shown.output
    flags = await rocketq("top", "-i", "1", "-n", broker.address, "--access-key", ADMIN.access_key, "--secret-key",
                          ADMIN.secret_key, env=NO_CREDENTIALS)
    assert flags.exit_code == 0 and "watchers" in flags.output, flags.output
    refused = await rocketq("top", "--iterations", "1", "-n", broker.address, env=NO_CREDENTIALS)
    assert refused.exit_code == 1 and "authentication failed for an unsigned request" in refused.stderr


def test_a_broker_started_with_the_admin_variables_set_ignores_them() -> None:
    """`ROCKETQ_ACCESS_KEY` and `ROCKETQ_SECRET_KEY` share the broker's ROCKETQ_ prefix: its config
    loading skips them (they are no config keys), as it does `ROCKETQ_ENDPOINTS`."""
    env = {**AS_ADMIN, "ROCKETQ_ENDPOINTS": "127.0.0.1:9876"}
    assert resolve_config(None, None, None, None, [], env) == resolve_config(None, None, None, None, [], {})
