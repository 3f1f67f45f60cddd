"""Building blocks of the seq-blocked append (layouts with `group: {tokens: N}`): which entries share
a block, fresh runs, block exponents, and the rescale of a block's kept codes. See docs/design.md
for the algorithm and its terms (lone, run, leader, fresh run, kept slots).

Everything below the COPY marker is copied into the generated module of every layout with an
append (see host.py), less the helpers it does not call (render.RUNTIME_OPTIONAL). The layout's
facts reach this code as module-level constexprs and aliases that the module defines first:
_BLOCK (slots per block), _SINK_SLOT (-1: none), _EXPONENT_LO (the clamp's lower end), and the
layout's own Triton helpers _encode_codes, _decode_codes and _block_exponent (amax bits ->
exponent, the scale rule).
"""
from __future__ import annotations

import triton
import triton.language as tl

# Names each generated module defines before this code (stand-ins; see the module docstring).
_BLOCK = tl.constexpr(32)
_SINK_SLOT = tl.constexpr(-1)
_EXPONENT_LO = tl.constexpr(-127)
_F32_BIAS = tl.constexpr(127)
_F32_MANTISSA_BITS = tl.constexpr(23)
_encode_codes = _decode_codes = _block_exponent = _convert = _magnitude_bits = _exp2i = _rescale_words = None

# --- COPY: everything below is copied into each generated module ------------------------------


@triton.jit
def _slot_written(loc, num_slots):
    """Whether slot ids `loc` are written by a call: not negative, not past the cache, not the sink."""
    if _SINK_SLOT >= 0:
        return (loc >= 0) & (loc < num_slots) & (loc != _SINK_SLOT)
    else:
        return (loc >= 0) & (loc < num_slots)


@triton.jit
def _block_of(loc, num_slots):
    """The _BLOCK-slot block of each slot id (int32); -1 for skipped slots (see _slot_written)."""
    loc = loc.to(tl.int64)
    return tl.where(_slot_written(loc, num_slots), loc // _BLOCK, -1).to(tl.int32)


@triton.jit
def _same_block(other, loc, num_slots):
    """Whether slot ids `other` land in the block of `loc`, a slot the call writes. Without a sink,
    one masked xor and no division: a skipped slot never does (negative ids differ from `loc` in
    the sign, and the cache ends at a block's end)."""
    if _SINK_SLOT >= 0:
        return _block_of(other, num_slots) == _block_of(loc, num_slots)
    else:
        return ((other.to(tl.int64) ^ loc.to(tl.int64)) & -_BLOCK) == 0


@triton.jit
def _later_member(loc_ptr, entry, loc, n_tokens, num_slots):
    """Whether one of the entries 2 to _BLOCK - 1 after each entry lands in its block (`loc`, a slot
    the call writes), and, where `loc` is a block's first slot and the next entry holds its second,
    whether those that do hold its slots from 2 on, each at its place and none after a gap (a fresh
    run's, see _fresh_run_rows): one load per lane and offset, from L1."""
    member = tl.zeros_like(entry) != 0        # none found yet
    last_in = tl.zeros_like(entry).to(tl.int32)          # the last of them in the block (0: none)
    first_out = last_in + _BLOCK                         # the first not at its place (_BLOCK: none)
    for later in tl.static_range(2, _BLOCK):
        later_loc = tl.load(loc_ptr + entry + later, mask=entry + later < n_tokens, other=-1).to(tl.int64)
        in_block = _same_block(later_loc, loc, num_slots)
        member = member | in_block
        last_in = tl.where(in_block, later, last_in)
        first_out = tl.minimum(first_out, tl.where((later_loc ^ loc) != later, later, _BLOCK))   # loc + later, for a block's first slot
    # Selects, not a chain of flags (fewer instructions).
    run_only = last_in < first_out
    return member, run_only


@triton.jit
def _fresh_run_rows(loc, before_loc, after_loc, num_slots):
    """The rows of entry e's block (of `loc`, a slot the call writes) if they are a fresh run, else 0:
    the block's entries are consecutive from e - j (j = loc % _BLOCK, the slot's place in the block)
    and hold its slots from the first, in order (_BLOCK of them: a whole block, as in most of a
    prefill; fewer: a sequence's last block). The slots of the entries around e: before_loc[i]
    e - 1 - i, after_loc[i] e + 1 + i (_BLOCK - 1 each; -1 past the call): every other entry of the
    block among them (its entries lie within _BLOCK consecutive ones) must be a run's, one [_BLOCK]
    tile, one sum and one max."""
    window = tl.arange(0, _BLOCK)
    j = (loc % _BLOCK).to(tl.int32)
    # The entries after e within the _BLOCK from e - j that land in the block: those of the run, if it is one.
    later = tl.sum((_same_block(after_loc, loc, num_slots) & (window < _BLOCK - 1 - j)).to(tl.int32), axis=0)
    # Breaks: one of the j entries before e that is not the run's, any earlier one in the block, one of
    # the `later` entries after e that is not the run's.
    breaks = tl.where(window < j, before_loc != loc - 1 - window, _same_block(before_loc, loc, num_slots))
    breaks = breaks | ((window < later) & (after_loc != loc + 1 + window))
    return tl.where(tl.max(breaks.to(tl.int32), axis=0) == 0, j + 1 + later, 0)


@triton.jit
def _fresh_exponents(magnitude):
    """A fresh block's exponents, from each value index's largest magnitude over its rows (fp32 bits,
    see _magnitude_bits): at least _EXPONENT_LO."""
    return tl.maximum(_block_exponent(magnitude), _EXPONENT_LO)


@triton.jit
def _slice_rows(first_row, row_stride, ok, count, ROWS: tl.constexpr):
    """ROWS rows of a slice of value indices (fp32 vectors, row_stride elements apart from first_row;
    0 from row `count` on) as a tuple, and each value index's largest magnitude over them (fp32
    bits). Vectors, not one [rows, values] tile: their max is elementwise, where a tile's max over
    rows has the program's warps exchange partial maxima through shared memory."""
    rows = ()
    lanes = tl.zeros_like(ok.to(tl.int32))      # row numbers as tensors: the interpreter rejects tensor & scalar masks
    magnitude = lanes
    row_ptr = first_row        # stepped, not first_row + i * row_stride (fewer 64-bit multiplies)
    for i in tl.static_range(ROWS):
        row = _convert(tl.load(row_ptr, mask=ok & (lanes + i < count), other=0.0), tl.float32)
        magnitude = tl.maximum(magnitude, _magnitude_bits(row))
        rows = rows + (row,)
        row_ptr += row_stride
    return rows, magnitude


@triton.jit
def _rows_magnitude(first_row, offsets, row_stride, ok, count, ROWS: tl.constexpr):
    """Each value index's largest magnitude (fp32 bits) over `count` (at most ROWS) rows of [heads,
    value indices] tiles (`offsets` from each row's start; the rows row_stride elements apart from
    first_row, a scalar pointer: no tile of 64-bit pointers to keep): all loads at once, an
    elementwise max."""
    lanes = tl.zeros_like(ok.to(tl.int32))      # row numbers as tensors: the interpreter rejects tensor & scalar masks
    magnitude = lanes
    row_ptr = first_row
    for i in tl.static_range(ROWS):
        row = _convert(tl.load(row_ptr + offsets, mask=ok & (lanes + i < count), other=0.0), tl.float32)
        magnitude = tl.maximum(magnitude, _magnitude_bits(row))
        row_ptr += row_stride
    return magnitude


@triton.jit
def _bit_or(a, b):
    """tl.reduce's combine for a bitwise or."""
    return a | b


@triton.jit
def _maybe_alone(loc_ptr, entry, n_tokens, num_slots):
    """Whether each entry may be alone in its block: its predecessor and successor land elsewhere."""
    own = _block_of(tl.load(loc_ptr + entry, mask=entry < n_tokens, other=-1), num_slots)
    before = _block_of(tl.load(loc_ptr + entry - 1, mask=(entry >= 1) & (entry <= n_tokens), other=-1), num_slots)
    after = _block_of(tl.load(loc_ptr + entry + 1, mask=entry + 1 < n_tokens, other=-1), num_slots)
    return (own >= 0) & (before != own) & (after != own)


@triton.jit
def _multiplier(exponent):
    """2**-exponent, the factor that takes values to codes, for the exponents of ue8m0 bytes,
    [-127, 128]: -127 .. 126 give normal fp32 powers, 127 the subnormal 2**-127, 128 (a stored 0xFF,
    an infinite scale) 0, so 0 codes as in the seed."""
    field = _F32_BIAS - exponent                  # the fp32 exponent field of 2**-exponent where it is normal
    # One max, no select: for a normal field (> 0) the first term is the power's bits and the second
    # smaller; for field 0 (2**-127) and -1 (0) the second, (field + 1) * 2**-127, is exact and the
    # first 0 or negative.
    bits = tl.maximum(field << _F32_MANTISSA_BITS, (field + 1) << (_F32_MANTISSA_BITS - 1))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _rescale(kept_addr, keep, shift):
    """Re-encode the kept codes under `keep` at their block's grown exponent: times 2**shift (old
    minus new exponent, exact: a power of two). The runs kernel's (ptxas 12.8 crashed on a
    [slots, values] tile variant there)."""
    old = tl.load(kept_addr, mask=keep, other=0)
    tl.store(kept_addr, _encode_codes(_decode_codes(old) * _exp2i(shift)), mask=keep)


@triton.jit
def _rescale_slots(row0, row1, row2, row3, written, ok, grown, factor):
    """The lone kernel's rescale of 4 consecutive slots of a block, [heads, value indices] codes at
    row0..row3: every slot but the one `written` now (its index counted from row0) is re-encoded
    times `factor` where its exponent `grown`, and written back whole (16-byte accesses), the rest
    unchanged. Every load comes before the first store (the compiler cannot move a load past a store
    to the same buffer); 4 such tiles take fewer registers than one [slots, heads, values] tile."""
    keep0 = ok & (written != 0)
    old0 = tl.load(row0, mask=keep0, other=0)
    keep1 = ok & (written != 1)
    old1 = tl.load(row1, mask=keep1, other=0)
    keep2 = ok & (written != 2)
    old2 = tl.load(row2, mask=keep2, other=0)
    keep3 = ok & (written != 3)
    old3 = tl.load(row3, mask=keep3, other=0)
    tl.store(row0, tl.where(grown, _encode_codes(_decode_codes(old0) * factor), old0), mask=keep0)
    tl.store(row1, tl.where(grown, _encode_codes(_decode_codes(old1) * factor), old1), mask=keep1)
    tl.store(row2, tl.where(grown, _encode_codes(_decode_codes(old2) * factor), old2), mask=keep2)
    tl.store(row3, tl.where(grown, _encode_codes(_decode_codes(old3) * factor), old3), mask=keep3)


@triton.jit
def _word_factors(shift, grown, HEAD_TILE: tl.constexpr, COLUMNS: tl.constexpr):
    """[heads, value indices] tiles to the [heads, words] tiles _rescale_words takes: 2**shift as
    f16x2 bits for codes 0-1 and 2-3 of each word, and 0xFF in each byte whose exponent grew."""
    lane = tl.arange(0, 4)[None, None, :]          # a code's byte in its (little-endian) word
    half = _exp2i(shift).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    half = tl.reshape(half, (HEAD_TILE, COLUMNS // 4, 4)) << (16 * (lane % 2))
    factor_lo = tl.sum(tl.where(lane < 2, half, 0), axis=2)      # disjoint bit fields: the sum is their or
    factor_hi = tl.sum(tl.where(lane >= 2, half, 0), axis=2)
    merge = tl.sum(tl.reshape(grown.to(tl.int32), (HEAD_TILE, COLUMNS // 4, 4)) * (0xFF << (8 * lane)), axis=2)
    return factor_lo, factor_hi, merge


@triton.jit
def _rescale_word_slots(row0, row1, row2, row3, row4, row5, row6, row7, written, ok, factor_lo, factor_hi, merge):
    """_rescale_slots on [heads, words] tiles of 8 consecutive slots (int32 pointers), every load
    before the first store."""
    keep0 = ok & (written != 0)
    old0 = tl.load(row0, mask=keep0, other=0)
    keep1 = ok & (written != 1)
    old1 = tl.load(row1, mask=keep1, other=0)
    keep2 = ok & (written != 2)
    old2 = tl.load(row2, mask=keep2, other=0)
    keep3 = ok & (written != 3)
    old3 = tl.load(row3, mask=keep3, other=0)
    keep4 = ok & (written != 4)
    old4 = tl.load(row4, mask=keep4, other=0)
    keep5 = ok & (written != 5)
    old5 = tl.load(row5, mask=keep5, other=0)
    keep6 = ok & (written != 6)
    old6 = tl.load(row6, mask=keep6, other=0)
    keep7 = ok & (written != 7)
    old7 = tl.load(row7, mask=keep7, other=0)
    tl.store(row0, _rescale_words(old0, factor_lo, factor_hi, merge), mask=keep0)
    tl.store(row1, _rescale_words(old1, factor_lo, factor_hi, merge), mask=keep1)
    tl.store(row2, _rescale_words(old2, factor_lo, factor_hi, merge), mask=keep2)
    tl.store(row3, _rescale_words(old3, factor_lo, factor_hi, merge), mask=keep3)
    tl.store(row4, _rescale_words(old4, factor_lo, factor_hi, merge), mask=keep4)
    tl.store(row5, _rescale_words(old5, factor_lo, factor_hi, merge), mask=keep5)
    tl.store(row6, _rescale_words(old6, factor_lo, factor_hi, merge), mask=keep6)
    tl.store(row7, _rescale_words(old7, factor_lo, factor_hi, merge), mask=keep7)
