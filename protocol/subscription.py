"""Tag-expression helpers both sides need (REFERENCE.md §5). Pure."""

from __future__ import annotations

SUB_ALL = "*"
_JAVA_WHITESPACE_MAX = 0x20


def tags_code(tag: str | None) -> int:
    """Java `String.hashCode()` of `tag`: 31-based over UTF-16 code units with signed 32-bit
    wrap-around; 0 for None or "". RocketMQ stores this in consume queues ("Aa" and "BB" are both
    2112, which is why clients re-check the tag string)."""
    if not tag:
        return 0
    h = 0
    if tag.isascii():
        for ch in tag.encode("ascii"):
            h = (31 * h + ch) & 0xFFFFFFFF
    else:
        units = tag.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def _java_trim(text: str) -> str:
    start, end = 0, len(text)
    while start < end and ord(text[start]) <= _JAVA_WHITESPACE_MAX:
        start += 1
    while end > start and ord(text[end - 1]) <= _JAVA_WHITESPACE_MAX:
        end -= 1
    return text[start:end]


def parse_tags(expression: str | None) -> frozenset[str]:
    """The tag set of a TAG subscription, as RocketMQ's `FilterAPI.buildSubscriptionData`.

    None, "" and exactly "*" subscribe to everything and give an empty set. Otherwise the
    expression is split on "||" (trailing empty pieces dropped, as Java's `split`), each piece
    trimmed (Java `trim`: code points ≤ U+0020) and non-empty pieces kept. "TagA || *" keeps "*" as a
    literal tag; " || " gives an empty set (matches nothing). Raises `ValueError` when the split
    yields no piece at all (e.g. "||"), which a broker answers with SUBSCRIPTION_PARSE_FAILED.
    """
    if expression is None or expression == "" or expression == SUB_ALL:
        return frozenset()
    pieces = expression.split("||")
    while pieces and pieces[-1] == "":
        pieces.pop()
    if not pieces:
        raise ValueError(f"tag expression {expression!r} has no tag")
    return frozenset(t for t in map(_java_trim, pieces) if t)


def is_subscribe_all(expression: str | None) -> bool:
    """True for the expressions that match every message (None, "", "*")."""
    return expression is None or expression == "" or expression == SUB_ALL
