"""`chaos.twins`: the C modules agree with their Python twins on a fixed draw of random and mutated
cases, every function sees cases it takes itself, and a C function that differs is caught."""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker.store.consume_queue import write_units_py
from chaos import twins
from protocol import frame

needs_c = pytest.mark.skipif(len(twins.c_modules()) < 2,
                             reason="the C modules were not built (no C compiler?) or RQ_PURE_PYTHON is set")


@needs_c
@pytest.mark.parametrize("seed", [3, 4])
def test_c_and_python_agree_on_a_fixed_draw(seed: int) -> None:
    counts = twins.run(seed, cases=1_500 * len(twins.CHECKS))
    assert set(counts) == set(twins.CHECKS)
    for name, (drawn, compared) in counts.items():
        assert drawn == 1_500
        assert compared > 100, f"{name}: the C function took only {compared} of {drawn} cases"


class _WritesOneByteMore:
    """write_units that writes what the twin writes, plus a stray byte after the run."""

    @staticmethod
    def write_units(buffer: bytearray, position: int, units: list[tuple[int, int, int]]) -> bool:
        write_units_py(buffer, position, units)
        end = position + 20 * len(units)
        if end < len(buffer):
            buffer[end] ^= 0xFF
        return True


class _DropsTheLastFrame:
    @staticmethod
    def decode_frames(buffer: bytes, max_frame_bytes: int) -> Any:
        commands, consumed = frame.decode_frames_py(buffer, max_frame_bytes)
        return commands[:-1], consumed


def test_a_c_function_that_differs_is_caught() -> None:
    rng = random.Random(1)
    with pytest.raises(twins.Divergence, match="write_units"):
        for _ in range(200):
            twins.check_write_units(rng, _WritesOneByteMore)
    with pytest.raises(twins.Divergence, match="decode_frames"):
        for _ in range(200):
            twins.check_decode_frames(rng, _DropsTheLastFrame)


def test_mutations_change_the_input_and_stay_reproducible() -> None:
    data = bytes(range(64))
    first = [twins.mutate(random.Random(seed), data) for seed in range(50)]
    assert first == [twins.mutate(random.Random(seed), data) for seed in range(50)]
    assert sum(mutated != data for mutated in first) >= 45


def test_run_takes_one_budget_and_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        twins.run(1)
    with pytest.raises(ValueError):
        twins.run(1, cases=10, seconds=1.0)
    monkeypatch.setattr(twins, "c_modules", dict)
    with pytest.raises(RuntimeError, match=r"protocol\._speedups"):
        twins.run(1, cases=10, only=["decode_frames"])
