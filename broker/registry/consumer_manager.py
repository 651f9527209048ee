"""The consumer registry kept by HEART_BEAT (RocketMQ `ConsumerManager`/`ConsumerGroupInfo`, §7).

One `ConsumerGroupInfo` per group: its channels (with client id and last heartbeat) and one
group-wide topic → subscription map. A change of members or subscriptions calls
`on_ids_changed(group)`, which announces it to the members with NOTIFY_CONSUMER_IDS_CHANGED
(coalesced per group: `ids_changed.IdsChangedNotifier`). A heartbeat is O(1) in the group's size;
past `max_consumers_per_group` members a new one is refused (`ConsumerGroupFull`, see `limits`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.registry.limits import ConsumerGroupFull
from protocol.channel import Channel
from protocol.model import ConsumeFromWhere, ConsumeType, MessageModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    """A registered subscription; `code_set` holds the tags codes of `tags_set` (empty: all)."""

    topic: str
    sub_string: str
    expression_type: str
    tags_set: frozenset[str]
    code_set: frozenset[int]
    sub_version: int


@dataclass(slots=True)
class ClientChannelInfo:
    channel: Channel
    client_id: str
    last_update_ms: int


@dataclass(slots=True)
class ConsumerGroupInfo:
    group_name: str
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    channels: dict[Channel, ClientChannelInfo] = field(default_factory=dict)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return [info.client_id for info in self.channels.values()]

    def update_channel(self, info: ClientChannelInfo) -> bool:
        """Record a heartbeat; True when the channel is new to the group."""
        old = self.channels.get(info.channel)
        if old is None:
            self.channels[info.channel] = info
            return True
        old.last_update_ms = info.last_update_ms
        if old.client_id != info.client_id:
            log.warning("group %s: channel %s changed client id %s → %s", self.group_name,
                        info.channel, old.client_id, info.client_id)
            old.client_id = info.client_id
        return False

    def update_subscriptions(self, subscriptions: Sequence[Subscription]) -> bool:
        """RocketMQ's `updateSubscription`: a new topic is added (changed); a known topic is
        replaced only by a greater `sub_version` (not counted as a change); topics missing from
        the heartbeat are removed (changed)."""
        changed = False
        for sub in subscriptions:
            old = self.subscriptions.get(sub.topic)
            if old is None:
                self.subscriptions[sub.topic] = sub
                changed = True
            elif sub.sub_version > old.sub_version:
                self.subscriptions[sub.topic] = sub
        topics = {s.topic for s in subscriptions}
        for topic in [t for t in self.subscriptions if t not in topics]:
            del self.subscriptions[topic]
            changed = True
        return changed


IdsChanged = Callable[[str], None]     # (group): its members or subscriptions changed


class ConsumerManager:
    def __init__(self, on_ids_changed: IdsChanged, *, max_consumers_per_group: int = 0) -> None:
        self._groups: dict[str, ConsumerGroupInfo] = {}
        self._on_ids_changed = on_ids_changed
        self._max_consumers_per_group = max_consumers_per_group      # 0: no bound

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self._groups.get(group)

    def channels_of(self, group: str) -> list[Channel]:
        """The members' channels of `group` now ([] when it has none)."""
        group_info = self._groups.get(group)
        return list(group_info.channels) if group_info is not None else []

    def require_room(self, group: str, channel: Channel) -> None:
        """Raise `ConsumerGroupFull` when `channel` is not a member of `group` and the group has
        `max_consumers_per_group` members already."""
        group_info = self._groups.get(group)
        limit = self._max_consumers_per_group
        if group_info is not None and 0 < limit <= len(group_info.channels) and channel not in group_info.channels:
            raise ConsumerGroupFull(group, len(group_info.channels), limit)

    def groups(self) -> list[ConsumerGroupInfo]:
        return list(self._groups.values())

    def register_consumer(self, group: str, info: ClientChannelInfo, consume_type: ConsumeType,
                          message_model: MessageModel, consume_from_where: ConsumeFromWhere,
                          subscriptions: Sequence[Subscription], *, notify: bool) -> bool:
        """Apply one heartbeat's consumer data; True when members or subscriptions changed (then
        the members are notified when `notify`). Raises `ConsumerGroupFull` (changing nothing)
        for a new member of a full group."""
        self.require_room(group, info.channel)
        group_info = self._groups.get(group)
        if group_info is None:
            group_info = ConsumerGroupInfo(group, consume_type, message_model, consume_from_where)
            self._groups[group] = group_info
        group_info.consume_type = consume_type
        group_info.message_model = message_model
        group_info.consume_from_where = consume_from_where
        new_channel = group_info.update_channel(info)
        changed_subs = group_info.update_subscriptions(subscriptions)
        if new_channel:
            log.info("group %s: consumer %s joined from %s", group, info.client_id, info.channel.remote_address)
        if (new_channel or changed_subs) and notify:
            self._on_ids_changed(group)
        return new_channel or changed_subs

    def unregister_consumer(self, group: str, channel: Channel, *, notify: bool) -> None:
        group_info = self._groups.get(group)
        if group_info is None:
            return
        info = group_info.channels.pop(channel, None)
        if info is None:
            return
        log.info("group %s: consumer %s left", group, info.client_id)
        if not group_info.channels:
            del self._groups[group]
        elif notify:
            self._on_ids_changed(group)

    def notify_topic_created(self, topic: str, notify: Callable[[str], bool]) -> list[str]:
        """A topic was created: announce NOTIFY_CONSUMER_IDS_CHANGED to the members of each group
        that subscribes to it and for which `notify(group)` (coalesced as any change), so they
        rebalance now and find its route instead of at their next periodic rebalance (20 s).
        Returns those groups. RocketMQ 4.9 has no such notice: its consumers wait for the next
        route poll (30 s)."""
        groups = [g for g in self._groups.values() if topic in g.subscriptions and g.channels and notify(g.group_name)]
        for group in groups:
            log.info("topic %s created: telling the %d consumer(s) of group %s to rebalance", topic,
                     len(group.channels), group.group_name)
            self._on_ids_changed(group.group_name)
        return [g.group_name for g in groups]

    def remove_channel(self, channel: Channel, notify: Callable[[str], bool]) -> list[str]:
        """Drop a closed or expired channel from every group; groups left with members are
        notified when `notify(group)`. Returns the groups it was in."""
        left = [g.group_name for g in self._groups.values() if channel in g.channels]
        for group in left:
            self.unregister_consumer(group, channel, notify=notify(group))
        return left

    def expired_channels(self, now_ms: int, timeout_ms: int) -> list[Channel]:
        """Channels whose last heartbeat is older than `timeout_ms`."""
        return [info.channel for g in self._groups.values() for info in g.channels.values()
                if now_ms - info.last_update_ms > timeout_ms]
