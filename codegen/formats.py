"""Facts about the number formats and scale rules a spec can name, computed once here."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

FP32_MANTISSA_BITS = 23
FP32_BIAS = 127
FP32_MANTISSA_ONE = 1 << FP32_MANTISSA_BITS     # the implicit leading 1 as a mantissa integer
FP32_MAX_BITS = 0x7F7FFFFF                     # the largest finite fp32


def fp32_bits(x: float) -> int:
    """The IEEE binary32 bit pattern of x (rounded to nearest even)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def fp32_value(x: float) -> float:
    """x rounded to the nearest fp32 value (as a Python float, exactly that value)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _hex(n: int) -> str:
    return f"0x{n:X}"


@dataclass(frozen=True)
class IntegerEncoding:
    """Constants of an fp8 encoder that works on fp32 bits alone (formats without a native sm_90
    conversion): a normal code is fp32's bits with the exponent rebased and the mantissa rounded to
    nearest even; below the smallest normal a code counts whole subnormal steps."""

    rebase_bits: int        # subtracted from |q|'s fp32 bits: exponent bias 127 -> the format's
    dropped_bits: int       # fp32 mantissa bits the code drops
    below_half: int         # added before dropping them, with their kept neighbour's lowest bit: RNE
    min_normal_bits: int    # fp32 bits of the smallest normal value; below it, subnormal steps
    step_magic: float       # 2**k whose ulp is one subnormal step: |q| + it - it rounds to a step (RNE)
    steps_per_unit: float   # 1 / the subnormal step (an exact power of two)
    negative_zero: bool     # whether the format has -0 (fnuz formats spend 0x80 on NaN)
    rebase_exponent: int    # added to a normal code's exponent field to give fp32's (decoding)
    subnormal_step: float   # the value of one subnormal step, 2**(1 - bias - mantissa bits)


@dataclass(frozen=True)
class ElementFormat:
    """An fp8 element format: values are stored as codes after division by the group's scale."""

    name: str            # spec name
    torch_dtype: str     # torch.<torch_dtype>
    triton_dtype: str    # tl.<triton_dtype> of the native conversion kvlayout uses
    fmax: float          # largest finite value; quantized values saturate here
    mantissa_bits: int
    nan_code: int        # the code written for NaN
    bias: int            # exponent bias
    emulated: bool = False   # e4m3fnuz: no native sm_90 conversion; encoded by integer arithmetic (see numerics.md)
    # PTX type of a pair of codes whose conversions to and from f16x2 make a power-of-two rescale
    # exact in fp16 (a grown block's rows as 32-bit words); None: rescale in fp32. Not e5m2: its codes
    # reach 57344, so times a factor fp16 flushes to zero (below 2^-24) they are still nonzero codes
    # (tests/test_numerics.py::test_fp16_rescale_route).
    f16_pair: str | None = None
    # Codes that are not numbers: "fn" (magnitude 0x7F is NaN, no inf), "ieee" (an all-ones exponent:
    # inf or NaN) or "fnuz" (0x80 is the one NaN, no -0, no inf).
    specials: str = "fn"
    bits: int = 8            # bits per code
    packing: int = 1         # codes per byte: 2 packs the even value in the low nibble, the odd one in the high
    encoder: str = "_encode_fp8"     # the runtime/codes.py function its Triton encoder calls with encode_args
    decoder: str = "_decode_fp8"     # ... and its decoder, with decode_args

    @property
    def encoded_as(self) -> str:
        """What its Triton encoder returns (packed formats' codes are packed from int32 low bytes)."""
        packed = "int32: the code in the low byte, the bits above any; q a product or quotient"
        return "uint8" if self.packing == 1 else packed

    @property
    def encode_args(self) -> tuple:
        """The constexpr arguments of runtime/codes.py's _encode_fp8 for this format, as keyword source
        (none for formats with an encoder of their own)."""
        if self.encoder != "_encode_fp8":
            return ()
        k = self.integer_encoding
        return (f"DTYPE=tl.{self.triton_dtype}", f"NATIVE={not self.emulated}", f"FMAX={self.fmax!r}",
                f"REBASE_BITS={_hex(k.rebase_bits)}", f"DROPPED_BITS={k.dropped_bits}",
                f"BELOW_HALF={_hex(k.below_half)}", f"MIN_NORMAL_BITS={_hex(k.min_normal_bits)}",
                f"STEP_MAGIC={k.step_magic!r}", f"STEPS_PER_UNIT={k.steps_per_unit!r}",
                f"NAN_CODE={_hex(self.nan_code)}", f"NEGATIVE_ZERO={k.negative_zero}")

    @property
    def decode_args(self) -> tuple:
        """The constexpr arguments of runtime/codes.py's _decode_fp8 for this format, as keyword source."""
        if self.decoder != "_decode_fp8":
            return ()
        k = self.integer_encoding
        return (f"DTYPE=tl.{self.triton_dtype}", f"NATIVE={not self.emulated}", f"FMAX={self.fmax!r}",
                f"NAN_CODE={_hex(self.nan_code)}", f"MANTISSA_BITS={self.mantissa_bits}",
                f"REBASE_EXPONENT={k.rebase_exponent}", f"SUBNORMAL_STEP={k.subnormal_step!r}",
                f'SPECIALS="{self.specials}"')

    @property
    def fmax_exponent(self) -> int:
        """floor(log2(fmax)): the unbiased exponent of fmax (torchao's target_max_pow2)."""
        return math.frexp(self.fmax)[1] - 1

    @property
    def integer_encoding(self) -> IntegerEncoding:
        step = 1 - self.bias - self.mantissa_bits           # log2 of the subnormal step
        return IntegerEncoding(
            rebase_bits=(FP32_BIAS - self.bias) << FP32_MANTISSA_BITS,
            dropped_bits=FP32_MANTISSA_BITS - self.mantissa_bits,
            below_half=(1 << (FP32_MANTISSA_BITS - self.mantissa_bits - 1)) - 1,
            min_normal_bits=fp32_bits(2.0 ** (1 - self.bias)),
            step_magic=2.0 ** (FP32_MANTISSA_BITS + step),
            steps_per_unit=2.0 ** -step,
            negative_zero=self.specials != "fnuz",
            rebase_exponent=FP32_BIAS - self.bias,
            subnormal_step=2.0 ** step,
        )

    @property
    def fmax_mantissa_bits(self) -> int:
        """fmax's fp32 mantissa field: amax needs one more scale step when its mantissa is above it."""
        return fp32_bits(self.fmax) & (FP32_MANTISSA_ONE - 1)


@dataclass(frozen=True)
class RawDtype:
    """A dtype whose values are copied into the record as they are (e.g. DSv4's bf16 rope)."""

    name: str
    torch_dtype: str
    triton_dtype: str
    nbytes: int


ELEMENT_FORMATS = {
    "fp8_e4m3fn": ElementFormat("fp8_e4m3fn", "float8_e4m3fn", "float8e4nv", 448.0, 3, 0x7F, 7, f16_pair="e4m3x2"),
    "fp8_e5m2": ElementFormat("fp8_e5m2", "float8_e5m2", "float8e5", 57344.0, 2, 0x7F, 15, specials="ieee"),
    "fp8_e4m3fnuz": ElementFormat("fp8_e4m3fnuz", "float8_e4m3fnuz", "float8e4nv", 240.0, 3, 0x80, 8, emulated=True, specials="fnuz"),
    # fp4 e2m1 (OCP MX): {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives, two codes per byte; no NaN
    # or inf (nan_code: what a NaN of either sign gives, +0; see _encode_e2m1).
    "fp4_e2m1": ElementFormat("fp4_e2m1", "uint8", "uint8", 6.0, 1, 0x0, 1, emulated=True, specials="none", bits=4,
                              packing=2, encoder="_encode_e2m1", decoder="_decode_e2m1"),
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
    bias: int           # ue8m0's exponent bias (0 for fp32)
    # runtime/codes.py functions: write 2**exponent, write an fp32 value (None: only powers of two),
    # read as fp32, and read as words (None: no word reads)
    store_pow2: str | None
    store_value: str | None
    load: str
    load_words: str | None
    # An fp8 scale format: the element format whose codes it stores (its encoder rounds each scale
    # to nearest even and saturates, its decoder reads them back); None for ue8m0 and fp32.
    code: str | None = None
    # The torch dtype that names a 1-byte format's codes (a view of a uint8 scale tensor as it is the
    # same scales); None for fp32.
    torch_view: str | None = None


SCALE_FORMATS = {
    # ue8m0: one byte holding exponent + 127; 0xFF is reserved (OCP: NaN), so 0..254 are stored.
    "ue8m0": ScaleFormat("ue8m0", 1, -127, 127, 127, "_store_ue8m0", None, "_load_ue8m0", "_load_ue8m0_words",
                         torch_view="float8_e8m0fnu"),
    # fp32: the scale itself, a power of two from a rule, or amax / fmax with rule `exact`.
    "fp32": ScaleFormat("fp32", 4, -127, 127, 0, "_store_fp32_pow2", "_store_fp32", "_load_fp32", None),
    # e4m3: NVFP4's block scales, one fp8 e4m3fn code per scale: amax / fmax (over a global scale
    # where the group names one) rounded to the nearest code, ties to even, saturated at 448; rule exact.
    "e4m3": ScaleFormat("e4m3", 1, -9, 8, 0, None, "_store_codes", "_load_codes", None, code="fp8_e4m3fn",
                        torch_view="float8_e4m3fn"),
}

# Rules that give a power of two 2^e, as integer tests on amax's fp32 bits: amax = 2^E * m.
POW2_RULES = ("rceil", "floor", "ceil", "even", "nearest")
RULES = POW2_RULES + ("exact", "given")


def mantissa_threshold(fmax: float, factor_sq_num: int, factor_sq_den: int) -> int:
    """The smallest fp32 mantissa field b with (1 + b/2^23)^2 >= mf^2 * num / den, where
    fmax = 2^Ef * mf: an exact integer stand-in for comparing log2(m / mf) with +-1/2."""
    mf = FP32_MANTISSA_ONE + (fp32_bits(fmax) & (FP32_MANTISSA_ONE - 1))   # mf * 2^23
    target = mf * mf * factor_sq_num                                        # compare (2^23 + b)^2 * den
    b = math.isqrt(-(-target // factor_sq_den)) - FP32_MANTISSA_ONE
    while (FP32_MANTISSA_ONE + b) ** 2 * factor_sq_den < target:
        b += 1
    while b > 0 and (FP32_MANTISSA_ONE + b - 1) ** 2 * factor_sq_den >= target:
        b -= 1
    return b


@dataclass(frozen=True)
class RuleTerms:
    """e = E - fmax_exponent + [mant > above] + [mant >= at_least] - [mant < below], with each
    term switched off by None: the one integer formula behind every power-of-two rule."""

    above: int | None = None
    at_least: int | None = None
    below: int | None = None

    def exponent(self, bits: int, fmax_exponent: int) -> int:
        """e for fp32 magnitude bits (finite), before any clamp: the formula itself."""
        mantissa = bits & (FP32_MANTISSA_ONE - 1)
        e = (bits >> FP32_MANTISSA_BITS) - FP32_BIAS - fmax_exponent
        if self.above is not None:
            e += mantissa > self.above
        if self.at_least is not None:
            e += mantissa >= self.at_least
        if self.below is not None:
            e -= mantissa < self.below
        return e

    @property
    def carry(self) -> tuple[int, int] | None:
        """(addend, adjust) with e = ((bits + addend) >> 23) - (127 + fmax_exponent) + adjust, when at most
        one term is on: [mant > t] is the carry out of mant + (2^23 - 1 - t), [mant >= t] that of
        mant + (2^23 - t), -[mant < t] = [mant >= t] - 1. None for rules with two terms."""
        on = [(name, t) for name, t in (("above", self.above), ("at_least", self.at_least), ("below", self.below))
              if t is not None]
        if not on:
            return 0, 0
        if len(on) > 1:
            return None
        name, t = on[0]
        if name == "above":
            return FP32_MANTISSA_ONE - 1 - t, 0
        return FP32_MANTISSA_ONE - t, (-1 if name == "below" else 0)


def rule_terms(rule: str, element: ElementFormat) -> RuleTerms:
    """The integer form of a power-of-two rule for one element format (see docs/numerics.md)."""
    if rule == "rceil":      # smallest e with amax <= fmax * 2^e
        return RuleTerms(above=element.fmax_mantissa_bits)
    if rule == "floor":      # OCP MX: floor(log2 amax) - emax_elem
        return RuleTerms()
    if rule == "ceil":       # ceil(log2 amax) - emax_elem
        return RuleTerms(above=0)
    if rule == "even":       # torchao EVEN: amax rounded to the element's mantissa width, then floor
        return RuleTerms(at_least=FP32_MANTISSA_ONE - (1 << (FP32_MANTISSA_BITS - element.mantissa_bits - 1)))
    if rule == "nearest":    # round(log2(amax / fmax)): -1 below mf/sqrt(2), +1 from mf*sqrt(2)
        down = mantissa_threshold(element.fmax, 1, 2)
        up = mantissa_threshold(element.fmax, 2, 1)
        return RuleTerms(below=down if down > 0 else None, at_least=up if up < FP32_MANTISSA_ONE else None)
    raise ValueError(rule)
