"""Element and scale formats in Triton: fp8 codes to and from fp32, and scale entries (ue8m0 bytes,
fp32 values) to and from fp32 scales. Shared by every generated module's kernels.

Everything below the COPY marker is copied into each generated module (see host.py), except the
helpers a module does not call (render._carried). A module's per-format wrappers
(`_encode_fp8_e4m3fn`, `_decode_fp8_e5m2`, ...) pass each format's constants from the format table
(codegen/formats.py: ElementFormat.encode_args / decode_args); its per-group wrappers
(`_<group>_load`, `_<group>_store`) pick the scale format's functions here.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Names each generated module defines before this code (stand-ins: see numerics.py).
_INTERPRETED = False
_F32_MANTISSA_BITS = 23
_F32_CANONICAL_NAN_BITS = 0x7FFFFFFF
_F32_2POW_MINUS_127_BITS = 0x400000
_encode_fp8_bits = _decode_fp8_bits = _exp2i = None

# --- COPY: everything below is copied into each generated module ------------------------------


@triton.jit
def _encode_fp8(q, DTYPE: tl.constexpr, NATIVE: tl.constexpr, FMAX: tl.constexpr, REBASE_BITS: tl.constexpr,
                DROPPED_BITS: tl.constexpr, BELOW_HALF: tl.constexpr, MIN_NORMAL_BITS: tl.constexpr,
                STEP_MAGIC: tl.constexpr, STEPS_PER_UNIT: tl.constexpr, NAN_CODE: tl.constexpr,
                NEGATIVE_ZERO: tl.constexpr):
    """fp32 -> fp8 codes (uint8): round to nearest even, saturate to +-FMAX, NaN -> NAN_CODE.
    NATIVE: sm_90 converts to DTYPE in one cvt.rn.satfinite (it rounds, saturates, infinities too,
    and maps NaN itself); under Triton's interpreter, and for formats without that conversion,
    integer arithmetic on q's bits gives the same codes (_encode_fp8_bits, its constants)."""
    if NATIVE:
        if _INTERPRETED:
            return _encode_fp8_bits(q, FMAX, REBASE_BITS, DROPPED_BITS, BELOW_HALF, MIN_NORMAL_BITS,
                                    STEP_MAGIC, STEPS_PER_UNIT, NAN_CODE, NEGATIVE_ZERO)
        else:
            return q.to(DTYPE).to(tl.uint8, bitcast=True)
    else:
        return _encode_fp8_bits(q, FMAX, REBASE_BITS, DROPPED_BITS, BELOW_HALF, MIN_NORMAL_BITS,
                                STEP_MAGIC, STEPS_PER_UNIT, NAN_CODE, NEGATIVE_ZERO)


@triton.jit
def _decode_fp8(codes, DTYPE: tl.constexpr, NATIVE: tl.constexpr, FMAX: tl.constexpr, NAN_CODE: tl.constexpr,
                MANTISSA_BITS: tl.constexpr, REBASE_EXPONENT: tl.constexpr, SUBNORMAL_STEP: tl.constexpr,
                SPECIALS: tl.constexpr):
    """fp8 codes (uint8) -> fp32, exactly; NaN codes give the canonical NaN. NATIVE: sm_90's
    conversion from DTYPE. Otherwise (an fnuz format, one exponent bias above DTYPE's) the DTYPE
    value of the code halved, the DTYPE NaN magnitude 0x7F being +-FMAX and NAN_CODE the NaN. Under
    the interpreter: integer arithmetic (_decode_fp8_bits)."""
    if _INTERPRETED:
        return _decode_fp8_bits(codes, MANTISSA_BITS, REBASE_EXPONENT, SUBNORMAL_STEP, SPECIALS)
    else:
        if NATIVE:
            return codes.to(DTYPE, bitcast=True).to(tl.float32)
        else:
            half = codes.to(DTYPE, bitcast=True).to(tl.float32) * 0.5
            half = tl.where((codes & 0x7F) == 0x7F, tl.where(codes >= 0x80, -FMAX, FMAX), half)
            nan = tl.full(codes.shape, _F32_CANONICAL_NAN_BITS, tl.int32).to(tl.float32, bitcast=True)
            return tl.where(codes == NAN_CODE, nan, half)


@triton.jit
def _encode_e2m1(q):
    """fp32 -> fp4 e2m1 codes (0..15, bit 3 the sign) in the low byte of an int32 (the bits above
    may hold anything; _quantize_packed_segment packs the low bytes): round to nearest even onto
    {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturate to +-6 (infinities too), exactly (sm_90 has no e2m1
    conversion). e2m1 has no NaN: a NaN gives +0 (code 0, whatever its sign bit). q is a product
    or quotient (every caller scales the values first): on the GPU a NaN there is the canonical,
    positive NaN, whose code _e2m1_code makes 0 with no test."""
    if _INTERPRETED:
        return _e2m1_code_steps(q)
    else:
        return _e2m1_code(q)


@triton.jit
def _e2m1_code_steps(q):
    """q's e2m1 code (int32, 0..15; a NaN of either sign gives 0) by compares and selects, the
    interpreter's encoder. The codes are evenly spaced within [0, 2) (by 0.5), [2, 4) (by 1) and
    [4, 6] (by 2), so |q|'s code is RNE(|q| / spacing) plus the range's offset, and the even code
    wins each tie (a range's first value is an even code). RNE to an integer is one fused
    multiply-add: adding 1.5 * 2^23 leaves the integer in the sum's low mantissa bits (the
    divisions are by powers of two, exact)."""
    a = tl.minimum(tl.abs(q), 6.0)                                    # saturated (a NaN: masked below)
    step = tl.where(a >= 4.0, 0.5, tl.where(a >= 2.0, 1.0, 2.0))      # 1 / the range's spacing
    # 1.5 * 2^23 plus the range's first code less RNE(its first value / spacing): 0, 4 - 2, 6 - 2
    magic = tl.where(a >= 4.0, 12582916.0, tl.where(a >= 2.0, 12582914.0, 12582912.0))
    code = (a * step + magic).to(tl.int32, bitcast=True) - 0x4B400000
    code |= (q.to(tl.int32, bitcast=True) >> 28) & 0x8
    return tl.where(q == q, code, 0)


@triton.jit
def _e2m1_code(q):
    """q's e2m1 code in the low byte of an int32 (the sum below keeps 0x4B400000 above it), with no
    compare or select (sm_90's integer and compare units, at half the fma units' rate, bound the fp4
    writers): eight sm_90 instructions, six of them the fma units' (abs is an operand modifier),
    then the sign bit by a high product and its shifted add. q must be computed (a product or a
    quotient): a negative NaN loaded as it is would give code 8. With t = |q|, the magnitude's code
    is the sum of three rounded pieces, each clamped by the instruction's .sat (to [0, 1], a NaN to +0):
        RNE(4 sat(t / 2))      = RNE(min(2t, 4))             0..4: the codes of [0, 2) by 0.5
        RNE(2 sat(t / 2 - 1))  = RNE(clamp(t - 2, 0, 2))     0..2: those of [2, 4] by 1
        RNE(sat(t / 2 - 2))    = RNE(clamp(t / 2 - 2, 0, 1)) 0..1: those of [4, 6] by 2
    For a normal t each piece is exact before its rounding (a power-of-two scaling, a difference of
    numbers within a factor two); a subnormal t rounds far below a tie, a huge one clamps. The sum
    is accumulated on 1.5 * 2^23, where fp32's spacing is 1, so each fma rounds the running integer
    plus the next piece to nearest even; a piece is fractional only where the pieces before it are
    at their maximum (4, then 6), even numbers, so its tie goes as its own RNE would. The sign bit,
    q >> 31 as a high product, adds 8 (a canonical NaN's is 0)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .f32 q, t, y1, y2, y3, s;
        .reg .b32 sign, sum;
        mov.b32 q, $1;
        abs.f32 t, q;
        mul.rn.sat.f32 y1, t, 0f3F000000;
        fma.rn.sat.f32 y2, t, 0f3F000000, 0fBF800000;
        fma.rn.sat.f32 y3, t, 0f3F000000, 0fC0000000;
        fma.rn.f32 s, y1, 0f40800000, 0f4B400000;
        fma.rn.f32 s, y2, 0f40000000, s;
        add.rn.f32 s, s, y3;
        mov.b32 sum, s;
        mul.hi.u32 sign, $1, 2;
        mad.lo.u32 $0, sign, 8, sum;
        }""",  # constants: 0.5, -1, -2, 4, 1.5 * 2^23, 2
        constraints="=r,r", args=[q.to(tl.int32, bitcast=True)], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _encode_e2m1_products(x, d):
    """x / d -> fp4 e2m1 codes (int32, 0..15) without the quotient (sglang's NVFP4 encoder): |x| compared with d
    times each midpoint of _encode_e2m1, each product rounded to fp32 (so a value within an ulp of
    a midpoint may round otherwise than its exact quotient would). The sign is x's bit, a NaN's too
    (a NaN fails every comparison: +-0); d = 0 (a zero scale) gives +0 for every value."""
    a = tl.abs(x)
    code = ((a > d * 0.25).to(tl.int32) + (a >= d * 0.75).to(tl.int32) + (a > d * 1.25).to(tl.int32)
            + (a >= d * 1.75).to(tl.int32) + (a > d * 2.5).to(tl.int32) + (a >= d * 3.5).to(tl.int32)
            + (a > d * 5.0).to(tl.int32))
    sign = (x.to(tl.int32, bitcast=True) >> 28) & 0x8
    return tl.where(d > 0, code | sign, 0)


@triton.jit
def _decode_e2m1(codes):
    """fp4 e2m1 codes (the low 4 bits of uint8) -> fp32, exactly, by integer arithmetic (no
    conversion instructions): a magnitude code k = 2e + m from 2 up is 2^(e - 1) (1 + m / 2), whose
    fp32 bits are (k << 22) + 0x3F000000 (exponent e + 126, mantissa bit m); k = 1 is 0.5
    (0x3F000000), k = 0 is 0; bit 3 the sign (code 8 is -0)."""
    c = codes.to(tl.int32)
    k = c & 0x7
    magnitude = tl.where(k >= 2, (k << 22) + 0x3F000000, k * 0x3F000000)
    return (magnitude | ((c & 0x8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _store_ue8m0(addr, exponent, mask, EVICTION: tl.constexpr):
    """Write ue8m0 scale bytes (exponent + 127) at byte addresses `addr`. EVICTION: the stores' cache
    eviction policy ("" for the default, or "evict_last")."""
    tl.store(addr, (exponent + 127).to(tl.uint8), mask=mask, eviction_policy=EVICTION)


@triton.jit
def _store_fp32(addr, scale, mask, EVICTION: tl.constexpr):
    """Write fp32 scales at byte addresses `addr` (4-byte aligned, checked by the model)."""
    tl.store(addr.to(tl.pointer_type(tl.float32)), scale, mask=mask, eviction_policy=EVICTION)


@triton.jit
def _store_fp32_pow2(addr, exponent, mask, EVICTION: tl.constexpr):
    """Write fp32 scales 2**exponent at byte addresses `addr`."""
    tl.store(addr.to(tl.pointer_type(tl.float32)), _exp2i(exponent), mask=mask, eviction_policy=EVICTION)


@triton.jit
def _store_fp32_pow2_poison(addr, exponent, mask, EVICTION: tl.constexpr, POISON: tl.constexpr):
    """Write fp32 scales 2**exponent at byte addresses `addr`; a poisoned group's exponent (POISON,
    one above the format's range) as the canonical NaN."""
    nan = tl.full(exponent.shape, _F32_CANONICAL_NAN_BITS, tl.int32).to(tl.float32, bitcast=True)
    _store_fp32(addr, tl.where(exponent == POISON, nan, _exp2i(exponent)), mask, EVICTION)


@triton.jit
def _store_codes(addr, codes, mask, EVICTION: tl.constexpr):
    """Write one-byte scale codes (fp8 scales, already encoded) at byte addresses `addr`."""
    tl.store(addr, codes, mask=mask, eviction_policy=EVICTION)


@triton.jit
def _load_codes(addr, mask, EVICTION: tl.constexpr):
    """Read one-byte scale codes at byte addresses `addr`; masked-off lanes read 0."""
    return tl.load(addr, mask=mask, other=0, eviction_policy=EVICTION)


@triton.jit
def _ue8m0_from_bytes(byte, mask, ZERO_IS_POW2: tl.constexpr, FF_IS_NAN: tl.constexpr = False):
    """ue8m0 bytes (as int32) -> fp32 scales 2**(byte - 127); 0xFF -> +inf, or the canonical NaN
    when FF_IS_NAN (OCP MX); 0x00 -> 2**-127 when ZERO_IS_POW2, else 0.0."""
    bits = byte << _F32_MANTISSA_BITS
    if ZERO_IS_POW2:
        bits = tl.where(mask & (bits == 0), _F32_2POW_MINUS_127_BITS, bits)
    if FF_IS_NAN:
        bits = tl.where(byte == 0xFF, _F32_CANONICAL_NAN_BITS, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load_ue8m0(addr, mask, EVICTION: tl.constexpr, ZERO_IS_POW2: tl.constexpr, FF_IS_NAN: tl.constexpr = False):
    """Read ue8m0 scales at byte addresses `addr` as fp32 (see _ue8m0_from_bytes); masked-off lanes
    read byte 0."""
    return _ue8m0_from_bytes(tl.load(addr, mask=mask, other=0, eviction_policy=EVICTION).to(tl.int32), mask, ZERO_IS_POW2,
                             FF_IS_NAN)


@triton.jit
def _load_fp32(addr, mask, EVICTION: tl.constexpr):
    """Read fp32 scales at byte addresses `addr`; masked-off lanes read 0."""
    return tl.load(addr.to(tl.pointer_type(tl.float32)), mask=mask, other=0.0, eviction_policy=EVICTION)


@triton.jit
def _ue8m0_word_bytes(word_row, dim, block, mask, WORD: tl.constexpr, EVICTION: tl.constexpr):
    """ue8m0 bytes (as int32) where one value index's bytes for every block of a page are adjacent
    (block fastest): one WORD-byte word per value index `dim` from `word_row`, its byte `block` taken
    (little-endian)."""
    if WORD == 2:
        words = tl.load(word_row.to(tl.pointer_type(tl.int16)) + dim, mask=mask, other=0, eviction_policy=EVICTION).to(tl.int32)
    elif WORD == 4:
        words = tl.load(word_row.to(tl.pointer_type(tl.int32)) + dim, mask=mask, other=0, eviction_policy=EVICTION)
    else:
        words = tl.load(word_row.to(tl.pointer_type(tl.int64)) + dim, mask=mask, other=0, eviction_policy=EVICTION)
    return ((words >> (block * 8).to(words.dtype)) & 0xFF).to(tl.int32)


@triton.jit
def _load_ue8m0_words(word_row, dim, block, mask, WORD: tl.constexpr, EVICTION: tl.constexpr,
                      ZERO_IS_POW2: tl.constexpr, FF_IS_NAN: tl.constexpr = False):
    """ue8m0 scales read as words (see _ue8m0_word_bytes) as fp32."""
    return _ue8m0_from_bytes(_ue8m0_word_bytes(word_row, dim, block, mask, WORD, EVICTION), mask, ZERO_IS_POW2,
                             FF_IS_NAN)
