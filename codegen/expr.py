"""Integer expressions over the runtime dimensions of a layout.

A layout fixes most of its geometry, but some extents are only known when a kernel is
called (``page_size``, and ``heads`` / ``values`` where the spec says ``any``). The model
computes every offset and stride once, as an ``Expr``: a constant where everything is fixed,
else a small tree over those symbols. The generated host code evaluates the rendered
expressions once per call shape; ``explain`` evaluates them for sample sizes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


class Expr:
    """Immutable integer expression. Build with ``const``, ``sym``, ``+``, ``*``, ``//``, ``round_up``."""

    def __add__(self, other) -> "Expr":
        return _add(self, as_expr(other))

    __radd__ = __add__

    def __mul__(self, other) -> "Expr":
        return _mul(self, as_expr(other))

    __rmul__ = __mul__

    def __floordiv__(self, other: int) -> "Expr":
        return _floordiv(self, other)

    @property
    def is_const(self) -> bool:
        return isinstance(self, Const)

    def const_value(self) -> int:
        if not isinstance(self, Const):
            raise ValueError(f"{self.render()} is not a constant")
        return self.value


@dataclass(frozen=True)
class Const(Expr):
    value: int

    def render(self) -> str:
        return str(self.value)

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.value

    def symbols(self) -> frozenset:
        return frozenset()


@dataclass(frozen=True)
class Sym(Expr):
    name: str

    def render(self) -> str:
        return self.name

    def evaluate(self, env: Mapping[str, int]) -> int:
        return env[self.name]

    def symbols(self) -> frozenset:
        return frozenset([self.name])


@dataclass(frozen=True)
class Sum(Expr):
    terms: tuple

    def render(self) -> str:
        return " + ".join(t.render() for t in self.terms)

    def evaluate(self, env):
        return sum(t.evaluate(env) for t in self.terms)

    def symbols(self):
        return frozenset().union(*(t.symbols() for t in self.terms))


@dataclass(frozen=True)
class Product(Expr):
    factors: tuple

    def render(self) -> str:
        return " * ".join(_paren(f) for f in self.factors)

    def evaluate(self, env):
        out = 1
        for f in self.factors:
            out *= f.evaluate(env)
        return out

    def symbols(self):
        return frozenset().union(*(f.symbols() for f in self.factors))


@dataclass(frozen=True)
class FloorDiv(Expr):
    num: Expr
    den: int

    def render(self) -> str:
        return f"{_paren(self.num)} // {self.den}"

    def evaluate(self, env):
        return self.num.evaluate(env) // self.den

    def symbols(self):
        return self.num.symbols()


@dataclass(frozen=True)
class RoundUp(Expr):
    num: Expr
    multiple: int

    def render(self) -> str:
        return f"_round_up({self.num.render()}, {self.multiple})"

    def evaluate(self, env):
        n = self.num.evaluate(env)
        return -(-n // self.multiple) * self.multiple

    def symbols(self):
        return self.num.symbols()


@dataclass(frozen=True)
class NextPow2(Expr):
    """The least power of two >= num (a tile's lanes for a width known only at call time)."""
    num: Expr

    def render(self) -> str:
        return f"_next_pow2({self.num.render()})"

    def evaluate(self, env):
        return 1 << max(0, self.num.evaluate(env) - 1).bit_length()

    def symbols(self):
        return self.num.symbols()


def next_pow2(a: Expr) -> Expr:
    if isinstance(a, Const):
        return Const(1 << max(0, a.value - 1).bit_length())
    return NextPow2(a)


def _paren(e: Expr) -> str:
    return f"({e.render()})" if isinstance(e, (Sum, FloorDiv)) else e.render()


def const(value: int) -> Const:
    return Const(int(value))


def sym(name: str) -> Sym:
    return Sym(name)


def as_expr(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, int):
        return Const(x)
    raise TypeError(f"not an integer expression: {x!r}")


def _add(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value)
    terms = [t for e in (a, b) for t in (e.terms if isinstance(e, Sum) else (e,))]
    constant = sum(t.value for t in terms if isinstance(t, Const))
    rest = [t for t in terms if not isinstance(t, Const)]
    if constant:
        rest.append(Const(constant))
    return rest[0] if len(rest) == 1 else Sum(tuple(rest))


_SYMBOL_ORDER = ("page_size", "heads", "values")


def _factor_key(f: Expr):
    if isinstance(f, Sym):
        return (0, _SYMBOL_ORDER.index(f.name) if f.name in _SYMBOL_ORDER else 99, f.name)
    return (1, 0, f.render())


def _mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value)
    factors = [f for e in (a, b) for f in (e.factors if isinstance(e, Product) else (e,))]
    coeff = 1
    for f in factors:
        if isinstance(f, Const):
            coeff *= f.value
    if coeff == 0:
        return Const(0)
    rest = sorted((f for f in factors if not isinstance(f, Const)), key=_factor_key)
    if coeff != 1:
        rest.append(Const(coeff))
    return rest[0] if len(rest) == 1 else Product(tuple(rest))


def _floordiv(a: Expr, den: int) -> Expr:
    if den == 1:
        return a
    if isinstance(a, Const):
        return Const(a.value // den)
    return FloorDiv(a, den)


def round_up(a: Expr, multiple: int) -> Expr:
    if multiple == 1:
        return a
    if isinstance(a, Const):
        return Const(-(-a.value // multiple) * multiple)
    return RoundUp(a, multiple)


def round_up_operand(e: Expr) -> Expr:
    """The number a round_up rounds (e itself where e is not rounded)."""
    return e.num if isinstance(e, RoundUp) else e


def divisible(e: Expr, k: int) -> bool:
    """True when e is a multiple of k for every value of its symbols (False means: not proven)."""
    if isinstance(e, Const):
        return e.value % k == 0
    if isinstance(e, Sum):
        return all(divisible(t, k) for t in e.terms)
    if isinstance(e, Product):
        return any(isinstance(f, Const) and f.value % k == 0 for f in e.factors)
    if isinstance(e, RoundUp):
        # a multiple of `multiple`; or num itself, where num always is one (round_up(656, 3) = 657)
        return e.multiple % k == 0 or (divisible(e.num, e.multiple) and divisible(e.num, k))
    return False


def contains(e: Expr, kind: type) -> bool:
    """Whether e has a node of the given class (e.g. RoundUp: the module then needs _round_up)."""
    if isinstance(e, kind):
        return True
    children = {Sum: lambda x: x.terms, Product: lambda x: x.factors, FloorDiv: lambda x: (x.num,),
                RoundUp: lambda x: (x.num,), NextPow2: lambda x: (x.num,)}.get(type(e), lambda x: ())(e)
    return any(contains(c, kind) for c in children)
