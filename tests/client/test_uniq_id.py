"""UNIQ_KEY generation: one at a time and a batch's ids at once share one layout."""

from __future__ import annotations

import re

from client.producer.uniq_id import UniqIdGenerator

_ID = re.compile(r"^[0-9A-F]{32}$")


def test_batch_ids_follow_the_single_ids_layout_and_counter() -> None:
    generator = UniqIdGenerator("10.1.2.3")
    single = generator.next_id()
    batch = generator.next_ids(5)
    assert all(_ID.match(i) for i in [single, *batch])
    assert [i[:12] for i in batch] == [single[:12]] * 5           # ip, pid: the same producer
    assert [int(i[-4:], 16) for i in batch] == [(int(single[-4:], 16) + n) & 0xFFFF for n in range(1, 6)]
    assert len({single, *batch}) == 6


def test_the_counter_wraps_at_16_bits_inside_a_batch() -> None:
    generator = UniqIdGenerator("10.1.2.3")
    generator.next_ids(0xFFFE)
    batch = generator.next_ids(4)
    assert [int(i[-4:], 16) for i in batch] == [0xFFFE, 0xFFFF, 0, 1]
    assert int(generator.next_id()[-4:], 16) == 2


def test_a_non_ipv4_host_uses_loopback() -> None:
    assert UniqIdGenerator("::1").next_id().startswith("7F000001")
