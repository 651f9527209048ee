"""conf.loader: precedence defaults < TOML < env < overrides, coercion, and the errors it raises."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from conf import BrokerConfig, ConfigError, LongPollingConfig, StoreConfig, dump_toml, load

Mode = Literal["fast", "safe"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf:
    ratio: float = 0.5
    mode: Mode = "safe"


@dataclass(frozen=True, slots=True, kw_only=True)
class Middle:
    name: str = "m"
    leaf: Leaf = field(default_factory=lambda: Leaf(ratio=0.25))


@dataclass(frozen=True, slots=True, kw_only=True)
class Root:
    count: int = 1
    flag: bool = False
    where: Path = Path("data")
    middle: Middle = field(default_factory=Middle)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_when_no_source_is_given() -> None:
    assert load(BrokerConfig, env={}) == BrokerConfig()


def test_each_source_overrides_the_one_before(tmp_path: Path) -> None:
    file = write(tmp_path, "broker_name = 'file'\nlisten_port = 1\n[long_polling]\nenable = false\n"
                           "short_polling_time_ms = 7\n")
    env = {"ROCKETQ_LISTEN_PORT": "2", "ROCKETQ_LONG_POLLING__ENABLE": "true",
           "ROCKETQ_LONG_POLLING__CHECK_INTERVAL_MS": "3", "PATH": "/bin", "OTHER_LISTEN_PORT": "x"}
    overrides = {"long_polling.enable": "no", "store.path": "/tmp/s"}
    config = load(BrokerConfig, file=file, env=env, overrides=overrides)
    assert config == BrokerConfig(
        broker_name="file", listen_port=2,
        long_polling=LongPollingConfig(enable=False, short_polling_time_ms=7, check_interval_ms=3),
        store=StoreConfig(path=Path("/tmp/s")))


def test_a_partial_section_keeps_the_other_defaults_of_its_factory(tmp_path: Path) -> None:
    config = load(Root, file=write(tmp_path, "[middle.leaf]\nmode = 'fast'\n"), env={})
    assert config == Root(middle=Middle(leaf=Leaf(ratio=0.25, mode="fast")))


def test_deeper_nesting_from_env_and_overrides() -> None:
    config = load(Root, env={"ROCKETQ_MIDDLE__LEAF__RATIO": "1e-3", "rocketq_count": "9"},
                  overrides={"middle.leaf.mode": "fast", "where": "x/y"})
    assert config == Root(where=Path("x/y"), middle=Middle(leaf=Leaf(ratio=0.001, mode="fast")))


def test_env_prefix_is_configurable() -> None:
    config = load(Root, env={"APP_COUNT": "4", "ROCKETQ_NOPE": "1"}, env_prefix="APP_")
    assert config.count == 4


@pytest.mark.parametrize(("raw", "expected"), [
    ("true", True), ("TRUE", True), ("Yes", True), ("1", True),
    ("false", False), ("No", False), ("0", False), (" no ", False),
])
def test_bool_words(raw: str, expected: bool) -> None:
    assert load(Root, env={}, overrides={"flag": raw}).flag is expected


@pytest.mark.parametrize(("key", "raw", "value"), [
    ("count", "1_000", 1_000), ("count", "-3", -3), ("middle.leaf.ratio", "2", 2.0),
    ("middle.name", "", ""), ("where", "/abs", Path("/abs")),
])
def test_strings_are_coerced_by_the_annotation(key: str, raw: str, value: object) -> None:
    config: object = load(Root, env={}, overrides={key: raw})
    for name in key.split("."):
        config = getattr(config, name)
    assert config == value


@pytest.mark.parametrize(("key", "raw", "expected"), [
    ("count", "10k", "expected int"),
    ("count", "1.5", "expected int"),
    ("flag", "maybe", "expected bool"),
    ("middle.leaf.ratio", "half", "expected float"),
    ("middle.leaf.mode", "FAST", "expected one of 'fast', 'safe'"),
])
def test_a_bad_string_names_key_value_and_type(key: str, raw: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(Root, env={}, overrides={key: raw})
    assert f"{key!r}" in str(info.value) and repr(raw) in str(info.value) and expected in str(info.value)
    assert info.value.key == key


def test_literal_is_validated_from_every_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected one of 'auto', 'asyncio', 'uvloop'"):
        load(BrokerConfig, env={"ROCKETQ_EVENT_LOOP": "trio"})
    with pytest.raises(ConfigError, match="'SYNC_FLUSH', 'ASYNC_FLUSH'"):
        load(BrokerConfig, file=write(tmp_path, "[store]\nflush_disk_type = 'sync'\n"), env={})
    config = load(BrokerConfig, env={}, overrides={"store.flush_disk_type": "ASYNC_FLUSH"})
    assert config.store.flush_disk_type == "ASYNC_FLUSH"


@pytest.mark.parametrize(("toml", "key", "expected"), [
    ("broker_name = 1", "broker_name", "expected str, got int"),
    ("listen_port = '10911'", "listen_port", "expected int, got str"),
    ("listen_port = true", "listen_port", "expected int, got bool"),
    ("listen_port = 1.0", "listen_port", "expected int, got float"),
    ("auto_create_topic = 1", "auto_create_topic", "expected bool (true or false), got int"),
    ("[store]\npath = 3", "store.path", "expected path (string), got int"),
    ("listen_host = ['a']", "listen_host", "expected str, got array"),
    ("[listen_port]\nx = 1", "listen_port", "expected int, got table"),
])
def test_toml_values_are_type_checked(tmp_path: Path, toml: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(BrokerConfig, file=write(tmp_path, toml + "\n"), env={})
    assert info.value.key == key and expected in str(info.value) and str(tmp_path) in str(info.value)


def test_toml_int_is_accepted_for_a_float(tmp_path: Path) -> None:
    assert load(Root, file=write(tmp_path, "[middle.leaf]\nratio = 2\n"), env={}).middle.leaf.ratio == 2.0


def test_unknown_key_in_a_section_lists_that_sections_keys(tmp_path: Path) -> None:
    message = "valid keys in [long_polling]: long_polling.check_interval_ms, long_polling.enable, " \
              "long_polling.short_polling_time_ms"
    with pytest.raises(ConfigError, match=r"unknown config key 'long_polling\.enabel'") as info:
        load(BrokerConfig, file=write(tmp_path, "[long_polling]\nenabel = false\n"), env={})
    assert message in str(info.value) and info.value.key == "long_polling.enabel"
    with pytest.raises(ConfigError, match="ROCKETQ_LONG_POLLING__ENABEL") as info:
        load(BrokerConfig, env={"ROCKETQ_LONG_POLLING__ENABEL": "false"})
    assert message in str(info.value)
    with pytest.raises(ConfigError, match="--set") as info:
        load(BrokerConfig, env={}, overrides={"long_polling.enabel": "false"})
    assert message in str(info.value)


def test_unknown_top_level_key_lists_keys_and_sections() -> None:
    with pytest.raises(ConfigError) as info:
        load(BrokerConfig, env={"ROCKETQ_LISTEN_PROT": "1"})
    text = str(info.value)
    assert "'listen_prot'" in text and "at the top level" in text
    assert "listen_port" in text and "long_polling.*" in text and "store.*" in text


def test_unknown_section_and_value_used_as_section() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'stor\.path'"):
        load(BrokerConfig, env={}, overrides={"stor.path": "x"})
    with pytest.raises(ConfigError, match=r"unknown config key 'listen_port\.x'"):
        load(BrokerConfig, env={}, overrides={"listen_port.x": "1"})


def test_a_section_cannot_be_set_to_a_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'store' .* is a section, not a value; valid keys: .*store\.path"):
        load(BrokerConfig, env={}, overrides={"store": "x"})
    with pytest.raises(ConfigError, match="is a section"):
        load(BrokerConfig, env={"ROCKETQ_LONG_POLLING": "false"})
    with pytest.raises(ConfigError, match=r"\[store\] table"):
        load(BrokerConfig, file=write(tmp_path, "store = 'x'\n"), env={})


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(BrokerConfig, file=tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(BrokerConfig, file=write(tmp_path, "listen_port = \n"), env={})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_load_rejects_a_non_dataclass() -> None:
    with pytest.raises(TypeError):
        load(int, env={})


def test_dump_toml_round_trips(tmp_path: Path) -> None:
    weird = Root(count=-1_234_567, flag=True, where=Path('a "b"\\c\n\x7f'),
                 middle=Middle(name="ü\t", leaf=Leaf(ratio=float("inf"), mode="fast")))
    for obj in (BrokerConfig(), weird, dataclasses.replace(BrokerConfig(), listen_port=0)):
        assert load(type(obj), file=write(tmp_path, dump_toml(obj)), env={}) == obj


def test_dump_toml_layout() -> None:
    text = dump_toml(Root())
    assert text == ('count = 1\nflag = false\nwhere = "data"\n\n[middle]\nname = "m"\n\n'
                    '[middle.leaf]\nratio = 0.25\nmode = "safe"\n')
    assert "listen_port = 10911\n" in dump_toml(BrokerConfig())
    assert "commit_log_segment_bytes = 33_554_432\n" in dump_toml(BrokerConfig())
