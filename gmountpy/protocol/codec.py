"""Wire codecs derived from type annotations: how a value of a type goes on the wire and comes back.

`codec(T)` builds, once per type, the encoder and the decoder of T from its
annotations. What each type looks like on the wire (msgpack):

    int, bool, str, bytes, None     as msgpack has them; `Any` as it comes, unchecked
    float                           a float (an int is taken too, and made a float)
    Literal[a, b]                   one of these values, of the same type
    X | Y                           a value of one of them (X | None: nil or an X)
    list[X], tuple[X, ...]          an array of X; tuple[X, Y]: an array of exactly an X and a Y
    dict[str, X]                    a map from strings to X
    a dataclass or NamedTuple       an array of its fields in order (trailing fields that have
                                    defaults may be left out); with a `wire_tag` class attribute,
                                    the tag first (a union of tagged classes is told apart by it)
    a TypedDict                     a map of exactly its keys
    Annotated[X, Range(lo, hi)]     an int within lo..hi
    Annotated[X, MaxLen(n)]         a str, bytes, array or map of at most n characters or items
    a class with `__wire_codec__`   whatever that classmethod gives (a request carried in another)

Decoding is exact: each value is checked against its type and bounds, and a value
that does not fit raises WireError naming where it is (``entries[3].attr: expected
...``). No value is converted but an int where a float goes (and an array where a
tuple goes); a NamedTuple made in this process (a node's call to itself) is taken as
it is. Encoding trusts its input (the code that made it is typed): values msgpack
packs as they are -- scalars, and tuples, lists and maps of them, NamedTuples
included -- are handed over untouched, so a 1 MiB read or a listing of 50,000
entries is never copied or walked to be sent. Decoders are built once per type and
kept (a struct's is unrolled: a listing decodes one per entry).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import reprlib
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints, is_typeddict

__all__ = ["Codec", "MaxLen", "Range", "WireError", "codec", "struct_codec"]

Decode = Callable[[Any], Any]
Encode = Callable[[Any], Any]


class WireError(ValueError):
    """A value that does not fit its type. `where`: the path to it ("" for the value itself)."""

    def __init__(self, problem: str, where: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.where = where

    def within(self, step: str | int) -> WireError:
        """The same error one level up: inside field `step` (a name) or item `step` (an index)."""
        head = f"[{step}]" if isinstance(step, int) else step
        if not self.where:
            return WireError(self.problem, head)
        return WireError(self.problem, head + (self.where if self.where.startswith("[") else "." + self.where))

    def __str__(self) -> str:
        return f"`{self.where}`: {self.problem}" if self.where else self.problem


@dataclass(frozen=True)
class Range:
    """Bounds of an int, both included (None: unbounded on that side)."""

    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class MaxLen:
    """The most characters of a str, bytes of a bytes, or items of an array or a map."""

    limit: int


@dataclass(frozen=True)
class Codec:
    """A type's wire form. `decode` checks (and builds) a value from the wire; `encode` makes a
    value msgpack can pack, None when msgpack packs the value as it is. `checks_only`: decode
    hands back the very value it was given when it fits (nothing is built)."""

    decode: Decode
    encode: Encode | None
    checks_only: bool = False

    def to_wire(self, value: Any) -> Any:
        return value if self.encode is None else self.encode(value)


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 4
_repr.maxlevel = 2


def shown(value: Any) -> str:
    """A short description of an untrusted value, for an error message (never the whole of it)."""
    if isinstance(value, str) and len(value) > 60:
        return f"a string of {len(value)} characters"
    if isinstance(value, bytes) and len(value) > 60:
        return f"{len(value)} bytes"
    return f"{_repr.repr(value)} ({type(value).__name__})"


def _mismatch(expected: str, value: Any) -> WireError:
    return WireError(f"expected {expected}, got {shown(value)}")


def codec(tp: Any) -> Codec:
    """The codec of type `tp` (built once; see the module for the types it knows)."""
    return _codec(tp)


@functools.cache
def _codec(tp: Any) -> Codec:
    origin = get_origin(tp)
    if origin is Annotated:
        return _annotated(tp)
    hook = getattr(origin or tp, "__wire_codec__", None)
    if hook is not None:
        return hook(tp)  # type: ignore[no-any-return]
    if tp is Any:
        return Codec(lambda value: value, None, checks_only=True)
    if tp in _SCALARS:
        return _SCALARS[tp]
    if origin is Literal:
        return _literal(get_args(tp))
    if origin is Union or origin is types.UnionType:
        return _union(get_args(tp))
    if origin is list:
        return _array(get_args(tp)[0], list)
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return _array(args[0], tuple)
        return _fixed_tuple(args)
    if origin is dict:
        return _map(*get_args(tp))
    if is_typeddict(tp):
        return _typed_dict(tp)
    if _is_struct(origin or tp):
        return struct_codec(tp)
    raise TypeError(f"no wire codec for {tp!r}")


# --------------------------------------------------------------------------- scalars


def _exact(kind: type, expected: str) -> Codec:
    def decode(value: Any) -> Any:
        if type(value) is kind:
            return value
        raise _mismatch(expected, value)

    return Codec(decode, None, checks_only=True)


def _decode_none(value: Any) -> None:
    if value is not None:
        raise _mismatch("nil", value)


def _decode_float(value: Any) -> float:
    kind = type(value)
    if kind is float:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return float(value)
    raise _mismatch("a number", value)


_SCALARS: dict[Any, Codec] = {
    int: _exact(int, "an integer"), bool: _exact(bool, "true or false"), str: _exact(str, "a string"),
    bytes: _exact(bytes, "bytes"), float: Codec(_decode_float, None),
    None: Codec(_decode_none, None, checks_only=True), type(None): Codec(_decode_none, None, checks_only=True),
}
#: What an array arrives as: a list from msgpack, a tuple (a NamedTuple too) from this process.
_ARRAYS = (list, tuple)
#: The types a scalar codec takes as they are: a struct of only these is checked in one pass.
_PLAIN = {int: int, bool: bool, str: str, bytes: bytes}


def _literal(values: tuple[Any, ...]) -> Codec:
    allowed = {(type(value), value) for value in values}
    expected = " or ".join(repr(value) for value in values)

    def decode(value: Any) -> Any:
        if type(value) in (str, int, bool, bytes) and (type(value), value) in allowed:
            return value
        raise _mismatch(expected, value)

    return Codec(decode, None, checks_only=True)


def _annotated(tp: Any) -> Codec:
    base, *marks = get_args(tp)
    if len(marks) == 1 and base in _PLAIN:  # the common bounded scalars, checked in one call
        fused = _bounded_scalar(base, marks[0])
        if fused is not None:
            return Codec(fused, None, checks_only=True)
    inner = codec(base)
    decode = inner.decode
    for mark in marks:
        if isinstance(mark, Range):
            decode = _in_range(decode, mark)
        elif isinstance(mark, MaxLen):
            decode = _at_most(decode, mark.limit)
    return Codec(decode, inner.encode, inner.checks_only)


def _bounded_scalar(base: type, mark: Any) -> Decode | None:
    """An int within a Range, a str or bytes within a MaxLen: one type check and one comparison."""
    slow = _annotated_slowly(base, mark)
    if base is int and isinstance(mark, Range) and mark.low is not None and mark.high is not None:
        low, high = mark.low, mark.high

        def in_range(value: Any) -> Any:
            if type(value) is int and low <= value <= high:
                return value
            return slow(value)  # raises, saying what is wrong

        return in_range
    if base in (str, bytes) and isinstance(mark, MaxLen):
        limit = mark.limit

        def short(value: Any) -> Any:
            if type(value) is base and len(value) <= limit:
                return value
            return slow(value)

        return short
    return None


def _annotated_slowly(base: type, mark: Any) -> Decode:
    decode = codec(base).decode
    if isinstance(mark, Range):
        return _in_range(decode, mark)
    if isinstance(mark, MaxLen):
        return _at_most(decode, mark.limit)
    return decode


def _in_range(decode: Decode, bounds: Range) -> Decode:
    low = -float("inf") if bounds.low is None else bounds.low
    high = float("inf") if bounds.high is None else bounds.high

    def check(value: Any) -> Any:
        value = decode(value)
        if low <= value <= high:
            return value
        raise WireError(f"{value} is out of range ({bounds.low if bounds.low is not None else ''}.."
                        f"{bounds.high if bounds.high is not None else ''})")

    return check


def _at_most(decode: Decode, limit: int) -> Decode:
    def check(value: Any) -> Any:
        if type(value) in (str, bytes, list, tuple, dict) and len(value) > limit:  # before looking inside
            raise WireError(f"{shown(value) if isinstance(value, str | bytes) else f'{len(value)} items'}: "
                            f"more than the {limit} allowed")
        return decode(value)

    return check


# --------------------------------------------------------------------------- unions


def _union(members: tuple[Any, ...]) -> Codec:
    optional = type(None) in members
    others = [member for member in members if member is not type(None)]
    if len(others) == 1:
        inner = codec(others[0])
        decode_inner, encode_inner = inner.decode, inner.encode

        def decode_optional(value: Any) -> Any:
            return None if value is None else decode_inner(value)

        encode = None if encode_inner is None else (lambda value: None if value is None else encode_inner(value))
        return Codec(decode_optional, encode, inner.checks_only)
    tags = {getattr(get_origin(member) or member, "wire_tag", None) for member in others}
    if None not in tags and len(tags) == len(others):
        return _tagged_union(others, optional)
    codecs = [codec(member) for member in others]
    expected = " or ".join(_describe(member) for member in members)

    def decode(value: Any) -> Any:
        if value is None and optional:
            return None
        for member in codecs:
            try:
                return member.decode(value)
            except WireError:
                continue
        raise _mismatch(expected, value)

    if all(member.encode is None for member in codecs):
        return Codec(decode, None, all(member.checks_only for member in codecs))
    raise TypeError(f"an untagged union of types that need encoding has no wire codec: {members!r}")


def _tagged_union(members: list[Any], optional: bool) -> Codec:
    """Message classes told apart by their `wire_tag`, the first item of their array."""
    by_tag = {(get_origin(member) or member).wire_tag: codec(member) for member in members}
    by_class = {get_origin(member) or member: codec(member) for member in members}
    expected = " or ".join(f"[{tag!r}, ...]" for tag in by_tag)

    def decode(value: Any) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, _ARRAYS) and value and type(value[0]) is str:
            member = by_tag.get(value[0])
            if member is not None:
                return member.decode(value)
        raise _mismatch(expected, value)

    def encode(value: Any) -> Any:
        return None if value is None else by_class[type(value)].to_wire(value)

    return Codec(decode, encode)


# --------------------------------------------------------------------------- collections


def _locate(error: WireError, decode: Decode, items: Sequence[Any] | Any) -> WireError:
    """Which item of `items` made `error` (decoding them again, on the error path only)."""
    for index, item in enumerate(items):
        try:
            decode(item)
        except WireError as exc:
            return exc.within(index)
    return error


def _array(item_type: Any, make: type[list[Any]] | type[tuple[Any, ...]]) -> Codec:
    item = codec(item_type)
    decode_item, encode_item = item.decode, item.encode
    plain = _PLAIN.get(item_type)

    def decode(value: Any) -> Any:
        if not isinstance(value, _ARRAYS):
            raise _mismatch("an array", value)
        if plain is not None and (not value or set(map(type, value)) == {plain}):  # one pass, in C
            return value if type(value) is make else make(value)
        try:
            if item.checks_only:
                for v in value:
                    decode_item(v)
                return value if type(value) is make else make(value)
            decoded = [decode_item(v) for v in value]
            return decoded if make is list else make(decoded)
        except WireError as exc:
            raise _locate(exc, decode_item, value) from None

    if encode_item is None:
        return Codec(decode, None)
    return Codec(decode, lambda value: [encode_item(v) for v in value])


def _fixed_tuple(item_types: tuple[Any, ...]) -> Codec:
    items = [codec(item) for item in item_types]
    decoders = [item.decode for item in items]
    expected = f"an array of {len(items)} items"

    def decode(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, _ARRAYS) or len(value) != len(decoders):
            raise _mismatch(expected, value)
        try:
            return tuple([decode_item(v) for decode_item, v in zip(decoders, value, strict=True)])
        except WireError:
            for index, (decode_item, v) in enumerate(zip(decoders, value, strict=True)):
                try:
                    decode_item(v)
                except WireError as exc:
                    raise exc.within(index) from None
            raise

    if all(item.encode is None for item in items):
        return Codec(decode, None)
    encoders = [item.to_wire for item in items]
    return Codec(decode, lambda value: [encode_item(v) for encode_item, v in zip(encoders, value, strict=True)])


def _map(key_type: Any, value_type: Any) -> Codec:
    if (get_args(key_type)[0] if get_origin(key_type) is Annotated else key_type) is not str:
        raise TypeError(f"map keys on the wire are strings, not {key_type!r}")
    decode_key = codec(key_type).decode
    item = codec(value_type)
    decode_item, encode_item = item.decode, item.encode

    def decode(value: Any) -> dict[str, Any]:
        if type(value) is not dict:
            raise _mismatch("a map", value)
        for key in value:
            try:
                decode_key(key)
            except WireError as exc:
                raise WireError(f"a map key: {exc}") from None
        try:
            if item.checks_only:
                for v in value.values():
                    decode_item(v)
                return value
            return {key: decode_item(v) for key, v in value.items()}
        except WireError:
            for key, v in value.items():
                try:
                    decode_item(v)
                except WireError as exc:
                    raise exc.within(f"[{key!r}]") from None
            raise

    if encode_item is None:
        return Codec(decode, None, item.checks_only)
    return Codec(decode, lambda value: {key: encode_item(v) for key, v in value.items()})


def _typed_dict(kind: Any) -> Codec:
    hints = get_type_hints(kind, include_extras=True)
    fields = {name: codec(tp) for name, tp in hints.items()}
    required = frozenset(kind.__required_keys__)
    checks_only = all(field.checks_only for field in fields.values())

    def decode(value: Any) -> dict[str, Any]:
        if type(value) is not dict:
            raise _mismatch(f"a map ({kind.__name__})", value)
        missing = required - value.keys()
        if missing:
            raise WireError(f"{kind.__name__} lacks {', '.join(sorted(missing))}")
        unknown = value.keys() - fields.keys()
        if unknown:
            raise WireError(f"{kind.__name__} has no {', '.join(sorted(map(str, unknown)))}")
        decoded = {}
        for name, v in value.items():
            try:
                decoded[name] = fields[name].decode(v)
            except WireError as exc:
                raise exc.within(name) from None
        return value if checks_only else decoded

    if all(field.encode is None for field in fields.values()):
        return Codec(decode, None, checks_only)
    return Codec(decode, lambda value: {name: fields[name].to_wire(v) for name, v in value.items()})


# --------------------------------------------------------------------------- structs


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and (dataclasses.is_dataclass(tp) or (issubclass(tp, tuple) and
                                                                      hasattr(tp, "_fields")))


def _fields(tp: Any) -> tuple[Any, list[tuple[str, Any, Any]]]:
    """The class of struct type `tp` (a dataclass or NamedTuple, maybe parameterized: PartOk[X]) and
    its fields in order as (name, type, default or dataclasses.MISSING), type variables substituted."""
    cls: Any = get_origin(tp) or tp
    owner: str = cls.__name__
    hints = get_type_hints(cls, include_extras=True)
    substitute = dict(zip(getattr(cls, "__parameters__", ()), get_args(tp), strict=False))

    def resolve(field_type: Any) -> Any:
        if isinstance(field_type, TypeVar):
            return substitute.get(field_type, Any)
        return field_type

    if dataclasses.is_dataclass(cls):
        fields: list[tuple[str, Any, Any]] = []
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            if field.default_factory is not dataclasses.MISSING:
                raise TypeError(f"{owner}.{field.name}: a wire field takes a plain default, not a factory")
            fields.append((field.name, resolve(hints[field.name]), field.default))
        return cls, fields
    defaults = cls._field_defaults
    return cls, [(name, resolve(hints[name]), defaults.get(name, dataclasses.MISSING)) for name in cls._fields]


def struct_codec(tp: Any) -> Codec:
    """A dataclass's or NamedTuple's codec: an array of its fields (after its `wire_tag`, if any)."""
    return _struct_codec(tp)


@functools.cache
def _struct_codec(tp: Any) -> Codec:
    cls, fields = _fields(tp)
    names = [name for name, _, _ in fields]
    codecs = [codec(field_type) for _, field_type, _ in fields]
    decoders = [field.decode for field in codecs]
    defaults = [default for _, _, default in fields]
    required = next((i for i, default in enumerate(defaults) if default is not dataclasses.MISSING), len(fields))
    total = len(fields)
    tag: str | None = cls.__dict__.get("wire_tag")
    skip = 0 if tag is None else 1
    plain = [_PLAIN.get(field_type) for _, field_type, _ in fields]
    all_plain = tuple(plain) if all(plain) else None  # (int, int, ...): checked in one pass, in C
    is_tuple = issubclass(cls, tuple)
    make: Callable[[Any], Any] = functools.partial(tuple.__new__, cls) if is_tuple else (lambda values: cls(*values))
    expected = f"an array of {total} fields ({cls.__name__})" if required == total else \
        f"an array of {required} to {total} fields ({cls.__name__})"

    whole = _all_fields(total, decoders, make)

    def decode(value: Any) -> Any:
        if type(value) is cls and is_tuple:  # made in this process (a node's call to itself): typed already
            return value
        if not isinstance(value, _ARRAYS):
            raise _mismatch(expected, value)
        if skip:
            if not value or value[0] != tag:
                raise _mismatch(f"[{tag!r}, ...] ({cls.__name__})", value)
            value = value[1:]
        count = len(value)
        if count == total:
            if all_plain is not None and tuple(map(type, value)) == all_plain:
                return make(value)
            try:
                return whole(value)
            except WireError:
                pass  # said below, with the field's name
        elif not required <= count <= total:
            raise WireError(f"{count} fields where {cls.__name__} has {required if required == total else expected}: "
                            f"{', '.join(names)}")
        try:
            values = [decode_field(v) for decode_field, v in zip(decoders, value, strict=False)]
        except WireError:
            for name, decode_field, v in zip(names, decoders, value, strict=False):
                try:
                    decode_field(v)
                except WireError as exc:
                    raise exc.within(name) from None
            raise
        if count < total:
            values += defaults[count:]
        return make(values)

    identity = all(field.encode is None for field in codecs)
    if is_tuple and identity and tag is None:
        return Codec(decode, None)
    get: Callable[[Any], Any]
    if is_tuple:
        get = tuple
    elif total == 1:
        only = operator.attrgetter(names[0])
        get = lambda value: (only(value),)  # noqa: E731
    elif total == 0:
        get = lambda value: ()  # noqa: E731
    else:
        get = operator.attrgetter(*names)
    head = [] if tag is None else [tag]
    if identity:
        return Codec(decode, lambda value: [*head, *get(value)])
    encoders = [field.to_wire for field in codecs]
    return Codec(decode, lambda value: [*head, *(encode(v) for encode, v in zip(encoders, get(value), strict=True))])


def _all_fields(total: int, decoders: list[Decode], make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A struct's decoder for when every field is there, unrolled (a listing decodes 50,000 of them):
    lambda value: make((d0(value[0]), d1(value[1]), ...))."""
    calls = "".join(f"d{i}(value[{i}]), " for i in range(total))
    namespace = {f"d{i}": decoder for i, decoder in enumerate(decoders)} | {"make": make}
    return eval(f"lambda value: make(({calls}))", namespace)  # type: ignore[no-any-return]  # noqa: S307


def _describe(tp: Any) -> str:
    names = {int: "an integer", bool: "true or false", str: "a string", bytes: "bytes", float: "a number",
             type(None): "nil"}
    return names.get(tp, getattr(tp, "__name__", repr(tp)))
