"""Admin commands pointed at a real name server with two real brokers registered to it: each covers
every broker of the cluster (reads, and `dlq resend`)."""

from __future__ import annotations

from pathlib import Path

from client.api import ClientAPI
from protocol.headers import CreateSubscriptionGroupRequestHeader
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.admin.test_dlq import GROUP as DLQ_GROUP
from tests.admin.test_dlq import copies, dead_letters
from tests.helpers import pull_header, send
from tests.namesrv.test_namesrv import cluster, wait_route

GROUP = "billing"


async def test_topic_list_status_broker_status_and_progress_cover_every_broker(tmp_path: Path,
                                                                              client_api: ClientAPI) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, brokers):
        a, b = brokers
        for broker in brokers:
            await client_api.create_topic(broker.address, "orders", queue_nums=2)
        await client_api.create_topic(a.address, "only-a", queue_nums=1)
        await wait_route(client_api, ns.address, "orders", ["broker-a", "broker-b"])
        await wait_route(client_api, ns.address, "only-a", ["broker-a"])
        for _ in range(3):
            await send(client_api, a.address, "orders", b"a", queue_id=1)
        for _ in range(5):
            await send(client_api, b.address, "orders", b"b", queue_id=0)
        await client_api.update_consumer_offset(a.address, GROUP, "orders", 1, 1)    # lag 2 on broker-a
        await client_api.update_consumer_offset(b.address, GROUP, "orders", 0, 4)    # lag 1 on broker-b
        ep = ("--endpoints", ns.address)

        topics = await rocketq_json("admin", "topic", "list", *ep)
        assert {(t["topic"], t["broker_name"]) for t in topics if t["topic"] in ("orders", "only-a")} == {
            ("orders", "broker-a"), ("orders", "broker-b"), ("only-a", "broker-a")}
        listed = await rocketq("admin", "topicList", *ep)
        assert listed.exit_code == 0, listed.output
        assert "broker-b" in listed.output and "only-a" in listed.output

        status = await rocketq_json("admin", "topic", "status", "-t", "orders", *ep)
        assert sorted((q["broker_name"], q["queue_id"], q["max_offset"]) for q in status["offset_table"]) == [
            ("broker-a", 0, 0), ("broker-a", 1, 3), ("broker-b", 0, 5), ("broker-b", 1, 0)]
        status_table = await rocketq("admin", "topic", "status", "-t", "orders", *ep)
        assert status_table.exit_code == 0 and "topic orders: 8 messages" in status_table.output

        infos = await rocketq_json("admin", "broker", "status", *ep)
        assert [(i["broker_name"], i["address"]) for i in infos] == [(a.config.broker_name, a.address),
                                                                     (b.config.broker_name, b.address)]
        blocks = await rocketq("admin", "brokerStatus", *ep)
        assert blocks.exit_code == 0 and blocks.output.count("held pulls") == 2, blocks.output

        progress = await rocketq_json("admin", "consumer", "progress", "-g", GROUP, *ep)
        lags = {(q["broker_name"], q["queue_id"]): q["lag"] for q in progress["queues"]}
        assert lags == {("broker-a", 0): 0, ("broker-a", 1): 2, ("broker-b", 0): 1, ("broker-b", 1): 0}
        assert progress["total_lag"] == 3
        table = await rocketq("admin", "consumerProgress", "-g", GROUP, *ep)
        assert table.exit_code == 0 and "total lag 3" in table.output
        assert "broker-a" in table.output and "broker-b" in table.output


async def test_group_list_and_dlq_list_cover_every_broker(tmp_path: Path, client_api: ClientAPI) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, brokers):
        a, b = brokers
        for broker, group in ((a, "only-on-a"), (b, GROUP)):
            await client_api.create_subscription_group(broker.address,
                                                       CreateSubscriptionGroupRequestHeader(group_name=group))
        await client_api.create_topic(b.address, "orders", queue_nums=1)       # a dead letter on broker-b
        await send(client_api, b.address, "orders", b"dead", properties={"KEYS": "poison"})
        pulled = await client_api.pull_message(b.address, pull_header(topic="orders", max_msg_nums=1), 3_000)
        await client_api.consumer_send_msg_back(b.address, pulled.messages[0], GROUP, -1, 16)
        await wait_route(client_api, ns.address, f"%DLQ%{GROUP}", ["broker-b"])
        ep = ("--endpoints", ns.address)

        groups = {(g["group_name"], g["broker_name"]) for g in await rocketq_json("admin", "group", "list", *ep)}
        assert {("only-on-a", "broker-a"), (GROUP, "broker-b")} <= groups
        assert (GROUP, "broker-a") not in groups
        table = await rocketq("admin", "groupList", *ep)
        assert table.exit_code == 0 and "on 2 brokers" in table.output, table.output

        letters = await rocketq_json("admin", "dlq", "list", "-g", GROUP, *ep)
        assert [(row["broker"], row["keys"]) for row in letters] == [("broker-b", "poison")]
        none = await rocketq("admin", "dlq", "list", "-g", "nobody", *ep)
        assert none.exit_code == 0 and "no dead letters for group 'nobody'" in none.output, none.output


async def test_dlq_resend_through_the_name_server_covers_every_broker(tmp_path: Path, client_api: ClientAPI) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, brokers):
        a, b = brokers
        on_a, on_b = await dead_letters(client_api, a, 2), await dead_letters(client_api, b, 1)
        await wait_route(client_api, ns.address, f"%DLQ%{DLQ_GROUP}", ["broker-a", "broker-b"])
        ep = ("--endpoints", ns.address)

        resent = await rocketq_json("admin", "dlq", "resend", "-g", DLQ_GROUP, "--all", *ep)
        assert sorted((row["broker"], row["dlq_msg_id"]) for row in resent) == sorted(
            [("broker-a", m.msg_id) for m in on_a] + [("broker-b", m.msg_id) for m in on_b])
        assert all(row["queue_id"] != "" for row in resent), resent
        assert sorted(m.properties["DLQ_RESENT_FROM"] for m in await copies(client_api, a)) == sorted(
            m.msg_id for m in on_a)                 # each copy sent by the broker that held the dead letter
        assert [m.properties["DLQ_RESENT_FROM"] for m in await copies(client_api, b)] == [on_b[0].msg_id]

        again = await rocketq("admin", "dlq", "resend", "-g", DLQ_GROUP, "--all", *ep)   # the marks moved
        assert again.exit_code == 0 and "nothing to resend" in again.output, again.output
        twice = await rocketq("admin", "dlq", "resend", "-g", DLQ_GROUP, "--msg-id", on_b[0].msg_id, *ep)
        assert twice.exit_code == 1 and "was already resent" in twice.stderr, twice.output
        forced = await rocketq_json("admin", "dlq", "resend", "-g", DLQ_GROUP, "--msg-id", on_b[0].msg_id,
                                    "--force", *ep)
        assert [(row["broker"], row["dlq_msg_id"]) for row in forced] == [("broker-b", on_b[0].msg_id)]
        assert len(await copies(client_api, b)) == 2
        unknown = await rocketq("admin", "dlq", "resend", "-g", DLQ_GROUP, "--msg-id", "F" * 32, *ep)
        assert unknown.exit_code == 1 and "no message" in unknown.stderr, unknown.output
        nobody = await rocketq("admin", "dlq", "resend", "-g", "nobody", "--all", *ep)
        assert nobody.exit_code == 0 and "nothing to resend" in nobody.output, nobody.output
