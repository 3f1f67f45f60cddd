"""The page reset every generated module carries (copied below the COPY marker, as host.py is):
the kernel, reset_pages and its pure-torch twin reset_pages_ref."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Names each generated module defines before this code (stand-ins; see the module for their meaning).
Cache = tuple
_CACHE_NAMES: tuple = ()
_index = _cache_dims = _check_index = _check_cache = _check_apart = _check_compiled_device = None
_PAGE_BYTES_NAMES = _PAGE_STRIDE_NAMES = ()
_kernel_cache = _next_pow2 = _ref_mode = _check_pdl = _ref_pages = _ref_put_back = None

# --- COPY: everything below is copied into each generated module ------------------------------


@triton.jit
def _reset_pages_kernel(buf_ptr, page_ids_ptr, num_pages, PAGE_BYTES: tl.constexpr, PAGE_STRIDE: tl.constexpr,
                        BLOCK: tl.constexpr):
    """Zero every byte of one page of a cache tensor per program (page ids outside [0, num_pages)
    are skipped), BLOCK bytes at a time; pages start PAGE_STRIDE bytes apart."""
    page = tl.load(page_ids_ptr + tl.program_id(0)).to(tl.int64)
    # A skipped id writes nothing: its limit is 0 bytes.
    limit = tl.where((page >= 0) & (page < num_pages), PAGE_BYTES, 0)
    first = buf_ptr.to(tl.pointer_type(tl.uint8)) + tl.where(limit > 0, page, 0) * PAGE_STRIDE
    for start in range(0, PAGE_BYTES, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        tl.store(first + offsets, tl.zeros([BLOCK], dtype=tl.uint8), mask=offsets < limit)

def reset_pages(cache: Cache, page_ids: torch.Tensor, page_size: int, *, pdl: bool | None = None) -> None:
    """Zero every byte of the pages `page_ids` in every cache tensor: records and scales. Call it when
    an allocator hands a page out again: a zeroed page is a fresh one (scale bytes 0: where slots
    share a scale, a block's exponent starts over from the smallest, whichever slot a new sequence
    starts at).

    page_ids: (N,) int32/int64 page indices; ids outside [0, num_pages) are skipped.
    One launch per cache tensor, fixed grids, no host sync: CUDA-graph capturable.
    pdl: True, False or None, for the signature every op shares (these launches are plain).
    """
    _check_pdl(pdl)
    geo, num_pages = _prepare_reset(cache, page_ids, page_size)
    _check_compiled_device(_reset_pages_kernel, "page_ids", page_ids.device)
    if page_ids.shape[0] == 0:
        return
    for t, page_bytes, page_stride in zip(_kernel_cache(cache), (geo[name] for name in _PAGE_BYTES_NAMES),
                                          (geo[name] for name in _PAGE_STRIDE_NAMES)):
        _reset_pages_kernel[(page_ids.shape[0],)](t, page_ids, num_pages, PAGE_BYTES=page_bytes, PAGE_STRIDE=page_stride,
                                                   BLOCK=min(_RESET_BLOCK, _next_pow2(page_bytes)))


# Bytes a reset program zeroes at a time.
_RESET_BLOCK = 4096


def _prepare_reset(cache, page_ids, page_size) -> tuple:
    """Checks for reset_pages (and its reference); returns the cache's geometry (each field's page
    bytes and page stride) and page count."""
    page_size = _index(page_size, "page_size")
    heads, values = _cache_dims(cache)
    device = page_ids.device if isinstance(page_ids, torch.Tensor) else None
    _check_index("page_ids", page_ids, device)
    geo, num_pages = _check_cache(cache, page_size, heads, values, device)
    _check_apart(("page_ids",) + _CACHE_NAMES, (page_ids, *cache), tuple(range(1, 1 + len(cache))))
    return geo, num_pages


def reset_pages_ref(cache: Cache, page_ids: torch.Tensor, page_size: int, *, pdl: bool | None = None) -> None:
    """Pure-torch twin of reset_pages: zeroes the same bytes (pdl is checked and ignored)."""
    _check_pdl(pdl)
    _, num_pages = _prepare_reset(cache, page_ids, page_size)
    ids = page_ids.to(torch.int64)
    ids = ids[(ids >= 0) & (ids < num_pages)]
    with _ref_mode(cache):
        fields = _ref_pages(cache)
        for t in fields:
            t.view(-1).view(torch.uint8).view(num_pages, -1)[ids] = 0
        _ref_put_back(cache, fields)
