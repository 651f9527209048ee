"""conf/broker.toml is the documented example: every BrokerConfig key, each at its default."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from conf import BrokerConfig, dump_toml, load

EXAMPLE = Path(__file__).resolve().parents[2] / "conf" / "broker.toml"


def keys(table: dict[str, Any], prefix: str = "") -> set[str]:
    found: set[str] = set()
    for name, value in table.items():
        found |= keys(value, f"{prefix}{name}.") if isinstance(value, dict) else {f"{prefix}{name}"}
    return found


def test_example_loads_to_the_defaults() -> None:
    assert load(BrokerConfig, file=EXAMPLE, env={}) == BrokerConfig()


def test_example_sets_every_key() -> None:
    example = tomllib.loads(EXAMPLE.read_text())
    assert keys(example) == keys(tomllib.loads(dump_toml(BrokerConfig())))
    assert example["store"]["path"] == "store"


def test_example_warns_about_async_flush() -> None:
    text = EXAMPLE.read_text()
    assert "ASYNC_FLUSH" in text and "ACKNOWLEDGED messages can be lost" in text
