"""broker.host: the cpuidle state read from a sysfs tree, and the start warning when every idle
moment halts the vCPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.host import CpuIdle, cpu_idle, warn_if_idle_halts


def _sysfs(root: Path, driver: str | None, poll: str | None) -> Path:
    if driver is not None:
        path = root / "devices/system/cpu/cpuidle/current_driver"
        path.parent.mkdir(parents=True)
        path.write_text(driver + "\n")
    if poll is not None:
        path = root / "module/haltpoll/parameters/guest_halt_poll_ns"
        path.parent.mkdir(parents=True)
        path.write_text(poll + "\n")
    return root


@pytest.mark.parametrize(("driver", "poll", "expected", "halts", "polling_applies"), [
    ("haltpoll", "0", CpuIdle("haltpoll", 0), True, True),
    ("haltpoll", "200000", CpuIdle("haltpoll", 200_000), False, True),
    ("intel_idle", None, CpuIdle("intel_idle", None), False, False),
    (None, None, CpuIdle(None, None), False, False),
    ("haltpoll", "garbage", CpuIdle("haltpoll", None), False, False),
    # a KVM guest whose kernel has the haltpoll module but did not load its driver (no REALTIME
    # hint): the parameter is there and governs nothing
    ("none", "200000", CpuIdle("none", 200_000), False, False),
])
def test_cpu_idle_reads_the_driver_and_halt_polling(tmp_path: Path, driver: str | None, poll: str | None,
                                                     expected: CpuIdle, halts: bool, polling_applies: bool) -> None:
    state = cpu_idle(_sysfs(tmp_path, driver, poll))
    assert state == expected
    assert state.halts_at_once is halts
    assert state.halt_polling_in_effect is polling_applies


def test_warns_only_when_every_idle_moment_halts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    halting = _sysfs(tmp_path / "a", "haltpoll", "0")
    polling = _sysfs(tmp_path / "b", "haltpoll", "200000")
    with caplog.at_level(logging.WARNING, logger="broker.host"):
        assert warn_if_idle_halts(polling) is False
        assert not caplog.records
        assert warn_if_idle_halts(halting) is True
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "guest_halt_poll_ns" in record.getMessage()
