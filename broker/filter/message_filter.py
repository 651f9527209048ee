"""Message filters the store and the hold service apply (RocketMQ `ExpressionMessageFilter`, §5, §6).

A filter answers on the consume-queue unit (`tags_code`) first; `match_by_commit_log` sees the
message properties and is only consulted when `needs_properties` is set (SQL92), so TAG filtering
never decodes a stored message and SQL92 filtering reads only the properties, never the body."""

from __future__ import annotations

from collections.abc import Callable

from broker.filter.sql92 import Expression
from broker.store.results import MessageFilter
from protocol.message import PROPERTY_RETRY_TOPIC

__all__ = ["MessageFilter", "RetryMessageFilter", "SqlMessageFilter", "TagMessageFilter"]


class TagMessageFilter:
    """Matches a consume-queue unit whose tags code is in `code_set` (hash only, as RocketMQ:
    collisions are removed by the client's re-check of the tag string). An untagged message
    (tags code 0) matches only if 0 is in the set, i.e. never for a real tag list."""

    __slots__ = ("code_set",)
    needs_properties = False

    def __init__(self, code_set: frozenset[int]) -> None:
        self.code_set = code_set

    def match_by_consume_queue(self, tags_code: int) -> bool:
        return tags_code in self.code_set

    def match_by_commit_log(self, properties: dict[str, str] | None) -> bool:
        return True


class SqlMessageFilter:
    """An SQL92 subscription: every consume-queue unit passes, then the message's properties must
    make `expression` True (None, unknown, does not match; neither do unreadable properties).
    `key` is the (group, topic, sub_version) it was compiled for."""

    __slots__ = ("_evaluate", "expression", "key")
    needs_properties = True

    def __init__(self, expression: Expression, key: tuple[str, str, int]) -> None:
        self.expression, self.key = expression, key
        self._evaluate = expression.evaluate

    def match_by_consume_queue(self, tags_code: int) -> bool:
        return True

    def match_by_commit_log(self, properties: dict[str, str] | None) -> bool:
        return properties is not None and self._evaluate(properties) is True


class RetryMessageFilter:
    """A pull of `%RETRY%<group>` when `filter_support_retry` is on (RocketMQ
    `ExpressionForRetryMessageFilter`): each retried message is judged by the group's SQL92
    filter for its original topic (its RETRY_TOPIC property); a message whose original topic has no
    SQL92 subscription in the group (a TAG one, or none) matches, as in RocketMQ."""

    __slots__ = ("_filter_for",)
    needs_properties = True

    def __init__(self, filter_for: Callable[[str], SqlMessageFilter | None]) -> None:
        self._filter_for = filter_for

    def match_by_consume_queue(self, tags_code: int) -> bool:
        return True

    def match_by_commit_log(self, properties: dict[str, str] | None) -> bool:
        if properties is None:
            return True
        original_topic = properties.get(PROPERTY_RETRY_TOPIC)
        sql = self._filter_for(original_topic) if original_topic else None
        return sql is None or sql.match_by_commit_log(properties)
