"""Store micro-benchmark: put_messages of 32 x 128 B and get_message of 32, in one process.

    .venv/bin/python bench/store_micro.py [--messages 640000] [--flush SYNC_FLUSH|ASYNC_FLUSH]

Measures the synchronous store calls only (no network, no protocol); the reput dispatch is timed
separately because in the broker it runs in its own event-loop steps.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Literal

from broker.store.message_store import MessageStore
from conf.store import StoreConfig
from protocol.subscription import tags_code

BATCH = 32


class _TagFilter:
    needs_properties = False

    def __init__(self, code: int) -> None:
        self._code = code

    def match_by_consume_queue(self, tags_code: int) -> bool:
        return tags_code == self._code

    def match_by_commit_log(self, properties: dict[str, str] | None) -> bool:
        return True


async def bench(total: int, flush: Literal["SYNC_FLUSH", "ASYNC_FLUSH"], directory: Path) -> None:
    config = StoreConfig(path=directory, flush_disk_type=flush)
    store = MessageStore(config, store_host="127.0.0.1:10911")
    await store.start()
    properties = {"TAGS": "TagA", "KEYS": "key-1", "UNIQ_KEY": "7F0000010000A1B2C3D4E5F600000001"}
    messages = [(properties, 0, bytes(128))] * BATCH
    born_timestamp = time.time_ns() // 1_000_000
    calls = total // BATCH

    started = time.perf_counter()
    for _ in range(calls):
        store.put_messages(topic="BenchTopic", queue_id=0, messages=messages,
                           born_timestamp=born_timestamp, born_host="127.0.0.1:50000")
    put_s = time.perf_counter() - started

    started = time.perf_counter()
    store.dispatch_available()
    reput_s = time.perf_counter() - started

    got, get_s = _read_queue(store, None)
    filtered, filter_s = _read_queue(store, _TagFilter(tags_code("TagA")))

    started = time.perf_counter()
    await store.wait_flushed(store.commit_log_max_offset())
    flush_s = time.perf_counter() - started
    await store.stop()

    done = calls * BATCH
    print(f"put_messages 32x128B : {done / put_s:>12,.0f} msg/s  ({put_s / done * 1e6:.2f} us/msg)")
    print(f"reput dispatch       : {done / reput_s:>12,.0f} msg/s  ({reput_s / done * 1e6:.2f} us/msg)")
    print(f"put + reput          : {done / (put_s + reput_s):>12,.0f} msg/s")
    print(f"get_message of 32    : {got / get_s:>12,.0f} msg/s  ({get_s / got * 1e6:.2f} us/msg)")
    print(f"get_message, TAG flt : {filtered / filter_s:>12,.0f} msg/s  ({filter_s / filtered * 1e6:.2f} us/msg)")
    print(f"final fsync          : {flush_s * 1000:.1f} ms")


def _read_queue(store: MessageStore, message_filter: _TagFilter | None) -> tuple[int, float]:
    """`get_message` of BATCH from queue 0 of BenchTopic, offset 0 to the end, through
    `message_filter`: (messages read, seconds)."""
    started = time.perf_counter()
    queue_offset = count = 0
    while True:
        result = store.get_message("BenchTopic", 0, queue_offset, BATCH, message_filter)
        if not result.messages:
            break
        count += result.message_count
        queue_offset = result.next_begin_offset
    return count, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=640_000)
    parser.add_argument("--flush", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], default="ASYNC_FLUSH")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(bench(args.messages, args.flush, Path(directory)))


if __name__ == "__main__":
    main()
