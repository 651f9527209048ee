"""Shared by the trace tests: bounded polls of a broker's (or a cluster's) trace."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from admin.trace import gather_trace
from client.admin_api import AdminAPI

Timeline = list[dict[str, Any]]


def events(timeline: Timeline, **match: Any) -> list[str]:
    """The event names of `timeline`, in order, of the entries whose fields equal `match`."""
    return [e["event"] for e in timeline if all(e.get(k) == v for k, v in match.items())]


async def trace_until(api: AdminAPI, endpoint: str, done: Callable[[Timeline], bool], *, timeout_s: float = 10,
                      msg_id: str = "", key: str = "") -> Timeline:
    """`gather_trace(api, endpoint, ...)` again until `done(timeline)`; fails after `timeout_s`
    with the last timeline."""
    timeline: Timeline = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                timeline = await gather_trace(api, endpoint, msg_id=msg_id, key=key)
                if done(timeline):
                    return timeline
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"trace never complete: {[(e['event'], e.get('topic')) for e in timeline]}") from None
