"""`PullFromWhichNode`: which broker of a replica set a queue is pulled from next (RocketMQ
`PullAPIWrapper.pullFromWhichNodeTable` and `recalculatePullFromWhichNode`).

Every pull answer carries `suggest_which_broker_id`: a master with `slave_read_enable` answers
a slave's id (the group's `which_broker_when_consume_slowly`, 1) when the pull read messages too
far behind its log end to be in memory, and a slave answers 0 (the master) once the consumer
caught up. The next pull of that queue goes to the suggested broker when the routes name it,
else to the master (or, while the master is down, a slave: `RouteTable.subscribe_address`). A
pull that fails at a suggested slave sends the queue back to the master."""

from __future__ import annotations

from collections.abc import Callable

from client.api import ClientAPI, PullResult
from protocol.errors import MQError
from protocol.headers import PullMessageRequestHeader
from protocol.model import MessageQueue

MASTER_ID = 0


class PullFromWhichNode:
    """`address_of(mq)`: the queue's master (or the slave serving while it is down);
    `broker_address(broker_name, broker_id)`: an id's address in the routes, None when absent."""

    def __init__(self, address_of: Callable[[MessageQueue], str],
                 broker_address: Callable[[str, int], str | None]) -> None:
        self._address_of, self._broker_address = address_of, broker_address
        self.suggested: dict[MessageQueue, int] = {}     # queues pulled from another broker than the master

    def address(self, mq: MessageQueue) -> str:
        """Where `mq` is pulled from next: the suggested broker when routed, else the master."""
        broker_id = self.suggested.get(mq)
        if broker_id is not None:
            address = self._broker_address(mq.broker_name, broker_id)
            if address is not None:
                return address
        return self._address_of(mq)

    def update(self, mq: MessageQueue, suggested_broker_id: int) -> None:
        if suggested_broker_id == MASTER_ID:
            self.suggested.pop(mq, None)
        else:
            self.suggested[mq] = suggested_broker_id

    async def pull(self, api: ClientAPI, mq: MessageQueue, header: PullMessageRequestHeader,
                   timeout_ms: int) -> PullResult:
        """PULL_MESSAGE to `address(mq)`, following the answer's suggestion next time; raises the
        pull's `MQError` (after which `mq` goes back to the master)."""
        try:
            result = await api.pull_message(self.address(mq), header, timeout_ms)
        except MQError:
            self.suggested.pop(mq, None)
            raise
        self.update(mq, result.suggest_which_broker_id)
        return result
