"""Write generated files if changed, remove orphans, and report drift as unified diffs."""
from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path

from .pipeline import GENERATED

IGNORED_PARTS = {"__pycache__"}


def existing_files(root: Path) -> dict:
    """{relative path: text} of every file under generated/ (caches excluded)."""
    base = root / GENERATED
    out = {}
    if base.is_dir():
        for path in sorted(base.rglob("*")):
            if path.is_file() and not IGNORED_PARTS.intersection(path.relative_to(root).parts):
                out[path.relative_to(root).as_posix()] = path.read_text()
    return out


def write(root: Path, files: dict, remove_orphans: bool) -> tuple:
    """Write the files that differ, then remove orphans; returns (written, removed) path lists.

    Every file is written to a temporary file beside it and renamed into place, so a reader
    never sees a half-written module.
    """
    current = existing_files(root)
    written = []
    for rel, text in files.items():
        if current.get(rel) == text:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        written.append(rel)
    removed = []
    if remove_orphans:
        for rel in current:
            if rel not in files:
                (root / rel).unlink()
                removed.append(rel)
    return written, removed


def drift(root: Path, files: dict) -> list:
    """Unified diffs (one string per file) for every changed, missing or orphan file."""
    current = existing_files(root)
    diffs = []
    for rel in sorted(set(files) | set(current)):
        want, have = files.get(rel), current.get(rel)
        if want == have:
            continue
        what = "missing" if have is None else "orphan" if want is None else "changed"
        diff = difflib.unified_diff((have or "").splitlines(keepends=True), (want or "").splitlines(keepends=True),
                                    fromfile=f"a/{rel}" if have is not None else "/dev/null",
                                    tofile=f"b/{rel}" if want is not None else "/dev/null")
        diffs.append(f"{what}: {rel}\n" + "".join(diff))
    return diffs
