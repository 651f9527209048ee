"""`SendBack`: hands a message the listener failed on back to the broker (RocketMQ
`DefaultMQPushConsumerImpl#sendMessageBack`, REFERENCE.md §9).

First CONSUMER_SEND_MSG_BACK to the broker the message came from; if that fails, a plain send of a
copy to `%RETRY%<group>` on the same broker (the broker moves it to `%DLQ%<group>` once
`reconsume_times` reaches the maximum). Only if both fail does the caller retry locally."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from client.api import ClientAPI
from protocol.errors import MQError
from protocol.headers import SendMessageRequestHeader
from protocol.message import (
    PROPERTY_CONSUME_START_TIME,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MIN_OFFSET,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    MessageExt,
)
from protocol.model import MessageQueue
from protocol.topics import retry_topic

log = logging.getLogger(__name__)

CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
RECONSUME_TIMES_MAX = 2**31 - 1            # the header's range (Java's int): the broker dead-letters at it
DEFAULT_MAX_RECONSUME_TIMES = 16          # max_reconsume_times = -1 means 16 for concurrent consumption
FIRST_RETRY_DELAY_LEVEL = 3
_CLIENT_SIDE_PROPERTIES = frozenset({PROPERTY_CONSUME_START_TIME, PROPERTY_MIN_OFFSET, PROPERTY_MAX_OFFSET})


def effective_max_reconsume_times(max_reconsume_times: int) -> int:
    """-1 (the option's default) -> 16, as RocketMQ's concurrent consumer."""
    return DEFAULT_MAX_RECONSUME_TIMES if max_reconsume_times == -1 else max_reconsume_times


def retry_copy_properties(message: MessageExt, max_reconsume_times: int) -> dict[str, str]:
    """Properties of the fallback copy sent to `%RETRY%<group>`: the message's own, plus
    RETRY_TOPIC (the original topic), ORIGIN_MESSAGE_ID (kept from the first attempt),
    MAX_RECONSUME_TIMES and DELAY = 3 + reconsume_times; without the properties the client itself
    added on delivery (CONSUME_START_TIME, MIN_OFFSET, MAX_OFFSET). Pure."""
    properties = {k: v for k, v in message.properties.items() if k not in _CLIENT_SIDE_PROPERTIES}
    properties.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
    if not properties.get(PROPERTY_ORIGIN_MESSAGE_ID):
        properties[PROPERTY_ORIGIN_MESSAGE_ID] = message.msg_id
    properties["MAX_RECONSUME_TIMES"] = str(max_reconsume_times)
    properties[PROPERTY_DELAY_TIME_LEVEL] = str(FIRST_RETRY_DELAY_LEVEL + message.reconsume_times)
    return properties


class SendBack:
    """`await send_back(message, mq, delay_level)` -> True when the broker took the message back
    (by send-back or by the fallback send), False when both failed (logged)."""

    def __init__(self, api: ClientAPI, address_of: Callable[[MessageQueue], str], consumer_group: str,
                 max_reconsume_times: int, timeout_ms: int) -> None:
        self._api, self._address_of, self._group = api, address_of, consumer_group
        self.max_reconsume_times = effective_max_reconsume_times(max_reconsume_times)
        self._timeout_ms = timeout_ms
        self.sent_back = 0
        self.fallback_sent = 0
        self.failed = 0

    async def __call__(self, message: MessageExt, mq: MessageQueue, delay_level: int) -> bool:
        address = self._address_of(mq)
        try:
            await self._api.consumer_send_msg_back(address, message, self._group, delay_level,
                                                   self.max_reconsume_times, self._timeout_ms)
            self.sent_back += 1
            return True
        except MQError as exc:
            log.warning("send-back of %s (group %s) to %s failed: %s; resending to the retry topic",
                        message.msg_id, self._group, address, exc)
        header = SendMessageRequestHeader(
            producer_group=CLIENT_INNER_PRODUCER_GROUP, topic=retry_topic(self._group), queue_id=0,
            flag=message.flag, born_timestamp=time.time_ns() // 1_000_000,
            properties=retry_copy_properties(message, self.max_reconsume_times),
            reconsume_times=min(message.reconsume_times + 1, RECONSUME_TIMES_MAX),
            max_reconsume_times=self.max_reconsume_times)
        try:
            await self._api.send_message(address, header, message.body, self._timeout_ms)
            self.fallback_sent += 1
            return True
        except MQError as exc:
            log.warning("resend of %s to %s failed too: %s; consuming it again locally",
                        message.msg_id, header.topic, exc)
            self.failed += 1
            return False
