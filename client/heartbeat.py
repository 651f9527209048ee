"""`Heartbeats`: the client instance's HEART_BEAT to every broker (RocketMQ
`MQClientInstance#sendHeartbeatToAllBroker`), and what it learns from the answers.

A broker that cannot be reached (connection refused or lost, timeout) is remembered as unreached;
RocketMQ's clients never fail for it and try again at the next heartbeat. Here, too, `heal()` beats
such a broker as soon as it is reached again for something else (a route answer), so a consumer
started before its broker is registered there before its first rebalance asks for the group's
members. An endpoint that refuses HEART_BEAT as unsupported is a name server."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from client.api import ClientAPI
from protocol.bodies import HeartbeatData
from protocol.errors import ConnectionClosed, MQError, NoPermission, RequestCodeNotSupported, RequestTimeout

log = logging.getLogger(__name__)


class Heartbeats:
    def __init__(self, api: ClientAPI, client_id: str, data: Callable[[], HeartbeatData],
                 addresses: Callable[[], list[str]], name_servers: set[str], timeout_ms: int) -> None:
        self._api, self._client_id, self._data, self._addresses = api, client_id, data, addresses
        self._name_servers = name_servers        # the instance's set, added to here
        self._timeout_ms = timeout_ms
        self.unreached: set[str] = set()         # brokers whose last heartbeat could not reach them

    async def send_to_all(self) -> None:
        """One heartbeat to each of `addresses()`, one after the other; nothing when no producer or
        consumer is registered. Failures are logged, never raised."""
        data = self._data()
        if not data.consumer_data_set and not data.producer_data_set:
            return
        for address in self._addresses():
            await self.send(address, data, "heartbeat")

    async def send(self, address: str, data: HeartbeatData | None = None, why: str = "heartbeat") -> bool:
        """One heartbeat to `address` (`data` default: the current one); True when the broker took
        it. `why` names the occasion in the log lines. Raises nothing."""
        data = data if data is not None else self._data()
        if not data.consumer_data_set and not data.producer_data_set:
            return False
        try:
            await self._api.send_heartbeat(address, data, self._timeout_ms)
        except RequestCodeNotSupported:
            self._name_servers.add(address)
            self.unreached.discard(address)
            return False
        except (ConnectionClosed, RequestTimeout) as exc:
            if address not in self.unreached:
                log.warning("client %s: %s to %s failed: %s; trying again at the next heartbeat or as soon "
                            "as it answers", self._client_id, why, address, exc)
                self.unreached.add(address)
            else:
                log.debug("client %s: %s to %s failed again: %s", self._client_id, why, address, exc)
            return False
        except NoPermission as exc:      # credentials refused: said at WARNING, not fatal (RocketMQ's)
            log.warning("client %s: %s to %s refused: %s", self._client_id, why, address, exc)
            return False
        except MQError as exc:
            log.info("client %s: %s to %s failed: %s", self._client_id, why, address, exc)
            return False
        if address in self.unreached:
            self.unreached.discard(address)
            log.info("client %s: broker %s reached again; registered there", self._client_id, address)
        return True

    async def heal(self, reached: Iterable[str]) -> None:
        """Beat at once each address of `reached` (brokers that just answered) whose last heartbeat
        could not reach it; the others are left to the periodic heartbeat."""
        for address in sorted(set(reached) & self.unreached):
            await self.send(address, why="heartbeat after reaching it again")
