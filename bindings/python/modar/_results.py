"""Result objects: a JSON document produced by the C++ core (the exact text the
CLI prints with --json), with a readable repr, .to_dict() and, where the
result is a table, .to_pandas()."""

from __future__ import annotations

import copy
import json
from typing import Any, Iterable


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class Result:
    """Base: holds the CLI's --json document."""

    _title = "result"

    def __init__(self, document: dict | str, text: str | None = None) -> None:
        self._doc = json.loads(document) if isinstance(document, str) else document
        self._text = text  # the CLI's human-readable rendering, when there is one

    def to_dict(self) -> dict:
        """The same structure as the CLI's --json output (a deep copy)."""
        return copy.deepcopy(self._doc)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self._doc, indent=indent)

    def __getitem__(self, key: str) -> Any:
        return self._doc[key]

    def keys(self) -> Iterable[str]:
        return self._doc.keys()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._doc == self._doc  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def _summary(self) -> list[str]:
        return [f"  {k}: {_fmt(v)}" for k, v in self._doc.items() if not isinstance(v, (dict, list))]

    def __str__(self) -> str:
        return self._text if self._text else self.__repr__()

    def __repr__(self) -> str:
        return "\n".join([f"<modar.{type(self).__name__}>"] + self._summary())

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython / Jupyter
        printer.text(repr(self))


def flatten(document: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1} (lists kept as they are)."""
    out: dict = {}
    for key, value in document.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
