"""`chaos.sanitize` without its minutes-long runs: what it copies, and a compiler without sanitizer
runtimes (an error, or a skip with `--if-available`, as CI asks), for both kinds of build."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chaos import sanitize


def test_the_copy_holds_the_sources_and_tests_but_no_builds_or_stores() -> None:
    names = {str(path.relative_to(sanitize.ROOT)) for path in sanitize.tracked_files(sanitize.ROOT)}
    for needed in ("setup.py", "pyproject.toml", "protocol/_speedups.c", "protocol/_msgpack.h",
                   "broker/store/_records.c", "broker/store/_fsync.c", "chaos/twins.py"):
        assert needed in names
    for tests in (*sanitize.TESTS, *sanitize.TSAN_TESTS):        # a test file, or a directory of them
        assert tests in names or any(name.startswith(tests + "/test_") for name in names), tests
    assert not any(name.startswith((".venv/", ".git/", "store/")) or name.endswith(".so") for name in names)


@pytest.mark.parametrize(("flags", "name"), [((), "AddressSanitizer/UBSan"), (("--thread",), "ThreadSanitizer")])
def test_a_compiler_without_sanitizer_runtimes_is_an_error_unless_if_available(flags: tuple[str, ...],
                                                                              name: str) -> None:
    assert sanitize.runtimes("/nonexistent/cc") is None
    assert sanitize.runtimes("/nonexistent/cc", sanitize.THREAD.runtime_names) is None
    env = {**os.environ, "CC": "/nonexistent/cc"}
    strict = subprocess.run([sys.executable, "-m", "chaos.sanitize", *flags], env=env, capture_output=True,
                            text=True, timeout=60)
    assert strict.returncode == 2
    assert f"no {name} runtime" in strict.stderr
    lenient = subprocess.run([sys.executable, "-m", "chaos.sanitize", "--if-available", *flags], env=env,
                             capture_output=True, text=True, timeout=60)
    assert lenient.returncode == 0
