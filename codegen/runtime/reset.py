"""The page reset every generated module carries (copied below the COPY marker, as host.py is)."""
from __future__ import annotations

import triton
import triton.language as tl

# --- COPY: everything below is copied into each generated module ------------------------------


@triton.jit
def _reset_pages_kernel(buf_ptr, page_ids_ptr, num_pages, PAGE_BYTES: tl.constexpr, BLOCK: tl.constexpr):
    """Zero every byte of one page of a cache tensor per program (page ids outside [0, num_pages)
    are skipped), BLOCK bytes at a time."""
    page = tl.load(page_ids_ptr + tl.program_id(0)).to(tl.int64)
    # A skipped id writes nothing: its limit is 0 bytes.
    limit = tl.where((page >= 0) & (page < num_pages), PAGE_BYTES, 0)
    first = buf_ptr.to(tl.pointer_type(tl.uint8)) + tl.where(limit > 0, page, 0) * PAGE_BYTES
    for start in range(0, PAGE_BYTES, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        tl.store(first + offsets, tl.zeros([BLOCK], dtype=tl.uint8), mask=offsets < limit)
