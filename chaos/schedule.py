"""The fault schedule of a chaos run: pure, seeded, printable and replayable (`--seed`).

Each cycle lets traffic run for `run_s` seconds, then applies one fault:
- `broker-kill`: SIGKILL the broker, restart it on the same port and store;
- `broker-stop`: SIGSTOP the broker for `pause_s` seconds, then SIGCONT;
- `consumer-kill`: SIGKILL consumer process `target` (an index into the consumers), restart it;
- `clean-restart`: stop the broker and every consumer with SIGTERM, start them all again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULTS = ("broker-kill", "broker-stop", "consumer-kill", "clean-restart")


@dataclass(frozen=True, slots=True)
class FaultStep:
    cycle: int
    run_s: float        # traffic before the fault
    fault: str          # one of FAULTS
    target: int         # consumer index for consumer-kill, else 0
    pause_s: float      # SIGSTOP duration for broker-stop, else 0

    def describe(self) -> str:
        detail = {"broker-stop": f" for {self.pause_s:.1f} s", "consumer-kill": f" #{self.target}"}
        return f"cycle {self.cycle:2d}: run {self.run_s:.1f} s, then {self.fault}{detail.get(self.fault, '')}"


def fault_schedule(seed: int, cycles: int, consumers: int, *,
                   run_s: tuple[float, float] = (2.0, 5.0)) -> list[FaultStep]:
    """`cycles` steps drawn from `random.Random(seed)`; the first four cycles cover every fault once
    (in a seeded order) so even a short run exercises each kind. Same arguments, same schedule."""
    rng = random.Random(seed)
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    steps = []
    for cycle in range(cycles):
        fault = kinds[cycle] if cycle < len(kinds) else rng.choice(FAULTS)
        steps.append(FaultStep(
            cycle=cycle + 1, run_s=round(rng.uniform(*run_s), 1), fault=fault,
            target=rng.randrange(consumers) if fault == "consumer-kill" else 0,
            pause_s=round(rng.uniform(2.0, 4.0), 1) if fault == "broker-stop" else 0.0))
    return steps
