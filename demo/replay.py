"""`Replay`: every flight as one message, 32 per `send_batch`, `workers` batches in flight; columns
named in `property_columns` also travel as message properties (the Spark pipeline's `time_hour`)."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Iterator, Sequence

from client import Message, Producer, SendStatus
from demo.flights import Flights, Row

BATCH_SIZE = 32
WORKERS = 16


def flight_message(topic: str, header: Sequence[str], row: Row, carrier: int, tailnum: int,
                   properties: Sequence[tuple[str, int]] = ()) -> Message:
    """tag = carrier, KEYS = tailnum, body = the row as compact JSON keyed by the CSV header (values
    as the CSV's text); `properties` names (property, column) pairs copied as user properties."""
    body = json.dumps(dict(zip(header, row, strict=True)), separators=(",", ":")).encode()
    return Message(topic, body, tags=row[carrier], keys=row[tailnum] or None,
                   properties={name: row[column] for name, column in properties} or None)


class Replay:
    """Sends `flights` to `topic`; `sent` counts acknowledged messages as they come in, `statuses`
    the send statuses by message. A failed `send_batch` (after the producer's own retries) ends
    `run()` with that error, cancelling the other workers."""

    def __init__(self, producer: Producer, topic: str, flights: Flights, *, batch_size: int = BATCH_SIZE,
                 workers: int = WORKERS, property_columns: Sequence[str] = ()) -> None:
        self._producer, self._topic, self._flights = producer, topic, flights
        self._properties = [(name, flights.column(name)) for name in property_columns]
        self._batch_size, self._workers = batch_size, workers
        self.sent = 0
        self.statuses: collections.Counter[SendStatus] = collections.Counter()
        self.started_at_s = 0.0     # time.perf_counter() of the first send
        self.finished_at_s = 0.0    # time.perf_counter() of the last acknowledgement

    @property
    def elapsed_s(self) -> float:
        return self.finished_at_s - self.started_at_s

    def _batches(self) -> Iterator[Sequence[Row]]:
        rows = self._flights.rows
        for start in range(0, len(rows), self._batch_size):
            yield rows[start:start + self._batch_size]

    async def run(self) -> None:
        batches = self._batches()
        self.started_at_s = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(self._workers):
                group.create_task(self._worker(batches))
        self.finished_at_s = time.perf_counter()

    async def _worker(self, batches: Iterator[Sequence[Row]]) -> None:
        header = self._flights.header
        carrier, tailnum = self._flights.column("carrier"), self._flights.column("tailnum")
        for batch in batches:    # the workers share one iterator: each batch is taken once
            messages = [flight_message(self._topic, header, row, carrier, tailnum, self._properties)
                        for row in batch]
            result = await self._producer.send_batch(messages)
            self.sent += len(messages)
            self.statuses[result.status] += len(messages)
