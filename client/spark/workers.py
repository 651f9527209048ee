"""`check_workers`: does the Python that Spark starts for its workers see rocketq's client?

Spark runs a data source's planning and tasks in Python workers started with `spark.pyspark.python`,
else $PYSPARK_PYTHON, else the `python3` on PATH — often not the virtualenv's interpreter the driver
runs in, when that was started without activating the virtualenv. Such a worker fails on its first
`import msgpack` deep inside a Java stack trace; this turns that into one error saying what to do."""

from __future__ import annotations

import os
import re
from typing import Any

from pyspark.sql import SparkSession

_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
PROBE_MODULE = "client.spark.queues"     # imports everything a task needs: msgpack, uvloop, pyarrow, ours


class WorkerPythonError(RuntimeError):
    """Spark's Python workers cannot import the client; names the worker Python (`worker_python`)
    and the module it misses (`module`)."""

    def __init__(self, worker_python: str, module: str) -> None:
        super().__init__(
            f"Spark's Python workers ({worker_python}) cannot import rocketq's client: no module named "
            f"{module!r}. Start Spark with PYSPARK_PYTHON set to the Python that has rocketq installed "
            "(e.g. PYSPARK_PYTHON=$VIRTUAL_ENV/bin/python, or the spark.pyspark.python setting), or create "
            "the session with client.spark.session.local_session, which does so.")
        self.worker_python, self.module = worker_python, module


def worker_python(spark: SparkSession) -> str:
    """The interpreter Spark starts its Python workers with, as Spark picks it."""
    configured = spark.sparkContext.getConf().get("spark.pyspark.python")
    return configured or spark.sparkContext.pythonExec or os.environ.get("PYSPARK_PYTHON") or "python3"


def check_workers(spark: SparkSession) -> None:
    """Run one one-row task that imports `PROBE_MODULE` in a Python worker; raises
    `WorkerPythonError` when the worker misses a module (the task's other errors propagate)."""
    def probe(_: Any) -> str:                  # nested: pickled by value, so unpickling imports nothing of ours
        import importlib
        import sys
        importlib.import_module("client.spark.queues")    # PROBE_MODULE, spelled out: no global to pickle
        return sys.executable

    try:
        spark.sparkContext.parallelize([0], 1).map(probe).collect()
    except Exception as exc:
        missing = _MISSING_MODULE.search(str(exc))
        if missing is None:
            raise
        raise WorkerPythonError(worker_python(spark), missing[1]) from None
