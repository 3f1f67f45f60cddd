"""Every op of every spec: the Triton kernel against its torch reference, bit for bit.

Without CUDA the kernels run in Triton's interpreter (with the GPU's conversions, see
interpreter_fp8.py); with CUDA they run on the GPU. Outputs are poisoned with random bytes first,
so any byte a kernel fails to write (or writes where it should not) shows up.
"""
import pytest
import torch

from tests.conftest import DEVICE, ON_GPU
from tests.corpus import adversarial_rows, generator, random_bytes, scaled_normal
from tests.harness import (KernelStub, assert_same_bytes, assert_same_cache, cases, clone, dims, fresh_cache, given,
                           module, pairs, per_plane, plane_rows, sources, unique_slots)

SOURCE_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def source_rows(m, tokens: int, heads: int, values: int, dtype, gen) -> torch.Tensor:
    """(tokens, heads, values): adversarial rows first (as many as fit), the rest random."""
    adv = adversarial_rows(values, gen, torch.float32)
    adv = adv[torch.randperm(adv.shape[0], generator=gen)]
    rows = torch.cat([adv, scaled_normal((tokens * heads, values), gen, torch.float32)])[: tokens * heads]
    rows = rows[torch.randperm(rows.shape[0], generator=gen)]
    return rows.view(tokens, heads, values).to(dtype).to(DEVICE)


@pytest.mark.parametrize("blocks", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("name", [n for n in cases("gather_dequant") if module(n).SCALE_GROUP_TOKENS > 1])
def test_gather_dequant_page_sizes(name, blocks):
    """Token-group scales at every page size a reader treats differently (one byte per value index and
    block, or one 2-, 4- or 8-byte word per value index), on random cache bytes (every scale byte)."""
    m = module(name)
    gen = generator(16)
    heads, values, _ = dims(m)
    page = -(-blocks * m.SCALE_GROUP_TOKENS // m.PAGE_SIZE_MULTIPLE) * m.PAGE_SIZE_MULTIPLE
    num_pages = 5
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    ids = torch.randint(-2, num_pages * page + 2, (203,), generator=gen).to(DEVICE)
    for plane, a, b in pairs(m, m.gather_dequant(cache, ids, page, **given(m)), m.gather_dequant_ref(cache, ids, page, **given(m))):
        assert_same_bytes(a, b, f"{name}.gather_dequant page {page} ({plane})")
    # The same bytes one byte into a larger allocation: too misaligned for word reads.
    shifted = []
    for t in cache:
        room = torch.empty(t.numel() * t.element_size() + 1, dtype=torch.uint8, device=DEVICE)
        view = room[1:].view(t.dtype).view(t.shape) if t.element_size() == 1 else t
        view.copy_(t)
        shifted.append(view)
    shifted = type(cache)(*shifted)
    for plane, a, b in pairs(m, m.gather_dequant(shifted, ids, page, **given(m)), m.gather_dequant_ref(cache, ids, page, **given(m))):
        assert_same_bytes(a, b, f"{name}.gather_dequant page {page}, buffers at odd addresses ({plane})")


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("name", cases("gather_dequant"))
def test_gather_dequant(name, out_dtype):
    m = module(name)
    gen = generator(11)
    heads, values, page = dims(m)
    num_pages = 9
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    num_slots = num_pages * page
    tokens = 333
    ids = torch.randint(0, num_slots, (tokens,), generator=gen)
    ids[:4] = torch.tensor([-1, -7, num_slots, num_slots + 5])
    ids = ids[torch.randperm(tokens, generator=gen)].to(torch.int32).to(DEVICE)
    # Destinations are strided slices of poisoned workspaces; the margins must stay untouched.
    work = [random_bytes(torch.empty(tokens + 2, heads, values + 16, dtype=out_dtype, device=DEVICE), gen)
            for _ in m.PLANES]
    work_ref = [w.clone() for w in work]
    slices = lambda ws: tuple(w[1:tokens + 1, :, 8:8 + values] for w in ws)  # noqa: E731
    out = slices(work) if len(m.PLANES) > 1 else slices(work)[0]
    out_ref = slices(work_ref) if len(m.PLANES) > 1 else slices(work_ref)[0]
    got = m.gather_dequant(cache, ids, page, out=out, **given(m))
    want = m.gather_dequant_ref(cache, ids, page, out=out_ref, **given(m))
    assert (got is out) and (want is out_ref)
    for plane, a, b in zip(m.PLANES, work, work_ref, strict=True):
        assert_same_bytes(a, b, f"{name}.gather_dequant workspace ({plane})")
    if out_dtype != torch.bfloat16:
        return
    # The default destination: fresh bf16 tensors (once: the same call whatever out_dtype).
    got = m.gather_dequant(cache, ids.to(torch.int64), page, **given(m))
    want = m.gather_dequant_ref(cache, ids.to(torch.int64), page, **given(m))
    for _, a, b in pairs(m, got, want):
        assert a.dtype == torch.bfloat16 and a.shape == (tokens, heads, values)
        assert_same_bytes(a, b, f"{name}.gather_dequant default out")


def lanes_of(name: str) -> int:
    """A gather's (plane, head) lanes at the test size."""
    return len(module(name).PLANES) * dims(module(name))[0]


def lane_group_cases() -> list:
    """(layout, most) for each distinct lane group that lane_group 1, 2, 4 or 8 gives a layout of
    several lanes (the smallest `most` giving it: larger ones launch the same grid)."""
    out = []
    for name in (n for n in cases("gather_dequant") if lanes_of(n) > 1):
        groups = {}
        for most in (1, 2, 4, 8):
            groups.setdefault(module(name)._lane_group(lanes_of(name), most), most)
        out += [pytest.param(name, most, id=f"{name}-{most}") for most in groups.values()]
    return out


@pytest.mark.parametrize("name", [n for n in cases("gather_dequant") if lanes_of(n) > 1])
def test_lane_group_is_the_largest_divisor_within_the_knob(name):
    m = module(name)
    lanes = lanes_of(name)
    for most in range(1, 17):
        group = m._lane_group(lanes, most)
        assert lanes % group == 0 and group <= most and all(lanes % d for d in range(group + 1, most + 1))


@pytest.mark.parametrize("name,most", lane_group_cases())
def test_gather_dequant_lane_groups(name, most):
    """Every grouping of a gather's (plane, head) lanes (lane_group: at most `most` side by side, the
    largest divisor of the lanes) reads every lane of every token block once: a partial last block,
    skipped ids, poisoned destinations."""
    m = module(name)
    gen = generator(12)
    heads, values, page = dims(m)
    group = m._lane_group(lanes_of(name), most)
    num_pages = 5
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    ids = torch.randint(-2, num_pages * page + 2, (203,), generator=gen).to(DEVICE)
    outs = [random_bytes(torch.empty(203, heads, values, dtype=torch.bfloat16, device=DEVICE), gen) for _ in m.PLANES]
    saved = m.LAUNCH["gather_dequant"]
    m.LAUNCH["gather_dequant"] = {**saved, "lane_group": most}
    try:
        got = m.gather_dequant(cache, ids, page, out=tuple(outs) if len(outs) > 1 else outs[0], **given(m))
    finally:
        m.LAUNCH["gather_dequant"] = saved
    want = m.gather_dequant_ref(cache, ids, page, **given(m))
    for _, a, b in pairs(m, got, want):
        assert_same_bytes(a, b, f"{name}.gather_dequant, lane groups of {group}")


@pytest.mark.parametrize("src_dtype", SOURCE_DTYPES, ids=str)
@pytest.mark.parametrize("name", cases("quantize_store"))
def test_quantize_store(name, src_dtype):
    m = module(name)
    gen = generator(12)
    heads, values, page = dims(m)
    # 333 tokens, or more so that every bf16 bit pattern goes through the encoder
    tokens = max(333, -(-adversarial_rows(values, gen).shape[0] // heads))
    num_pages = -(-tokens * 3 // 2 // page)
    num_slots = num_pages * page
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    before = clone(m, cache)
    cache_ref = clone(m, cache)
    srcs = [source_rows(m, tokens, heads, values, src_dtype, gen) for _ in m.PLANES]
    extra = [-1, -5, num_slots, num_slots + 9] + ([m.SINK_SLOT] if m.SINK_SLOT is not None else [])
    loc = unique_slots(num_slots, tokens, gen, extra).to(DEVICE)
    m.quantize_store(*sources(m, srcs), loc, cache, page, **given(m))
    m.quantize_store_ref(*sources(m, srcs), loc, cache_ref, page, **given(m))
    assert_same_cache(m, cache, cache_ref, f"{name}.quantize_store")
    if m.SINK_SLOT is not None:   # the sink slot's bytes never change
        ids = torch.tensor([m.SINK_SLOT], device=DEVICE)
        for _, a, b in pairs(m, m.gather_dequant_ref(cache, ids, page, **given(m)), m.gather_dequant_ref(before, ids, page, **given(m))):
            assert_same_bytes(a, b, f"{name}: sink slot")


@pytest.mark.parametrize("src_dtype", SOURCE_DTYPES, ids=str)
@pytest.mark.parametrize("name", cases("quantize"))
def test_quantize(name, src_dtype):
    m = module(name)
    gen = generator(13)
    values = dims(m)[1]
    rows = adversarial_rows(values, gen, torch.float32)
    rows = torch.cat([rows, scaled_normal((77, values), gen, torch.float32)])
    x = rows[: rows.shape[0] // 3 * 3].view(3, -1, values).to(src_dtype).to(DEVICE)
    data, scale = m.quantize(x)
    data_ref, scale_ref = m.quantize_ref(x)
    assert data.dtype == data_ref.dtype and data.shape[:-1] == x.shape[:-1] and scale.shape[:-1] == x.shape[:-1]
    assert_same_bytes(data, data_ref, f"{name}.quantize data")
    assert_same_bytes(scale, scale_ref, f"{name}.quantize scale")


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("name", cases("dequantize"))
def test_dequantize(name, out_dtype):
    m = module(name)
    gen = generator(14)
    values = dims(m)[1]
    data, scale = m.quantize_ref(torch.zeros(2, 5, values, device=DEVICE))
    data = random_bytes(torch.empty((2, 301) + data.shape[2:], dtype=data.dtype, device=DEVICE), gen)
    scale = random_bytes(torch.empty((2, 301) + scale.shape[2:], dtype=scale.dtype, device=DEVICE), gen)
    # Every code and every scale byte, for certain (0x00 and 0xFF included).
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)
    data.view(-1).view(torch.uint8)[:256] = every
    scale.view(-1).view(torch.uint8)[:256] = every
    got = m.dequantize(data, scale, out_dtype)
    want = m.dequantize_ref(data, scale, out_dtype)
    assert got.dtype == out_dtype and got.shape == (2, 301, values)
    assert_same_bytes(got, want, f"{name}.dequantize")
    if out_dtype == torch.bfloat16:        # None is the default, bf16, as the torch operator reads it
        assert_same_bytes(m.dequantize(data, scale, None), want, f"{name}.dequantize(out_dtype=None)")
        assert_same_bytes(m.dequantize_ref(data, scale, None), want, f"{name}.dequantize_ref(out_dtype=None)")


# Append cases the interpreter leaves to the GPU suite: they repeat, for a zoo layout, a launch
# shape the other append layouts already take through the same kernel code (a plane more, or another
# scale rule, changes no lane tiling nor run split; zoo_tokens_kv's two planes still go through the
# runs kernel in its big-calls batch), at 10-40 s each on two CPU cores.
INTERPRETER_SKIPS = {("heads", "zoo_tokens_kv"), ("heads", "zoo_tokens_nearest"), ("columns", "zoo_tokens_nearest"),
                     ("columns", "zoo_tokens_kv"), ("calls", "zoo_tokens_kv"), ("calls", "zoo_tokens_nearest")}


def skip_in_interpreter(case: str, name: str) -> None:
    if not ON_GPU and (case, name) in INTERPRETER_SKIPS:
        pytest.skip(f"interpreter: {case} runs for the other append layouts here; the GPU suite runs it for {name}")


@pytest.mark.parametrize("launch, pages", [({"lone_heads": 2, "lone_columns": 64, "lone_warps": 1}, 1),
                                           ({"lone_heads": 4, "lone_columns": 128, "lone_programs": 1}, 2),
                                           ({"columns": 64, "entries": 16, "num_warps": 2, "dependent_launch": False,
                                             "ptx_rescale": False, "lone_fresh_runs": False}, 4)],
                         ids=["heads", "scan", "columns"])
@pytest.mark.parametrize("name", cases("append"))
def test_append(name, launch, pages, monkeypatch):
    """Prefill runs into fresh pages with stale bytes, then decode steps that grow block exponents.
    Three launch shapes: lone rows two heads (of 3) and half the value indices per tile; one lone
    program scanning a whole call; blocks with several rows 16 entries per program, split columns,
    fresh runs written by their leaders, not slices per entry by the lone kernel, and (on a
    GPU of sm_90+) both kernels launched plainly, not as dependent launches, and grown blocks
    rescaled code by code, not as words with inline PTX.
    The tiled lone kernel ("heads") starts from the reference's prefill: every bf16 pattern and the
    prefill go through each kernel once untiled. Pages of 1, 2 and 4 times the smallest test page: block exponents of a value index in words of
    2, 4 and 8 bytes where the layout keeps them adjacent."""
    skip_in_interpreter("heads" if "lone_heads" in launch and "lone_programs" not in launch
                        else "columns" if "columns" in launch else "scan", name)
    m = module(name)
    launch = dict(launch)
    tiled = "lone_heads" in launch and "lone_programs" not in launch
    monkeypatch.setattr(m, "DEPENDENT_LAUNCH", launch.pop("dependent_launch", True))
    monkeypatch.setattr(m, "PTX_RESCALE", launch.pop("ptx_rescale", True), raising=False)   # layouts with the word rescale
    monkeypatch.setitem(m.LAUNCH, "append", {**m.LAUNCH["append"], **launch})
    gen = generator(15)
    heads, values, page = dims(m)
    page *= pages
    num_pages = 24
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    if name == "mxfp8_v_seqblocked":      # [head, dim, block]: a value index's block exponents adjacent
        assert m._scale_word_bytes(cache, m.geometry(page, heads, values), page) == page // 32
    cache_ref = clone(m, cache)
    pages = torch.randperm(num_pages, generator=gen).tolist()
    lengths = [page + 19, 45, 7, 1, 62]       # tokens already in each sequence (62: a fresh block at step 2)
    seqs = [[pages[2 * i] * page, pages[2 * i + 1] * page] for i in range(len(lengths))]

    def slot(seq, t):
        return seqs[seq][t // page] + t % page

    # Every bf16 bit pattern through the encoder: one sequence's prefill on pages of its own. Once per
    # kernel (the lone kernel in "scan", the runs kernel in "columns"): tiling heads and columns
    # changes which lanes are masked, not the encoder.
    if not tiled:
        patterns = adversarial_rows(values, gen)
        pattern_tokens = -(-patterns.shape[0] // heads)
        spare = pages[2 * len(lengths):]
        first = [spare[t // page] * page + t % page for t in range(pattern_tokens)]
        rows = torch.cat([patterns, patterns[: pattern_tokens * heads - patterns.shape[0]]]).view(pattern_tokens, heads, values)
        v = rows.to(DEVICE)
        m.append(*plane_rows(m, v), torch.tensor(first).to(DEVICE), cache, page)
        m.append_ref(*plane_rows(m, v), torch.tensor(first).to(DEVICE), cache_ref, page)
        assert_same_cache(m, cache, cache_ref, f"{name}.append every bf16 pattern")
    # Prefill: every sequence's tokens in one call, sequences one after another. With tiled lanes the
    # reference writes it into both caches (the same prefill is the kernels' in "scan" and "columns"),
    # and the tiled kernel starts at the decode steps: blocks in use, grown, fresh at a page's end.
    loc = torch.tensor([slot(s, t) for s, n in enumerate(lengths) for t in range(n)] + [-1])
    if tiled:
        v = scaled_normal((loc.numel(), heads, values), gen, torch.float32).to(torch.bfloat16).to(DEVICE)
        for target in (cache, cache_ref):
            m.append_ref(*plane_rows(m, v), loc.to(DEVICE), target, page)
        steps = []
    else:
        steps = [loc]
    # Decode: one token per sequence per call, magnitudes rising so block exponents grow.
    for step in range(4):
        steps.append(torch.tensor([slot(s, n + step) for s, n in enumerate(lengths)] + [-3]))
    lengths = [n + 4 for n in lengths]
    # Chunks of several tokens into blocks in use (rescaled where exponents grow), one crossing into a
    # fresh block, one ending at a block's end.
    chunks = [9, 3, 30, 2, 5]
    steps.append(torch.tensor([slot(s, n + t) for s, (n, c) in enumerate(zip(lengths, chunks)) for t in range(c)]))
    lengths = [n + c for n, c in zip(lengths, chunks)]
    # Two tokens per sequence, the later first, interleaved across sequences with padding between:
    # a block's leader need not write its first slot, and a run start need not lead.
    steps.append(torch.tensor([slot(s, n + 1) for s, n in enumerate(lengths)] + [-2]
                              + [slot(s, n) for s, n in enumerate(lengths)]))
    # A decode step of rows far smaller than their blocks': no exponent grows, so none is written.
    steps.append(torch.tensor([slot(s, n + 2) for s, n in enumerate(lengths)]))
    # Then rows 2^42 times larger than any before: the kept codes shrink past fp16's range, to zero.
    steps.append(torch.tensor([slot(s, n + 3) for s, n in enumerate(lengths)]))
    growths = [2.0 ** (3 * i) for i in range(len(steps) - 2)] + [2.0 ** -30, 2.0 ** 60]
    for i, (loc, growth) in enumerate(zip(steps, growths)):
        v = (scaled_normal((loc.numel(), heads, values), gen, torch.float32) * growth).to(torch.bfloat16)
        if i == 0:
            v[1] = adversarial_rows(values, gen)[-6: -6 + heads]   # specials inside one block
        v, loc = v.to(DEVICE), loc.to(DEVICE)
        m.append(*plane_rows(m, v), loc, cache, page)
        m.append_ref(*plane_rows(m, v), loc, cache_ref, page)
        assert_same_cache(m, cache, cache_ref, f"{name}.append step {i}")


@pytest.mark.parametrize("launch", [{}, {"lone_programs": 1}], ids=["calls", "big-calls"])
@pytest.mark.parametrize("name", cases("append"))
def test_append_batch_prefill(name, launch, monkeypatch):
    """A prefill of a batch of sequences of random lengths, one after another, each from the first
    slot of pages of its own: blocks start at any entry of the call, so fresh runs (whole blocks and
    each sequence's last, partial one) start at a program's first entry and in the middle of one. Then every
    sequence grows by a chunk of random length (blocks in use: merged, rescaled where an exponent
    grows). As launched for decode-size calls and for big ones (rows preloaded)."""
    skip_in_interpreter("big-calls" if launch else "calls", name)
    m = module(name)
    monkeypatch.setitem(m.LAUNCH, "append", {**m.LAUNCH["append"], **launch})
    gen = generator(18)
    heads, values, page = dims(m)
    lengths = torch.randint(1, 2 * page, (6,), generator=gen).tolist()
    chunks = torch.randint(1, 40, (6,), generator=gen).tolist()
    pages_each = [-(-(n + c) // page) for n, c in zip(lengths, chunks)]
    num_pages = sum(pages_each) + 2
    order = torch.randperm(num_pages, generator=gen).tolist()
    owned, used = [], 0
    for count in pages_each:
        owned.append(order[used: used + count])
        used += count

    def slots(seq, start, count):
        return [owned[seq][t // page] * page + t % page for t in range(start, start + count)]

    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    cache_ref = clone(m, cache)
    prefill = torch.tensor([s for i, n in enumerate(lengths) for s in slots(i, 0, n)])
    grow = torch.tensor([s for i, (n, c) in enumerate(zip(lengths, chunks)) for s in slots(i, n, c)])
    for step, (loc, scale) in enumerate(((prefill, 1.0), (grow, 8.0))):
        v = (scaled_normal((loc.numel(), heads, values), gen, torch.float32) * scale).to(torch.bfloat16)
        v, loc = v.to(DEVICE), loc.to(DEVICE)
        m.append(*plane_rows(m, v), loc, cache, page)
        m.append_ref(*plane_rows(m, v), loc, cache_ref, page)
        assert_same_cache(m, cache, cache_ref, f"{name}.append batch step {step}")


@pytest.mark.parametrize("name", [n for n in cases("append") if module(n).SINK_SLOT is not None])
def test_append_skips_sink(name):
    """The sink slot is never written, and no row counts it as a neighbour: a row beside the sink in
    its block is still alone (the lone kernel writes it) and never a run's leader (the runs kernel
    skips it). Then a prefill through the sink's block, which its leader writes around the sink."""
    m = module(name)
    gen = generator(21)
    heads, values, page = dims(m)
    block = m.SCALE_GROUP_TOKENS
    sink = m.SINK_SLOT
    mates = [s for s in range(sink - sink % block, sink - sink % block + block) if s != sink]
    cache = fresh_cache(m, 4, page, heads, values, gen)
    cache_ref = clone(m, cache)
    elsewhere = 2 * page + 5
    steps = [[sink, elsewhere, -1, mates[0]],            # the sink before its block-mate
             [mates[1], sink, elsewhere + 1],             # and right after it
             mates[2:] + [sink]]                           # the rest of the block, the sink among them
    for i, loc in enumerate(steps):
        v = scaled_normal((len(loc), heads, values), gen).to(DEVICE)
        loc = torch.tensor(loc).to(DEVICE)
        m.append(*plane_rows(m, v), loc, cache, page)
        m.append_ref(*plane_rows(m, v), loc, cache_ref, page)
        assert_same_cache(m, cache, cache_ref, f"{name}.append sink step {i}")


@pytest.mark.parametrize("name", [n for n in cases("append") if hasattr(module(n), "_word_factors")])
def test_word_factors_pack_codes_little_endian(name):
    """_word_factors (the sm_90 word rescale's inputs, also checked here where that rescale cannot run):
    per 32-bit word, 2**shift as fp16 bits for codes 0-1 (low) and 2-3 (high), and 0xFF in each byte
    whose exponent grew, code 0 in the lowest byte."""
    import triton
    import triton.language as tl
    m = module(name)

    @triton.jit
    def probe(shift_ptr, grown_ptr, lo_ptr, hi_ptr, merge_ptr, H: tl.constexpr, C: tl.constexpr,
              word_factors: tl.constexpr):
        tile = tl.arange(0, H)[:, None] * C + tl.arange(0, C)[None, :]
        words = tl.arange(0, H)[:, None] * (C // 4) + tl.arange(0, C // 4)[None, :]
        lo, hi, merge = word_factors(tl.load(shift_ptr + tile), tl.load(grown_ptr + tile) != 0, H, C)
        tl.store(lo_ptr + words, lo)
        tl.store(hi_ptr + words, hi)
        tl.store(merge_ptr + words, merge)

    H, C = 2, 16
    gen = generator(17)
    shift = torch.randint(-30, 1, (H, C), generator=gen, dtype=torch.int32)
    grown = torch.randint(0, 2, (H, C), generator=gen, dtype=torch.int32)
    lo, hi, merge = (torch.full((H, C // 4), 0x5A5A5A5A, dtype=torch.int32, device=DEVICE) for _ in range(3))
    probe[(1,)](shift.to(DEVICE), grown.to(DEVICE), lo, hi, merge, H, C, m._word_factors)
    half = (m._ref_exp2i(shift).to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF).view(H, C // 4, 4)
    bytes_grown = (grown.to(torch.int64) * 0xFF).view(H, C // 4, 4)
    as_int32 = lambda t: (t - ((t >> 31) << 32)).to(torch.int32)     # the uint32 bit pattern as int32
    assert torch.equal(lo.cpu(), as_int32(half[..., 0] | half[..., 1] << 16))
    assert torch.equal(hi.cpu(), as_int32(half[..., 2] | half[..., 3] << 16))
    assert torch.equal(merge.cpu(), as_int32(sum(bytes_grown[..., i] << 8 * i for i in range(4))))


@pytest.mark.parametrize("name", cases("gather_dequant"))
def test_one_row_per_program(name, monkeypatch):
    """The launch of a call too small to fill the GPU (_rows_cap: one row per program here), for every
    op but append, against the references (under the interpreter the cap is otherwise off)."""
    m = module(name)
    monkeypatch.setattr(m, "_rows_cap", lambda rows, lanes, device: 1)
    gen = generator(17)
    heads, values, page = dims(m)
    num_pages = 3
    num_slots = num_pages * page
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    ids = torch.randint(-1, num_slots + 1, (7,), generator=gen).to(DEVICE)
    for _, a, b in pairs(m, m.gather_dequant(cache, ids, page, **given(m)), m.gather_dequant_ref(cache, ids, page, **given(m))):
        assert_same_bytes(a, b, f"{name}.gather_dequant, one row per program")
    if "quantize_store" in m.OPS:
        cache_ref = clone(m, cache)
        srcs = [source_rows(m, 7, heads, values, torch.bfloat16, gen) for _ in m.PLANES]
        loc = unique_slots(num_slots, 7, gen, [-1]).to(DEVICE)
        m.quantize_store(*sources(m, srcs), loc, cache, page, **given(m))
        m.quantize_store_ref(*sources(m, srcs), loc, cache_ref, page, **given(m))
        assert_same_cache(m, cache, cache_ref, f"{name}.quantize_store, one row per program")
    if "quantize" in m.OPS:
        x = source_rows(m, 7, 1, dims(m)[1], torch.bfloat16, gen)[:, 0]
        (data, scale), (data_ref, scale_ref) = m.quantize(x), m.quantize_ref(x)
        assert_same_bytes(data, data_ref, f"{name}.quantize data, one row per program")
        assert_same_bytes(scale, scale_ref, f"{name}.quantize scale, one row per program")
        # random record and scale bytes, every code among them
        data, scale = random_bytes(torch.empty_like(data), gen), random_bytes(torch.empty_like(scale), gen)
        data.view(-1).view(torch.uint8)[:256] = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)
        assert_same_bytes(m.dequantize(data, scale), m.dequantize_ref(data, scale),
                          f"{name}.dequantize, one row per program")


@pytest.mark.parametrize("name", cases("append"))
def test_append_caps_registers_of_one_entry_programs(name, monkeypatch):
    """The lone kernel launches under the spec's register cap (lone_registers) when each program takes
    one entry, and never when its programs scan several (they need more registers), nor with a Triton
    release other than the one the cap was tuned with."""
    m = module(name)
    launches = []
    monkeypatch.setattr(m, "_REGISTER_CAPS", True)

    monkeypatch.setattr(m, "_append_lone_kernel", KernelStub(lambda kwargs: launches.append(("lone", kwargs))))
    monkeypatch.setattr(m, "_append_runs_kernel", KernelStub(lambda kwargs: launches.append(("runs", kwargs))))
    monkeypatch.setitem(m.LAUNCH, "append", {**m.LAUNCH["append"], "lone_registers": 64, "lone_programs": 8})
    heads, values, page = dims(m)
    cache = m.alloc_cache(4, page, heads=heads, values=values, device=DEVICE)
    for tokens, chunks, cap in ((8, 1, 64), (9, 2, None)):
        launches.clear()
        m.append(*[torch.ones(tokens, heads, values, device=DEVICE)] * len(m.PLANES),
                 torch.arange(tokens, device=DEVICE), cache, page)
        (lone_name, lone), (runs_name, runs) = launches
        assert (lone_name, runs_name, lone["CHUNKS"]) == ("lone", "runs", chunks)
        assert lone.get("maxnreg") == cap and "maxnreg" not in runs
    monkeypatch.setattr(m, "_REGISTER_CAPS", False)
    launches.clear()
    m.append(*[torch.ones(8, heads, values, device=DEVICE)] * len(m.PLANES), torch.arange(8, device=DEVICE), cache, page)
    assert "maxnreg" not in launches[0][1]
    assert m._REGISTER_CAPS_TRITON == "3.6"       # the release lone_registers was tuned with (bench/RESULTS.md)
    monkeypatch.setattr(m, "_REGISTER_CAPS", True)
    monkeypatch.setitem(m.LAUNCH, "append", {**m.LAUNCH["append"], "lone_registers": None})
    launches.clear()
    m.append(*[torch.ones(8, heads, values, device=DEVICE)] * len(m.PLANES), torch.arange(8, device=DEVICE), cache, page)
    assert "maxnreg" not in launches[0][1]


@pytest.mark.parametrize("writer", ["lone", "runs", "runs-without-fresh-runs"])
@pytest.mark.parametrize("name", cases("append"))
def test_append_fresh_runs_have_one_writer(name, writer, monkeypatch):
    """With lone_fresh_runs the lone kernel writes a decode-size call's fresh runs (a block's entries
    consecutive, its slots in order from the first) and the runs kernel every other block with several
    new rows; without it the runs kernel writes the fresh runs too. One kernel is left out here (a
    no-op launch), so the other's bytes show alone, against the reference given only the entries of its
    blocks: a whole block, runs of 5 and 2 entries, of _SHORT_RUN (the last written row by row) and one
    more (slices dealt out), and blocks that are not fresh runs: from slot 3, with a skipped entry, out of
    order, with another block's entry inside (that one is alone: a lone tile)."""
    m = module(name)
    monkeypatch.setitem(m.LAUNCH, "append", {**m.LAUNCH["append"], "lone_fresh_runs": writer != "runs-without-fresh-runs"})
    monkeypatch.setattr(m, "_append_runs_kernel" if writer == "lone" else "_append_lone_kernel", KernelStub())
    gen = generator(23)
    heads, values, page = dims(m)
    block = m.SCALE_GROUP_TOKENS

    def at(k, *slots):        # block k from page 1 on (page 0 holds any sink); -1: a skipped entry
        return [page + k * block + s if s >= 0 else -1 for s in slots]
    short = m._SHORT_RUN
    fresh_runs = [at(0, *range(block)), at(1, 0, 1, 2, 3, 4), at(7, 0, 1), at(8, *range(short)), at(9, *range(short + 1))]
    others = [at(2, 3, 4), at(3, 0, -1, 2), at(4, 1, 0)]
    gap, alone = at(5, 0, 1) + at(6, 0) + at(5, 2), at(6, 0)
    loc = torch.tensor(fresh_runs[0] + fresh_runs[1] + sum(others, []) + gap + sum(fresh_runs[2:], []))
    written = {"lone": sum(fresh_runs, alone), "runs": sum(others, at(5, 0, 1, 2)),
               "runs-without-fresh-runs": sum(fresh_runs + others, at(5, 0, 1, 2))}[writer]
    cache = fresh_cache(m, 2 + -(-10 * block // page), page, heads, values, gen)
    want = clone(m, cache)
    v = scaled_normal((loc.numel(), heads, values), gen).to(DEVICE)
    m.append(*plane_rows(m, v), loc.to(DEVICE), cache, page)
    m.append_ref(*plane_rows(m, v), torch.where(torch.isin(loc, torch.tensor(written)), loc, -1).to(DEVICE), want, page)
    assert_same_cache(m, cache, want, f"{name}.append, {writer} kernel alone")


@pytest.mark.parametrize("name", cases("gather_dequant"))
def test_rows_cap_gives_every_sm_a_program(name, monkeypatch):
    m = module(name)
    monkeypatch.setattr(m, "_sm_count", lambda index: 132)
    gpu = torch.device("cuda", 0)
    assert m._rows_cap(2048, 1, gpu) == 8            # 256 programs of 8 rows
    assert m._rows_cap(2048, 16, gpu) == 128          # plenty of programs: no cap below the knobs' 64
    assert m._rows_cap(100, 1, gpu) == 1
    assert m._rows_cap(2048, 1, torch.device("cpu")) == 64
    assert m._launch_shape("gather_dequant", 128, 1)["BLOCK_T"] == 1


@pytest.mark.skipif(not ON_GPU, reason="calls overlap only on a GPU (the interpreter runs them one by one)")
@pytest.mark.parametrize("name", cases("gather_dequant"))
def test_chained_calls_see_each_other(name, monkeypatch):
    """Decode steps back to back on one stream with no sync between: each step writes one row per
    sequence (quantize_store or append), a gather reads them back at once, and quantize's records go
    straight into dequantize. Every call is a programmatic dependent launch (pdl=True; sm_90+) and
    every op lets the next kernel launch at its own start (early_release), so each kernel's programs
    may be scheduled while the one before still runs: each must still see all of its predecessor's
    bytes. Run eagerly, then replayed from a CUDA graph, against the references."""
    m = module(name)
    for op in m.OPS:
        monkeypatch.setitem(m.LAUNCH, op, {**m.LAUNCH[op], "early_release": True})
    gen = generator(21)
    heads, values, page = dims(m)
    sequences, steps = 256, 6
    num_pages = sequences + 1                      # page 0 unused: the sink, if any, is never a step's slot
    base = (torch.randperm(sequences, generator=gen) + 1) * page
    locs = [(base + i).to(DEVICE) for i in range(steps)]
    rows = [sources(m, [source_rows(m, sequences, heads, values, torch.bfloat16, gen) for _ in m.PLANES]) for _ in range(steps)]
    dense = [source_rows(m, sequences, 1, dims(m)[1], torch.bfloat16, gen)[:, 0] for _ in range(steps)]
    write, write_ref = ((m.quantize_store, m.quantize_store_ref) if "quantize_store" in m.OPS
                        else (m.append, m.append_ref))
    start = fresh_cache(m, num_pages, page, heads, values, gen)
    scales = given(m)                              # made before the graph capture (a copy to the device)

    def as_tuple(x):
        return tuple(per_plane(m, x))

    # the references, step by step: each step's gathered planes, then (dense ops) its dequantized rows
    cache_ref = clone(m, start)
    want = []
    for i in range(steps):
        write_ref(*rows[i], locs[i], cache_ref, page, **scales)
        want.append(as_tuple(m.gather_dequant_ref(cache_ref, locs[i], page, **scales)))
        if "quantize" in m.OPS:
            want[-1] += (m.dequantize_ref(*m.quantize_ref(dense[i])),)

    cache = clone(m, start)
    gathered, dequantized = [], []

    def chain(first_call: bool):
        for i in range(steps):
            write(*rows[i], locs[i], cache, page, pdl=True, **scales)
            if first_call:
                gathered.append(m.gather_dequant(cache, locs[i], page, pdl=True, **scales))
            else:
                m.gather_dequant(cache, locs[i], page, out=gathered[i], pdl=True, **scales)
            if "quantize" in m.OPS:
                back = m.dequantize(*m.quantize(dense[i], pdl=True), pdl=True)
                if first_call:
                    dequantized.append(back)
                else:
                    dequantized[i].copy_(back)

    chain(first_call=True)
    torch.cuda.synchronize()
    for how in ("eager", "graph"):
        for i in range(steps):
            got = as_tuple(gathered[i]) + ((dequantized[i],) if dequantized else ())
            for j, (a, b) in enumerate(zip(got, want[i], strict=True)):
                assert_same_bytes(a, b, f"{name}: {how} chain, step {i}, output {j}")
        assert_same_cache(m, cache, cache_ref, f"{name}: {how} chain, the cache")
        if how == "eager":
            for t, s in zip(cache, start, strict=True):
                t.copy_(s)
            for o in [t for g in gathered for t in as_tuple(g)] + dequantized:
                random_bytes(o, gen)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain(first_call=False)
            graph.replay()
            torch.cuda.synchronize()


@pytest.mark.parametrize("name", cases("gather_dequant") + [n for n in cases("quantize") if n not in cases("gather_dequant")])
def test_reset_pages_zeroes_exactly_the_named_pages(name):
    """reset_pages zeroes every byte of the valid ids' pages in every cache tensor and nothing else
    (ids past the cache and negative ones are skipped), as its reference does."""
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(40)
    cache = fresh_cache(m, 6, page, heads, values, gen)
    ref = clone(m, cache)
    ids = torch.tensor([4, -1, 1, 6, 1 << 40, 4], device=DEVICE)
    m.reset_pages(cache, ids, page)
    m.reset_pages_ref(ref, ids, page)
    assert_same_cache(m, cache, ref, f"{name}.reset_pages")
    for t in cache:
        pages = t.view(-1).view(torch.uint8).view(6, -1)
        assert not pages[[1, 4]].any() and pages[[0, 2, 3, 5]].any()


@pytest.mark.parametrize("name", cases("append"))
def test_append_into_a_reused_page_starts_fresh_after_reset(name):
    """A page that held large values, handed out again to a sequence that starts mid-block: without
    a reset its old exponents stay (new values decode to 0); after reset_pages the new rows read
    back as written (to the format's precision), as the reference has them."""
    m = module(name)
    heads, values, page = dims(m)
    cache = m.alloc_cache(2, page, heads=heads, values=values, device=DEVICE)
    block = m.SCALE_GROUP_TOKENS
    m.append(*[torch.full((block, heads, values), 2.0 ** 100, device=DEVICE)] * len(m.PLANES),
             torch.arange(block, device=DEVICE), cache, page)
    loc = torch.arange(5, 9, device=DEVICE)                   # a new sequence from slot 5 of the same block
    rows = [torch.full((4, heads, values), 0.75, device=DEVICE) for _ in m.PLANES]
    stale = clone(m, cache)
    m.append(*rows, loc, stale, page)
    read = m.gather_dequant(stale, loc, page, **given(m))
    assert not any(r.float().abs().max() > 0 for r in (read if isinstance(read, tuple) else (read,)))
    m.reset_pages(cache, torch.tensor([0], device=DEVICE), page)
    ref = clone(m, cache)
    m.append(*rows, loc, cache, page)
    m.append_ref(*rows, loc, ref, page)
    assert_same_cache(m, cache, ref, f"{name}.append after reset_pages")
    read = m.gather_dequant(cache, loc, page, **given(m))
    for r, x in zip(read if isinstance(read, tuple) else (read,), rows, strict=True):
        assert torch.equal(r.float(), x)
