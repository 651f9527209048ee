"""The Spark side of the flights pipeline: the streaming aggregation, the pandas reference and the
comparison of the two. Synchronous (Spark and pandas calls block); `demo.pipeline` drives it.

Per carrier (the message tag) and per one-hour event-time window of `time_hour` (a message
property), the number of flights and the mean `dep_delay` and `arr_delay` (JSON body fields,
"NA" → null, ignored by the means as pandas ignores NaN). The aggregation runs in append mode with
a watermark `WATERMARK_DELAY` behind the latest `time_hour` seen, so each window is written to
Parquet once, when final. The replay ends with one `END` message per queue dated
`END_TIME_HOUR`, which moves the watermark past every real window; its own window never closes."""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

WATERMARK_DELAY = "3 days"
END_TAG = "END"
END_TIME_HOUR = "2014-01-20T00:00:00Z"
DONE_WATERMARK = "2014-01-02T00:00:00"   # a batch with this watermark has emitted every 2013 window
KEY = ["carrier", "hour"]
RELATIVE_TOLERANCE = 1e-9                # the means are sums in another order


def _delay(field: str) -> Any:
    return F.expr(f"try_cast(get_json_object(cast(body as string), '$.{field}') as double)").alias(field)


def hourly_stats(flights: DataFrame) -> DataFrame:
    """flights rows (the rocketq schema) → carrier, hour (window start), flights, mean_dep_delay,
    mean_arr_delay."""
    parsed = flights.select(F.col("tags").alias("carrier"),
                            F.expr("try_cast(properties['time_hour'] as timestamp)").alias("time_hour"),
                            _delay("dep_delay"), _delay("arr_delay"))
    return (parsed.withWatermark("time_hour", WATERMARK_DELAY)
            .groupBy("carrier", F.window("time_hour", "1 hour"))
            .agg(F.count(F.lit(1)).alias("flights"), F.avg("dep_delay").alias("mean_dep_delay"),
                 F.avg("arr_delay").alias("mean_arr_delay"))
            .select("carrier", F.col("window.start").alias("hour"), "flights", "mean_dep_delay", "mean_arr_delay"))


def start_query(spark: SparkSession, endpoint: str, topic: str, out_dir: Path,
                options: Mapping[str, str] | None = None) -> StreamingQuery:
    """The streaming query, from the topic's earliest offsets, one micro-batch a second; `out_dir`
    is emptied first and receives `parquet/` and `checkpoint/`. `options`: more source options
    (`accessKey`, `secretKey`, `caFile`)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    flights = (spark.readStream.format("rocketq").option("endpoints", endpoint).option("topic", topic)
               .option("startingOffsets", "earliest").options(**(options or {})).load())
    return (hourly_stats(flights).writeStream.format("parquet").outputMode("append")
            .option("path", str(out_dir / "parquet")).option("checkpointLocation", str(out_dir / "checkpoint"))
            .trigger(processingTime="1 second").queryName("flights_by_carrier_hour").start())


def query_done(progress: dict[str, Any] | None) -> bool:
    """True once the no-data micro-batch that follows the END markers has completed: it reads no
    rows and runs with a watermark past every real window, so it wrote every window. (The batch
    that read the END markers may report the new watermark already, before anything was emitted.)"""
    progress = progress or {}
    watermark = (progress.get("eventTime") or {}).get("watermark", "")
    return bool(watermark) and watermark >= DONE_WATERMARK and progress.get("numInputRows") == 0


def spark_result(spark: SparkSession, out_dir: Path) -> pd.DataFrame:
    """The Parquet the query wrote (through its `_spark_metadata` log), sorted by carrier, hour."""
    df: pd.DataFrame = spark.read.parquet(str(out_dir / "parquet")).toPandas()
    hours = pd.to_datetime(df["hour"])
    df["hour"] = hours.dt.tz_convert("UTC").dt.tz_localize(None) if hours.dt.tz is not None else hours
    return df.sort_values(KEY).reset_index(drop=True)


def pandas_result(csv: pd.DataFrame) -> pd.DataFrame:
    """The same aggregation by pandas on the CSV (`time_hour` is already the hour's start)."""
    hours = pd.to_datetime(csv["time_hour"], utc=True).dt.tz_localize(None)
    grouped = csv.assign(hour=hours).groupby(KEY, sort=True)
    return grouped.agg(flights=("carrier", "size"), mean_dep_delay=("dep_delay", "mean"),
                       mean_arr_delay=("arr_delay", "mean")).reset_index()


@dataclass(frozen=True, slots=True)
class Comparison:
    rows: int                        # (carrier, hour) groups pandas found
    missing: list[tuple[str, str]]   # groups pandas has and Spark does not
    extra: list[tuple[str, str]]     # and the reverse
    different: list[str]             # groups whose figures differ, described

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=RELATIVE_TOLERANCE)


def compare(expected: pd.DataFrame, actual: pd.DataFrame) -> Comparison:
    """Group by group: the count exactly, the means within `RELATIVE_TOLERANCE` (NaN = NaN)."""
    def keyed(df: pd.DataFrame) -> dict[tuple[str, str], tuple[int, float, float]]:
        return {(str(r.carrier), str(r.hour)): (int(r.flights), float(r.mean_dep_delay), float(r.mean_arr_delay))
                for r in df.itertuples()}

    want, got = keyed(expected), keyed(actual)
    different = []
    for key in sorted(want.keys() & got.keys()):
        (n1, dep1, arr1), (n2, dep2, arr2) = want[key], got[key]
        if n1 != n2 or not _same(dep1, dep2) or not _same(arr1, arr2):
            different.append(f"{key}: pandas {want[key]}, spark {got[key]}")
    return Comparison(len(want), sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys()), different)
