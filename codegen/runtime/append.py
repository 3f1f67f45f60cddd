"""Building blocks of the seq-blocked append (layouts with `group: {tokens: N}`): which entries share
a block, fresh runs, block exponents, and the rescale of a block's kept codes. See docs/design.md
for the algorithm and its terms (lone, run, leader, fresh run, kept slots).

Everything below the COPY marker is copied into the generated module of every layout with an
append (see host.py), less the helpers it does not call (render._carried). The layout's
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
_UE8M0_BIAS = tl.constexpr(127)
_encode_codes = _decode_codes = _block_exponent = _convert = _magnitude_bits = _exp2i = _rescale_words = None
_wait_for_previous = _ue8m0_word_bytes = _slot_written = None

# --- COPY: everything below is copied into each generated module ------------------------------


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


# --- the two append kernels' programs --------------------------------------------------------------
# Each generated kernel passes its plane's tensors and its geometry under these names: a record's
# bytes at page * REC_PAGE_STRIDE + REC_OFFSET + slot * REC_SLOT_STRIDE + head * REC_HEAD_STRIDE,
# a block's exponent byte at page * SC_PAGE_STRIDE + SC_OFFSET + head * SC_HEAD_STRIDE +
# block * SC_BLOCK_STRIDE + dim * SC_DIM_STRIDE (the model's strides; append layouts split no
# coordinate).


@triton.jit
def _outside_sink_block(block):
    """Whether `block` is not the sink slot's block (always, without a sink)."""
    if _SINK_SLOT >= 0:
        return block != _SINK_SLOT // _BLOCK
    else:
        return True


@triton.jit
def _write_lone_row(x_ptr, x_stride_t, x_stride_h, records_ptr, scales_ptr, entry, loc, head, dim, ok,
                    HEAD_TILE: tl.constexpr, COLUMNS: tl.constexpr, WORD: tl.constexpr, WORD_RESCALE: tl.constexpr,
                    PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
                    REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
                    SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
                    SC_DIM_STRIDE: tl.constexpr):
    """An entry alone in its block: its row's [heads, value indices] tile merged with the block's stored
    exponents (a fresh block starts over), written, and the block's other slots rescaled where an
    exponent grew."""
    page = loc // PAGE_SIZE
    slot = loc % PAGE_SIZE
    block = slot // _BLOCK
    fresh = slot % _BLOCK == 0
    records = records_ptr.to(tl.pointer_type(tl.uint8))
    scales = scales_ptr.to(tl.pointer_type(tl.uint8))
    # Tiles [heads, value indices]: the new values; the block's exponents as stored (ue8m0 bytes).
    x = _convert(tl.load(x_ptr + entry.to(tl.int64) * x_stride_t + head[:, None] * x_stride_h + dim[None, :], mask=ok, other=0.0), tl.float32)
    sc_addr = scales + page * SC_PAGE_STRIDE + SC_OFFSET + head[:, None] * SC_HEAD_STRIDE + block * SC_BLOCK_STRIDE + dim[None, :] * SC_DIM_STRIDE
    if WORD > 0:
        # A value index's blocks fill one aligned word: whole words along the value indices, then the block's byte.
        stored = _ue8m0_word_bytes(scales + page * SC_PAGE_STRIDE + SC_OFFSET + head[:, None] * SC_HEAD_STRIDE, dim[None, :], block, ok, WORD, "")
    else:
        stored = tl.load(sc_addr, mask=ok, other=0).to(tl.int32)
    # A fresh block (its first slot written now) starts over from the smallest exponent.
    if _EXPONENT_LO + _UE8M0_BIAS == 0:
        byte_old = stored & tl.where(fresh, 0, 0xFF)     # a scalar mask, not a select per value (fewer registers)
    else:
        byte_old = tl.where(fresh, _EXPONENT_LO + _UE8M0_BIAS, stored)
    byte = tl.maximum(byte_old, _block_exponent(_magnitude_bits(x)) + _UE8M0_BIAS)
    new_row = page * REC_PAGE_STRIDE + REC_OFFSET + slot * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE + dim[None, :]
    tl.store(records + new_row, _encode_codes(x * _multiplier(byte - _UE8M0_BIAS)), mask=ok)
    grown = (byte > byte_old) & ok
    if (tl.reduce(tl.where(ok, byte ^ byte_old, 0), None, _bit_or) != 0) | fresh:    # integer bits: cheaper than a max of booleans
        # Only the exponents that grew are written (a fresh block's all); when none did, the byte
        # stores (and the layout conversion they need) are skipped.
        tl.store(sc_addr, byte.to(tl.uint8), mask=tl.where(fresh, ok, grown))
        if ~fresh:
            if WORD_RESCALE:
                _rescale_block_words(records, page, slot, head, byte_old, byte, grown, HEAD_TILE, COLUMNS,
                                     PAGE_SIZE, HEADS, VALUES, REC_PAGE_STRIDE, REC_OFFSET, REC_SLOT_STRIDE, REC_HEAD_STRIDE,
                                     SC_PAGE_STRIDE, SC_OFFSET, SC_HEAD_STRIDE, SC_BLOCK_STRIDE, SC_DIM_STRIDE)
            else:
                _rescale_block_bytes(records, page, slot, head, dim, ok, byte_old, byte, grown,
                                     PAGE_SIZE, HEADS, VALUES, REC_PAGE_STRIDE, REC_OFFSET, REC_SLOT_STRIDE, REC_HEAD_STRIDE,
                                     SC_PAGE_STRIDE, SC_OFFSET, SC_HEAD_STRIDE, SC_BLOCK_STRIDE, SC_DIM_STRIDE)


@triton.jit
def _rescale_block_words(records, page, slot, head, byte_old, byte, grown, HEAD_TILE: tl.constexpr, COLUMNS: tl.constexpr,
                         PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
                         REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
                         SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
                         SC_DIM_STRIDE: tl.constexpr):
    """The lone row's block: its other slots rescaled where an exponent grew (byte_old -> byte), as
    32-bit words of 4 codes (inline PTX, see _rescale_words), 8 slots at a time; byte addresses of
    records, which are word-aligned (checked at launch), shift right by 2 to index words."""
    factor_lo, factor_hi, merge = _word_factors(byte_old - byte, grown, HEAD_TILE, COLUMNS)
    word = tl.program_id(2) * (COLUMNS // 4) + tl.arange(0, COLUMNS // 4)
    words_ok = (head < HEADS)[:, None] & (word < VALUES // 4)[None, :]
    written = (slot % _BLOCK).to(tl.int32) + tl.zeros_like(merge)    # the new row's slot in the block, as a tile
    words = records.to(tl.pointer_type(tl.int32))
    for r in range(0, _BLOCK, 8):
        row0 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 0) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        row1 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 1) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        row2 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 2) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        row3 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 3) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        row4 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 4) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        row5 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 5) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        row6 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 6) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        row7 = words + ((page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 7) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE) >> 2) + word[None, :]
        _rescale_word_slots(row0, row1, row2, row3, row4, row5, row6, row7, written - r, words_ok, factor_lo, factor_hi, merge)


@triton.jit
def _rescale_block_bytes(records, page, slot, head, dim, ok, byte_old, byte, grown,
                         PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
                         REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
                         SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
                         SC_DIM_STRIDE: tl.constexpr):
    """The lone row's block: its other slots rescaled where an exponent grew, code by code, 4 slots at a time."""
    factor = _exp2i(byte_old - byte)          # old over new scale: an exact power of two
    written = (slot % _BLOCK).to(tl.int32) + tl.zeros_like(byte)    # the new row's slot in the block, as a tile
    for r in range(0, _BLOCK, 4):
        row0 = records + page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 0) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE + dim[None, :]
        row1 = records + page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 1) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE + dim[None, :]
        row2 = records + page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 2) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE + dim[None, :]
        row3 = records + page * REC_PAGE_STRIDE + REC_OFFSET + (slot - slot % _BLOCK + r + 3) * REC_SLOT_STRIDE + head[:, None] * REC_HEAD_STRIDE + dim[None, :]
        _rescale_slots(row0, row1, row2, row3, written - r, ok, grown, factor)


@triton.jit
def _write_short_run(x_ptr, x_stride_t, x_stride_h, records_ptr, scales_ptr, entry, loc, part, run, tile_head, dim,
                     HEAD_TILE: tl.constexpr, SHORT_RUN: tl.constexpr, SHORT_HEADS: tl.constexpr,
                     PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
                     REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
                     SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
                     SC_DIM_STRIDE: tl.constexpr):
    """A short fresh run's entry (at most SHORT_RUN rows: dealt out, its slices would take several
    rounds): it writes its own row, as a lone entry does, from the exponents of all the run's rows;
    the run's first entry writes the exponents."""
    page = loc // PAGE_SIZE
    slot = loc % PAGE_SIZE
    block = slot // _BLOCK
    records = records_ptr.to(tl.pointer_type(tl.uint8))
    scales = scales_ptr.to(tl.pointer_type(tl.uint8))
    # SHORT_HEADS of the tile's heads at a time (half the registers of the whole tile: no spills under the cap).
    for first_head in tl.static_range(0, HEAD_TILE, SHORT_HEADS):
        part_head = tile_head + first_head + tl.arange(0, SHORT_HEADS)
        part_ok = (part_head < HEADS)[:, None] & (dim < VALUES)[None, :]
        # The block's exponents from all the run's rows ([heads, value indices] tiles, loaded at once), then the entry's own row.
        offsets = part_head[:, None] * x_stride_h + dim[None, :]
        exponent = _fresh_exponents(_rows_magnitude(x_ptr + (entry - part).to(tl.int64) * x_stride_t, offsets, x_stride_t, part_ok, run, SHORT_RUN))
        x = _convert(tl.load(x_ptr + entry.to(tl.int64) * x_stride_t + offsets, mask=part_ok, other=0.0), tl.float32)
        new_row = page * REC_PAGE_STRIDE + REC_OFFSET + slot * REC_SLOT_STRIDE + part_head[:, None] * REC_HEAD_STRIDE + dim[None, :]
        tl.store(records + new_row, _encode_codes(x * _multiplier(exponent)), mask=part_ok)
        if part == 0:
            # The run's first entry writes the exponents.
            sc_addr = scales + page * SC_PAGE_STRIDE + SC_OFFSET + part_head[:, None] * SC_HEAD_STRIDE + block * SC_BLOCK_STRIDE + dim[None, :] * SC_DIM_STRIDE
            tl.store(sc_addr, (exponent + _UE8M0_BIAS).to(tl.uint8), mask=part_ok)


@triton.jit
def _write_run_slices(x_ptr, x_stride_t, x_stride_h, records_ptr, scales_ptr, entry, loc, part, run, tile_head,
                      HEAD_TILE: tl.constexpr, COLUMNS: tl.constexpr, SLICE: tl.constexpr,
                      PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
                      REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
                      SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
                      SC_DIM_STRIDE: tl.constexpr):
    """A fresh run's entry: slices `part`, part + run, ... of the program's tile (SLICE value indices of
    one head each), every row of the run in each, with the block's exponents."""
    page = loc // PAGE_SIZE
    slot = loc % PAGE_SIZE
    block = slot // _BLOCK
    piece = part
    while piece < HEAD_TILE * (COLUMNS // SLICE):
        slice_head = tile_head + piece // (COLUMNS // SLICE)
        slice_dim = tl.program_id(2) * COLUMNS + piece % (COLUMNS // SLICE) * SLICE + tl.arange(0, SLICE)
        slice_ok = (slice_dim < VALUES) & (tl.zeros_like(slice_dim) + slice_head < HEADS)
        records = records_ptr.to(tl.pointer_type(tl.uint8))
        scales = scales_ptr.to(tl.pointer_type(tl.uint8))
        # The slice of the run's rows (its entries, from the block's first), one vector each: see _slice_rows.
        first_row = x_ptr + (entry - part).to(tl.int64) * x_stride_t + slice_head * x_stride_h + slice_dim
        values, magnitude = _slice_rows(first_row, x_stride_t, slice_ok, run, _BLOCK)
        exponent = _fresh_exponents(magnitude)
        multiplier = _multiplier(exponent)
        for i in tl.static_range(_BLOCK):
            block_row = page * REC_PAGE_STRIDE + REC_OFFSET + (slot - part + i) * REC_SLOT_STRIDE + slice_head * REC_HEAD_STRIDE + slice_dim
            tl.store(records + block_row, _encode_codes(values[i] * multiplier), mask=slice_ok & (tl.zeros_like(slice_dim) + i < run))
        sc_addr = scales + page * SC_PAGE_STRIDE + SC_OFFSET + slice_head * SC_HEAD_STRIDE + block * SC_BLOCK_STRIDE + slice_dim * SC_DIM_STRIDE
        tl.store(sc_addr, (exponent + _UE8M0_BIAS).to(tl.uint8), mask=slice_ok)

        piece += run


@triton.jit
def _append_lone_program(
        x_ptr, x_stride_t, x_stride_h, loc_ptr, n_tokens, num_slots, records_ptr, scales_ptr,
        HEAD_TILE: tl.constexpr, HEAD_TILES: tl.constexpr, CHUNKS: tl.constexpr, COLUMNS: tl.constexpr,
        FRESH_RUNS: tl.constexpr, SLICE: tl.constexpr, SHORT_RUN: tl.constexpr, SHORT_HEADS: tl.constexpr,
        PDL: tl.constexpr, RELEASE_RUNS: tl.constexpr, WORD: tl.constexpr, WORD_RESCALE: tl.constexpr,
        PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
        REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
        SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
        SC_DIM_STRIDE: tl.constexpr):
    """The entries alone in their block (none of the _BLOCK - 1 entries before or after lands in it:
    every row of a decode step), for one plane: the source rows x (x_stride_t, x_stride_h elements
    apart), the plane's records and scale bytes. One entry, HEAD_TILE heads and COLUMNS value
    indices per program, as one [heads, value indices] tile (the lone check is made once for all its
    heads); in big calls a program scans CHUNKS entries. The new row's exponents merge with the
    stored ones (a fresh block, first slot written, starts over); where one grew, the block's other
    slots are rescaled (WORD_RESCALE: as 32-bit words of codes, see _word_rescale). WORD > 0: the
    stored exponents are read as words of that many bytes (see _scale_word_bytes).

    FRESH_RUNS (calls of one entry per program): the entries of a fresh run (a block's entries are
    consecutive and hold its slots in order from the first: a prefill's blocks, whole or a
    sequence's last) write it together, the tile's HEAD_TILE * COLUMNS / SLICE slices (SLICE value
    indices of one head, all the run's rows) dealt out to the run's entries, so that a prefill's
    programs share its blocks (otherwise they end at once, and the runs kernel's leaders write each
    alone); in a run of at most SHORT_RUN rows each entry writes its own row instead, from the
    exponents of all the run's rows, SHORT_HEADS of the tile's heads at a time (fewer registers than
    the whole tile). _append_runs_program does every other entry's block."""
    _wait_for_previous(PDL, False)     # its dependent is the runs kernel: let launch below (RELEASE_RUNS)
    if RELEASE_RUNS & (CHUNKS == 1):
        # Calls of one entry per program: let the runs kernel launch now, in every program (it reads
        # nothing this kernel writes: their blocks are disjoint). While some program ends without
        # this, it launched only at this kernel's end (H200: a 2048-token prefill 4.44 -> 4.21 us).
        tl.extra.cuda.gdc_launch_dependents()
    tile_head = tl.program_id(1) % HEAD_TILES * HEAD_TILE      # the program's first head
    head = tile_head + tl.arange(0, HEAD_TILE)
    dim = tl.program_id(2) * COLUMNS + tl.arange(0, COLUMNS)
    if (HEADS % HEAD_TILE == 0) & (VALUES % COLUMNS == 0):
        ok = tl.full((HEAD_TILE, COLUMNS), 1, tl.int1)      # whole tiles: no masks
    else:
        ok = (head < HEADS)[:, None] & (dim < VALUES)[None, :]
    window = tl.arange(0, _BLOCK)
    start = tl.program_id(0) * CHUNKS
    stop = tl.minimum(start + CHUNKS, n_tokens)
    if CHUNKS > 1:
        # Only an entry whose neighbours land in other blocks can be alone: most of a prefill's
        # programs stop here; the entries that may be alone go in turn.
        scanned = start + tl.arange(0, CHUNKS)
        maybe = _maybe_alone(loc_ptr, scanned, n_tokens, num_slots)
        entry = tl.min(tl.where(maybe, scanned, stop), axis=0)
    else:
        entry = start
    while entry < stop:
        loc = tl.load(loc_ptr + entry).to(tl.int64)
        # Alone: a slot the call writes, and none of the _BLOCK - 1 entries before or after lands in its block.
        before = entry - 1 - window
        after = entry + 1 + window
        before_loc = tl.load(loc_ptr + before, mask=(window < _BLOCK - 1) & (before >= 0), other=-1)
        after_loc = tl.load(loc_ptr + after, mask=(window < _BLOCK - 1) & (after < n_tokens), other=-1)
        shared = _same_block(before_loc, loc, num_slots) | _same_block(after_loc, loc, num_slots)
        if _slot_written(loc, num_slots) & (tl.max(shared.to(tl.int32), axis=0) == 0):
            if RELEASE_RUNS & (CHUNKS > 1):
                # A big call's programs let the runs kernel launch at their first lone entry (a call with
                # none, a prefill, launches it at its end).
                tl.extra.cuda.gdc_launch_dependents()
            _write_lone_row(x_ptr, x_stride_t, x_stride_h, records_ptr, scales_ptr, entry, loc, head, dim, ok,
                            HEAD_TILE, COLUMNS, WORD, WORD_RESCALE,
                            PAGE_SIZE, HEADS, VALUES, REC_PAGE_STRIDE, REC_OFFSET, REC_SLOT_STRIDE, REC_HEAD_STRIDE,
                            SC_PAGE_STRIDE, SC_OFFSET, SC_HEAD_STRIDE, SC_BLOCK_STRIDE, SC_DIM_STRIDE)
        elif FRESH_RUNS:
            run = _fresh_run_rows(loc, before_loc, after_loc, num_slots)
            # The entry's share of its fresh run: slices `part` (its row, its slot's place in the block),
            # part + run, ... of the program's tile, each SLICE value indices of one head, all the run's rows.
            part = loc % _BLOCK
            if _slot_written(loc, num_slots) & (run > 0) & (run <= SHORT_RUN) & _outside_sink_block(loc // _BLOCK):
                # A short run (at most SHORT_RUN rows: dealt out, its slices would take several rounds): each
                # entry writes its own row, as a lone entry does, from the exponents of all the run's rows.
                _write_short_run(x_ptr, x_stride_t, x_stride_h, records_ptr, scales_ptr, entry, loc, part, run, tile_head, dim,
                                 HEAD_TILE, SHORT_RUN, SHORT_HEADS,
                                 PAGE_SIZE, HEADS, VALUES, REC_PAGE_STRIDE, REC_OFFSET, REC_SLOT_STRIDE, REC_HEAD_STRIDE,
                                 SC_PAGE_STRIDE, SC_OFFSET, SC_HEAD_STRIDE, SC_BLOCK_STRIDE, SC_DIM_STRIDE)
            elif _slot_written(loc, num_slots) & (run > 0) & (part < HEAD_TILE * (COLUMNS // SLICE)) & _outside_sink_block(loc // _BLOCK):
                _write_run_slices(x_ptr, x_stride_t, x_stride_h, records_ptr, scales_ptr, entry, loc, part, run, tile_head,
                                  HEAD_TILE, COLUMNS, SLICE,
                                  PAGE_SIZE, HEADS, VALUES, REC_PAGE_STRIDE, REC_OFFSET, REC_SLOT_STRIDE, REC_HEAD_STRIDE,
                                  SC_PAGE_STRIDE, SC_OFFSET, SC_HEAD_STRIDE, SC_BLOCK_STRIDE, SC_DIM_STRIDE)
        if CHUNKS > 1:
            entry = tl.min(tl.where(maybe & (scanned > entry), scanned, stop), axis=0)
        else:
            entry = stop


@triton.jit
def _lead_block(k, first, index, loc, candidate, window, head, dim, rows, x_stride_t, x_own, records, scales,
                loc_ptr, n_tokens, num_slots, ENTRIES: tl.constexpr, RESCALE_ROWS: tl.constexpr,
                PRELOADED: tl.constexpr, PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
        REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
        SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
        SC_DIM_STRIDE: tl.constexpr):
    """The runs kernel's candidate at window entry k: if it leads its block (no earlier entry of the
    _BLOCK before it lands there), merge the block's new rows with its stored exponents, write them
    and rescale the kept slots where an exponent grew (a whole fresh block: written at once).
    PRELOADED: the program's own rows are x_own (a big call's first leader). Returns the next
    candidate's entry."""
    n = first + k
    loc_k = tl.sum(tl.where(index == k, loc, 0), axis=0)
    block_id = loc_k // _BLOCK
    page_k = loc_k // PAGE_SIZE
    first_slot = loc_k % PAGE_SIZE - loc_k % _BLOCK
    after = tl.min(tl.where(candidate & (index > k), index, ENTRIES), axis=0)
    member = n + window
    member_loc = tl.load(loc_ptr + member, mask=member < n_tokens, other=-1).to(tl.int64)
    src = rows + member.to(tl.int64)[:, None] * x_stride_t + dim[None, :]
    if PRELOADED:
        ahead = member < n_tokens                                # the program's own rows, preloaded
        x_ahead = x_own
    else:
        # Every load at once, before the leader check: the rows of the run that starts here (its entries
        # up to the next candidate; to the window's end past this program's entries) need not wait for
        # the slots (other rows of the block join in block_body).
        ahead = (window < tl.where(after < ENTRIES, after - k, _BLOCK)) & (member < n_tokens)
        x_ahead = tl.load(src, mask=ahead[:, None] & (dim < VALUES)[None, :], other=0.0)
    # The block's stored exponents, unless the leader itself starts the block.
    dim_ok = dim < VALUES
    sc_addr = scales + page_k * SC_PAGE_STRIDE + SC_OFFSET + head * SC_HEAD_STRIDE + first_slot // _BLOCK * SC_BLOCK_STRIDE + dim * SC_DIM_STRIDE
    stored = tl.load(sc_addr, mask=dim_ok & (tl.zeros_like(dim) + loc_k % _BLOCK != 0), other=0).to(tl.int32) - _UE8M0_BIAS
    before = n - _BLOCK + window
    before_block = _block_of(tl.load(loc_ptr + before, mask=before >= 0, other=-1), num_slots)
    # A run start leads unless an earlier entry of the _BLOCK before it lands in the same block.
    if tl.max((before_block == block_id).to(tl.int32), axis=0) == 0:
        # A whole fresh block (the _BLOCK entries from the leader are its slots in order, as in most of a
        # prefill): its rows are all loaded ahead and nothing is merged or rescaled, so no masks per row.
        whole = (tl.sum((member_loc == loc_k + window).to(tl.int32), axis=0) == _BLOCK) & (loc_k % _BLOCK == 0) & _outside_sink_block(block_id)
        if whole:
            x = _convert(x_ahead, tl.float32)
            exponent = _fresh_exponents(tl.max(_magnitude_bits(x), axis=0))
            block_row = page_k * REC_PAGE_STRIDE + REC_OFFSET + (first_slot + window)[:, None] * REC_SLOT_STRIDE + head * REC_HEAD_STRIDE + dim[None, :]
            tl.store(records + block_row, _encode_codes(x * _multiplier(exponent)[None, :]), mask=dim_ok[None, :])
            tl.store(sc_addr, (exponent + _UE8M0_BIAS).to(tl.uint8), mask=dim_ok)
        else:
            hit = _block_of(member_loc, num_slots) == block_id
            hit_ok = hit[:, None] & dim_ok[None, :]
            if PRELOADED:
                x = _convert(tl.where(hit_ok, x_ahead, 0.0), tl.float32)       # rows past the call's end are no hits: all are preloaded
            else:
                x = tl.load(src, mask=hit_ok & ~ahead[:, None], other=x_ahead)     # the rows not loaded ahead
                x = _convert(tl.where(hit_ok, x, 0.0), tl.float32)
            member_in_block = tl.where(hit, member_loc % _BLOCK, -1).to(tl.int32)   # each entry's slot in the block
            # A block whose first slot is written now starts over: stored exponents and other slots are stale.
            fresh = tl.max((member_in_block == 0).to(tl.int32), axis=0)
            in_use = dim_ok & (tl.zeros_like(dim) + fresh == 0)    # tensors: the interpreter rejects tensor & scalar masks
            exponent_old = tl.where(in_use, stored, _EXPONENT_LO)
            exponent = tl.maximum(exponent_old, _block_exponent(tl.max(_magnitude_bits(x), axis=0)))
            member_row = page_k * REC_PAGE_STRIDE + REC_OFFSET + (member_loc % PAGE_SIZE)[:, None] * REC_SLOT_STRIDE + head * REC_HEAD_STRIDE + dim[None, :]
            tl.store(records + member_row, _encode_codes(x * _multiplier(exponent)[None, :]), mask=hit_ok)
            tl.store(sc_addr, (exponent + _UE8M0_BIAS).to(tl.uint8), mask=dim_ok)
            if tl.max(((exponent > exponent_old) & in_use).to(tl.int32), axis=0) > 0:
                # The block's kept slots (the ones not written now), RESCALE_ROWS at a time.
                for r in range(0, _BLOCK, RESCALE_ROWS):
                    part = r + tl.arange(0, RESCALE_ROWS)
                    kept = tl.max((member_in_block[None, :] == part[:, None]).to(tl.int32), axis=1) == 0
                    kept_row = page_k * REC_PAGE_STRIDE + REC_OFFSET + (first_slot + part)[:, None] * REC_SLOT_STRIDE + head * REC_HEAD_STRIDE + dim[None, :]
                    _rescale(records + kept_row, kept[:, None] & ((exponent > exponent_old) & in_use)[None, :], (exponent_old - exponent)[None, :])

    return after


@triton.jit
def _append_runs_program(
        x_ptr, x_stride_t, x_stride_h, loc_ptr, n_tokens, num_slots, records_ptr, scales_ptr,
        ENTRIES: tl.constexpr, COLUMNS: tl.constexpr, RESCALE_ROWS: tl.constexpr, PRELOAD: tl.constexpr,
        FRESH_RUNS: tl.constexpr, PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr,
        PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, VALUES: tl.constexpr,
        REC_PAGE_STRIDE: tl.constexpr, REC_OFFSET: tl.constexpr, REC_SLOT_STRIDE: tl.constexpr, REC_HEAD_STRIDE: tl.constexpr,
        SC_PAGE_STRIDE: tl.constexpr, SC_OFFSET: tl.constexpr, SC_HEAD_STRIDE: tl.constexpr, SC_BLOCK_STRIDE: tl.constexpr,
        SC_DIM_STRIDE: tl.constexpr):
    """The blocks with several new rows, for one plane: ENTRIES consecutive loc entries, one head and
    COLUMNS value indices per program. PRELOAD (big calls, prefill-like): each program's first
    _BLOCK rows load before its slots arrive. FRESH_RUNS: the lone kernel writes the fresh runs;
    they are skipped here.

    An entry leads its block when none of the _BLOCK entries before it lands in the same block (a
    block's entries must lie within _BLOCK consecutive entries, as with per-sequence contiguous
    slots); only run starts (the entry before lands elsewhere) can lead. A leader merges its block's
    new exponents with the stored ones, writes the new codes and exponents and rescales the kept
    codes where an exponent grew (_lead_block); other entries do nothing. A whole fresh block (the
    _BLOCK entries from its leader are its slots in order, as in most of a prefill) skips the merge."""
    if EARLY_RELEASE:
        # Let the stream's next kernel launch now: it waits for this kernel's end, which comes after
        # the lone kernel's (see the end).
        tl.extra.cuda.gdc_launch_dependents()
    head = tl.program_id(1) % HEADS
    first = tl.program_id(0) * ENTRIES
    dim = tl.program_id(2) * COLUMNS + tl.arange(0, COLUMNS)
    window = tl.arange(0, _BLOCK)
    index = tl.arange(0, ENTRIES)
    entry = first + index
    loc = tl.load(loc_ptr + entry, mask=entry < n_tokens, other=-1).to(tl.int64)
    own_block = _block_of(loc, num_slots)
    previous = _block_of(tl.load(loc_ptr + entry - 1, mask=(entry >= 1) & (entry <= n_tokens), other=-1), num_slots)
    next_loc = tl.load(loc_ptr + entry + 1, mask=entry + 1 < n_tokens, other=-1)
    following = _block_of(next_loc, num_slots)
    # Candidates: run starts (the entry before lands elsewhere) with a later entry in their block (the
    # next one, or for a run of one entry one of the _BLOCK - 2 after it); the others are alone or led.
    run_start = (own_block >= 0) & (previous != own_block)
    if PRELOAD:
        # A big call (prefill-like) reads the later entries only where a run of one entry needs them.
        later = tl.zeros_like(entry) != 0
        if tl.max((run_start & (following != own_block)).to(tl.int32), axis=0) > 0:
            later, _ = _later_member(loc_ptr, entry, loc, n_tokens, num_slots)
    else:
        later, run_only = _later_member(loc_ptr, entry, loc, n_tokens, num_slots)     # with the slots: no second round trip
    candidate = run_start & ((following == own_block) | later)
    if FRESH_RUNS:
        # The lone kernel writes the fresh runs (a block's entries hold its slots in order from its
        # first), slices per entry: they lead nothing here.
        fresh_run = (loc % _BLOCK == 0) & (next_loc == loc + 1) & run_only & _outside_sink_block(own_block)
        candidate = candidate & ~fresh_run
    records = records_ptr.to(tl.pointer_type(tl.uint8))
    scales = scales_ptr.to(tl.pointer_type(tl.uint8))
    rows = x_ptr + head * x_stride_h                 # + entry * stride_t + value index: a new value
    # The candidates one at a time: a block's new rows are among the _BLOCK entries from its leader on.
    k = tl.min(tl.where(candidate, index, ENTRIES), axis=0)
    if PRELOAD:
        # A big call's program loads its own _BLOCK rows with its slots: the rows of a leader at its first entry.
        own = first + window
        x_own = tl.load(rows + own.to(tl.int64)[:, None] * x_stride_t + dim[None, :],
                        mask=(own < n_tokens)[:, None] & (dim < VALUES)[None, :], other=0.0)

        if k == 0:
            k = _lead_block(k, first, index, loc, candidate, window, head, dim, rows, x_stride_t, x_own, records, scales,
                            loc_ptr, n_tokens, num_slots, ENTRIES, RESCALE_ROWS, True,
                            PAGE_SIZE, HEADS, VALUES, REC_PAGE_STRIDE, REC_OFFSET, REC_SLOT_STRIDE, REC_HEAD_STRIDE,
                SC_PAGE_STRIDE, SC_OFFSET, SC_HEAD_STRIDE, SC_BLOCK_STRIDE, SC_DIM_STRIDE)
    while k < ENTRIES:
        k = _lead_block(k, first, index, loc, candidate, window, head, dim, rows, x_stride_t, 0, records, scales,
                        loc_ptr, n_tokens, num_slots, ENTRIES, RESCALE_ROWS, False,
                        PAGE_SIZE, HEADS, VALUES, REC_PAGE_STRIDE, REC_OFFSET, REC_SLOT_STRIDE, REC_HEAD_STRIDE,
                SC_PAGE_STRIDE, SC_OFFSET, SC_HEAD_STRIDE, SC_BLOCK_STRIDE, SC_DIM_STRIDE)

    if PDL & (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
        # Launched early (programmatic dependent launch): the grid ends after the lone kernel, so later
        # work sees both. One program waiting is enough (a grid ends with its last program); the
        # others end now and free their SM slots for the next kernel's programs.
        tl.extra.cuda.gdc_wait()
