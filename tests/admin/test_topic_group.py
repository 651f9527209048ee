"""`rocketq admin topic ...` and `group ...` against a real broker, plus the unreachable-broker rule."""

from __future__ import annotations

from broker.broker import Broker
from client.api import ClientAPI
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.helpers import free_port, send


async def test_topic_create_update_list_status_route_delete(broker: Broker, client_api: ClientAPI) -> None:
    ep = ("--endpoints", broker.address)
    created = await rocketq("admin", "topic", "create", "--topic", "orders", "--queues", "2", *ep)
    assert created.exit_code == 0 and "created topic orders: 2 read / 2 write queues" in created.output
    again = await rocketq("admin", "topic", "create", "--topic", "orders", *ep)
    assert again.exit_code == 1 and "already exists" in again.output
    updated = await rocketq_json("admin", "updateTopic", "-t", "orders", "--write-queues", "3", *ep)
    assert updated == {"topic": "orders", "read_queue_nums": 2, "write_queue_nums": 3, "perm": 6}
    await send(client_api, broker.address, "orders", b"a", queue_id=1)
    await send(client_api, broker.address, "orders", b"b", queue_id=1)
    listed = await rocketq_json("admin", "topic", "list", *ep)
    assert {"topic": "orders", "read_queue_nums": 2, "write_queue_nums": 3, "perm": 6} in listed
    table = await rocketq("admin", "topicList", *ep)
    assert table.exit_code == 0 and "orders" in table.output and "RW (6)" in table.output
    status = await rocketq_json("admin", "topic", "status", "-t", "orders", *ep)
    queue_1 = next(q for q in status["offset_table"] if q["queue_id"] == 1)
    assert (queue_1["min_offset"], queue_1["max_offset"]) == (0, 2) and queue_1["last_update_timestamp"] > 0
    assert "2 messages" in (await rocketq("admin", "topic", "status", "-t", "orders", *ep)).output
    route = await rocketq_json("admin", "topic", "route", "-t", "orders", *ep)
    assert route["broker_datas"][0]["broker_addrs"] == {"0": broker.address}
    assert (await rocketq("admin", "topic", "delete", "-t", "orders", *ep)).exit_code == 0
    assert "orders" not in [t["topic"] for t in await rocketq_json("admin", "topic", "list", *ep)]
    missing = await rocketq("admin", "topic", "delete", "-t", "orders", *ep)
    assert missing.exit_code == 1 and "TOPIC_NOT_EXIST" in missing.output


async def test_group_create_update_list_delete(broker: Broker, client_api: ClientAPI) -> None:
    ep = ("--endpoints", broker.address)
    created = await rocketq("admin", "group", "create", "-g", "billing", "--retry-max-times", "3", *ep)
    assert created.exit_code == 0 and "created group billing" in created.output and "retry max 3" in created.output
    updated = await rocketq_json("admin", "updateSubGroup", "-g", "billing", "--consume-disable", *ep)
    assert updated["consume_enable"] is False and updated["retry_max_times"] == 3
    listed = {g["group_name"]: g for g in await rocketq_json("admin", "group", "list", *ep)}
    assert listed["billing"]["consume_enable"] is False
    await send(client_api, broker.address, "t", b"x")
    await client_api.update_consumer_offset(broker.address, "billing", "t", 0, 1)
    assert (await rocketq("admin", "group", "delete", "-g", "billing", *ep)).exit_code == 0
    assert "billing" not in {g["group_name"] for g in await rocketq_json("admin", "group", "list", *ep)}
    assert broker.offsets.query("billing", "t", 0) is None, "delete cleans the group's offsets"


def _closed_port() -> int:
    return free_port()      # below the ephemeral range: no outgoing connection takes it meanwhile


async def test_an_unreachable_broker_is_one_line_and_exit_code_2() -> None:
    for args in (["admin", "topic", "list"], ["admin", "consumer", "progress", "-g", "g"],
                 ["admin", "broker", "status"], ["admin", "offset", "reset", "-g", "g", "-t", "t", "--to-latest"]):
        result = await rocketq(*args, "--endpoints", f"127.0.0.1:{_closed_port()}")
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rocketq admin: cannot reach the broker at 127.0.0.1:"), lines
        assert "Traceback" not in result.output


async def test_group_fifo_flag_is_created_kept_and_cleared(broker: Broker) -> None:
    ep = ("--endpoints", broker.address)
    created = await rocketq("admin", "group", "create", "-g", "order-flow", "--fifo", *ep)
    assert created.exit_code == 0 and ", fifo" in created.output
    config = broker.groups.get("order-flow")
    assert config is not None and config.consume_message_orderly
    kept = await rocketq_json("admin", "group", "update", "-g", "order-flow", "--retry-max-times", "2", *ep)
    assert kept["consume_message_orderly"] is True and kept["retry_max_times"] == 2
    cleared = await rocketq_json("admin", "group", "update", "-g", "order-flow", "--no-fifo", *ep)
    assert cleared["consume_message_orderly"] is False
    listed = {g["group_name"]: g for g in await rocketq_json("admin", "group", "list", *ep)}
    assert listed["order-flow"]["consume_message_orderly"] is False


async def test_group_broker_ids_for_slave_reads_are_set_kept_and_listed(broker: Broker) -> None:
    """`--broker-id` / `--which-broker-when-consume-slowly` (mqadmin updateSubGroup -i / -w) reach
    the broker's group config; an update of another field keeps them (it used to reset both to the
    defaults: GET_ALL_SUBSCRIPTIONGROUP_CONFIG did not carry them); out of range is refused."""
    ep = ("--endpoints", broker.address)
    created = await rocketq("admin", "group", "create", "-g", "reads", "-i", "2", "-w", "3", *ep)
    assert created.exit_code == 0 and "pulls to broker 2 (slowly: 3)" in created.output, created.output
    config = broker.groups.get("reads")
    assert config is not None and (config.broker_id, config.which_broker_when_consume_slowly) == (2, 3)
    kept = await rocketq_json("admin", "updateSubGroup", "-g", "reads", "--retry-max-times", "4", *ep)
    assert (kept["broker_id"], kept["which_broker_when_consume_slowly"], kept["retry_max_times"]) == (2, 3, 4)
    config = broker.groups.get("reads")
    assert config is not None and (config.broker_id, config.which_broker_when_consume_slowly) == (2, 3)
    changed = await rocketq_json("admin", "group", "update", "-g", "reads", "--which-broker-when-consume-slowly",
                                 "1", *ep)
    assert (changed["broker_id"], changed["which_broker_when_consume_slowly"]) == (2, 1)
    listed = {g["group_name"]: g for g in await rocketq_json("admin", "group", "list", *ep)}
    assert (listed["reads"]["broker_id"], listed["reads"]["which_broker_when_consume_slowly"]) == (2, 1)
    refused = await rocketq("admin", "group", "update", "-g", "reads", "--broker-id", "1000001", *ep)
    assert refused.exit_code == 2 and "1000001" in refused.output
