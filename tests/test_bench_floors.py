"""bench.floors' bare kernels move exactly the bytes they claim (the floors in bench/RESULTS.md)."""
import torch

from tests.conftest import DEVICE
from bench import floors as F


def test_rewrite_blocks_moves_whole_blocks_and_nothing_else():
    g = torch.Generator().manual_seed(0)
    blocks = torch.tensor([5, 0, 3], device=DEVICE)
    src = torch.randint(-2**31, 2**31 - 1, (8 * F.BLOCK_SLOTS * F.ROW_WORDS,), generator=g, dtype=torch.int32).to(DEVICE)
    for split, rows in ((1, 8), (2, 4), (4, 8)):
        dst = torch.full_like(src, -1)       # poisoned: unwritten words show
        F.rewrite_blocks(src, dst, F.block_first_words(blocks, split), F.BLOCK_SLOTS // split, rows, warps=1)
        want = torch.full_like(src, -1).view(8, -1)
        want[blocks] = src.view(8, -1)[blocks]
        assert torch.equal(dst.view(8, -1), want), (split, rows)


def test_gather_rows_writes_each_tokens_record_then_zeros():
    g = torch.Generator().manual_seed(1)
    records = torch.randint(-2**31, 2**31 - 1, (50 * F.RECORD_WORDS,), generator=g, dtype=torch.int32).to(DEVICE)
    ids = torch.tensor([7, 49, 0, 7, 13], dtype=torch.int32, device=DEVICE)
    out = torch.full((ids.numel() * F.OUT_WORDS,), -1, dtype=torch.int32, device=DEVICE)
    F.gather_rows(records, ids, out, tokens=2, load_records=True, warps=1)
    rows = out.view(ids.numel(), F.OUT_WORDS)
    assert torch.equal(rows[:, :F.RECORD_WORDS], records.view(50, -1)[ids.long()])
    assert bool((rows[:, F.RECORD_WORDS:] == 0).all())
    F.gather_rows(records, ids, out, tokens=4, load_records=False, warps=1)
    assert torch.equal(rows, ids[:, None] + torch.arange(F.OUT_WORDS, dtype=torch.int32, device=DEVICE)[None, :])
