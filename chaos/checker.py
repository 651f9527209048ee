"""The chaos checker: pure. Compares every acknowledged send with every delivery.

Concurrent group: `lost` = acknowledged keys never delivered; `duplicates` = deliveries beyond the
first of a key (allowed: at-least-once). Orderly group: keys `o:<shard>:<seq>`, each shard sent in
sequence (the next only after the previous was acknowledged); `reorderings` counts first
deliveries of a shard that come after the first delivery of a later sequence number of the same
shard. Redelivery of an earlier stretch after a crash (5 6 7 5 6 7 8) is duplicates, not
reordering, as in RocketMQ's at-least-once orderly consumption."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupResult:
    acknowledged: int
    delivered: int          # deliveries, duplicates included
    lost: int
    duplicates: int
    reorderings: int
    lost_examples: tuple[str, ...]


def check_group(acknowledged: Iterable[str], deliveries: Iterable[str], *, orderly: bool = False) -> GroupResult:
    acked = set(acknowledged)
    counts: Counter[str] = Counter()
    reorderings = 0
    last_first_seq: dict[str, int] = {}
    for key in deliveries:
        counts[key] += 1
        if orderly and counts[key] == 1:
            _, shard, seq_text = key.split(":")
            seq = int(seq_text)
            if seq < last_first_seq.get(shard, -1):
                reorderings += 1
            last_first_seq[shard] = max(seq, last_first_seq.get(shard, -1))
    lost = sorted(acked - counts.keys())
    return GroupResult(acknowledged=len(acked), delivered=sum(counts.values()), lost=len(lost),
                       duplicates=sum(n - 1 for n in counts.values()), reorderings=reorderings,
                       lost_examples=tuple(lost[:10]))
