"""`rocketq admin message query|print` (mqadmin `queryMsgById`, `queryMsgByUniqueKey`, `queryMsgByKey`,
`printMsg`).

`query --id ID` looks the message up by its offset message id (VIEW_MESSAGE_BY_ID); an id that is
not one is looked up as a UNIQ_KEY in the key index under `--topic` (queryMsgByUniqueKey).
`query --key K --topic T` uses the broker's key index (QUERY_MESSAGE). `print --topic T --queue Q
--offset N` reads from a queue like a consumer (group `TOOLS_CONSUMER`, nothing committed)."""

from __future__ import annotations

import click

from admin.base import admin_group, example_epilog
from admin.common import CommandError, command_options, format_time_ms, run_admin, show, table
from client.admin_api import AdminAPI
from protocol.codes import PullSysFlag
from protocol.errors import QueryNotFound, SystemError_
from protocol.headers import PullMessageRequestHeader
from protocol.message import MessageExt

TOOLS_CONSUMER = "TOOLS_CONSUMER"
MAX_UNIQ_KEY_MATCHES = 64           # the broker's most per QUERY_MESSAGE


@admin_group.group("message")
def message_group() -> None:
    """Find and print stored messages."""


def _as_dict(msg: MessageExt) -> dict[str, object]:
    try:
        body: object = msg.body.decode()
    except UnicodeDecodeError:
        body = msg.body.hex()
    return {"msg_id": msg.msg_id, "topic": msg.topic, "queue_id": msg.queue_id, "queue_offset": msg.queue_offset,
            "commit_log_offset": msg.commit_log_offset, "born_timestamp": msg.born_timestamp,
            "born_host": msg.born_host, "store_timestamp": msg.store_timestamp, "reconsume_times": msg.reconsume_times,
            "properties": dict(msg.properties), "body": body}


def _show(messages: list[MessageExt], as_json: bool, title: str) -> None:
    rows = []
    for msg in messages:
        item = _as_dict(msg)
        body = str(item["body"])
        rows.append([msg.msg_id, msg.topic, msg.queue_id, msg.queue_offset, msg.properties.get("TAGS", ""),
                     msg.properties.get("KEYS", ""), format_time_ms(msg.store_timestamp),
                     body if len(body) <= 60 else body[:57] + "..."])
    show(as_json, [_as_dict(m) for m in messages],
         table(title, ["msg id", "topic", "queue", "offset", "tags", "keys", "stored", "body"], rows))


async def find_by_id(api: AdminAPI, address: str, msg_id: str, topic: str | None) -> list[MessageExt]:
    """RocketMQ's queryMsgById then queryMsgByUniqueKey: `msg_id` as an offset message id
    (VIEW_MESSAGE_BY_ID), kept only when the message found has that id, since a UNIQ_KEY is 32 hex
    digits too and decodes to some offset; else, with `topic`, as a UNIQ_KEY in the broker's key
    index under the topic (QUERY_MESSAGE, then only messages whose UNIQ_KEY is `msg_id`: a KEYS
    word may equal it), newest first. Raises `CommandError` when neither finds it."""
    try:
        message = await api.view_message(address, msg_id)
        if message.msg_id == msg_id:
            return [message]
    except (SystemError_, QueryNotFound):
        pass
    if topic is None:
        raise CommandError(f"no message has the offset message id {msg_id!r}; give --topic to look it up "
                           "as a UNIQ_KEY (the id a producer's SendResult gives)")
    try:
        found = await api.query_message(address, topic, msg_id, MAX_UNIQ_KEY_MATCHES)
    except QueryNotFound:
        found = []
    found = [m for m in found if m.uniq_key == msg_id]
    if not found:
        raise CommandError(f"no message of topic {topic!r} has the message id or UNIQ_KEY {msg_id!r}")
    return found


@message_group.command("query", epilog=example_epilog(
    "rocketq admin message query --key cust-7 --topic orders --max 2"))
@click.option("--id", "-i", "msg_id", default=None,
              help="Message id: the offset msg id, or with --topic the UNIQ_KEY a producer's SendResult gives "
                   "(e.g. --id 7F0000010B2C1507C950176F58D50000 --topic orders).")
@click.option("--key", "-k", default=None, help="A key the message was sent with (with --topic).")
@click.option("--topic", "-t", default=None, help="Topic (needed with --key, and to find a UNIQ_KEY with --id).")
@click.option("--max", "max_num", type=click.IntRange(1, 64), default=32, show_default=True,
              help="Most messages to show for --key.")
@command_options
def query(msg_id: str | None, key: str | None, topic: str | None, max_num: int, endpoints: str,
          as_json: bool) -> None:
    """Find messages by id, or by key within a topic (newest first)."""
    if (msg_id is None) == (key is None):
        raise click.UsageError("give exactly one of --id or --key")
    if key is not None and topic is None:
        raise click.UsageError("--key needs --topic")
    if msg_id is not None:
        found = run_admin(endpoints, lambda api, address: find_by_id(api, address, msg_id, topic))
        _show(found, as_json, f"message {msg_id}")
        return
    assert key is not None and topic is not None
    found = run_admin(endpoints, lambda api, address: api.query_message(address, topic, key, max_num))
    _show(found, as_json, f"{len(found)} message(s) of {topic} with key {key}")


async def _read(api: AdminAPI, address: str, topic: str, queue_id: int, queue_offset: int,
                count: int) -> list[MessageExt]:
    header = PullMessageRequestHeader(consumer_group=TOOLS_CONSUMER, topic=topic, queue_id=queue_id,
                                      queue_offset=queue_offset, max_msg_nums=count, sys_flag=PullSysFlag.SUBSCRIPTION,
                                      commit_offset=0, suspend_timeout_ms=0, sub_version=0, subscription="*",
                                      expression_type="TAG")
    result = await api.pull_message(address, header, 5_000)
    if not result.messages:
        raise QueryNotFound(f"no message at {topic}:{queue_id} offset {queue_offset} "
                            f"(the queue holds [{result.min_offset}, {result.max_offset}))")
    return result.messages[:count]


@message_group.command("print", epilog=example_epilog(
    "rocketq admin message print --topic orders --queue 0 --offset 0 --count 10"))
@click.option("--topic", "-t", required=True, help="Topic.")
@click.option("--queue", "-q", "queue_id", type=click.IntRange(0), required=True, help="Queue id.")
@click.option("--offset", "-o", "queue_offset", type=click.IntRange(0), required=True, help="Queue offset.")
@click.option("--count", "-c", type=click.IntRange(1, 32), default=1, show_default=True, help="Messages to print.")
@command_options
def print_messages(topic: str, queue_id: int, queue_offset: int, count: int, endpoints: str, as_json: bool) -> None:
    """Print the message(s) at a queue offset (nothing is committed)."""
    found = run_admin(endpoints, lambda api, address: _read(api, address, topic, queue_id, queue_offset, count))
    _show(found, as_json, f"{topic}:{queue_id} from offset {queue_offset}")


admin_group.aliases.update({"queryMsgById": ["message", "query"], "queryMsgByKey": ["message", "query"],
                            "queryMsgByUniqueKey": ["message", "query"], "printMsg": ["message", "print"]})
