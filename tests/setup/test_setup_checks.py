"""The set-up decisions check the real state: scripts/check_python_requirements.py
(pinned version installed AND importable; the cache skips only the imports,
and only while nothing it depends on changed) and scripts/lib.sh's dpkg check.
Run by scripts/test.sh with pytest (tests/setup)."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "check_python_requirements.py"


def unsatisfied(tmp_path: Path, lines: list[str], *, site: Path | None = None,
                cache: Path | None = None) -> list[str]:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(["# a comment", "", *lines]) + "\n")
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    args = [sys.executable, str(CHECK), str(requirements)]
    if cache is not None:
        args += ["--cache", str(cache)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=True)
    return done.stdout.splitlines()


def fake_distribution(site: Path, *, importable: bool) -> None:
    """A distribution `modarfake` 1.0 in `site`: metadata plus its package."""
    info = site / "modarfake-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: modarfake\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("modarfake\n")
    package = site / "modarfake"
    package.mkdir(exist_ok=True)
    body = "VALUE = 1\n" if importable else "raise ImportError('broken install')\n"
    (package / "__init__.py").write_text(body)


def test_installed_pin_is_satisfied(tmp_path: Path) -> None:
    version = metadata.version("pytest")
    assert unsatisfied(tmp_path, [f"pytest=={version}"]) == []


def test_missing_package_and_other_version_are_reported(tmp_path: Path) -> None:
    lines = ["modar-no-such-package==1.0", "pytest==0.0.1"]
    assert unsatisfied(tmp_path, lines) == lines


def test_unpinned_line_is_reported_for_pip_to_decide(tmp_path: Path) -> None:
    assert unsatisfied(tmp_path, ["pytest>=1"]) == ["pytest>=1"]


def test_version_present_but_import_broken_is_reported(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_distribution(site, importable=False)
    assert unsatisfied(tmp_path, ["modarfake==1.0"], site=site) == ["modarfake==1.0"]
    fake_distribution(site, importable=True)
    assert unsatisfied(tmp_path, ["modarfake==1.0"], site=site) == []


def test_cache_skips_imports_only_while_the_package_folder_is_unchanged(tmp_path: Path) -> None:
    site = tmp_path / "site"
    cache = tmp_path / "cache"
    fake_distribution(site, importable=True)
    assert unsatisfied(tmp_path, ["modarfake==1.0"], site=site, cache=cache) == []
    assert cache.is_file()
    # Breaking the package by adding a module changes its folder: checked again.
    time.sleep(0.01)
    (site / "modarfake" / "__init__.py").write_text("raise ImportError('broken')\n")
    (site / "modarfake" / "extra.py").write_text("")
    assert unsatisfied(tmp_path, ["modarfake==1.0"], site=site, cache=cache) == ["modarfake==1.0"]
    assert not cache.exists()  # a failed check leaves no cache behind
    # A removed package is found by the version check, cache or not.
    fake_distribution(site, importable=True)
    assert unsatisfied(tmp_path, ["modarfake==1.0"], site=site, cache=cache) == []
    shutil.rmtree(site / "modarfake-1.0.dist-info")
    assert unsatisfied(tmp_path, ["modarfake==1.0"], site=site, cache=cache) == ["modarfake==1.0"]


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian system")
def test_debian_check_reports_only_packages_not_installed() -> None:
    done = subprocess.run(
        ["bash", "-c", "source scripts/lib.sh && modar_missing_debian_packages dpkg "
                       "modar-no-such-package coreutils"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == ["modar-no-such-package"]
