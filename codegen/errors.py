"""Errors that point at a place in a spec file: ``path:line:col: message``."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    """A 1-based line and column in a spec file."""

    path: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"


class SpecError(Exception):
    """A spec is malformed. ``str(err)`` is the ``path:line:col: message`` line shown to users."""

    def __init__(self, mark: Mark | None, message: str, fix: str | None = None):
        self.mark = mark
        self.message = message
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.mark}: " if self.mark else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{where}{self.message}{fix}"
