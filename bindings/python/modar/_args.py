"""Argument checks shared by the public calls: a wrong type is a one-line
TypeError naming the argument and the type expected, never pybind11's
multi-line "incompatible function arguments" or an AttributeError."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, TypeVar

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


def one_line_type_errors(func: F) -> F:
    """Public call wrapper: a TypeError from pybind11 argument matching
    becomes one line naming the call's parameters and their types."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TypeError as error:
            text = str(error)
            if "incompatible function arguments" not in text and "incompatible constructor arguments" not in text:
                raise
            raise TypeError(one_line(text, f"modar.{func.__name__}")) from None

    return wrapper  # type: ignore[return-value]
