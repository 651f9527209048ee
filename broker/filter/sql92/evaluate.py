"""Run-time pieces of SQL92 evaluation: value conversion and three-valued logic. Pure.

Every message property is a string; a missing property is None, which makes the predicate that
reads it unknown (None). Only True matches. Conversions (PROTOCOL.md deliberate difference 4):

- a property compared with a number (`>`, `>=`, `<`, `<=`, `BETWEEN`, `=` / `<>` against a numeric
  literal, unary minus) is read as a number: an integer text (`int()`, so "+7", " 7 " and "007"
  are 7) or else a float text ("3.5", "1e3", "inf"); anything else, NaN and texts with "_" give
  None (unknown), never an error, so `a > 3` with a = "3.5" is True and with a = "x" is unknown.
  (RocketMQ converts with the literal's Java type, so a = "3.5" makes `a > 3` throw.)
- a property compared with TRUE / FALSE, or used where a condition is expected (`a AND b`, a bare
  `a`), is "true" / "false" (any case) or else unknown. (RocketMQ: a bare string property is FALSE.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import TypeVar

Properties = Mapping[str, str]
Number = int | float
Predicate = Callable[[Properties], "bool | None"]
NumberOf = Callable[[Properties], "Number | None"]
T = TypeVar("T")


def to_number(text: str) -> Number | None:
    """The number a property text denotes, or None (see the module docstring)."""
    try:
        value: Number = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return None
        if value != value:                  # NaN compares with nothing
            return None
    if "_" in text:                         # Python reads "1_000"; SQL does not
        return None
    return value


def to_bool(text: str) -> bool | None:
    """True for "true", False for "false" (any case), else None."""
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def and_(left: Predicate, right: Predicate) -> Predicate:
    """Kleene AND with short-circuit: False if either side is False, else None if either is None."""
    return _decided_pair(left, right, False)


def or_(left: Predicate, right: Predicate) -> Predicate:
    """Kleene OR with short-circuit: True if either side is True, else None if either is None."""
    return _decided_pair(left, right, True)


def _decided_pair(left: Predicate, right: Predicate, decisive: bool) -> Predicate:
    """`_decided_by` for two operands, unrolled (AND and OR are the most common nodes): `decisive`
    as soon as one side is `decisive`, else None if either side is None, else not `decisive`."""
    def evaluate(properties: Properties) -> bool | None:
        a = left(properties)
        if a is decisive:
            return a
        b = right(properties)
        if a is None and b is not decisive:
            return None
        return b
    return evaluate


def any_of(operands: list[Predicate]) -> Predicate:
    """Kleene OR of `operands` left to right (the same as nesting `or_`, in one call, so a chain of
    thousands cannot overflow the stack): True at the first True, else None if any is None."""
    return or_(*operands) if len(operands) == 2 else _decided_by(tuple(operands), True)


def all_of(operands: list[Predicate]) -> Predicate:
    """Kleene AND of `operands` left to right: False at the first False, else None if any is None."""
    return and_(*operands) if len(operands) == 2 else _decided_by(tuple(operands), False)


def _decided_by(predicates: tuple[Predicate, ...], decisive: bool) -> Predicate:
    """`decisive` at the first operand that is `decisive`, else None if any is None, else not `decisive`."""
    def evaluate(properties: Properties) -> bool | None:
        unknown = False
        for predicate in predicates:
            value = predicate(properties)
            if value is decisive:
                return decisive
            if value is None:
                unknown = True
        return None if unknown else not decisive
    return evaluate


def not_(operand: Predicate) -> Predicate:
    """NOT: unknown stays unknown."""
    def evaluate(properties: Properties) -> bool | None:
        value = operand(properties)
        return None if value is None else not value
    return evaluate


def constant(value: bool | None) -> Predicate:
    def evaluate(properties: Properties) -> bool | None:
        return value
    return evaluate


def property_as_bool(name: str) -> Predicate:
    """A property used as a condition (see the module docstring)."""
    def evaluate(properties: Properties) -> bool | None:
        text = properties.get(name)
        return None if text is None else to_bool(text)
    return evaluate


def property_number(name: str, negate: bool) -> NumberOf:
    """The property read as a number (negated for unary minus), None when missing or not one."""
    def number(properties: Properties) -> Number | None:
        text = properties.get(name)
        value = None if text is None else to_number(text)
        return -value if negate and value is not None else value
    return number


def compare_property(name: str, compare: Callable[[Number, Number], bool], literal: Number,
                     ) -> Predicate:
    """`name <op> literal` for `>`, `>=`, `<`, `<=` (and numeric `=` / `<>`): the fast, common
    case, one dict lookup and one conversion."""
    return _converted_property(name, to_number, compare, literal)


def bool_property_equals(name: str, literal: bool, negated: bool) -> Predicate:
    """`name = TRUE|FALSE` (`<>` when `negated`): the property read as a boolean."""
    return _converted_property(name, to_bool, operator.is_not if negated else operator.is_, literal)


def _converted_property(name: str, convert: Callable[[str], T | None], compare: Callable[[T, T], bool],
                        literal: T) -> Predicate:
    """`compare(convert(text), literal)` on the property's text; unknown when the property is
    missing or `convert` gives None."""
    def evaluate(properties: Properties) -> bool | None:
        text = properties.get(name)
        value = None if text is None else convert(text)
        return None if value is None else compare(value, literal)
    return evaluate


def string_equals(name: str, literal: str, negated: bool) -> Predicate:
    """`name = 'literal'` (`<>` when `negated`); unknown when the property is missing."""
    return _text_test(name, operator.eq, literal, negated)


def string_test(name: str, test: Callable[[str, str], bool], literal: str, negated: bool) -> Predicate:
    """`name [NOT] CONTAINS|STARTSWITH|ENDSWITH 'literal'` (RocketMQ 5.x): False for an empty
    literal in both forms, as RocketMQ; unknown when the property is missing."""
    if not literal:
        return constant(False)
    return _text_test(name, test, literal, negated)


def _text_test(name: str, test: Callable[[str, str], bool], literal: str, negated: bool) -> Predicate:
    """`test(text, literal)` on the property's text, inverted when `negated`; unknown when the
    property is missing."""
    def evaluate(properties: Properties) -> bool | None:
        text = properties.get(name)
        if text is None:
            return None
        return test(text, literal) is not negated
    return evaluate


def member_of(name: str, members: frozenset[str], negated: bool) -> Predicate:
    """`name [NOT] IN ('a', 'b')`: unknown when the property is missing. (Not a `_text_test`: the
    membership test stays inline on this common path, `TAGS IN (...)`.)"""
    def evaluate(properties: Properties) -> bool | None:
        text = properties.get(name)
        if text is None:
            return None
        return (text in members) is not negated
    return evaluate


def compare_numbers(left: NumberOf, compare: Callable[[Number, Number], bool], right: NumberOf,
                    ) -> Predicate:
    """`left <op> right` over two number-valued operands; None if either is unknown."""
    return _both_known(left, compare, right)


def properties_equal(left: str, right: str, negated: bool) -> Predicate:
    """Two properties compared as strings."""
    return _both_known(_reader(left), operator.ne if negated else operator.eq, _reader(right))


def _reader(name: str) -> Callable[[Properties], str | None]:
    """The property's text, None when missing."""
    def read(properties: Properties) -> str | None:
        return properties.get(name)
    return read


def predicates_equal(left: Predicate, right: Predicate, negated: bool) -> Predicate:
    """Two conditions compared (`(a > 1) = (b > 2)`, `(a > 1) = TRUE`)."""
    return _both_known(left, operator.is_not if negated else operator.is_, right)


def _both_known(left: Callable[[Properties], T | None], compare: Callable[[T, T], bool],
                right: Callable[[Properties], T | None]) -> Predicate:
    """`compare(left, right)` over two operands read from the properties; None if either is None
    (`right` is not read when `left` is None)."""
    def evaluate(properties: Properties) -> bool | None:
        a = left(properties)
        if a is None:
            return None
        b = right(properties)
        if b is None:
            return None
        return compare(a, b)
    return evaluate


def between(value: NumberOf, low: NumberOf, high: NumberOf, negated: bool) -> Predicate:
    """`value [NOT] BETWEEN low AND high` (inclusive); unknown when any operand is unknown."""
    def evaluate(properties: Properties) -> bool | None:
        v = value(properties)
        if v is None:
            return None
        lo = low(properties)
        hi = high(properties)
        if lo is None or hi is None:
            return None
        return (lo <= v <= hi) is not negated
    return evaluate


def is_null(value: Callable[[Properties], object], negated: bool) -> Predicate:
    """`x IS [NOT] NULL`: never unknown."""
    def evaluate(properties: Properties) -> bool | None:
        return (value(properties) is None) is not negated
    return evaluate
