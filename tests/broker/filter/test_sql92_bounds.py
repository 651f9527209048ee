"""SQL92 bounds (length, nesting, AND / OR terms) checked before and after parsing, long chains
compiled without recursion, and the compile cache bounded by bytes, not only by count."""

from __future__ import annotations

import gc
import time
import tracemalloc

import pytest

from broker.filter.compile_cache import CompileCache
from broker.filter.filter_manager import FilterManager
from broker.filter.sql92 import compile_expression
from broker.filter.sql92.bounds import Sql92Limits, prescan
from broker.filter.sql92.errors import FilterTooComplex
from protocol.errors import SubscriptionParseFailed


def _or_chain(terms: int) -> str:
    return " OR ".join(f"a = {i}" for i in range(terms))


def _in_list(tag: str, members: int) -> str:
    return "a IN (" + ", ".join(f"'{tag}-{i:06d}'" for i in range(members)) + ")"


@pytest.mark.parametrize(("text", "bound", "column"), [
    (_or_chain(100_000), "sql92_max_expression_bytes", 65_537),
    ("(" * 10_000 + "a = 1" + ")" * 10_000, "sql92_max_depth", 65),
    (_or_chain(2_000), "sql92_max_terms", 11_176),     # the 1,024th OR
    ("NOT " * 65 + "a", "sql92_max_depth", 257),           # the 65th NOT
    ("a > " + "- " * 70 + "1", "sql92_max_depth", 0),
])
def test_expressions_over_a_bound_are_refused_quickly_naming_it(text: str, bound: str, column: int) -> None:
    started = time.perf_counter()
    with pytest.raises(FilterTooComplex) as caught:
        compile_expression(text)
    assert time.perf_counter() - started < 1.0
    error = caught.value
    assert isinstance(error, SubscriptionParseFailed) and error.bound == bound
    assert bound in error.remark and "this broker accepts at most" in error.remark
    assert column == 0 or error.column == column
    assert len(error.remark) < 1_000                  # the caret line is cut around the column


def test_the_prescan_skips_strings_comments_and_between() -> None:
    limits = Sql92Limits(max_depth=2, max_terms=3)
    prescan("s = '((((((' AND t = 'x OR y OR z OR w' -- ((( OR OR OR\n AND /* (((( AND */ u = 1", limits)
    prescan("a BETWEEN 1 AND 2 AND b BETWEEN 3 AND 4 AND c = 1", limits)
    with pytest.raises(FilterTooComplex, match="sql92_max_terms"):
        prescan("a = 1 OR b = 1 OR c = 1 OR d = 1", limits)
    with pytest.raises(FilterTooComplex, match="sql92_max_depth"):
        prescan("((( a = 1 )))", limits)
    with pytest.raises(FilterTooComplex, match="sql92_max_expression_bytes"):
        prescan("s = '" + "é" * 40_000 + "'")          # 80,006 bytes in 40,006 characters


def test_depth_and_term_bounds_admit_what_they_name() -> None:
    assert compile_expression("(" * 64 + "a = 1" + ")" * 64).evaluate({"a": "1"}) is True
    assert compile_expression("NOT " * 63 + "a").evaluate({"a": "true"}) is False
    chain = compile_expression(_or_chain(1_024))     # 1,023 ORs: no recursion per operand
    assert chain.evaluate({"a": "1023"}) is True and chain.evaluate({"a": "-1"}) is False
    assert chain.evaluate({}) is None
    both = compile_expression(" AND ".join(f"a <> {i}" for i in range(1_000)))
    assert both.evaluate({"a": "5000"}) is True and both.evaluate({"a": "999"}) is False


def test_chains_keep_their_fully_parenthesised_canonical_form() -> None:
    assert compile_expression("a = 1 OR b = 2 OR c = 3").canonical == "(((a = 1) OR (b = 2)) OR (c = 3))"
    assert compile_expression("a = 1 AND b = 2 OR c = 3 AND d = 4 AND e = 5").canonical == \
        "(((a = 1) AND (b = 2)) OR (((c = 3) AND (d = 4)) AND (e = 5)))"


def test_the_cache_is_bounded_by_bytes_and_evicts_least_recently_used() -> None:
    small = [compile_expression(f"a = {i}") for i in range(3)]
    evicted: list[str] = []
    cache = CompileCache(max_bytes=sum(e.size_bytes for e in small[:2]), on_evict=evicted.append)
    cache.put(small[0].text, small[0])
    cache.put(small[1].text, small[1])
    assert cache.get(small[0].text) is small[0]        # now the most recently used
    cache.put(small[2].text, small[2])
    assert evicted == [small[1].text] and small[1].text not in cache
    assert cache.size_bytes <= sum(e.size_bytes for e in small[:2])


def test_distinct_large_in_lists_keep_the_filter_manager_under_its_byte_bound() -> None:
    """40 distinct 1.1 MB IN lists kept 760 MB; now 24 distinct ~16 KiB lists (the byte bound
    refuses 1.1 MB) stay within a 512 KiB cache, and what Python holds for them stays near it."""
    filters = FilterManager(sql92_enabled=True, cache_bytes=512 * 1024)
    texts = [_in_list(f"list{n}", 1_000) for n in range(24)]
    gc.collect()
    tracemalloc.start()
    try:
        for n, text in enumerate(texts):
            filters.register("g", f"topic-{n % 3}", n, text)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert filters.compiled.size_bytes <= 512 * 1024
    assert 0 < len(filters.compiled) < 24
    assert held < 2 * 512 * 1024, f"{held:,} bytes held"
    assert filters.index.registered_count == len(filters.compiled)     # evicted ones left the index too
