"""Bounds on an SQL92 expression, checked before any parsing and then on the parse tree. Pure.

RocketMQ has no such bounds: its JavaCC parser takes any length and nesting, and a large enough
expression blocks it or overflows its stack. Ours refuse, with SUBSCRIPTION_PARSE_FAILED and a
remark naming the bound and its config key, an expression
- longer than `max_expression_bytes` (UTF-8; `sql92_max_expression_bytes`, 64 KiB),
- with more than `max_terms` conditions joined by AND / OR (`sql92_max_terms`, 1,024), or
- nested deeper than `max_depth` (`sql92_max_depth`, 64): parentheses, checked by `prescan`
  before parsing; then parentheses, NOT and unary signs together, checked on the parse tree by
  `check_depth` (iteratively: a deep tree cannot overflow the checker).
`prescan` is one regular-expression pass (strings and comments skipped), a few ms at 64 KiB; an
expression over the byte bound is refused from its length alone."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lark import Token, Tree

from broker.filter.sql92.errors import FilterTooComplex


@dataclass(frozen=True, slots=True, kw_only=True)
class Sql92Limits:
    max_expression_bytes: int = 65_536
    max_depth: int = 64
    max_terms: int = 1_024


DEFAULT_LIMITS = Sql92Limits()

# A string literal (perhaps unterminated), a comment, a parenthesis or a word.
_SCAN = re.compile(r"'(?:[^']|'')*'?|--[^\n]*|/\*.*?(?:\*/|\Z)|[()]|[A-Za-z_$][A-Za-z0-9_$]*", re.DOTALL)
_NESTING = frozenset({"primary", "not_", "pos", "neg"})     # rules that nest one level
_CHAINS = frozenset({"or_", "and_"})                        # compiled as flat lists


def prescan(text: str, limits: Sql92Limits = DEFAULT_LIMITS) -> None:
    """Raise `FilterTooComplex` when `text` is over the byte bound, nests parentheses deeper than
    `max_depth` or joins more than `max_terms` conditions (AND / OR, the AND of BETWEEN aside)."""
    max_bytes = limits.max_expression_bytes
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        size = len(text.encode("utf-8", "surrogatepass"))
        raise FilterTooComplex(text, f"the expression is {size:,} bytes long", "sql92_max_expression_bytes",
                               max_bytes, _position_of_byte(text, max_bytes))
    depth = terms = betweens = 0
    for match in _SCAN.finditer(text):
        token = match.group()
        if token == "(":
            depth += 1
            if depth > limits.max_depth:
                raise FilterTooComplex(text, f"parentheses nest more than {limits.max_depth} deep",
                                       "sql92_max_depth", limits.max_depth, match.start())
        elif token == ")":
            depth -= 1
        elif token[0] not in "'-/":
            word = token.upper()
            if word == "BETWEEN":
                betweens += 1
            elif word in ("AND", "OR"):
                if betweens and word == "AND":
                    betweens -= 1           # BETWEEN's own AND
                    continue
                terms += 1
                if terms >= limits.max_terms:
                    raise FilterTooComplex(text, f"more than {limits.max_terms:,} conditions are joined by "
                                           "AND / OR", "sql92_max_terms", limits.max_terms, match.start())


def check_depth(text: str, tree: Tree[Token], limits: Sql92Limits = DEFAULT_LIMITS) -> None:
    """Raise `FilterTooComplex` when parentheses, NOT and unary + / - nest deeper than `max_depth`
    in `tree`, or AND / OR change operator deeper than that (a chain of one operator is one level)."""
    stack: list[tuple[Tree[Token], int, bool]] = [(tree, 0, False)]     # (node, depth above it, continues a chain)
    while stack:
        node, depth, continues_chain = stack.pop()
        rule = str(node.data)
        if rule in _NESTING or (rule in _CHAINS and not continues_chain):
            depth += 1
        if depth > limits.max_depth:
            index = 0 if node.meta.empty else node.meta.start_pos
            raise FilterTooComplex(text, f"the expression nests more than {limits.max_depth} deep (parentheses, "
                                   "NOT, unary signs, alternating AND / OR)", "sql92_max_depth",
                                   limits.max_depth, index)
        for position, child in enumerate(node.children):
            if isinstance(child, Tree):
                # the left operand continuing an AND / OR chain is compiled on the chain's level
                stack.append((child, depth, rule in _CHAINS and position == 0 and str(child.data) == rule))


def _position_of_byte(text: str, limit: int) -> int:
    """The index of the first character whose UTF-8 encoding ends past `limit` bytes."""
    return len(text.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore"))
