"""The tile walks of one record segment, shared by every generated module's kernels: quantize a run
of values into codes and scales, dequantize it back, copy a raw run in and out.

Everything below the COPY marker is copied into each generated module (see host.py), except the
helpers a module's ops do not call (render._carried). A module reaches these through small
generated wrappers, one per segment (`_quantize_<segment>`, ...), which pass the segment's facts as
constexprs: its first value and record byte, its group size, and the layout's own Triton helpers
(scale rule, encoder, decoder, scale load/store) as constexpr functions, which Triton inlines.

Addresses: a row's record starts at byte `rec_row` of `rec_ptr` (uint8), its scale entries at byte
`sc_row` of `sc_ptr`, SC_STRIDE bytes apart (the model's stride of the region's `scale` or `dim`
coordinate), or, where the region splits `scale` as `scale // SC_SPLIT` and `scale % SC_SPLIT`,
SC_STRIDE per quotient and SC_LO per remainder (see _scale_offset); the source or output row at
element `x_row` / `out_row`.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Names each generated module defines before this code (stand-ins: see numerics.py).
_convert = _magnitude_bits = _exp2i = _canonical_nan = _divisor = _quotient = None
_F32_CANONICAL_NAN_BITS = 0x7FFFFFFF

# --- COPY: everything below is copied into each generated module ------------------------------


@triton.jit
def _scale_offset(entry, SC_STRIDE: tl.constexpr, SC_SPLIT: tl.constexpr, SC_LO: tl.constexpr):
    """Byte offset of a row's scale entries `entry` from its first: entry * SC_STRIDE, or, with the
    scale coordinate split (e.g. CUTLASS's 128x4 tiles of four scales), (entry // SC_SPLIT) *
    SC_STRIDE + (entry % SC_SPLIT) * SC_LO."""
    if SC_SPLIT == 1:
        return entry * SC_STRIDE
    else:
        return (entry // SC_SPLIT) * SC_STRIDE + (entry % SC_SPLIT) * SC_LO


@triton.jit
def _group_lanes(GROUP: tl.constexpr, LANES: tl.constexpr):
    """A group's lane indices: GROUP of them, or LANES (0: GROUP), the power of two above a GROUP
    that is not one (e.g. a head of 80 values), of which the first GROUP hold values (_in_group)."""
    if LANES == 0:
        return tl.arange(0, GROUP)
    else:
        return tl.arange(0, LANES)


@triton.jit
def _in_group(mask, lane, GROUP: tl.constexpr, LANES: tl.constexpr):
    """mask ([rows, tiles, lanes]) limited to the lanes that hold values (all of them unless LANES)."""
    if LANES == 0 or LANES == GROUP:
        return mask
    else:
        return mask & (lane < GROUP)[None, None, :]


@triton.jit
def _group_codes(x_ptr, x_row, read, values, EXACT: tl.constexpr, SCALE_OF: tl.constexpr, ENCODE: tl.constexpr,
                 GLOBAL: tl.constexpr, PRODUCTS: tl.constexpr, g, POISON: tl.constexpr = False,
                 NAN_CODE: tl.constexpr = 0, POISON_EXPONENT: tl.constexpr = 0, WIDE: tl.constexpr = True):
    """The source values at `values` ([rows, tiles, lanes] indices, where `read`) of each row as
    codes, and each group's scale: (codes, scales). Lanes not read load +0, which leaves amax as it
    is. SCALE_OF(amax bits): the scale exponent (power-of-two rules) or the fp32 scale (EXACT; with
    GLOBAL, SCALE_OF(amax bits, g) relative to the global scale g, and values divided by scale * g).
    ENCODE(fp32 quotients) -> codes, or with PRODUCTS ENCODE(values, divisors), which compares the
    values with multiples of the divisor instead of dividing. POISON: a group holding a NaN is NaN
    as a whole: every code NAN_CODE, its scale the canonical NaN (EXACT) or POISON_EXPONENT (which
    its store writes as the format's NaN). WIDE: the divisors may need _divisor's scaling (EXACT)."""
    x = tl.load(x_ptr + x_row[:, None, None] + values, mask=read, other=0.0)
    x = _convert(x, tl.float32)
    amax = tl.max(_magnitude_bits(x), axis=2)                                # fp32 bits, NaN ignored
    if GLOBAL:
        scale = SCALE_OF(amax, g)
        d = scale * g                                                        # the block's divisor, rounded
    else:
        scale = SCALE_OF(amax)
        d = scale
    if PRODUCTS:
        codes = ENCODE(x, d[:, :, None])
    elif EXACT:
        p, dp, r = _divisor(d, WIDE)                                         # once per group
        q = _quotient(x, p[:, :, None], dp[:, :, None], r[:, :, None])
        codes = ENCODE(tl.where(d[:, :, None] > 0, q, 0.0))                 # an all-zero group stays 0
    else:
        codes = ENCODE(x * _exp2i(-scale)[:, :, None])                      # exact: a power of two
    if POISON:
        nan = tl.max((x != x).to(tl.int32), axis=2) > 0                      # a NaN among the group's values
        codes = tl.where(nan[:, :, None], NAN_CODE, codes).to(tl.uint8)
        if EXACT:
            scale = tl.where(nan, tl.full(scale.shape, _F32_CANONICAL_NAN_BITS, tl.int32).to(tl.float32, bitcast=True),
                             scale)
        else:
            scale = tl.where(nan, POISON_EXPONENT, scale)
    return codes, scale


@triton.jit
def _quantize_segment(x_ptr, x_row, row_in, row_ok, rec_ptr, rec_row, sc_ptr, sc_row,
                      SC_STRIDE: tl.constexpr, TILES: tl.constexpr, CHUNK: tl.constexpr, SCALE_EVICTION: tl.constexpr,
                      GROUP: tl.constexpr, VALUE_OFFSET: tl.constexpr, BYTE_OFFSET: tl.constexpr,
                      EXACT: tl.constexpr, SCALE_OF: tl.constexpr, ENCODE: tl.constexpr, STORE_SCALE: tl.constexpr,
                      SC_SPLIT: tl.constexpr = 1, SC_LO: tl.constexpr = 0, LANES: tl.constexpr = 0,
                      GLOBAL: tl.constexpr = False, PRODUCTS: tl.constexpr = False, g=1.0,
                      POISON: tl.constexpr = False, NAN_CODE: tl.constexpr = 0, POISON_EXPONENT: tl.constexpr = 0,
                      WIDE: tl.constexpr = True):
    """TILES groups of GROUP values of each row (from value VALUE_OFFSET) -> codes at record byte
    BYTE_OFFSET and one scale per group, CHUNK groups at a time (LANES: see _group_lanes).

    SCALE_OF(amax bits): the group's scale exponent (power-of-two rules) or fp32 scale (EXACT);
    ENCODE(fp32) -> codes; STORE_SCALE(addresses, scale, mask, eviction) writes the scales; GLOBAL,
    PRODUCTS, g: two-level scales and comparison encoders; POISON, NAN_CODE, POISON_EXPONENT: groups
    a NaN makes NaN as a whole; WIDE: divisors that may need scaling (see _group_codes).
    Rows in row_in are read (so the loads need not wait for the slots), rows in row_ok written.
    """
    lane = _group_lanes(GROUP, LANES)
    for first in range(0, TILES, CHUNK):
        tile = first + tl.arange(0, CHUNK)
        in_segment = (tile < TILES)[None, :]
        ok = row_ok[:, None] & in_segment                                    # [rows, tiles]
        index = tile[None, :, None] * GROUP + lane[None, None, :]            # value index in the segment
        read = _in_group((row_in[:, None] & in_segment)[:, :, None], lane, GROUP, LANES)
        codes, scale = _group_codes(x_ptr, x_row, read, VALUE_OFFSET + index, EXACT, SCALE_OF, ENCODE, GLOBAL, PRODUCTS, g,
                                    POISON, NAN_CODE, POISON_EXPONENT, WIDE)
        tl.store(rec_ptr + rec_row[:, None, None] + (BYTE_OFFSET + index), codes, mask=_in_group(ok[:, :, None], lane, GROUP, LANES))
        STORE_SCALE(sc_ptr + sc_row[:, None] + _scale_offset(tile, SC_STRIDE, SC_SPLIT, SC_LO)[None, :], scale, ok, SCALE_EVICTION)


@triton.jit
def _dequantize_segment(rec_ptr, rec_row, sc_ptr, sc_row, row_ok, out_ptr, out_row, out_ok, block,
                        SC_STRIDE: tl.constexpr, TILES: tl.constexpr, CHUNK: tl.constexpr, CANON_NAN: tl.constexpr,
                        SCALE_EVICTION: tl.constexpr, WORD: tl.constexpr,
                        GROUP: tl.constexpr, VALUE_OFFSET: tl.constexpr, BYTE_OFFSET: tl.constexpr,
                        DECODE: tl.constexpr, LOAD_SCALE: tl.constexpr, LOAD_SCALE_WORDS: tl.constexpr,
                      SC_SPLIT: tl.constexpr = 1, SC_LO: tl.constexpr = 0, LANES: tl.constexpr = 0,
                      GLOBAL: tl.constexpr = False, g=1.0):
    """Codes at record byte BYTE_OFFSET times their scales -> out values from VALUE_OFFSET (rows not
    row_ok read as 0), CHUNK groups (GROUP values that share a scale; 1: one scale per value index,
    a `tokens` group; LANES: see _group_lanes) at a time.

    DECODE(codes) -> fp32; LOAD_SCALE(addresses, mask, eviction) -> fp32 scales. WORD > 0 (token
    groups whose block exponents of a value index fill one aligned WORD-byte word, and whose block
    coordinate has stride 1, as the launch checked): LOAD_SCALE_WORDS(word row, value indices,
    block, ...) reads them as words, `block` being the row's block in its page (None where WORD is
    never above 0). GLOBAL: the
    values are then multiplied by the global scale g too (two-level scales: code * scale * g).
    """
    lane = _group_lanes(GROUP, LANES)
    STORE_VEC: tl.constexpr = 128 // out_ptr.dtype.element_ty.primitive_bitwidth   # values in one 16-byte store
    if GROUP == 1:
        RUN: tl.constexpr = STORE_VEC if STORE_VEC < CHUNK else CHUNK     # contiguous codes claimed
    elif GROUP >= 8:
        RUN: tl.constexpr = STORE_VEC
    else:
        RUN: tl.constexpr = STORE_VEC if STORE_VEC < GROUP else GROUP
    for first in range(0, TILES, CHUNK):
        tile = first + tl.arange(0, CHUNK)
        in_segment = (tile < TILES)[None, :]
        read = row_ok[:, None] & in_segment                                  # [rows, tiles]
        index = tile[None, :, None] * GROUP + lane[None, None, :]
        # The codes are contiguous along the value indices (GROUP 1) or the lanes; claiming runs of one
        # output store's width (not the whole run) gives their load the store's layout, so no tile
        # moves through shared memory between them.
        if GROUP == 1:
            codes_at = tl.max_contiguous(rec_ptr + rec_row[:, None, None] + (BYTE_OFFSET + index), [1, RUN, 1])
        else:
            codes_at = tl.max_contiguous(rec_ptr + rec_row[:, None, None] + (BYTE_OFFSET + index), [1, 1, RUN])
        codes = tl.load(codes_at, mask=_in_group(read[:, :, None], lane, GROUP, LANES), other=0)
        if GROUP == 1:
            # One scale per value index: read as [rows, tiles, 1] tiles like the codes, so they share its layout too.
            if WORD == 0:
                scale = LOAD_SCALE(sc_ptr + sc_row[:, None, None] + _scale_offset(index, SC_STRIDE, SC_SPLIT, SC_LO), read[:, :, None], SCALE_EVICTION)
            else:   # the block coordinate has stride 1: drop it to address the value index's word
                scale = LOAD_SCALE_WORDS(sc_ptr + (sc_row - block)[:, None, None], index, block[:, None, None],
                                         read[:, :, None], WORD, SCALE_EVICTION)
            x = DECODE(codes) * scale
        else:
            scale = LOAD_SCALE(sc_ptr + sc_row[:, None] + _scale_offset(tile, SC_STRIDE, SC_SPLIT, SC_LO)[None, :], read, SCALE_EVICTION)
            x = DECODE(codes) * scale[:, :, None]
        if GLOBAL:
            x = tl.where(read[:, :, None], x * g, 0.0)                  # rows not read: +0 whatever g's sign
        if CANON_NAN:
            x = _canonical_nan(x)
        write = _in_group((out_ok[:, None] & in_segment)[:, :, None], lane, GROUP, LANES)
        tl.store(out_ptr + out_row[:, None, None] + (VALUE_OFFSET + index), _convert(x, out_ptr.dtype.element_ty), mask=write)


@triton.jit
def _quantize_packed_segment(x_ptr, x_row, row_in, row_ok, rec_ptr, rec_row, sc_ptr, sc_row,
                             SC_STRIDE: tl.constexpr, TILES: tl.constexpr, CHUNK: tl.constexpr, SCALE_EVICTION: tl.constexpr,
                             GROUP: tl.constexpr, VALUE_OFFSET: tl.constexpr, BYTE_OFFSET: tl.constexpr,
                             EXACT: tl.constexpr, SCALE_OF: tl.constexpr, ENCODE: tl.constexpr, STORE_SCALE: tl.constexpr,
                             SC_SPLIT: tl.constexpr = 1, SC_LO: tl.constexpr = 0,
                             GLOBAL: tl.constexpr = False, PRODUCTS: tl.constexpr = False, g=1.0,
                             WIDE: tl.constexpr = True):
    """_quantize_segment for formats of two codes per byte (fp4): a group's values 2i and 2i + 1 go
    to the low and the high nibble of its byte i, GROUP / 2 bytes per group from record byte
    BYTE_OFFSET. ENCODE gives int32 codes in the low 4 bits with bits 4..7 clear (the bits above
    may hold anything): a byte is the low byte of even + 16 odd."""
    lane = tl.arange(0, GROUP)
    pair = tl.arange(0, GROUP // 2)
    LOAD_VEC: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth    # values in one 16-byte load
    RUN: tl.constexpr = LOAD_VEC // 2 if LOAD_VEC < GROUP else GROUP // 2         # ... their bytes, within a group
    for first in range(0, TILES, CHUNK):
        tile = first + tl.arange(0, CHUNK)
        in_segment = (tile < TILES)[None, :]
        ok = row_ok[:, None] & in_segment                                    # [rows, tiles]
        index = tile[None, :, None] * GROUP + lane[None, None, :]            # value index in the segment
        codes, scale = _group_codes(x_ptr, x_row, (row_in[:, None] & in_segment)[:, :, None], VALUE_OFFSET + index,
                                    EXACT, SCALE_OF, ENCODE, GLOBAL, PRODUCTS, g, WIDE=WIDE)
        even, odd = tl.split(tl.reshape(codes, (codes.shape[0], CHUNK, GROUP // 2, 2)))
        byte = tile[None, :, None] * (GROUP // 2) + pair[None, None, :]      # byte index in the segment
        # A thread's bytes are the pairs of the values it loaded (one 16-byte load's): claiming runs of
        # that many bytes, not the group's, gives the store the load's layout (no trip through shared memory).
        at = tl.max_contiguous(rec_ptr + rec_row[:, None, None] + (BYTE_OFFSET + byte), [1, 1, RUN])
        tl.store(at, (even + (odd << 4)).to(tl.uint8), mask=ok[:, :, None])
        STORE_SCALE(sc_ptr + sc_row[:, None] + _scale_offset(tile, SC_STRIDE, SC_SPLIT, SC_LO)[None, :], scale, ok, SCALE_EVICTION)


@triton.jit
def _dequantize_packed_segment(rec_ptr, rec_row, sc_ptr, sc_row, row_ok, out_ptr, out_row, out_ok,
                               SC_STRIDE: tl.constexpr, TILES: tl.constexpr, CHUNK: tl.constexpr, CANON_NAN: tl.constexpr,
                               SCALE_EVICTION: tl.constexpr, GROUP: tl.constexpr, VALUE_OFFSET: tl.constexpr,
                               BYTE_OFFSET: tl.constexpr, DECODE: tl.constexpr, LOAD_SCALE: tl.constexpr,
                               SC_SPLIT: tl.constexpr = 1, SC_LO: tl.constexpr = 0, GLOBAL: tl.constexpr = False, g=1.0):
    """_dequantize_segment for formats of two codes per byte (fp4): the low nibble of a group's byte
    i is its value 2i, the high nibble value 2i + 1 (GLOBAL, g: see _dequantize_segment)."""
    lane = tl.arange(0, GROUP)
    pair = tl.arange(0, GROUP // 2)
    STORE_VEC: tl.constexpr = 128 // out_ptr.dtype.element_ty.primitive_bitwidth   # values in one 16-byte store
    RUN: tl.constexpr = STORE_VEC // 2 if STORE_VEC < GROUP else GROUP // 2       # ... their bytes, within a group
    for first in range(0, TILES, CHUNK):
        tile = first + tl.arange(0, CHUNK)
        in_segment = (tile < TILES)[None, :]
        read = row_ok[:, None] & in_segment                                  # [rows, tiles]
        byte = tile[None, :, None] * (GROUP // 2) + pair[None, None, :]
        # Claiming runs of the bytes of one output store (not the group's) gives the codes' load the
        # layout the joined values are stored in: no tile moves through shared memory between them.
        at = tl.max_contiguous(rec_ptr + rec_row[:, None, None] + (BYTE_OFFSET + byte), [1, 1, RUN])
        codes = tl.load(at, mask=read[:, :, None], other=0)
        scale = LOAD_SCALE(sc_ptr + sc_row[:, None] + _scale_offset(tile, SC_STRIDE, SC_SPLIT, SC_LO)[None, :], read, SCALE_EVICTION)
        x = tl.join(DECODE(codes & 0xF), DECODE(codes >> 4))                # [rows, tiles, GROUP / 2, 2]
        x = tl.reshape(x, (codes.shape[0], CHUNK, GROUP)) * scale[:, :, None]
        if GLOBAL:
            x = tl.where(read[:, :, None], x * g, 0.0)                  # rows not read: +0 whatever g's sign
        if CANON_NAN:
            x = _canonical_nan(x)
        index = tile[None, :, None] * GROUP + lane[None, None, :]
        write = (out_ok[:, None] & in_segment)[:, :, None]
        tl.store(out_ptr + out_row[:, None, None] + (VALUE_OFFSET + index), _convert(x, out_ptr.dtype.element_ty), mask=write)


@triton.jit
def _quantize_given_segment(x_ptr, x_row, row_in, row_ok, rec_ptr, rec_row, scale,
                            TILES: tl.constexpr, CHUNK: tl.constexpr, VALUE_OFFSET: tl.constexpr,
                            BYTE_OFFSET: tl.constexpr, ENCODE: tl.constexpr):
    """TILES values of each row (from value VALUE_OFFSET) divided by the call's fp32 `scale` (one
    for the plane, correctly rounded) -> codes at record byte BYTE_OFFSET, CHUNK values at a time.
    ENCODE(fp32) -> codes; nothing else is stored."""
    lane = tl.arange(0, CHUNK)
    # the scale as the values' divisor (a splat: every lane the same value) and its parts, once per call
    d = tl.full((CHUNK,), 1.0, tl.float32)[None, :] * scale
    p, dp, r = _divisor(d)
    for first in range(0, TILES, CHUNK):
        index = first + lane
        in_segment = (index < TILES)[None, :]
        x = tl.load(x_ptr + x_row[:, None] + (VALUE_OFFSET + index)[None, :], mask=row_in[:, None] & in_segment, other=0.0)
        q = _quotient(_convert(x, tl.float32), p, dp, r)
        tl.store(rec_ptr + rec_row[:, None] + (BYTE_OFFSET + index)[None, :], ENCODE(q), mask=row_ok[:, None] & in_segment)


@triton.jit
def _dequantize_given_segment(rec_ptr, rec_row, scale, row_ok, out_ptr, out_row, out_ok,
                              TILES: tl.constexpr, CHUNK: tl.constexpr, CANON_NAN: tl.constexpr,
                              VALUE_OFFSET: tl.constexpr, BYTE_OFFSET: tl.constexpr, DECODE: tl.constexpr):
    """Codes at record byte BYTE_OFFSET times the call's fp32 `scale` -> TILES out values from
    VALUE_OFFSET (rows not row_ok read as 0), CHUNK values at a time."""
    lane = tl.arange(0, CHUNK)
    for first in range(0, TILES, CHUNK):
        index = first + lane
        in_segment = (index < TILES)[None, :]
        read = row_ok[:, None] & in_segment
        codes = tl.load(rec_ptr + rec_row[:, None] + (BYTE_OFFSET + index)[None, :], mask=read, other=0)
        x = tl.where(read, DECODE(codes) * scale, 0.0)   # rows not read are +0 whatever the scale's sign
        if CANON_NAN:
            x = _canonical_nan(x)
        tl.store(out_ptr + out_row[:, None] + (VALUE_OFFSET + index)[None, :], _convert(x, out_ptr.dtype.element_ty),
                 mask=out_ok[:, None] & in_segment)


@triton.jit
def _store_raw_segment(x_ptr, x_row, row_in, row_ok, rec_ptr, rec_row,
                       WIDTH: tl.constexpr, LANES: tl.constexpr, VALUE_OFFSET: tl.constexpr,
                       BYTE_OFFSET: tl.constexpr, DTYPE: tl.constexpr):
    """WIDTH values of each row (from value VALUE_OFFSET; LANES: WIDTH rounded up to a power of two)
    -> raw DTYPE values at record byte BYTE_OFFSET."""
    lane = tl.arange(0, LANES)
    in_segment = (lane < WIDTH)[None, :]
    ok = row_ok[:, None] & in_segment
    x = tl.load(x_ptr + x_row[:, None] + (VALUE_OFFSET + lane[None, :]), mask=row_in[:, None] & in_segment,
                other=0.0)
    dst = (rec_ptr + rec_row + BYTE_OFFSET).to(tl.pointer_type(DTYPE))
    tl.store(dst[:, None] + lane[None, :], _convert(x, DTYPE), mask=ok)


@triton.jit
def _load_raw_segment(rec_ptr, rec_row, row_ok, out_ptr, out_row, out_ok,
                      WIDTH: tl.constexpr, LANES: tl.constexpr, VALUE_OFFSET: tl.constexpr,
                      BYTE_OFFSET: tl.constexpr, DTYPE: tl.constexpr):
    """Raw DTYPE values at record byte BYTE_OFFSET -> WIDTH out values from VALUE_OFFSET (rows not
    row_ok read as 0)."""
    lane = tl.arange(0, LANES)
    in_segment = (lane < WIDTH)[None, :]
    src = (rec_ptr + rec_row + BYTE_OFFSET).to(tl.pointer_type(DTYPE))
    x = tl.load(src[:, None] + lane[None, :], mask=row_ok[:, None] & in_segment, other=0.0)
    tl.store(out_ptr + out_row[:, None] + (VALUE_OFFSET + lane[None, :]), _convert(x, out_ptr.dtype.element_ty),
             mask=out_ok[:, None] & in_segment)
