"""`--endpoints` (alias `-n`) before or after the subcommand, `ROCKETQ_ENDPOINTS`, malformed
endpoints, and unknown consumer groups: one line each, with the exit codes of usage (2) and of a
refusal (1)."""

from __future__ import annotations

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from tests.admin.cli_runner import rocketq
from tests.helpers import free_port, send

ENV = "ROCKETQ_ENDPOINTS"


@pytest.mark.parametrize("endpoints", ["nonsense", "host:notaport", "127.0.0.1:99999", ":10911", ";"])
async def test_malformed_endpoints_are_one_line_and_exit_2(endpoints: str) -> None:
    for args in (["admin", "topic", "list", "--endpoints", endpoints], ["admin", "--endpoints", endpoints,
                                                                        "topic", "list"],
                 ["admin", "consumer", "progress", "-g", "g", "-n", endpoints], ["top", "--endpoints", endpoints]):
        result = await rocketq(*args, env={ENV: None})
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "--endpoints" in lines[0] and "HOST:PORT" in lines[0], lines
    from_env = await rocketq("admin", "topic", "list", env={ENV: "nonsense"})
    assert from_env.exit_code == 2 and ENV in from_env.stderr and len(from_env.stderr.splitlines()) == 1


async def test_endpoints_before_the_subcommand_n_alias_and_the_environment(broker: Broker,
                                                                         client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "seen", b"x")
    for args in (["admin", "--endpoints", broker.address, "topic", "list"],
                 ["admin", "-n", broker.address, "topicList"],
                 ["admin", "topicList", "-n", broker.address]):
        result = await rocketq(*args, env={ENV: None})
        assert result.exit_code == 0 and "seen" in result.output, (args, result.output)
    assert "seen" in (await rocketq("admin", "topic", "list", env={ENV: broker.address})).output
    elsewhere = f"127.0.0.1:{free_port()}"        # nobody listens there
    option_beats_variable = [["admin", "topic", "list", "-n", broker.address],
                             ["admin", "-n", broker.address, "topic", "list"]]
    for args in option_beats_variable:
        result = await rocketq(*args, env={ENV: elsewhere})
        assert result.exit_code == 0 and "seen" in result.output, (args, result.output)
    after_beats_before = await rocketq("admin", "-n", elsewhere, "topic", "list", "-n", broker.address)
    assert after_beats_before.exit_code == 0, after_beats_before.output
    unreachable = await rocketq("admin", "topic", "list", env={ENV: elsewhere})
    assert unreachable.exit_code == 2 and elsewhere in unreachable.output
    helped = await rocketq("admin", "topic", "list", "--help")
    assert ENV in helped.output and "127.0.0.1:10911" in helped.output and "-n" in helped.output


async def test_an_unknown_consumer_group_is_one_line_and_exit_1(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "t", b"x")
    await client_api.update_consumer_offset(broker.address, "known", "t", 0, 1)
    for command in ("progress", "status"):
        result = await rocketq("admin", "consumer", command, "--group", "nosuch", "-n", broker.address)
        assert result.exit_code == 1, (command, result.output)
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.output
        assert "'nosuch'" in result.stderr and result.stderr.startswith("rocketq admin: "), result.stderr
    on_topic = await rocketq("admin", "consumer", "progress", "-g", "known", "-t", "other", "-n", broker.address)
    assert on_topic.exit_code == 1 and "'known'" in on_topic.stderr and "'other'" in on_topic.stderr
    known = await rocketq("admin", "consumer", "progress", "-g", "known", "-n", broker.address)
    assert known.exit_code == 0 and "total lag 0" in known.output
