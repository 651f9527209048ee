"""`python -m chaos [--cycles 20] [--seed N] [--workdir DIR] [--kinds KIND,...]`: the chaos run (`make chaos`).
Prints the schedule and the report; exits 1 when a message was lost or reordered."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from chaos.run import run_chaos
from chaos.schedule import FAULTS


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="replay a schedule (default: random, printed)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the store and delivery files here")
    parser.add_argument("--kinds", default=",".join(FAULTS), metavar="KIND,...",
                        help=f"the fault kinds to draw from (default all: {', '.join(FAULTS)})")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    with tempfile.TemporaryDirectory(prefix="rocketq-chaos-") as scratch:
        workdir = args.workdir or Path(scratch)
        report = asyncio.run(run_chaos(workdir, cycles=args.cycles, seed=seed,
                                       kinds=[k.strip() for k in args.kinds.split(",") if k.strip()]))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
