"""The project config: where a repository keeps its specs and where kvlayout writes.

A project is the directory of its config, found by walking up from the current directory (as ruff
and pytest do): a ``kvlayout.toml`` (keys at top level), or a ``pyproject.toml`` with a
``[tool.kvlayout]`` table. A pyproject.toml without that table is passed by. There is no fallback:
without a config kvlayout stops and suggests ``kvlayout init``.

Keys (every path relative to the config's directory, inside it):

    specs   = "specs"          # spec folder, or a list of them; compat specs sit in <folder>/compat/
    output  = "generated"      # the generated package (kvlayout owns only the files it wrote there)
    package = "generated"      # its import name (default: the output folder's name; bench and tools
                               # import the modules by it, the modules import each other relatively)
    svg     = "docs/layouts"   # optional: one byte-map picture per layout spec, kept in sync by check
"""
from __future__ import annotations

import keyword
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CONFIG_FILE = "kvlayout.toml"
PYPROJECT = "pyproject.toml"
KEYS = ("specs", "output", "package", "svg")
DEFAULTS = {"specs": "specs", "output": "generated", "package": "generated"}
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class ConfigError(Exception):
    """No config, or a bad one: ``str(err)`` is one line for the user (exit 4)."""


@dataclass(frozen=True)
class Project:
    root: Path                   # the config's directory; every path below is relative to it
    config: Path                 # the config file
    specs: tuple                 # spec folders, POSIX relative paths
    output: str                  # generated package folder
    package: str                 # import name of the generated package
    svg: str | None = None       # byte-map pictures folder

    def spec_dir(self, i: int = 0) -> Path:
        return self.root / self.specs[i]

    @property
    def out_dir(self) -> Path:
        return self.root / self.output

    @property
    def trees(self) -> tuple:
        """The folders kvlayout writes (and removes orphans in): output, then svg."""
        return (self.output,) + ((self.svg,) if self.svg else ())


def read_table(path: Path) -> dict | None:
    """The kvlayout table of a config file, or None when a pyproject.toml has none."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    if path.name != PYPROJECT:                # kvlayout.toml, or a --config file of any other name
        return data
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: [tool] must be a table")
    table = tool.get("kvlayout")
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.kvlayout] must be a table")
    return table


def spec_folders(path: Path, table: dict | None) -> tuple | None:
    """The spec folders a config's table names (the default where it names none), as relative POSIX
    paths; None for no table. Whether they exist is not checked here."""
    if table is None:
        return None
    specs = table.get("specs", DEFAULTS["specs"])
    specs = [specs] if isinstance(specs, str) else specs
    if not isinstance(specs, list) or not specs:
        raise ConfigError(f"{path}: specs must be a folder or a non-empty list of folders")
    specs = tuple(relative_folder(path, "specs", s) for s in specs)
    for i, a in enumerate(specs):
        for b in specs[i + 1:]:
            if _overlaps(a, b):
                raise ConfigError(f"{path}: spec folders {a!r} and {b!r} overlap; list each folder once (compat "
                                  "specs sit in <folder>/compat/ by themselves)")
    return specs


def relative_folder(path: Path, key: str, value) -> str:
    """A configured folder as a POSIX path relative to the config's folder (ConfigError if it is not one)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: {key} must be a non-empty string (a folder relative to {path.parent})")
    if any(ord(c) < 32 or 127 <= ord(c) <= 159 or c in "\u2028\u2029" for c in value):
        raise ConfigError(f"{path}: {key} = {value!r} holds a control character; name a plain folder")
    rel = PurePosixPath(value.replace("\\", "/"))
    if rel.is_absolute() or ".." in rel.parts:
        raise ConfigError(f"{path}: {key} = {value!r} must be a folder inside {path.parent} (relative, no '..')")
    if str(rel) == ".":
        raise ConfigError(f"{path}: {key} = {value!r} must name a folder below {path.parent}, not the root itself")
    # A link on the way to a folder kvlayout writes may lead elsewhere: it must resolve inside the
    # config's folder too (spec folders, only read, may be links to a shared checkout).
    root = path.parent.resolve()
    if key != "specs" and not (root / rel).resolve().is_relative_to(root):
        raise ConfigError(f"{path}: {key} = {value!r} leads outside {path.parent} through a link "
                          f"(to {(root / rel).resolve()}); name a folder inside it")
    return str(rel)


def load(path: Path) -> Project:
    """The Project of one config file (kvlayout.toml, or a pyproject.toml with [tool.kvlayout])."""
    path = Path(os.path.abspath(path))       # a linked config names this folder's project, not the link's target's
    table = read_table(path)
    if table is None:
        raise ConfigError(f"{path}: has no [tool.kvlayout] table; add one, or run `kvlayout init`")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(KEYS)}")
    values = {**DEFAULTS, **table}
    specs = spec_folders(path, table)
    output = relative_folder(path, "output", values["output"])
    svg = relative_folder(path, "svg", values["svg"]) if values.get("svg") is not None else None
    package = table.get("package", PurePosixPath(output).name)     # default: the output folder's name
    if (not isinstance(package, str) or not _PACKAGE.match(package)
            or any(keyword.iskeyword(part) for part in package.split("."))):
        named = "" if "package" in table else " (the output folder's name, the default)"
        raise ConfigError(f"{path}: package = {package!r}{named} must be a dotted Python import name (no part a "
                          "keyword), e.g. 'generated'")
    if package.rpartition(".")[2] != PurePosixPath(output).name:
        raise ConfigError(f"{path}: package = {package!r} does not end in the output folder's name "
                          f"{PurePosixPath(output).name!r}; import {output!r} by a name that ends in it")
    owned = [("output", output)] + ([("svg", svg)] if svg else [])
    for key, folder in owned:
        for s in specs:
            if _overlaps(folder, s):
                raise ConfigError(f"{path}: {key} = {folder!r} overlaps the spec folder {s!r}; kvlayout replaces "
                                  f"that folder's generated files, keep the specs elsewhere")
    if svg and _overlaps(svg, output):
        raise ConfigError(f"{path}: svg = {svg!r} overlaps output = {output!r}; give the pictures a folder of their own")
    for s in specs:
        if not (path.parent / s).is_dir():
            raise ConfigError(f"{path}: specs = {s!r}: no such folder in {path.parent} (create it, or "
                              "fix the path)")
    return Project(root=path.parent, config=path, specs=specs, output=output, package=package, svg=svg)


def _overlaps(a: str, b: str) -> bool:
    pa, pb = PurePosixPath(a).parts, PurePosixPath(b).parts
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def config_in(directory: Path) -> Path | None:
    """The config file of one directory: a kvlayout.toml or a pyproject.toml with [tool.kvlayout]; both
    is an error (neither would be seen to win)."""
    pyproject = directory / PYPROJECT
    if (directory / CONFIG_FILE).is_file():
        try:                                  # (a pyproject.toml kvlayout does not use may be anything)
            table = pyproject.is_file() and read_table(pyproject) is not None
        except ConfigError:
            table = False
        if table:
            raise ConfigError(f"{directory}: holds two kvlayout configs, {CONFIG_FILE} and [tool.kvlayout] in "
                              f"{PYPROJECT}; keep one (move the table's keys into {CONFIG_FILE}, or delete it)")
        return directory / CONFIG_FILE
    return pyproject if pyproject.is_file() and read_table(pyproject) is not None else None


def find(start: Path) -> Project:
    """The project whose config is nearest at or above ``start``."""
    start = Path(os.path.abspath(start))
    for directory in (start, *start.parents):
        found = config_in(directory)
        if found is not None:
            return load(found)
    raise ConfigError(f"no kvlayout config (kvlayout.toml, or [tool.kvlayout] in pyproject.toml) in {start} "
                      "or any folder above it; run `kvlayout init` to create one")


def at_root(root: Path) -> Project:
    """The project of --root DIR: its config must be in DIR itself."""
    root = Path(os.path.abspath(root))
    if not root.is_dir():
        raise ConfigError(f"--root {root}: no such directory")
    found = config_in(root)
    if found is None:
        raise ConfigError(f"--root {root}: no kvlayout config there (kvlayout.toml, or [tool.kvlayout] in "
                          "pyproject.toml); run `kvlayout init` in it")
    return load(found)
