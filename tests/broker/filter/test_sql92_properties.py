"""Property tests of SQL92 evaluation over random expressions and random property maps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.filter.sql92 import compile_expression

NAMES = ("a", "b", "c")
TEXTS = ("0", "1", "-2", "3.5", "10", "1e2", "x", "", "true", "FALSE", "it's", "abc")

properties = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(TEXTS), max_size=len(NAMES))
names = st.sampled_from(NAMES)
numbers = st.sampled_from(("0", "1", "2.5", "-3", "10", "1e1", "0.0"))
strings = st.sampled_from(("''", "'x'", "'abc'", "'it''s'", "'1'", "'true'"))


def _leaf() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds("{} {} {}".format, names, st.sampled_from(("=", "<>", ">", ">=", "<", "<=")), numbers),
        st.builds("{} {} {}".format, names, st.sampled_from(("=", "<>")), strings),
        st.builds("{} {} {}".format, names, st.sampled_from(("=", "<>")), names),
        st.builds("{} {} TRUE".format, names, st.sampled_from(("=", "<>"))),
        st.builds("{} {}BETWEEN {} AND {}".format, names, st.sampled_from(("", "NOT ")), numbers, numbers)
        .filter(lambda text: "NOT" in text or _bounds_ordered(text)),
        st.builds("{} {}IN ({})".format, names, st.sampled_from(("", "NOT ")),
                  st.lists(strings, min_size=1, max_size=3).map(", ".join)),
        st.builds("{} IS {}NULL".format, names, st.sampled_from(("", "NOT "))),
        st.builds("{} {}{} {}".format, names, st.sampled_from(("", "NOT ")),
                  st.sampled_from(("CONTAINS", "STARTSWITH", "ENDSWITH")), strings),
        names, st.sampled_from(("TRUE", "FALSE", "NULL")),
    )


def _bounds_ordered(text: str) -> bool:
    low, high = text.split("BETWEEN ")[1].split(" AND ")
    return float(low) <= float(high)


expressions = st.recursive(
    _leaf(),
    lambda inner: st.one_of(
        st.builds("({}) AND ({})".format, inner, inner),
        st.builds("({}) OR ({})".format, inner, inner),
        st.builds("NOT ({})".format, inner),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(expressions, properties)
def test_not_matches_exactly_where_the_expression_is_false(text: str, props: dict[str, str]) -> None:
    value = compile_expression(text).evaluate(props)
    negated = compile_expression(f"NOT ({text})")
    assert negated.matches(props) is (value is False)
    assert negated.evaluate(props) is (None if value is None else not value)


@settings(max_examples=100, deadline=None)
@given(expressions, expressions, properties)
def test_de_morgan_holds_in_three_valued_logic(left: str, right: str, props: dict[str, str]) -> None:
    both = compile_expression(f"NOT (({left}) AND ({right}))").evaluate(props)
    either = compile_expression(f"(NOT ({left})) OR (NOT ({right}))").evaluate(props)
    assert both is either


@settings(max_examples=100, deadline=None)
@given(expressions, properties)
def test_canonical_form_compiles_to_the_same_predicate(text: str, props: dict[str, str]) -> None:
    compiled = compile_expression(text)
    again = compile_expression(compiled.canonical)
    assert again.canonical == compiled.canonical
    assert again.evaluate(props) is compiled.evaluate(props)
    assert compiled.properties <= set(NAMES)
    # a property the expression does not read cannot change its result
    assert compiled.evaluate({**props, "unread": "1"}) is compiled.evaluate(props)
