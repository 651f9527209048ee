"""The fault schedule of a chaos run: pure, seeded, printable and replayable (`--seed`).

Each cycle lets traffic run for `run_s` seconds, then applies one fault:
- `broker-kill`: SIGKILL the broker, restart it on the same port and store;
- `broker-stop`: SIGSTOP the broker for `pause_s` seconds, then SIGCONT;
- `consumer-kill`: SIGKILL consumer process `target` (an index into the consumers), restart it;
- `clean-restart`: stop the broker and every consumer with SIGTERM, start them all again;
- `unread-pulls`: for `pause_s` seconds, connections pipeline pulls of large messages and never read
  the answers (`chaos.unread_pulls`);
- `heartbeat-flood`: for `pause_s` seconds, fake client ids heartbeat into the consumers' groups
  (`chaos.heartbeat_flood`);
- `topic-create-kill`: topics created and sent to, then kill -9 within 1 s, for `pause_s` seconds
  of such cycles (`chaos.topic_create_kill`);
- `disk-fill`: another process fills the file system of the broker's store for `pause_s` seconds,
  then a restart on the full disk (`chaos.disk_fill`; only when the store is on a small file system
  of its own, see `chaos.run`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

FAULTS = ("broker-kill", "broker-stop", "consumer-kill", "clean-restart", "unread-pulls", "heartbeat-flood",
          "topic-create-kill", "disk-fill")
TIMED_FAULTS = frozenset({"broker-stop", "unread-pulls", "heartbeat-flood", "topic-create-kill", "disk-fill"})


@dataclass(frozen=True, slots=True)
class FaultStep:
    cycle: int
    run_s: float        # traffic before the fault
    fault: str          # one of FAULTS
    target: int         # consumer index for consumer-kill, else 0
    pause_s: float      # how long a timed fault lasts (TIMED_FAULTS), else 0

    def describe(self) -> str:
        detail = f" for {self.pause_s:.1f} s" if self.fault in TIMED_FAULTS else ""
        if self.fault == "consumer-kill":
            detail = f" #{self.target}"
        return f"cycle {self.cycle:2d}: run {self.run_s:.1f} s, then {self.fault}{detail}"


def fault_schedule(seed: int, cycles: int, consumers: int, *, run_s: tuple[float, float] = (2.0, 5.0),
                   kinds: Sequence[str] = FAULTS) -> list[FaultStep]:
    """`cycles` steps drawn from `random.Random(seed)` among `kinds` (default every fault); the first
    `len(kinds)` cycles cover every kind once (in a seeded order) so even a short run exercises
    each. Same arguments, same schedule. Raises `ValueError` for an unknown kind."""
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULTS)}")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    steps = []
    for cycle in range(cycles):
        fault = order[cycle] if cycle < len(order) else rng.choice(list(kinds))
        steps.append(FaultStep(
            cycle=cycle + 1, run_s=round(rng.uniform(*run_s), 1), fault=fault,
            target=rng.randrange(consumers) if fault == "consumer-kill" else 0,
            pause_s=round(rng.uniform(2.0, 4.0), 1) if fault in TIMED_FAULTS else 0.0))
    return steps
