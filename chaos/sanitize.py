"""`python -m chaos.sanitize [--thread] [--seconds S] [--seed N] [--if-available] [--keep]`
(`make sanitize`, `make sanitize-thread`): rocketq's C modules built with AddressSanitizer and
UndefinedBehaviorSanitizer (or, `--thread`, ThreadSanitizer), then run.

In a copy of this checkout (its tracked files, in a temporary directory) the five optional C
modules (`protocol._speedups`, `broker.store._records`, `broker.store._fsync`, `auth._checks`,
`broker.trace._sets`) are built with `-fsanitize=address,undefined`; then, with the sanitizer
runtimes preloaded into the interpreter (and Python's own allocator off, so that the C code's reads
and writes of Python objects are checked too), the tests that drive them (`TESTS`: the protocol and
store suites, and a broker with clients over TCP, bad input included), `python -m chaos.twins` for
`--seconds`, and 100,000 fuzz frames at a broker of its own (`chaos.fuzz`, whose RSS check is off:
ASan keeps freed memory). A sanitizer report (on stderr, which pytest is told not to capture at the
file descriptor: the report is the process's last words; a fuzzed broker's is in the log lines
printed when it stops serving) fails the run; so does a failed test. The C code reads frames
straight off the network: an out-of-bounds read there is a crash or worse, which the twins'
equality alone would not show.

`--thread` builds the same modules with `-fsanitize=thread` instead and runs the tests that drive
`broker.store._fsync`, the one C module with a thread of its own (`TSAN_TESTS`: the store suite,
which starts and stops fsync workers, slow and failing disks included, and brokers taking
SYNC_FLUSH sends over TCP): a data race between that thread and the event loop's calls
(`request`, `note_end`, `take`, `stop`), or a lock taken in two orders, is reported and fails the
run. CPython itself is not instrumented, so only the C modules' own memory accesses are checked;
the locks and threads of both sides are seen through TSan's interceptors. The twins and the frame
fuzz are not run: the other two modules never leave the event loop's thread.

Needs a C compiler with the sanitizer runtimes (`$CC`, default gcc: `gcc -print-file-name=libasan.so`,
`libtsan.so` for `--thread`). Exit codes: 0 clean, 1 a report or a failure, 2 no sanitizer runtime
(0 with `--if-available`, which CI uses: a machine without them skips the run with a note)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("protocol/_speedups", "broker/store/_records", "broker/store/_fsync", "auth/_checks",
           "broker/trace/_sets")
TESTS = ("tests/protocol", "tests/broker/store", "tests/broker/test_batch_decode.py", "tests/chaos/test_twins.py",
         "tests/broker/test_usual_send.py",     # the single send's fields and response (C and twin)
         # a broker and clients over TCP: frames decoded and encoded in C on both sides, bad input
         "tests/broker/test_bad_input.py", "tests/broker/test_send_pull.py", "tests/broker/test_pipelining.py",
         "tests/broker/test_connection_protocol.py", "tests/broker/test_long_polling.py",
         "tests/client/test_producer.py", "tests/chaos/test_fuzz_frames.py",
         # request signatures: canonical bytes, signing and the broker's check (with libcrypto's SHA-256)
         "tests/auth/test_canonical_speedups.py", "tests/auth/test_signing_speedups.py",
         "tests/auth/test_check_signed.py", "tests/auth/test_nonces.py",
         "tests/auth/test_known_key.py", "tests/broker/auth",
         # the message trace's per-message calls (not its timing-bound broker tests: slowed ~10x, a
         # transaction's check-back came twice before its commit in a sanitized CI run)
         "tests/trace/test_sets_twin.py", "tests/trace/test_bounds.py")
# ThreadSanitizer: the tests that start, feed and stop `_fsync.FsyncWorker`s (about 15 s)
TSAN_TESTS = ("tests/broker/store", "tests/broker/test_disk_full.py", "tests/broker/test_send_pull.py",
              "tests/broker/test_pipelining.py")
FUZZ_FRAMES = 100_000      # random and mutated frames at a sanitized broker (chaos.fuzz, ~10 s)
FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g"


@dataclasses.dataclass(frozen=True, slots=True)
class Sanitizer:
    """One kind of sanitized build: its compile and link flags, the runtimes to preload, the symbol
    an instrumented module holds, the run's environment and its tests (and whether the twins and
    the frame fuzz run too)."""

    name: str
    cflags: str
    ldflags: str
    runtime_names: tuple[str, ...]
    marker: bytes
    env: dict[str, str]
    tests: tuple[str, ...]
    fuzzers: bool


ADDRESS = Sanitizer(
    "AddressSanitizer/UBSan", FLAGS, "-fsanitize=address,undefined", ("libasan.so", "libubsan.so"), b"__asan_",
    {"PYTHONMALLOC": "malloc", "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
     "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}, TESTS, fuzzers=True)
THREAD = Sanitizer(
    "ThreadSanitizer", "-fsanitize=thread -fno-omit-frame-pointer -O1 -g", "-fsanitize=thread", ("libtsan.so",),
    b"__tsan_", {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}, TSAN_TESTS, fuzzers=False)
SKIPPED_DIRS = {".git", ".venv", "build", "store", "store-cluster", "pipeline-out", "__pycache__", ".pytest_cache",
                ".mypy_cache", ".ruff_cache", ".hypothesis"}


def runtimes(compiler: str, names: tuple[str, ...] = ADDRESS.runtime_names) -> list[str] | None:
    """The paths of the runtimes `names` (default libasan.so and libubsan.so) `compiler` links
    against, None when it lacks one."""
    found = []
    for name in names:
        try:
            path = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
        if not os.path.isabs(path) or not os.path.exists(path):
            return None
        found.append(path)
    return found


def tracked_files(root: Path) -> list[Path]:
    """The checkout's files: git's tracked (and new, not ignored) files, else every file outside
    the build, store and cache directories."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True, timeout=60).stdout
        return [root / name for name in listed.decode().split("\0") if name and (root / name).is_file()]
    except (OSError, subprocess.SubprocessError):
        files = []
        for directory, subdirs, names in os.walk(root):
            subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS]
            files += [Path(directory, name) for name in names if not name.endswith(".so")]
        return files


def copy_checkout(root: Path, target: Path) -> None:
    for path in tracked_files(root):
        destination = target / path.relative_to(root)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


def step(title: str, command: list[str], cwd: Path, env: dict[str, str]) -> bool:
    print(f"[sanitize] {title}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    ok = subprocess.run(command, cwd=cwd, env=env).returncode == 0
    print(f"[sanitize] {title}: {'ok' if ok else 'FAILED'} ({time.monotonic() - started:.0f} s)", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.sanitize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--thread", action="store_true",
                        help="ThreadSanitizer instead of AddressSanitizer/UBSan: the fsync thread's tests only")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long chaos.twins runs (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="chaos.twins's seed (default 1)")
    parser.add_argument("--if-available", action="store_true",
                        help="exit 0 with a note when the compiler has no sanitizer runtimes")
    parser.add_argument("--keep", action="store_true", help="keep the build directory (printed)")
    args = parser.parse_args()
    compiler = os.environ.get("CC", "gcc")
    kind = THREAD if args.thread else ADDRESS
    preload = runtimes(compiler, kind.runtime_names)
    if preload is None:
        print(f"[sanitize] {compiler} has no {kind.name} runtime ({', '.join(kind.runtime_names)}): "
              "install gcc (Debian: apt-get install gcc) or set CC", file=sys.stderr)
        return 0 if args.if_available else 2
    work = Path(tempfile.mkdtemp(prefix="rocketq-sanitize-"))
    try:
        return _run(work / "rocketq", kind, preload, compiler, args.seconds, args.seed)
    finally:
        if args.keep:
            print(f"[sanitize] kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(copy: Path, kind: Sanitizer, preload: list[str], compiler: str, seconds: float, seed: int) -> int:
    started = time.monotonic()
    copy_checkout(ROOT, copy)
    build_env = {**os.environ, "CC": compiler, "CFLAGS": kind.cflags, "LDFLAGS": kind.ldflags}
    build_env.pop("RQ_PURE_PYTHON", None)
    if not step("build", [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], copy, build_env):
        return 1
    for module in MODULES:      # (the extensions are optional: a failed compile only warns)
        built = list((copy / module).parent.glob(Path(module).name + ".*.so"))
        if not built or kind.marker not in built[0].read_bytes():
            print(f"[sanitize] {module} was not built with {kind.name}", file=sys.stderr)
            return 1
    env = {**build_env, "LD_PRELOAD": " ".join(preload), **kind.env}
    where = [sys.executable, "-c", "import protocol._speedups as s, broker.store._records as r, "
             "broker.store._fsync as f, auth._checks as n, broker.trace._sets as t; "
             "print(s.__file__, r.__file__, f.__file__, n.__file__, t.__file__)"]
    loaded = subprocess.run(where, cwd=copy, env=env, capture_output=True, text=True)
    paths = loaded.stdout.split()
    if loaded.returncode != 0 or len(paths) != len(MODULES) or not all(p.startswith(str(copy)) for p in paths):
        print(f"[sanitize] the sanitized modules are not the ones imported: {loaded.stdout}{loaded.stderr}",
              file=sys.stderr)
        return 1
    ok = step("tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys",
                        *kind.tests], copy, env)
    if kind.fuzzers:
        ok = step("twins", [sys.executable, "-m", "chaos.twins", "--seconds", str(seconds), "--seed", str(seed)],
                  copy, env) and ok
        ok = step("fuzz", [sys.executable, "-m", "chaos.fuzz", "--frames", str(FUZZ_FRAMES), "--seed", str(seed),
                           "--no-rss-check"], copy, env) and ok
    print(f"[sanitize] {kind.name}: {'clean' if ok else 'FAILED (a sanitizer report or a failure above)'} "
          f"({time.monotonic() - started:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
