"""protocol.signing: a request signed by one side verifies on the other after a trip through the
wire codec; any change to the code, an ext value (at any depth) or the body, a wrong key, or a
missing signature fails."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.command import RemotingCommand, request
from protocol.frame import FrameDecoder, encode_frame_bytes
from protocol.signing import SIGNATURE, Credentials, canonical_bytes, sign, signing_key, verify

CREDENTIALS = Credentials("billing", "s3cret")
scalars = st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.booleans(), st.none(),
                    st.binary(max_size=20), st.floats(allow_nan=False))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
ext_maps = st.dictionaries(st.text(max_size=12).filter(lambda k: not k.startswith("auth_")), values, max_size=8)


def _through_the_wire(cmd: RemotingCommand) -> RemotingCommand:
    [decoded] = FrameDecoder(64 * 1024 * 1024).feed(encode_frame_bytes(cmd))
    return decoded


@settings(max_examples=200, deadline=None)
@given(code=st.integers(0, 65_535), fields=ext_maps, body=st.binary(max_size=200), oneway=st.booleans())
def test_a_signed_request_verifies_after_the_wire_and_not_after_a_change(
        code: int, fields: dict[str, Any], body: bytes, oneway: bool) -> None:
    cmd = request(code, dict(fields), body, oneway=oneway)
    sign(cmd, CREDENTIALS)
    received = _through_the_wire(cmd)
    assert verify(received, CREDENTIALS.key)
    assert not verify(received, signing_key("billing", "other"))
    changed_body = RemotingCommand(received.code, received.opaque, received.flag, None, dict(received.fields),
                                   received.body_bytes() + b"x")
    assert not verify(changed_body, CREDENTIALS.key)
    changed_code = RemotingCommand(received.code + 1, fields=dict(received.fields), body=received.body)
    assert not verify(changed_code, CREDENTIALS.key)
    for key in [k for k in received.fields if k != SIGNATURE]:
        changed = dict(received.fields)
        changed[key] = [changed[key]]
        assert not verify(RemotingCommand(received.code, fields=changed, body=received.body), CREDENTIALS.key)
    unsigned = dict(received.fields)
    del unsigned[SIGNATURE]
    assert not verify(RemotingCommand(received.code, fields=unsigned, body=received.body), CREDENTIALS.key)


def test_the_canonical_form_is_independent_of_map_order_and_body_split() -> None:
    """Another language's client builds the same bytes whatever order it writes its maps in, and a
    body sent as several buffers digests as its concatenation."""
    one = canonical_bytes(10, {"b": 1, "a": {"y": "2", "x": "1"}}, [b"he", b"llo"])
    two = canonical_bytes(10, {"a": {"x": "1", "y": "2"}, "b": 1}, b"hello")
    assert one == two


def test_the_canonical_bytes_of_a_known_request() -> None:
    """The fixed vector docs/protocol.md prints, so another implementation can check itself."""
    cmd = request(10, {"topic": "orders", "queue_id": 0, "properties": {"TAGS": "a", "KEYS": "k"}}, b"hi")
    sign(cmd, Credentials("billing", "s3cret"), now_ms=1_700_000_000_000, nonce="00112233445566778899aabbccddeeff")
    assert signing_key("billing", "s3cret").hex() == "f6db9d023fcba812229d05df553cfde3028387932f8d43a32945aadbf16f0c92"
    assert canonical_bytes(10, cmd.fields, b"hi").hex() == (
        "94af5251312d484d41432d5348413235360a86af617574685f6163636573735f6b6579a762696c6c696e67aa617574685f6e6f6e"
        "6365d9203030313132323333343435353636373738383939616162626363646465656666b1617574685f74696d657374616d705f"
        "6d73cf0000018bcfe56800aa70726f7065727469657382a44b455953a16ba454414753a161a871756575655f696400a5746f7069"
        "63a66f7264657273c4208f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4")
    assert cmd.fields[SIGNATURE] == "1913ed5e8feaa2c13cb5f4051c72a380a579880fdb7f021e330cee0e9e238315"
