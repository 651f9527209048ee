"""`CompileCache`: compiled SQL92 expressions by text, bounded by their total size in bytes.

A bound by count alone let 40 distinct 1.1 MB IN lists hold 760 MB. Each entry weighs its
`Expression.size_bytes` (text, canonical form, closures, IN-list members; see `compile.py`) or,
for a text that did not compile, the text's size; past `max_bytes` (`sql92_compile_cache_bytes`,
32 MiB) or `max_entries` the least recently used entries are dropped, and `on_evict(text)` lets
the owner drop what else holds that expression (filters per subscription, the match index). An
entry larger than `max_bytes` on its own is kept alone. RocketMQ keeps compiled filters per
(group, topic) with no bound. Pure; event-loop thread only."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable

from broker.filter.sql92 import Expression, FilterSyntaxError

Compiled = Expression | FilterSyntaxError
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


def weight(compiled: Compiled) -> int:
    """The bytes an entry is counted for."""
    if isinstance(compiled, Expression):
        return compiled.size_bytes
    return sys.getsizeof(compiled.expression) + 1_024


class CompileCache:
    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = 4096,
                 on_evict: Callable[[str], None] | None = None) -> None:
        self._max_bytes, self._max_entries = max_bytes, max(max_entries, 1)
        self._entries: OrderedDict[str, tuple[Compiled, int]] = OrderedDict()
        self.size_bytes = 0
        self.on_evict = on_evict

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, text: str) -> bool:
        return text in self._entries

    def get(self, text: str) -> Compiled | None:
        """The entry of `text` (now the most recently used), or None."""
        entry = self._entries.get(text)
        if entry is None:
            return None
        self._entries.move_to_end(text)
        return entry[0]

    def put(self, text: str, compiled: Compiled) -> None:
        """Keep `compiled`, dropping the least recently used entries until it fits (all of them
        when it alone is over `max_bytes`)."""
        size = weight(compiled)
        self.discard(text)
        while self._entries and (self.size_bytes + size > self._max_bytes or len(self._entries) >= self._max_entries):
            oldest = next(iter(self._entries))
            self.discard(oldest)
            if self.on_evict is not None:
                self.on_evict(oldest)
        self._entries[text] = (compiled, size)
        self.size_bytes += size

    def discard(self, text: str) -> None:
        entry = self._entries.pop(text, None)
        if entry is not None:
            self.size_bytes -= entry[1]
