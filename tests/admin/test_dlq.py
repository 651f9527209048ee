"""`rocketq admin dlq list|resend` against a real broker: messages reach `%DLQ%<group>` through
CONSUMER_SEND_MSG_BACK, as a consumer's would."""

from __future__ import annotations

from broker.broker import Broker
from client.api import ClientAPI
from protocol.message import MessageExt
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.helpers import pull_header, send

GROUP = "mend"


async def dead_letters(api: ClientAPI, broker: Broker, count: int, max_reconsume_times: int = 0) -> list[MessageExt]:
    """`count` messages of topic "orders" sent back past `max_reconsume_times`: each lands in
    %DLQ%mend at once; returns them as pulled from the DLQ."""
    for i in range(count):
        await send(api, broker.address, "orders", f"order {i} with a body long enough to be cut".encode(),
                   properties={"KEYS": f"o-{i}", "UNIQ_KEY": f"{i:032X}"})
    pulled = await api.pull_message(broker.address, pull_header(topic="orders", max_msg_nums=count), 3_000)
    for message in pulled.messages:
        await api.consumer_send_msg_back(broker.address, message, GROUP, 0, max_reconsume_times)
    dlq = await api.pull_message(broker.address, pull_header(topic=f"%DLQ%{GROUP}", group="reader",
                                                             max_msg_nums=count), 3_000)
    assert len(dlq.messages) == count
    return dlq.messages


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
