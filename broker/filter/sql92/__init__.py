"""SQL92 property filters (REFERENCE.md §6 with PROTOCOL.md's deliberate differences).

`compile_expression(text) -> Expression`; `Expression.evaluate(properties) -> bool | None`
(None: unknown, which does not match); a bad expression raises `FilterSyntaxError`, a
`protocol.errors.SubscriptionParseFailed` carrying line, column and what was expected."""

from broker.filter.sql92.compile import Expression, compile_expression
from broker.filter.sql92.errors import FilterSyntaxError

__all__ = ["Expression", "FilterSyntaxError", "compile_expression"]
