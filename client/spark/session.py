"""`local_session`: a local SparkSession whose Python workers run this interpreter, with `rocketq`
registered — what the tests, the benchmark and the flights pipeline use; `activate`: make a session
the calling thread's active one, where Spark looks a Python data source up."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from client.spark.active import activate

__all__ = ["activate", "local_session"]


def local_session(app_name: str, *, master: str = "local[2]", shuffle_partitions: int = 2,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A (new or existing) session on `master`, UI off, session time zone UTC. Spark starts its
    Python workers (data source planning, tasks) with $PYSPARK_PYTHON, else the `python3` on PATH,
    which need not see our packages: it is set to this interpreter unless already set."""
    from client.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
