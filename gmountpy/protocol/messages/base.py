"""What every message has: a request's arguments and reply types, their wire form, and the bounds
of the values they carry.

A request is a frozen dataclass whose fields are the operation's arguments in wire
order, subclassing `Request[Reply]` with the type of its reply. Its wire form, both
ways, is derived from those annotations (gmountpy.protocol.codec): `to_wire()` gives
the arguments as sent, `from_wire(args)` checks arguments received (WireError names
the field that does not fit), `decode(value)` checks and types a reply (OSError EPROTO
naming the operation), `encode_reply(reply)` makes a reply msgpack can send.
"""

from __future__ import annotations

import errno
import inspect
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Generic, Self, TypeVar, get_args, get_origin, get_type_hints

from ..codec import Codec, MaxLen, Range, WireError, codec, shown, struct_codec

R = TypeVar("R", covariant=True)
T = TypeVar("T")

#: The longest path and file name a node takes (Linux's PATH_MAX and NAME_MAX).
PATH_MAX = 4096
NAME_MAX = 255
#: Largest single read or write a peer may ask for.
MAX_IO = 4 * 1024 * 1024
_INT64 = Range(-(2**63), 2**63 - 1)

Pathname = Annotated[str, MaxLen(PATH_MAX)]
Name = Annotated[str, MaxLen(NAME_MAX)]
NodeName = Annotated[str, MaxLen(255)]
Handle = Annotated[int, Range(0, 2**63 - 1)]
Offset = Annotated[int, Range(0, 2**63 - 1)]
Size = Annotated[int, Range(0, 2**63 - 1)]
Count = Annotated[int, Range(0, 2**63 - 1)]
Mode = Annotated[int, Range(0, 0o177777)]
Nanoseconds = Annotated[int, _INT64]


def malformed_reply(op: str, error: WireError) -> OSError:
    return OSError(errno.EPROTO, f"malformed {op} reply: {error} (do both nodes run the same gmountpy?)")


class Message:
    """A reply type, or a part of one: its wire form comes from its annotations."""

    def to_wire(self) -> Any:
        return codec(type(self)).to_wire(self)

    @classmethod
    def from_wire(cls, value: Any) -> Self:
        """The value from its wire form; WireError when it does not fit."""
        return codec(cls).decode(value)  # type: ignore[no-any-return]


#: op name -> request type: every operation a gmountpy node answers (each module of this package adds its own).
REQUESTS: dict[str, type[Request[Any]]] = {}


class Request(Generic[R]):
    """One operation's arguments. `op` names it on the wire; `reply` is its reply's type (the R of
    Request[R] in the class's bases)."""

    op: ClassVar[str]
    reply: ClassVar[Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Request):
                (reply,) = get_args(base)
                if not isinstance(reply, TypeVar):
                    cls.reply = reply
        op = cls.__dict__.get("op")
        if op is not None and cls.__module__.startswith(__package__ + "."):
            if op in REQUESTS:
                raise TypeError(f"two requests are named {op!r}: {REQUESTS[op].__name__} and {cls.__name__}")
            REQUESTS[op] = cls

    @classmethod
    def from_wire(cls, args: Any) -> Self:
        """The request from the arguments received; WireError names the one that does not fit."""
        return struct_codec(cls).decode(args)  # type: ignore[no-any-return]

    def to_wire(self) -> list[Any]:
        """The arguments as sent: the fields in order, each in its wire form."""
        return struct_codec(type(self)).encode(self)  # type: ignore[misc,no-any-return]

    def reply_codec(self) -> Codec:
        """The wire form of this request's reply."""
        return _reply_codec(type(self))

    def decode(self, value: Any) -> R:
        """The reply, checked and typed; OSError(EPROTO) naming the operation when it does not fit."""
        try:
            return self.reply_codec().decode(value)  # type: ignore[no-any-return]
        except WireError as exc:
            raise malformed_reply(self.op, exc) from None

    def encode_reply(self, reply: Any) -> Any:
        """The reply (of this request's reply type) as sent."""
        return self.reply_codec().to_wire(reply)

    @classmethod
    def __wire_codec__(cls, tp: Any) -> Codec:
        """A request carried in another's field: [op, its arguments], of any operation of type `tp`."""
        return _carried(get_origin(tp) or tp)


class Carrying(Request[R]):
    """A request that carries another one (`request`), to be served on someone's behalf. A carried
    request cannot carry one itself (so a peer cannot nest them without end)."""

    request: Request[Any]

    def reply_codec(self) -> Codec:
        return self.request.reply_codec()

    def decode(self, value: Any) -> R:
        """The carried request's reply: a malformed one names the carried request's op."""
        return self.request.decode(value)  # type: ignore[no-any-return]


def _reply_codec(kind: type[Request[Any]]) -> Codec:
    found = _reply_codecs.get(kind)
    if found is None:
        found = _reply_codecs[kind] = codec(kind.reply)
    return found


_reply_codecs: dict[type[Request[Any]], Codec] = {}


def _carried(base: type[Request[Any]]) -> Codec:
    def decode(value: Any) -> Request[Any]:
        if not isinstance(value, list | tuple) or len(value) != 2 or type(value[0]) is not str:
            raise WireError(f"expected [op, arguments] of a request, got {shown(value)}")
        op, args = value
        kind = REQUESTS.get(op)
        if kind is None or not issubclass(kind, base) or issubclass(kind, Carrying):
            raise WireError(f"{shown(op)} is not an operation that can be carried here")
        try:
            return kind.from_wire(args)
        except WireError as exc:
            raise exc.within(op) from None

    return Codec(decode, lambda request: [request.op, request.to_wire()])


#: A handler table: request type -> the function that serves it (it takes the typed request last).
Operations = dict[type[Request[Any]], Callable[..., Any]]


def operations(*handlers: Callable[..., Any]) -> Operations:
    """A handler table made from handlers alone: each serves the request type its last parameter is
    annotated with, so the table cannot pair a handler with another type than it takes."""
    table: Operations = {}
    for handler in handlers:
        target = inspect.unwrap(handler)
        last = list(inspect.signature(target).parameters)[-1:]
        annotation = get_type_hints(target).get(last[0]) if last else None
        kind = get_origin(annotation) or annotation  # IndexBackup[Any]: IndexBackup
        if not (isinstance(kind, type) and issubclass(kind, Request)):
            raise TypeError(f"{handler!r} does not take a request type as its last parameter")
        if kind in table:
            raise TypeError(f"two handlers for {kind.op!r}: {table[kind]!r} and {handler!r}")
        table[kind] = handler
    return table
