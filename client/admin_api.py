"""`AdminAPI`: the admin requests of `rocketq admin` (and `rocketq top`) on top of `ClientAPI`,
one method per request code, typed bodies in and out. Errors as `ClientAPI`: the `ResponseError` of
the response code, `RequestTimeout` or `ConnectionClosed`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from client.api import DEFAULT_TIMEOUT_MS, ClientAPI
from protocol import headers_v5 as v5
from protocol.bodies import (
    AclEntryData,
    AclInfo,
    BrokerRuntimeInfo,
    ConsumerConnection,
    ConsumerRunningInfo,
    ConsumeStats,
    ResetOffsetBody,
    SubscriptionGroupData,
    SubscriptionGroupTable,
    TopicConfigData,
    TopicConfigTable,
    TopicStatsTable,
    UserInfo,
    decode_body,
    decode_body_list,
    encode_body,
)
from protocol.codes import RequestCode
from protocol.command import request
from protocol.headers import (
    ConsumerGroupRequestHeader,
    CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumeStatsRequestHeader,
    QueryMessageRequestHeader,
    ResetOffsetRequestHeader,
    TopicRequestHeader,
)
from protocol.message import MessageExt, decode_message_batch
from protocol.signing import signing_key
from protocol.trace import QueryMessageTraceRequestHeader


class AdminAPI(ClientAPI):
    async def get_all_topic_config(self, address: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[TopicConfigData]:
        response = await self._call(address, request(RequestCode.GET_ALL_TOPIC_CONFIG), timeout_ms)
        return decode_body(TopicConfigTable, response.body_bytes()).topic_config_table

    async def update_topic(self, address: str, topic: str, read_queue_nums: int, write_queue_nums: int, perm: int,
                           timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """UPDATE_AND_CREATE_TOPIC with distinct read and write queue counts."""
        header = CreateTopicRequestHeader(topic=topic, read_queue_nums=read_queue_nums,
                                          write_queue_nums=write_queue_nums, perm=perm)
        await self._call(address, request(RequestCode.UPDATE_AND_CREATE_TOPIC, header), timeout_ms)

    async def delete_topic(self, address: str, topic: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        await self._call(address, request(RequestCode.DELETE_TOPIC_IN_BROKER, TopicRequestHeader(topic=topic)),
                         timeout_ms)

    async def get_topic_stats(self, address: str, topic: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> TopicStatsTable:
        response = await self._call(address, request(RequestCode.GET_TOPIC_STATS_INFO,
                                                      TopicRequestHeader(topic=topic)), timeout_ms)
        return decode_body(TopicStatsTable, response.body_bytes())

    async def get_all_subscription_groups(self, address: str,
                                          timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[SubscriptionGroupData]:
        response = await self._call(address, request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), timeout_ms)
        return decode_body(SubscriptionGroupTable, response.body_bytes()).subscription_group_table

    async def delete_subscription_group(self, address: str, group: str, *, clean_offset: bool = True,
                                        timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        header = DeleteSubscriptionGroupRequestHeader(group_name=group, clean_offset=clean_offset)
        await self._call(address, request(RequestCode.DELETE_SUBSCRIPTIONGROUP, header), timeout_ms)

    async def get_consumer_connection_list(self, address: str, group: str,
                                           timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ConsumerConnection:
        """Raises `ConsumerNotOnline` when no consumer of the group is connected."""
        response = await self._call(address, request(RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                                      ConsumerGroupRequestHeader(consumer_group=group)), timeout_ms)
        return decode_body(ConsumerConnection, response.body_bytes())

    async def get_consume_stats(self, address: str, group: str, topic: str | None = None,
                                timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ConsumeStats:
        header = GetConsumeStatsRequestHeader(consumer_group=group, topic=topic)
        response = await self._call(address, request(RequestCode.GET_CONSUME_STATS, header), timeout_ms)
        return decode_body(ConsumeStats, response.body_bytes())

    async def get_consumer_running_info(self, address: str, group: str, client_id: str,
                                        timeout_ms: int = 10_000) -> ConsumerRunningInfo:
        header = GetConsumerRunningInfoRequestHeader(consumer_group=group, client_id=client_id)
        response = await self._call(address, request(RequestCode.GET_CONSUMER_RUNNING_INFO, header), timeout_ms)
        return decode_body(ConsumerRunningInfo, response.body_bytes())

    async def reset_offset(self, address: str, header: ResetOffsetRequestHeader,
                           timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ResetOffsetBody:
        response = await self._call(address, request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header), timeout_ms)
        return decode_body(ResetOffsetBody, response.body_bytes())

    async def query_message(self, address: str, topic: str, key: str, max_num: int = 32,
                            timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[MessageExt]:
        """Messages of `topic` with `key` among their KEYS (or as UNIQ_KEY), newest first; raises
        `QueryNotFound` when there is none."""
        header = QueryMessageRequestHeader(topic=topic, key=key, max_num=max_num)
        response = await self._call(address, request(RequestCode.QUERY_MESSAGE, header), timeout_ms)
        return decode_message_batch(response.body_bytes())

    async def query_message_trace(self, address: str, *, msg_id: str = "", key: str = "", topic: str = "",
                                  max_entries: int = 1_000,
                                  timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[dict[str, Any]]:
        """QUERY_MESSAGE_TRACE: the broker's trace entries (`protocol.trace`) for the messages with
        msg id `msg_id` (a UNIQ_KEY or an offset msg id) or, instead, key `key`, of `topic` when
        given; [] when it knows none. Raises `SystemError_` for a malformed query."""
        header = QueryMessageTraceRequestHeader(msg_id=msg_id, key=key, topic=topic, max_entries=max_entries)
        response = await self._call(address, request(RequestCode.QUERY_MESSAGE_TRACE, header), timeout_ms)
        entries = msgpack.unpackb(response.body_bytes(), raw=False)
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    async def get_broker_runtime_info(self, address: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> BrokerRuntimeInfo:
        response = await self._call(address, request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout_ms)
        return decode_body(BrokerRuntimeInfo, response.body_bytes())

    # -- users and ACLs (AUTH_* codes; the same on a broker and a name server) ------------------------
    # Errors: `NoPermission` unless the caller is a Super user (or allowed Update/Get on Cluster);
    # `SystemError_` whose remark names a bad value, an existing user or ACL, or a missing one.

    async def create_user(self, address: str, username: str, password: str, user_type: str = "Normal",
                          timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """AUTH_CREATE_USER. Sends the signing key derived from the password (PBKDF2, ~5 ms here),
        never the password; `user_type` "Super" or "Normal"."""
        header = v5.CreateUserRequestHeader(username=username, signing_key=signing_key(username, password).hex(),
                                         user_type=user_type)
        await self._call(address, request(RequestCode.AUTH_CREATE_USER, header), timeout_ms)

    async def update_user(self, address: str, username: str, password: str | None = None,
                          user_type: str | None = None, user_status: str | None = None,
                          timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """AUTH_UPDATE_USER: what is None stays as it is; `user_status` "enable" or "disable"."""
        key = signing_key(username, password).hex() if password is not None else None
        header = v5.UpdateUserRequestHeader(username=username, signing_key=key, user_type=user_type,
                                         user_status=user_status)
        await self._call(address, request(RequestCode.AUTH_UPDATE_USER, header), timeout_ms)

    async def delete_user(self, address: str, username: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """AUTH_DELETE_USER (its ACL goes with it)."""
        await self._call(address, request(RequestCode.AUTH_DELETE_USER, v5.UserRequestHeader(username=username)),
                         timeout_ms)

    async def get_user(self, address: str, username: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> UserInfo:
        header = v5.UserRequestHeader(username=username)
        response = await self._call(address, request(RequestCode.AUTH_GET_USER, header), timeout_ms)
        return decode_body(UserInfo, response.body_bytes())

    async def list_users(self, address: str, name_filter: str = "",
                         timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[UserInfo]:
        """AUTH_LIST_USER: users whose name contains `name_filter`, by name."""
        header = v5.ListUsersRequestHeader(filter=name_filter or None)
        response = await self._call(address, request(RequestCode.AUTH_LIST_USER, header), timeout_ms)
        return decode_body_list(UserInfo, response.body_bytes())

    async def create_acl(self, address: str, subject: str, entries: Sequence[AclEntryData],
                         timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """AUTH_CREATE_ACL: add `entries` to `subject`'s ("User:billing") ACL; refused when it
        already has an entry for one of those resources (and source networks)."""
        body = encode_body(AclInfo(subject=subject, entries=list(entries)))
        await self._call(address, request(RequestCode.AUTH_CREATE_ACL, body=body), timeout_ms)

    async def update_acl(self, address: str, subject: str, entries: Sequence[AclEntryData],
                         timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """AUTH_UPDATE_ACL: replace (or add) those resources' entries of an existing ACL."""
        body = encode_body(AclInfo(subject=subject, entries=list(entries)))
        await self._call(address, request(RequestCode.AUTH_UPDATE_ACL, body=body), timeout_ms)

    async def delete_acl(self, address: str, subject: str, resources: Sequence[str] = (),
                         timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """AUTH_DELETE_ACL: the entries of `resources` (patterns as written, e.g. "Topic:orders-*"),
        or the whole ACL when none is given."""
        header = v5.DeleteAclRequestHeader(subject=subject, resources=",".join(resources) if resources else None)
        await self._call(address, request(RequestCode.AUTH_DELETE_ACL, header), timeout_ms)

    async def get_acl(self, address: str, subject: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> AclInfo:
        response = await self._call(address, request(RequestCode.AUTH_GET_ACL, v5.GetAclRequestHeader(subject=subject)),
                                    timeout_ms)
        return decode_body(AclInfo, response.body_bytes())

    async def list_acls(self, address: str, subject_filter: str = "", resource_filter: str = "",
                        timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[AclInfo]:
        """AUTH_LIST_ACL: ACLs of subjects containing `subject_filter`, with their entries whose
        resource contains `resource_filter`."""
        header = v5.ListAclsRequestHeader(subject_filter=subject_filter or None,
                                          resource_filter=resource_filter or None)
        response = await self._call(address, request(RequestCode.AUTH_LIST_ACL, header), timeout_ms)
        return decode_body_list(AclInfo, response.body_bytes())
