"""Message filters the store and the hold service apply (RocketMQ `ExpressionMessageFilter`, §5).

A filter answers on the consume-queue unit (`tags_code`) first; `match_by_commit_log` sees the
message properties and is only consulted when `needs_properties` is set (SQL92, a later issue), so
TAG filtering never decodes a stored message."""

from __future__ import annotations

from broker.store.results import MessageFilter

__all__ = ["MessageFilter", "TagMessageFilter"]


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
