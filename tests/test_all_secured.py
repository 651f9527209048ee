"""Everything on at once (issue 37): a name server and two brokers with authentication,
authorization and TLS (enforcing), the brokers registering over TLS as an inner user; Normal users
allowed only what they need; then every feature through it, over TCP in this process: concurrent
consumption with send-back, retries and a dead letter; orderly consumption (queue locks) with a
slow listener and a graceful stop; a pull consumer; the admin CLI through the name server; one
frame of `rocketq top`; the Spark sink and a batch read."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import tests.client.spark.conftest as spark_fixtures
from broker.broker import Broker
from client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Credentials,
    Message,
    MessageExt,
    NoPermission,
    Producer,
    PullConsumer,
    PushConsumer,
    SelectMessageQueueByHash,
)
from client.spark.queues import READER_GROUP
from conf.client import ClientConfig
from conf.devcerts import CertFiles
from tests.admin.cli_runner import rocketq
from tests.client.test_orderly import KeyLog
from tests.helpers import wait_until
from tests.secured_cluster import CLUSTER, SecuredCluster, secured_cluster
from tests.security_helpers import ADMIN

pytestmark = pytest.mark.timeout(120)
FAST = ClientConfig(persist_offset_interval_ms=200, rebalance_interval_ms=300)
spark = spark_fixtures.spark     # the session's SparkSession (skips without a Java runtime)
OK, LATER = ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ConsumeConcurrentlyStatus.RECONSUME_LATER


@pytest.fixture
async def cluster(tmp_path: Path, tls_certs: CertFiles) -> AsyncIterator[SecuredCluster]:
    async with secured_cluster(tmp_path, tls_certs) as running:
        yield running


async def app_users(cluster: SecuredCluster, topic: str, *groups: str) -> tuple[Credentials, Credentials]:
    """(a producer allowed Pub on `topic`, a consumer allowed Sub on it and on `groups`), everywhere."""
    producer = await cluster.add_user(f"{topic}-producer", "p-secret", [(f"Topic:{topic}", ["Pub"])])
    consumer = await cluster.add_user(f"{topic}-consumer", "c-secret",
                                      [(f"Topic:{topic}", ["Sub"]), *((f"Group:{g}", ["Sub"]) for g in groups)])
    return producer, consumer


async def test_send_back_retries_and_a_dead_letter(cluster: SecuredCluster) -> None:
    topic, group = "sec-orders", "sec-billing"
    await cluster.create_topic(topic, 2)
    producer_user, consumer_user = await app_users(cluster, topic, group)
    async with Producer("sec-pg", cluster.endpoint, credentials=producer_user, ssl_context=cluster.context()) as p:
        brokers = {(await p.send(Message(topic, f"m{i}".encode(), keys=f"m{i}"))).broker_name for i in range(24)}
        with pytest.raises(NoPermission, match=r"has no permission to [\w ]+ on Topic:elsewhere"):
            await p.send(Message("elsewhere", b"x"))
    assert brokers == {"broker-a", "broker-b"}, "sends go round both brokers"

    attempts: Counter[str] = Counter()
    lock = threading.Lock()
    fail_once, poison = {"m3", "m8", "m13"}, "m5"

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        body = msgs[0].body.decode()
        with lock:
            attempts[body] += 1
            return LATER if body == poison or (body in fail_once and attempts[body] == 1) else OK

    consumer = PushConsumer(group, cluster.endpoint, client_config=FAST, credentials=consumer_user,
                            ssl_context=cluster.context(), consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            max_reconsume_times=1)
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    async with consumer:
        await wait_until(lambda: len(attempts) == 24 and all(attempts[k] == 2 for k in (*fail_once, poison)), 30,
                         "every message consumed, the failed ones retried, the poison one twice")
        assert {k: n for k, n in attempts.items() if n != 1} == {k: 2 for k in (*fail_once, poison)}
        dlq_topic = f"%DLQ%{group}"           # the last send-back may still be on its way
        await wait_until(lambda: sum(stored(b, dlq_topic) for b in cluster.brokers) == 1, 10, "a dead letter")
        await wait_until(lambda: bool(cluster.routed_brokers(dlq_topic)), 10, "the DLQ topic routed")

    dlq = await rocketq("admin", "dlq", "list", "-g", group, "--json", *cli_args(cluster), env=NO_ENV)
    assert dlq.exit_code == 0, dlq.output
    [letter] = json.loads(dlq.stdout)        # through the name server: the brokers the DLQ topic's route names
    assert letter["keys"] == poison and letter["broker"] in {"broker-a", "broker-b"}, letter


async def test_orderly_locks_a_slow_listener_and_a_graceful_stop(cluster: SecuredCluster) -> None:
    topic, group = "sec-fifo", "sec-fifo-cg"
    await cluster.create_topic(topic, 2)
    producer_user, consumer_user = await app_users(cluster, topic, group)
    keys, per_key = 6, 16
    async with Producer("sec-opg", cluster.endpoint, credentials=producer_user, ssl_context=cluster.context()) as p:
        for seq in range(per_key):
            for k in range(keys):
                await p.send(Message(topic, f"k{k}:{seq}".encode(), keys=f"k{k}"), SelectMessageQueueByHash(), f"k{k}")
    total, log = keys * per_key, KeyLog()

    def slow(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        threading.Event().wait(0.03)          # slower than the backlog drains (a listener's work)
        log.record(msgs, ctx)
        return ConsumeOrderlyStatus.SUCCESS

    def orderly() -> PushConsumer:
        consumer = PushConsumer(group, cluster.endpoint, client_config=FAST, credentials=consumer_user,
                                ssl_context=cluster.context(), consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                await_termination_ms=10_000)
        consumer.subscribe(topic)
        consumer.register_listener(slow, orderly=True)
        return consumer

    first = orderly()
    await first.start()
    try:
        await wait_until(lambda: log.distinct() >= total // 3, 30, "a third consumed")
        for broker in cluster.brokers:        # LOCK_BATCH_MQ, signed, over TLS, on both brokers
            assert broker.locks.owners(group), f"{broker.config.broker_name} holds no lock of the group"
    finally:
        await first.shutdown()
    assert log.distinct() < total, "the stop must come with a backlog left"
    for broker in cluster.brokers:            # UNLOCK_BATCH_MQ at the graceful stop
        assert broker.locks.owners(group) == {}, f"{broker.config.broker_name} still holds a lock"

    async with orderly():
        await wait_until(lambda: log.distinct() == total, 30, "the rest consumed")
    assert log.in_order(), "each key in send order across the stop"


async def test_a_pull_consumer_the_admin_cli_and_top(cluster: SecuredCluster) -> None:
    topic, group = "sec-cli", "sec-pull"
    created = await rocketq("admin", "topic", "create", "-t", topic, "-c", CLUSTER, "-q", "2", *cli_args(cluster),
                            env=NO_ENV)
    assert created.exit_code == 0, created.output
    await wait_until(lambda: cluster.routed_brokers(topic) == {"broker-a", "broker-b"}, 10, "the topic routed")
    producer_user, consumer_user = await app_users(cluster, topic, group)
    async with Producer("sec-cli-pg", cluster.endpoint, credentials=producer_user, ssl_context=cluster.context()) as p:
        await p.send_batch([Message(topic, f"b{i}".encode()) for i in range(10)])
        for i in range(10):
            await p.send(Message(topic, f"s{i}".encode()))

    pull = PullConsumer(group, cluster.endpoint, client_config=FAST, credentials=consumer_user,
                        ssl_context=cluster.context(), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    pull.subscribe(topic)
    pulled: list[bytes] = []
    async with pull, asyncio.timeout(20):
        while len(pulled) < 20:
            pulled.extend(m.body for m in await pull.poll(1_000))
        await pull.commit_sync()
    assert sorted(pulled) == sorted([f"b{i}".encode() for i in range(10)] + [f"s{i}".encode() for i in range(10)])

    listed = await rocketq("admin", "topic", "list", "--json", *cli_args(cluster), env=NO_ENV)
    assert listed.exit_code == 0 and topic in listed.stdout, listed.output
    progress = await rocketq("admin", "consumer", "progress", "-g", group, "--json", *cli_args(cluster), env=NO_ENV)
    assert progress.exit_code == 0, progress.output
    queues = json.loads(progress.stdout)["queues"]
    assert sum(q["consumer_offset"] for q in queues) == 20 and sum(q["lag"] for q in queues) == 0, queues
    assert {q["broker_name"] for q in queues} == {"broker-a", "broker-b"}, queues
    groups = await rocketq("admin", "group", "list", "--json", *cli_args(cluster), env=NO_ENV)
    assert groups.exit_code == 0, groups.output
    assert {g["broker_name"] for g in json.loads(groups.stdout) if g["group_name"] == group} == {"broker-a", "broker-b"}
    users = await rocketq("admin", "user", "list", "--json", "-c", CLUSTER, "--namesrv", *cli_args(cluster),
                          env=NO_ENV)
    assert users.exit_code == 0 and users.stdout.count(f"{topic}-consumer") == 3, users.output
    acls = await rocketq("admin", "acl", "list", "-s", f"{topic}-producer", "-c", CLUSTER, *cli_args(cluster),
                         env=NO_ENV)
    assert acls.exit_code == 0 and acls.stdout.count(f"Topic:{topic}") == 2, acls.output
    as_consumer = await rocketq("admin", "user", "list", *cli_args(cluster, consumer_user), env=NO_ENV)
    assert as_consumer.exit_code == 1 and "no permission" in as_consumer.stderr, as_consumer.output
    plaintext = await rocketq("admin", "topic", "list", "-n", cluster.endpoint, "--access-key", ADMIN.access_key,
                              "--secret-key", ADMIN.secret_key, env=NO_ENV)
    assert plaintext.exit_code == 2, plaintext.output

    broker_a = cluster.brokers[0].address
    top = await rocketq("top", "--iterations", "1", *cli_args(cluster), "-n", broker_a, env=NO_ENV)
    assert top.exit_code == 0 and group in top.stdout, top.output


async def test_spark_sink_and_batch_read(cluster: SecuredCluster, spark: SparkSession) -> None:
    topic = "sec-spark"
    await cluster.create_topic(topic, 2, cluster.brokers[:1])      # the source reads topics of one broker
    await cluster.add_user("spark-writer", "w-secret", [(f"Topic:{topic}", ["Pub"])])
    await cluster.add_user("spark-reader", "r-secret",
                           [(f"Topic:{topic}", ["Sub"]), (f"Group:{READER_GROUP}", ["Sub"])])
    common = {"endpoints": cluster.endpoint, "topic": topic, "caFile": cluster.certs.ca_file}
    rows = [(f"body-{i}".encode(), f"k{i}") for i in range(30)]

    def write_and_read() -> list[bytes]:
        df = spark.createDataFrame(rows, "body binary, keys string").repartition(2)
        df.write.format("rocketq").options(**common, accessKey="spark-writer", secretKey="w-secret") \
            .mode("append").save()
        read = spark.read.format("rocketq").options(**common, accessKey="spark-reader", secretKey="r-secret").load()
        return [bytes(r.body) for r in read.collect()]

    assert sorted(await asyncio.to_thread(write_and_read)) == sorted(body for body, _ in rows)


NO_ENV: dict[str, str | None] = {name: None for name in (
    "ROCKETQ_ENDPOINTS", "ROCKETQ_ACCESS_KEY", "ROCKETQ_SECRET_KEY", "ROCKETQ_TLS", "ROCKETQ_CA_FILE",
    "ROCKETQ_CERT_FILE", "ROCKETQ_KEY_FILE")}


def stored(broker: Broker, topic: str, queue_id: int = 0) -> int:
    """The max offset of a queue of `broker` (0 for a topic it does not have)."""
    return broker.store.get_max_offset(topic, queue_id) if broker.store is not None else 0


def cli_args(cluster: SecuredCluster, credentials: Credentials = ADMIN) -> list[str]:
    """`-n` the name server, signed as `credentials`, over TLS with the cluster's CA."""
    return ["-n", cluster.endpoint, "--access-key", credentials.access_key, "--secret-key", credentials.secret_key,
            "--ca-file", cluster.certs.ca_file]

