"""Typed conversion between msgpack values and frozen dataclasses (headers and bodies).

`int` means a msgpack integer (a bool or float is wrong) within signed 64 bits, or within the
`IntRange` of an `Annotated[int, IntRange(low, high)]`; `str` a msgpack string, `bytes` bin,
`X | None` allows nil or absence; lists, `dict[str, V]`, tuples of fixed shape and nested dataclasses
are checked recursively. Every mismatch raises `MissingHeaderField` (answered SYSTEM_ERROR) naming
the path of the field and the expected type; an integer out of its range raises its subclass
`FieldOutOfRange`, naming the range. (msgpack carries integers up to 2**64 - 1; a value past
signed 64 bits, or past a field's own range, is refused here, at decode, never left to overflow
later in a packer, a timer or a C encoder.)"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, TypeVar, Union

from protocol.errors import FieldOutOfRange, MissingHeaderField

T = TypeVar("T")
_MISSING = dataclasses.MISSING
Converter = Callable[[Any, str], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class IntRange:
    """The inclusive range of an integer field: `Annotated[int, IntRange(0, 1023)]`."""

    low: int
    high: int


INT64 = IntRange(-(1 << 63), (1 << 63) - 1)     # a plain `int`


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _int_range(tp: Any) -> IntRange | None:
    """The range of an integer annotation (`int`: signed 64 bits), None for any other type."""
    if tp is int:
        return INT64
    if typing.get_origin(tp) is Annotated:
        base, *extras = typing.get_args(tp)
        if base is int:
            return next((extra for extra in extras if isinstance(extra, IntRange)), INT64)
    return None


def _ranged_int(bounds: IntRange) -> Converter:
    low, high = bounds.low, bounds.high

    def convert(value: Any, path: str) -> Any:
        if type(value) is not int:
            raise MissingHeaderField(path, "int", value)
        if not low <= value <= high:
            raise FieldOutOfRange(path, low, high, value)
        return value
    return convert


def _scalar(expected: type, name: str) -> Converter:
    def convert(value: Any, path: str) -> Any:
        if type(value) is expected:
            return value
        if expected is float and type(value) is int:
            return float(value)
        raise MissingHeaderField(path, name, value)
    return convert


def converter_for(tp: Any) -> Converter:
    """A function (value, path) -> typed value for the annotation `tp`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return lambda value, path: value
    bounds = _int_range(tp)
    if bounds is not None:
        return _ranged_int(bounds)
    if tp in (str, bool, float, bytes):
        return _scalar(tp, _type_name(tp))
    if isinstance(tp, type) and issubclass(tp, Enum):
        enum_tp = tp

        def convert_enum(value: Any, path: str) -> Any:
            try:
                return enum_tp(value)
            except ValueError:
                allowed = ", ".join(repr(m.value) for m in enum_tp)
                raise MissingHeaderField(path, f"one of {allowed}", value) from None
        return convert_enum
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        inner_types = [a for a in args if a is not type(None)]
        inner = converter_for(inner_types[0]) if len(inner_types) == 1 else None

        def convert_optional(value: Any, path: str) -> Any:
            if value is None:
                return None
            if inner is None:
                return value
            return inner(value, path)
        return convert_optional
    if origin is list or origin is frozenset or origin is set:
        (item_tp,) = typing.get_args(tp) or (Any,)
        item = converter_for(item_tp)
        build: Callable[[Any], Any] = origin if origin is not list else list

        def convert_list(value: Any, path: str) -> Any:
            if not isinstance(value, list | tuple):
                raise MissingHeaderField(path, "array", value)
            return build(item(v, f"{path}[{i}]") for i, v in enumerate(value))
        return convert_list
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = converter_for(args[0])

            def convert_var_tuple(value: Any, path: str) -> Any:
                if not isinstance(value, list | tuple):
                    raise MissingHeaderField(path, "array", value)
                return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))
            return convert_var_tuple
        items = [converter_for(a) for a in args]

        def convert_tuple(value: Any, path: str) -> Any:
            if not isinstance(value, list | tuple) or len(value) != len(items):
                raise MissingHeaderField(path, f"array of {len(items)}", value)
            return tuple(c(v, f"{path}[{i}]") for i, (c, v) in enumerate(zip(items, value, strict=True)))
        return convert_tuple
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp) or (Any, Any)
        key_c, value_c = converter_for(key_tp), converter_for(value_tp)

        def convert_dict(value: Any, path: str) -> Any:
            if not isinstance(value, dict):
                raise MissingHeaderField(path, "map", value)
            return {key_c(k, f"{path} key"): value_c(v, f"{path}[{k!r}]") for k, v in value.items()}
        return convert_dict
    if dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp)  # type: ignore[arg-type]
    raise TypeError(f"no converter for {tp!r}")


_CACHE: dict[type, Converter] = {}


def _dataclass_converter(cls: type) -> Converter:
    cached = _CACHE.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls, include_extras=True)
    specs: list[tuple[str, Converter, bool, Any]] = []
    for f in dataclasses.fields(cls):
        required = f.default is _MISSING and f.default_factory is _MISSING
        specs.append((f.name, converter_for(hints[f.name]), required, f))

    def convert(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise MissingHeaderField(path or cls.__name__, "map", value)
        kwargs: dict[str, Any] = {}
        for name, conv, required, _ in specs:
            raw = value.get(name, _MISSING)
            field_path = f"{path}.{name}" if path else name
            if raw is _MISSING or (raw is None and required):
                if required:
                    raise MissingHeaderField(field_path, _type_name(hints[name]))
                continue
            kwargs[name] = conv(raw, field_path)
        return cls(**kwargs)

    _CACHE[cls] = convert
    return convert


_FAST: dict[type, Callable[[Any], Any]] = {}
_EXACT = (str, bool, bytes)


def _fast_check(tp: Any, var: str) -> list[str] | None:
    """Source lines rejecting (`return slow(value)`) a value `var` not exactly of type `tp` (or an
    integer outside its range), for the annotations the fast path handles (exact scalars, ranged
    ints, their `| None`, `dict[str, str]`); None for any other annotation (the field goes through
    its generic converter)."""
    bounds = _int_range(tp)
    if bounds is not None:
        return [f"if type({var}) is not int or not {bounds.low} <= {var} <= {bounds.high}: return slow(value)"]
    if tp in _EXACT:
        return [f"if type({var}) is not {tp.__name__}: return slow(value)"]
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            return None
        bounds = _int_range(inner[0])
        if bounds is not None:
            return [f"if {var} is not None and (type({var}) is not int or not {bounds.low} <= {var} <= "
                    f"{bounds.high}): return slow(value)"]
        if inner[0] in _EXACT:
            return [f"if {var} is not None and type({var}) is not {inner[0].__name__}: return slow(value)"]
        return None
    if origin is dict and typing.get_args(tp) == (str, str):
        return [f"if type({var}) is not dict: return slow(value)",
                f"for k, x in {var}.items():",
                "    if type(k) is not str or type(x) is not str: return slow(value)",
                f"{var} = dict({var})"]
    return None


def _fast_converter(cls: type) -> Callable[[Any], Any]:
    """A generated `value -> cls(...)` for a decoded map whose fields all have exactly their
    declared types (the normal case on the wire): plain `type(v) is int` checks inline, no per-field
    calls. Anything else (a missing or mistyped field, a subtype, a nested dataclass) goes to the
    generic converter, which builds the same value or raises the same `MissingHeaderField`: the
    fast path only ever accepts what the generic one accepts, and builds an equal value."""
    cached = _FAST.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls, include_extras=True)
    generic = _dataclass_converter(cls)
    lines = ["def fast(value):", "    if type(value) is not dict: return slow(value)"]
    env: dict[str, Any] = {"slow": lambda value: generic(value, ""), "cls": cls, "MISSING": _MISSING}
    args = []
    for i, f in enumerate(dataclasses.fields(cls)):
        var = f"v{i}"
        if f.default is not _MISSING:
            env[f"d{i}"] = f.default
            lines.append(f"    {var} = value.get({f.name!r}, d{i})")
        elif f.default_factory is not _MISSING:
            lines.append(f"    {var} = value.get({f.name!r}, MISSING)")
            lines.append(f"    if {var} is MISSING: return slow(value)")
        else:       # required: absent or nil is the generic path's MissingHeaderField
            lines.append(f"    {var} = value.get({f.name!r}, MISSING)")
            lines.append(f"    if {var} is MISSING or {var} is None: return slow(value)")
        check = _fast_check(hints[f.name], var)
        if check is None:
            env[f"c{i}"] = converter_for(hints[f.name])
            lines.append(f"    {var} = c{i}({var}, {f.name!r})")
        else:
            lines.extend(f"    {line}" for line in check)
        args.append(f"{f.name}={var}")
    lines.append(f"    return cls({', '.join(args)})")
    exec("\n".join(lines), env)     # generated from the dataclass's own field list
    fast: Callable[[Any], Any] = env["fast"]
    _FAST[cls] = fast
    return fast


def from_value(cls: type[T], value: Any, path: str = "") -> T:
    """`cls` (a dataclass) built from a decoded msgpack map; raises `MissingHeaderField`."""
    if not path:
        return _fast_converter(cls)(value)  # type: ignore[no-any-return]
    return _dataclass_converter(cls)(value, path)  # type: ignore[no-any-return]


def to_value(obj: Any) -> Any:
    """A dataclass (recursively) as msgpack-ready maps, lists and scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_value(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_value(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_value(v) for k, v in obj.items()}
    return obj
