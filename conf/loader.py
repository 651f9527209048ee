"""Build config dataclasses from defaults < TOML file < environment < `--set` overrides.

A config class is a frozen, slotted, kw-only dataclass whose fields are `bool`, `int`, `float`, `str`,
`Path`, a `Literal[...]` of those, or another such dataclass (a TOML table / dotted-key section).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar, cast, get_args, get_origin, get_type_hints

T = TypeVar("T")

ENV_PREFIX = "ROCKETQ_"
_NO_OVERRIDES: Mapping[str, str] = MappingProxyType({})
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

# Field name → coerced value, or a nested tree for a nested dataclass field.
_Tree = dict[str, Any]


class ConfigError(ValueError):
    """A config source names an unknown key or gives a value its field cannot take.

    `key` is the dotted key (`"long_polling.enable"`), or `""` for a problem with a whole file.
    The message names the source (file, environment variable or `--set`) and, for an unknown key,
    the valid keys of its section."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


def load(
    cls: type[T],
    *,
    file: Path | None = None,
    env: Mapping[str, str] = os.environ,
    overrides: Mapping[str, str] = _NO_OVERRIDES,
    env_prefix: str = ENV_PREFIX,
) -> T:
    """Build `cls` from its defaults, then `file`, then `env`, then `overrides`, each overriding the
    one before.

    `file` is TOML: top-level keys are fields, tables are nested dataclass fields (`[long_polling]`,
    `[store]`); values must already have the field's type (an int for an `int`, a string for a `Path`
    or a `Literal`). `env` keys are `<env_prefix><SECTION>__<KEY>` (case-insensitive, `__` per level:
    `ROCKETQ_LONG_POLLING__ENABLE`, `ROCKETQ_LISTEN_PORT`); env vars without the prefix are ignored.
    `overrides` keys are dotted (`long_polling.enable`). Env and override values are strings coerced by
    the field's annotation: `int()`, `float()`, bools from true/false/yes/no/1/0 (any case), a `Literal`
    must equal one of its values. Nested sections not mentioned keep their field default.
    Raises `ConfigError` for an unreadable or invalid file, an unknown key (any source, including an
    env var with the prefix) or a bad value; the dataclass is built with `cls(**kwargs)`."""
    _require_config_class(cls)
    tree: _Tree = {}
    if file is not None:
        _load_toml_table(cls, _read_toml(file), [], tree, source=f"config file {file}")
    for name, raw in sorted(env.items()):
        if name.startswith(env_prefix):
            path = name[len(env_prefix):].lower().split("__")
            _set_from_string(cls, path, raw, tree, source=f"environment variable {name}")
    for dotted, raw in overrides.items():
        _set_from_string(cls, dotted.strip().split("."), raw, tree, source=f"--set {dotted}={raw}")
    return _build(cls, tree, default=None, prefix="")


def dump_toml(obj: object) -> str:
    """TOML text of a config dataclass instance: its plain fields first, then one table per nested
    dataclass (`[long_polling]`, `[a.b]` for deeper ones), each in field order. Ints other than `*port`
    are written with `_` thousands separators. Loading the text gives back an equal object."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"dump_toml needs a dataclass instance, got {obj!r}")
    lines: list[str] = []
    _dump_table(obj, "", lines)
    return "\n".join(lines).lstrip("\n") + "\n"


# --- reading -------------------------------------------------------------------------------------


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as f:
            return tomllib.load(f)
    except OSError as err:
        raise ConfigError(f"cannot read config file {file}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {file} is not valid TOML: {err}") from None


def _load_toml_table(cls: type, table: Mapping[str, Any], prefix: list[str], tree: _Tree, *,
                     source: str) -> None:
    types = _field_types(cls)
    for name, value in table.items():
        path = [*prefix, name]
        key = ".".join(path)
        if name not in types:
            raise _unknown_key(key, cls, prefix, source)
        tp = types[name]
        if _is_config_class(tp):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"config key {key!r} ({source}) is a section, not a value: write it as a "
                    f"[{key}] table; valid keys: {_valid_keys(tp, path)}", key=key)
            _load_toml_table(tp, value, path, tree, source=source)
        else:
            _put(tree, path, _check_toml_value(value, tp, key, source))


def _check_toml_value(value: object, tp: Any, key: str, source: str) -> Any:
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(cast(float, value)) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    elif tp is Path:
        ok = isinstance(value, str)
        value = Path(cast(str, value)) if ok else value
    elif get_origin(tp) is Literal:
        ok = any(type(value) is type(choice) and value == choice for choice in get_args(tp))
    else:
        raise TypeError(f"config key {key!r} has unsupported type {tp!r}")
    if not ok:
        raise ConfigError(f"invalid value {value!r} for config key {key!r} ({source}): expected "
                          f"{_describe_type(tp, toml=True)}, got {_toml_type_name(value)}", key=key)
    return value


def _set_from_string(cls: type, path: Sequence[str], raw: str, tree: _Tree, *, source: str) -> None:
    key = ".".join(path)
    section: type = cls
    for depth, name in enumerate(path):
        types = _field_types(section)
        if name not in types:
            raise _unknown_key(key, section, list(path[:depth]), source)
        tp = types[name]
        last = depth == len(path) - 1
        if last and _is_config_class(tp):
            raise ConfigError(f"config key {key!r} ({source}) is a section, not a value; "
                              f"valid keys: {_valid_keys(tp, list(path))}", key=key)
        if not last and not _is_config_class(tp):
            raise _unknown_key(key, section, list(path[:depth]), source)
        if last:
            _put(tree, path, _coerce_string(raw, tp, key, source))
        else:
            section = tp


def _coerce_string(raw: str, tp: Any, key: str, source: str) -> Any:
    try:
        if tp is bool:
            return _BOOL_WORDS[raw.strip().lower()]
        if tp is int:
            return int(raw)
        if tp is float:
            return float(raw)
        if tp is str:
            return raw
        if tp is Path:
            return Path(raw)
        if get_origin(tp) is Literal:
            for choice in get_args(tp):
                if str(choice) == raw:
                    return choice
            raise ValueError(raw)
    except (KeyError, ValueError):
        raise ConfigError(f"invalid value {raw!r} for config key {key!r} ({source}): "
                          f"expected {_describe_type(tp)}", key=key) from None
    raise TypeError(f"config key {key!r} has unsupported type {tp!r}")


def _put(tree: _Tree, path: Sequence[str], value: object) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


# --- building ------------------------------------------------------------------------------------


def _build(cls: type[T], tree: _Tree, *, default: T | None, prefix: str) -> T:
    """`default` (a nested field's default instance) is updated with `dataclasses.replace`, so a
    parent's non-trivial `default_factory` survives a partial section; without one, `cls(**kwargs)`."""
    types = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, dict):
            section = f"{prefix}{name}"
            sub_default = getattr(default, name) if default is not None else _field_default(cls, name)
            kwargs[name] = _build(types[name], value, default=sub_default, prefix=f"{section}.")
        else:
            kwargs[name] = value
    try:
        if default is not None:
            return dataclasses.replace(default, **kwargs)  # type: ignore[type-var]
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        where = f"section [{prefix.rstrip('.')}]" if prefix else "config"
        raise ConfigError(f"invalid {where}: {err}") from None


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


# --- dumping -------------------------------------------------------------------------------------


def _dump_table(obj: object, prefix: str, lines: list[str]) -> None:
    if prefix:
        lines.extend(["", f"[{prefix}]"])
    sections: list[tuple[str, object]] = []
    for f in dataclasses.fields(cast(Any, obj)):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            sections.append((f.name, value))
        else:
            lines.append(f"{f.name} = {_toml_value(value, f.name)}")
    for name, value in sections:
        _dump_table(value, f"{prefix}.{name}" if prefix else name, lines)


def _toml_value(value: object, name: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if name.endswith("port") else f"{value:_}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str | Path):
        return _toml_string(str(value))
    raise TypeError(f"cannot write {value!r} as a TOML config value")


def _toml_string(text: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# --- introspection -------------------------------------------------------------------------------


def _require_config_class(cls: type) -> None:
    if not _is_config_class(cls):
        raise TypeError(f"{cls!r} is not a config dataclass")


def _is_config_class(tp: object) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of the init fields (the config modules use postponed annotations)."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _valid_keys(cls: type, prefix: Sequence[str]) -> str:
    """Sorted dotted keys of one section; nested sections as `name.*`."""
    lead = "".join(f"{p}." for p in prefix)
    keys = [f"{lead}{name}.*" if _is_config_class(tp) else f"{lead}{name}"
            for name, tp in _field_types(cls).items()]
    return ", ".join(sorted(keys))


def _unknown_key(key: str, section: type, prefix: Sequence[str], source: str) -> ConfigError:
    where = f"in [{'.'.join(prefix)}]" if prefix else "at the top level"
    return ConfigError(f"unknown config key {key!r} ({source}); valid keys {where}: "
                       f"{_valid_keys(section, prefix)}", key=key)


def _describe_type(tp: Any, *, toml: bool = False) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(tp))
    if tp is bool:
        return "bool (true or false)" if toml else "bool (true/false, yes/no, 1/0)"
    if tp is Path:
        return "path (string)"
    return str(getattr(tp, "__name__", tp))


def _toml_type_name(value: object) -> str:
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return type(value).__name__
