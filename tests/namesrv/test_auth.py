"""A name server with authentication and authorization on: brokers register with their inner
credentials, a rogue REGISTER_BROKER is refused, routes need Get (or Pub/Sub) on the topic, and
every code is refused without credentials, with a wrong secret, expired or replayed."""

from __future__ import annotations

from pathlib import Path

import pytest

from conf.auth import AuthConfig
from conf.namesrv import NamesrvConfig
from namesrv.auth_codes import NAMESRV_CODE_MAP
from namesrv.namesrv import NameServer
from protocol.bodies import RegisterBrokerBody, TopicConfigData, encode_body
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import NoPermission
from protocol.headers import GetRouteInfoRequestHeader, RegisterBrokerRequestHeader
from protocol.headers_v5 import ListUsersRequestHeader, UserRequestHeader
from protocol.signing import Credentials
from tests.auth.servers import (
    ROOT,
    add_user,
    admin_as,
    allow,
    copy_of,
    secured,
    secured_broker,
    secured_namesrv,
    signed,
)
from tests.helpers import wait_until

TIMEOUT_MS = 5_000


def _rogue_registration(broker_addr: str = "10.6.6.6:10911") -> RemotingCommand:
    header = RegisterBrokerRequestHeader(broker_name="broker-a", broker_addr=broker_addr, cluster_name="DefaultCluster")
    body = RegisterBrokerBody(topic_configs=[TopicConfigData(topic="orders", read_queue_nums=4, write_queue_nums=4,
                                                             perm=6)])
    return request(RequestCode.REGISTER_BROKER, header, encode_body(body))


def _state(namesrv: NameServer) -> tuple[object, ...]:
    store = namesrv.auth.store
    assert store is not None
    return (sorted(namesrv.routes.broker_live_table), repr(namesrv.routes.cluster_info()),
            sorted(namesrv.routes.all_topics()), repr(store.users()), repr(store.acls()))


async def test_the_code_map_has_an_entry_for_every_code_the_name_server_handles(tmp_path: Path) -> None:
    async with NameServer(NamesrvConfig(listen_port=0, config_dir=str(tmp_path))) as namesrv:
        assert namesrv.request_codes == NAMESRV_CODE_MAP.keys()


async def test_a_broker_registers_with_its_inner_credentials_and_a_rogue_registration_is_refused(
        tmp_path: Path) -> None:
    async with secured_namesrv(tmp_path) as namesrv:
        await add_user(namesrv.address, "broker-a", "broker-secret", allow("Cluster", "Update"))
        reader = await add_user(namesrv.address, "reader", "reader-secret", allow("Topic:*", "Get"))
        inner = AuthConfig(inner_credentials="broker-a:broker-secret")
        async with secured_broker(tmp_path / "b", inner, namesrv_addr=namesrv.address,
                                  register_name_server_period_ms=200) as broker:
            await wait_until(lambda: broker.address in namesrv.routes.broker_live_table, 5, "broker registered")
            before = _state(namesrv)
            for credentials in (None, Credentials("broker-a", "guessed"), reader):
                async with admin_as(credentials) as rogue:
                    response = await rogue.remoting.invoke(namesrv.address, _rogue_registration(), TIMEOUT_MS)
                assert response.code == ResponseCode.NO_PERMISSION, response
                assert _state(namesrv) == before
            assert response.remark == "User:reader has no permission to Update on Cluster (request code 103)"
            async with admin_as(reader) as api:
                unregister = request(RequestCode.UNREGISTER_BROKER, RegisterBrokerRequestHeader(
                    broker_name=broker.config.broker_name, broker_addr=broker.address, cluster_name="DefaultCluster"))
                assert (await api.remoting.invoke(namesrv.address, unregister, TIMEOUT_MS)).code == 16
            assert broker.address in namesrv.routes.broker_live_table


async def test_routes_need_get_on_the_topic_and_cluster_info_get_on_the_cluster(tmp_path: Path) -> None:
    async with secured_namesrv(tmp_path) as namesrv:
        await add_user(namesrv.address, "broker-a", "broker-secret", allow("Cluster", "Update"))
        inner = AuthConfig(inner_credentials="broker-a:broker-secret")
        async with secured_broker(tmp_path / "b", inner, namesrv_addr=namesrv.address,
                                  register_name_server_period_ms=200) as broker:
            async with admin_as(None) as api:
                await api.create_topic(broker.address, "orders")
                await api.create_topic(broker.address, "payroll")
            await wait_until(lambda: {"orders", "payroll"} <= set(namesrv.routes.all_topics()), 5, "topics routed")
            reader = await add_user(namesrv.address, "reader", "reader-secret", allow("Topic:orders", "Get"))
            async with admin_as(reader) as api:
                route = await api.get_route_info(namesrv.address, "orders")
                assert [q.broker_name for q in route.queue_datas] == ["broker-a"]
                with pytest.raises(NoPermission, match=r"User:reader has no permission to Pub or Sub or Get on "
                                                       r"Topic:payroll \(request code 105\)$"):
                    await api.get_route_info(namesrv.address, "payroll")
                with pytest.raises(NoPermission, match="Get on Cluster"):
                    await api.get_broker_cluster_info(namesrv.address)
                with pytest.raises(NoPermission, match="List on Topic:"):
                    await api.get_all_topic_list(namesrv.address)


async def test_users_are_managed_on_a_name_server_as_on_a_broker(tmp_path: Path) -> None:
    async with secured_namesrv(tmp_path) as namesrv, admin_as(ROOT) as root:
        await root.create_user(namesrv.address, "ops", "ops-secret")
        await root.create_acl(namesrv.address, "User:ops", [allow("Cluster", "Get")])
        assert [u.username for u in await root.list_users(namesrv.address)] == ["ops", "root"]
        async with admin_as(Credentials("ops", "ops-secret")) as ops:
            await ops.get_broker_cluster_info(namesrv.address)
            with pytest.raises(NoPermission, match="Update on Cluster"):
                await ops.create_user(namesrv.address, "eve", "eve-secret", "Super")
    assert (tmp_path / "namesrv" / "auth.json").stat().st_mode & 0o777 == 0o600


async def test_every_name_server_code_is_refused_without_credentials_wrong_secret_expired_or_replayed(
        tmp_path: Path) -> None:
    async with secured_namesrv(tmp_path, secured(max_failures_per_address=1_000_000)) as namesrv:
        def requests() -> list[RemotingCommand]:
            topic = GetRouteInfoRequestHeader(topic="orders")
            return [_rogue_registration(),
                    request(RequestCode.UNREGISTER_BROKER, RegisterBrokerRequestHeader(
                        broker_name="broker-a", broker_addr="10.6.6.6:10911", cluster_name="DefaultCluster")),
                    request(RequestCode.GET_ROUTEINFO_BY_TOPIC, topic),
                    request(RequestCode.GET_BROKER_CLUSTER_INFO),
                    request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
                    request(RequestCode.AUTH_GET_USER, UserRequestHeader(username="root")),
                    request(RequestCode.AUTH_LIST_USER, ListUsersRequestHeader()),
                    request(RequestCode.AUTH_DELETE_USER, UserRequestHeader(username="root"))]
        async with admin_as(None) as unsigned, admin_as(Credentials("root", "wrong")) as wrong:
            for make in (lambda cmd: (unsigned, cmd), lambda cmd: (wrong, cmd),
                         lambda cmd: (unsigned, signed(cmd, ROOT, age_ms=10 * 60_000))):
                for cmd in requests():
                    api, cmd = make(cmd)
                    before = _state(namesrv)
                    response = await api.remoting.invoke(namesrv.address, cmd, TIMEOUT_MS)
                    assert response.code == ResponseCode.NO_PERMISSION, (RequestCode(cmd.code).name, response)
                    assert _state(namesrv) == before
            for cmd in requests()[:-1]:     # (not the last: it would delete root)
                await unsigned.remoting.invoke(namesrv.address, signed(cmd, ROOT), TIMEOUT_MS)
                before = _state(namesrv)
                response = await unsigned.remoting.invoke(namesrv.address, copy_of(cmd), TIMEOUT_MS)
                assert response.code == ResponseCode.NO_PERMISSION, (RequestCode(cmd.code).name, response)
                assert response.remark == "authentication failed for root"
                assert _state(namesrv) == before


async def test_a_code_the_name_server_does_not_serve_is_answered_not_supported_unchecked(tmp_path: Path) -> None:
    """A client whose endpoint is a name server sends it HEART_BEAT: answered 3 as without
    authentication (not 16, which every such client logged as a refusal), signed or not."""
    async with secured_namesrv(tmp_path) as namesrv:
        for credentials in (None, ROOT):
            async with admin_as(credentials) as api:
                response = await api.remoting.invoke(namesrv.address, request(RequestCode.HEART_BEAT), TIMEOUT_MS)
            assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, response
