"""Parse SQL92 selector text with lark's LALR parser over `grammar.lark` (basic lexer, so keywords
are reserved words, as in RocketMQ), turning lark's errors into `FilterSyntaxError`s that name the
line, column and what was expected there. Pure; the parser is built once per process."""

from __future__ import annotations

import functools
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from broker.filter.sql92.errors import FilterSyntaxError

_TERMINAL_NAMES = {
    "$END": "end of expression", "IDENT": "a property name", "STRING": "a string literal",
    "INTEGER": "an integer", "FLOAT": "a decimal number", "LPAR": "'('", "RPAR": "')'", "COMMA": "','",
    "EQ": "'='", "NE": "'<>'", "GT": "'>'", "GE": "'>='", "LT": "'<'", "LE": "'<='", "PLUS": "'+'",
    "MINUS": "'-'",
}
_OPERATORS = frozenset({"EQ", "NE", "GT", "GE", "LT", "LE", "IS", "BETWEEN", "IN", "CONTAINS", "STARTSWITH",
                        "ENDSWITH", "NOT"})


def parse(text: str) -> Tree[Token]:
    """The parse tree of `text`; raises `FilterSyntaxError` at the first problem."""
    try:
        return _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None


@functools.cache
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "grammar.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", lexer="basic", propagate_positions=True)


def _syntax_error(text: str, exc: UnexpectedInput) -> FilterSyntaxError:
    line, column = exc.line, exc.column
    if isinstance(exc, UnexpectedToken):
        expected = _names(exc.expected)
        token = exc.token
        if token.type == "$END":
            lines = text.split("\n")
            line, column = len(lines), len(lines[-1]) + 1
            return FilterSyntaxError(text, "the expression ends too early", line, column, expected)
        return FilterSyntaxError(text, f"unexpected {token.value!r}", line, column, expected)
    if isinstance(exc, UnexpectedCharacters):
        position = exc.pos_in_stream or 0
        char = text[position] if 0 <= position < len(text) else ""
        reason = "unterminated string literal" if char == "'" else f"unexpected character {char!r}"
        return FilterSyntaxError(text, reason, line, column, _names(_accepted_after(text[:position], exc)))
    return FilterSyntaxError(text, str(exc), max(line, 1), max(column, 1))


def _accepted_after(prefix: str, exc: UnexpectedCharacters) -> set[str]:
    """What the parser would accept after `prefix` (the lexer alone cannot tell)."""
    try:
        interactive = _parser().parse_interactive(prefix)
        interactive.exhaust_lexer()
        accepted: set[str] = interactive.accepts()  # type: ignore[no-untyped-call]
        return accepted
    except UnexpectedInput:
        return set(exc.allowed or ())


def _names(terminals: set[str] | frozenset[str]) -> tuple[str, ...]:
    operators = terminals & _OPERATORS
    if len(operators) > 1:          # after a complete operand: say "an operator", not 14 of them
        terminals = (terminals - _OPERATORS) | {"an operator"}
    named = {_TERMINAL_NAMES.get(t, t) for t in terminals if not t.startswith("__")}
    return tuple(sorted(named, key=lambda n: (n.startswith("'"), n.startswith("a"), n)))
