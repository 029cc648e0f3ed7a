"""Hugging Face config.json -> modar Config: the C++ importer, nothing mapped here.

`Config.from_hf` hands the file (or a dict, as JSON text) to the same code
the CLI reads config.json files with (include/modar/hf_config.hpp); which
fields map where, the training-length default and what is not modelled are
in docs/hf_import.md.  What the import assumed and left out comes back as one
HfImportWarning.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Mapping

from . import _core


class HfImportWarning(UserWarning):
    """What a config.json import assumed (defaults taken) and did not model, once."""


def import_hf(source: str | os.PathLike | Mapping[str, Any], overridden: list[str]) -> "_core.Config":
    """The imported (not yet validated) core config; warns once with the import's notes.

    `overridden`: the dotted keys the caller sets afterwards (their notes are
    left out)."""
    if isinstance(source, Mapping):
        try:
            text = json.dumps(dict(source), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(f"config: the dict is not a JSON document: {error}") from None
        cpp, summary = _core.import_hf_text(text, "<dict>", overridden)
    elif isinstance(source, (str, os.PathLike)):
        cpp, summary = _core.import_hf_file(os.fspath(source), overridden)
    else:
        raise TypeError(f"config: expected a config.json path or a dict, got {type(source).__name__}")
    if summary:
        warnings.warn(summary, HfImportWarning, stacklevel=3)
    return cpp
