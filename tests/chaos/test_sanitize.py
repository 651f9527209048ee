"""`chaos.sanitize` without its two-minute run: what it copies, and a compiler without sanitizer
runtimes (an error, or a skip with `--if-available`, as CI asks)."""

from __future__ import annotations

import os
import subprocess
import sys

from chaos import sanitize


def test_the_copy_holds_the_sources_and_tests_but_no_builds_or_stores() -> None:
    names = {str(path.relative_to(sanitize.ROOT)) for path in sanitize.tracked_files(sanitize.ROOT)}
    for needed in ("setup.py", "pyproject.toml", "protocol/_speedups.c", "protocol/_msgpack.h",
                   "broker/store/_records.c", "broker/store/_fsync.c", "chaos/twins.py"):
        assert needed in names
    for tests in sanitize.TESTS:        # a test file, or a directory of them
        assert tests in names or any(name.startswith(tests + "/test_") for name in names), tests
    assert not any(name.startswith((".venv/", ".git/", "store/")) or name.endswith(".so") for name in names)


def test_a_compiler_without_sanitizer_runtimes_is_an_error_unless_if_available() -> None:
    assert sanitize.runtimes("/nonexistent/cc") is None
    env = {**os.environ, "CC": "/nonexistent/cc"}
    strict = subprocess.run([sys.executable, "-m", "chaos.sanitize"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert strict.returncode == 2
    assert "no AddressSanitizer/UBSan runtime" in strict.stderr
    lenient = subprocess.run([sys.executable, "-m", "chaos.sanitize", "--if-available"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert lenient.returncode == 0
