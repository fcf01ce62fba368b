"""The compiled RLS codec (`_wire`) agrees with the upb-backed generated classes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimitd.config import Rule
from ratelimitd.messages import Descriptor, Response, Status
from ratelimitd.transport import _wire, protocodec
from ratelimitd.transport.protocodec import DecodeError

text = st.text(max_size=12)
u32 = st.integers(0, 2**32 - 1)
descriptors = st.builds(
    Descriptor,
    st.lists(st.tuples(text, text), max_size=3).map(tuple),
    st.none() | st.tuples(u32, st.integers(0, 7)),
    st.none() | st.integers(0, 2**64 - 1),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(domain=text, ds=st.lists(descriptors, max_size=4), hits=u32)
def test_decode_matches_upb(domain: str, ds: list[Descriptor], hits: int) -> None:
    data = protocodec.encode_request(domain, ds, hits)
    assert _wire.decode_request(data) == protocodec.decode_request_upb(data)


def test_recent_strings_are_reused_only_when_equal() -> None:
    # The compiled decoder hands a short string it decoded recently out again: strings of
    # one length and the same end bytes (one slot of its table) still decode as themselves.
    seen = []
    for value in ("axb", "ayb", "axb", "a\u00e9b", "ayb", "a\u00e8b", "a\u00e9b"):
        data = protocodec.encode_request("d", [Descriptor((("k", value),))], 0)
        entries = _wire.decode_request(data).descriptors[0].entries
        assert entries == (("k", value),)
        seen.append(entries[0][0])
    assert all(key is seen[0] for key in seen)  # the same object each time


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_is_refused_or_decoded_like_upb(data: bytes) -> None:
    try:
        expected: Any = protocodec.decode_request_upb(data)
    except DecodeError as exc:
        expected = str(exc)
    try:
        got: Any = protocodec.decode_request(data)
    except DecodeError as exc:
        got = str(exc)
    if isinstance(expected, str) and isinstance(got, str):
        assert got == expected  # both refuse with grpc-go's words
    elif isinstance(expected, str) or isinstance(got, str):
        # upb may accept some bytes we refuse (e.g. groups) or vice versa; never a crash.
        return
    assert got == expected


rules = st.builds(
    lambda rpu, unit, name: Rule("d.k", rpu, unit, name=name), u32, st.integers(1, 7), text
)
statuses = st.builds(
    Status,
    st.integers(0, 2),
    st.none() | rules,
    u32,
    st.integers(0, 31_536_000),
)
responses = st.builds(
    Response,
    st.integers(0, 2),
    st.lists(statuses, max_size=4),
    st.lists(st.tuples(text, text), max_size=3),
    st.none()
    | st.dictionaries(
        text, st.none() | st.booleans() | text | st.floats(allow_nan=False), max_size=3
    ),
    st.lists(st.tuples(text, text), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(responses)
def test_encode_is_byte_identical_to_upb(resp: Response) -> None:
    for st_ in resp.statuses:
        if st_.rule is None:
            st_.duration_until_reset = 0  # a status without a limit carries no reset
    assert protocodec.encode_response(resp) == protocodec.encode_response_upb(resp)


def test_compiled_codec_is_in_use_by_default() -> None:
    import os

    expected = "pure" if os.environ.get("RATELIMITD_NO_EXTENSIONS") else "compiled"
    assert expected == protocodec.IMPLEMENTATION


def _tag(number: int, wire: int) -> bytes:
    out, n = bytearray(), number << 3 | wire
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out) + bytes([n])


def _len(number: int, body: bytes) -> bytes:
    return _tag(number, 2) + bytes([len(body)]) + body


GO_DECODE_ERROR = "proto: cannot parse invalid wire-format data"
ENTRY = _len(1, b"k") + _len(2, b"v")
# Field number 0 (any wire type) and numbers above 2^29-1 in every message of a request.
INVALID_FIELD_NUMBERS = {
    "request": _tag(0, 0) + b"\x00",
    "request-len": _tag(0, 2) + b"\x00",
    "request-after-domain": _len(1, b"d") + _tag(0, 0) + b"\x01",
    "request-too-big": _tag(1 << 29, 0) + b"\x00",
    "descriptor": _len(2, _tag(0, 0) + b"\x00"),
    "entry": _len(2, _len(1, ENTRY + _tag(0, 0) + b"\x00")),
    "limit": _len(2, _len(2, _tag(0, 0) + b"\x00")),
    "hits-addend": _len(2, _len(3, _tag(0, 5) + b"\x00\x00\x00\x00")),
}


@pytest.mark.parametrize("data", INVALID_FIELD_NUMBERS.values(), ids=INVALID_FIELD_NUMBERS)
@pytest.mark.parametrize(
    "decode",
    [protocodec.decode_request, protocodec.decode_request_upb],
    ids=[protocodec.IMPLEMENTATION, "upb"],
)
def test_field_number_zero_is_refused_with_grpc_gos_message(decode: Any, data: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode(data)
    assert str(info.value) == GO_DECODE_ERROR


@pytest.mark.parametrize("data", INVALID_FIELD_NUMBERS.values(), ids=INVALID_FIELD_NUMBERS)
def test_the_compiled_codec_refuses_field_number_zero(data: bytes) -> None:
    with pytest.raises(_wire.WireError, match=f"^{GO_DECODE_ERROR}$"):
        _wire.decode_request(data)


@settings(max_examples=200, deadline=None)
@given(domain=text, ds=st.lists(descriptors, min_size=1, max_size=3), where=st.integers(0))
def test_a_field_zero_anywhere_at_the_top_is_refused_by_both(
    domain: str, ds: list[Descriptor], where: int
) -> None:
    data = protocodec.encode_request(domain, ds)
    # Field boundaries at the top level: after each complete field.
    msg = protocodec.RateLimitRequest.FromString(data)
    fields = [_len(1, domain.encode())] if domain else []
    fields += [_len(2, d.SerializeToString()) for d in msg.descriptors]
    fields.insert(where % (len(fields) + 1), _tag(0, 0) + b"\x00")
    bad = b"".join(fields)
    for decode in (protocodec.decode_request, protocodec.decode_request_upb):
        with pytest.raises(DecodeError, match=f"^{GO_DECODE_ERROR}$"):
            decode(bad)
