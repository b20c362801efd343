"""Hypothesis strategies for the message types, derived from their annotations as the codec is:
values that fit a type (within its bounds), and values that do not."""

from __future__ import annotations

import dataclasses
import types
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints, is_typeddict

from hypothesis import strategies as st

from gmountpy.protocol import messages as msg
from gmountpy.protocol.codec import MaxLen, Range

#: Any character but lone surrogates: random ones do not round-trip (two escaped bytes may make a
#: valid UTF-8 character); names of undecodable bytes are tested apart (tests/node/test_service.py).
TEXT = st.characters(exclude_categories=["Cs"])
#: How long a generated string, bytes or array gets at most (the limits themselves are tested apart).
LONGEST = 40
INT64 = (-(2**63), 2**64 - 1)  # what msgpack carries


def carried_kinds() -> list[type[msg.Request[Any]]]:
    return [kind for kind in msg.REQUESTS.values() if not issubclass(kind, msg.Carrying)]


def values(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of type `tp` that its codec takes."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        base, *marks = args
        for mark in marks:
            if isinstance(mark, Range):
                low = INT64[0] if mark.low is None else mark.low
                high = INT64[1] if mark.high is None else mark.high
                return st.integers(low, high)
            if isinstance(mark, MaxLen):
                return _sized(base, min(mark.limit, LONGEST), depth)
        return values(base, depth)
    if isinstance(origin or tp, type) and issubclass(origin or tp, msg.Request):  # a carried request
        return st.sampled_from(carried_kinds()).flatmap(lambda kind: requests(kind, depth + 1))
    if tp is Any:
        return st.none() | st.integers(-100, 100) | st.text(TEXT, max_size=5)
    if tp is int:
        return st.integers(*INT64)
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is bool:
        return st.booleans()
    if tp is str or tp is bytes:
        return _sized(tp, LONGEST, depth)
    if tp is None or tp is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(args)
    if origin is Union or origin is types.UnionType:
        return st.one_of([values(arg, depth) for arg in args])
    if origin is list:
        return st.lists(values(args[0], depth), max_size=4)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(values(args[0], depth), max_size=4).map(tuple)
        return st.tuples(*[values(arg, depth) for arg in args])
    if origin is dict:
        return st.dictionaries(values(args[0], depth), values(args[1], depth), max_size=3)
    if is_typeddict(tp):
        hints = get_type_hints(tp, include_extras=True)
        return st.fixed_dictionaries({key: values(hints[key], depth) for key in tp.__required_keys__},
                                     optional={key: values(hints[key], depth) for key in tp.__optional_keys__})
    return _struct(tp, depth)


def _sized(base: Any, longest: int, depth: int) -> st.SearchStrategy[Any]:
    if base is str:
        return st.text(TEXT, max_size=longest)
    if base is bytes:
        return st.binary(max_size=longest)
    origin, args = get_origin(base), get_args(base)
    if origin is list:
        return st.lists(values(args[0], depth), max_size=min(longest, 4))
    if origin is dict:
        return st.dictionaries(values(args[0], depth), values(args[1], depth), max_size=min(longest, 3))
    raise TypeError(f"no sized strategy for {base!r}")


def struct_fields(tp: Any) -> tuple[Any, list[tuple[str, Any, bool]]]:
    """A dataclass's or NamedTuple's class and fields (name, type, has a default), type variables as Any."""
    cls = get_origin(tp) or tp
    hints = get_type_hints(cls, include_extras=True)
    bound = dict(zip(getattr(cls, "__parameters__", ()), get_args(tp), strict=False))

    def resolve(field_type: Any) -> Any:
        return bound.get(field_type, Any) if isinstance(field_type, TypeVar) else field_type

    if dataclasses.is_dataclass(cls):
        return cls, [(f.name, resolve(hints[f.name]), f.default is not dataclasses.MISSING)
                     for f in dataclasses.fields(cls)]
    return cls, [(name, resolve(hints[name]), name in cls._field_defaults) for name in cls._fields]


def _struct(tp: Any, depth: int) -> st.SearchStrategy[Any]:
    cls, fields = struct_fields(tp)
    return st.builds(cls, *[values(field_type, depth) for _, field_type, _ in fields])


def requests(kind: type[msg.Request[Any]], depth: int = 0) -> st.SearchStrategy[msg.Request[Any]]:
    return _struct(kind, depth)


# --------------------------------------------------------------------------- values that do not fit

#: Wire values of every msgpack kind; for any field type, some of these do not fit.
WRONG = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False), st.integers(*INT64), st.text(TEXT, max_size=8),
    st.binary(max_size=8), st.lists(st.integers(0, 3) | st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
    st.just("x" * 5000), st.just(b"x" * (msg.MAX_IO + 1)), st.just(2**64 - 1), st.just(-(2**63)),
)


def wrong_arguments(kind: type[msg.Request[Any]]) -> st.SearchStrategy[tuple[list[Any], str | None]]:
    """An argument list for `kind`'s op that its type refuses, and the field it breaks (None: the
    count is wrong). The caller checks it does not fit (a WRONG value may happen to)."""
    _, fields = struct_fields(kind)
    required = sum(1 for _, _, has_default in fields if not has_default)

    def break_one(valid: msg.Request[Any]) -> st.SearchStrategy[tuple[list[Any], str | None]]:
        args = valid.to_wire()
        if not args:
            return st.lists(WRONG, min_size=1, max_size=3).map(lambda extra: (extra, None))
        choices = [st.tuples(st.integers(0, len(args) - 1), WRONG).map(
            lambda pick: ([*args[:pick[0]], pick[1], *args[pick[0] + 1:]], fields[pick[0]][0])),
            st.lists(WRONG, min_size=1, max_size=2).map(lambda extra: ([*args, *extra], None))]
        if required:
            choices.append(st.integers(0, required - 1).map(lambda keep: (args[:keep], None)))
        return st.one_of(choices)

    return requests(kind).flatmap(break_one)
