"""Every spec (shipped and test-only) against the naive oracle of tests/oracle.py, which builds the
expected bytes from the spec's own fields with no code of codegen/: the torch reference must equal
the oracle, and the kernel the reference, so a wrong stride or offset cannot pass both."""
import pytest
import torch

from tests import oracle
from tests.conftest import DEVICE
from tests.corpus import adversarial_rows, generator, scaled_normal
from tests.harness import (ROOT, SPECS, assert_same_bytes, assert_same_cache, cases, clone, dims, fresh_cache, given,
                           given_floats, module, pairs, per_plane, sources)


def spec_of(name: str) -> oracle.Spec:
    folder = ROOT / "specs" if name in SPECS else ROOT / "tests" / "specs"
    return oracle.Spec(folder / f"{name}.yaml")


def rows(tokens: int, heads: int, values: int, gen, dtype) -> torch.Tensor:
    """Random rows at scales 2^-20..2^20, with special values (NaN, inf, +-0, subnormals, ties,
    values past fmax) and an all-zero row among them."""
    special = adversarial_rows(values, gen, torch.float32)[-10:]
    x = scaled_normal((tokens * heads, values), gen, torch.float32)
    x[: special.shape[0]] = special[: tokens * heads]
    return x[torch.randperm(x.shape[0], generator=gen)].view(tokens, heads, values).to(dtype)


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
    srcs = [rows(tokens, heads, values, gen, src_dtype) for _ in m.PLANES]
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
    outs = tuple(torch.empty(24, heads, values, dtype=out_dtype, device=DEVICE) for _ in m.PLANES)
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
    codes) count."""
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
    steps = [([a + t for t in range(block + 3)] + [b + t for t in range(5)] + [-1], 1.0),
             ([a + block + 3, b + 5], 64.0),
             ([a + block + 4 + t for t in range(block)] + [b + 6], 2.0 ** -10),
             ([stale, stale + 1, b + 7], 2.0 ** 100)]
    for i, (loc, growth) in enumerate(steps):
        xs = [(rows(len(loc), heads, values, gen, torch.float32) * growth).to(torch.bfloat16) for _ in m.PLANES]
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
