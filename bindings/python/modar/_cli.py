"""Where the `modar` command-line tool installed with this package lives."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


def cli_path() -> str:
    """Path of the `modar` executable installed beside this Python (the wheel
    puts it in the environment's scripts directory); falls back to PATH."""
    for scheme_dir in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = Path(scheme_dir) / "modar"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("modar")
    if found is None:
        raise FileNotFoundError("the modar command-line tool is not installed with this package")
    return found


def main() -> int:  # `python -m modar ...` runs the CLI
    executable = cli_path()
    os.execv(executable, [executable, *sys.argv[1:]])
    return 1  # not reached
