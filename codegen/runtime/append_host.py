"""The host side of the seq-blocked append: its launch constants and the two launches of a checked
call (see docs/design.md for the kernels).

Everything below the COPY marker is copied into the generated module of every layout with an
append (see host.py). It reads the layout's facts from module-level names the module defines:
_WORD_RESCALE_CODES (whether its codes take the inline-PTX word rescale), _RECORD_FIELDS (the Cache
fields holding records), _RECORD_WORD_ALIGNED (geometry names that must be multiples of 4 for it),
and the module's kernels and helpers.
"""
from __future__ import annotations

import torch
import triton

# Names each generated module defines before this code (stand-ins; see the module docstring).
LAUNCH: dict = {}
PLANES: tuple = ()
SCALE_GROUP_TOKENS = 32
_WORD_RESCALE_CODES = False
_RECORD_FIELDS: tuple = ()
_RECORD_WORD_ALIGNED: tuple = ()
_append_lone_kernel = _append_runs_kernel = _compute_capability = _next_pow2 = _cdiv = None
_kernel_cache = None
_dependent_launch = _chain = _launch = _scale_word_bytes = None

# --- COPY: everything below is copied into each generated module ------------------------------


# Slots the runs kernel's rescale of a block takes at a time (more: fewer round trips, more registers).
_RESCALE_ROWS = 16
# Fresh runs of at most this many rows are written a row per entry (each loading all the run's rows), not as
# slices dealt out to the run's entries, r slices a round, one round trip after another (H200, 2048-token
# batches of 1-300-token sequences: 4.70-4.81 us; 4.89-5.05 with 4 here; 4.63-5.26 without).
_SHORT_RUN = 8
# The spec's register cap (lone_registers) was tuned with this Triton minor version; other versions
# allocate registers differently (Triton 3.9 spills under the same cap), so they launch uncapped.
_REGISTER_CAPS_TRITON = "3.6"
_REGISTER_CAPS = ".".join(triton.__version__.split(".")[:2]) == _REGISTER_CAPS_TRITON
# Threads per warp: a fresh run's slices hold at least one value index per thread of the lone kernel.
_WARP_THREADS = 32


# Set to False to rescale a grown block's rows code by code in Triton everywhere, never as words
# with inline PTX; the bytes written are the same either way.
PTX_RESCALE = True


def _word_rescale(cache, geo: dict, device: torch.device) -> bool:
    """Whether the lone kernel rescales a grown block's rows as 32-bit words of 4 codes with inline
    PTX (_rescale_words: e4m3fn codes, sm_90 and later, compiled kernels only, never under Triton's
    interpreter): the record bytes must be word-aligned: buffers, pages, region and strides (a
    record's, so its value count too)."""
    if not (_WORD_RESCALE_CODES and PTX_RESCALE and isinstance(_append_lone_kernel, triton.runtime.JITFunction)
            and device.type == "cuda"
            and _compute_capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9):
        return False
    starts = [cache[i].data_ptr() for i in _RECORD_FIELDS] + [geo[name] for name in _RECORD_WORD_ALIGNED]
    return all(n % 4 == 0 for n in starts)


def _append_launches(srcs: tuple, loc, cache, page_size: int, geo: dict, num_pages: int, pdl, plan, tensors: tuple) -> None:
    """append's two launches for checked arguments (recorded into `plan` when it is not None)."""
    n_tokens, heads, values = srcs[0].shape
    knobs = LAUNCH["append"]
    args = (*(arg for src in srcs for arg in (src, src.stride(0), src.stride(1))),
            loc, n_tokens, num_pages * page_size, *_kernel_cache(cache))
    # A big call's lone programs scan several entries each (few of a prefill's entries are alone).
    chunks = _next_pow2(_cdiv(n_tokens, knobs["lone_programs"]))
    columns = min(knobs["lone_columns"], _next_pow2(values))
    head_tile = min(knobs["lone_heads"], _next_pow2(heads))
    head_tiles = _cdiv(heads, head_tile)
    runs_pdl = _dependent_launch(loc.device)         # the runs kernel a dependent of the lone kernel
    chain = _chain("append", loc.device, pdl)        # the lone kernel one of the stream's previous kernel
    # One entry per program (a decode step's): capped registers fit more programs on an SM at once.
    lone_cap = {"maxnreg": knobs["lone_registers"]} if chunks == 1 and knobs["lone_registers"] and _REGISTER_CAPS else {}
    # ... and then write fresh runs too, slices of each tile dealt out to a run's entries (up to a block of slices, each
    # within one head and at least a value index per thread: a slice the program's warps shared each would load).
    fresh_runs = knobs["lone_fresh_runs"] and chunks == 1
    slice_values = min(columns, max(head_tile * columns // SCALE_GROUP_TOKENS, _WARP_THREADS * knobs["lone_warps"]))
    grid = (_cdiv(n_tokens, chunks), len(PLANES) * head_tiles, _cdiv(values, columns))
    _launch(_append_lone_kernel, grid, args, dict(HEAD_TILE=head_tile, HEAD_TILES=head_tiles, CHUNKS=chunks, COLUMNS=columns,
                              FRESH_RUNS=fresh_runs, SLICE=slice_values, SHORT_RUN=_SHORT_RUN,
                              SHORT_HEADS=max(1, head_tile // 2), RELEASE_RUNS=runs_pdl,
                              WORD=_scale_word_bytes(cache, geo, page_size),
                              WORD_RESCALE=columns >= 4 and _word_rescale(cache, geo, loc.device),
                              PDL=chain["PDL"], num_warps=knobs["lone_warps"], **lone_cap,
                              **({"launch_pdl": True} if chain["PDL"] else {}), **geo), plan, tensors)
    entries, columns = knobs["entries"], min(knobs["columns"], _next_pow2(values))
    grid = (_cdiv(n_tokens, entries), len(PLANES) * heads, _cdiv(values, columns))
    _launch(_append_runs_kernel, grid, args, dict(ENTRIES=entries, COLUMNS=columns, RESCALE_ROWS=min(_RESCALE_ROWS, SCALE_GROUP_TOKENS),
                              PRELOAD=chunks > 1, FRESH_RUNS=fresh_runs, PDL=runs_pdl, EARLY_RELEASE=chain["EARLY_RELEASE"],
                              num_warps=knobs["num_warps"], **({"launch_pdl": True} if runs_pdl else {}), **geo), plan, tensors)
