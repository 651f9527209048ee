"""The fuzzer's frames: well-framed random requests decode; mutated ones decode or raise FrameError."""

from __future__ import annotations

import random

from chaos.fuzz import mutated_frame, random_frame
from protocol.errors import FrameError
from protocol.frame import FrameDecoder


def test_random_frames_are_well_framed_and_mutated_ones_fail_cleanly() -> None:
    rng = random.Random(5)
    decoder = FrameDecoder()
    frames = [random_frame(rng) for _ in range(2_000)]
    assert len(decoder.feed(b"".join(frames))) == 2_000
    failures = 0
    for _ in range(500):
        try:
            FrameDecoder(max_frame_bytes=1 << 24).feed(mutated_frame(rng))
        except FrameError:
            failures += 1
    assert failures > 100
