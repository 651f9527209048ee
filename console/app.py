"""`create_app(state)`: the console's Starlette application, its URL table in one place.

Pages (GET): `/`, `/brokers`, `/topics`, `/topics/<topic>`, `/groups`, `/groups/<group>`,
`/messages?topic=T&key=K` (or `msg_id=`, or `topic=` with `begin=`/`end=`), `/messages/<msg_id>`,
`/dlq/<group>`, `/users` (users and ACLs), `/login`. JSON for auto-refresh: `/api/brokers`,
`/api/topics/<topic>`, `/api/groups`, `/api/groups/<group>`. Actions (POST, CSRF token, admin
sessions only): `/login`, `/logout`, `/topics`, `/topics/<topic>/delete`, `/groups/<group>/reset`,
`/dlq/<group>/resend`. Static files under `/static/` from `console/static`."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from console import actions, pages
from console.state import ConsoleState


def create_app(state: ConsoleState) -> Starlette:
    routes = [
        Route("/", pages.home),
        Route("/brokers", pages.brokers_page),
        Route("/topics", pages.topics_page),
        Route("/topics", actions.topic_create, methods=["POST"]),
        Route("/topics/{topic}", pages.topic_page),
        Route("/topics/{topic}/delete", actions.topic_delete, methods=["POST"]),
        Route("/groups", pages.groups_page),
        Route("/groups/{group}", pages.group_page),
        Route("/groups/{group}/reset", actions.offset_reset, methods=["POST"]),
        Route("/messages", pages.messages_page),
        Route("/messages/{msg_id}", pages.message_page),
        Route("/dlq/{group}", pages.dlq_page),
        Route("/dlq/{group}/resend", actions.dlq_resend, methods=["POST"]),
        Route("/users", pages.users_page),
        Route("/login", pages.login_page),
        Route("/login", actions.login_submit, methods=["POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Route("/api/brokers", pages.brokers_json),
        Route("/api/topics/{topic}", pages.topic_json),
        Route("/api/groups", pages.groups_json),
        Route("/api/groups/{group}", pages.group_json),
        Mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static")), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.console = state
    return app
