"""Inputs for the cross-checks: fresh random data over a wide range of scales, plus the
adversarial classes (all bf16 bit patterns, all fp8 codes, all scale bytes, +-0, subnormals,
NaN/inf, exact ties, values at and just above the format maximum, all-zero blocks)."""
from __future__ import annotations

import torch

SCALE_EXPONENTS = (-20, 20)   # rows are drawn at magnitudes 2^-20 .. 2^20


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def scaled_normal(shape, gen, dtype=torch.bfloat16) -> torch.Tensor:
    """N(0, 1) rows, each multiplied by 2^k with k uniform in SCALE_EXPONENTS (per leading index)."""
    x = torch.randn(shape, generator=gen)
    lo, hi = SCALE_EXPONENTS
    k = torch.randint(lo, hi + 1, shape[:1] + (1,) * (len(shape) - 1), generator=gen).float()
    return (x * torch.exp2(k)).to(dtype)


def all_bf16() -> torch.Tensor:
    """Every bf16 bit pattern once (NaNs, infinities, subnormals, +-0 included)."""
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def special_values(fmax: float) -> list:
    """Hand-picked values that stress rounding, saturation and the scale rule."""
    inf, nan = float("inf"), float("nan")
    tiny = 2.0 ** -133              # bf16 subnormal
    return [0.0, -0.0, 1.0, -1.0, fmax, -fmax, fmax * 1.0078125, fmax * 1.5, 2 * fmax, 3.3895e38, -3.3895e38,
            1.125, 1.0625, 1.1875, 0.5 + 2 ** -5, 2 ** -9, 2 ** -10, 3 * 2 ** -11, tiny, -tiny, 2.0 ** -126,
            1e-30, 1e-8, 126.24, 464.0, 480.0, inf, -inf, nan, -nan]


def adversarial_rows(width: int, gen, dtype=torch.bfloat16) -> torch.Tensor:
    """Rows of `width` values: every bf16 pattern (in blocks), special values, all-zero rows,
    rows with one NaN or inf among normal values, and rows at the very ends of the range."""
    patterns = all_bf16()
    n = -(-patterns.numel() // width) * width
    rows = [torch.cat([patterns, patterns[: n - patterns.numel()]]).view(-1, width).to(dtype)]
    special = torch.tensor(special_values(448.0) + special_values(57344.0), dtype=torch.float32)
    reps = -(-width // special.numel())
    rows.append(special.repeat(reps)[:width][None].to(dtype))
    rows.append(special.flip(0).repeat(reps)[:width][None].to(dtype))
    rows.append(torch.zeros(2, width, dtype=dtype))
    rows[-1][1] = -0.0
    spiky = torch.randn(4, width, generator=gen)
    spiky[0, 0], spiky[1, width // 2], spiky[2, -1], spiky[3, 1] = float("nan"), float("inf"), -float("inf"), 2.0 ** 100
    rows.append(spiky.to(dtype))
    rows.append(torch.full((1, width), 2.0 ** -133).to(dtype))      # an all-subnormal row
    rows.append(torch.full((1, width), 3.3895e38).to(dtype))        # bf16's largest finite
    return torch.cat(rows)


def random_bytes(t: torch.Tensor, gen) -> torch.Tensor:
    """Fill t's bytes with uniform random bytes (every fp8 code and scale byte appears)."""
    b = t.view(torch.uint8) if t.element_size() == 1 else t.view(-1).view(torch.uint8)
    b.copy_(torch.randint(0, 256, b.shape, dtype=torch.uint8, generator=gen))
    return t
