"""What the machine under the broker does when a CPU is idle, and the warning the broker logs at
start when that costs every request.

A Linux guest with the `haltpoll` cpuidle driver (KVM, Firecracker) polls for
`guest_halt_poll_ns` before it halts an idle vCPU. With 0 (some VM images boot with
`haltpoll.guest_halt_poll_ns=0`) every idle moment halts it: a request that arrives while the
vCPU is halted waits for the host to resume it and then runs with cold caches and branch
predictors. A broker serving one request at a time is idle between any two, so it pays that on
each. On the development VM that doubled the CPU of a one-at-a-time send, for rocketq and Redis
alike (docs/performance.md, "Per-request cost": 72 → 29 µs of broker CPU per send with 200 µs of polling).
Redis warns at start about kernel settings that cost it (transparent huge pages, overcommit);
this is the same kind of warning. Nothing is changed: the setting is the machine owner's."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SYS_ROOT = Path("/sys")
_DRIVER = Path("devices/system/cpu/cpuidle/current_driver")
_HALT_POLL_NS = Path("module/haltpoll/parameters/guest_halt_poll_ns")


@dataclass(frozen=True, slots=True)
class CpuIdle:
    """`driver`: the cpuidle driver (None when Linux does not say); `guest_halt_poll_ns`: how long
    the `haltpoll` driver polls before halting a vCPU (None without that driver's module)."""

    driver: str | None
    guest_halt_poll_ns: int | None

    @property
    def halts_at_once(self) -> bool:
        """True when every idle moment halts the vCPU (haltpoll with no polling)."""
        return self.driver == "haltpoll" and self.guest_halt_poll_ns == 0

    @property
    def halt_polling_in_effect(self) -> bool:
        """True when `guest_halt_poll_ns` governs idle vCPUs: only under the `haltpoll` driver. A
        kernel that has the module's parameters but another driver, or none (a KVM guest without
        the REALTIME hint, unless booted with `cpuidle_haltpoll.force=1`), halts an idle vCPU
        through its default idle whatever the parameter says (on such a Firecracker VM, November
        26, a spinning SCHED_IDLE process on each vCPU in place of polling moved no single-request
        row beyond the noise: docs/performance.md, "A new machine")."""
        return self.driver == "haltpoll" and self.guest_halt_poll_ns is not None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def cpu_idle(sys_root: Path = SYS_ROOT) -> CpuIdle:
    """The machine's cpuidle driver and halt polling, read from sysfs under `sys_root`; never raises
    (missing or unreadable files give None)."""
    poll = _read(sys_root / _HALT_POLL_NS)
    return CpuIdle(driver=_read(sys_root / _DRIVER),
                   guest_halt_poll_ns=int(poll) if poll is not None and poll.isdigit() else None)


def warn_if_idle_halts(sys_root: Path = SYS_ROOT) -> bool:
    """Log a WARNING (and return True) when every idle moment halts this machine's vCPUs."""
    state = cpu_idle(sys_root)
    if not state.halts_at_once:
        return False
    log.warning("this virtual machine halts a vCPU at every idle moment (cpuidle driver haltpoll, "
                "guest_halt_poll_ns 0): a request that finds the broker idle waits for the host to "
                "resume it and runs cold, about twice the CPU per request when clients send one at a "
                "time. To poll briefly first (root, costs idle host CPU): echo 200000 > "
                "/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    return True
