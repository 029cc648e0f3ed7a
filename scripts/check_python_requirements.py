"""Print the lines of a pinned requirements file that this Python does not
satisfy, one per line (nothing when all are there); exit 0 either way.

Run with the interpreter to check (scripts/setup.sh runs it with .venv's):

    .venv/bin/python scripts/check_python_requirements.py scripts/python-requirements.txt [--cache FILE]

A pin `name==version` counts as satisfied only when the installed
distribution has exactly that version AND its top-level modules import (a
half-removed or broken package fails the import).  The versions are read
every time (cheap); the imports (a few seconds for pandas, matplotlib,
ipykernel) are skipped when --cache FILE holds the key of an earlier check
that passed: the requirements text, this interpreter and the modification
times of its site-packages folders and of each pinned package's folder (pip
install / uninstall, or a file removed from a package's folder, change them).  Standard library only, so that it runs in a bare environment.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as metadata
import os
import re
import sys
import sysconfig

PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _modules(distribution: metadata.Distribution, name: str) -> list[str]:
    """The importable top-level modules of a distribution (its name when the
    metadata does not say)."""
    tops: set[str] = set()
    text = distribution.read_text("top_level.txt")
    if text:
        tops.update(line.strip() for line in text.splitlines() if line.strip())
    else:
        for path in distribution.files or ():
            parts = path.parts
            if len(parts) >= 2 and parts[1] == "__init__.py":
                tops.add(parts[0])
            elif len(parts) == 1 and parts[0].endswith(".py"):
                tops.add(parts[0][:-3])
    public = sorted(t for t in tops if t and not t.startswith("_") and "/" not in t)
    own = _normalise(name)
    if own in public:
        return [own]
    return public[:1] or [own]


def unsatisfied(lines: list[str], check_imports: bool = True) -> list[str]:
    missing = []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.fullmatch(line)
        if match is None:  # not a plain pin: cannot be checked, let pip decide
            missing.append(line)
            continue
        name, wanted = match.groups()
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(line)
            continue
        if distribution.version != wanted:
            missing.append(line)
            continue
        if not check_imports:
            continue
        try:
            for module in _modules(distribution, name):
                importlib.import_module(module)
        except Exception:  # any failure to import is a broken install
            missing.append(line)
    return missing


def _mtime(path: str) -> str:
    try:
        return f"{path} {os.stat(path).st_mtime_ns}"
    except OSError:
        return f"{path} absent"


def _cache_key(lines: list[str]) -> str:
    """What the import check depends on: the requirements, this interpreter,
    the site-packages folders and each pinned package's own folder (pip
    install / uninstall, or a file removed from a package, change them)."""
    parts = [hashlib.sha256("\n".join(lines).encode()).hexdigest(), sys.executable]
    for folder in sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}):
        parts.append(_mtime(folder))
    for raw in lines:
        match = PIN.fullmatch(raw.split("#", 1)[0].strip())
        if match is None:
            continue
        try:
            distribution = metadata.distribution(match.group(1))
        except metadata.PackageNotFoundError:
            continue
        for module in _modules(distribution, match.group(1)):
            parts.append(_mtime(str(distribution.locate_file(module))))
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    args = argv[1:]
    cache = None
    if len(args) == 3 and args[1] == "--cache":
        cache = args[2]
    elif len(args) != 1:
        print("usage: check_python_requirements.py REQUIREMENTS.txt [--cache FILE]", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as handle:
        text = handle.read()
    key = _cache_key(text.splitlines())
    cached = False
    if cache is not None:
        try:
            with open(cache, encoding="utf-8") as handle:
                cached = handle.read() == key
        except OSError:
            cached = False
    missing = unsatisfied(text.splitlines(), check_imports=not cached)
    for line in missing:
        print(line)
    if cache is not None and not missing and not cached:
        with open(cache, "w", encoding="utf-8") as handle:
            handle.write(key)
    elif cache is not None and missing and os.path.exists(cache):
        os.remove(cache)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
