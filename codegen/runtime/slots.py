"""Which rows a cache kernel's program handles and where they go: the slot arithmetic every cache
kernel shares (quantize_store, gather_dequant; append reuses _slot_written).

Everything below the COPY marker is copied into each generated module, less the helpers its ops do
not call (render._carried). The layout's facts reach this code as module-level constexprs
the module defines first: _SINK_SLOT (the slot writers skip, -1: none) and _BLOCK (slots that share
one scale, for layouts whose scale groups run along slots).
"""
from __future__ import annotations

import triton
import triton.language as tl

# Names each generated module defines before this code (stand-ins; see the module docstring).
_SINK_SLOT = tl.constexpr(-1)
_BLOCK = tl.constexpr(32)

# --- COPY: everything below is copied into each generated module ------------------------------


@triton.jit
def _slot_written(loc, num_slots):
    """Whether slot ids `loc` are written by a call: not negative, not past the cache, not the sink."""
    if _SINK_SLOT >= 0:
        return (loc >= 0) & (loc < num_slots) & (loc != _SINK_SLOT)
    else:
        return (loc >= 0) & (loc < num_slots)


@triton.jit
def _program_tokens(BLOCK_T: tl.constexpr):
    """The BLOCK_T token rows of this program (grid axis 0 counts blocks of rows)."""
    return tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)


@triton.jit
def _head_rows(BLOCK_T: tl.constexpr, HEADS: tl.constexpr):
    """(token, head) of a writer program whose BLOCK_T rows are (token, head) pairs, every head of a
    token in turn, and which writes them for every plane (grid axis 0 counts blocks of rows): the
    records of a token's heads and planes, adjacent in a page, are written by one program at once."""
    row = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    return row // HEADS, row % HEADS


@triton.jit
def _grouped_lane_tokens(LANE_GROUP: tl.constexpr, BLOCK_T: tl.constexpr):
    """(lane, token rows) of a gather program. Programs go LANE_GROUP lanes at a time (grid axis 1 is
    the group): within a group the lanes of one block of rows are adjacent, then the next block."""
    lane = tl.program_id(1) * LANE_GROUP + tl.program_id(0) % LANE_GROUP
    token = tl.program_id(0) // LANE_GROUP * BLOCK_T + tl.arange(0, BLOCK_T)
    return lane, token


@triton.jit
def _write_targets(loc_ptr, token, in_range, num_slots, PAGE_SIZE: tl.constexpr):
    """(ok, page, slot in page) of the slot ids at rows `token`: ok where the call writes; the
    others point at slot 0 (and are masked)."""
    loc = tl.load(loc_ptr + token, mask=in_range, other=-1).to(tl.int64)
    ok = in_range & _slot_written(loc, num_slots)
    loc = tl.where(ok, loc, 0)
    return ok, loc // PAGE_SIZE, loc % PAGE_SIZE


@triton.jit
def _read_targets(ids_ptr, token, in_range, num_slots, PAGE_SIZE: tl.constexpr):
    """(ok, page, slot in page) of the slot ids at rows `token`: negative ids and ids past the cache
    are not ok (they read as zeros) and point at slot 0."""
    loc = tl.load(ids_ptr + token, mask=in_range, other=-1).to(tl.int64)
    ok = in_range & (loc >= 0) & (loc < num_slots)
    loc = tl.where(ok, loc, 0)
    return ok, loc // PAGE_SIZE, loc % PAGE_SIZE


@triton.jit
def _block_in_page(slot):
    """The _BLOCK-slot block of a page holding slot `slot` (its scales' block coordinate)."""
    return slot // _BLOCK


@triton.jit
def _row_offset(token, head, stride_t, stride_h):
    """Element offset of row (token, head) in a (T, heads, values) source or destination."""
    return token.to(tl.int64) * stride_t + head * stride_h
