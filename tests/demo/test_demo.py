"""The flights demo end to end on a small slice: the in-process test broker, 3,000 flights."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from broker.broker import Broker
from demo import run_demo
from demo.flights import CarrierStats, expected_stats, read_flights
from tests.security_helpers import ADMIN, admin_api, secured_config
from tests.tls_certs import CertFiles, server_tls


async def test_demo_replays_a_slice_and_every_carrier_matches(broker: Broker) -> None:
    out = io.StringIO()
    result = await run_demo(endpoint=broker.address, limit=3_000, timeout_s=15,
                            console=Console(file=out, width=120))
    assert result.ok, out.getvalue()
    assert result.figures is not None and result.figures.consumed == 3_000
    assert "Using the broker already listening on" in out.getvalue()


def test_missing_delays_are_counted_apart_not_as_zero() -> None:
    stats = CarrierStats()
    for delay in ("5", "NA", "-3", ""):
        stats.add(delay)
    assert stats == CarrierStats(flights=4, delay_sum=2, delay_missing=2)


def test_expected_stats_of_the_first_rows() -> None:
    flights = read_flights(limit=10)
    stats = expected_stats(flights)
    assert sum(s.flights for s in stats.values()) == 10
    assert stats["UA"].flights >= 1


async def test_the_secure_demo_runs_with_a_user_and_an_acl_per_role(tmp_path: Path) -> None:
    async with Broker(secured_config(tmp_path)) as broker:
        out = io.StringIO()
        result = await run_demo(endpoint=broker.address, limit=2_000, timeout_s=15, secure=True, admin=ADMIN,
                                console=Console(file=out, width=200))
        assert result.ok, out.getvalue()
        assert "Authentication and authorization on" in out.getvalue()
        async with admin_api() as api:
            users = {u.username: u.user_type for u in await api.list_users(broker.address)}
            acls = {acl.subject: {(e.resource, tuple(e.actions)) for e in acl.entries}
                    for acl in await api.list_acls(broker.address)}
        producer, consumer = sorted(name for name in users if name.startswith("flight-"))
        assert users[producer] == users[consumer] == "Normal"
        topic = next(resource for resource, _ in acls[f"User:{producer}"])
        assert acls[f"User:{producer}"] == {(topic, ("Pub",))}
        assert acls[f"User:{consumer}"] == {(topic, ("Sub",)), (f"Group:{consumer}", ("Sub",))}


async def test_a_secure_run_on_a_broker_of_your_own_needs_its_super_user(broker: Broker) -> None:
    result = await run_demo(endpoint=broker.address, limit=10, timeout_s=5, secure=True,
                            console=Console(file=io.StringIO()))
    assert not result.ok and result.error is not None and "Super user" in result.error


async def test_the_secure_demo_starts_its_broker_with_mutual_tls() -> None:
    """Authentication, authorization and mutual TLS all on, on a broker process it starts with
    certificates made for the run."""
    out = io.StringIO()
    result = await run_demo(limit=1_000, timeout_s=30, secure=True, console=Console(file=out, width=200))
    assert result.ok, out.getvalue()
    text = out.getvalue()
    assert "Started a broker" in text and "TLS on (enforcing, mutual)" in text, text
    assert "Authentication and authorization on" in text


async def test_the_secure_demo_on_a_tls_broker_of_your_own(tmp_path: Path, tls_certs: CertFiles) -> None:
    async with Broker(secured_config(tmp_path, tls=server_tls(tls_certs))) as broker:
        out = io.StringIO()
        result = await run_demo(endpoint=broker.address, limit=500, timeout_s=15, secure=True, admin=ADMIN,
                                ca_file=tls_certs.ca_file, console=Console(file=out, width=200))
        assert result.ok, out.getvalue()
        plaintext = await run_demo(endpoint=broker.address, limit=10, timeout_s=5, secure=True, admin=ADMIN,
                                   console=Console(file=io.StringIO()))
        assert not plaintext.ok and plaintext.error is not None, "TLS enforcing: a plaintext run is refused"
