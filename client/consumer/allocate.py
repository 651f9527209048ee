"""Queue allocation strategies: which of a topic's queues one consumer of a group takes in a rebalance.

RocketMQ's `client/.../consumer/rebalance/*` (4.9.8), REFERENCE.md §13. Every consumer of a group runs
the same strategy over the same inputs and takes its own share, so a strategy must be a pure function
of its arguments. The rebalance sorts `mq_all` (topic, broker name, queue id) and `cid_all` (string
order) before calling; strategies take both in the order given and never re-sort, so clients of other
implementations agree on an assignment.

Pure code: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from protocol.model import MessageQueue

__all__ = [
    "AllocateMachineRoomNearby",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueByConfig",
    "AllocateMessageQueueByMachineRoom",
    "AllocateMessageQueueConsistentHash",
    "AllocateMessageQueueStrategy",
    "strategy_by_name",
]

T = TypeVar("T")


class AllocateMessageQueueStrategy(Protocol):
    """RocketMQ's `AllocateMessageQueueStrategy`: `name` is the strategy's RocketMQ name ("AVG", ...)."""

    @property
    def name(self) -> str: ...

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        """The queues of `mq_all` that `current_cid` takes, in `mq_all` order."""
        ...


def _check(current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]) -> bool:
    """`AbstractAllocateMessageQueueStrategy.check`: raises `ValueError` on an empty `current_cid`,
    `mq_all` or `cid_all`; False (allocate nothing) when `current_cid` is not in `cid_all`."""
    if not current_cid:
        raise ValueError("current_cid is empty")
    if not mq_all:
        raise ValueError("mq_all is empty")
    if not cid_all:
        raise ValueError("cid_all is empty")
    return current_cid in cid_all


class AllocateMessageQueueAveragely:
    """"AVG": each consumer takes a contiguous block; the first `n % c` consumers take one extra.
    10 queues over 4 cids gives blocks of 3, 3, 2, 2; with n <= c the first n cids take one queue each
    and the rest none. Raises `ValueError` on empty inputs; [] when `current_cid` is not in `cid_all`.
    Same arithmetic as RocketMQ's `AllocateMessageQueueAveragely`."""

    name = "AVG"

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        if not _check(current_cid, mq_all, cid_all):
            return []
        n, c = len(mq_all), len(cid_all)
        index = cid_all.index(current_cid)
        mod = n % c
        if n <= c:
            size = 1
        elif mod > 0 and index < mod:
            size = n // c + 1
        else:
            size = n // c
        start = index * size if mod > 0 and index < mod else index * size + mod
        count = min(size, n - start)
        return [mq_all[(start + k) % n] for k in range(count)]


class AllocateMessageQueueAveragelyByCircle:
    """"AVG_BY_CIRCLE": consumer i takes the queues j with j % c == i (round robin); 10 queues over
    4 cids gives {0,4,8}, {1,5,9}, {2,6}, {3,7}. Errors as AVG. RocketMQ's
    `AllocateMessageQueueAveragelyByCircle`."""

    name = "AVG_BY_CIRCLE"

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        if not _check(current_cid, mq_all, cid_all):
            return []
        index = cid_all.index(current_cid)
        return list(mq_all[index::len(cid_all)])


def md5_hash(key: str) -> int:
    """RocketMQ's `MD5HashFunction`: the first 4 bytes of MD5(UTF-8 `key`) as a big-endian unsigned
    32-bit integer."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


class AllocateMessageQueueConsistentHash:
    """"CONSISTENT_HASH": a hash ring of `virtual_node_count` virtual nodes per cid, keyed
    `cid + "-" + k`, hashed by `md5_hash`; a colliding hash keeps the later node (insertion order is
    `cid_all` order, then k). Each queue is hashed by `str(mq)` (`MessageQueue [topic=..., ...]`) and
    goes to the first node with hash >= its hash, wrapping to the smallest. Result in `mq_all` order.

    As RocketMQ's `ConsistentHashRouter`, a cid listed twice adds virtual nodes numbered on from the
    ones it already has on the ring. `virtual_node_count` < 1 raises `ValueError` (RocketMQ accepts 0,
    which routes no queue to anyone). Other errors as AVG."""

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_count: int = 10) -> None:
        if virtual_node_count < 1:
            raise ValueError(f"virtual_node_count must be >= 1, got {virtual_node_count}")
        self.virtual_node_count = virtual_node_count

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        if not _check(current_cid, mq_all, cid_all):
            return []
        ring: dict[int, str] = {}
        for cid in cid_all:
            existing = sum(1 for owner in ring.values() if owner == cid)
            for k in range(existing, existing + self.virtual_node_count):
                ring[md5_hash(f"{cid}-{k}")] = cid
        hashes = sorted(ring)
        result = []
        for mq in mq_all:
            i = bisect_left(hashes, md5_hash(str(mq)))
            if ring[hashes[i if i < len(hashes) else 0]] == current_cid:
                result.append(mq)
        return result


class AllocateMessageQueueByConfig:
    """"CONFIG": every consumer takes the configured `message_queues`, whatever the inputs; no check,
    raises nothing. RocketMQ's `AllocateMessageQueueByConfig`."""

    name = "CONFIG"

    def __init__(self, message_queues: Sequence[MessageQueue]) -> None:
        self.message_queues: tuple[MessageQueue, ...] = tuple(message_queues)

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        return list(self.message_queues)


def _java_split(text: str, sep: str) -> list[str]:
    """Java's `String.split(sep)` for a literal separator: trailing empty parts are dropped
    ("a@b@" gives 2 parts, "@" gives 0)."""
    parts = text.split(sep)
    if len(parts) > 1:
        while parts and not parts[-1]:
            parts.pop()
    return parts


class AllocateMessageQueueByMachineRoom:
    """"MACHINE_ROOM": only queues whose broker name is "<room>@<name>" (Java `split("@")` giving exactly
    2 parts) with <room> in `consumer_idcs` are shared out, as pre (in `mq_all` order). With
    mod = len(pre) // c and rem = len(pre) % c, consumer i takes pre[i*mod : i*mod+mod] and, if
    rem > i, also pre[i + mod*c]: 5 room queues over 2 cids gives {0,1,4}, {2,3}. Errors as AVG.
    RocketMQ's `AllocateMessageQueueByMachineRoom`."""

    name = "MACHINE_ROOM"

    def __init__(self, consumer_idcs: Sequence[str] | set[str] | frozenset[str]) -> None:
        self.consumer_idcs: frozenset[str] = frozenset(consumer_idcs)

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        if not _check(current_cid, mq_all, cid_all):
            return []
        index, c = cid_all.index(current_cid), len(cid_all)
        pre = []
        for mq in mq_all:
            parts = _java_split(mq.broker_name, "@")
            if len(parts) == 2 and parts[0] in self.consumer_idcs:
                pre.append(mq)
        mod, rem = divmod(len(pre), c)
        result = pre[index * mod:index * mod + mod]
        if rem > index:
            result.append(pre[index + mod * c])
        return result


class AllocateMachineRoomNearby:
    """"MACHINE_ROOM_NEARBY-<inner name>": prefer queues in the consumer's own machine room.

    Queues are grouped by `broker_room_of(mq)` and cids by `consumer_room_of(cid)` (keeping the given
    orders); a None or empty room raises `ValueError`. The result is `strategy` on the queues of the
    current cid's room with that room's cids, then, for each room (in sorted order) that has queues
    but no consumer, `strategy` on that room's queues with all of `cid_all`; concatenated. Common check
    as AVG first. RocketMQ's `AllocateMachineRoomNearby`."""

    def __init__(self, strategy: AllocateMessageQueueStrategy,
                 broker_room_of: Callable[[MessageQueue], str | None],
                 consumer_room_of: Callable[[str], str | None]) -> None:
        self.strategy = strategy
        self.broker_room_of = broker_room_of
        self.consumer_room_of = consumer_room_of

    @property
    def name(self) -> str:
        return "MACHINE_ROOM_NEARBY-" + self.strategy.name

    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        if not _check(current_cid, mq_all, cid_all):
            return []
        mqs_by_room = _by_room(mq_all, self.broker_room_of, "mq")
        cids_by_room = _by_room(cid_all, self.consumer_room_of, "consumer id")

        result: list[MessageQueue] = []
        current_room = self.consumer_room_of(current_cid)
        if not current_room:
            raise ValueError(f"machine room is empty for consumer id {current_cid}")
        own_mqs = mqs_by_room.pop(current_room, None)
        if own_mqs:
            result.extend(self.strategy.allocate(consumer_group, current_cid, own_mqs,
                                                 cids_by_room[current_room]))
        for room in sorted(mqs_by_room):
            if room not in cids_by_room:
                result.extend(self.strategy.allocate(consumer_group, current_cid, mqs_by_room[room],
                                                     cid_all))
        return result


def _by_room(items: Sequence[T], room_of: Callable[[T], str | None], what: str) -> dict[str, list[T]]:
    """`items` grouped by `room_of(item)`, each group in the given order; `ValueError` for an item
    whose room is None or empty."""
    by_room: dict[str, list[T]] = {}
    for item in items:
        room = room_of(item)
        if not room:
            raise ValueError(f"machine room is empty for {what} {item}")
        by_room.setdefault(room, []).append(item)
    return by_room


def strategy_by_name(name: str, **kwargs: Any) -> AllocateMessageQueueStrategy:
    """A strategy from its RocketMQ name ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "CONFIG",
    "MACHINE_ROOM"), built with `kwargs` (e.g. `virtual_node_count`, `message_queues`,
    `consumer_idcs`). Raises `ValueError` for another name ("MACHINE_ROOM_NEARBY-*" needs resolvers:
    build `AllocateMachineRoomNearby` directly) and `TypeError` for wrong kwargs."""
    match name:
        case "AVG":
            return AllocateMessageQueueAveragely(**kwargs)
        case "AVG_BY_CIRCLE":
            return AllocateMessageQueueAveragelyByCircle(**kwargs)
        case "CONSISTENT_HASH":
            return AllocateMessageQueueConsistentHash(**kwargs)
        case "CONFIG":
            return AllocateMessageQueueByConfig(**kwargs)
        case "MACHINE_ROOM":
            return AllocateMessageQueueByMachineRoom(**kwargs)
    raise ValueError(f"unknown allocate strategy {name!r}")
