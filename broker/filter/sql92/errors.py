"""`FilterSyntaxError`: an SQL92 expression that does not compile, with where and what was expected."""

from __future__ import annotations

from protocol.errors import SubscriptionParseFailed

CARET_WINDOW = 120      # characters of a long source line shown around the error


class FilterSyntaxError(SubscriptionParseFailed):
    """The expression cannot be compiled (SUBSCRIPTION_PARSE_FAILED on the wire).

    `line` and `column` are 1-based and point at the offending character of `expression`;
    `expected` names what would have been accepted there (e.g. ("AND", "OR", "end of expression"),
    or ("a number",) for a type error); `reason` is the message without position. The remark
    carries all of it plus the source line with a caret under the column, so a client that only
    sees the remark can still show the position."""

    def __init__(self, expression: str, reason: str, line: int, column: int,
                 expected: tuple[str, ...] = ()) -> None:
        self.expression, self.reason = expression, reason
        self.line, self.column, self.expected = line, column, expected
        wanted = f"; expected {_one_of(expected)}" if expected else ""
        super().__init__(f"SQL92 expression error at line {line}, column {column}: {reason}{wanted}\n"
                         f"{self.caret()}")

    def caret(self) -> str:
        """The source line of the error and a caret under its column, two lines of text; a line
        longer than `CARET_WINDOW` characters is cut to that many around the column ("...")."""
        lines = self.expression.split("\n")
        source = lines[self.line - 1] if 0 < self.line <= len(lines) else ""
        column = max(self.column - 1, 0)
        if len(source) > CARET_WINDOW:
            start = max(0, min(column - CARET_WINDOW // 2, len(source) - CARET_WINDOW))
            head, tail = ("..." if start else ""), ("..." if start + CARET_WINDOW < len(source) else "")
            source, column = head + source[start:start + CARET_WINDOW] + tail, column - start + len(head)
        return f"  {source}\n  {' ' * column}^"


class FilterTooComplex(FilterSyntaxError):
    """The expression is over one of the broker's bounds (see `bounds.py`); `bound` is the config
    key (`sql92_max_expression_bytes`, `sql92_max_depth`, `sql92_max_terms`), `limit` its value,
    and line / column point where the bound was crossed."""

    def __init__(self, expression: str, reason: str, bound: str, limit: int, index: int) -> None:
        self.bound, self.limit = bound, limit
        line = expression.count("\n", 0, index) + 1
        column = index - (expression.rfind("\n", 0, index) + 1) + 1
        super().__init__(expression, f"{reason}; this broker accepts at most {limit:,} ({bound})", line, column)


def _one_of(expected: tuple[str, ...]) -> str:
    if len(expected) == 1:
        return expected[0]
    return "one of " + ", ".join(expected)
