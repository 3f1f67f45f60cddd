"""Give Triton's CPU interpreter the GPU's float conversions (applied only under TRITON_INTERPRET=1).

Triton's interpreter converts floats with its own bit arithmetic (``interpreter._convert_float``),
which gets fp8 wrong (e4m3fn 0x7F/0xFF decode as +-480, fp32 -> fp8 rounds ties away from zero,
drops mantissa carries, mishandles NaN/inf/subnormals) and truncates fp32 -> bf16 instead of
rounding. kvlayout's CI compares the interpreter with torch references bit for bit, so this module
replaces that one function with torch's conversions plus the H200's documented behaviour
(tools/probe_numerics.py measured every fp32 bit pattern on an H200, triton 3.6):

* fp32 -> fp8 e4m3fn / e5m2: cvt.rn.satfinite: round to nearest even, saturate to +-fmax
  (infinities included), every NaN -> 0x7F;
* fp32 -> bf16 / fp16: round to nearest even, every NaN -> 0x7FFF;
* fp8 / fp16 -> fp32: exact, NaN -> 0x7FFFFFFF;  bf16 -> fp32: exact, bits kept.

The interpreter routes some casts (fp32 <-> fp16) through numpy's astype instead; those are
redirected here as well.

Conversions the GPU gets wrong itself (fp8 e5m2 -> bf16 in one step) raise, so a kernel that
relies on them fails in CI instead of passing here and misbehaving on the GPU.
"""
from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

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
_BITS = {8: (np.uint8, torch.uint8), 16: (np.int16, torch.int16), 32: (np.int32, torch.int32)}

_original = interpreter._convert_float
_original_cast = interpreter.InterpreterBuilder.cast_impl


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
    out_bits = y.view(_BITS[dst.primitive_bitwidth][1])
    if src == tl.bfloat16 and dst == tl.float32:
        return out_bits                       # widening bf16 is a shift: NaN payloads survive
    nan = _NAN16 if dst.primitive_bitwidth == 16 else _NAN32
    nan = torch.tensor(nan, dtype=torch.int64).to(out_bits.dtype)
    return torch.where(y.isnan(), nan, out_bits)


def _convert_float(input, input_dtype, output_dtype, rounding_mode):
    known = input_dtype in _TORCH and output_dtype in _TORCH
    if not known or rounding_mode == interpreter._ir.ROUNDING_MODE.RTZ:
        return _original(input, input_dtype, output_dtype, rounding_mode)
    np_in, _ = _BITS[input_dtype.primitive_bitwidth]
    np_out, _ = _BITS[output_dtype.primitive_bitwidth]
    bits = torch.from_numpy(np.frombuffer(input.tobytes(), dtype=np_in).copy())
    out = gpu_convert(bits, input_dtype, output_dtype).numpy().view(np_out)
    unsigned = getattr(np, f"uint{output_dtype.primitive_bitwidth}")
    return out.view(unsigned).reshape(input.shape)


def _cast_impl(self, src, dst_type):
    """Float-to-float casts that bypass _convert_float (numpy's astype, e.g. fp32 -> fp16) go here too."""
    src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
    if src_ty in _TORCH and dst_ty in _TORCH and src_ty != dst_ty:
        data = _convert_float(src.data, src_ty, dst_ty, interpreter._ir.ROUNDING_MODE.RTNE)
        return interpreter.TensorHandle(data.view(interpreter._get_np_dtype(dst_type)), dst_ty)
    return _original_cast(self, src, dst_type)


def install() -> None:
    """Replace the interpreter's float conversions (idempotent)."""
    interpreter._convert_float = _convert_float
    interpreter.InterpreterBuilder.cast_impl = _cast_impl
