"""`MessageSelector` (RocketMQ `MessageSelector`): which messages of a topic a consumer wants.

    consumer.subscribe("orders", MessageSelector.by_sql("TAGS IN ('paid', 'refund') AND amount > 100"))
    consumer.subscribe("orders", MessageSelector.by_tag("paid || refund"))   # same as the string form
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.model import ExpressionType
from protocol.subscription import SUB_ALL


@dataclass(frozen=True, slots=True)
class MessageSelector:
    """`expression_type` is "TAG" or "SQL92"; `expression` the tag expression or the SQL92 text.
    The SQL92 text is compiled by the broker: a consumer asks it at start (CHECK_CLIENT_CONFIG) and
    fails to start with the broker's message, which points at the line and column."""

    expression_type: str
    expression: str

    @classmethod
    def by_tag(cls, tag: str | None = SUB_ALL) -> MessageSelector:
        """A tag expression: "*" (everything, also for None or ""), "A" or "A || B"."""
        return cls(ExpressionType.TAG.value, tag or SUB_ALL)

    @classmethod
    def by_sql(cls, sql: str) -> MessageSelector:
        """An SQL92 expression over message properties (e.g. "TAGS IN ('a') AND amount > 100");
        raises `ValueError` when empty."""
        if not sql or not sql.strip():
            raise ValueError("an SQL92 selector needs an expression (use by_tag('*') for everything)")
        return cls(ExpressionType.SQL92.value, sql)
