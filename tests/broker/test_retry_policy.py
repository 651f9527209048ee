"""The send-back decision (REFERENCE.md §9): retry with a growing delay, or the DLQ."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.retry_policy import (
    RetryDecision,
    decide,
    decide_for_retry_send,
    dlq_reason,
    max_reconsume_times_of,
)


@pytest.mark.parametrize(("reconsume_times", "delay_level", "maximum", "expected"), [
    (0, 0, 16, RetryDecision("%RETRY%g", 3)),      # 3 + reconsume_times when the request says 0
    (5, 0, 16, RetryDecision("%RETRY%g", 8)),
    (15, 0, 16, RetryDecision("%RETRY%g", 18)),
    (16, 0, 16, RetryDecision("%DLQ%g", 0)),       # the 17th failure: 1 delivery + 16 retries
    (0, 7, 16, RetryDecision("%RETRY%g", 7)),      # the consumer's delay_level_when_next_consume
    (0, -1, 16, RetryDecision("%DLQ%g", 0)),       # a negative level: straight to the DLQ
    (2, 0, 2, RetryDecision("%DLQ%g", 0)),
    (0, 0, 0, RetryDecision("%DLQ%g", 0)),
])
def test_decisions(reconsume_times: int, delay_level: int, maximum: int, expected: RetryDecision) -> None:
    decision = decide(reconsume_times, delay_level, maximum, "g")
    assert decision == expected
    assert decision.to_dlq is (expected.topic == "%DLQ%g")


def test_max_reconsume_times_comes_from_the_request_else_the_group() -> None:
    assert max_reconsume_times_of(None, 16) == 16
    assert max_reconsume_times_of(-1, 16) == 16
    assert max_reconsume_times_of(3, 16) == 3
    assert max_reconsume_times_of(0, 16) == 0


def test_a_retry_send_at_the_maximum_goes_to_the_dlq() -> None:
    assert decide_for_retry_send(16, 16, "g") == "%DLQ%g"
    assert decide_for_retry_send(15, 16, "g") is None


@given(st.integers(0, 100), st.integers(-3, 30), st.integers(0, 50))
def test_a_message_is_retried_exactly_until_the_maximum(reconsume_times: int, delay_level: int,
                                                        maximum: int) -> None:
    decision = decide(reconsume_times, delay_level, maximum, "g")
    assert decision.to_dlq == (reconsume_times >= maximum or delay_level < 0)
    if not decision.to_dlq:
        assert decision.delay_level == (delay_level or 3 + reconsume_times) > 0


@pytest.mark.parametrize(("reconsume_times", "delay_level", "maximum", "expected"), [
    (16, 0, 16, "failed 17 times (max reconsume times 16)"),
    (0, 0, 0, "failed 1 time (max reconsume times 0)"),
    (0, -1, 16, "the consumer sent it to the DLQ (delay level -1)"),
    (16, -1, 16, "failed 17 times (max reconsume times 16)"),     # ran out anyway
])
def test_dlq_reasons(reconsume_times: int, delay_level: int, maximum: int, expected: str) -> None:
    assert decide(reconsume_times, delay_level, maximum, "g").to_dlq
    assert dlq_reason(reconsume_times, delay_level, maximum) == expected
