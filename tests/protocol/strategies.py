"""Hypothesis strategies shared by the protocol tests: msgpack values, commands, frames."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from protocol.command import Buffer, RemotingCommand

MSGPACK_INT = st.integers(min_value=-(2**63), max_value=2**64 - 1)
SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), MSGPACK_INT, st.floats(allow_nan=False), st.text(max_size=20),
    st.binary(max_size=20),
)
# Map keys: no bools (True == 1 would collide in a Python dict) and no floats (NaN-free but -0.0 == 0).
MAP_KEYS: st.SearchStrategy[Any] = st.one_of(st.text(max_size=8), MSGPACK_INT, st.binary(max_size=8))
VALUES: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(MAP_KEYS, children, max_size=4),
    max_leaves=12,
)
EXT_MAPS: st.SearchStrategy[dict[str, Any]] = st.dictionaries(st.text(max_size=12), VALUES, max_size=6)


def _as_buffer(data: bytes, kind: int) -> Buffer:
    return data if kind == 0 else bytearray(data) if kind == 1 else memoryview(data)


BUFFERS: st.SearchStrategy[Buffer] = st.builds(
    _as_buffer, st.binary(max_size=64), st.integers(min_value=0, max_value=2))
BODIES: st.SearchStrategy[Any] = st.one_of(
    st.just(b""), BUFFERS, st.lists(BUFFERS, max_size=4),
)


@st.composite
def commands(draw: st.DrawFn) -> RemotingCommand:
    return RemotingCommand(
        code=draw(MSGPACK_INT),
        opaque=draw(MSGPACK_INT),
        flag=draw(MSGPACK_INT),
        remark=draw(st.none() | st.text(max_size=30)),
        fields=draw(EXT_MAPS),
        body=draw(BODIES),
        version=draw(MSGPACK_INT),
    )


def chunk(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` split at the given cut points (any order, duplicates and 0/len allowed)."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
