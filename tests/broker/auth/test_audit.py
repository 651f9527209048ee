"""The audit log (one JSON line per decision, reasons the client is not told, no secrets) and the
per-address rate limit of authentication failures, on a broker over TCP."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker.broker import Broker
from protocol.clock import ManualClock
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import NoPermission
from protocol.headers import TopicQueueRequestHeader
from protocol.signing import Credentials, signing_key
from tests.auth.servers import ROOT, add_user, admin_as, allow, copy_of, secured, secured_broker, signed
from tests.conftest import broker_config
from tests.helpers import send


async def test_each_decision_is_one_audit_line_with_the_reason_and_no_secret(tmp_path: Path) -> None:
    async with secured_broker(tmp_path, secured(audit_log="audit.log")) as broker:
        address = broker.address
        billing = await add_user(address, "billing", "billing-secret", allow("Topic:orders", "Pub"))
        async with admin_as(billing) as api:
            await send(api, address, "orders")
            with pytest.raises(NoPermission):
                await send(api, address, "payments")
        async with admin_as(Credentials("billing", "guess")) as api:
            with pytest.raises(NoPermission):
                await send(api, address, "orders")
        async with admin_as(None) as api:
            cmd = signed(request(RequestCode.GET_MAX_OFFSET, TopicQueueRequestHeader(topic="orders", queue_id=0)),
                         ROOT)
            assert (await api.remoting.invoke(address, cmd, 3_000)).code == ResponseCode.SUCCESS
            assert (await api.remoting.invoke(address, copy_of(cmd), 3_000)).code == ResponseCode.NO_PERMISSION
        enforcer = broker.auth.enforcer
        assert enforcer is not None and enforcer.audit is not None and enforcer.audit.flush()
        text = (tmp_path / "store" / "audit.log").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    decisions = [(d["user"], d["code"], d["resource"], d["decision"], d["reason"]) for d in lines]
    assert decisions[-5:] == [
        ("billing", 10, "Topic:orders", "allow", "acl"),
        ("billing", 10, "Topic:payments", "deny", "acl: no Allow entry matches"),
        ("billing", 10, "-", "deny", "authentication: bad signature"),
        ("root", 30, "*", "allow", "super user"),
        ("root", 30, "-", "deny", "authentication: replayed"),
    ]
    assert all(d["peer"] == "127.0.0.1" and d["time"].endswith("Z") for d in lines)
    for secret in ("billing-secret", "root-secret", "guess", signing_key("billing", "billing-secret").hex(),
                   cmd.fields["auth_signature"]):
        assert secret not in text


async def test_an_address_that_failed_too_often_is_refused_unchecked_until_its_window_ends(tmp_path: Path) -> None:
    clock = ManualClock(now_ms=time.time_ns() // 1_000_000)
    config = broker_config(tmp_path, auth=secured(max_failures_per_address=3, failure_window_ms=10_000))
    async with (Broker(config, clock=clock) as broker, admin_as(Credentials("root", "guess")) as guesser,
                admin_as(ROOT) as root):
        for _ in range(3):
            with pytest.raises(NoPermission, match="authentication failed for root"):
                await guesser.list_users(broker.address)
        clock.advance(4_000)
        with pytest.raises(NoPermission, match=r"^NO_PERMISSION: too many authentication failures from 127\.0\.0\.1; "
                                               r"retry after 6000 ms$"):
            await root.list_users(broker.address)      # right credentials, same address: not even checked
        clock.advance(6_000)
        assert [u.username for u in await root.list_users(broker.address)] == ["root"]
        enforcer = broker.auth.enforcer
        assert enforcer is not None and len(enforcer.limiter) == 0
