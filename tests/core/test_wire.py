"""The compiled RLS codec (`_wire`) agrees with the upb-backed generated classes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimitd import _wire
from ratelimitd.config import Rule
from ratelimitd.messages import Descriptor, Response, Status
from ratelimitd.transport import protocodec
from ratelimitd.transport.protocodec import DecodeError

text = st.text(max_size=12)
u32 = st.integers(0, 2**32 - 1)
descriptors = st.builds(
    Descriptor,
    st.lists(st.tuples(text, text), max_size=3).map(tuple),
    st.none() | st.tuples(u32, st.integers(0, 7)),
    st.none() | st.integers(0, 2**64 - 1),
)


@settings(max_examples=300, deadline=None)
@given(domain=text, ds=st.lists(descriptors, max_size=4), hits=u32)
def test_decode_matches_upb(domain: str, ds: list[Descriptor], hits: int) -> None:
    data = protocodec.encode_request(domain, ds, hits)
    assert _wire.decode_request(data) == protocodec.decode_request_upb(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_is_refused_or_decoded_like_upb(data: bytes) -> None:
    try:
        expected: Any = protocodec.decode_request_upb(data)
    except DecodeError:
        expected = DecodeError
    try:
        got: Any = protocodec.decode_request(data)
    except DecodeError:
        got = DecodeError
    if expected is DecodeError or got is DecodeError:
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
