"""The console's pages (GET, stable URLs that work typed or bookmarked) and the JSON endpoints
their auto-refresh polls (`/api/...`, the same data as the page). Each is a `console.web`
handler: the session first (a redirect to /login when one is needed), admin client errors as
an error page."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from admin.common import CommandError
from console import cluster_data, messages
from console.lag_history import lag_chart_svg
from console.sessions import Session
from console.web import UNREACHABLE, LoginRequired, current_session, error_page, render, state_of, with_cookie
from protocol.errors import MQError

Handler = Callable[[Request, Session], Awaitable[Response]]


def route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint running `handler(request, session)`: no session and a login needed
    sends a page to /login?next=<path> (an /api/ call gets 401); admin errors become `error_page`."""
    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        session: Session | None = None
        try:
            session = await current_session(request)
            return await handler(request, session)
        except LoginRequired:
            if request.url.path.startswith("/api/"):
                return JSONResponse({"error": "log in first"}, status_code=401)
            return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
        except (MQError, CommandError, *UNREACHABLE) as exc:
            if request.url.path.startswith("/api/"):
                return JSONResponse({"error": str(exc)}, status_code=502)
            return error_page(request, session, exc)
    return endpoint


def _now_ms() -> int:
    return int(time.time() * 1000)


def _json(request: Request, value: Any) -> Response:
    return with_cookie(request, JSONResponse(value, headers={"Cache-Control": "no-store"}))


@route
async def home(request: Request, session: Session) -> Response:
    state = state_of(request)
    brokers = await cluster_data.brokers(session.api, state.settings.endpoint, state.rates, _now_ms())
    groups = await cluster_data.groups(session.api, state.settings.endpoint)
    topics = await cluster_data.topics(session.api, state.settings.endpoint)
    return render(request, session, "home.html", brokers=brokers, groups=groups,
                  topic_count=sum(1 for t in topics if t["kind"] == "normal"),
                  total_lag=sum(g["total_lag"] for g in groups))


@route
async def brokers_page(request: Request, session: Session) -> Response:
    state = state_of(request)
    rows = await cluster_data.brokers(session.api, state.settings.endpoint, state.rates, _now_ms())
    return render(request, session, "brokers.html", brokers=rows)


@route
async def brokers_json(request: Request, session: Session) -> Response:
    state = state_of(request)
    return _json(request, await cluster_data.brokers(session.api, state.settings.endpoint, state.rates, _now_ms()))


@route
async def topics_page(request: Request, session: Session) -> Response:
    rows = await cluster_data.topics(session.api, state_of(request).settings.endpoint)
    show_system = request.query_params.get("system") == "1"
    shown = [row for row in rows if show_system or row["kind"] == "normal"]
    return render(request, session, "topics.html", topics=shown, show_system=show_system, hidden=len(rows) - len(shown))


@route
async def topic_page(request: Request, session: Session) -> Response:
    state = state_of(request)
    detail = await cluster_data.topic_detail(session.api, state.settings.endpoint, request.path_params["topic"],
                                             state.rates, _now_ms())
    return render(request, session, "topic.html", detail=detail)


@route
async def topic_json(request: Request, session: Session) -> Response:
    state = state_of(request)
    return _json(request, await cluster_data.topic_detail(session.api, state.settings.endpoint,
                                                          request.path_params["topic"], state.rates, _now_ms()))


@route
async def groups_page(request: Request, session: Session) -> Response:
    rows = await cluster_data.groups(session.api, state_of(request).settings.endpoint)
    return render(request, session, "groups.html", groups=rows)


@route
async def groups_json(request: Request, session: Session) -> Response:
    return _json(request, await cluster_data.groups(session.api, state_of(request).settings.endpoint))


async def _group(request: Request, session: Session) -> dict[str, Any]:
    state, group = state_of(request), request.path_params["group"]
    detail = await cluster_data.group_detail(session.api, state.settings.endpoint, group)
    now_ms = _now_ms()
    state.history.record(group, now_ms, detail["total_lag"])
    detail["chart_svg"] = lag_chart_svg(state.history.samples(group, now_ms - 3_600_000), now_ms)
    return detail


@route
async def group_page(request: Request, session: Session) -> Response:
    return render(request, session, "group.html", detail=await _group(request, session))


@route
async def group_json(request: Request, session: Session) -> Response:
    return _json(request, await _group(request, session))


MAX_TIME_MS = 253_402_300_799_999      # 9999-12-31T23:59:59.999Z: the latest time a search takes


def _epoch_ms(value: str, name: str) -> int | None:
    """A form's time: epoch ms or an ISO date-time (local time: the browser's datetime-local), in
    0..`MAX_TIME_MS`; None when empty. Raises `ValueError` saying what is wrong (shown, a 400)."""
    value = value.strip()
    if not value:
        return None
    out_of_range = ValueError(f"{name} must be between 1970-01-01 and 9999-12-31, not {value[:40]!r}")
    try:
        when = int(value) if value.isdigit() else datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name} must be a date and time (YYYY-MM-DDTHH:MM:SS) or epoch milliseconds, "
                         f"not {value[:40]!r}") from None
    try:
        epoch_ms = when if isinstance(when, int) else int(when.timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        raise out_of_range from None
    if not 0 <= epoch_ms <= MAX_TIME_MS:
        raise out_of_range
    return epoch_ms


def _time_range(begin: str, end: str) -> tuple[int | None, int | None]:
    """The search's (begin, end) in epoch ms (None: not given). Raises `ValueError` for a bad time
    or an end before the begin."""
    begin_ms, end_ms = _epoch_ms(begin, "the range's start"), _epoch_ms(end, "the range's end")
    if begin_ms is not None and end_ms is not None and end_ms < begin_ms:
        raise ValueError("the end of the time range is before its start")
    return begin_ms, end_ms


@route
async def messages_page(request: Request, session: Session) -> Response:
    """/messages?topic=T&key=K, ?msg_id=ID[&topic=T], or ?topic=T&begin=TIME&end=TIME (TIME: epoch
    ms or YYYY-MM-DDTHH:MM:SS local; a missing begin is 1970, a missing end now). A bad time or an
    end before the begin is the page with why (400), never an error page."""
    endpoint, params = state_of(request).settings.endpoint, request.query_params
    topic, key, msg_id = (params.get(name, "").strip() for name in ("topic", "key", "msg_id"))
    form: dict[str, Any] = {"topic": topic, "key": key, "msg_id": msg_id, "begin": params.get("begin", ""),
            "end": params.get("end", "")}
    try:
        begin, end = _time_range(form["begin"], form["end"])
    except ValueError as exc:
        return render(request, session, "messages.html", status_code=400, results=[], searched=False,
                      problem=str(exc), **form)
    found, searched, problem = [], False, ""
    if msg_id:
        found, searched = await messages.by_id(session.api, endpoint, msg_id, topic or None), True
    elif topic and key:
        found, searched = await messages.by_key(session.api, endpoint, topic, key), True
    elif topic and (begin is not None or end is not None):
        found = await messages.by_time(session.api, endpoint, topic, begin or 0, _now_ms() if end is None else end)
        searched = True
    elif params:
        problem = "give a message id, or a topic with a key or a time range"
    return render(request, session, "messages.html", results=[messages.summary(m) for m in found],
                  searched=searched, problem=problem, **form)


@route
async def message_page(request: Request, session: Session) -> Response:
    endpoint, msg_id = state_of(request).settings.endpoint, request.path_params["msg_id"]
    topic = request.query_params.get("topic") or None
    found = await messages.by_id(session.api, endpoint, msg_id, topic)
    message = found[0] if found else None
    timeline, trace_problem = await messages.trace(session.api, endpoint, msg_id if message is None else
                                                   message.uniq_key or message.msg_id)
    if message is None and not timeline:
        where = f" in topic {topic!r}" if topic else " (give ?topic=T to look a UNIQ_KEY up)"
        return render(request, session, "error.html", status_code=404, message=f"no message {msg_id}{where}")
    if message is None:     # no longer stored (or a UNIQ_KEY without ?topic=): its trace alone
        return render(request, session, "message.html", msg_id=msg_id, message=None, timeline=timeline,
                      trace_problem=trace_problem)
    return render(request, session, "message.html", msg_id=message.msg_id, message=messages.summary(message),
                  properties=sorted(message.properties.items()), preview=messages.body_preview(message.body),
                  timeline=timeline, trace_problem=trace_problem)


@route
async def dlq_page(request: Request, session: Session) -> Response:
    group = request.path_params["group"]
    listed = await messages.dead_letters(session.api, state_of(request).settings.endpoint, group)
    return render(request, session, "dlq.html", group=group, dlq=listed)


@route
async def users_page(request: Request, session: Session) -> Response:
    endpoint = state_of(request).settings.endpoint
    users = await session.api.list_users(endpoint)
    acls = await session.api.list_acls(endpoint)
    return render(request, session, "users.html", users=users, acls=acls)


async def login_page(request: Request) -> Response:
    return render(request, None, "login.html", next=_safe_next(request.query_params.get("next", "/")), error="")


def _safe_next(target: str) -> str:
    """Only a path on this console (never another site: an open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"
