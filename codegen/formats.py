"""Facts about the number formats a spec can name, computed once here and nowhere else."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

FP32_MANTISSA_BITS = 23
FP32_BIAS = 127


def fp32_bits(x: float) -> int:
    """The IEEE binary32 bit pattern of x (rounded to nearest even)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


@dataclass(frozen=True)
class ElementFormat:
    """An fp8 element format: values are stored as codes after division by the group's scale."""

    name: str            # spec name
    torch_dtype: str     # torch.<torch_dtype>
    triton_dtype: str    # tl.<triton_dtype>
    fmax: float          # largest finite value; quantized values saturate here
    nan_code: int        # the code GPU conversions write for NaN (cvt.rn.satfinite: 0x7F)

    @property
    def fmax_exponent(self) -> int:
        """floor(log2(fmax)): the unbiased exponent of fmax."""
        return math.frexp(self.fmax)[1] - 1

    @property
    def fmax_mantissa_bits(self) -> int:
        """fmax's fp32 mantissa field: amax needs one more scale step when its mantissa is above it."""
        return fp32_bits(self.fmax) & ((1 << FP32_MANTISSA_BITS) - 1)


@dataclass(frozen=True)
class RawDtype:
    """A dtype whose values are copied into the record as they are (e.g. DSv4's bf16 rope)."""

    name: str
    torch_dtype: str
    triton_dtype: str
    nbytes: int


ELEMENT_FORMATS = {
    "fp8_e4m3fn": ElementFormat("fp8_e4m3fn", "float8_e4m3fn", "float8e4nv", 448.0, 0x7F),
    "fp8_e5m2": ElementFormat("fp8_e5m2", "float8_e5m2", "float8e5", 57344.0, 0x7F),
}

RAW_DTYPES = {
    "bf16": RawDtype("bf16", "bfloat16", "bfloat16", 2),
    "fp16": RawDtype("fp16", "float16", "float16", 2),
    "fp32": RawDtype("fp32", "float32", "float32", 4),
}


@dataclass(frozen=True)
class ScaleFormat:
    name: str
    nbytes: int
    exponent_min: int   # smallest unbiased exponent the format stores
    exponent_max: int   # largest
    bias: int


SCALE_FORMATS = {
    # ue8m0: one byte holding exponent + 127; 0xFF is reserved (OCP: NaN), so 0..254 are stored.
    "ue8m0": ScaleFormat("ue8m0", 1, -127, 127, 127),
}
