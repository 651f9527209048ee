"""SQL92 selectors, table-driven over the whole grammar (REFERENCE.md §6 with PROTOCOL.md's
deliberate differences 2-4): literals and escapes, every operator, IS [NOT] NULL, [NOT] IN,
[NOT] BETWEEN, three-valued logic with missing properties, type conversion, precedence, and
errors with their positions."""

from __future__ import annotations

import pytest

from broker.filter.sql92 import FilterSyntaxError, compile_expression
from protocol.errors import SubscriptionParseFailed

P = {"a": "3.5", "n": "10", "s": "hello", "t": "TRUE", "f": "false", "e": "", "q": "it's",
     "neg": "-4", "big": "9223372036854775807", "ws": " 7 ", "word": "abc", "TAGS": "paid"}

# (expression, result over P): None is unknown (does not match)
CASES: list[tuple[str, bool | None]] = [
    # literals and escapes
    ("TRUE", True), ("false", False), ("NULL", None), ("tRuE", True),
    ("s = 'hello'", True), ("q = 'it''s'", True), ("'it''s' = q", True), ("e = ''", True),
    ("s = 'HELLO'", False), ("n = 10", True), ("n = 10L", True), ("n = 10l", True), ("n = 10.0", True),
    ("n = 1e1", True), ("n = 1E+1", True), ("a = 35e-1", True), ("a = .35E1", True), ("n > 0.0", True),
    ("n = 0", False), ("big = 9223372036854775807", True), ("neg = -4", True), ("neg = - 4", True),
    ("neg = -(4)", True), ("n = +10", True), ("n = - -10", True), ("n = -(-10)", True),
    ("'abc' = 'abc'", True), ("'abc' <> 'abd'", True), ("'7' = 7", True), ("1 = 1.0", True),
    # comparisons
    ("n > 9", True), ("n > 10", False), ("n >= 10", True), ("n < 11", True), ("n <= 9.99", False),
    ("n <> 10", False), ("n <> 11", True), ("9 < n", True), ("11 <= n", False), ("10 >= n", True),
    ("a > n", False), ("n > a", True), ("a < n", True), ("n = n", True), ("s = word", False),
    ("-n < 0", True), ("-a = -3.5", True), ("+n = 10", True), ("1 < 2", True), ("2.5 >= 3", False),
    # numbers in strings (deliberate difference 4)
    ("a > 3", True), ("a > 3.4", True), ("a = 3.5", True), ("a < 4", True), ("ws = 7", True),
    ("s > 3", None), ("s = 3", None), ("s <> 3", None), ("e > 0", None), ("word <= 1", None),
    ("n = '10'", True), ("n = '10.0'", False),
    # booleans
    ("t = TRUE", True), ("t <> TRUE", False), ("f = FALSE", True), ("f", False), ("t", True),
    ("s = TRUE", None), ("s", None), ("t AND f", False), ("NOT f", True), ("(n > 1) = TRUE", True),
    ("(n > 1) = (a > 100)", False), ("(n > 1) <> FALSE", True), ("TRUE = t", True),
    # IS [NOT] NULL
    ("missing IS NULL", True), ("missing IS NOT NULL", False), ("s IS NULL", False), ("e IS NOT NULL", True),
    ("(missing > 1) IS NULL", True), ("(n > 1) IS NOT NULL", True), ("NULL IS NULL", True),
    ("-missing IS NULL", True), ("1 IS NULL", False),
    # [NOT] IN
    ("TAGS IN ('paid', 'refund')", True), ("TAGS IN ('refund')", False), ("TAGS NOT IN ('refund')", True),
    ("TAGS NOT IN ('paid')", False), ("missing IN ('x')", None), ("missing NOT IN ('x')", None),
    ("q IN ('it''s')", True), ("s in ('HELLO')", False),
    # [NOT] BETWEEN
    ("n BETWEEN 10 AND 20", True), ("n BETWEEN 11 AND 20", False), ("n NOT BETWEEN 11 AND 20", True),
    ("a BETWEEN 3 AND 4", True), ("n NOT BETWEEN 1 AND 10", False), ("missing BETWEEN 1 AND 2", None),
    ("missing NOT BETWEEN 1 AND 2", None), ("s BETWEEN 1 AND 2", None), ("n BETWEEN a AND 20", True),
    ("n BETWEEN 1 AND missing", None), ("n NOT BETWEEN 20 AND 1", True), ("5 BETWEEN 1 AND 9", True),
    # CONTAINS / STARTSWITH / ENDSWITH (5.x)
    ("s CONTAINS 'ell'", True), ("s CONTAINS 'x'", False), ("s NOT CONTAINS 'x'", True),
    ("s STARTSWITH 'he'", True), ("s STARTSWITH 'lo'", False), ("s NOT STARTSWITH 'lo'", True),
    ("s ENDSWITH 'lo'", True), ("s NOT ENDSWITH 'lo'", False), ("s CONTAINS ''", False),
    ("s NOT CONTAINS ''", False), ("missing CONTAINS 'x'", None), ("missing NOT ENDSWITH 'x'", None),
    ("q contains ''''", True),
    # three-valued logic with missing properties
    ("missing = 'x'", None), ("missing <> 'x'", None), ("missing > 1", None), ("NOT missing = 'x'", None),
    ("missing = 'x' AND n = 10", None), ("missing = 'x' AND n = 11", False), ("n = 11 AND missing = 'x'", False),
    ("missing = 'x' OR n = 10", True), ("missing = 'x' OR n = 11", None), ("n = 10 OR missing = 'x'", True),
    ("missing = other", None), ("missing", None), ("NOT missing", None), ("NULL AND FALSE", False),
    ("NULL OR TRUE", True), ("NOT NULL", None), ("(missing > 1) = TRUE", None),
    # precedence: OR < AND < NOT < equality < comparison < unary (NOT is standard, difference 3)
    ("n = 10 OR n = 11 AND n = 12", True), ("(n = 10 OR n = 11) AND n = 12", False),
    ("NOT n = 11", True), ("NOT n = 10 OR s = 'hello'", True), ("NOT (n = 10 OR s = 'hello')", False),
    ("NOT NOT n = 10", True), ("n > 5 = TRUE", True), ("n > 50 = FALSE", True),
    ("NOT n > 5 AND s = 'hello'", False), ("TRUE OR FALSE AND FALSE", True), ("NOT FALSE AND FALSE", False),
    ("n between 1 and 20 and s = 'hello'", True), ("- n > - 11", True),
    # keywords are case-insensitive, names are case-sensitive; comments and whitespace
    ("S = 'hello'", None), ("tags IN ('paid')", None), ("n = 10 -- the rest is a comment", True),
    ("/* lead */ n /* mid */ = 10", True), ("n\n=\t10", True), ("$x IS NULL AND _y IS NULL", True),
]


@pytest.mark.parametrize(("expression", "expected"), CASES)
def test_evaluates(expression: str, expected: bool | None) -> None:
    compiled = compile_expression(expression)
    assert compiled.evaluate(P) is expected
    assert compiled.matches(P) is (expected is True)
    # the canonical form means the same thing
    assert compile_expression(compiled.canonical).evaluate(P) is expected


# (expression, line, column, something the error's `expected` contains)
ERRORS: list[tuple[str, int, int, str]] = [
    # syntax (strict: nothing may follow a complete expression, difference 3)
    ("a = 1 garbage", 1, 7, "end of expression"), ("a = 1)", 1, 6, "end of expression"),
    ("a = ", 1, 5, "a property name"), ("", 1, 1, "a property name"), ("a >", 1, 4, "an integer"),
    ("(a = 1", 1, 7, "')'"), ("a = 'open", 1, 5, "a string literal"), ("a # 1", 1, 3, "an operator"),
    ("a IN ()", 1, 7, "a string literal"), ("a IN (1)", 1, 7, "a string literal"), ("a IN 'x'", 1, 6, "'('"),
    ("a BETWEEN 1", 1, 12, "AND"), ("a = 007", 1, 6, "end of expression"), ("NOT", 1, 4, "a property name"),
    ("a = 1 AND", 1, 10, "NOT"), ("in = 1", 1, 1, "a property name"), ("a.b = 1", 1, 2, "an operator"),
    ("a CONTAINS b", 1, 12, "a string literal"), ("a = 1\n  AND AND", 2, 7, "a property name"),
    ("a == 1", 1, 4, "a property name"), ("a != 1", 1, 3, "an operator"), ("a LIKE 'x%'", 1, 3, "an operator"),
    # types
    ("a > 'x'", 1, 5, "a number"), ("'x' < a", 1, 1, "a number"), ("a > TRUE", 1, 5, "a number"),
    ("a >= NULL", 1, 6, "a number"), ("(a > 1) > 2", 1, 2, "a number"), ("a BETWEEN 'x' AND 2", 1, 11, "a number"),
    ("a = NULL", 1, 5, "a value other than NULL"), ("NULL <> a", 1, 1, "a value other than NULL"),
    ("TRUE = 'x'", 1, 8, "a value comparable with TRUE"), ("(a > 1) = 3", 1, 11, "a value comparable with (a > 1)"),
    ("'x' IN ('x')", 1, 1, "a property name"), ("(a = 1) NOT IN ('x')", 1, 2, "a property name"),
    ("1 CONTAINS 'x'", 1, 1, "a property name"), ("-'x' = 1", 1, 2, "a number"),
    ("1", 1, 1, "a condition"), ("'x'", 1, 1, "a condition"), ("a = 1 AND 2", 1, 11, "a condition"),
    ("NOT 'x'", 1, 5, "a condition"), ("-a", 1, 1, "a condition"),
    # ranges
    ("a > 9223372036854775808", 1, 5, "an integer up to 9223372036854775807"),
    ("a > 1e400", 1, 5, "a finite number"), ("a BETWEEN 5 AND 1", 1, 11, "a lower bound <= 1"),
]


@pytest.mark.parametrize(("expression", "line", "column", "expected"), ERRORS)
def test_errors_carry_position_and_expectation(expression: str, line: int, column: int, expected: str) -> None:
    with pytest.raises(FilterSyntaxError) as caught:
        compile_expression(expression)
    err = caught.value
    assert (err.line, err.column) == (line, column), err.remark
    assert expected in err.expected, err.expected
    assert isinstance(err, SubscriptionParseFailed)
    assert f"line {line}, column {column}" in err.remark
    source_line, caret_line = err.caret().split("\n")
    assert caret_line.index("^") - 2 == column - 1
    assert source_line[2:] == expression.split("\n")[line - 1]


def test_properties_read_and_canonical_form() -> None:
    compiled = compile_expression("TAGS IN ('paid','refund') and NOT amount <= 100 or x is null")
    assert compiled.properties == frozenset({"TAGS", "amount", "x"})
    assert compiled.canonical == "(((TAGS IN ('paid', 'refund')) AND (NOT (amount <= 100))) OR (x IS NULL))"
    assert compile_expression("TRUE").properties == frozenset()


def test_not_between_accepts_reversed_literal_bounds() -> None:
    """RocketMQ checks low <= high only for BETWEEN; NOT BETWEEN 5 AND 1 is always true."""
    assert compile_expression("n NOT BETWEEN 5 AND 1").evaluate({"n": "3"}) is True


@pytest.mark.parametrize(("value", "expected"), [
    ("3", True), ("+3", True), ("0003", True), ("3.0", True), ("3e0", True), (" 3\t", True), ("inf", False),
    ("-inf", True), ("nan", None), ("1_0", None), ("three", None), ("", None), ("0x3", None),
])
def test_number_reading_of_property_texts(value: str, expected: bool | None) -> None:
    assert compile_expression("v <= 3").evaluate({"v": value}) is expected


def test_large_integers_compare_exactly() -> None:
    expression = compile_expression("v > 9007199254740992")       # 2**53: a float would say False
    assert expression.evaluate({"v": "9007199254740993"}) is True
    assert expression.evaluate({"v": "9007199254740992"}) is False
