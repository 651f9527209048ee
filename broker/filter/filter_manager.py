"""`FilterManager`: subscription expressions → message filters, compiled once and cached
(RocketMQ `ConsumerFilterManager` without its bloom-filter bitmaps).

SQL92 filters are cached per (group, topic, sub_version), so a pull finds its compiled filter with
one dict lookup; compilation itself is cached per expression text (a heartbeat and the pulls of a
group share it, and a new sub_version with the same text costs nothing). Both caches are bounded
(`max_entries`, oldest dropped first). A text that does not compile is remembered as its
`FilterSyntaxError` so a consumer pulling with it is refused at once every time."""

from __future__ import annotations

from typing import TypeVar

from broker.filter.match_index import MatchIndex, QueueMatches
from broker.filter.message_filter import MessageFilter, SqlMessageFilter, TagMessageFilter
from broker.filter.sql92 import Expression, FilterSyntaxError, compile_expression
from protocol.errors import SubscriptionParseFailed, SystemError_
from protocol.model import ExpressionType
from protocol.subscription import is_subscribe_all, parse_tags, tags_code

DEFAULT_MAX_ENTRIES = 4096
K = TypeVar("K")
V = TypeVar("V")


def build_tag_filter(expression: str | None) -> MessageFilter | None:
    """None for "*" (everything), else a `TagMessageFilter`; raises `SubscriptionParseFailed`."""
    if is_subscribe_all(expression):
        return None
    try:
        tags = parse_tags(expression)
    except ValueError as exc:
        raise SubscriptionParseFailed(f"cannot parse tag expression {expression!r}: {exc}") from None
    return TagMessageFilter(frozenset(tags_code(t) for t in tags))


class FilterManager:
    """`sql92_enabled` is the broker's `filter_support_sql92` (RocketMQ `enablePropertyFilter`,
    on by default here): when off, SQL92 is refused with SYSTEM_ERROR as RocketMQ does."""

    def __init__(self, *, sql92_enabled: bool, max_entries: int = DEFAULT_MAX_ENTRIES,
                 index: MatchIndex | None = None) -> None:
        self.sql92_enabled = sql92_enabled
        self.index = index if index is not None else MatchIndex()
        self._max_entries = max(max_entries, 1)
        self._compiled: dict[str, Expression | FilterSyntaxError] = {}
        self._filters: dict[tuple[str, str, int], SqlMessageFilter] = {}

    def compile(self, expression: str) -> Expression:
        """The compiled expression; raises `FilterSyntaxError` (SUBSCRIPTION_PARSE_FAILED) or
        `SystemError_` when SQL92 is disabled."""
        if not self.sql92_enabled:
            raise SystemError_("SQL92 filtering is disabled on this broker (filter_support_sql92 = false); "
                               "subscribe by TAG")
        compiled = self._compiled.get(expression)
        if compiled is None:
            try:
                compiled = compile_expression(expression)
            except FilterSyntaxError as exc:
                compiled = exc
            _bounded_put(self._compiled, expression, compiled, self._max_entries)
        if isinstance(compiled, FilterSyntaxError):
            raise compiled
        return compiled

    def sql_filter(self, group: str, topic: str, sub_version: int, expression: str) -> SqlMessageFilter:
        """The SQL92 filter of (group, topic, sub_version); raises as `compile`."""
        key = (group, topic, sub_version)
        cached = self._filters.get(key)
        if cached is not None and cached.expression.text == expression:
            return cached
        built = SqlMessageFilter(self.compile(expression), key)
        _bounded_put(self._filters, key, built, self._max_entries)
        return built

    def register(self, group: str, topic: str, sub_version: int, expression: str) -> SqlMessageFilter:
        """A heartbeat's SQL92 subscription: its filter (raises as `compile`), now also indexed as
        messages arrive on `topic` (see `MatchIndex`)."""
        built = self.sql_filter(group, topic, sub_version, expression)
        self.index.register(topic, built.expression)
        return built

    def matches(self, message_filter: MessageFilter | None, topic: str, queue_id: int) -> QueueMatches | None:
        """The indexed matches of an SQL92 filter on one queue, if its expression is indexed."""
        if isinstance(message_filter, SqlMessageFilter):
            return self.index.lookup(topic, message_filter.expression.text, queue_id)
        return None

    def build(self, group: str, topic: str, expression_type: str | None, expression: str | None,
              sub_version: int) -> MessageFilter | None:
        """The filter of a subscription: None for TAG "*" (everything), a `TagMessageFilter`, or an
        `SqlMessageFilter`. Raises `SubscriptionParseFailed` for a bad expression or an unknown
        `expression_type` ("" and None mean TAG), `SystemError_` for SQL92 when it is disabled."""
        kind = expression_type or ExpressionType.TAG
        if kind == ExpressionType.TAG:
            return build_tag_filter(expression)
        if kind == ExpressionType.SQL92:
            return self.sql_filter(group, topic, sub_version, expression or "")
        raise SubscriptionParseFailed(f"unknown expression_type {kind!r} (TAG or SQL92)")

    def check(self, expression_type: str | None, expression: str | None) -> None:
        """CHECK_CLIENT_CONFIG: raise what `build` would for this subscription, else return."""
        kind = expression_type or ExpressionType.TAG
        if kind == ExpressionType.SQL92:
            self.compile(expression or "")
        else:
            self.build("", "", kind, expression, 0)


def _bounded_put(table: dict[K, V], key: K, value: V, limit: int) -> None:
    while len(table) >= limit:
        del table[next(iter(table))]
    table[key] = value
