"""Pure-torch building blocks of every generated module's references: the same conversions as the
kernels (runtime/numerics.py), on any device.

Everything below the COPY marker is copied into each generated module (see host.py), except the
optional helpers a module's references do not call (render.RUNTIME_OPTIONAL).
"""
from __future__ import annotations

import torch

# Each generated module defines its element formats: spec dtype -> (torch dtype, fmax, NaN code).
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


def _ref_encode(q: torch.Tensor, dtype: str) -> torch.Tensor:
    """fp32 -> fp8 codes as cvt.rn.satfinite: round to nearest even, saturate, any NaN -> the NaN code."""
    torch_dtype, fmax, nan_code = _CODE_DTYPES[dtype]
    q = torch.where(q > fmax, fmax, torch.where(q < -fmax, -fmax, q))
    codes = q.to(torch_dtype).view(torch.uint8)
    return torch.where(q.isnan(), nan_code, codes).to(torch.uint8)


def _ref_decode(codes: torch.Tensor, dtype: str) -> torch.Tensor:
    return codes.view(_CODE_DTYPES[dtype][0]).to(torch.float32)


def _ref_cast(x: torch.Tensor, dtype: torch.dtype, computed: bool) -> torch.Tensor:
    """x.to(dtype) with the GPU's NaNs: computed fp32 values and narrowing conversions carry the
    canonical NaN; copies of raw values keep their bits (widening bf16 included)."""
    if not computed and (x.dtype == dtype or (x.dtype, dtype) == (torch.bfloat16, torch.float32)):
        return x.to(dtype)
    y = x.to(dtype)
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]
    nan = torch.tensor(_F32_NAN_BITS[8 * y.element_size()], dtype=torch.int64).to(bits)
    return torch.where(y.isnan(), nan.to(y.device).view(dtype), y)
