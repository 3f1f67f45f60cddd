"""Triton building blocks every generated module carries: fp32 bit constants, the dependent-launch
wait, and the exact conversions (fp8 encode/decode by integer arithmetic, float-to-float casts).

Everything below the COPY marker is copied into each generated module (see host.py), except the
optional helpers a module's kernels do not call (render._carried). The per-format encoders
and decoders that call these (one constant set per format, formats.py) are generated.
"""
from __future__ import annotations

import triton
import triton.language as tl

# --- COPY: everything below is copied into each generated module ------------------------------


_F32_INF_BITS = tl.constexpr(0x7F800000)
_F32_CANONICAL_NAN_BITS = tl.constexpr(0x7FFFFFFF)   # the NaN the GPU's fp32 arithmetic produces
_F32_MANTISSA_MASK = tl.constexpr(0x7FFFFF)
_F32_MANTISSA_BITS = tl.constexpr(23)
_F32_BIAS = tl.constexpr(127)
_F32_SMALLEST_SUBNORMAL_EXP = tl.constexpr(-149)
_F32_2POW_MINUS_127_BITS = tl.constexpr(0x400000)    # 2**-127, the subnormal ue8m0 byte 0x00 means


@triton.jit
def _wait_for_previous(PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
    """A kernel's first step. PDL (a programmatic dependent launch, see _dependent_launch): wait for
    the stream's previous kernel to end and its writes to show, before any memory access. Before
    that, EARLY_RELEASE lets the stream's next kernel launch (it waits likewise for this one's end)."""
    if PDL:
        if EARLY_RELEASE:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


# Under TRITON_INTERPRET=1, triton.jit gives interpreted functions, whose fp8 and bf16 conversions
# differ from the GPU's (ties, carries, NaN, truncation): the kernels then convert by exact integer
# arithmetic instead (_encode_fp8_bits, _decode_fp8_bits, _convert), so they give the same bytes
# as on the GPU with a stock interpreter.
_INTERPRETED = tl.constexpr(not isinstance(_wait_for_previous, triton.runtime.JITFunction))


@triton.jit
def _exp2i(n):
    """2.0**n as fp32 for an int32 tensor n: exact from 2**-149 (subnormals included), 0.0 below."""
    normal = (n + _F32_BIAS) << _F32_MANTISSA_BITS
    shift = tl.minimum(tl.maximum(n - _F32_SMALLEST_SUBNORMAL_EXP, 0), _F32_MANTISSA_BITS - 1)
    subnormal = tl.full(n.shape, 1, tl.int32) << shift
    bits = tl.where(n >= 1 - _F32_BIAS, normal, tl.where(n >= _F32_SMALLEST_SUBNORMAL_EXP, subnormal, 0))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _magnitude_bits(x):
    """|x| as fp32 bits; NaN reads as 0 so a max over bits ignores it, as the GPU's max.f32 does (it
    returns the operand that is not NaN). The interpreter's tl.maximum is numpy's maximum (Triton 3.6,
    NaN wins) or fmax (3.9), so there the bits are masked instead: the same result."""
    if _INTERPRETED:
        bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        return tl.where(bits > _F32_INF_BITS, 0, bits)
    else:
        return tl.maximum(tl.abs(x), 0.0).to(tl.int32, bitcast=True)


@triton.jit
def _rule_exponent(amax_bits, BIAS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, CLAMP_LO: tl.constexpr,
                   CLAMP_HI: tl.constexpr, FLOOR_BITS: tl.constexpr = None, CARRY: tl.constexpr = None,
                   ABOVE: tl.constexpr = None, AT_LEAST: tl.constexpr = None, BELOW: tl.constexpr = None):
    """A power-of-two scale rule: the exponent e of a group's scale 2**e from its amax's fp32 bits, by
    exact integer arithmetic (no log2; docs/numerics.md). With amax = 2**E * (1 + mantissa / 2**23):
    e = E - BIAS + [mantissa > ABOVE] + [mantissa >= AT_LEAST] - [mantissa < BELOW], each term off
    where None; or, for a rule of one term at most, e = E' - BIAS with E' the exponent field of the
    bits plus CARRY (the term is the carry out of the mantissa). amax is first raised to FLOOR_BITS
    (a floor's bits); an infinite amax takes HI; e is clamped to [LO, HI] on the sides it can cross
    (CLAMP_LO: the floor's or a zero amax's e is below LO; CLAMP_HI: the largest finite amax's is above HI)."""
    a = amax_bits
    if FLOOR_BITS is not None:
        a = tl.maximum(a, FLOOR_BITS)
    if CARRY is not None:
        e = ((a + CARRY) >> _F32_MANTISSA_BITS) - (_F32_BIAS + BIAS)
    else:
        mantissa = a & _F32_MANTISSA_MASK
        e = (a >> _F32_MANTISSA_BITS) - (_F32_BIAS + BIAS)
        if ABOVE is not None:
            e += (mantissa > ABOVE).to(tl.int32)
        if AT_LEAST is not None:
            e += (mantissa >= AT_LEAST).to(tl.int32)
        if BELOW is not None:
            e -= (mantissa < BELOW).to(tl.int32)
    e = tl.where(a >= _F32_INF_BITS, HI, e)
    if CLAMP_LO:
        e = tl.maximum(e, LO)
    if CLAMP_HI:
        e = tl.minimum(e, HI)
    return e


@triton.jit
def _exact_scale(amax_bits, FMAX: tl.constexpr, FLOOR_BITS: tl.constexpr = None, SCALE_FLOOR: tl.constexpr = None):
    """Rule exact: amax (raised to FLOOR_BITS, a floor's bits) / FMAX, correctly rounded, raised to
    SCALE_FLOOR (an fp32 value)."""
    if FLOOR_BITS is not None:
        amax_bits = tl.maximum(amax_bits, FLOOR_BITS)
    amax = amax_bits.to(tl.float32, bitcast=True)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
    if SCALE_FLOOR is not None:
        scale = tl.maximum(scale, SCALE_FLOOR)
    return scale


@triton.jit
def _relative_scale(amax_bits, g, FMAX: tl.constexpr):
    """Rule exact relative to a call-time global scale g (two-level scaling): amax / (FMAX * g), the
    product rounded to fp32, the quotient correctly rounded."""
    amax = amax_bits.to(tl.float32, bitcast=True)
    return tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32) * g)


@triton.jit
def _saturate(q, FMAX: tl.constexpr):
    """Clamp to [-FMAX, FMAX]; NaN passes through (the integer encoder needs it before rounding)."""
    q = tl.where(q > FMAX, FMAX, q)
    return tl.where(q < -FMAX, -FMAX, q)


@triton.jit
def _canonical_nan(x):
    """Replace any NaN by the GPU's canonical fp32 NaN, so fp32 outputs are bit-exact everywhere."""
    nan = tl.full(x.shape, _F32_CANONICAL_NAN_BITS, tl.int32).to(tl.float32, bitcast=True)
    return tl.where(x == x, x, nan)


@triton.jit
def _divisor(d, WIDE: tl.constexpr = True):
    """A divisor's parts for _quotient, computed once per divisor (a group's scale): (p, d p,
    RN(1 / (d p))). WIDE: p = 2^96, 1 or 2^-96 takes |d| into [2^-64, 2^64] (a subnormal d too),
    where the reciprocal is a normal number and the remainders of _quotient are exact; otherwise
    (the model's ScaleGroup.wide_divisors: every nonzero d in [2^-77, 2^126) already) p = 1. A zero,
    infinite or NaN d keeps x / d's meaning (inf, 0, NaN)."""
    if WIDE:
        a = tl.abs(d)
        # 2^-64 and 2^64: the bounds; 2^96 and 2^-96: the factors (exact)
        p = tl.where(a < 5.421010862427522e-20, 7.922816251426434e28,
                     tl.where(a > 1.8446744073709552e19, 1.262177448353619e-29, 1.0))
    else:
        p = tl.full(d.shape, 1.0, tl.float32)
    dp = d * p
    return p, dp, tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), dp)


@triton.jit
def _quotient(x, p, dp, r):
    """x / d rounded to nearest even (div.rn), by a multiply and a correction instead of a division
    per value; (p, dp, r) = _divisor(d). On the GPU _markstein; the interpreter divides (numpy's
    division is correctly rounded; older interpreters' fma rounds twice)."""
    if _INTERPRETED:
        return tl.math.div_rn(x * p, dp)
    else:
        return _markstein(x, p, dp, r)


@triton.jit
def _markstein(x, p, dp, r):
    """q = RN(x p r), then Markstein's correction q + r (x p - q d p) rounded once, the remainder
    exact by an fma: the correctly rounded quotient wherever |x / d| is in [2^-24, 2^96] (checked
    against div.rn over every pair of fp32 mantissas on an H200: q alone can be 1.125 ulp off,
    the corrected value is not; powers of two commute with each step while r, x p, q and the
    remainder stay normal, which _divisor's range ensures). Outside, the result only feeds an
    encoder, which gives it the quotient's code: below 2^-24 it keeps the quotient's sign and stays
    under every format's least subnormal; above 2^96 (x p may overflow) it is as large, or an
    infinity of the same sign, which saturates as the quotient does; where the correction meets an
    infinity (x = +-inf, an overflow, d = 0) q itself is the quotient, as it is where the
    remainder is 0 (so a zero keeps its sign)."""
    xp = x * p
    q = xp * r
    e = tl.fma(q, dp, -xp)             # q d p - x p, exactly
    c = tl.fma(-e, r, q)
    return tl.where((e != 0) & (c == c), c, q)


@triton.jit
def _encode_fp8_bits(q, FMAX: tl.constexpr, REBASE_BITS: tl.constexpr, DROPPED_BITS: tl.constexpr,
                     BELOW_HALF: tl.constexpr, MIN_NORMAL_BITS: tl.constexpr, STEP_MAGIC: tl.constexpr,
                     STEPS_PER_UNIT: tl.constexpr, NAN_CODE: tl.constexpr, NEGATIVE_ZERO: tl.constexpr):
    """fp32 -> fp8 codes by integer arithmetic on q's bits, exactly as cvt.rn.satfinite: saturate to
    +-FMAX, round to nearest even, NaN -> NAN_CODE. Used where no exact conversion exists: formats
    without a native sm_90 one, and every format under Triton's interpreter (whose fp8 conversions
    round ties away and mishandle specials).

    A normal code is q's bits with the exponent rebased (REBASE_BITS) and DROPPED_BITS mantissa bits
    rounded off (BELOW_HALF plus the kept lowest bit: ties to even; the carry may raise the exponent).
    Below the smallest normal (MIN_NORMAL_BITS), adding and taking away STEP_MAGIC (its ulp is one
    subnormal step) rounds |q| to a whole step, ties to even. NEGATIVE_ZERO: whether the format has
    -0 (fnuz formats have none: 0x80 is their NaN)."""
    q = _saturate(q, FMAX)
    bits = q.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    rebased = magnitude - REBASE_BITS
    normal = (rebased + BELOW_HALF + ((rebased >> DROPPED_BITS) & 1)) >> DROPPED_BITS
    steps = ((tl.abs(q) + STEP_MAGIC) - STEP_MAGIC) * STEPS_PER_UNIT
    codes = tl.where(magnitude < MIN_NORMAL_BITS, steps.to(tl.int32), normal)
    sign = (bits >> 24) & 0x80
    if NEGATIVE_ZERO:
        codes = codes | sign
    else:
        codes = tl.where(codes == 0, 0, codes | sign)
    return tl.where(q != q, NAN_CODE, codes).to(tl.uint8)


@triton.jit
def _decode_fp8_bits(codes, MANTISSA_BITS: tl.constexpr, REBASE_EXPONENT: tl.constexpr,
                     SUBNORMAL_STEP: tl.constexpr, SPECIALS: tl.constexpr):
    """fp8 codes (uint8) -> fp32 by integer arithmetic, exactly: normal codes move their exponent
    (plus REBASE_EXPONENT) and mantissa into fp32's fields, subnormal ones are mantissa times
    SUBNORMAL_STEP. SPECIALS: "fn" (magnitude 0x7F is NaN), "ieee" (an all-ones exponent is inf or
    NaN) or "fnuz" (0x80 is NaN). NaN decodes to the canonical NaN, as the GPU's conversion does."""
    c = codes.to(tl.int32)
    magnitude = c & 0x7F
    exponent = magnitude >> MANTISSA_BITS
    mantissa = magnitude & ((1 << MANTISSA_BITS) - 1)
    normal = ((exponent + REBASE_EXPONENT) << _F32_MANTISSA_BITS) | (mantissa << (_F32_MANTISSA_BITS - MANTISSA_BITS))
    subnormal = (mantissa.to(tl.float32) * SUBNORMAL_STEP).to(tl.int32, bitcast=True)
    bits = tl.where(exponent == 0, subnormal, normal) | ((c & 0x80) << 24)
    if SPECIALS == "fn":
        bits = tl.where(magnitude == 0x7F, _F32_CANONICAL_NAN_BITS, bits)
    elif SPECIALS == "ieee":
        top = (1 << (7 - MANTISSA_BITS)) - 1
        special = tl.where(mantissa == 0, _F32_INF_BITS | ((c & 0x80) << 24), _F32_CANONICAL_NAN_BITS)
        bits = tl.where(exponent == top, special, bits)
    else:
        bits = tl.where(c == 0x80, _F32_CANONICAL_NAN_BITS, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _convert(x, DTYPE: tl.constexpr):
    """x.to(DTYPE) as sm_90 converts floats: round to nearest even; narrowing and fp16 widening give
    the canonical NaN, bf16 widening keeps the bits. Under Triton's interpreter (which truncates
    fp32 -> bf16 and rewrites NaN payloads) the same by integer arithmetic."""
    if _INTERPRETED:
        if x.dtype == DTYPE:
            return x
        if x.dtype == tl.bfloat16:
            x = (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)   # exact, bits kept
        elif x.dtype == tl.float16:
            x = _canonical_nan(x.to(tl.float32))
        if DTYPE == tl.float32:
            return x
        elif DTYPE == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16       # to nearest, ties to even
            return tl.where(x == x, rounded, 0x7FFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return _canonical_nan(x).to(DTYPE)
    else:
        return x.to(DTYPE)
