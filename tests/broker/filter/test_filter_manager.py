"""`FilterManager`: compiled once per text and per (group, topic, sub_version), bounded caches,
TAG / SQL92 / unknown types, and the SQL92 switch; the filters' match rules."""

from __future__ import annotations

import pytest

from broker.filter.filter_manager import FilterManager
from broker.filter.message_filter import RetryMessageFilter, SqlMessageFilter, TagMessageFilter
from broker.filter.sql92 import FilterSyntaxError
from protocol.errors import SubscriptionParseFailed, SystemError_
from protocol.subscription import tags_code


def test_sql_filters_are_cached_per_group_topic_and_version() -> None:
    filters = FilterManager(sql92_enabled=True)
    first = filters.sql_filter("g", "t", 1, "a > 1")
    assert filters.sql_filter("g", "t", 1, "a > 1") is first
    again = filters.sql_filter("g", "t", 2, "a > 1")
    assert again is not first and again.expression is first.expression      # compiled once per text
    assert filters.sql_filter("g", "t", 2, "a < 1").expression.text == "a < 1"  # text changed: rebuilt
    assert isinstance(filters.build("g", "t", "SQL92", "a > 1", 1), SqlMessageFilter)


def test_caches_are_bounded() -> None:
    filters = FilterManager(sql92_enabled=True, max_entries=3)
    built = [filters.sql_filter("g", "t", version, f"a > {version}") for version in range(10)]
    assert filters.sql_filter("g", "t", 9, "a > 9") is built[9]
    assert filters.sql_filter("g", "t", 0, "a > 0") is not built[0]          # evicted, rebuilt


def test_a_bad_expression_is_refused_every_time() -> None:
    filters = FilterManager(sql92_enabled=True)
    for _ in range(2):
        with pytest.raises(FilterSyntaxError) as caught:
            filters.sql_filter("g", "t", 1, "a >")
        assert (caught.value.line, caught.value.column) == (1, 4)


def test_tag_and_unknown_types() -> None:
    filters = FilterManager(sql92_enabled=False)
    assert filters.build("g", "t", None, "*", 0) is None
    assert filters.build("g", "t", "", "", 0) is None
    tag = filters.build("g", "t", "TAG", "A || B", 0)
    assert isinstance(tag, TagMessageFilter) and tag.code_set == {tags_code("A"), tags_code("B")}
    with pytest.raises(SubscriptionParseFailed):
        filters.build("g", "t", "TAG", "||", 0)
    with pytest.raises(SubscriptionParseFailed, match="expression_type"):
        filters.build("g", "t", "CLASS", "x", 0)
    with pytest.raises(SystemError_, match="filter_support_sql92"):
        filters.build("g", "t", "SQL92", "a = 1", 0)
    filters.check("TAG", "A")


def test_sql_filter_matches_only_true() -> None:
    flt = FilterManager(sql92_enabled=True).sql_filter("g", "t", 1, "a > 1")
    assert flt.needs_properties and flt.match_by_consume_queue(12345)
    assert flt.match_by_commit_log({"a": "2"})
    assert not flt.match_by_commit_log({"a": "0"})
    assert not flt.match_by_commit_log({})              # unknown
    assert not flt.match_by_commit_log(None)            # unreadable properties


def test_retry_filter_uses_the_original_topics_filter() -> None:
    orders = FilterManager(sql92_enabled=True).sql_filter("g", "orders", 1, "a > 1")
    retry = RetryMessageFilter(lambda topic: orders if topic == "orders" else None)
    assert retry.match_by_commit_log({"RETRY_TOPIC": "orders", "a": "2"})
    assert not retry.match_by_commit_log({"RETRY_TOPIC": "orders", "a": "0"})
    assert retry.match_by_commit_log({"RETRY_TOPIC": "news", "a": "0"})
    assert retry.match_by_commit_log({"a": "0"}) and retry.match_by_commit_log(None)
