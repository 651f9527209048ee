"""`MessageStore.truncate_to`: a fenced slave cuts its commit-log tail; consume queues, key index,
max offsets and `check_store` agree afterwards, and appends continue from the cut."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.store.check import check_store
from tests.broker.store.conftest import open_store, put, put_many, small_config


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(1, 40), keep=st.data(), queues=st.integers(1, 3))
async def test_truncate_keeps_a_consistent_prefix(tmp_path_factory: object, count: int, keep: st.DataObject,
                                                  queues: int) -> None:
    path = tmp_path_factory.mktemp("truncate")  # type: ignore[attr-defined]
    store = await open_store(small_config(Path(path)))
    try:
        ends = [0]
        for index in range(count):
            ends.append(put(store, "t", index % queues, f"m{index}".encode(),
                            properties={"KEYS": f"k{index}"}).end_offset)
        store.dispatch_available()
        kept = keep.draw(st.integers(0, count))
        await store.truncate_to(ends[kept])
        assert store.commit_log_max_offset() == ends[kept]
        for queue_id in range(queues):
            assert store.get_max_offset("t", queue_id) == len(range(queue_id, kept, queues))
        assert [i for i in range(count) if store.query_by_key("t", f"k{i}", 10)] == list(range(kept))
        put_many(store, 3, "t", 0)
        assert store.commit_log_max_offset() > ends[kept]
    finally:
        await store.stop()
    report = check_store(Path(path))
    assert report.ok, report.problems
