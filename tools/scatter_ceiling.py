"""The ceiling of a store into scattered slots: a plain Triton scatter copy (no quantization) that moves
the bytes of a quantize_store at N=131072 tokens, into contiguous slots (a prefill) and into random
slots, as % of the same run's device copy.

Run on a CUDA machine: python tools/scatter_ceiling.py (bench/RESULTS.md quotes it).
  DSv4 shape:  1 KB of bf16 read per token; a 576-byte record and 7 trailer bytes written
               (pages of 64 slots, records then an 8-byte-per-slot trailer).
  MXFP8 plane: 2 KB read per token; a 1 KB record and 8 x 4 scale bytes written, one 4-byte group
               per head in a per-head region of the page (pages of 128 slots).
"""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench.run as br  # noqa: E402

TOKENS = 1 << 17
SCALE_LANES = tl.constexpr(64)     # >= scale bytes per token


@triton.jit
def _scatter_kernel(src_ptr, loc_ptr, dst_ptr, n_tokens,
                    PAGE: tl.constexpr, PAGE_BYTES: tl.constexpr, RECORD: tl.constexpr, SCALES_OFFSET: tl.constexpr,
                    SCALE_BYTES: tl.constexpr, SCALE_SLOT_STRIDE: tl.constexpr, HEADS: tl.constexpr,
                    SCALE_HEAD_STRIDE: tl.constexpr, ROW: tl.constexpr, BLOCK_T: tl.constexpr):
    """BLOCK_T tokens per program: read ROW int16 values, write RECORD bytes (one per value) at the
    token's slot and SCALE_BYTES bytes per head in the page's scale region."""
    token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = token < n_tokens
    loc = tl.load(loc_ptr + token, mask=ok, other=0).to(tl.int64)
    page = loc // PAGE
    slot = loc % PAGE
    value = tl.arange(0, ROW)
    x = tl.load(src_ptr + token.to(tl.int64)[:, None] * ROW + value[None, :], mask=ok[:, None], other=0)
    record = page * PAGE_BYTES + slot * RECORD
    tl.store(dst_ptr + record[:, None] + value[None, :], x.to(tl.uint8), mask=ok[:, None] & (value < RECORD)[None, :])
    lane = tl.arange(0, SCALE_LANES)
    scales = page * PAGE_BYTES + SCALES_OFFSET + slot * SCALE_SLOT_STRIDE
    at = scales[:, None] + (lane // SCALE_BYTES * SCALE_HEAD_STRIDE + lane % SCALE_BYTES)[None, :]
    tl.store(dst_ptr + at, tl.full([BLOCK_T, SCALE_LANES], 7, tl.uint8), mask=ok[:, None] & (lane < SCALE_BYTES * HEADS)[None, :])


SHAPES = {  # name: (page, pages, row values, record bytes, scale bytes per head, heads, tokens per program)
    "DSv4 (576 B + 7 B trailer)": (64, 16384, 512, 576, 7, 1, 32),
    "MXFP8 plane (1 KB + 8 x 4 B)": (128, 4096, 1024, 1024, 4, 8, 8),
}


def main() -> int:
    if not torch.cuda.is_available():
        print("scatter_ceiling needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    copy = br.device_copy_gbps()
    print(f"device copy {copy:.0f} GB/s")
    for name, (page, pages, row, record, scale_bytes, heads, block_t) in SHAPES.items():
        slot_stride = 8 if heads == 1 else scale_bytes      # DSv4's trailer has a pad byte per slot
        page_bytes = page * record + page * slot_stride * heads
        dst = torch.empty(pages * page_bytes, dtype=torch.uint8, device="cuda")
        src = torch.randint(-30000, 30000, (TOKENS, row), dtype=torch.int16, device="cuda")
        moved = TOKENS * (2 * row + record + scale_bytes * heads + 4)
        for scenario, loc in (("prefill", br.prefill_slots(TOKENS, pages, page)),
                              ("random", br.random_slots(TOKENS, pages * page))):
            loc = loc.to(torch.int32)

            def call():
                _scatter_kernel[(triton.cdiv(TOKENS, block_t),)](
                    src, loc, dst, TOKENS, page, page_bytes, record, page * record, scale_bytes, slot_stride,
                    heads, page * scale_bytes, row, block_t, num_warps=4)

            ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            print(f"{name:<30} {scenario:<8} {ms * 1e3:8.1f} us {100 * moved / ms / 1e6 / copy:6.1f}% of copy", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
