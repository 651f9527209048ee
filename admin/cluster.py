"""Admin reads through a name server: `--endpoints` may name a broker or a name server. A name
server answers the broker's admin requests with REQUEST_CODE_NOT_SUPPORTED (which is how
`ClientInstance` tells one too); then the request goes to every broker it lists
(GET_BROKER_CLUSTER_INFO), or with a topic to every broker of the topic's route
(GET_ROUTEINFO_BY_TOPIC), and the command shows their answers together (mqadmin does the same
with `-n`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from client.admin_api import AdminAPI
from protocol.bodies import BrokerData
from protocol.errors import RequestCodeNotSupported

T = TypeVar("T")
MASTER_ID = 0


@dataclass(frozen=True, slots=True)
class BrokerAnswer(Generic[T]):
    """One broker's answer: `broker_name` is "" when the endpoint was the broker itself."""

    broker_name: str
    address: str
    value: T


@dataclass(frozen=True, slots=True)
class BrokerAnswers(Generic[T]):
    """`answers` in broker-name order; `via_name_server` False means one answer, of the endpoint."""

    via_name_server: bool
    answers: list[BrokerAnswer[T]]

    def values(self) -> list[T]:
        return [answer.value for answer in self.answers]


def serving_address(broker: BrokerData) -> str | None:
    """The master's address, else the lowest-id slave's (reads only); None without any."""
    if MASTER_ID in broker.broker_addrs:
        return broker.broker_addrs[MASTER_ID]
    return broker.broker_addrs[min(broker.broker_addrs)] if broker.broker_addrs else None


def addresses_by_name(brokers: Iterable[BrokerData]) -> list[tuple[str, str]]:
    """(broker name, serving address) of each broker with an address, sorted by name."""
    found = {b.broker_name: address for b in brokers if (address := serving_address(b)) is not None}
    return sorted(found.items())


async def name_server_brokers(api: AdminAPI, name_server: str, topic: str | None = None) -> list[tuple[str, str]]:
    """(broker name, address) of every broker the name server lists, or with `topic` of every
    broker of its route (raises `TopicNotExist` when none serves it)."""
    if topic is not None:
        return addresses_by_name((await api.get_route_info(name_server, topic)).broker_datas)
    return addresses_by_name((await api.get_broker_cluster_info(name_server)).broker_addr_table.values())


async def on_each_broker(api: AdminAPI, endpoint: str, work: Callable[[str], Awaitable[T]], *,
                         topic: str | None = None) -> BrokerAnswers[T]:
    """`work(endpoint)` when the endpoint is a broker; when it is a name server (`work`'s first
    request is answered REQUEST_CODE_NOT_SUPPORTED), `work(address)` on each broker of
    `name_server_brokers(api, endpoint, topic)`, one after the other. Errors of a broker propagate."""
    try:
        return BrokerAnswers(False, [BrokerAnswer("", endpoint, await work(endpoint))])
    except RequestCodeNotSupported:
        brokers = await name_server_brokers(api, endpoint, topic)
    return BrokerAnswers(True, [BrokerAnswer(name, address, await work(address)) for name, address in brokers])
