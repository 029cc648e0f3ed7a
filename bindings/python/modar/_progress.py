"""Progress of long calls (sweeps, profiling), shown while the C++ core runs
with the GIL released.  The core calls back at most a few times a second."""

from __future__ import annotations

import sys
import time
from typing import Callable

ProgressCallback = Callable[[int, int], None]


class _Printer:
    """One updating line on stderr: 'modar.sweep: 12000 candidates, 3.1 s'."""

    def __init__(self, label: str, unit: str) -> None:
        self.label, self.unit = label, unit
        self.start = time.monotonic()
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < 1.0 and not self.shown:
            return  # quick calls stay quiet
        count = f"{done}/{total}" if total >= 0 else f"{done}"
        sys.stderr.write(f"\r{self.label}: {count} {self.unit}, {elapsed:.1f} s")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def resolve(progress: bool | ProgressCallback | None, label: str, unit: str):
    """(callback for the core, closer): True -> a stderr line, a callable ->
    itself, False / None -> no display (Ctrl-C is still honoured)."""
    if progress is True:
        printer = _Printer(label, unit)
        return printer, printer.close
    if callable(progress):
        return progress, lambda: None
    return None, lambda: None
