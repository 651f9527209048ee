"""The broker's request-code map is complete, and every code is refused (NO_PERMISSION, nothing
changed) without credentials, with a wrong secret, with an expired timestamp and as a replayed
frame; and, for a Normal user with no ACL, by authorization."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from broker.auth.code_map import BROKER_CODE_MAP
from broker.broker import Broker
from protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.message import parse_msg_id
from protocol.model import MessageQueue
from protocol.signing import Credentials
from tests.auth.servers import ROOT, add_user, admin_as, allow, copy_of, secured, secured_broker, signed
from tests.broker.auth.requests import GROUP, TOPIC, broker_requests, snapshot
from tests.conftest import broker_config
from tests.helpers import send

TIMEOUT_MS = 5_000
MANY = secured(max_failures_per_address=1_000_000)
# A message sent back waits an hour, not the tests' 300 ms: a slow run (a sanitizer) saw the
# schedule deliver it to %RETRY%g between a snapshot and its check.
QUIET_DELAY_LEVELS = " ".join(["1h"] * 18)


def quiet(tmp_path: Path) -> dict[str, object]:
    """Broker overrides under which nothing moves by itself while a test compares snapshots."""
    return {"store": replace(broker_config(tmp_path).store, message_delay_level=QUIET_DELAY_LEVELS)}


async def test_the_code_map_has_an_entry_for_every_request_code_the_broker_handles(tmp_path: Path) -> None:
    async with Broker(broker_config(tmp_path)) as broker:
        codes = broker.request_codes
    assert codes, "the broker registered no handlers?"
    missing = sorted(RequestCode(code).name for code in codes - BROKER_CODE_MAP.keys())
    stale = sorted(RequestCode(code).name for code in BROKER_CODE_MAP.keys() - codes)
    assert not missing, f"request codes with a handler and no entry in broker.auth.code_map: {missing}"
    assert not stale, f"entries for request codes the broker does not handle: {stale}"


async def _prepare(broker: Broker) -> dict[int, RemotingCommand]:
    """Topic t with a message, group g with an offset, a consumer `owner` of g holding a queue
    lock, user alice with an ACL; the requests of every code about them."""
    address = broker.address
    async with admin_as(ROOT) as root:
        sent = await send(root, address, TOPIC)
        await root.update_consumer_offset(address, GROUP, TOPIC, 0, 1)
        await add_user(address, "alice", "alice-secret", allow("Topic:t", "Pub"))
    return broker_requests(broker, sent.msg_id, parse_msg_id(sent.msg_id)[1])


async def test_every_code_is_refused_without_credentials_with_a_wrong_secret_expired_or_replayed(
        tmp_path: Path) -> None:
    async with (secured_broker(tmp_path, MANY, **quiet(tmp_path)) as broker, admin_as(ROOT) as owner,
                admin_as(None) as unsigned, admin_as(Credentials("root", "not-the-secret")) as wrong):
        address = broker.address
        requests = await _prepare(broker)
        assert requests.keys() == broker.request_codes, "tests.broker.auth.requests misses a code"
        await owner.send_heartbeat(address, HeartbeatData(client_id="owner", consumer_data_set=[ConsumerData(
            group_name=GROUP, subscription_data_set=[SubscriptionData(topic=TOPIC)])]))
        await owner.lock_batch_mq(address, GROUP, "owner", [MessageQueue(TOPIC, broker.config.broker_name, 0)])

        def invoke(api: object) -> Callable[[RemotingCommand], Awaitable[RemotingCommand]]:
            return lambda cmd: api.remoting.invoke(address, cmd, TIMEOUT_MS)  # type: ignore[attr-defined]

        ways: dict[str, Callable[[RemotingCommand], Awaitable[RemotingCommand]]] = {
            "unsigned": invoke(unsigned),
            "wrong secret": invoke(wrong),
            "expired": lambda cmd: invoke(unsigned)(signed(cmd, ROOT, age_ms=10 * 60_000)),
        }
        for way, call in ways.items():
            for code, cmd in (await _fresh(broker, requests)).items():
                before = snapshot(broker)
                response = await call(cmd)
                assert response.code == ResponseCode.NO_PERMISSION, (way, RequestCode(code).name, response)
                assert response.remark is not None and response.remark.startswith("authentication failed for "), \
                    (way, response.remark)
                assert snapshot(broker) == before, (way, RequestCode(code).name)
        for code, cmd in (await _fresh(broker, requests)).items():
            first = await unsigned.remoting.invoke(address, signed(cmd, ROOT), TIMEOUT_MS)
            assert first.code != ResponseCode.NO_PERMISSION, (RequestCode(code).name, first)
            before = snapshot(broker)
            replay = await unsigned.remoting.invoke(address, copy_of(cmd), TIMEOUT_MS)
            assert replay.code == ResponseCode.NO_PERMISSION, (RequestCode(code).name, replay)
            assert replay.remark == "authentication failed for root"
            assert snapshot(broker) == before, RequestCode(code).name


async def _fresh(broker: Broker, requests: dict[int, RemotingCommand]) -> dict[int, RemotingCommand]:
    """New requests of the same codes (a sent request has its opaque and, once signed, its nonce)."""
    return {code: RemotingCommand(code=cmd.code, fields=dict(cmd.fields), body=cmd.body)
            for code, cmd in requests.items()}


async def test_every_code_is_refused_to_a_normal_user_without_an_acl(tmp_path: Path) -> None:
    async with secured_broker(tmp_path, MANY, **quiet(tmp_path)) as broker:
        requests = await _prepare(broker)
        nobody = await add_user(broker.address, "nobody", "nobody-secret")
        async with admin_as(nobody) as api:
            for code, cmd in requests.items():
                before = snapshot(broker)
                response = await api.remoting.invoke(broker.address, cmd, TIMEOUT_MS)
                assert response.code == ResponseCode.NO_PERMISSION, (RequestCode(code).name, response)
                assert response.remark is not None and response.remark.startswith("User:nobody has no permission "), \
                    response.remark
                assert f"(request code {code})" in response.remark
                assert snapshot(broker) == before, RequestCode(code).name
