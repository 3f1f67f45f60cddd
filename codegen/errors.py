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

    @property
    def problems(self) -> list:
        """Every problem this error stands for (one, or a SpecErrors' several), in file order."""
        return [self]

    def render(self) -> str:
        where = f"{self.mark}: " if self.mark else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{where}{self.message}{fix}"


class SpecProblems(SpecError):
    """Several problems of one spec file (each field is checked; its problems are all reported)."""

    def __init__(self, errors):
        self.errors = sorted((p for e in errors for p in e.problems),
                             key=lambda e: (e.mark.line, e.mark.col) if e.mark else (0, 0))
        first = self.errors[0]
        super().__init__(first.mark, first.message, first.fix)

    @property
    def problems(self) -> list:
        return list(self.errors)

    def render(self) -> str:
        return "\n".join(SpecError.render(e) for e in self.errors)


def gather(checks) -> list:
    """Run each (callable) check; return the results, or raise every problem they found together."""
    out, errors = [], []
    for check in checks:
        try:
            out.append(check())
        except SpecError as err:
            errors.append(err)
    if errors:
        raise errors[0] if len(errors) == 1 else SpecProblems(errors)
    return out
