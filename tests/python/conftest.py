"""Shared fixtures: the `modar` CLI installed with the package (or the build
tree's), and a helper that runs it and parses its --json output."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import modar

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _cli() -> str:
    if os.environ.get("MODAR_CLI"):  # an explicit choice (e.g. a developer build)
        return os.environ["MODAR_CLI"]
    try:
        return modar.cli_path()
    except FileNotFoundError:
        built = REPO / os.environ.get("BUILD_DIR", "build") / "bin" / "modar"
        if built.exists():
            return str(built)
        raise


@pytest.fixture(scope="session")
def cli() -> str:
    return _cli()


class CliError(Exception):
    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(f"exit {returncode}: {stderr.strip()}")
        self.returncode, self.stderr = returncode, stderr


def run_cli(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 300) -> str:
    proc = subprocess.run([_cli(), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)
    if proc.returncode != 0:
        raise CliError(proc.returncode, proc.stderr)
    return proc.stdout


def run_cli_json(*args: str, cwd: str | os.PathLike | None = None) -> dict:
    return json.loads(run_cli(*args, cwd=cwd))


@pytest.fixture
def data_dir() -> Path:
    return DATA
