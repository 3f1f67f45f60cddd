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


def test_sweep_prints_a_tuning_block_the_spec_loader_takes(tmp_path):
    """`kvlayout bench --sweep` ends with each layout's best knobs as a `tuning:` block: pasted into the
    spec in place of its own, the spec builds with exactly those knobs."""
    import re
    from pathlib import Path
    from bench.run import tuning_blocks
    from codegen.build import build_layout, load_spec
    root = Path(__file__).resolve().parent.parent
    chosen = {("mxfp8_v_seqblocked", "append"): {"columns": 64, "entries": 16, "early_release": False},
              ("mxfp8_v_seqblocked", "append_small"): {"lone_heads": 4, "lone_registers": None},
              ("mxfp8_v_seqblocked", "gather_dequant"): {"elements": 1024, "num_warps": 8}}
    block = tuning_blocks(chosen)
    assert block.startswith("# specs/mxfp8_v_seqblocked.yaml\ntuning:\n")
    spec = root / "specs" / "mxfp8_v_seqblocked.yaml"
    text = re.sub(r"\ntuning:\n(  .*\n)+", "\n" + block.split("\n", 1)[1] + "\n", spec.read_text())
    assert text != spec.read_text()
    tmp = tmp_path / "mxfp8_v_seqblocked.yaml"
    tmp.write_text(text)
    kind, tree, display, digest = load_spec(tmp, root)
    launch = build_layout(tree, display, digest).launch
    assert {k: launch["append"][k] for k in ("columns", "entries", "early_release", "lone_heads")} == \
        {"columns": 64, "entries": 16, "early_release": False, "lone_heads": 4}
    assert launch["gather_dequant"]["elements"] == 1024 and launch["gather_dequant"]["num_warps"] == 8
