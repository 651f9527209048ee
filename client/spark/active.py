"""`activate`: make a session the calling thread's active one, where Spark looks a Python data
source up (also importable from `client.spark.session`)."""

from __future__ import annotations

from pyspark.sql import SparkSession


def activate(spark: SparkSession) -> None:
    """Make `spark` the calling thread's active session in the JVM.

    Spark finds a Python data source such as `rocketq` through the active session of the thread
    that reads or writes (`DataSource.lookupDataSource` asks `SparkSession.getActiveSession`), and
    PySpark runs each Python thread's calls on a JVM thread of its own: a session is active only in
    the thread that created it, so `spark.read.format("rocketq")` from another thread (an asyncio
    `to_thread`, a thread pool) failed with DATA_SOURCE_NOT_FOUND although the source was
    registered. `register` and `local_session` call this for their thread; call it in any other
    thread before reading or writing there. (PySpark has no public call for it: this is
    `SparkSession.setActiveSession` of the JVM, through the session's own gateway.)"""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)  # type: ignore[union-attr]
