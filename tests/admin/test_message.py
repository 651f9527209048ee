"""`rocketq admin message query|print` against a real broker, and the key index rebuilt on restart."""

from __future__ import annotations

from pathlib import Path

from broker.broker import Broker
from client import Message, Producer
from client.api import ClientAPI
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.conftest import broker_config
from tests.helpers import send


async def test_query_by_id_and_key_print_by_offset_and_index_survives_restart(tmp_path: Path,
                                                                              client_api: ClientAPI) -> None:
    config = broker_config(tmp_path)
    async with Broker(config) as broker:
        ep = ("--endpoints", broker.address)
        first = await send(client_api, broker.address, "orders", b"order 1", properties={"KEYS": "o-1 cust-7"})
        await send(client_api, broker.address, "orders", b"order 2", properties={"KEYS": "o-2 cust-7"})
        await send(client_api, broker.address, "other", b"not this one", properties={"KEYS": "cust-7"})

        by_id = await rocketq_json("admin", "message", "query", "--id", first.msg_id, *ep)
        assert [m["body"] for m in by_id] == ["order 1"] and by_id[0]["msg_id"] == first.msg_id
        by_key = await rocketq_json("admin", "queryMsgByKey", "--key", "cust-7", "--topic", "orders", *ep)
        assert [m["body"] for m in by_key] == ["order 2", "order 1"], "newest first, this topic only"
        table = await rocketq("admin", "message", "query", "--key", "o-2", "--topic", "orders", *ep)
        assert table.exit_code == 0 and "order 2" in table.output and "o-2 cust-7" in table.output
        missing = await rocketq("admin", "message", "query", "--key", "nope", "--topic", "orders", *ep)
        assert missing.exit_code == 1 and "QUERY_NOT_FOUND" in missing.output

        printed = await rocketq_json("admin", "message", "print", "-t", "orders", "-q", str(first.queue_id),
                                     "-o", str(first.queue_offset), "-c", "2", *ep)
        assert [m["queue_offset"] for m in printed] == [first.queue_offset, first.queue_offset + 1]
        assert "order 1" in (await rocketq("admin", "printMsg", "-t", "orders", "-q", str(first.queue_id), "-o",
                                           str(first.queue_offset), *ep)).output
    async with Broker(config) as restarted:
        again = await rocketq_json("admin", "message", "query", "--key", "cust-7", "--topic", "orders",
                                   "--endpoints", restarted.address)
        assert [m["body"] for m in again] == ["order 2", "order 1"], "the key index is rebuilt at start"


async def test_query_by_uniq_key_finds_the_message_under_its_topic(broker: Broker) -> None:
    ep = ("--endpoints", broker.address)
    async with Producer("pg", broker.address) as producer:
        wanted = await producer.send(Message("orders", b"by uniq key", keys=["o-9"]))
        await producer.send(Message("orders", b"another"))
    (uniq_key,) = wanted.uniq_keys
    found = await rocketq_json("admin", "message", "query", "--id", uniq_key, "--topic", "orders", *ep)
    assert [(m["body"], m["properties"]["UNIQ_KEY"], m["msg_id"]) for m in found] == \
        [("by uniq key", uniq_key, wanted.msg_id)]
    alias = await rocketq("admin", "queryMsgByUniqueKey", "-i", uniq_key, "-t", "orders", *ep)
    assert alias.exit_code == 0 and "by uniq key" in alias.output
    by_offset_id = await rocketq_json("admin", "message", "query", "--id", wanted.msg_id, "--topic", "orders", *ep)
    assert [m["body"] for m in by_offset_id] == ["by uniq key"], "the offset msg id still works with --topic"
    no_topic = await rocketq("admin", "message", "query", "--id", uniq_key, *ep)
    assert no_topic.exit_code == 1 and "--topic" in no_topic.output and "Traceback" not in no_topic.output
    elsewhere = await rocketq("admin", "message", "query", "--id", uniq_key, "--topic", "other", *ep)
    assert elsewhere.exit_code == 1 and uniq_key in elsewhere.output
