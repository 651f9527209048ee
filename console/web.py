"""What every console route shares: the session of a request (`current_session`: a login page
redirect when authentication is on and there is none), rendering a template with the session,
the CSRF and permission checks of a POST (`checked_form`), and turning admin client errors into
pages (`error_page`: 404 for an unknown topic or group, 502 when the cluster cannot be reached).
The routes live in `console.pages` and `console.actions`."""

from __future__ import annotations

import hmac
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from admin.common import CommandError, format_bytes, format_duration_ms
from console.sessions import COOKIE_NAME, Session
from console.state import ConsoleState
from protocol.errors import ConnectionClosed, MQError, NoPermission, RequestTimeout, ResponseError, TopicNotExist

log = logging.getLogger(__name__)
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
UNREACHABLE = (ConnectionClosed, RequestTimeout, ConnectionError, TimeoutError, OSError)


def _time_ms(epoch_ms: int) -> str:
    return "-" if epoch_ms <= 0 else datetime.fromtimestamp(epoch_ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


TEMPLATES.env.filters.update(time_ms=_time_ms, duration_ms=format_duration_ms, bytes=format_bytes,
                             url=lambda value: quote(str(value), safe=""))


class LoginRequired(Exception):
    """No session and the cluster wants a login: the route answers with a redirect to /login."""


def state_of(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


async def current_session(request: Request) -> Session:
    """The request's session. Without one: with authentication off a new anonymous admin session
    (on the console's own client; the response sets its cookie), else `LoginRequired`."""
    state = state_of(request)
    session = await state.sessions.lookup(request.cookies.get(COOKIE_NAME))
    if session is not None:
        return session
    if await state.needs_login():
        raise LoginRequired()
    session = await state.sessions.add("", True, state.api, owns_api=False)
    request.state.new_session = session
    return session


def with_cookie(request: Request, response: Response, session: Session | None = None) -> Response:
    """Sets the session cookie when this request made a session (or `session` is given)."""
    session = session or getattr(request.state, "new_session", None)
    if session is not None:
        response.set_cookie(COOKIE_NAME, state_of(request).sessions.cookie_value(session), httponly=True,
                            samesite="strict", path="/", secure=request.url.scheme == "https")
    return response


def render(request: Request, session: Session | None, name: str, status_code: int = 200,
           **context: Any) -> Response:
    state = state_of(request)
    page = TEMPLATES.TemplateResponse(request, name, {
        "session": session, "endpoint": state.settings.endpoint, "now_ms": int(time.time() * 1000),
        "refresh_ms": state.settings.refresh_interval_ms, "auth_on": bool(state.auth_required), **context},
        status_code=status_code)
    page.headers["Cache-Control"] = "no-store"
    return with_cookie(request, page)


async def checked_form(request: Request, session: Session) -> FormData:
    """The POST's form after the checks every action makes: the session's CSRF token in field
    `csrf_token` (else 403), and the session may act (`admin`; else 403: a Normal user's POST is
    refused even with a valid token)."""
    form = await request.form()
    token = str(form.get("csrf_token", "")) or request.headers.get("x-csrf-token", "")
    if not hmac.compare_digest(token.encode(), session.csrf_token.encode()):
        raise HTTPException(403, "missing or wrong CSRF token (reload the page)")
    if not session.admin:
        raise HTTPException(403, f"user {session.username!r} may not change the cluster (a Normal user is read-only)")
    return form


def error_page(request: Request, session: Session | None, exc: Exception) -> Response:
    """An admin client error as a page: 404 unknown topic, 403 refused, 502 unreachable, 400 else."""
    if isinstance(exc, TopicNotExist):
        status, text = 404, str(exc)
    elif isinstance(exc, NoPermission):
        status, text = 403, f"the broker refused: {exc.remark}"
    elif isinstance(exc, ResponseError):
        status, text = 400, f"the broker refused: {exc.code.name}: {exc.remark}"
    elif isinstance(exc, CommandError | MQError):
        status, text = 400, str(exc)
    else:
        status, text = 502, f"cannot reach the cluster at {state_of(request).settings.endpoint}: {exc}"
        state_of(request).auth_required = None
    log.debug("console %s %s: %s", request.method, request.url.path, text)
    return render(request, session, "error.html", status_code=status, message=text)
