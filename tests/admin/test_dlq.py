"""`rocketq admin dlq list|resend` against a real broker: messages reach `%DLQ%<group>` through
CONSUMER_SEND_MSG_BACK, as a consumer's would."""

from __future__ import annotations

from broker.broker import Broker
from client.api import ClientAPI
from protocol.errors import TopicNotExist
from protocol.message import MessageExt
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.helpers import pull_header, send

GROUP = "mend"


async def dead_letters(api: ClientAPI, broker: Broker, count: int, *, uniq_keys: bool = True) -> list[MessageExt]:
    """`count` messages of topic "orders" queue 0 sent back with max reconsume times 0: each lands
    in %DLQ%mend at once; returns them as pulled from the DLQ. Without `uniq_keys` they have
    none (as a producer that sets none sends them)."""
    start = await api.get_max_offset(broker.address, "orders", 0) if await topic_exists(api, broker) else 0
    dlq_start = await api.get_max_offset(broker.address, f"%DLQ%{GROUP}", 0) if start else 0
    for i in range(start, start + count):
        await send(api, broker.address, "orders", f"order {i} with a body long enough to be cut".encode(),
                   properties={"KEYS": f"o-{i}"} | ({"UNIQ_KEY": f"{i:032X}"} if uniq_keys else {}))
    pulled = await api.pull_message(broker.address, pull_header(topic="orders", queue_offset=start,
                                                                max_msg_nums=count), 3_000)
    for message in pulled.messages:
        await api.consumer_send_msg_back(broker.address, message, GROUP, 0, 0)
    dlq = await api.pull_message(broker.address, pull_header(topic=f"%DLQ%{GROUP}", group="reader",
                                                             queue_offset=dlq_start, max_msg_nums=count), 3_000)
    assert len(dlq.messages) == count
    return dlq.messages


async def topic_exists(api: ClientAPI, broker: Broker) -> bool:
    try:
        await api.get_route_info(broker.address, "orders")
    except TopicNotExist:
        return False
    return True


async def copies(api: ClientAPI, broker: Broker) -> list[MessageExt]:
    """The messages of topic "orders" that carry DLQ_RESENT_FROM (the resent copies), by queue."""
    found = []
    for queue_id in range(4):
        pulled = await api.pull_message(broker.address, pull_header(topic="orders", group="reader",
                                                                    queue_id=queue_id), 3_000)
        found += [m for m in pulled.messages if "DLQ_RESENT_FROM" in m.properties]
    return found


async def test_dlq_list_printed_to_a_non_terminal_keeps_every_id_whole(broker: Broker,
                                                                       client_api: ClientAPI) -> None:
    dead = await dead_letters(client_api, broker, 3)
    listed = await rocketq("admin", "dlq", "list", "-g", GROUP, "-n", broker.address)
    assert listed.exit_code == 0, listed.output
    for message in dead:
        assert message.msg_id in listed.output and message.properties["ORIGIN_MESSAGE_ID"] in listed.output


async def test_dlq_list_says_why_each_message_is_there(broker: Broker, client_api: ClientAPI) -> None:
    await dead_letters(client_api, broker, 1)
    await send(client_api, broker.address, "orders", b"poison")
    poison = (await client_api.pull_message(broker.address, pull_header(topic="orders", queue_offset=1), 3_000))
    await client_api.consumer_send_msg_back(broker.address, poison.messages[0], GROUP, -1, 16)
    await send(client_api, broker.address, f"%DLQ%{GROUP}", b"older", properties={"RETRY_TOPIC": "orders"})
    rows = await rocketq_json("admin", "dlq", "list", "-g", GROUP, "-n", broker.address)
    assert [row["why"] for row in rows] == ["failed 1 time (max reconsume times 0)",
                                            "the consumer sent it to the DLQ (delay level -1)",
                                            "reconsume times 0 (no DLQ_REASON)"]
    table = await rocketq("admin", "dlq", "list", "-g", GROUP, "-n", broker.address)
    assert table.exit_code == 0 and "why" in table.output and "failed 1 time (max reconsume times 0)" in table.output


async def test_resending_a_message_twice_is_refused_unless_forced(broker: Broker, client_api: ClientAPI) -> None:
    ep = ("-g", GROUP, "-n", broker.address)
    first, second = await dead_letters(client_api, broker, 2)
    (bare,) = await dead_letters(client_api, broker, 1, uniq_keys=False)
    for message in (first, bare):
        resent = await rocketq_json("admin", "dlq", "resend", "--msg-id", message.msg_id, *ep)
        assert [row["dlq_msg_id"] for row in resent] == [message.msg_id] and resent[0]["queue_id"] != ""
        again = await rocketq("admin", "dlq", "resend", "--msg-id", message.msg_id, *ep)
        assert again.exit_code == 1 and again.stdout == "", again.output
        assert len(again.stderr.splitlines()) == 1 and "already resent" in again.stderr and "--force" in again.stderr
        assert resent[0]["new_msg_id"] in again.stderr, "names the earlier copy"
    made = await copies(client_api, broker)
    assert [m.properties["DLQ_RESENT_FROM"] for m in made] == [first.msg_id, bare.msg_id]
    assert all("DLQ_REASON" not in m.properties and m.reconsume_times == 0 for m in made)
    listed = await rocketq_json("admin", "dlq", "list", *ep)
    assert [(row["msg_id"], row["resent"]) for row in listed] == [
        (first.msg_id, True), (second.msg_id, False), (bare.msg_id, True)], "resent by id, the mark unmoved"

    forced = await rocketq_json("admin", "dlq", "resend", "--msg-id", first.msg_id, "--force", *ep)
    assert [row["dlq_msg_id"] for row in forced] == [first.msg_id] and forced[0]["queue_id"] != ""
    assert len(await copies(client_api, broker)) == 3

    everything = await rocketq_json("admin", "dlq", "resend", "--all", *ep)
    assert [(row["dlq_msg_id"], row["queue_id"] != "") for row in everything] == [
        (first.msg_id, False), (second.msg_id, True), (bare.msg_id, False)], "--all skips what was resent"
    assert all("already resent" in row["new_msg_id"] for row in everything if row["queue_id"] == "")
    assert len(await copies(client_api, broker)) == 4
