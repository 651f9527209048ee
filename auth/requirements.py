"""What a request needs to be allowed: the building blocks of the broker's and the name server's
request-code maps (`broker.auth.code_map`, `namesrv.auth_codes`), after RocketMQ 5.3's
`DefaultAuthorizationContextBuilder`.

A `Requirement` is `(kind, name, actions)`: the resource ("Cluster", "Topic" or "Group" and its
name; "" for the cluster) and the actions of which ANY one suffices, as RocketMQ's
`PolicyEntry.isMatchAction` (GET_ROUTEINFO_BY_TOPIC needs Pub, Sub or Get on the topic). A
`RequirementBuilder` reads them from a request's ext fields (or its body) without parsing the
whole header, and raises `ResourceUnknown` when a field naming a resource is missing or not a
string: such a request is refused, since what it touches cannot be told.

A builder whose requirements follow from a few string fields alone is registered with them
(`keyed`, `KEY_FIELDS`): the enforcer then remembers, per connection, the (user, code, values)
it allowed, and skips the builder and the ACL for the next request with the same values (a
producer's sends to one topic are decided once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.topics import RETRY_GROUP_TOPIC_PREFIX

Requirement = tuple[str, str, tuple[str, ...]]
RequirementBuilder = Callable[[RemotingCommand], list[Requirement]]
CodeMap = Mapping[int, RequirementBuilder]

PUB, SUB, GET, LIST = ("Pub",), ("Sub",), ("Get",), ("List",)
CREATE, UPDATE, DELETE = ("Create",), ("Update",), ("Delete",)
SUB_OR_GET = ("Sub", "Get")
EVERY = "*"              # the name of "every topic" / "every group" (listing them): `Topic:*` covers it


# builder -> the ext fields whose values alone decide its requirements (see `keyed`)
KEY_FIELDS: dict[RequirementBuilder, tuple[str, ...]] = {}


def keyed(builder: RequirementBuilder, *names: str) -> RequirementBuilder:
    """Register `builder` as deciding from the ext fields `names` alone (none: always the same
    requirements) and return it: equal values of those fields must give equal requirements."""
    KEY_FIELDS[builder] = names
    return builder


class ResourceUnknown(ValueError):
    """The request does not say which resource it touches (a missing or mistyped field)."""


def field(request: RemotingCommand, name: str) -> str:
    """The non-empty string ext field `name`; raises `ResourceUnknown`."""
    value = request.fields.get(name)
    if not isinstance(value, str) or not value:
        raise ResourceUnknown(f"field {name!r} names no resource")
    return value


def optional_field(request: RemotingCommand, name: str) -> str | None:
    """The string ext field `name`, None when absent, nil or empty; raises `ResourceUnknown` for another type."""
    value = request.fields.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ResourceUnknown(f"field {name!r} names no resource")
    return value


def retry_group(topic: str) -> str | None:
    """`"%RETRY%g"` → `"g"`; None for any other topic."""
    return topic[len(RETRY_GROUP_TOPIC_PREFIX):] if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else None


def topic_for(topic: str, actions: tuple[str, ...], retry_actions: tuple[str, ...] | None = SUB) -> list[Requirement]:
    """`actions` on the topic; a retry topic `%RETRY%g` instead needs `retry_actions` on Group g
    (None: nothing, for requests that also check the group itself), as RocketMQ."""
    group = retry_group(topic)
    if group is None:
        return [("Topic", topic, actions)]
    return [] if retry_actions is None else [("Group", group, retry_actions)]


def on_topic(actions: tuple[str, ...], name: str = "topic") -> RequirementBuilder:
    """A builder: `actions` on the topic of field `name` (retry topic: the same actions on its group)."""
    def build(request: RemotingCommand) -> list[Requirement]:
        return topic_for(field(request, name), actions, actions)
    return keyed(build, name)


def on_group(actions: tuple[str, ...], name: str = "consumer_group") -> RequirementBuilder:
    """A builder: `actions` on the group of field `name`."""
    def build(request: RemotingCommand) -> list[Requirement]:
        return [("Group", field(request, name), actions)]
    return keyed(build, name)


def on_group_and_topic(actions: tuple[str, ...], group_field: str = "consumer_group", topic_field: str = "topic",
                       topic_optional: bool = False) -> RequirementBuilder:
    """A builder: `actions` on the group and on the topic (a retry topic adds nothing: the group
    is checked), as RocketMQ's offset codes."""
    def build(request: RemotingCommand) -> list[Requirement]:
        required = [("Group", field(request, group_field), actions)]
        topic = optional_field(request, topic_field) if topic_optional else field(request, topic_field)
        if topic is not None:
            required += topic_for(topic, actions, None)
        return required
    return keyed(build, group_field, topic_field)


def fixed(*required: Requirement) -> RequirementBuilder:
    """A builder for codes whose resource is not in the request: always `required`."""
    answer = list(required)

    def build(request: RemotingCommand) -> list[Requirement]:
        return answer
    return keyed(build)


def route_query(request: RemotingCommand) -> list[Requirement]:
    """GET_ROUTEINFO_BY_TOPIC: Pub, Sub or Get on the topic; for `%RETRY%g`, Sub or Get on Group g."""
    return topic_for(field(request, "topic"), ("Pub", "Sub", "Get"), SUB_OR_GET)


keyed(route_query, "topic")


# AUTH_* (RocketMQ: Cluster Update to change users and ACLs, Cluster Get to read them).
AUTH_CODE_MAP: dict[int, RequirementBuilder] = {
    RequestCode.AUTH_CREATE_USER: fixed(("Cluster", "", UPDATE)),
    RequestCode.AUTH_UPDATE_USER: fixed(("Cluster", "", UPDATE)),
    RequestCode.AUTH_DELETE_USER: fixed(("Cluster", "", UPDATE)),
    RequestCode.AUTH_GET_USER: fixed(("Cluster", "", GET)),
    RequestCode.AUTH_LIST_USER: fixed(("Cluster", "", GET)),
    RequestCode.AUTH_CREATE_ACL: fixed(("Cluster", "", UPDATE)),
    RequestCode.AUTH_UPDATE_ACL: fixed(("Cluster", "", UPDATE)),
    RequestCode.AUTH_DELETE_ACL: fixed(("Cluster", "", UPDATE)),
    RequestCode.AUTH_GET_ACL: fixed(("Cluster", "", GET)),
    RequestCode.AUTH_LIST_ACL: fixed(("Cluster", "", GET)),
}


def describe(kind: str, name: str) -> str:
    """A resource as ACLs write it: `Cluster`, `Topic:orders`, `Group:billing`, `Topic:*` (every topic)."""
    return "Cluster" if kind == "Cluster" else f"{kind}:{name}"
