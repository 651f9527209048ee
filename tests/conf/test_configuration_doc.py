"""docs/configuration.md is what `python -m conf.docgen` writes from the config classes, and every
key it lists is documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_type_hints

import pytest

from conf.docgen import ROOTS, class_comments, render, unit_of

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def nested_sections(cls: type) -> dict[str, type]:
    """Field name → config class of `cls`'s nested sections (`store`, `long_polling`)."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)
            if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])}


def config_classes() -> list[type]:
    """Every config class the page covers: the roots and the sections nested in them."""
    found: list[type] = []
    pending = [root.cls for root in ROOTS]
    while pending:
        cls = pending.pop(0)
        found.append(cls)
        pending += nested_sections(cls).values()
    return found


def test_the_committed_page_is_what_the_generator_writes() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md differs from the config classes: run `make config-doc` "
        "(python -m conf.docgen docs/configuration.md) and commit the page")


def test_the_page_covers_the_nested_sections() -> None:
    names = {cls.__name__ for cls in config_classes()}
    assert {"BrokerConfig", "LongPollingConfig", "StoreConfig", "NamesrvConfig", "ClientConfig",
            "PushConsumerOptions"} <= names
    text = render()
    assert "`store.flush_disk_type`" in text and "`long_polling.enable`" in text


@pytest.mark.parametrize("cls", config_classes(), ids=lambda cls: cls.__name__)
def test_every_key_has_a_description(cls: type) -> None:
    documented = class_comments(cls).fields
    nested = nested_sections(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in nested and not documented.get(f.name)]
    assert not missing, f"{cls.__name__}: add a comment after (or right above) {missing}"


@pytest.mark.parametrize("cls", config_classes(), ids=lambda cls: cls.__name__)
def test_every_range_names_a_field(cls: type) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    assert set(getattr(cls, "RANGES", {})) <= names


def test_units_come_from_the_name() -> None:
    assert unit_of("flush_interval_ms", int) == "ms"
    assert unit_of("max_frame_bytes", int) == "bytes"
    assert unit_of("file_reserved_time_hours", int) == "hours"
    assert unit_of("disk_max_used_space_ratio", int) == "%"
    assert unit_of("pull_threshold_size_for_queue", int) == "MiB"
    assert unit_of("listen_port", int) == ""


def test_a_comment_block_over_several_fields_is_a_note() -> None:
    from conf.client import PushConsumerOptions

    comments = class_comments(PushConsumerOptions)
    assert any(note.startswith("Orderly consumption") for note in comments.notes)
    assert comments.fields["lock_interval_ms"] == "how often the queue locks are renewed"
    assert comments.fields["await_termination_millis_when_shutdown"].startswith("RocketMQ's name of")
