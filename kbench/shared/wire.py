"""The checks a message's fields get when it arrives (protocol.py): every value of exactly
the type its dataclass annotates, built back into that dataclass, or ProtocolError saying what
is wrong. Imports nothing of kbench's: both sides of the trust boundary use it."""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any


class ProtocolError(ValueError):
    """A message is not one this version of kbench sends."""


def plain(value: Any) -> Any:
    """A message as plain dicts and lists; tensors stay the very tensors."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if type(value) is list:
        return [plain(v) for v in value]
    return value


def build(cls: type, data: object, where: str) -> Any:
    """The dataclass ``cls`` from ``data``, every field checked; ``where`` names it in errors."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    if unknown := [k for k in data if k not in names]:
        raise ProtocolError(f"{where}: unknown field {shown(unknown[0])}")
    values = {}
    for f in fields(cls):
        if f.name in data:
            values[f.name] = check(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ProtocolError(f"{where}: missing field {f.name!r}")
    return cls(**values)


def check(hint: Any, value: object, where: str) -> Any:
    """``value`` if it is of type ``hint`` (exactly: a bool is no int, an int no float); a
    dataclass with a ``from_wire`` classmethod checks itself."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return check(option, value, where)
            except ProtocolError:
                continue
        raise ProtocolError(f"{where}: expected {hint}, got {type(value).__name__}")
    if hint is Any:
        return value
    if origin is list:
        if type(value) is not list:
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(hint)
        return [check(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key, item = typing.get_args(hint)
        if type(value) is not dict:
            raise ProtocolError(f"{where}: expected a mapping, got {type(value).__name__}")
        return {check(key, k, where): check(item, v, f"{where}.{shown(k)}")
                for k, v in value.items()}
    if from_wire := getattr(hint, "from_wire", None):  # a record with checks of its own
        return from_wire(value)
    if is_dataclass(hint):
        return build(hint, value, where)
    if type(value) is not hint:
        raise ProtocolError(f"{where}: expected {getattr(hint, '__name__', hint)}, got "
                            f"{type(value).__name__}")
    return value


def shown(value: object) -> str:
    """A value from a worker, for a message: strings short, anything else by its type only
    (a repr of hostile data could be huge or never end)."""
    if type(value) is str:
        return repr(value[:40])
    return str(value) if type(value) is int and abs(value) < 1 << 62 else type(value).__name__
