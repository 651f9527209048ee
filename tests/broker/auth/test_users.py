"""Users and ACLs through the AUTH_* codes: kept in a 0600 file without passwords, surviving a
restart; `init_user` at first start; clear remarks for what cannot be done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol.bodies import AclEntryData, AclInfo, UserInfo
from protocol.errors import NoPermission, SystemError_
from protocol.signing import Credentials
from tests.auth.servers import ROOT, admin_as, allow, secured, secured_broker
from tests.helpers import send


async def test_users_and_acls_persist_in_a_private_file_without_passwords_and_survive_a_restart(
        tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker, admin_as(ROOT) as root:
        await root.create_user(broker.address, "billing", "hunter2-billing")
        await root.create_acl(broker.address, "User:billing", [
            allow("Topic:orders-*", "Pub", "Sub"), allow("Group:billing", "Sub", source_ips=("10.0.0.0/8",))])
    path = tmp_path / "store" / "config" / "auth.json"
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert "hunter2-billing" not in text and "root-secret" not in text
    assert {u["username"] for u in json.loads(text)["users"]} == {"root", "billing"}
    async with secured_broker(tmp_path) as broker:
        async with admin_as(Credentials("billing", "hunter2-billing")) as billing:
            await send(billing, broker.address, "orders-eu")
        async with admin_as(ROOT) as root:
            assert await root.get_user(broker.address, "billing") == UserInfo(
                username="billing", user_type="Normal", user_status="enable")
            assert await root.get_acl(broker.address, "User:billing") == AclInfo(subject="User:billing", entries=[
                AclEntryData(resource="Topic:orders-*", actions=["Pub", "Sub"]),
                AclEntryData(resource="Group:billing", actions=["Sub"], source_ips=["10.0.0.0/8"])])


async def test_init_user_is_created_at_first_start_only(tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker, admin_as(ROOT) as root:
        assert await root.list_users(broker.address) == [UserInfo(username="root", user_type="Super",
                                                                   user_status="enable")]
        await root.update_user(broker.address, "root", password="changed")
    async with secured_broker(tmp_path) as broker:     # same init_user: the changed password stays
        async with admin_as(ROOT) as old:
            with pytest.raises(NoPermission, match="authentication failed for root"):
                await old.list_users(broker.address)
        async with admin_as(Credentials("root", "changed")) as root:
            assert [u.username for u in await root.list_users(broker.address)] == ["root"]


async def test_store_file_and_audit_log_locations_follow_the_config(tmp_path: Path) -> None:
    store_file = tmp_path / "elsewhere" / "users.json"
    auth = secured(store_file=str(store_file), audit_log="logs/audit.jsonl")
    async with secured_broker(tmp_path, auth) as broker, admin_as(ROOT) as root:
        await root.list_users(broker.address)
        enforcer = broker.auth.enforcer
        assert enforcer is not None and enforcer.audit is not None and enforcer.audit.flush()
    assert json.loads(store_file.read_text())["users"][0]["username"] == "root"
    assert not (tmp_path / "store" / "config" / "auth.json").exists()
    assert (tmp_path / "store" / "logs" / "audit.jsonl").stat().st_mode & 0o777 == 0o600


async def test_admin_codes_answer_what_is_wrong(tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker, admin_as(ROOT) as root:
        address = broker.address
        await root.create_user(address, "u", "pw")
        cases = [
            (root.create_user(address, "u", "pw"), "user u already exists"),
            (root.create_user(address, "bad name", "pw"), "field 'username': user name 'bad name' must be"),
            (root.create_user(address, "v", "pw", "Admin"), "field 'user_type': 'Admin' is not one of Super, Normal"),
            (root.update_user(address, "nobody", user_status="enable"), "no user nobody"),
            (root.update_user(address, "u", user_status="off"), "field 'user_status': 'off' is not one of enable"),
            (root.delete_user(address, "nobody"), "no user nobody"),
            (root.get_user(address, "nobody"), "no user nobody"),
            (root.create_acl(address, "Group:u", [allow("Topic:t", "Pub")]), "field 'subject': subject 'Group:u'"),
            (root.create_acl(address, "User:nobody", [allow("Topic:t", "Pub")]), "no user nobody"),
            (root.create_acl(address, "User:u", [allow("Queue:t", "Pub")]), "field 'entries\\[0\\]': resource"),
            (root.create_acl(address, "User:u", [allow("Topic:t", "Publish")]), "action 'Publish' is not one of"),
            (root.create_acl(address, "User:u", [allow("Topic:t", "Pub", decision="Maybe")]), "decision 'Maybe'"),
            (root.create_acl(address, "User:u", [allow("Topic:t", "Pub", source_ips=("10.0.0.300",))]),
             "source network '10.0.0.300'"),
            (root.create_acl(address, "User:u", []), "an ACL needs at least one entry"),
            (root.update_acl(address, "User:u", [allow("Topic:t", "Pub")]), "User:u has no ACL to update"),
            (root.delete_acl(address, "User:u"), "User:u has no ACL"),
        ]
        for call, remark in cases:
            with pytest.raises(SystemError_, match=remark):
                await call
        await root.create_acl(address, "User:u", [allow("Topic:t", "Pub"), allow("Topic:x", "Sub")])
        with pytest.raises(SystemError_, match="User:u already has an ACL for Topic:t"):
            await root.create_acl(address, "User:u", [allow("Topic:t", "Sub")])
        await root.delete_acl(address, "User:u", ["Topic:t"])
        assert [e.resource for e in (await root.get_acl(address, "User:u")).entries] == ["Topic:x"]
        assert [a.subject for a in await root.list_acls(address, subject_filter="u")] == ["User:u"]
        assert await root.list_acls(address, resource_filter="Group:") == []
        await root.delete_user(address, "u")
        assert await root.list_acls(address) == []
