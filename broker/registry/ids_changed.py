"""NOTIFY_CONSUMER_IDS_CHANGED: tell every member of a group that its membership changed."""

from __future__ import annotations

import logging

from protocol.channel import Channel
from protocol.codes import RequestCode
from protocol.command import request
from protocol.errors import MQError
from protocol.headers import NotifyConsumerIdsChangedRequestHeader

log = logging.getLogger(__name__)


def notify_consumer_ids_changed(group: str, channels: list[Channel]) -> None:
    """One-way NOTIFY_CONSUMER_IDS_CHANGED {consumer_group} to each channel (RocketMQ
    `Broker2Client.notifyConsumerIdsChanged`); a closed channel is skipped."""
    for channel in channels:
        if channel.closed:
            continue
        try:
            channel.invoke_oneway(request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                          NotifyConsumerIdsChangedRequestHeader(consumer_group=group)))
        except MQError as exc:
            log.info("could not notify %s of group %s change: %s", channel, group, exc)
