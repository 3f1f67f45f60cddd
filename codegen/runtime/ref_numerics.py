"""Pure-torch building blocks of every generated module's references: the same conversions as the
kernels (runtime/numerics.py), on any device.

Everything below the COPY marker is copied into each generated module (see host.py), except the
optional helpers a module's references do not call (render._carried).
"""
from __future__ import annotations

import torch

# Each generated module defines its element formats: spec dtype -> (torch dtype, fmax, NaN code, bits).
_CODE_DTYPES: dict = {}

# --- COPY: everything below is copied into each generated module ------------------------------


_F32_NAN_BITS = {16: 0x7FFF, 32: 0x7FFFFFFF}   # NaN the GPU writes when it converts to bf16/fp16, or computes in fp32


def _ref_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view sharing t's storage (t is contiguous)."""
    return t.reshape(-1).view(torch.uint8)


def _ref_magnitude_bits(x32: torch.Tensor) -> torch.Tensor:
    bits = x32.view(torch.int32) & 0x7FFFFFFF
    return torch.where(bits > 0x7F800000, 0, bits)


def _ref_exp2i(n: torch.Tensor) -> torch.Tensor:
    n = n.to(torch.int32)
    normal = (n + 127) << 23
    subnormal = torch.ones_like(n) << (n + 149).clamp(0, 22)
    bits = torch.where(n >= 1 - 127, normal, torch.where(n >= -149, subnormal, 0))
    return bits.view(torch.float32)


_E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _ref_encode(q: torch.Tensor, dtype: str) -> torch.Tensor:
    """fp32 -> codes as cvt.rn.satfinite: round to nearest even, saturate, any NaN -> the NaN code.
    fp4 e2m1 (torch has no conversion): the count of midpoints |q| passes (a tie counts where the
    upper code is even), the sign bit as bit 3; a NaN passes none and gives +0."""
    torch_dtype, fmax, nan_code, bits = _CODE_DTYPES[dtype]
    if bits == 4:
        a = q.abs()
        code = sum(((a >= m) if tie_up else (a > m)).to(torch.int32) for m, tie_up in _E2M1_MIDPOINTS)
        return (code | torch.where(q.isnan(), 0, (q.view(torch.int32) >> 28) & 0x8)).to(torch.uint8)
    q = torch.where(q > fmax, fmax, torch.where(q < -fmax, -fmax, q))
    codes = q.to(torch_dtype).view(torch.uint8)
    return torch.where(q.isnan(), nan_code, codes).to(torch.uint8)


def _ref_decode(codes: torch.Tensor, dtype: str) -> torch.Tensor:
    if _CODE_DTYPES[dtype][3] == 4:                       # fp4 e2m1: a table of its 16 codes
        table = torch.tensor(_E2M1_VALUES + tuple(-v for v in _E2M1_VALUES), device=codes.device)
        return table[codes.to(torch.int64)]
    return codes.view(_CODE_DTYPES[dtype][0]).to(torch.float32)


def _ref_pack(codes: torch.Tensor) -> torch.Tensor:
    """(..., 2n) 4-bit codes -> (..., n) bytes: value 2i in the low nibble of byte i, 2i + 1 in the high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _ref_unpack(packed: torch.Tensor) -> torch.Tensor:
    """(..., n) bytes -> (..., 2n) 4-bit codes (see _ref_pack)."""
    return torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2)


def _ref_cast(x: torch.Tensor, dtype: torch.dtype, computed: bool) -> torch.Tensor:
    """x.to(dtype) with the GPU's NaNs: computed fp32 values and narrowing conversions carry the
    canonical NaN; copies of raw values keep their bits (widening bf16 included)."""
    if not computed and (x.dtype == dtype or (x.dtype, dtype) == (torch.bfloat16, torch.float32)):
        return x.to(dtype)
    y = x.to(dtype)
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]
    nan = torch.tensor(_F32_NAN_BITS[8 * y.element_size()], dtype=torch.int64, device=y.device).to(bits)
    return torch.where(y.isnan(), nan.view(dtype), y)
