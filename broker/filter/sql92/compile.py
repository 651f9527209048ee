"""Compile SQL92 selector text (REFERENCE.md §6, PROTOCOL.md deliberate differences 2-4) into a
tree of closures, once; evaluating it then costs a few dict lookups and comparisons. Pure.

Parsing is lark's LALR parser over `grammar.lark` with its basic lexer (so keywords are reserved
words, as in RocketMQ). The parse tree is walked once into typed terms: a condition (a predicate
over the properties), a property reference, a number, a string, a boolean or NULL literal. Type
rules are checked here, with the position of the offending operand, rather than failing per
message: `>`/`>=`/`<`/`<=`/BETWEEN need numbers (a property is read as one), `=`/`<>` refuse NULL
(use IS NULL) and a condition compared with a number or string, IN/CONTAINS/STARTSWITH/ENDSWITH need
a property on the left, BETWEEN with literal bounds needs low <= high, and the whole expression
(like each operand of AND/OR/NOT) must be a condition, a property or a TRUE/FALSE/NULL literal.
Integer literals must fit a signed 64-bit long; float literals must be finite (`0.0` is valid).
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lark import Token, Tree

from broker.filter.sql92 import evaluate as ev
from broker.filter.sql92.bounds import DEFAULT_LIMITS, Sql92Limits, check_depth, prescan
from broker.filter.sql92.errors import FilterSyntaxError, FilterTooComplex
from broker.filter.sql92.evaluate import Number, NumberOf, Predicate, Properties
from broker.filter.sql92.parse import parse

_LONG_MAX = (1 << 63) - 1
_COMPARE: dict[str, tuple[str, Callable[[Any, Any], bool], Callable[[Any, Any], bool]]] = {
    # rule: (symbol, operator, operator with the operands swapped)
    "gt": (">", operator.gt, operator.lt), "ge": (">=", operator.ge, operator.le),
    "lt": ("<", operator.lt, operator.gt), "le": ("<=", operator.le, operator.ge),
}
_STRING_TESTS: dict[str, tuple[str, Callable[[str, str], bool], bool]] = {
    "contains": ("CONTAINS", operator.contains, False), "not_contains": ("CONTAINS", operator.contains, True),
    "startswith": ("STARTSWITH", str.startswith, False), "not_startswith": ("STARTSWITH", str.startswith, True),
    "endswith": ("ENDSWITH", str.endswith, False), "not_endswith": ("ENDSWITH", str.endswith, True),
}

_NODE_BYTES = 260            # a compiled node: its closure, cells and canonical text piece (measured 130-320)
_MEMBER_BYTES = 100          # an IN-list member: the str and its set slot, beyond its characters (measured)

# Term kinds
COND, PROP, NUM, NUMX, STR, BOOL, NULL = "condition", "property", "number", "numeric", "string", "boolean", "NULL"


@dataclass(slots=True)
class _Term:
    kind: str
    text: str                      # canonical form, fully parenthesised
    line: int
    column: int
    predicate: Predicate | None = None     # COND
    number: NumberOf | None = None         # NUMX
    value: Any = None                      # NUM, STR, BOOL literal; PROP: the name
    reads: frozenset[str] = frozenset()


class Expression:
    """A compiled SQL92 selector. `evaluate(properties) -> bool | None` (None: unknown, which does
    not match); `text` is the source, `canonical` the parsed form fully parenthesised, `properties`
    the property names it reads; `size_bytes` estimates the memory it holds (text, canonical form,
    closures, IN-list members), what the filter manager's cache is bounded by. Immutable and
    shareable between pulls."""

    __slots__ = ("canonical", "evaluate", "properties", "size_bytes", "text")

    def __init__(self, text: str, canonical: str, predicate: Predicate, properties: frozenset[str],
                 size_bytes: int = 0) -> None:
        self.text, self.canonical, self.properties = text, canonical, properties
        self.evaluate: Callable[[Properties], bool | None] = predicate
        self.size_bytes = size_bytes or sys.getsizeof(text) + sys.getsizeof(canonical)

    def matches(self, properties: Properties) -> bool:
        """True only when the expression is True for `properties`."""
        return self.evaluate(properties) is True

    def __repr__(self) -> str:
        return f"Expression({self.canonical})"


def compile_expression(text: str, limits: Sql92Limits = DEFAULT_LIMITS) -> Expression:
    """Check `text` against `limits` (before parsing: length, parenthesis depth, AND / OR count;
    after: nesting), parse and type-check it; raises `FilterSyntaxError` (a
    `SubscriptionParseFailed`) with the 1-based line and column of the first problem and what was
    expected there, `FilterTooComplex` (one too) for a bound. CPU-bound: up to ~0.5 s at 64 KiB,
    so the broker runs it in a thread (`FilterManager.compile_async`)."""
    prescan(text, limits)
    tree = parse(text)
    check_depth(text, tree, limits)
    compiler = _Compiler(text)
    try:
        term = compiler.term(tree)
        predicate = _as_condition(text, term)
    except RecursionError:         # not reached within the depth bound; a last guard
        raise FilterTooComplex(text, "the expression nests too deeply to compile", "sql92_max_depth",
                               limits.max_depth, 0) from None
    size_bytes = (sys.getsizeof(text) + sys.getsizeof(term.text) + compiler.nodes * _NODE_BYTES
                  + compiler.member_bytes)
    return Expression(text, term.text, predicate, term.reads, size_bytes)


def _error(text: str, term: _Term, reason: str, *expected: str) -> FilterSyntaxError:
    return FilterSyntaxError(text, reason, term.line, term.column, expected)


def _as_condition(text: str, term: _Term) -> Predicate:
    """A term used where a condition is expected (top level, AND/OR/NOT operands)."""
    if term.kind == COND:
        assert term.predicate is not None
        return term.predicate
    if term.kind == PROP:
        return ev.property_as_bool(term.value)
    if term.kind in (BOOL, NULL):
        return ev.constant(term.value)
    raise _error(text, term, f"{term.text} is a {term.kind}, not a condition", "a condition")


def _as_number(text: str, term: _Term) -> NumberOf:
    if term.kind == NUM:
        value = term.value
        return lambda properties: value
    if term.kind == PROP:
        return ev.property_number(term.value, negate=False)
    if term.kind == NUMX:
        assert term.number is not None
        return term.number
    raise _error(text, term, f"{term.text} is a {term.kind}, not a number", "a number")


def _value_of(term: _Term) -> Callable[[Properties], object]:
    """Any term as a value getter (for IS NULL)."""
    if term.kind == PROP:
        name = term.value
        return lambda properties: properties.get(name)
    if term.kind == COND:
        assert term.predicate is not None
        return term.predicate
    if term.kind == NUMX:
        assert term.number is not None
        return term.number
    value = term.value
    return lambda properties: value


class _Compiler:
    """Walks a parse tree once into a `_Term`; counts `nodes` and the bytes of IN-list members."""

    def __init__(self, text: str) -> None:
        self._text = text
        self.nodes = 0
        self.member_bytes = 0

    def term(self, node: Tree[Token] | Token) -> _Term:
        if isinstance(node, Token):         # a parenthesised expression keeps its tokens
            raise AssertionError(f"unexpected token {node!r}")
        rule = str(node.data)
        if rule in ("or_expr", "and_expr", "not_expr", "equality", "comparison", "unary", "primary"):
            inner = [c for c in node.children if isinstance(c, Tree)]
            return self.term(inner[0])     # "( expr )"
        self.nodes += 1
        method = getattr(self, f"_{rule}", None)
        if method is not None:
            result: _Term = method(node)
            return result
        if rule in _COMPARE:
            return self._compare(node, rule)
        if rule in _STRING_TESTS:
            return self._string_test(node, rule)
        raise AssertionError(f"no compiler for rule {rule}")

    def _operands(self, node: Tree[Token]) -> list[_Term]:
        return [self.term(c) for c in node.children if isinstance(c, Tree)]

    @staticmethod
    def _where(node: Tree[Token]) -> tuple[int, int]:
        return node.meta.line, node.meta.column

    # literals and names ----------------------------------------------------------------------

    def _integer(self, node: Tree[Token]) -> _Term:
        token = node.children[0]
        assert isinstance(token, Token)
        value = int(token.value.rstrip("lL"))
        term = _Term(NUM, str(value), token.line or 1, token.column or 1, value=value)
        if value > _LONG_MAX:
            raise _error(self._text, term, f"integer {token.value} does not fit a 64-bit long",
                         f"an integer up to {_LONG_MAX}")
        return term

    def _float(self, node: Tree[Token]) -> _Term:
        token = node.children[0]
        assert isinstance(token, Token)
        value = float(token.value)
        term = _Term(NUM, repr(value), token.line or 1, token.column or 1, value=value)
        if math.isinf(value):
            raise _error(self._text, term, f"number {token.value} is out of range", "a finite number")
        return term

    def _string(self, node: Tree[Token]) -> _Term:
        token = node.children[0]
        assert isinstance(token, Token)
        value = _unquote(token.value)
        return _Term(STR, _quote(value), token.line or 1, token.column or 1, value=value)

    def _literal(self, node: Tree[Token], kind: str, value: bool | None) -> _Term:
        line, column = self._where(node)
        return _Term(kind, "NULL" if value is None else str(value).upper(), line, column, value=value)

    def _true(self, node: Tree[Token]) -> _Term:
        return self._literal(node, BOOL, True)

    def _false(self, node: Tree[Token]) -> _Term:
        return self._literal(node, BOOL, False)

    def _null(self, node: Tree[Token]) -> _Term:
        return self._literal(node, NULL, None)

    def _ident(self, node: Tree[Token]) -> _Term:
        token = node.children[0]
        assert isinstance(token, Token)
        return _Term(PROP, token.value, token.line or 1, token.column or 1, value=token.value,
                     reads=frozenset((token.value,)))

    # unary -----------------------------------------------------------------------------------

    def _pos(self, node: Tree[Token]) -> _Term:
        (operand,) = self._operands(node)
        number = _as_number(self._text, operand)
        line, column = self._where(node)
        if operand.kind == NUM:
            return _Term(NUM, operand.text, line, column, value=operand.value)
        return _Term(NUMX, f"(+{operand.text})", line, column, number=number, reads=operand.reads)

    def _neg(self, node: Tree[Token]) -> _Term:
        (operand,) = self._operands(node)
        number = _as_number(self._text, operand)
        line, column = self._where(node)
        if operand.kind == NUM:
            value = -operand.value
            return _Term(NUM, repr(value) if isinstance(value, float) else str(value), line, column,
                         value=value)
        if operand.kind == PROP:
            return _Term(NUMX, f"(-{operand.text})", line, column,
                         number=ev.property_number(operand.value, negate=True), reads=operand.reads)

        def negated(properties: Properties) -> Number | None:
            value = number(properties)
            return None if value is None else -value
        return _Term(NUMX, f"(-{operand.text})", line, column, number=negated, reads=operand.reads)

    # logic -----------------------------------------------------------------------------------

    def _chain(self, node: Tree[Token], word: str, combine: Callable[[list[Predicate]], Predicate]) -> _Term:
        """A left-deep chain of one operator (`a OR b OR c` parses as `(a OR b) OR c`), compiled as
        one n-ary node: no recursion per operand, so a long chain cannot overflow the stack. The
        canonical text stays fully parenthesised: `((a OR b) OR c)`."""
        rule, right_nodes, current = node.data, [], node
        while isinstance(current, Tree) and current.data == rule:
            left, right = [c for c in current.children if isinstance(c, Tree)]
            right_nodes.append(right)
            current = left
        operands = [self.term(current), *(self.term(n) for n in reversed(right_nodes))]
        self.nodes += len(right_nodes) - 1
        predicates = [_as_condition(self._text, operand) for operand in operands]
        text = "(" * (len(operands) - 1) + operands[0].text + "".join(f" {word} {o.text})" for o in operands[1:])
        line, column = self._where(node)
        return _Term(COND, text, line, column, predicate=combine(predicates),
                     reads=frozenset().union(*(o.reads for o in operands)))

    def _or_(self, node: Tree[Token]) -> _Term:
        return self._chain(node, "OR", ev.any_of)

    def _and_(self, node: Tree[Token]) -> _Term:
        return self._chain(node, "AND", ev.all_of)

    def _not_(self, node: Tree[Token]) -> _Term:
        (operand,) = self._operands(node)
        line, column = self._where(node)
        return _Term(COND, f"(NOT {operand.text})", line, column,
                     predicate=ev.not_(_as_condition(self._text, operand)), reads=operand.reads)

    # comparisons -----------------------------------------------------------------------------

    def _cond(self, node: Tree[Token], text: str, predicate: Predicate, *operands: _Term) -> _Term:
        line, column = self._where(node)
        reads: frozenset[str] = frozenset().union(*(o.reads for o in operands))
        return _Term(COND, text, line, column, predicate=predicate, reads=reads)

    def _eq(self, node: Tree[Token]) -> _Term:
        return self._equality(node, negated=False)

    def _ne(self, node: Tree[Token]) -> _Term:
        return self._equality(node, negated=True)

    def _equality(self, node: Tree[Token], negated: bool) -> _Term:
        left, right = self._operands(node)
        text = f"({left.text} {'<>' if negated else '='} {right.text})"
        for operand in (left, right):
            if operand.kind == NULL:
                raise _error(self._text, operand, "NULL cannot be compared with = or <>; use IS [NOT] NULL",
                             "a value other than NULL")
        second = right
        if right.kind == PROP and left.kind != PROP:
            left, right = right, left
        kinds = {left.kind, right.kind}
        compare = operator.ne if negated else operator.eq
        predicate: Predicate
        if left.kind == PROP and right.kind == STR:
            predicate = ev.string_equals(left.value, right.value, negated)
        elif left.kind == PROP and right.kind == NUM:
            predicate = ev.compare_property(left.value, compare, right.value)
        elif left.kind == PROP and right.kind == BOOL:
            predicate = ev.bool_property_equals(left.value, right.value, negated)
        elif left.kind == PROP and right.kind == PROP:
            predicate = ev.properties_equal(left.value, right.value, negated)
        elif kinds <= {PROP, COND, BOOL}:
            predicate = ev.predicates_equal(_as_condition(self._text, left), _as_condition(self._text, right),
                                            negated)
        elif kinds <= {PROP, NUM, NUMX}:
            predicate = ev.compare_numbers(_as_number(self._text, left), compare, _as_number(self._text, right))
        elif kinds == {STR}:
            predicate = ev.constant((left.value == right.value) is not negated)
        elif kinds == {STR, NUM}:
            string = left if left.kind == STR else right
            number = right if left.kind == STR else left
            converted = ev.to_number(string.value)
            predicate = ev.constant(None if converted is None else compare(converted, number.value))
        else:
            raise _error(self._text, second, f"cannot compare {left.text} with {right.text} "
                         f"(a {left.kind} with a {right.kind})", f"a value comparable with {left.text}")
        return self._cond(node, text, predicate, left, right)

    def _is_null(self, node: Tree[Token]) -> _Term:
        (operand,) = self._operands(node)
        return self._cond(node, f"({operand.text} IS NULL)", ev.is_null(_value_of(operand), False), operand)

    def _is_not_null(self, node: Tree[Token]) -> _Term:
        (operand,) = self._operands(node)
        return self._cond(node, f"({operand.text} IS NOT NULL)", ev.is_null(_value_of(operand), True), operand)

    def _compare(self, node: Tree[Token], rule: str) -> _Term:
        left, right = self._operands(node)
        symbol, compare, swapped = _COMPARE[rule]
        text = f"({left.text} {symbol} {right.text})"
        left_number, right_number = _as_number(self._text, left), _as_number(self._text, right)
        if left.kind == PROP and right.kind == NUM:
            predicate = ev.compare_property(left.value, compare, right.value)
        elif left.kind == NUM and right.kind == PROP:
            predicate = ev.compare_property(right.value, swapped, left.value)
        else:
            predicate = ev.compare_numbers(left_number, compare, right_number)
        return self._cond(node, text, predicate, left, right)

    def _between(self, node: Tree[Token]) -> _Term:
        return self._range(node, negated=False)

    def _not_between(self, node: Tree[Token]) -> _Term:
        return self._range(node, negated=True)

    def _range(self, node: Tree[Token], negated: bool) -> _Term:
        value, low, high = self._operands(node)
        value_of, low_of, high_of = (_as_number(self._text, t) for t in (value, low, high))
        if not negated and low.kind == NUM and high.kind == NUM and low.value > high.value:
            raise _error(self._text, low, f"BETWEEN {low.text} AND {high.text} is empty (low > high)",
                         f"a lower bound <= {high.text}")
        word = "NOT BETWEEN" if negated else "BETWEEN"
        return self._cond(node, f"({value.text} {word} {low.text} AND {high.text})",
                          ev.between(value_of, low_of, high_of, negated), value, low, high)

    def _property_operand(self, node: Tree[Token], word: str) -> _Term:
        first = node.children[0]
        assert isinstance(first, Tree)
        left = self.term(first)
        if left.kind != PROP:
            raise _error(self._text, left, f"{word} needs a property name on its left, not {left.text}",
                         "a property name")
        return left

    def _in_(self, node: Tree[Token]) -> _Term:
        return self._membership(node, negated=False)

    def _not_in(self, node: Tree[Token]) -> _Term:
        return self._membership(node, negated=True)

    def _membership(self, node: Tree[Token], negated: bool) -> _Term:
        word = "NOT IN" if negated else "IN"
        left = self._property_operand(node, word)
        (strings,) = [c for c in node.children if isinstance(c, Tree) and c.data == "string_list"]
        members = [_unquote(t.value) for t in strings.children if isinstance(t, Token) and t.type == "STRING"]
        self.member_bytes += sum(sys.getsizeof(m) + _MEMBER_BYTES for m in members)
        listed = ", ".join(_quote(m) for m in members)
        return self._cond(node, f"({left.text} {word} ({listed}))",
                          ev.member_of(left.value, frozenset(members), negated), left)

    def _string_test(self, node: Tree[Token], rule: str) -> _Term:
        word, test, negated = _STRING_TESTS[rule]
        word = f"NOT {word}" if negated else word
        left = self._property_operand(node, word)
        (token,) = [c for c in node.children if isinstance(c, Token) and c.type == "STRING"]
        literal = _unquote(token.value)
        return self._cond(node, f"({left.text} {word} {_quote(literal)})",
                          ev.string_test(left.value, test, literal, negated), left)


def _unquote(token: str) -> str:
    return token[1:-1].replace("''", "'")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
