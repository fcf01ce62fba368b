"""The request bounds are enforced while a request is decoded, by every decoder.

Before: a 4 MiB gRPC request of 466,000 descriptors was decoded whole (466,000 Descriptor
objects, ~320 ms of loop time) and only then refused by the service; a descriptor value had
no bound at all (one 1 MB value made a 1 MB counter key).
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.attacks import many_descriptors

from ratelimitd.messages import Bounds, Descriptor, TooLarge
from ratelimitd.transport import _wire, jsoncodec, protocodec

DECODERS: dict[str, Callable[..., Any]] = {
    "compiled": _wire.decode_request,
    "upb": protocodec.decode_request_upb,
}
BOUNDS = Bounds(max_descriptors=3, max_entries=2, max_value_length=8)


@pytest.fixture(params=list(DECODERS))
def decode(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return DECODERS[request.param]


def grpc_request(*descriptors: tuple[tuple[str, str], ...]) -> bytes:
    return protocodec.encode_request("d", [Descriptor(d) for d in descriptors])


def json_request(*descriptors: tuple[tuple[str, str], ...]) -> bytes:
    ds = [{"entries": [{"key": k, "value": v} for k, v in d]} for d in descriptors]
    return json.dumps({"domain": "d", "descriptors": ds}).encode()


CASES = [
    ((("k", "v"),) * 4, "4 descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST=3)"),
    (
        ((("a", "1"), ("b", "2"), ("c", "3")),),
        "a descriptor with 3 entries (MAX_ENTRIES_PER_DESCRIPTOR=2)",
    ),
    (((("k", "123456789"),),), "a descriptor value of 9 bytes (MAX_DESCRIPTOR_VALUE_LENGTH=8)"),
    (((("é" * 5, "v"),),), "a descriptor key of 10 bytes (MAX_DESCRIPTOR_VALUE_LENGTH=8)"),
]  # fmt: skip


@pytest.mark.parametrize(("descriptors", "message"), CASES)
def test_every_decoder_refuses_past_the_bounds(
    decode: Callable[..., Any], descriptors: Any, message: str
) -> None:
    with pytest.raises(TooLarge) as grpc_error:
        decode(grpc_request(*[(d,) if isinstance(d[0], str) else d for d in descriptors]), BOUNDS)
    assert str(grpc_error.value) == message
    with pytest.raises(TooLarge) as json_error:
        jsoncodec.decode_request(
            json_request(*[(d,) if isinstance(d[0], str) else d for d in descriptors]), BOUNDS
        )
    assert str(json_error.value) == message


def test_at_the_bounds_a_request_is_decoded(decode: Callable[..., Any]) -> None:
    at = (("a", "12345678"), ("é" * 4, "v"))
    request = decode(grpc_request(at, at, at), BOUNDS)
    assert len(request.descriptors) == 3 and request.descriptors[0].entries == at
    assert len(jsoncodec.decode_request(json_request(at, at, at), BOUNDS).descriptors) == 3


def test_no_bounds_no_limit(decode: Callable[..., Any]) -> None:
    assert len(decode(many_descriptors("d", 5000)).descriptors) == 5000


def test_a_huge_request_is_refused_before_anything_is_built() -> None:
    """466,000 descriptors in 4 MiB: refused naming its real size, and the compiled codec
    builds (almost) nothing to say so (before: every descriptor was decoded first)."""
    data = many_descriptors("d", 466_000)
    assert len(data) < 4 * 1024 * 1024
    expected = "466000 descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST=1024)"
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge) as error:
            _wire.decode_request(data, Bounds())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (
        str(error.value) == "466000 descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST=1024)"
    )
    assert peak < 1024 * 1024  # 1,024 small descriptors at most, not 466,000
    with pytest.raises(TooLarge) as error:
        protocodec.decode_request_upb(data, Bounds())
    assert str(error.value) == expected


text = st.text(max_size=6)
entries = st.lists(st.tuples(text, text), max_size=3).map(tuple)


@settings(max_examples=300, deadline=None)
@given(ds=st.lists(entries, max_size=4))
def test_the_compiled_codec_refuses_exactly_as_its_twin(ds: list[Any]) -> None:
    data = grpc_request(*ds)
    outcomes = []
    for decode in DECODERS.values():
        try:
            outcomes.append(decode(data, BOUNDS))
        except TooLarge as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
