"""The console's actions (POST, each form carrying the session's CSRF token; refused with 403
for a session that may not act, `console.web.checked_form`): log in and out, topic create and
delete, a live offset reset (the page shows each queue before and after), DLQ resend of one
message or of all. Each does what the matching `rocketq admin` command does, through the same
functions."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from admin.cluster import on_each_broker
from admin.offset import parse_timestamp_ms
from admin.topic import write_topic
from console import messages
from console.pages import _safe_next, route
from console.sessions import COOKIE_NAME, LoginFailed, Session, login
from console.web import UNREACHABLE, checked_form, render, state_of, with_cookie
from protocol.errors import MQError
from protocol.headers import ResetOffsetRequestHeader

MAX_QUEUES = 1024


async def login_submit(request: Request) -> Response:
    """POST /login (username, password, next): a session signed as that user, or the login page
    again with why (401). The password goes to the broker only as signatures."""
    state = state_of(request)
    form = await request.form()
    username, password = str(form.get("username", "")), str(form.get("password", ""))
    target = _safe_next(str(form.get("next", "/")))
    try:
        api, admin = await login(state.settings.connection, state.settings.endpoint, username, password)
    except LoginFailed as exc:
        return render(request, None, "login.html", status_code=401, next=target, error=str(exc))
    except (MQError, *UNREACHABLE) as exc:
        return render(request, None, "login.html", status_code=502, next=target,
                      error=f"cannot reach the cluster at {state.settings.endpoint}: {exc}")
    session = await state.sessions.add(username, admin, api)
    return with_cookie(request, RedirectResponse(target, status_code=303), session)


async def logout(request: Request) -> Response:
    """POST /logout: ends the session (its admin client closes) and clears the cookie."""
    state = state_of(request)
    session = await state.sessions.lookup(request.cookies.get(COOKIE_NAME))
    if session is not None:
        form = await request.form()
        if str(form.get("csrf_token", "")) != session.csrf_token:
            raise HTTPException(403, "missing or wrong CSRF token (reload the page)")
        await state.sessions.remove(session)
    response = RedirectResponse("/login" if state.auth_required else "/", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/")
    return response


def _int(value: object, name: str, low: int, high: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise HTTPException(400, f"{name} must be a whole number") from None
    if not low <= number <= high:
        raise HTTPException(400, f"{name} must be in {low}..{high}")
    return number


@route
async def topic_create(request: Request, session: Session) -> Response:
    """POST /topics (topic, queues, perm): `admin topic create` on every broker of the endpoint."""
    form = await checked_form(request, session)
    topic = str(form.get("topic", "")).strip()
    if not topic:
        raise HTTPException(400, "give the topic a name")
    queues = _int(form.get("queues", "4"), "queues", 1, MAX_QUEUES)
    perm = _int(form.get("perm", "6"), "perm", 0, 15)
    api = session.api
    await on_each_broker(api, state_of(request).settings.endpoint, lambda address: write_topic(
        api, address, topic, queues, None, None, perm, refuse_existing=True))
    return RedirectResponse(f"/topics/{topic}", status_code=303)


@route
async def topic_delete(request: Request, session: Session) -> Response:
    """POST /topics/<topic>/delete: `admin topic delete` on every broker of the topic."""
    await checked_form(request, session)
    topic = request.path_params["topic"]
    await on_each_broker(session.api, state_of(request).settings.endpoint,
                         lambda address: session.api.delete_topic(address, topic), topic=topic)
    return RedirectResponse("/topics", status_code=303)


@route
async def offset_reset(request: Request, session: Session) -> Response:
    """POST /groups/<group>/reset (topic; to: earliest | latest | timestamp; timestamp): `admin
    offset reset`, live; answers a page with each queue's offset before and after."""
    form = await checked_form(request, session)
    group, topic, to = request.path_params["group"], str(form.get("topic", "")).strip(), str(form.get("to", ""))
    if not topic or to not in ("earliest", "latest", "timestamp"):
        raise HTTPException(400, "give a topic and where to: earliest, latest or timestamp")
    timestamp = -1
    if to == "timestamp":
        try:
            timestamp = parse_timestamp_ms(str(form.get("timestamp", "")))
        except Exception as exc:   # click.BadParameter: a page, not a traceback
            raise HTTPException(400, str(exc)) from None
    header = ResetOffsetRequestHeader(topic=topic, group=group, is_force=True, timestamp=timestamp,
                                      to_where=None if to == "timestamp" else to.upper(), queue_id=-1, offset=-1)
    found = await on_each_broker(session.api, state_of(request).settings.endpoint,
                                 lambda address: session.api.reset_offset(address, header), topic=topic)
    rows: list[dict[str, Any]] = [
        {"topic": q.topic, "broker_name": q.broker_name, "queue_id": q.queue_id, "before": q.before, "after": q.after,
         "moved": q.after - max(q.before, 0)} for result in found.values() for q in result.offset_table]
    return render(request, session, "reset.html", group=group, topic=topic, rows=rows)


@route
async def dlq_resend(request: Request, session: Session) -> Response:
    """POST /dlq/<group>/resend (msg_id, or all=1): `admin dlq resend --msg-id` / `--all`;
    answers a page with each message resent (or why not)."""
    form = await checked_form(request, session)
    group = request.path_params["group"]
    msg_id = None if form.get("all") == "1" else str(form.get("msg_id", "")).strip()
    if msg_id == "":
        raise HTTPException(400, "give msg_id or all=1")
    rows = await messages.resend(session.api, state_of(request).settings.endpoint, group, msg_id)
    return render(request, session, "resent.html", group=group, rows=rows,
                  resent=sum(1 for row in rows if row["queue_id"] != ""))
