"""Argument checks shared by the public calls: a wrong type is a one-line
TypeError naming the argument and the type expected, never pybind11's
multi-line "incompatible function arguments" or an AttributeError."""

from __future__ import annotations

import functools
import inspect
import os
import re
from typing import Any, Callable, Iterable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect_type(name: str, value: Any, types: type | tuple[type, ...], expected: str) -> None:
    """TypeError "name = value: expected <expected>, got <type>" unless value is
    an instance of types (bool never counts as a number)."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        raise TypeError(f"{name} = {_shown(value)}: expected {expected}, got {type(value).__name__}")


_SIGNATURE = re.compile(r"^\s*1\. \((?P<params>.*)\) -> .*$", re.MULTILINE)


def one_line(message: str, where: str) -> str:
    """pybind11's "incompatible function arguments" text -> one line naming
    the parameters and the types they take."""
    first = message.splitlines()[0] if message else ""
    match = _SIGNATURE.search(message)
    params = match.group("params") if match else ""
    params = re.sub(r"modar\._core\.", "", params)
    params = ", ".join(p for p in params.split(", ") if not p.startswith("self:"))
    invoked = ""
    if "Invoked with:" in message:
        invoked = message.split("Invoked with:", 1)[1].strip().replace("\n", " ")
        invoked = invoked if len(invoked) <= 120 else invoked[:117] + "..."
    name = first.split("(")[0].strip() or "argument"
    return (f"{where}: an argument has the wrong type for {name}({params})"
            + (f"; got {invoked}" if invoked else ""))


def _not_text(value: Any, depth: int = 0) -> str | None:
    """The first string inside `value` (also inside lists, tuples, sets, dict
    keys and values, paths) that is not text the core can take: a lone
    surrogate such as '\\ud800' cannot be encoded as UTF-8.  None when all are."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value
        return None
    if depth > 3:
        return None
    if isinstance(value, os.PathLike):
        return _not_text(os.fspath(value), depth + 1)
    if isinstance(value, dict):
        items: Iterable[Any] = [v for pair in value.items() for v in pair]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return None
    for item in items:
        bad = _not_text(item, depth + 1)
        if bad is not None:
            return bad
    return None


def check_text(where: str, func: Callable[..., Any] | None, args: tuple, kwargs: dict) -> None:
    """ValueError naming the argument when a string argument of a public call
    is not valid text (pybind11 would say "Unable to cast Python instance")."""
    for position, value in enumerate(args):
        bad = _not_text(value)
        if bad is not None:
            name = f"argument {position + 1}"
            if func is not None:
                try:
                    params = list(inspect.signature(func).parameters)
                    name = params[position] if position < len(params) else name
                except (TypeError, ValueError):
                    pass
            raise ValueError(f"{where}: {name} = {_shown(bad)}: not valid text (a lone surrogate "
                             "cannot be encoded as UTF-8); allowed: a str of Unicode characters")
    for name, value in kwargs.items():
        bad = _not_text(value)
        if bad is not None:
            raise ValueError(f"{where}: {name} = {_shown(bad)}: not valid text (a lone surrogate "
                             "cannot be encoded as UTF-8); allowed: a str of Unicode characters")


def one_line_type_errors(func: F) -> F:
    """Public call wrapper: a string argument that is not valid text is a
    ValueError naming the argument, and a TypeError from pybind11 argument
    matching becomes one line naming the call's parameters and their types."""
    # "Config.__init__" -> "Config"; a function defined inside another keeps its own name.
    where = f"modar.{func.__qualname__.replace('.__init__', '').rsplit('<locals>.', 1)[-1]}"

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check_text(where, func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except TypeError as error:
            text = str(error)
            if "incompatible function arguments" not in text and "incompatible constructor arguments" not in text:
                raise
            raise TypeError(one_line(text, where)) from None

    return wrapper  # type: ignore[return-value]
