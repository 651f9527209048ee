"""The Spark source and sink over TLS: options `tls`, `caFile`, `certFile` and `keyFile` (pure
parsing), then a write and a read through Spark against a broker that enforces TLS, and against one
that requires a client certificate (mutual TLS)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from client.spark.options import SinkOptions, SourceOptions, TlsSettings
from tests.client.spark.conftest import BrokerThread
from tests.conftest import broker_config
from tests.tls_certs import CertFiles, server_tls

pytestmark = pytest.mark.timeout(300)   # the first Spark test also starts the JVM and Python workers
BASE = {"endpoints": "127.0.0.1:10911", "topic": "t"}


def test_tls_options() -> None:
    assert SourceOptions.parse(BASE, streaming=False).tls == TlsSettings()
    assert SourceOptions.parse({**BASE, "tls": "true"}, streaming=True).tls == TlsSettings(enabled=True)
    assert SourceOptions.parse({**BASE, "caFile": "/ca.pem"}, streaming=False).tls == TlsSettings(True, "/ca.pem")
    assert SinkOptions.parse({**BASE, "TLS": "1", "cafile": "/ca.pem"}).tls == TlsSettings(True, "/ca.pem")
    with pytest.raises(ValueError, match="option tls must be true or false"):
        SourceOptions.parse({**BASE, "tls": "maybe"}, streaming=False)
    mutual = {**BASE, "caFile": "/ca.pem", "certFile": "/c.pem", "keyFile": "/c.key"}
    assert SourceOptions.parse(mutual, streaming=False).tls == TlsSettings(True, "/ca.pem", "/c.pem", "/c.key")
    assert SinkOptions.parse({**BASE, "certfile": "/c.pem"}).tls == TlsSettings(True, "", "/c.pem")   # implies tls
    with pytest.raises(ValueError, match="option keyFile needs certFile"):
        SinkOptions.parse({**BASE, "keyFile": "/c.key"})


def test_write_and_read_through_spark_over_tls(spark: SparkSession, tmp_path: Path, tls_certs: CertFiles) -> None:
    broker = BrokerThread(tmp_path, broker_config(tmp_path, tls=server_tls(tls_certs, "enforcing")))
    broker.start()
    try:
        tls = {"endpoints": broker.address, "topic": "spark_tls", "tls": "true", "caFile": tls_certs.ca_file}
        df = spark.createDataFrame([(f"m{i}".encode(),) for i in range(50)], "body binary")
        df.write.format("rocketq").options(**tls).mode("append").save()
        back = spark.read.format("rocketq").options(**tls).load()
        assert sorted(row.body for row in back.select("body").collect()) == sorted(f"m{i}".encode() for i in range(50))
        with pytest.raises(Exception, match=r"ConnectionClosed|cannot connect|closed"):     # plaintext is refused
            spark.read.format("rocketq").options(endpoints=broker.address, topic="spark_tls",
                                                 brokerWaitTimeoutMs="500").load().collect()
    finally:
        broker.stop()


def test_write_and_read_through_spark_with_a_client_certificate(spark: SparkSession, tmp_path: Path,
                                                                tls_certs: CertFiles) -> None:
    tls = server_tls(tls_certs, "enforcing", require_client_cert=True)
    broker = BrokerThread(tmp_path, broker_config(tmp_path, tls=tls))
    broker.start()
    try:
        server_only = {"endpoints": broker.address, "topic": "spark_mtls", "caFile": tls_certs.ca_file}
        mutual = {**server_only, "certFile": tls_certs.client_cert, "keyFile": tls_certs.client_key}
        df = spark.createDataFrame([(f"m{i}".encode(),) for i in range(20)], "body binary")
        df.write.format("rocketq").options(**mutual).mode("append").save()
        back = spark.read.format("rocketq").options(**mutual).load()
        assert sorted(row.body for row in back.select("body").collect()) == sorted(f"m{i}".encode() for i in range(20))
        with pytest.raises(Exception, match=r"ConnectionClosed|cannot connect|closed"):   # no client certificate
            spark.read.format("rocketq").options(**server_only, brokerWaitTimeoutMs="500").load().collect()
    finally:
        broker.stop()
