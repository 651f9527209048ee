"""`FilterManager`: subscription expressions → message filters, compiled once and cached
(RocketMQ `ConsumerFilterManager` without its bloom-filter bitmaps).

SQL92 filters are cached per (group, topic, sub_version), so a pull finds its compiled filter with
one dict lookup; compilation itself is cached per expression text (a heartbeat and the pulls of a
group share it, and a new sub_version with the same text costs nothing). The text cache is bounded
by total size (`CompileCache`, `sql92_compile_cache_bytes`) and count (`max_entries`); evicting an
expression also drops its per-subscription filters and its match-index registrations, so nothing
else keeps it alive. A text that does not compile is remembered as its `FilterSyntaxError` so a
consumer pulling with it is refused at once every time; one over a bound (`FilterTooComplex`) is
refused again by the cheap pre-scan and never cached.

On the broker, compiling runs off the event loop: `compile_async` pre-scans on the loop (bounds,
a few ms), then compiles in a thread, one expression at a time (`COMPILE_CONCURRENCY`), with
concurrent requests for one text sharing one compilation. Request paths ask with
`compile_now=False` and get `NotCompiled` instead of compiling on the loop."""

from __future__ import annotations

import asyncio

from broker.filter.compile_cache import DEFAULT_MAX_BYTES, CompileCache, Compiled
from broker.filter.match_index import MatchIndex, QueueMatches
from broker.filter.message_filter import MessageFilter, SqlMessageFilter, TagMessageFilter
from broker.filter.sql92 import Expression, FilterSyntaxError, compile_expression
from broker.filter.sql92.bounds import DEFAULT_LIMITS, Sql92Limits, prescan
from broker.filter.sql92.errors import FilterTooComplex
from protocol.errors import SubscriptionParseFailed, SystemError_
from protocol.model import ExpressionType
from protocol.subscription import is_subscribe_all, parse_tags, tags_code

DEFAULT_MAX_ENTRIES = 4096
COMPILE_CONCURRENCY = 1         # compiling is CPU-bound Python: more threads would only share the GIL
FilterKey = tuple[str, str, int]        # (group, topic, sub_version)


class NotCompiled(Exception):
    """Raised with `compile_now=False` when `text` must be compiled first: `await
    FilterManager.compile_async(text)`, then ask again. Never reaches the dispatcher."""

    def __init__(self, text: str) -> None:
        super().__init__("SQL92 expression not compiled yet")
        self.text = text


def _compile_or_error(text: str, limits: Sql92Limits) -> Compiled:
    """`compile_expression`, its `FilterSyntaxError` returned rather than raised (runs in a thread)."""
    try:
        return compile_expression(text, limits)
    except FilterSyntaxError as exc:
        return exc


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
    on by default here): when off, SQL92 is refused with SYSTEM_ERROR as RocketMQ does. `limits`
    bound each expression (`bounds.py`); `cache_bytes` bounds the compiled ones together."""

    def __init__(self, *, sql92_enabled: bool, max_entries: int = DEFAULT_MAX_ENTRIES,
                 index: MatchIndex | None = None, limits: Sql92Limits = DEFAULT_LIMITS,
                 cache_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.sql92_enabled = sql92_enabled
        self.index = index if index is not None else MatchIndex()
        self.limits = limits
        self._max_entries = max(max_entries, 1)
        self.compiled = CompileCache(max_bytes=cache_bytes, max_entries=max_entries, on_evict=self._evicted)
        self._filters: dict[FilterKey, SqlMessageFilter] = {}
        self._keys_by_text: dict[str, set[FilterKey]] = {}
        self._indexed_topics: dict[str, set[str]] = {}
        self._compiling: dict[str, asyncio.Task[Compiled]] = {}
        self._compile_slots = asyncio.Semaphore(COMPILE_CONCURRENCY)

    def _require_enabled(self) -> None:
        if not self.sql92_enabled:
            raise SystemError_("SQL92 filtering is disabled on this broker (filter_support_sql92 = false); "
                               "subscribe by TAG")

    def compile(self, expression: str) -> Expression:
        """The compiled expression, compiled here if it is not cached (blocking: tests and tools;
        the broker's request paths use `compile_async`). Raises `FilterSyntaxError`
        (SUBSCRIPTION_PARSE_FAILED), `FilterTooComplex` (one too) or `SystemError_` when SQL92 is
        disabled."""
        self._require_enabled()
        compiled = self.compiled.get(expression)
        if compiled is None:
            compiled = self._cache(expression, _compile_or_error(expression, self.limits))
        if isinstance(compiled, FilterSyntaxError):
            raise compiled
        return compiled

    def pending(self, expression_type: str | None, expression: str | None) -> bool:
        """True when a subscription of this type needs `compile_async` before it can be used."""
        return (expression_type == ExpressionType.SQL92 and self.sql92_enabled
                and (expression or "") not in self.compiled)

    async def compile_async(self, expression: str) -> Expression:
        """`compile` off the event loop: the bounds pre-scan on the loop (an expression over one is
        refused without a thread), then one compilation per text in a thread, shared by everyone
        asking for that text meanwhile; raises as `compile`."""
        self._require_enabled()
        compiled = self.compiled.get(expression)
        if compiled is None:
            prescan(expression, self.limits)
            task = self._compiling.get(expression)
            if task is None:
                task = asyncio.get_running_loop().create_task(self._compile_in_thread(expression))
                self._compiling[expression] = task
                task.add_done_callback(lambda _: self._compiling.pop(expression, None))
            compiled = await asyncio.shield(task)
        if isinstance(compiled, FilterSyntaxError):
            raise compiled
        return compiled

    async def _compile_in_thread(self, expression: str) -> Compiled:
        async with self._compile_slots:
            compiled = self.compiled.get(expression)
            if compiled is None:
                compiled = await asyncio.to_thread(_compile_or_error, expression, self.limits)
                self._cache(expression, compiled)
        return compiled

    async def close(self) -> None:
        """Give up compilations still waiting or running (a running one ends in its thread)."""
        tasks = list(self._compiling.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _cache(self, expression: str, compiled: Compiled) -> Compiled:
        if not isinstance(compiled, FilterTooComplex):     # the pre-scan refuses it again, cheaply
            self.compiled.put(expression, compiled)
        return compiled

    def _evicted(self, expression: str) -> None:
        """The compile cache dropped `expression`: so do its filters and index registrations."""
        for key in self._keys_by_text.pop(expression, ()):
            self._filters.pop(key, None)
        for topic in self._indexed_topics.pop(expression, ()):
            self.index.unregister(topic, expression)

    def sql_filter(self, group: str, topic: str, sub_version: int, expression: str, *,
                   compile_now: bool = True) -> SqlMessageFilter:
        """The SQL92 filter of (group, topic, sub_version); raises as `compile`, or `NotCompiled`
        when `compile_now` is False and the text is not compiled yet."""
        key = (group, topic, sub_version)
        cached = self._filters.get(key)
        if cached is not None and cached.expression.text == expression:
            return cached
        if not compile_now and expression not in self.compiled:
            self._require_enabled()
            raise NotCompiled(expression)
        built = SqlMessageFilter(self.compile(expression), key)
        self._forget_filter(key)
        while len(self._filters) >= self._max_entries:
            self._forget_filter(next(iter(self._filters)))
        self._filters[key] = built
        self._keys_by_text.setdefault(expression, set()).add(key)
        return built

    def _forget_filter(self, key: FilterKey) -> None:
        dropped = self._filters.pop(key, None)
        if dropped is None:
            return
        keys = self._keys_by_text.get(dropped.expression.text)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys_by_text[dropped.expression.text]

    def register(self, group: str, topic: str, sub_version: int, expression: str, *,
                 compile_now: bool = True) -> SqlMessageFilter:
        """A heartbeat's SQL92 subscription: its filter (raises as `sql_filter`), now also indexed
        as messages arrive on `topic` (see `MatchIndex`)."""
        built = self.sql_filter(group, topic, sub_version, expression, compile_now=compile_now)
        self.compiled.get(expression)           # in use: now the most recently used
        self.index.register(topic, built.expression)
        self._indexed_topics.setdefault(expression, set()).add(topic)
        return built

    def matches(self, message_filter: MessageFilter | None, topic: str, queue_id: int) -> QueueMatches | None:
        """The indexed matches of an SQL92 filter on one queue, if its expression is indexed."""
        if isinstance(message_filter, SqlMessageFilter):
            return self.index.lookup(topic, message_filter.expression.text, queue_id)
        return None

    def build(self, group: str, topic: str, expression_type: str | None, expression: str | None,
              sub_version: int, *, compile_now: bool = True) -> MessageFilter | None:
        """The filter of a subscription: None for TAG "*" (everything), a `TagMessageFilter`, or an
        `SqlMessageFilter`. Raises `SubscriptionParseFailed` for a bad expression or an unknown
        `expression_type` ("" and None mean TAG), `SystemError_` for SQL92 when it is disabled,
        `NotCompiled` as `sql_filter`."""
        kind = expression_type or ExpressionType.TAG
        if kind == ExpressionType.TAG:
            return build_tag_filter(expression)
        if kind == ExpressionType.SQL92:
            return self.sql_filter(group, topic, sub_version, expression or "", compile_now=compile_now)
        raise SubscriptionParseFailed(f"unknown expression_type {kind!r} (TAG or SQL92)")

    def check(self, expression_type: str | None, expression: str | None) -> None:
        """CHECK_CLIENT_CONFIG: raise what `build` would for this subscription, else return."""
        kind = expression_type or ExpressionType.TAG
        if kind == ExpressionType.SQL92:
            self.compile(expression or "")
        else:
            self.build("", "", kind, expression, 0)
