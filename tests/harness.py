"""Shared helpers for the kernel cross-checks: which layouts exist, their test sizes, caches
filled with random bytes, and bit-level comparisons."""
from __future__ import annotations

import torch

from tests.conftest import DEVICE
from tests.corpus import random_bytes
from tests.layouts import LAYOUTS, ROOT, SPECS, ZOO, module, sources  # noqa: F401  (re-exported)


def cases(op: str) -> list:
    """(layout,) for every layout whose spec asks for op: new specs are picked up automatically."""
    return [name for name in LAYOUTS if op in module(name).OPS]


def dims(m) -> tuple:
    """(heads, values, page_size) to test a layout at: odd where the spec allows it."""
    heads = m.HEADS or 3
    page = 7 if m.PAGE_SIZE_MULTIPLE == 1 else 2 * m.PAGE_SIZE_MULTIPLE
    # (96 where it may: odd; else the first value count the layout takes, 256 before 128 so a split
    # of the scales by 4 has a quotient above 0)
    values = m.VALUES or next((v for v in (96, 256, 128, 384, 512, 1024, 2048) if _allowed(m, page, heads, v)), None)
    if values is None:
        raise ValueError(f"{m.__name__}: no test value count in 96..2048 passes its geometry checks")
    return heads, values, page


def _allowed(m, page: int, heads: int, values: int) -> bool:
    """Whether the layout takes these sizes (its geometry checks, e.g. values a multiple of 128)."""
    try:
        m.geometry(page, heads, values)
    except ValueError:
        return False
    return True


# Call-time scales the tests pass, one per given scale argument in turn: not powers of two (so the
# division rounds), one below 1 and one above.
GIVEN_VALUES = (0.0371, 2.7, 0.3, 11.0)


def given(m, values=GIVEN_VALUES) -> dict:
    """The call-time scale arguments of a module's ops (k_scale, v_scale, ...) as one-element float32
    tensors; {} for layouts without them."""
    return {name: torch.tensor([values[i % len(values)]], dtype=torch.float32, device=DEVICE)
            for i, name in enumerate(m._GIVEN_SCALES)}


def given_floats(m, scales: dict) -> dict:
    """The same scales as Python floats, a list of them for per-head scales (for the oracle)."""
    return {name: float(t.item()) if t.numel() == 1 else [float(v) for v in t.cpu()] for name, t in scales.items()}


class KernelStub:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` launches nothing and hands
    the keyword arguments to `on_launch`, if given."""

    def __init__(self, on_launch=None):
        self.on_launch = on_launch

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.on_launch and self.on_launch(kwargs)


def fresh_cache(m, num_pages: int, page: int, heads: int, values: int, gen):
    cache = m.alloc_cache(num_pages, page, heads=heads, values=values, device=DEVICE)
    for t in cache:
        random_bytes(t, gen)
    return cache


def clone(m, cache):
    return m.Cache(*(t.clone() for t in cache))


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bytes(got, want, what: str) -> None:
    """Bit-exact equality with a readable count of the differing elements."""
    got_b, want_b = as_bits(got), as_bits(want)
    assert got_b.shape == want_b.shape, f"{what}: shapes {tuple(got_b.shape)} != {tuple(want_b.shape)}"
    bad = (got_b != want_b)
    if bad.any():
        first = bad.flatten().nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} elements differ; first at flat index "
                             f"{first}: got {[hex(int(v)) for v in got_b.flatten()[first]]}, "
                             f"want {[hex(int(v)) for v in want_b.flatten()[first]]}")


def assert_same_cache(m, got, want, what: str) -> None:
    for field, a, b in zip(m.Cache._fields, got, want, strict=True):
        assert_same_bytes(a, b, f"{what}: cache.{field}")


def per_plane(m, result) -> tuple:
    """A reader's result as one tensor per plane: a tensor for one plane, else a tuple of exactly one
    per plane (so a missing or extra plane fails)."""
    if len(m.PLANES) == 1:
        assert isinstance(result, torch.Tensor), type(result)
        return (result,)
    assert isinstance(result, tuple) and len(result) == len(m.PLANES), type(result)
    return result


def plane_rows(m, v) -> list:
    """One source per plane from rows v: v itself, then v times -2, 4, ... (each plane's values differ,
    so a kernel that mixes planes up shows)."""
    return [v] + [(v.float() * (-2.0) ** (i + 1)).to(v.dtype) for i in range(len(m.PLANES) - 1)]


def pairs(m, got, want) -> list:
    """(plane, got, want) for each plane of two reader results."""
    return list(zip(m.PLANES, per_plane(m, got), per_plane(m, want), strict=True))


def unique_slots(num_slots: int, count: int, gen, extra=()) -> torch.Tensor:
    """count distinct slots in random order; the first len(extra) are replaced by `extra`
    (negative slots, the sink, slots past the cache)."""
    loc = torch.randperm(num_slots, generator=gen)[:count]
    for i, v in enumerate(extra):
        loc[i * 7 % count] = v
    return loc
