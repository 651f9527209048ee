"""Tags code (Java String.hashCode), tag expressions (REFERENCE.md §5) and names."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.subscription import is_subscribe_all, parse_tags, tags_code
from protocol.topics import (
    check_group,
    check_topic,
    dlq_topic,
    is_dlq_topic,
    is_retry_topic,
    retry_topic,
)


def utf16_code_units(text: str) -> list[int]:
    """UTF-16 code units, computed from code points (a surrogate pair above the BMP)."""
    units: list[int] = []
    for ch in text:
        point = ord(ch)
        if point < 0x10000:
            units.append(point)
        else:
            point -= 0x10000
            units += [0xD800 + (point >> 10), 0xDC00 + (point & 0x3FF)]
    return units


def java_string_hash_code(text: str) -> int:
    """Java `String.hashCode`: h = 31*h + unit over UTF-16 units, in a signed 32-bit int."""
    h = ctypes.c_int32(0)
    for unit in utf16_code_units(text):
        h = ctypes.c_int32(31 * h.value + unit)
    return h.value


def test_reference_implementation_known_values() -> None:
    assert java_string_hash_code("Aa") == java_string_hash_code("BB") == 2112
    assert java_string_hash_code("TagA") == 2598919
    assert java_string_hash_code("hello world") == 1794106052      # "hello world".hashCode() in Java
    assert java_string_hash_code("polygenelubricants") == -2147483648
    assert utf16_code_units("a\U0001F600") == [0x61, 0xD83D, 0xDE00]


@pytest.mark.parametrize(("tag", "code"), [
    ("Aa", 2112), ("BB", 2112), ("", 0), (None, 0), ("TagA", 2598919), ("*", 42),
    ("polygenelubricants", -2147483648), ("\U0001F600", java_string_hash_code("\U0001F600")),
])
def test_tags_code_known_values(tag: str | None, code: int) -> None:
    assert tags_code(tag) == code


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.text(st.characters(min_codepoint=0x10000), max_size=10)
       | st.text(st.characters(max_codepoint=0x7F), max_size=60))
def test_tags_code_is_java_string_hash_code(tag: str) -> None:
    code = tags_code(tag)
    assert code == java_string_hash_code(tag)
    assert -(2**31) <= code < 2**31


# -- parse_tags ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("expression", "tags"), [
    (None, set()), ("", set()), ("*", set()),
    ("A || B", {"A", "B"}), ("A||B", {"A", "B"}), ("TagA", {"TagA"}),
    (" * ", {"*"}), ("TagA || *", {"TagA", "*"}), (" || ", set()), ("A||", {"A"}), ("A|| ||", {"A"}),
    ("||A", {"A"}), ("A ||  || B", {"A", "B"}), ("\tA\n||\x00B ", {"A", "B"}), ("A|B", {"A|B"}),
    ("|||", {"|"}), ("A || A", {"A"}), ("\u00a0A", {"\u00a0A"}),  # NBSP is not trimmed by Java trim
])
def test_parse_tags_table(expression: str | None, tags: set[str]) -> None:
    assert parse_tags(expression) == frozenset(tags)


@pytest.mark.parametrize("expression", ["||", "||||", "||||||"])
def test_parse_tags_without_any_piece_raises(expression: str) -> None:
    with pytest.raises(ValueError, match="no tag"):
        parse_tags(expression)


TAG = st.text(st.characters(categories=["L", "N"], include_characters="_-%*"), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(TAG, min_size=1, max_size=5), st.text(" \t", max_size=2))
def test_parse_tags_of_joined_tags(tags: list[str], padding: str) -> None:
    expression = (padding + "||" + padding).join(padding + t + padding for t in tags)
    expected = frozenset() if expression == "*" else frozenset(tags)
    assert parse_tags(expression) == expected


def test_is_subscribe_all() -> None:
    assert is_subscribe_all(None) and is_subscribe_all("") and is_subscribe_all("*")
    assert not is_subscribe_all(" * ") and not is_subscribe_all("A || *")


# -- names --------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True))
def test_valid_topic_names(topic: str) -> None:
    assert check_topic(topic) is None
    assert check_group(topic) is None


@pytest.mark.parametrize("topic", [
    "", "a" * 128, "../x", "a/b", "a.b", "a b", "a\n", "a\nb", "\n", "topic\x00", "ü", "a:b", "a\\b",
    None, 5, b"topic", ["t"],
])
def test_invalid_topic_names(topic: object) -> None:
    remark = check_topic(topic)
    assert remark is not None and "topic name" in remark


def test_name_length_limits() -> None:
    assert check_topic("a" * 127) is None
    assert check_topic("a" * 128) is not None
    assert check_group("g" * 255) is None
    remark = check_group("g" * 256)
    assert remark is not None and "group name" in remark and "255" in remark


def test_reserved_topics() -> None:
    assert retry_topic("g") == "%RETRY%g" and is_retry_topic("%RETRY%g") and not is_retry_topic("g")
    assert dlq_topic("g") == "%DLQ%g" and is_dlq_topic("%DLQ%g") and not is_dlq_topic("%RETRY%g")
    assert check_topic(retry_topic("my_group-1")) is None and check_topic(dlq_topic("g")) is None
