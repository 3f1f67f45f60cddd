"""Floors of two access patterns whose ops miss a target: bare kernels that move the same bytes in the
same order, with no quantization, timed in the same run as the op (GPU).

  rescale  a rescaling append decode step (`typical`, `grow` in bench.run): each of 2048 programs
           reads a random 32-slot block of the seq-blocked cache (32 rows of 8 heads x 128 fp8
           values, 32 KB) and writes it back; also copied to another buffer, and consecutive
           blocks instead of random ones. Launch shapes: programs per block, rows at a time, warps.
  gather   a decode-size DSv4 gather (2048 random ids): each token's id, then its 584 bytes (the
           record and its scales), then 1 KB of bf16 values written; also without the record
           load (one round trip instead of two). Launch shapes: tokens per program, warps.

    python -m bench.floors [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from . import run as B

# The seq-blocked append's bench geometry: a block is 32 slots of 8 heads x 128 one-byte codes.
BLOCK_SLOTS = 32
ROW_WORDS = 8 * 128 // 4              # one slot's codes, as int32 words
DECODE_TOKENS = 2048
PAGES, PAGE = 4096, 128
# The DSv4 gather's: a token's record and scale bytes (584), and its 512 bf16 values (1 KB).
RECORD_WORDS = 584 // 4
OUT_WORDS = 512 * 2 // 4
DSV4_PAGES, DSV4_PAGE = 16384, 64


@triton.jit
def _rewrite_rows(src, dst, first_word_ptr, ROWS: tl.constexpr, BLOCK_ROWS: tl.constexpr, ROW_WORDS: tl.constexpr):
    """BLOCK_ROWS rows of ROW_WORDS words from the program's first word, ROWS at a time: loaded from
    src and stored to dst (the same buffer: a read and write back)."""
    first = tl.load(first_word_ptr + tl.program_id(0))
    rows = tl.arange(0, ROWS)[:, None] * ROW_WORDS + tl.arange(0, ROW_WORDS)[None, :]
    for r in range(0, BLOCK_ROWS, ROWS):
        at = first + r * ROW_WORDS + rows
        tl.store(dst + at, tl.load(src + at))


@triton.jit
def _gather_rows(records, ids_ptr, out, n, TOKENS: tl.constexpr, LOAD_RECORDS: tl.constexpr,
                 RECORD_WORDS: tl.constexpr, OUT_WORDS: tl.constexpr):
    """TOKENS ids per program; each token's OUT_WORDS output words: its record's RECORD_WORDS words
    (zeros after them) when LOAD_RECORDS, else words made from the id alone."""
    token = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    ok = token < n
    ids = tl.load(ids_ptr + token, mask=ok, other=0).to(tl.int64)
    word = tl.arange(0, OUT_WORDS)[None, :]
    if LOAD_RECORDS:
        x = tl.load(records + ids[:, None] * RECORD_WORDS + word, mask=ok[:, None] & (word < RECORD_WORDS), other=0)
    else:
        x = ids[:, None].to(tl.int32) + word
    tl.store(out + token.to(tl.int64)[:, None] * OUT_WORDS + word, x, mask=ok[:, None])


def rewrite_blocks(src, dst, first_words, block_rows, rows, warps):
    _rewrite_rows[(first_words.numel(),)](src, dst, first_words, ROWS=rows, BLOCK_ROWS=block_rows,
                                          ROW_WORDS=ROW_WORDS, num_warps=warps)


def gather_rows(records, ids, out, tokens, load_records, warps):
    _gather_rows[(triton.cdiv(ids.numel(), tokens),)](records, ids, out, ids.numel(), TOKENS=tokens,
                                                      LOAD_RECORDS=load_records, RECORD_WORDS=RECORD_WORDS,
                                                      OUT_WORDS=OUT_WORDS, num_warps=warps)


def block_first_words(blocks: torch.Tensor, split: int) -> torch.Tensor:
    """Each program's first word when each block of BLOCK_SLOTS rows is split over `split` programs."""
    rows = blocks[:, None] * BLOCK_SLOTS + torch.arange(split, device=blocks.device)[None, :] * (BLOCK_SLOTS // split)
    return (rows.flatten() * ROW_WORDS).to(torch.int64)


def rescale_floor(copy_gbps: float) -> list[dict]:
    torch.manual_seed(0)
    cache = torch.randint(-2**31, 2**31 - 1, (PAGES * PAGE * ROW_WORDS,), dtype=torch.int32, device="cuda")
    other = torch.empty_like(cache)
    pages = torch.randperm(PAGES, device="cuda")[:DECODE_TOKENS]
    random_blocks = pages * (PAGE // BLOCK_SLOTS) + torch.randint(0, PAGE // BLOCK_SLOTS, (DECODE_TOKENS,), device="cuda")
    moved = 2 * DECODE_TOKENS * BLOCK_SLOTS * ROW_WORDS * 4
    out = []
    for blocks_name, blocks in (("random", random_blocks), ("consecutive", torch.arange(DECODE_TOKENS, device="cuda"))):
        for target_name, dst in (("in place", cache), ("to another buffer", other)):
            times = []
            for split in (1, 2, 4):
                first_words = block_first_words(blocks, split)
                for rows in (4, 8, 16, 32):
                    if rows > BLOCK_SLOTS // split:
                        continue
                    for warps in (1, 2, 4, 8):
                        us = B.graph_us(lambda: rewrite_blocks(cache, dst, first_words, BLOCK_SLOTS // split, rows, warps))
                        times.append((us, f"{split} programs/block, {rows} rows, {warps} warps"))
            times.sort()
            out.append({"floor": "rescale", "case": f"{blocks_name} blocks, {target_name}", "moved_bytes": moved,
                        "best_us": times[0][0], "best_shape": times[0][1], "worst_us": times[-1][0],
                        "shapes": len(times), "best_pct_copy": 100 * moved / times[0][0] / 1e3 / copy_gbps,
                        "worst_pct_copy": 100 * moved / times[-1][0] / 1e3 / copy_gbps})
    return out


def gather_floor() -> list[dict]:
    from generated import dsv4_k
    torch.manual_seed(0)
    cache = B.filled_cache(dsv4_k, DSV4_PAGES, DSV4_PAGE, dsv4_k.HEADS, dsv4_k.VALUES)
    ids = torch.randint(0, DSV4_PAGES * DSV4_PAGE, (DECODE_TOKENS,), device="cuda").to(torch.int32)
    dest = torch.empty(DECODE_TOKENS, dsv4_k.HEADS, dsv4_k.VALUES, dtype=torch.bfloat16, device="cuda")
    out = [{"floor": "gather", "case": "dsv4_k.gather_dequant (the op)",
            "best_us": B.graph_us(lambda: dsv4_k.gather_dequant(cache, ids, DSV4_PAGE, out=dest))}]
    records = torch.randint(-2**31, 2**31 - 1, (DSV4_PAGES * DSV4_PAGE * RECORD_WORDS,), dtype=torch.int32, device="cuda")
    rows = torch.empty(DECODE_TOKENS * OUT_WORDS, dtype=torch.int32, device="cuda")
    for load_records, name in ((True, "ids, then records; rows written"), (False, "ids only; rows written")):
        times = sorted((B.graph_us(lambda: gather_rows(records, ids, rows, tokens, load_records, warps)),
                        f"{tokens} tokens/program, {warps} warps")
                       for tokens in (1, 2, 4, 8, 16, 32) for warps in (1, 2, 4, 8))
        out.append({"floor": "gather", "case": f"bare: {name}", "best_us": times[0][0], "best_shape": times[0][1],
                    "worst_us": times[-1][0], "shapes": len(times)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.floors needs a CUDA GPU", file=sys.stderr)
        return 4                 # bad usage here (2 is a bad spec's code)
    copy_gbps = B.device_copy_gbps()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy {copy_gbps:.0f} GB/s")
    results = rescale_floor(copy_gbps) + gather_floor()
    for r in results:
        line = f"{r['floor']:8s} {r['case']:40s} best {r['best_us']:7.2f} us"
        if "shapes" in r:
            line += f" ({r['best_shape']}), worst {r['worst_us']:7.2f} us over {r['shapes']} shapes"
        if "best_pct_copy" in r:
            line += f"; {r['best_pct_copy']:.1f}-{r['worst_pct_copy']:.1f}% of copy"
        print(line)
    if a.json:
        Path(a.json).write_text(json.dumps({"copy_gbps": copy_gbps, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
