"""Delay-level math (RocketMQ `ScheduleMessageService.parseDelayLevel` / `computeDeliverTimestamp`).

Pure: no clock reads. Level N (1-based) is the N-th entry of `store.message_delay_level`."""

from __future__ import annotations

import re

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_ENTRY = re.compile(r"^(\d+)(ms|s|m|h|d)$")
UNKNOWN_LEVEL_DELAY_MS = 1_000    # RocketMQ: an unknown level is delivered storeTimestamp + 1000


class DelayLevelError(ValueError):
    """`store.message_delay_level` does not parse; the message names the bad entry."""


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """`"1s 5s 10s 30s 1m ... 2h"` -> `(1000, 5000, 10000, 30000, 60000, ..., 7200000)` (ms).

    Entries are separated by whitespace; each is a non-negative integer and a unit: `ms`, `s`, `m`,
    `h` or `d` (RocketMQ knows s, m, h, d; `ms` is ours, for tests and sub-second levels). Raises
    `DelayLevelError` for an empty list or a bad entry. Level N is the tuple's index N - 1."""
    levels: list[int] = []
    for entry in text.split():
        match = _ENTRY.fullmatch(entry.strip().lower())
        if match is None:
            raise DelayLevelError(f"message_delay_level entry {entry!r} must be a number with a unit "
                                  f"(ms, s, m, h or d), e.g. '1s 5s 10s 30s 1m'")
        levels.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    if not levels:
        raise DelayLevelError("message_delay_level must list at least one delay, e.g. '1s 5s 10s'")
    return tuple(levels)


def clamp_level(level: int, levels: tuple[int, ...]) -> int:
    """A requested level clamped to 1..max (RocketMQ clamps a level above the max to the max; a
    level <= 0 means "no delay" and is returned as 0)."""
    if level <= 0:
        return 0
    return min(level, len(levels))


def delay_ms_of(level: int, levels: tuple[int, ...]) -> int:
    """The delay of `level` in ms; `UNKNOWN_LEVEL_DELAY_MS` outside 1..len(levels)."""
    if 1 <= level <= len(levels):
        return levels[level - 1]
    return UNKNOWN_LEVEL_DELAY_MS


def deliver_at_ms(stored_at_ms: int, level: int, levels: tuple[int, ...]) -> int:
    """When a message stored at `stored_at_ms` (epoch ms) with delay `level` is due (epoch ms).
    The schedule topic's consume queue stores this in place of the tags code."""
    return stored_at_ms + delay_ms_of(level, levels)


def queue_id_of(level: int) -> int:
    """`SCHEDULE_TOPIC_XXXX` queue id of a level (level - 1)."""
    return level - 1


def level_of(queue_id: int) -> int:
    """Delay level of a `SCHEDULE_TOPIC_XXXX` queue id (queue_id + 1)."""
    return queue_id + 1


def countdown_ms(deliver_at: int, now_ms: int, level: int, levels: tuple[int, ...]) -> int:
    """Milliseconds until `deliver_at` (<= 0: due now). RocketMQ's clamp: a delivery time more than
    one level-delay in the future (the clock went back) is treated as due now."""
    if deliver_at > now_ms + delay_ms_of(level, levels):
        return 0
    return deliver_at - now_ms
