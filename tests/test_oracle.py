"""Every spec (shipped and test-only) against the naive oracle of tests/oracle.py, which builds the
expected bytes from the spec's own fields with no code of codegen/: the torch reference must equal
the oracle, and the kernel the reference, so a wrong stride or offset cannot pass both."""
import math

import numpy as np
import pytest
import torch

from tests import oracle
from tests.conftest import DEVICE
from tests.corpus import adversarial_rows, generator, random_bytes, scaled_normal
from tests.harness import (ROOT, SPECS, assert_same_bytes, assert_same_cache, cases, clone, dims, fresh_cache, given,
                           given_floats, module, pairs, per_plane, plane_rows, sources)


def spec_of(name: str) -> oracle.Spec:
    folder = ROOT / "specs" if name in SPECS else ROOT / "tests" / "specs"
    return oracle.Spec(folder / f"{name}.yaml")


def rows(tokens: int, heads: int, values: int, gen, dtype, spec: oracle.Spec | None = None,
         skipped: int = 0) -> torch.Tensor:
    """Random rows at scales 2^-20..2^20, with special values (NaN, inf, +-0, subnormals, ties,
    values past fmax) and an all-zero row among them; with a spec, also its formats' tie rows. The
    special rows go to random places past the first `skipped` tokens (those a test writes nowhere)."""
    special = adversarial_rows(values, gen, torch.float32)[-10:]
    if spec is not None:
        special = torch.cat([tie_rows(spec, values, gen), special])
    x = scaled_normal((tokens * heads, values), gen, torch.float32)
    free = x.shape[0] - skipped * heads
    at = skipped * heads + torch.randperm(free, generator=gen)[: min(special.shape[0], free)]
    x[at] = special[: at.numel()]
    return x.view(tokens, heads, values).to(dtype)


def tie_rows(spec: oracle.Spec, values: int, gen, count: int = 4) -> torch.Tensor:
    """Rows of exact ties, for each element format of the spec in turn: every 16th value is
    +-fmax * 2^k (k in [-6, 0]: above any floor, and fp16 holds it), so the power-of-two rules (but
    ceil, which takes 2^(k+1)) and the exact rule scale a group of 16 values or more by 2^k, and the
    others sit exactly halfway between two neighbouring codes times 2^k: ties of q = x / 2^k (not
    of a call-time or two-level scale's quotients)."""
    formats = sorted({item["dtype"] for item in spec.record if item.get("dtype") in oracle.ELEMENTS})
    out = torch.empty(count if formats else 0, values)     # (none for a record of raw values only)
    for i in range(out.shape[0]):
        fmt = formats[i % len(formats)]
        mags = oracle.magnitudes(fmt)[1]
        mids = torch.from_numpy((mags[:-1] + mags[1:]) / 2)
        k = 2.0 ** int(torch.randint(-6, 1, (), generator=gen))
        signs = torch.where(torch.rand(values, generator=gen) < 0.5, -1.0, 1.0)
        row = mids[torch.randint(0, mids.numel(), (values,), generator=gen)] * k * signs
        row[::16] = oracle.fmax(fmt) * k * signs[::16]
        out[i] = row.float()
    return out


def oracle_cache(m, spec, state, like):
    return m.Cache(*(t.to(DEVICE) for t in state.tensors(like)))


@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("name", cases("quantize_store"))
def test_quantize_store_matches_the_oracle(name, src_dtype):
    m, spec = module(name), spec_of(name)
    gen = generator(31)
    heads, values, page = dims(m)
    num_pages = 3
    tokens = min(20, num_pages * page - 4)
    cache = fresh_cache(m, num_pages, page, heads, values, gen)      # random bytes: unwritten ones must stay
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    srcs = [rows(tokens, heads, values, gen, src_dtype, spec, skipped=3) for _ in m.PLANES]
    loc = torch.randperm(num_pages * page, generator=gen)[:tokens]
    loc[:3] = torch.tensor([-1, num_pages * page, m.SINK_SLOT if m.SINK_SLOT is not None else -4])
    oracle.quantize_store(spec, state, srcs, loc, given_floats(m, given(m)))
    want = oracle_cache(m, spec, state, cache)
    ref, kernel = clone(m, cache), clone(m, cache)
    m.quantize_store_ref(*sources(m, [s.to(DEVICE) for s in srcs]), loc.to(DEVICE), ref, page, **given(m))
    assert_same_cache(m, ref, want, f"{name}.quantize_store_ref vs the oracle")
    m.quantize_store(*sources(m, [s.to(DEVICE) for s in srcs]), loc.to(DEVICE), kernel, page, **given(m))
    assert_same_cache(m, kernel, ref, f"{name}.quantize_store vs its reference")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("name", cases("gather_dequant"))
def test_gather_dequant_matches_the_oracle(name, out_dtype):
    m, spec = module(name), spec_of(name)
    gen = generator(32)
    heads, values, page = dims(m)
    num_pages = 3
    cache = fresh_cache(m, num_pages, page, heads, values, gen)      # every code and scale byte
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    ids = torch.randint(-2, num_pages * page + 2, (24,), generator=gen)
    want = oracle.gather_dequant(spec, state, ids, out_dtype, given_floats(m, given(m)))
    outs = tuple(torch.full((24, heads, values), 7.0, dtype=out_dtype, device=DEVICE) for _ in m.PLANES)   # poisoned
    ref = m.gather_dequant_ref(cache, ids.to(DEVICE), page, out=outs if len(outs) > 1 else outs[0], **given(m))
    kernel = m.gather_dequant(cache, ids.to(DEVICE), page, **given(m))
    for plane, a, b in zip(m.PLANES, per_plane(m, ref), want, strict=True):
        assert_same_bytes(a.cpu(), b, f"{name}.gather_dequant_ref ({plane}) vs the oracle")
    if out_dtype == torch.bfloat16:          # the default output dtype
        for plane, a, b in pairs(m, kernel, ref):
            assert_same_bytes(a, b, f"{name}.gather_dequant ({plane}) vs its reference")


@pytest.mark.parametrize("name", cases("append"))
def test_append_matches_the_oracle(name):
    """A prefill from two blocks' first slots, a decode step into blocks in use with rows 2^6 larger
    (exponents grow, kept codes rescale), a chunk crossing into a fresh block, and rows into a block
    never written from its first slot, whose stale bytes (every fifth one 0xFF: infinite scales, NaN
    codes) count; the steps' rows are bf16, fp32, fp16 and fp32 (each source dtype's own rounding)."""
    m, spec = module(name), spec_of(name)
    gen = generator(33)
    heads, values, page = dims(m)
    block = m.SCALE_GROUP_TOKENS
    num_pages = 2
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    for t in cache:
        t.view(-1).view(torch.uint8)[::5] = 0xFF
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    ref, kernel = clone(m, cache), clone(m, cache)
    a, b = 0, page + block                               # two sequences' first slots
    stale = num_pages * page - block + 2                 # the last block, from its third slot
    steps = [([a + t for t in range(block + 3)] + [b + t for t in range(5)] + [-1], 1.0, torch.bfloat16),
             ([a + block + 3, b + 5], 64.0, torch.float32),
             ([a + block + 4 + t for t in range(block)] + [b + 6], 2.0 ** -10, torch.float16),
             ([stale, stale + 1, b + 7], 2.0 ** 100, torch.float32)]
    for i, (loc, growth, dtype) in enumerate(steps):
        xs = [(rows(len(loc), heads, values, gen, torch.float32) * growth).to(dtype) for _ in m.PLANES]
        loc = torch.tensor(loc)
        oracle.append(spec, state, xs, loc)
        m.append_ref(*(x.to(DEVICE) for x in xs), loc.to(DEVICE), ref, page)
        assert_same_cache(m, ref, oracle_cache(m, spec, state, cache), f"{name}.append_ref step {i} vs the oracle")
        m.append(*(x.to(DEVICE) for x in xs), loc.to(DEVICE), kernel, page)
        assert_same_cache(m, kernel, ref, f"{name}.append step {i} vs its reference")


@pytest.mark.parametrize("name", [n for n in cases("quantize_store") + cases("append")])
def test_cache_sizes_match_the_oracle(name):
    """alloc_cache gives every buffer the page bytes the spec's fields add up to, at two page sizes."""
    m, spec = module(name), spec_of(name)
    heads, values, page = dims(m)
    for p in (page, 2 * page):
        cache = m.alloc_cache(2, p, heads=heads, values=values)
        for plane in spec.planes:
            for buffer in spec.buffers:
                t = getattr(cache, spec.field(plane, buffer))
                assert t.numel() * t.element_size() == 2 * spec.page_bytes(buffer, p, heads, values), (name, buffer, p)


# fp32 scales a reader takes as they are: zeros, infinities, NaN, the smallest subnormal and normal,
# the largest finite, negative ones.
FP32_SCALES = (0.0, -0.0, math.inf, -math.inf, math.nan, 2.0 ** -149, 2.0 ** -126, 3.4028234663852886e38, -1.5, 0.75)


def stored_groups(spec: oracle.Spec) -> list:
    return [name for name in spec.scales if spec.group_of(name)[0] != "tensor"]


def scale_entries(spec: oracle.Spec, name: str, page: int, heads: int, values: int) -> list:
    """The coordinates of every scale entry of group `name` in one page that a reader reads (not the
    padding of a pad_to)."""
    kind, size = spec.group_of(name, values)
    if kind == "values":
        seg = next(s for s in spec.record if s.get("scale") == name)
        return [{"slot": s, "head": h, "scale": j} for s in range(page) for h in range(heads)
                for j in range(spec.segment_values(seg, values) // size)]
    return [{"block": b, "head": h, "dim": d} for b in range(page // size) for h in range(heads) for d in range(values)]


@pytest.mark.parametrize("name", [n for n in cases("gather_dequant") if stored_groups(spec_of(n))])
def test_every_scale_byte_reads_as_the_oracle_says(name):
    """Each scale entry a reader reads, placed by the oracle, holds the next of every byte 0x00..0xFF
    (one-byte formats: ue8m0 0x00 and 0xFF, e4m3 NaN and negative scales; another sequence in each
    plane) or of FP32_SCALES; every slot is read
    back (fp32 out, so nothing rounds away) by the reference, which must equal the oracle, and by the
    kernel into a poisoned output, which must equal the reference."""
    m, spec = module(name), spec_of(name)
    gen = generator(34)
    heads, values, page = dims(m)
    groups = stored_groups(spec)
    per_page = min(len(scale_entries(spec, g, page, heads, values)) for g in groups)
    num_pages = max(2, -(-256 // per_page))             # room for every byte in each group
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    for plane in spec.planes:
        for g in groups:
            entries = [(p, c) for p in range(num_pages) for c in scale_entries(spec, g, page, heads, values)]
            for i, (page_id, coords) in enumerate(entries):
                data = (np.array([FP32_SCALES[i % len(FP32_SCALES)]], dtype=np.float32).view(np.uint8)
                        if spec.scale_bytes(g) == 4 else np.array([(i * 7 + 101 * spec.planes.index(plane)) % 256],
                                                                  dtype=np.uint8))
                state.write(plane, g, page_id, coords, data)
    cache = oracle_cache(m, spec, state, cache)
    ids = torch.arange(-2, num_pages * page + 2)
    want = oracle.gather_dequant(spec, state, ids, torch.float32, given_floats(m, given(m)))
    outs = tuple(torch.full((ids.numel(), heads, values), 7.0, device=DEVICE) for _ in m.PLANES)
    ref = m.gather_dequant_ref(cache, ids.to(DEVICE), page, out=outs if len(outs) > 1 else outs[0], **given(m))
    for plane, a, b in zip(m.PLANES, per_plane(m, ref), want, strict=True):
        assert_same_bytes(a.cpu(), b, f"{name}.gather_dequant_ref ({plane}) vs the oracle")
    outs = tuple(torch.full((ids.numel(), heads, values), -5.0, device=DEVICE) for _ in m.PLANES)
    kernel = m.gather_dequant(cache, ids.to(DEVICE), page, out=outs if len(outs) > 1 else outs[0], **given(m))
    for plane, a, b in pairs(m, kernel, ref):
        assert_same_bytes(a, b, f"{name}.gather_dequant ({plane}) vs its reference")


def dense_slots(spec: oracle.Spec, tokens: int, page: int) -> tuple:
    """(pages, the first `tokens` slots writers write, the sink skipped) to stand dense rows in a cache."""
    num_pages = -(-(tokens + 1) // page)
    slots = [s for s in range(num_pages * page) if s != spec.sink][:tokens]
    return num_pages, torch.tensor(slots)


def dense_entries(spec: oracle.Spec, values: int) -> list:
    """(group, entry) of one row's scales as quantize returns them: each quantized segment's entries
    in record order, unpadded."""
    return [(seg["scale"], j) for seg, _, _ in oracle._segment_offsets(spec, values) if seg["dtype"] in oracle.ELEMENTS
            for j in range(spec.segment_values(seg, values) // spec.group_of(seg["scale"], values)[1])]


def dense_scale_bytes(spec: oracle.Spec, state: oracle.CacheBytes, plane: str, page_id: int, where: dict) -> np.ndarray:
    """One row's scales as quantize returns them, read from the oracle's cache."""
    return np.concatenate([state.read(plane, g, page_id, {**where, "scale": j}, spec.scale_bytes(g))
                           for g, j in dense_entries(spec, state.values)])


@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", cases("quantize"))
def test_quantize_matches_the_oracle(name, src_dtype):
    """quantize's data and scale are, byte for byte, the record and the scale entries the oracle's writer
    puts in a cache for the same rows: every bf16 pattern, special values, all-zero rows, then random
    rows over 2^-20..2^20."""
    m, spec = module(name), spec_of(name)
    gen = generator(35)
    heads, values, page = dims(m)
    x = torch.cat([adversarial_rows(values, gen, torch.float32), scaled_normal((16, values), gen, torch.float32)])
    tokens = x.shape[0] // heads
    x = x[: tokens * heads].view(tokens, heads, values).to(src_dtype)
    num_pages, loc = dense_slots(spec, tokens, page)
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    plane = spec.planes[0]
    oracle.quantize_store(spec, state, [x], loc)                       # (only the first plane's rows)
    record = spec.record_bytes(values)
    want_data, want_scale = [], []
    for slot_id in loc.tolist():
        page_id, slot = divmod(slot_id, page)
        for head in range(heads):
            where = {"slot": slot, "head": head}
            want_data.append(state.read(plane, "records", page_id, where, record))
            want_scale.append(dense_scale_bytes(spec, state, plane, page_id, where))
    want_data, want_scale = torch.from_numpy(np.stack(want_data)), torch.from_numpy(np.stack(want_scale))
    for op in (m.quantize_ref, m.quantize):
        data, scale = op(x.to(DEVICE))
        assert_same_bytes(data.cpu().contiguous().view(torch.uint8).reshape(tokens * heads, -1), want_data,
                          f"{name}.{op.__name__} data vs the oracle's records")
        assert_same_bytes(scale.cpu().contiguous().view(torch.uint8).reshape(tokens * heads, -1), want_scale,
                          f"{name}.{op.__name__} scale vs the oracle's scale entries")


@pytest.mark.parametrize("name", cases("dequantize"))
def test_dequantize_matches_the_oracle(name):
    """dequantize of random data and scale bytes (every code and every scale byte among them) is what
    the oracle's reader takes from a cache holding those records and scale entries."""
    m, spec = module(name), spec_of(name)
    gen = generator(36)
    heads, values, page = dims(m)
    one = m.quantize_ref(torch.zeros(1, heads, values, device=DEVICE))[1]
    tokens = max(24, -(-256 // (one.numel() * one.element_size())))     # room for every scale byte
    data, scale = m.quantize_ref(torch.zeros(tokens, heads, values, device=DEVICE))
    data, scale = random_bytes(data, gen), random_bytes(scale, gen)
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)
    data.view(-1).view(torch.uint8)[:256] = every
    scale.view(-1).view(torch.uint8)[:256] = every
    num_pages, loc = dense_slots(spec, tokens, page)
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    plane = spec.planes[0]
    data_bytes = data.cpu().contiguous().view(torch.uint8).reshape(tokens, heads, -1).numpy()
    scale_bytes = scale.cpu().contiguous().view(torch.uint8).reshape(tokens, heads, -1).numpy()
    for t, slot_id in enumerate(loc.tolist()):
        page_id, slot = divmod(slot_id, page)
        for head in range(heads):
            where = {"slot": slot, "head": head}
            state.write(plane, "records", page_id, where, data_bytes[t, head])
            at = 0
            for g, j in dense_entries(spec, values):
                nb = spec.scale_bytes(g)
                state.write(plane, g, page_id, {**where, "scale": j}, scale_bytes[t, head, at:at + nb])
                at += nb
    for out_dtype in (torch.float32, torch.bfloat16):
        want = oracle.gather_dequant(spec, state, loc, out_dtype)[0]
        ref = m.dequantize_ref(data, scale, out_dtype)
        assert_same_bytes(ref.cpu(), want, f"{name}.dequantize_ref ({out_dtype}) vs the oracle's reader")


# Layouts whose writer test_quantize_matches_the_oracle (dense rows) and tests/test_given_scales.py do
# not already take through the oracle with every bf16 pattern.
GIVEN_TESTED = ("vllm_fp8", "zoo_given_e5m2", "dsv4_nvfp4", "flashinfer_nvfp4")


@pytest.mark.parametrize("name", [n for n in cases("quantize_store")
                                  if "quantize" not in module(n).OPS and n not in GIVEN_TESTED])
def test_quantize_store_takes_every_bf16_pattern_as_the_oracle_says(name):
    """Every bf16 bit pattern (in groups), special values and all-zero rows, stored into a cache of
    random bytes: the reference equals the oracle, the kernel the reference."""
    m, spec = module(name), spec_of(name)
    gen = generator(37)
    heads, values, page = dims(m)
    x = adversarial_rows(values, gen, torch.bfloat16)
    tokens = x.shape[0] // heads
    x = x[: tokens * heads].view(tokens, heads, values)
    num_pages = -(-(tokens + 2) // page)
    loc = torch.randperm(num_pages * page, generator=gen)[:tokens]
    if spec.sink is not None:
        loc = torch.where(loc == spec.sink, -1, loc)
    srcs = plane_rows(m, x)
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    oracle.quantize_store(spec, state, srcs, loc, given_floats(m, given(m)))
    ref, kernel = clone(m, cache), clone(m, cache)
    m.quantize_store_ref(*sources(m, [s.to(DEVICE) for s in srcs]), loc.to(DEVICE), ref, page, **given(m))
    assert_same_cache(m, ref, oracle_cache(m, spec, state, cache), f"{name}.quantize_store_ref vs the oracle")
    m.quantize_store(*sources(m, [s.to(DEVICE) for s in srcs]), loc.to(DEVICE), kernel, page, **given(m))
    assert_same_cache(m, kernel, ref, f"{name}.quantize_store vs its reference")
