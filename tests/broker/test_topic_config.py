"""`TopicConfig` permissions: kept as plain ints whatever they are given as (an IntFlag `&` on every
send and pull cost ~1 µs), with READ and WRITE enforced as before."""

from __future__ import annotations

import pytest

from broker.topics.topic_config_manager import TopicConfig, TopicConfigManager
from protocol.codes import Perm
from protocol.errors import NoPermission


@pytest.mark.parametrize("config", [TopicConfig(topic="t"), TopicConfig(topic="t", perm=Perm.READ | Perm.WRITE),
                                    TopicConfigManager(auto_create_topic=True, default_queue_nums=4).for_send("t", 0),
                                    TopicConfigManager(auto_create_topic=False, default_queue_nums=4).ensure("t", 1)])
def test_a_topic_s_perm_is_a_plain_int(config: TopicConfig) -> None:
    assert type(config.perm) is int and config.perm == 6
    assert config.readable and config.writable


def test_perm_given_as_a_flag_is_still_enforced() -> None:
    topics = TopicConfigManager(auto_create_topic=False, default_queue_nums=4)
    topics.update(TopicConfig(topic="read_only", perm=Perm.READ))
    topics.update(TopicConfig(topic="write_only", perm=Perm.WRITE))
    assert topics.require_readable_queue("read_only", 0).perm == 4
    with pytest.raises(NoPermission, match="not writable"):
        topics.for_send("read_only", 0)
    assert topics.for_send("write_only", 0).perm == 2
    with pytest.raises(NoPermission, match="not readable"):
        topics.require_readable_queue("write_only", 0)
