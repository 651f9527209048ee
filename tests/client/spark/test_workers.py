"""`register(spark)` with Spark's Python workers on an interpreter that lacks the client's
dependencies: one clear error, not a Java stack trace (issue 41). Runs in a subprocess: a
SparkContext's worker Python is fixed for the life of its JVM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.spark.conftest import java_missing

pytestmark = pytest.mark.timeout(300)
BARE_PYTHON = "/usr/bin/python3"
SCRIPT = """
from client.spark import WorkerPythonError
from client.spark.session import local_session
try:
    local_session("rocketq-bare-workers")
except WorkerPythonError as exc:
    print("ERROR", exc.worker_python, exc.module)
    print(exc)
else:
    print("NO ERROR")
"""


def _bare_python_without_msgpack() -> str | None:
    if not os.path.exists(BARE_PYTHON):
        return None
    probe = subprocess.run([BARE_PYTHON, "-c", "import msgpack"], capture_output=True, check=False)
    version = subprocess.run([BARE_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True, check=False).stdout.strip()
    same_minor = version == str(tuple(sys.version_info[:2]))    # Spark refuses a worker of another minor version
    return BARE_PYTHON if probe.returncode != 0 and same_minor else None


def test_register_names_the_worker_python_and_the_fix_when_workers_cannot_import_the_client() -> None:
    reason = java_missing()
    if reason is not None:
        pytest.skip(reason)
    bare = _bare_python_without_msgpack()
    if bare is None:
        pytest.skip(f"no {BARE_PYTHON} of this Python's minor version without msgpack")
    root = str(Path(__file__).parents[3])
    env = {**os.environ, "PYSPARK_PYTHON": bare, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240,
                          check=False)
    first, *rest = done.stdout.splitlines() or ["(no output)"]
    assert first == f"ERROR {bare} msgpack", done.stdout + done.stderr[-2000:]
    message = "\n".join(rest)
    assert "PYSPARK_PYTHON" in message and "client.spark.session.local_session" in message
    assert "Traceback" not in message and "Py4J" not in message
