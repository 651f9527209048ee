"""The broker's instructions per request, counted by valgrind: `python -m bench.instructions send
[--auth] [--trace off] [--count N]` (any `bench.inproc` mode and options).

Runs `python -m bench.inproc ... --rounds 2` under callgrind, collecting only inside the reads the
harness hands the broker (`feed_one_at_a_time` calls them through `operator.call`, which nothing
else in the broker uses), and prints the instructions per request. Unlike CPU time, the count does
not move with the machine's other load, so two builds or two settings compare to the percent on a
noisy machine. valgrind emulates no SHA extensions: HMAC-SHA256 counts ~8x what it costs on a CPU
with them. About 30 s per 1,000 requests; needs `valgrind` (Debian's package)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys


def instructions_per_request(args: list[str], count: int = 2_000, rounds: int = 2) -> float:
    """Instructions of the broker per request of `bench.inproc args` (`count` requests a round).
    Raises `RuntimeError` when valgrind is missing or its report cannot be read."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    run = subprocess.run([valgrind, "--tool=callgrind", "--toggle-collect=_operator_call*",
                          "--callgrind-out-file=/dev/null", sys.executable, "-m", "bench.inproc", *args,
                          "--rounds", str(rounds), "--count", str(count)], capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise RuntimeError(f"bench.inproc under callgrind failed ({run.returncode}): {run.stderr[-2000:]}")
    return int(found.group(1)) / (count * rounds)


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return
    count = 2_000
    if "--count" in args:
        at = args.index("--count")
        count = int(args[at + 1])
        del args[at:at + 2]
    print(f"{instructions_per_request(args, count):,.0f} instructions per request ({' '.join(args)})")


if __name__ == "__main__":
    main()
