"""The sans-IO wire format: every message survives a round trip, in any chunking; garbage never crashes."""

from __future__ import annotations

import os
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmountpy.protocol import wire
from gmountpy.protocol.wire import ErrorReply, FrameDecoder, Hello, ProtocolError, Reply, Request

# Timing is not what these tests check, and a loaded CI machine is slow.
no_deadline = settings(deadline=None)

# ---------------------------------------------------------------- strategies

ids = st.integers(min_value=0, max_value=2**63 - 1)
# msgpack carries integers from -2**63 to 2**64-1; floats are float64, so any non-NaN float is exact.
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=40))
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=25,
)
# File names as Linux has them: any bytes but NUL and "/", shown by Python with lone surrogates.
raw_names = st.binary(min_size=1, max_size=60).filter(lambda b: b"\0" not in b and b"/" not in b)
fs_names = raw_names.map(os.fsdecode)

requests = st.builds(Request, ids, st.text(max_size=16), st.lists(values, max_size=6))
replies = st.builds(Reply, ids, values)
errors = st.builds(ErrorReply, ids, st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(max_size=40))
hellos = st.builds(Hello, st.dictionaries(st.text(max_size=10), values, max_size=6))
messages = requests | replies | errors | hellos


def decode_all(data: bytes) -> list[wire.Message]:
    decoder = FrameDecoder()
    out = decoder.feed(data)
    assert decoder.pending == 0
    return out


# ---------------------------------------------------------------- round trips


@no_deadline
@given(messages)
def test_every_message_kind_round_trips(message: wire.Message) -> None:
    assert decode_all(wire.encode(message)) == [message]


@no_deadline
@given(requests)
def test_encode_request_matches_generic_encode(message: Request) -> None:
    assert wire.encode_request(message.id, message.op, message.args) == wire.encode(message)


def test_frame_layout() -> None:
    frame = wire.encode_reply(7, b"xyz")
    version, length = wire.HEADER.unpack_from(frame)
    assert (version, length) == (wire.VERSION, len(frame) - wire.HEADER.size)
    assert msgpack.unpackb(frame[wire.HEADER.size:]) == [wire.REPLY, 7, b"xyz"]


def test_bytes_and_str_stay_distinct() -> None:
    [message] = decode_all(wire.encode_reply(1, [b"abc", "abc", {"k": b"\x00\xff"}]))
    assert message == Reply(1, [b"abc", "abc", {"k": b"\x00\xff"}])
    assert type(message.result[0]) is bytes and type(message.result[1]) is str


def test_extreme_integers_round_trip() -> None:
    for value in (-(2**63), 2**63 - 1, 2**64 - 1, 0, -1):
        assert decode_all(wire.encode_reply(2**63 - 1, value)) == [Reply(2**63 - 1, value)]


def test_integers_beyond_msgpack_range_are_refused_at_encode() -> None:
    with pytest.raises(OverflowError):
        wire.encode_reply(1, 2**64)


def test_encode_refuses_what_is_not_a_message() -> None:
    with pytest.raises(TypeError, match="not a wire message"):
        wire.encode("hello")  # type: ignore[arg-type]


def test_encode_refuses_unpackable_arguments() -> None:
    with pytest.raises(TypeError):
        wire.encode_request(1, "op", [object()])


def test_encode_refuses_an_oversized_frame() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        wire.encode_reply(1, bytes(wire.MAX_FRAME))


@no_deadline
@given(st.lists(fs_names, min_size=1, max_size=5))
def test_non_utf8_file_names_survive_a_round_trip(names: list[str]) -> None:
    """A file named with bytes that are not UTF-8 must stay reachable (and its directory listable)."""
    [request] = decode_all(wire.encode_request(1, "lookup", ["/" + "/".join(names)]))
    assert isinstance(request, Request)
    assert request.args == ["/" + "/".join(names)]
    assert [os.fsencode(n) for n in request.args[0][1:].split("/")] == [os.fsencode(n) for n in names]
    listing = [(name, [0o100644, 1]) for name in names]
    assert decode_all(wire.encode_reply(2, listing)) == [Reply(2, [[n, a] for n, a in listing])]


def test_invalid_utf8_in_a_received_string_decodes_with_surrogates() -> None:
    body = b"\x93" + b"\x01\x05" + b"\xa2\xff\xfe"  # [1, 5, str(b"\xff\xfe")]
    assert wire.decode_body(body) == Reply(5, "\udcff\udcfe")


# ---------------------------------------------------------------- framing


@no_deadline
@given(st.lists(messages, max_size=8), st.data())
def test_any_chunking_yields_the_same_messages(batch: list[wire.Message], data: st.DataObject) -> None:
    frames = [wire.encode(m) for m in batch]
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.sets(st.integers(min_value=0, max_value=len(stream)), max_size=12)))
    decoder = FrameDecoder()
    received: list[wire.Message] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        received += decoder.feed(stream[start:end])
        consumed = sum(len(frame) for frame in frames[:len(received)])
        assert decoder.pending == end - consumed
    assert received == batch
    assert decoder.pending == 0


@no_deadline
@given(messages, st.data())
def test_a_truncated_frame_waits_for_the_rest(message: wire.Message, data: st.DataObject) -> None:
    frame = wire.encode(message)
    cut = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
    decoder = FrameDecoder()
    assert decoder.feed(frame[:cut]) == []
    assert decoder.pending == cut
    assert decoder.feed(frame[cut:]) == [message]
    assert decoder.pending == 0


def test_byte_by_byte() -> None:
    frames = wire.encode_hello({"a": 1}) + wire.encode_request(3, "read", [1, 0, 4096])
    decoder = FrameDecoder()
    out: list[wire.Message] = []
    for i in range(len(frames)):
        out += decoder.feed(frames[i:i + 1])
    assert out == [Hello({"a": 1}), Request(3, "read", [1, 0, 4096])]


# 1: before the handshake hid names; 2: before attributes carried dev and ino; 3: before the typed codec;
# 4: before settle and index_owned; 6: a newer gmountpy
@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 6, 255])
def test_wrong_version_is_refused_from_the_header_alone(version: int) -> None:
    with pytest.raises(ProtocolError, match=f"wire version {version} is not supported"):
        FrameDecoder().feed(wire.HEADER.pack(version, 3))


def test_wrong_version_after_a_good_frame() -> None:
    good = wire.encode_reply(1, None)
    decoder = FrameDecoder()
    assert decoder.feed(good) == [Reply(1, None)]
    with pytest.raises(ProtocolError):
        decoder.feed(wire.HEADER.pack(9, 0))


def test_oversized_length_is_refused_before_the_body_arrives() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.feed(wire.HEADER.pack(wire.VERSION, wire.MAX_FRAME + 1))
    with pytest.raises(ProtocolError, match="exceeds the 100-byte limit"):
        FrameDecoder(max_frame=100).feed(wire.HEADER.pack(wire.VERSION, 101) + b"\x90")


def test_largest_allowed_length_just_waits() -> None:
    decoder = FrameDecoder(max_frame=100)
    assert decoder.feed(wire.HEADER.pack(wire.VERSION, 100) + b"\x00" * 10) == []
    assert decoder.pending == 15


def test_before_the_handshake_only_small_frames_are_read() -> None:
    """A stranger cannot make a node buffer a large frame: the header alone is refused."""
    decoder = FrameDecoder(preauth=True)
    with pytest.raises(ProtocolError, match="exceeds the 4096-byte limit before the handshake"):
        decoder.feed(wire.HEADER.pack(wire.VERSION, wire.PREAUTH_MAX_FRAME + 1))
    hello = wire.encode_hello({"node": "n1", "nonce": b"\0" * 32, "mac": b"\1" * 32})
    assert FrameDecoder(preauth=True).feed(hello) == [Hello({"node": "n1", "nonce": b"\0" * 32, "mac": b"\1" * 32})]


@pytest.mark.parametrize("value", [
    [[]] * 100,                      # an array of many (empty) arrays: a stall and gigabytes at 16 MiB
    {str(i): i for i in range(20)},  # a big map
    b"x" * 1000,                     # a big binary
    "y" * 1000,                      # a big string
])
def test_before_the_handshake_msgpack_values_are_small(value: Any) -> None:
    frame = wire.encode_hello({"x": value})
    assert len(frame) < wire.PREAUTH_MAX_FRAME
    with pytest.raises(ProtocolError, match="undecodable"):
        FrameDecoder(preauth=True).feed(frame)
    assert FrameDecoder().feed(frame) == [Hello({"x": value})]  # the same frame, once authenticated


def test_authenticate_lifts_the_handshake_limits() -> None:
    decoder = FrameDecoder(preauth=True)
    decoder.authenticate(None)
    big = wire.encode_reply(1, [b"z" * (2 << 20), [[]] * 1000])
    assert decoder.feed(big) == [Reply(1, [b"z" * (2 << 20), [[]] * 1000])]


def test_partial_header_waits() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"\x01\x00") == []
    assert decoder.pending == 2


# ---------------------------------------------------------------- garbage


@pytest.mark.parametrize("body", [
    b"",                                   # empty body
    b"\xc1",                               # never-used msgpack byte
    b"\x90",                               # []
    b"\x01",                               # not an array
    msgpack.packb([9, 1, 2]),              # unknown kind
    msgpack.packb([0, -1, "op", []]),      # negative id
    msgpack.packb([0, 2**63, "op", []]),   # id too large
    msgpack.packb([0, True, "op", []]),    # bool is not an id
    msgpack.packb([0, 1, b"op", []]),      # op must be str
    msgpack.packb([0, 1, "op", {}]),       # args must be a list
    msgpack.packb([0, 1, "op"]),           # too short
    msgpack.packb([1, 1, 2, 3]),           # reply too long
    msgpack.packb([2, 1, "x", "y"]),       # errno must be int
    msgpack.packb([3, [1]]),               # hello fields must be a map
    msgpack.packb([1, 1, {1: 2}]),         # non-string map key
    msgpack.packb([1, 1, None]) + b"\x00",  # trailing data
    b"\x91" * 5000 + b"\xc0",              # nesting deeper than msgpack allows
    b"\xdd\xff\xff\xff\xff",               # array claims 4 billion items
])
def test_malformed_bodies_raise_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire.decode_body(body)
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(wire.HEADER.pack(wire.VERSION, len(body)) + body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decode_body_only_raises_protocol_error(payload: bytes) -> None:
    try:
        message = wire.decode_body(payload)
    except ProtocolError:
        return
    assert isinstance(message, Request | Reply | ErrorReply | Hello)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=64) | st.builds(lambda v, n: wire.HEADER.pack(v, n),
                                                      st.sampled_from([2, 2, 2, 0, 1]),
                                                      st.integers(min_value=0, max_value=80)), max_size=10))
def test_fuzz_feed_only_yields_messages_or_protocol_error(chunks: list[bytes]) -> None:
    decoder = FrameDecoder(max_frame=64)
    for chunk in chunks:
        try:
            out = decoder.feed(chunk)
        except ProtocolError:
            return
        for message in out:
            assert isinstance(message, Request | Reply | ErrorReply | Hello)
        assert decoder.pending >= 0


def shaped_garbage() -> st.SearchStrategy[Any]:
    """Valid msgpack that looks almost like a message: the right kinds, arbitrary fields."""
    return st.lists(values, max_size=5).flatmap(
        lambda rest: st.sampled_from([0, 1, 2, 3, 4, -1, True]).map(lambda kind: [kind, *rest]))


@settings(max_examples=150, deadline=None)
@given(shaped_garbage())
def test_fuzz_well_formed_msgpack_of_the_wrong_shape(body: list[Any]) -> None:
    payload = msgpack.packb(body, use_bin_type=True)
    try:
        message = wire.decode_body(payload)
    except ProtocolError:
        return
    # Whatever was accepted re-encodes to the same message.
    assert decode_all(wire.encode(message)) == [message]


# ---------------------------------------------------------------- per-frame MAC


KEYS = wire.frame_keys(b"s" * 32, b"n" * 32, b"c" * 32, "n1")


def sealed_stream(batch: list[wire.Message]) -> bytes:
    mac = wire.FrameMac(KEYS[0])
    return b"".join(mac.seal(wire.encode(m)) for m in batch)


def mac_decoder() -> FrameDecoder:
    decoder = FrameDecoder()
    decoder.authenticate(wire.FrameMac(KEYS[0]))
    return decoder


@no_deadline
@given(st.lists(messages, min_size=1, max_size=6), st.data())
def test_sealed_frames_round_trip_in_any_chunking(batch: list[wire.Message], data: st.DataObject) -> None:
    stream = sealed_stream(batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder, got = mac_decoder(), []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += decoder.feed(stream[a:b])
    assert got == batch and decoder.pending == 0


@no_deadline
@given(st.lists(messages, min_size=1, max_size=4), st.data())
def test_any_flipped_bit_is_refused(batch: list[wire.Message], data: st.DataObject) -> None:
    """A corrupted frame is never delivered: refused, or (a length made longer) held until more arrives."""
    mac = wire.FrameMac(KEYS[0])
    frames = [mac.seal(wire.encode(m)) for m in batch]
    stream = bytearray(b"".join(frames))
    position = data.draw(st.integers(wire.HEADER.size, len(stream) - 1))  # the first header is caught earlier
    stream[position] ^= 1 << data.draw(st.integers(0, 7))
    corrupted = next(i for i in range(len(frames)) if position < sum(map(len, frames[:i + 1])))
    decoder = mac_decoder()
    try:
        delivered = decoder.feed(bytes(stream))
    except ProtocolError:
        return
    # only a later frame's length can have grown: the frames before it come through, it waits for its body
    assert delivered == batch[:corrupted] and decoder.pending > 0


def test_replayed_reordered_and_foreign_frames_are_refused() -> None:
    mac = wire.FrameMac(KEYS[0])
    first, second = mac.seal(wire.encode_request(1, "unlink", ["/f"])), mac.seal(wire.encode_request(2, "x", []))
    decoder = mac_decoder()
    assert decoder.feed(first) == [Request(1, "unlink", ["/f"])]
    with pytest.raises(wire.IntegrityError, match="frame 1 failed its integrity check"):
        decoder.feed(first)  # replayed
    with pytest.raises(wire.IntegrityError):
        mac_decoder().feed(second + first)  # reordered
    other_direction = wire.FrameMac(KEYS[1]).seal(wire.encode_request(1, "unlink", ["/f"]))
    with pytest.raises(wire.IntegrityError):
        mac_decoder().feed(other_direction)  # reflected back from the other direction
    other_connection = wire.frame_keys(b"s" * 32, b"N" * 32, b"c" * 32, "n1")[0]
    with pytest.raises(wire.IntegrityError):
        mac_decoder().feed(wire.FrameMac(other_connection).seal(wire.encode_request(1, "unlink", ["/f"])))


def test_frame_keys_depend_on_everything_in_the_handshake() -> None:
    base = wire.frame_keys(b"s" * 32, b"n" * 32, b"c" * 32, "n1")
    assert base[0] != base[1]
    for changed in (wire.frame_keys(b"S" * 32, b"n" * 32, b"c" * 32, "n1"),
                    wire.frame_keys(b"s" * 32, b"m" * 32, b"c" * 32, "n1"),
                    wire.frame_keys(b"s" * 32, b"n" * 32, b"d" * 32, "n1"),
                    wire.frame_keys(b"s" * 32, b"n" * 32, b"c" * 32, "n2")):
        assert not set(changed) & set(base)
