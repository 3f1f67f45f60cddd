"""The H200's float conversions, emulated with torch on raw bits (test-only).

Measured exhaustively on an H200 (tools/probe_numerics.py, triton 3.6):

* fp32 -> fp8 e4m3fn / e5m2: cvt.rn.satfinite: round to nearest even, saturate to +-fmax
  (infinities included), every NaN -> 0x7F;
* fp32 -> bf16 / fp16: round to nearest even, every NaN -> 0x7FFF;
* fp8 / fp16 -> fp32: exact, NaN -> 0x7FFFFFFF;  bf16 -> fp32: exact, bits kept.

Tests use this to emulate GPU-only routes on the CPU (the seq-blocked append's f16x2 rescale).
Conversions the GPU gets wrong itself (fp8 e5m2 -> bf16 in one step) raise, so a route that relies
on them fails here instead of misbehaving on the GPU.
"""
from __future__ import annotations

import torch
import triton.language as tl

_TORCH = {
    tl.float8e4nv: torch.float8_e4m3fn,
    tl.float8e5: torch.float8_e5m2,
    tl.bfloat16: torch.bfloat16,
    tl.float16: torch.float16,
    tl.float32: torch.float32,
}
_FP8_SAT = {tl.float8e4nv: 448.0, tl.float8e5: 57344.0}
_FP8_NAN_CODE = 0x7F
_NAN16, _NAN32 = 0x7FFF, 0x7FFFFFFF
_BITS = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def gpu_convert(bits: torch.Tensor, src, dst) -> torch.Tensor:
    """Convert raw bits of tl dtype ``src`` to raw bits of ``dst`` as an sm_90 GPU does."""
    if (src, dst) == (tl.float8e5, tl.bfloat16):
        raise NotImplementedError("fp8e5 -> bf16 in one step is wrong on sm_90 (inf/NaN become 65536..); "
                                  "convert through fp32")
    x = bits.view(_TORCH[src])
    if dst in _FP8_SAT:
        fmax = _FP8_SAT[dst]
        x32 = x.to(torch.float32)
        q = torch.where(x32 > fmax, fmax, torch.where(x32 < -fmax, -fmax, x32))
        out = q.to(_TORCH[dst]).view(torch.uint8)
        return torch.where(q.isnan(), _FP8_NAN_CODE, out).to(torch.uint8)
    y = x.to(_TORCH[dst])
    out_bits = y.view(_BITS[dst.primitive_bitwidth])
    if src == tl.bfloat16 and dst == tl.float32:
        return out_bits                       # widening bf16 is a shift: NaN payloads survive
    nan = _NAN16 if dst.primitive_bitwidth == 16 else _NAN32
    nan = torch.tensor(nan, dtype=torch.int64).to(out_bits.dtype)
    return torch.where(y.isnan(), nan, out_bits)
