"""`python -m chaos [--cycles 20] [--ha-cycles 10] [--seed N] [--workdir DIR] [--kinds KIND,...]`: the chaos
run (`make chaos`), then the HA cycles (`chaos.ha_cycles`; `--cycles 0` runs only those). Prints the
schedule and the reports; exits 1 when a message was lost, duplicated or reordered."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from chaos.ha_cycles import run_ha_cycles
from chaos.run import run_chaos
from chaos.schedule import FAULTS


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--ha-cycles", type=int, default=0, help="HA cycles after the broker cycles (make chaos: 10)")
    parser.add_argument("--seed", type=int, default=None, help="replay a schedule (default: random, printed)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the store and delivery files here")
    parser.add_argument("--kinds", default=",".join(FAULTS), metavar="KIND,...",
                        help=f"the fault kinds to draw from (default all: {', '.join(FAULTS)})")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    with tempfile.TemporaryDirectory(prefix="rocketq-chaos-") as scratch:
        workdir = args.workdir or Path(scratch)
        passed = True
        if args.cycles:
            report = asyncio.run(run_chaos(workdir, cycles=args.cycles, seed=seed,
                                           kinds=[k.strip() for k in args.kinds.split(",") if k.strip()]))
            passed = report.passed
        if args.ha_cycles:
            ha_report = asyncio.run(run_ha_cycles(workdir / "ha", cycles=args.ha_cycles, seed=seed))
            print(ha_report.summary())
            for problem in ha_report.problems:
                print(f"  {problem}")
            passed = passed and ha_report.passed
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
