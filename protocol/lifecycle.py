"""`Lifecycle`: `async with` for whatever rocketq starts and stops (a broker, a name server, a
producer, a consumer, a broker subprocess): entering awaits `start()` and gives the object back,
leaving awaits the class's closing method (`stop()`, or `shutdown()` for clients, as RocketMQ names
them), named by `_close = stop` in the subclass. An exception inside the block is never swallowed."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Lifecycle:
    async def start(self) -> None:
        raise NotImplementedError

    async def _close(self) -> object:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._close()
