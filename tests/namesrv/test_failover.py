"""A name server and 3 brokers as subprocesses; one broker is killed with SIGKILL while a producer
and two push consumers run through the name server (issue 13's "what it must show")."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

from broker.process import BrokerSubprocess
from client import ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.client import ClientConfig
from protocol.errors import MQError, TopicNotExist
from tests.helpers import free_port, wait_until

BROKERS = ("broker-a", "broker-b", "broker-c")
VICTIM = "broker-b"




def broker_process(tmp_path: Path, name: str, namesrv: str, port: int) -> BrokerSubprocess:
    return BrokerSubprocess(tmp_path / name, listen_port=port, settings={
        "broker_name": name, "namesrv_addr": namesrv, "register_name_server_period_ms": "1000",
        "persist_interval_ms": "200", "store.commit_log_segment_bytes": "1048576",
        "store.flush_disk_type": "ASYNC_FLUSH"})


async def test_killing_a_broker_moves_sends_to_the_others_and_loses_nothing(tmp_path: Path) -> None:
    api = ClientAPI(RemotingClient())
    ports = {name: free_port() for name in BROKERS}
    consumed: Counter[str] = Counter()
    consumed_at: dict[str, float] = {}

    async def listener(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        for m in msgs:
            consumed[m.uniq_key or ""] += 1
            consumed_at.setdefault(m.uniq_key or "", time.monotonic())
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async with AsyncExitStack() as stack:
        stack.push_async_callback(api.remoting.close)
        namesrv = BrokerSubprocess(None, command=[sys.executable, "-m", "namesrv"])
        await stack.enter_async_context(namesrv)
        brokers = {name: broker_process(tmp_path, name, namesrv.address, ports[name]) for name in BROKERS}
        for proc in brokers.values():
            await stack.enter_async_context(proc)
            await api.create_topic(proc.address, "orders", queue_nums=2)

        async def route() -> list[str]:
            try:
                return sorted(q.broker_name for q in (await api.get_route_info(namesrv.address, "orders")).queue_datas)
            except TopicNotExist:
                return []
        async with asyncio.timeout(10):
            while await route() != list(BROKERS):
                await asyncio.sleep(0.05)

        consumers = [PushConsumer("failover-g", namesrv.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                  client_config=ClientConfig(instance_name=f"c{i}", persist_offset_interval_ms=200))
                     for i in range(2)]
        for consumer in consumers:
            consumer.subscribe("orders")
            consumer.register_listener(listener)
            await stack.enter_async_context(consumer)
        producer = await stack.enter_async_context(Producer("failover-pg", namesrv.address))

        acked: dict[str, str] = {}                    # uniq key -> broker
        acked_at: list[float] = []
        stop = asyncio.Event()

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                try:
                    result = await producer.send(Message("orders", f"m{i}".encode()))
                except MQError:
                    continue                           # every attempt failed: try the next message
                acked[result.uniq_keys[0]] = result.broker_name
                acked_at.append(time.monotonic())
                i += 1
        sending = asyncio.create_task(produce())
        try:
            await wait_until(lambda: len(acked) >= 600, 30, "600 sends before the kill")
            assert set(acked.values()) == set(BROKERS), "sends spread over all three brokers"
            brokers[VICTIM].kill()
            killed_at = time.monotonic()
            await brokers[VICTIM].stop()
            before = len(acked)
            await wait_until(lambda: len(acked) >= before + 600, 30, "600 sends after the kill")
            after_kill = [t for t in acked_at if t > killed_at]
            assert after_kill and after_kill[0] - killed_at < 2.0, "sends continue within 2 s"
            gaps = [b - a for a, b in itertools.pairwise(after_kill)]
            assert max(gaps, default=0.0) < 2.0, f"no send stalls for 2 s (longest gap {max(gaps):.2f} s)"
            survivors = {k for k, b in acked.items() if b != VICTIM}
            await wait_until(lambda: survivors <= set(consumed), 20, "the other brokers' messages consumed")
        finally:
            stop.set()
            await sending
        brokers[VICTIM] = broker_process(tmp_path, VICTIM, namesrv.address, ports[VICTIM])
        await stack.enter_async_context(brokers[VICTIM])     # restarted: same store, same address
        await wait_until(lambda: set(acked) <= set(consumed), 60, "every acknowledged message consumed")
        assert sum(1 for b in acked.values() if b == VICTIM) > 0
