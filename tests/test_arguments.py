"""Argument handling of the generated modules: bad calls raise ValueError naming the argument before
any launch, caches carry their page size in their shape, and launch plans (the cheap path of a
repeated call) give the checked path's bytes and keep its per-call checks."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from tests.conftest import DEVICE, ON_GPU, ROOT
from tests.corpus import generator, random_bytes, scaled_normal
from tests.harness import (LAYOUTS, SPECS, assert_same_bytes, assert_same_cache, cases, clone, dims, fresh_cache, given,
                           module, per_plane, sources)


def raises(match: str, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


def kv_setup(pages: int = 4, page: int = 32, heads: int = 2, values: int = 64, tokens: int = 8):
    m = module("mxfp8_kv")
    cache = m.alloc_cache(pages, page, heads=heads, values=values, device=DEVICE)
    x = scaled_normal((tokens, heads, values), generator(30)).to(DEVICE)
    loc = torch.arange(1, tokens + 1, device=DEVICE)
    return m, cache, x, loc


def test_page_size_is_checked_on_every_call():
    """geometry() caches its results, but its type checks run on every call: 64.0 and True are
    rejected after 64 and 1 were used; numpy integers are taken as ints."""
    m = module("mxfp8_kv")
    m.geometry(64, 2, 64)
    m.geometry(32, 1, 32)
    raises("page_size: expected an int, got 64.0", m.geometry, 64.0, 2, 64)
    raises("page_size: expected an int, got True", m.geometry, True, 2, 64)
    raises("heads: expected an int >= 1, got 0", m.geometry, 64, 0, 64)
    assert m.geometry(np.int64(64), 2, 64) == m.geometry(64, 2, 64)
    _, cache, x, loc = kv_setup()
    raises("page_size: expected an int", m.quantize_store, x, x, loc, cache, 32.0)
    m.quantize_store(x, x, loc, cache, np.int64(32))


@pytest.mark.parametrize("name", cases("quantize_store") + cases("append") + cases("gather_dequant"))
def test_a_cache_is_read_with_the_page_size_it_was_allocated_with(name):
    """Every cache tensor's first dim counts pages, so another page size is an error naming page_size
    and the page size the cache was allocated with, whichever way the byte counts divide (the compat
    default page_size=128 on 32-slot caches was one), also one step away, where padded pages are
    checked by their byte size (the build refuses padding that would give two page sizes one)."""
    m = module(name)
    heads, values, page = dims(m)
    cache = m.alloc_cache(4, page, heads=heads, values=values, device=DEVICE)
    ids = torch.arange(4, device=DEVICE)
    scales = given(m)
    step = m.PAGE_SIZE_MULTIPLE
    for wrong in (page - step, page + step, 2 * page, 4 * page):
        told = r"^page_size: cache\.\w+ was allocated for page_size=%d \(shape .*\), but page_size=%d was passed;" % (
            page, wrong)
        if "gather_dequant" in m.OPS:
            raises(told, m.gather_dequant, cache, ids, wrong, **scales)
        writer = m.quantize_store if "quantize_store" in m.OPS else getattr(m, "append", None)
        if writer is not None:
            rows = torch.ones(4, heads, values, device=DEVICE)
            raises(told, writer, *sources(m, [rows] * len(m.PLANES)), ids, cache, wrong, **scales)
    raises(r"^page_size: cache\.\w+ was allocated for page_size=%d .*, but page_size=%d was passed" % (page, 2 ** 40),
           m.gather_dequant if "gather_dequant" in m.OPS else m.append,
           *((cache, ids) if "gather_dequant" in m.OPS else ([torch.ones(4, heads, values, device=DEVICE)] * len(m.PLANES)
                                                              + [ids, cache])), 2 ** 40, **scales)


def test_a_cache_tensor_with_other_tensors_page_count_is_named():
    """The tensor whose page count the others do not share is named, whichever field it is (the
    records tensor too, which gives heads and values); with no one odd tensor, every count is."""
    m, cache, x, loc = kv_setup()
    ids = torch.arange(4, device=DEVICE)
    for i, field in enumerate(m.Cache._fields):
        short = m.Cache(*(t[:3] if j == i else t for j, t in enumerate(cache)))
        raises(rf"^cache\.{field}: holds 3 pages, the other tensors 4$", m.gather_dequant, short, ids, 32)
        raises(rf"^cache\.{field}: holds 3 pages, the other tensors 4$", m.quantize_store, x, x, loc, short, 32)
    mixed = m.Cache(cache.k_cache[:3], cache.k_sf[:2], cache.v_cache, cache.v_sf)
    told = r"^cache\.k_cache, cache\.k_sf, cache\.v_cache, cache\.v_sf: hold different numbers of pages \(3, 2, 4, 4\); "
    raises(told, m.gather_dequant, mixed, ids, 32)
    # a compat wrapper names its own parameters, in the head too
    from generated.compat import sglang_mxfp8 as compat
    raises(r"^k_cache, sfk, v_cache, sfv: hold different numbers of pages \(3, 2, 4, 4\); pass the tensors of one cache$",
           compat.quant_store_kv_mxfp8, x, x, loc, *mixed[::2], *mixed[1::2], page_size=32)
    raises(r"^k_cache and sfk: hold each other's tensors \(exchanged, every cache tensor holds whole pages of "
           r"page_size=32\); pass each tensor in its own place \(k_cache, sfk, v_cache, sfv\)$",
           compat.quant_store_kv_mxfp8, x, x, loc, cache.k_sf, cache.v_cache, cache.k_cache, cache.v_sf, page_size=32)


@pytest.mark.parametrize("name", sorted(set(cases("quantize_store") + cases("append") + cases("gather_dequant"))))
def test_cache_tensors_in_each_others_places_are_named(name):
    """Two cache tensors of different shapes passed in each other's places are named together, by
    the writer (whose sources give heads and values) and by the gather (whose records tensor does:
    here a swapped one), not blamed on the sources or on page_size."""
    m = module(name)
    heads, values, page = dims(m)
    cache = m.alloc_cache(4, page, heads=heads, values=values, device=DEVICE)
    ids, scales = torch.arange(4, device=DEVICE), given(m)
    writer = m.quantize_store if "quantize_store" in m.OPS else getattr(m, "append", None)
    fields = m.Cache._fields
    pairs = [(i, j) for i in range(len(fields)) for j in range(i + 1, len(fields))
             if (cache[i].shape, cache[i].dtype) != (cache[j].shape, cache[j].dtype)]
    if not pairs:
        pytest.skip("no two of its cache tensors differ in shape or dtype")
    for i, j in pairs:
        tensors = list(cache)
        tensors[i], tensors[j] = cache[j], cache[i]
        told = rf"^cache\.{fields[i]} and cache\.{fields[j]}: hold each other's tensors \(exchanged, every cache tensor "
        if "gather_dequant" in m.OPS:
            raises(told, m.gather_dequant, m.Cache(*tensors), ids, page, **scales)
        if writer is not None:
            rows = torch.ones(4, heads, values, device=DEVICE)
            raises(told, writer, *sources(m, [rows] * len(m.PLANES)), ids, m.Cache(*tensors), page, **scales)


def test_a_cache_tensor_passed_for_another_field_is_named():
    """A cache tensor in the place of another field whose shape and dtype it has (another cache's
    scales) names the field and the fields it fits, also where it gives heads and values (in a gather:
    their right values are then the other plane's records tensor's)."""
    m, cache, x, loc = kv_setup()
    ids = torch.arange(4, device=DEVICE)
    other = m.alloc_cache(4, 32, heads=2, values=64, device=DEVICE)
    told = (r"^cache\.%s: shape \(4, 2, 32, 1, 2\) torch.uint8 is what alloc_cache gives cache\.k_sf \(page_size=32\) "
            r"or cache\.v_sf \(page_size=32\); pass each tensor in its own place \(cache\.k_cache, cache\.k_sf, cache\.v_cache, "
            r"cache\.v_sf\)$")
    raises(told % "v_cache", m.gather_dequant, cache._replace(v_cache=other.v_sf), ids, 32)
    raises(told % "k_cache", m.gather_dequant, cache._replace(k_cache=other.k_sf), ids, 32)
    raises(told % "v_cache", m.quantize_store, x, x, loc, cache._replace(v_cache=other.v_sf), 32)
    raises(told % "k_cache", m.quantize_store, x, x, loc, cache._replace(k_cache=other.k_sf), 32)
    # a tuple of another type holding the tensors is checked as a plain tuple
    class Tensors(tuple):
        pass
    raises(r"^cache\.k_sf: holds 2 pages, the other tensors 4$", m.gather_dequant,
           Tensors((cache.k_cache, cache.k_sf[:2], cache.v_cache, cache.v_sf)), ids, 32)
    raises(r"^cache\.k_cache and cache\.k_sf: hold each other's tensors", m.gather_dequant,
           Tensors((cache.k_sf, cache.k_cache, cache.v_cache, cache.v_sf)), ids, 32)
    # a flat tensor of less than a page records no shape: its bytes are what is told
    raises(r"^page_size: a page of page_size=32 takes 4096 bytes of cache\.v_cache, which holds 100$", m.gather_dequant,
           m.RawCache(*cache._replace(v_cache=cache.v_cache.view(-1)[:100])), ids, 32)


@pytest.mark.parametrize("name", sorted(set(cases("quantize_store") + cases("append") + cases("gather_dequant"))))
def test_one_tensor_passed_for_two_cache_fields_is_named(name):
    """A tensor passed for two cache fields (or views sharing bytes) is refused naming both, by the
    writers and by the gathers, which only read them, also where a plan of the call's signature
    was recorded (on a GPU: a replay finds the repeat and takes the checked path)."""
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(43)
    cache = fresh_cache(m, 4, page, heads, values, gen)
    ids, scales = torch.arange(4, device=DEVICE), given(m)
    writer = m.quantize_store if "quantize_store" in m.OPS else getattr(m, "append", None)
    rows = sources(m, [torch.ones(4, heads, values, device=DEVICE)] * len(m.PLANES))
    fields = m.Cache._fields
    if "gather_dequant" in m.OPS:
        m.gather_dequant(cache, ids, page, **scales)          # records a plan on a GPU
    for i in range(len(fields)):
        for j in range(len(fields)):
            if i == j:
                continue
            tensors = list(cache)
            tensors[i] = cache[j]
            told = (rf"^cache\.{fields[min(i, j)]}: overlaps cache\.{fields[max(i, j)]} in memory; each cache field "
                    "needs a buffer of its own$")
            if "gather_dequant" in m.OPS:
                raises(told, m.gather_dequant, m.Cache(*tensors), ids, page, **scales)
            if writer is not None:
                before = clone(m, cache)
                raises(told, writer, *rows, ids, m.Cache(*tensors), page, **scales)
                assert_same_cache(m, cache, before, f"{name}: a refused write")
    if len(fields) > 1:       # the last field a view of the first one's bytes
        last = cache[-1]
        shared = m.Cache(*cache[:-1], cache[0].view(torch.uint8).view(-1)[:last.nbytes].view(last.dtype).view(last.shape))
        told = rf"^cache\.{fields[0]}: overlaps cache\.{fields[-1]} in memory"
        if "gather_dequant" in m.OPS:
            raises(told, m.gather_dequant, shared, ids, page, **scales)
        if writer is not None:
            raises(told, writer, *rows, ids, shared, page, **scales)


def test_a_plan_is_not_replayed_on_cache_fields_that_share_bytes(monkeypatch):
    """A plan is found by the call's signature, which one tensor passed for two cache fields of one
    shape keeps, and so do overlapping views at other addresses: a replay checks the fields' spans
    (once per set of field pointers) and names the fields as the checked path does (a stand-in plan
    here, which fails if run; plans exist on GPUs only)."""
    m, cache, x, loc = kv_setup()

    class Replayed(m._Plan):
        def run(self, *args):
            raise AssertionError("a plan was replayed")

    def find(plans, tensors, scalars):
        return Replayed(tuple(m._extent(t) for t in tensors)), None, [t.data_ptr() for t in tensors]

    monkeypatch.setattr(m, "_find", find)
    pages = torch.zeros((5, *cache.k_cache.shape[1:]), dtype=cache.k_cache.dtype, device=DEVICE)
    told = r"^cache\.k_cache: overlaps cache\.v_cache in memory; each cache field needs a buffer of its own$"
    for shared in (cache._replace(v_cache=cache.k_cache), cache._replace(k_cache=pages[:4], v_cache=pages[1:])):
        raises(told, m.gather_dequant, shared, loc, 32)
        raises(told, m.quantize_store, x, x, loc, shared, 32)
    for call in (lambda: m.gather_dequant(cache, loc, 32), lambda: m.quantize_store(x, x, loc, cache, 32)):
        with pytest.raises(AssertionError, match="a plan was replayed"):     # a cache of its own is replayed
            call()


@pytest.mark.parametrize("name", [n for n in cases("gather_dequant") if module(n).HEADS is not None])
def test_gather_writes_a_2d_out_where_heads_are_fixed(name):
    """Where the spec fixes heads, gather_dequant (and its reference) take out as (T, heads * values),
    as the writers take their sources, write the bytes a 3-D out gets and return it as passed."""
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(41)
    cache = fresh_cache(m, 3, page, heads, values, gen)
    ids = torch.tensor([0, 3 * page - 1, -1, page + 1, 5], device=DEVICE)
    scales = given(m)
    one = len(m.PLANES) == 1
    for dtype in (torch.bfloat16, torch.float32):
        want = tuple(torch.empty(5, heads, values, dtype=dtype, device=DEVICE) for _ in m.PLANES)
        m.gather_dequant_ref(cache, ids, page, **scales, out=want[0] if one else want)
        for fn in (m.gather_dequant, m.gather_dequant, m.gather_dequant_ref):   # (on a GPU the second replays a plan)
            outs = tuple(random_bytes(torch.empty(5, heads * values, dtype=dtype, device=DEVICE), gen) for _ in m.PLANES)
            got = per_plane(m, fn(cache, ids, page, **scales, out=outs[0] if one else outs))
            assert all(g is o for g, o in zip(got, outs))
            for plane, o, w in zip(m.PLANES, outs, want):
                assert_same_bytes(o, w.view(5, -1), f"{name}.{fn.__name__}, 2-D out ({plane}) {dtype}")
    bad = torch.empty(5, 2 * heads * values, device=DEVICE)[:, ::2]
    raises(rf"^out( \(\w+\))?: expected shape \(5, {heads}, {values}\) or \(5, {heads * values}\) with a contiguous last dim",
           m.gather_dequant, cache, ids, page, **scales, out=bad if one else (bad,) * len(m.PLANES))


def test_a_one_plane_gathers_output_is_named_out_in_every_error():
    """A one-plane layout's gather takes out= as one tensor: its errors name `out` (a two-plane
    layout's name `out (k)` and `out (v)`), as its aliasing errors do."""
    m = module("dsv4_k")
    heads, values, page = dims(m)
    cache = m.alloc_cache(2, page, heads=heads, values=values, device=DEVICE)
    ids = torch.arange(3, device=DEVICE)
    raises(r"^out: expected a torch.Tensor, got tuple", m.gather_dequant, cache, ids, page, out=(None,))
    raises(r"^out: expected 2 or 3 dims", m.gather_dequant, cache, ids, page,
           out=torch.empty(3 * heads * values, dtype=torch.bfloat16, device=DEVICE))
    raises(r"^out: expected shape \(3, ", m.gather_dequant, cache, ids, page,
           out=torch.empty(4, heads, values, dtype=torch.bfloat16, device=DEVICE))
    raises(r"^out: overlaps cache\.", m.gather_dequant, cache, ids, page,
           out=cache[0].view(torch.uint8).view(-1)[:3 * heads * values * 2].view(torch.bfloat16).view(3, heads, values))


def test_compat_default_page_size_is_checked():
    compat = pytest.importorskip("generated.compat.sglang_mxfp8")
    m, cache, x, loc = kv_setup()
    raises("page_size=128", compat.quant_store_kv_mxfp8, x, x, loc, cache.k_cache, cache.v_cache, cache.k_sf, cache.v_sf)


def test_compat_page_size_read_off_a_tensor_is_told_so():
    """Where a compat function reads the page size off a tensor's shape (the seed's page_size is
    v_cache.shape[1]), a tensor allocated for another page size is named against the one read, and
    the tensor read, shaped otherwise than the seed takes it, is named with the size its bytes hold;
    no fix asks for another page size, which the caller does not pass."""
    from generated.compat import sglang_mxfp8, vllm_ds32
    seqblocked = module("mxfp8_v_seqblocked")
    c64 = seqblocked.alloc_cache(4, 64, heads=2, values=128, device=DEVICE)
    c32 = seqblocked.alloc_cache(4, 32, heads=2, values=128, device=DEVICE)
    v = torch.ones(3, 2, 128, dtype=torch.bfloat16, device=DEVICE)
    loc = torch.arange(3, device=DEVICE)
    raises(r"^sfv: was allocated for page size 32 \(shape \(4, 2, 128, 1\): 4 pages of 256 bytes\), but "
           r"v_cache\.shape\[1\]=64; pass sfv and v_cache of one cache$",
           sglang_mxfp8.update_mxfp8_v_cache_seqblocked, v, loc, c64.v_cache, c32.v_sf)
    indexer = module("ds32_indexer")
    kv_cache = indexer.alloc_cache(4, 64, device=DEVICE).k_cache       # (4, 64 * 132): the layout's own shape
    k = torch.ones(3, 128, dtype=torch.bfloat16, device=DEVICE)
    raises(r"^kv_cache: kv_cache\.shape\[1\]=8448 is read as the page size, but kv_cache holds pages of 64 slot\(s\) "
           r"\(shape \(4, 8448\): 4 pages of 8448 bytes\); pass kv_cache as \(num_pages, page size, \.\.\.\): its page size is "
           r"read at kv_cache\.shape\[1\]$", vllm_ds32.indexer_k_quant_and_cache, k, kv_cache, loc, 128, None)
    raises(r"^kv_cache: shape \(4, 32, 264\) is not \(num_pages, \.\.\.\) of 4224-byte pages for kv_cache\.shape\[1\]=32; "
           r"pass kv_cache as \(num_pages, page size, \.\.\.\): its page size is read at "
           r"kv_cache\.shape\[1\]$",
           vllm_ds32.indexer_k_quant_and_cache, k, kv_cache.view(4, 32, 264), loc, 128, None)
    vllm_ds32.indexer_k_quant_and_cache(k, kv_cache.view(4, 64, 132), loc, 128, None)     # the seed's shape
    # another tensor than the one read, shaped otherwise: it is named, with the page size it must hold
    from generated.compat import vllm_flash
    flash = module("vllm_fp8").alloc_cache(4, 16, heads=2, values=16, device=DEVICE)
    rows, scale = torch.ones(3, 2, 16, device=DEVICE), torch.ones(1, device=DEVICE)
    raises(r"^value_cache: shape \(64, 2, 16\) is not \(num_pages, \.\.\.\) of 512-byte pages for key_cache\.shape\[1\]=16; "
           r"pass value_cache with key_cache\.shape\[1\] slots per page, of the cache key_cache belongs to$",
           vllm_flash.reshape_and_cache_flash, rows, rows, flash.k_cache, flash.v_cache.view(64, 2, 16), loc, "fp8",
           scale, scale)


def test_sources_must_match_the_cache_heads_and_values():
    m, cache, x, loc = kv_setup()
    told = r"^k: shape \(8, %d, %d\) has %d head\(s\) of %d values, but cache\.k_cache's shape \(4, 32, 2, 64\) gives 2 of 64$"
    raises(told % (1, 64, 1, 64), m.quantize_store, x[:, :1], x[:, :1], loc, cache, 32)
    raises(told % (2, 32, 2, 32), m.quantize_store, x[..., :32], x[..., :32], loc, cache, 32)
    # as many values a token as the cache holds, in other heads: the cache holds whole pages of them,
    # so no exchange of its tensors is blamed
    raises(told % (4, 32, 4, 32), m.quantize_store, x.view(8, 4, 32), x.view(8, 4, 32), loc, cache, 32)
    raises(r"k: shape \(8, 0, 64\) has no heads or no values", m.quantize_store,
           x[:, :0], x[:, :0], loc, cache, 32)
    raises("k: is a meta tensor", m.quantize_store, torch.empty(8, 2, 64, device="meta"), x, loc, cache, 32)
    raises("values: expected an int >= 1, got 0", m.alloc_cache, 1, 32, heads=2, values=0)


def test_a_records_tensor_that_gave_heads_and_values_is_named():
    """Where a records tensor's trailing dims give heads and values, a view of it that counts them
    otherwise (other trailing dims, a 2-byte dtype) is named, with what it gave, not page_size nor
    an exchange with the other plane's records tensor of as many bytes."""
    m, cache, x, loc = kv_setup()
    ids = torch.arange(4, device=DEVICE)
    folded = cache._replace(k_cache=cache.k_cache.view(4, 32, 128))
    raises(r"^cache\.k_cache: shape \(4, 32, 128\) torch.float8_e4m3fn gives 32 head\(s\) of 128 values, whose pages of "
           r"page_size=32 take 131072 bytes, but it holds 16384 bytes; pass it shaped as alloc_cache gives it",
           m.gather_dequant, folded, ids, 32)
    wide = cache._replace(k_cache=cache.k_cache.view(torch.int16))
    told = (r"^cache\.k_cache: shape \(4, 32, 2, 32\) torch.int16 gives 2 head\(s\) of 32 values, counted in 2-byte "
            r"elements, but alloc_cache gives it as torch.float8_e4m3fn; ")
    raises(told, m.gather_dequant, wide, ids, 32)
    raises(told, m.quantize_store, x, x, loc, wide, 32)
    # a RawCache's token-major records tensor gives heads and values rightly: a wrong page_size is told
    token_major = m.RawCache(cache.k_cache.view(128, 2, 64), *cache[1:])
    raises(r"^page_size: a page of page_size=256 takes 32768 bytes of cache\.k_cache, which holds 16384$",
           m.gather_dequant, token_major, ids, 256)


def test_geometry_gives_a_dict_of_the_callers_own():
    """The kernels launch from a cached geometry: what geometry() returns is a copy, so changing it
    changes no launch."""
    m, cache, x, loc = kv_setup()
    g = m.geometry(32, 2, 64)
    want = dict(g)
    g.clear()
    assert m.geometry(32, 2, 64) == want == m._checked_geometry(32, 2, 64)
    assert m.geometry(32, 2, 64) is not m.geometry(32, 2, 64)


def test_rows_in_parts_are_checked_part_by_part():
    """A writer taking each row in parts (vllm_ds_mla: kv_c, k_pe) reads them from separate tensors of
    their own strides, and an error names the part: its width, its token count, its heads, its dtype,
    a part overlapping the cache; nothing is written by a refused call."""
    m = module("vllm_ds_mla")
    gen = generator(41)
    rows = scaled_normal((24, 1, 576), gen).to(DEVICE)
    kv_c = rows[..., :512].contiguous()
    k_pe = torch.zeros(24, 3, 64, dtype=rows.dtype, device=DEVICE)[:, 1:2]   # rows 192 values apart
    k_pe.copy_(rows[..., 512:])
    loc = torch.randperm(64, generator=gen)[:24].to(DEVICE)
    cache, want = fresh_cache(m, 4, 16, 1, 576, gen), None
    want = clone(m, cache)
    m.quantize_store(kv_c, k_pe, loc, cache, 16)
    m.quantize_store_ref(rows[..., :512], rows[..., 512:], loc, want, 16)
    assert_same_cache(m, cache, want, "parts of their own strides")
    before = clone(m, cache)
    raises(r"^kv_c: expected 512 values per head", m.quantize_store, rows[..., :500], k_pe, loc, cache, 16)
    raises(r"^k_pe: expected 64 values per head", m.quantize_store, kv_c, rows[..., 500:], loc, cache, 16)
    raises(r"^k_pe: shape \(23, 1, 64\) has other tokens", m.quantize_store, kv_c, k_pe[1:], loc, cache, 16)
    # the part that disagrees with loc's length is named, whichever it is
    raises(r"^kv_c: shape \(23, 1, 512\) has other tokens or heads than k_pe's \(24, 1, 64\)$",
           m.quantize_store, kv_c[1:], k_pe, loc, cache, 16)
    raises(r"^kv_c: shape \(23, 1, 512\) has other tokens", m.quantize_store_ref, kv_c[1:], k_pe, loc, cache, 16)
    raises(r"^k_pe: expected 1 head", m.quantize_store, kv_c, torch.zeros(24, 2, 64, device=DEVICE), loc, cache, 16)
    inside = cache.k_cache.view(-1)[: 24 * 128].view(torch.bfloat16).view(24, 1, 64)
    raises(r"^cache.k_cache: overlaps k_pe", m.quantize_store, kv_c, inside, loc, cache, 16)
    # a row's parts are one dtype (the bf16 rope is copied bit for bit, not converted)
    raises(r"^k_pe: dtype torch.float32, kv_c's is torch.bfloat16; pass the parts of plane k's rows in one dtype",
           m.quantize_store, kv_c, k_pe.float(), loc, cache, 16)
    with pytest.raises(TypeError):
        m.quantize_store(rows, loc, cache, 16)                           # whole rows: not this signature
    assert_same_cache(m, cache, before, "refused calls")


def test_size_errors_name_the_tensor_that_gave_the_size():
    """A value count the layout cannot take is reported against the tensor it came from."""
    m = module("mxfp8_kv")
    cache = m.Cache(*(torch.zeros((1, 32, 2, 40) if "cache" in f else (1, 2, 32, 1, 2), dtype=torch.uint8, device=DEVICE)
                      for f in m.Cache._fields))
    raises(r"cache\.k_cache: shape \(1, 32, 2, 40\): values: the value count must be a multiple of 32",
           m.gather_dequant, cache, torch.arange(2, device=DEVICE), 32)
    rows = torch.ones(2, 2, 40, device=DEVICE)
    raises(r"k: shape \(2, 2, 40\): values: the value count must be a multiple of 32",
           m.quantize_store, rows, rows, torch.arange(2, device=DEVICE), cache, 32)
    raises(r"^x: shape \(2, 41\): values: the value count must be a multiple of 32 \(values=41\)$", m.quantize,
           torch.ones(2, 41, device=DEVICE))
    raises(r"^data: shape \(2, 41\): values: the value count must be a multiple of 32 \(values=41\)$", m.dequantize,
           torch.zeros(2, 41, dtype=torch.float8_e4m3fn, device=DEVICE), torch.zeros(2, 1, dtype=torch.uint8, device=DEVICE))
    raises(r"^x: shape \(2, 41\): values: this layout has 512 values per head, got 41$", module("dsv4_k").quantize,
           torch.ones(2, 41, device=DEVICE))


def test_a_records_width_counts_its_planes_and_inline_scales():
    """vllm_fp8_per_token_head: a row of the last dim is K's and V's records, each head_size codes
    and a 4-byte fp32 scale, so a reader takes head_size from half that dim less 4, which must leave
    values that keep the scales aligned."""
    m = module("vllm_fp8_per_token_head")
    ids = torch.arange(2, device=DEVICE)
    for width, error in ((140, r"cache\.kv_cache: shape \(1, 8, 2, 140\): values: the value count must be a multiple of 4"),
                         (8, r"cache\.kv_cache: a last dim of 8 is not 2 record\(s\) of values and 4 scale bytes"),
                         (137, r"cache\.kv_cache: a last dim of 137 is not 2 record\(s\)")):
        raises(error, m.gather_dequant, m.Cache(torch.zeros(1, 8, 2, width, dtype=torch.uint8, device=DEVICE)), ids, 8)
    raises("values: the value count must be a multiple of 4", m.alloc_cache, 1, 8, heads=2, values=66)
    cache = m.alloc_cache(1, 8, heads=2, values=64, device=DEVICE)
    assert cache.kv_cache.shape == (1, 8, 2, 136)
    assert m.gather_dequant(cache, ids, 8)[0].shape == (2, 2, 64)


def test_written_buffers_must_not_alias_other_arguments():
    m, cache, x, loc = kv_setup()
    aliased = m.Cache(cache.k_cache, cache.k_sf, cache.k_cache, cache.v_sf)
    raises("cache.k_cache: overlaps cache.v_cache", m.quantize_store, x, x, loc, aliased, 32)
    m.quantize_store(x, x, loc, cache, 32)      # k and v may be one tensor: both are only read
    workspace = torch.empty(2, 8, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    raises(r"out \(k\): overlaps out \(v\)", m.gather_dequant, cache, loc, 32, out=(workspace[0], workspace[0]))
    over = cache.k_cache.view(torch.uint8).view(-1)[: 8 * 2 * 64 * 2].view(torch.bfloat16).view(8, 2, 64)
    raises(r"out \(k\): overlaps cache.k_cache", m.gather_dequant, cache, loc, 32, out=(over, workspace[1]))
    shared = torch.zeros(8 * 2 * 64 // 4, dtype=torch.int64, device=DEVICE)    # ids in the first bytes of out
    raises(r"out \(k\): overlaps token_ids", m.gather_dequant, cache, shared[:8], 32,
           out=(shared.view(torch.bfloat16).view(8, 2, 64), workspace[1]))


@pytest.mark.parametrize("name", LAYOUTS)
def test_alloc_cache_gives_every_buffer_its_page_bytes(name):
    """alloc_cache/cache_shapes: each buffer's tensor holds exactly its model's page bytes per page
    (an fp32 scale buffer too), and the module's own checks accept it; the default device is
    torch's default (the CPU here unless set otherwise)."""
    from codegen import build
    m = module(name)
    heads, values, page = dims(m)
    folder = ROOT / "specs" if name in SPECS else ROOT / "tests" / "specs"
    layout = build.build_layout(*build.load_spec(folder / f"{name}.yaml", ROOT)[1:])
    sizes = {"page_size": page, "heads": heads, "values": values}
    geo = m.geometry(page, heads, values)
    for field, plane, buffer in layout.cache_fields:
        shape, dtype = m.cache_shapes(3, page, heads=heads, values=values)[field]
        nbytes = torch.empty(shape, dtype=dtype, device="meta").numel() * dtype.itemsize
        assert nbytes == 3 * buffer.page_bytes.evaluate(sizes) == 3 * geo[buffer.page_bytes_name], field
    cache = m.alloc_cache(3, page, heads=heads, values=values)
    assert all(t.device == torch.empty(0).device for t in cache)
    m._check_cache(cache, page, heads, values, cache[0].device, ("cache", cache[0].shape))


def test_alloc_cache_names_a_device_it_cannot_use_and_a_size_no_tensor_holds():
    """alloc_cache's device is checked before it allocates (a CUDA one where this process has none
    was an AssertionError, a float a TypeError), and so is a cache too big for a tensor (torch's
    storage size overflow); None is torch's default device."""
    m = module("mxfp8_kv")
    raises(r"^device: 3\.5 is not a torch device \(", m.alloc_cache, 2, 32, heads=2, values=64, device=3.5)
    raises(r"^device: 'nonsense' is not a torch device", m.alloc_cache, 2, 32, heads=2, values=64, device="nonsense")
    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    raises(rf"^device: {missing} is not available in this process", m.alloc_cache, 2, 32, heads=2, values=64,
           device=missing)
    raises(r"^num_pages: 4611686018427387904 page\(s\) of 4096 bytes of cache\.k_cache take more than a tensor holds",
           m.alloc_cache, 2 ** 62, 32, heads=2, values=64)
    raises(r"^page_size, heads and values: 2 page\(s\) of \d+ bytes of cache\.k_cache take more", m.alloc_cache, 2,
           2 ** 57, heads=2, values=64)
    raises(r"^device: ipu cannot hold tensors in this process \(NotImplementedError: ", m.alloc_cache, 2, 32, heads=2,
           values=64, device="ipu")
    assert m.alloc_cache(2, 32, heads=2, values=64).k_cache.device == torch.empty(0).device


@pytest.mark.parametrize("name", LAYOUTS)
def test_references_take_every_argument_of_their_kernels(name):
    import inspect
    m = module(name)
    for op in m.OPS:
        kernel, ref = inspect.signature(getattr(m, op)), inspect.signature(getattr(m, f"{op}_ref"))
        assert list(kernel.parameters) == list(ref.parameters), op


@pytest.mark.parametrize("name", ["vllm_fp8", "dsv4_k", "mxfp8_v_seqblocked"])
def test_references_run_where_their_kernels_do(name):
    """A reference op behaves as its kernel whatever torch's modes: sources and call-time scales that
    require grad make no output require it; outs and caches made under inference_mode are written
    (kernels write them through their pointers); another default device (meta) changes nothing. The
    bytes are the kernel's in each case."""
    m = module(name)
    gen = generator(51)
    heads, values, page = dims(m)
    tokens = 6
    loc = torch.randperm(2 * page, generator=gen)[:tokens].to(DEVICE)
    srcs = [scaled_normal((tokens, heads, values), gen).to(DEVICE) for _ in m.PLANES]
    writer = "append" if "append" in m.OPS else "quantize_store"
    scales = {k: v.clone().requires_grad_() for k, v in given(m).items()}
    grad_srcs = [s.clone().requires_grad_() for s in srcs]
    base = fresh_cache(m, 2, page, heads, values, gen)
    want = clone(m, base)
    getattr(m, writer)(*sources(m, srcs), loc, want, page, **given(m))
    with torch.inference_mode():
        got = clone(m, base)
    getattr(m, f"{writer}_ref")(*sources(m, grad_srcs), loc, got, page, **scales)   # an inference cache
    assert_same_cache(m, got, want, f"{name}.{writer}_ref into an inference-mode cache")
    page_ids = torch.tensor([1], device=DEVICE)
    m.reset_pages_ref(got, page_ids, page)
    m.reset_pages(want, page_ids, page)
    assert_same_cache(m, got, want, f"{name}.reset_pages_ref of an inference-mode cache")
    if "gather_dequant" not in m.OPS:
        return
    kernel = per_plane(m, m.gather_dequant(want, loc, page, **given(m)))
    ref = per_plane(m, m.gather_dequant_ref(want, loc, page, **scales))
    assert not any(t.requires_grad for t in ref)
    for a, b in zip(kernel, ref, strict=True):
        assert_same_bytes(a, b, f"{name}.gather_dequant_ref with scales that require grad")
    with torch.inference_mode():
        outs = tuple(torch.full_like(t, float("nan")) for t in kernel)
    m.gather_dequant_ref(want, loc, page, out=outs if len(outs) > 1 else outs[0], **scales)
    for a, b in zip(kernel, outs, strict=True):
        assert_same_bytes(a, b, f"{name}.gather_dequant_ref into inference-mode outs")
    torch.set_default_device("meta")
    try:
        ref = per_plane(m, m.gather_dequant_ref(want, loc, page, **given(m)))
    finally:
        torch.set_default_device(None)
    for a, b in zip(kernel, ref, strict=True):
        assert_same_bytes(a, b, f"{name}.gather_dequant_ref under a meta default device")


# --- launch plans ---------------------------------------------------------------------------------

def test_signature_tells_apart_what_triton_specializes_on():
    m = module("mxfp8_kv")
    x = torch.zeros(64, dtype=torch.bfloat16)

    def key(*tensors, scalars=(64,)):
        return m._signature(tensors, scalars)[0]
    base = key(x)
    assert m._signature((x,), (64,))[1] == [x.data_ptr()]
    assert key(x[1:]) != base                                           # shape, and 2-byte misalignment
    assert key(x.view(8, 8).t()) != key(x.view(8, 8))                   # strides
    assert key(x.float()) != base                                       # dtype
    assert key(x, scalars=(64.0,)) != base and key(x, scalars=(True,)) != key(x, scalars=(1,))
    assert m._signature((x, 3), (64,)) == (None, None)                  # not a tensor: the checked path names it
    assert m._signature(None, (64,)) == (None, None)


def test_plan_slots_match_each_call_tensor_once():
    """A kernel argument is the call tensor itself or a view of it; two tensors with one first byte
    (k is v) take their slots in order."""
    m = module("mxfp8_kv")
    k = torch.zeros(4, 2, 8)
    loc = torch.zeros(4, dtype=torch.int64)
    used, got = set(), []
    for a in (k.view(4, 16), k, loc):
        got.append(m._match(a, (loc, k, k), used))
        used.add(got[-1])
    assert got == [1, 2, 0]
    assert m._match(torch.zeros(3), (loc, k), set()) is None


def test_disjoint_check_and_extents():
    m = module("mxfp8_kv")
    buf = torch.zeros(100, dtype=torch.uint8)
    a, b = buf[:50], buf[50:]
    assert m._extent(buf[::2]) == 99 and m._extent(buf[:0]) == 0
    m._check_disjoint(("a", "b"), (a.data_ptr(), b.data_ptr()), (0, 1), (50, 50))
    raises("b: overlaps a", m._check_disjoint, ("a", "b"), (a.data_ptr(), b.data_ptr()), (1,), (51, 50))
    # read-only arguments may overlap each other (k is v), but not a written one
    c = buf[20:30]
    m._check_disjoint(("a", "c", "w"), (a.data_ptr(), c.data_ptr(), b.data_ptr()), (2,), (50, 10, 50))
    raises("w: overlaps a", m._check_disjoint, ("a", "c", "w"), (a.data_ptr(), c.data_ptr(), buf[40:].data_ptr()),
           (2,), (50, 10, 60))


def counted(fn, calls: list):
    def wrapper(*args, **kwargs):
        calls.append(fn.__name__)
        return fn(*args, **kwargs)
    return wrapper


@pytest.mark.skipif(not ON_GPU, reason="launch plans exist for compiled kernels on CUDA devices")
@pytest.mark.parametrize("name", [n for n in LAYOUTS if n in SPECS])
def test_repeated_calls_replay_plans_with_the_same_bytes(name, monkeypatch):
    """The second call of each op with the same argument signature replays the first one's plan (its
    checks are not run again) and writes what the reference writes, on fresh data; the aliasing
    check still runs on the replay."""
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(31)
    cache = fresh_cache(m, 6, page, heads, values, gen)
    ids = torch.randperm(6 * page, generator=gen)[:40].to(DEVICE)
    writer = "quantize_store" if "quantize_store" in m.OPS else "append"
    checked = []
    for round_ in range(2):
        rows = [scaled_normal((40, heads, values), gen).to(DEVICE) for _ in m.PLANES]
        scales = given(m, (0.0371, 2.7) if round_ == 0 else (5.5, 0.125))   # new call-time scale tensors: replayed too
        ref = clone(m, cache)
        loc = ids if writer == "quantize_store" else torch.arange(40, device=DEVICE)
        getattr(m, writer)(*sources(m, rows), loc, cache, page, **scales)
        assert not checked                      # the kernel op replayed its plan; the reference checks
        getattr(m, f"{writer}_ref")(*sources(m, rows), loc, ref, page, **scales)
        checked.clear()
        assert_same_cache(m, cache, ref, f"{name}.{writer} round {round_}")
        got = m.gather_dequant(cache, ids, page, **scales)
        assert not checked
        want = m.gather_dequant_ref(cache, ids, page, **scales)
        checked.clear()
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,), strict=True):
            assert_same_bytes(a, b, f"{name}.gather_dequant round {round_}")
        if round_ == 0:
            assert len(m._PLANS[writer]) == 1 and len(m._PLANS["gather_dequant"]) == 1
            checks = ("_prepare_store_inputs" if hasattr(m, "INPUTS") else "_prepare_store", "_prepare_gather")
            for helper in checks:   # from now on the ops must not run the checks
                monkeypatch.setattr(m, helper, counted(getattr(m, helper), checked))
    if len(m.Cache._fields) > 1:     # the cache with one tensor replaced by a view of the first one's bytes, of its shape
        index = len(cache) // 2
        bytes_ = cache[index].numel() * cache[index].element_size()
        view = cache[0].view(-1).view(torch.uint8)[:bytes_].view(cache[index].dtype).view(cache[index].shape)
        assert view.numel() * view.element_size() == bytes_          # the first tensor is the largest one
        aliased = m.Cache(*(view if i == index else t for i, t in enumerate(cache)))
        with pytest.raises(ValueError, match="overlaps"):
            getattr(m, writer)(*sources(m, rows), ids, aliased, page, **scales)


def test_interleaved_outputs_of_one_workspace_are_not_aliasing():
    """Strided slices of one workspace whose elements interleave (out=(ws[:, 0], ws[:, 1])) are
    fine; an expand()ed output, whose elements share bytes, is not."""
    m, cache, x, loc = kv_setup()
    m.quantize_store(x, x, loc, cache, 32)
    ws = torch.empty(8, 2, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    got = m.gather_dequant(cache, loc, 32, out=(ws[:, 0], ws[:, 1]))
    for a, b in zip(got, m.gather_dequant_ref(cache, loc, 32), strict=True):
        assert_same_bytes(a, b, "interleaved outs")
    shifted = ws.view(-1)[64:].as_strided((8, 2, 64), (256, 64, 1))     # half a head past ws[:, 0]: shares bytes
    raises(r"out \(k\): overlaps out \(v\)", m.gather_dequant, cache, loc, 32, out=(ws[:, 0], shifted))
    one = torch.empty(1, 2, 64, dtype=torch.bfloat16, device=DEVICE).expand(8, 2, 64)
    raises(r"out \(k\): elements overlap in memory", m.gather_dequant, cache, loc, 32, out=(one, ws[:, 1]))
    assert not m._strided_overlap(ws[:, 0], ws[:, 1]) and m._strided_overlap(ws[:, 0], ws.view(-1)[1:].as_strided((8, 2, 64), (256, 64, 1)))


def test_a_wrong_out_is_refused_after_calls_that_replay():
    """out=() or a tuple of the wrong length, after calls without out (on the GPU: a recorded and a
    replayed plan), still takes the checked path and raises, rather than replaying with fresh outputs."""
    m, cache, x, loc = kv_setup()
    m.quantize_store(x, x, loc, cache, 32)
    for _ in range(2):
        m.gather_dequant(cache, loc, 32)
    k = torch.empty(8, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    for out in ((), [k], (k, k, k)):
        raises(r"^out: expected a tuple of 2 tensors", m.gather_dequant, cache, loc, 32, out=out)


def test_odd_scalars_and_caches_raise_value_errors():
    d = module("dsv4_k")
    ids = torch.arange(4, device=DEVICE)
    raises("cache.k_cache: expected a torch.Tensor", d.gather_dequant, (None,), ids, 64)
    raises("cache.k_cache: expected a torch.Tensor", d.reset_pages, (None,), ids, 64)
    cache = d.alloc_cache(4, 64, device=DEVICE)
    raises("page_size: expected an int", d.gather_dequant, cache, ids, torch.tensor(64.0))
    raises("page_size: expected an int", d.gather_dequant, cache, ids, torch.tensor(64))
    raises("page_size: expected an int", d.gather_dequant, cache, ids, [64])
    raises(r"pdl: expected True, False or None .* got \[1\] \(list\)", d.gather_dequant, cache, ids, 64, pdl=[1])
    raises("cache.k_cache: overlaps page_ids", d.reset_pages, cache, cache.k_cache.view(torch.int64).view(-1)[:2], 64)


def test_views_of_tensors_sharing_a_first_byte_get_no_plan():
    m = module("mxfp8_kv")
    data = torch.zeros(16, dtype=torch.float8_e4m3fn)
    scale = data.view(torch.uint8)[:4]                          # another tensor starting at data's first byte
    assert m._match(data.view(torch.uint8), (data, scale), set()) is None
    assert m._match(data, (data, scale), set()) == 0


def test_vllm_indexer_compat_writes_the_layouts_bytes_and_refuses_other_formats():
    """vLLM's indexer_k_quant_and_cache on its own cache shape (num_blocks, block_size, 132) writes
    ds32_indexer's bytes; a quant_block_size or scale_fmt the layouts do not implement raises
    ValueError naming it before anything is written."""
    compat = pytest.importorskip("generated.compat.vllm_ds32")
    from generated import ds32_indexer as m
    gen = torch.Generator().manual_seed(5)
    blocks, block_size = 6, 64
    k = (torch.randn(90, 128, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    slots = torch.randperm(blocks * block_size, generator=gen)[:90]
    slots[::7] = -1                                                    # padding tokens: skipped
    slots = slots.to(DEVICE)
    kv_cache = torch.full((blocks, block_size, 132), 0xA5, dtype=torch.uint8, device=DEVICE)
    want = m.Cache(k_cache=kv_cache.clone().view(blocks, -1))
    compat.indexer_k_quant_and_cache(k, kv_cache, slots, 128, "")
    m.quantize_store_ref(k, slots, want, block_size)
    assert torch.equal(kv_cache.view(blocks, -1), want.k_cache)
    before = kv_cache.clone()
    for args, name in (((64, ""), "quant_block_size"), ((128, "fp8"), "scale_fmt"), ((128.0, ""), "quant_block_size"),
                       ((True, ""), "quant_block_size"), ((np.array([128]), ""), "quant_block_size"),
                       ((np.array(128), ""), "quant_block_size"), ((128, np.array(["", ""])), "scale_fmt"),
                       ((128, b""), "scale_fmt")):
        with pytest.raises(ValueError, match=f"^{name}: "):
            compat.indexer_k_quant_and_cache(k, kv_cache, slots, *args)
    assert torch.equal(kv_cache, before)
    compat.indexer_k_quant_and_cache(k, kv_cache, slots, np.int64(128), None)    # an integer of any type; None
    assert torch.equal(kv_cache, want.k_cache.view(kv_cache.shape))


def _far_heads(heads: int, values: int, tokens: int, dtype=torch.bfloat16):
    """A (tokens, heads, values) view whose heads lie 2**30 elements apart: an int32 stride whose
    products with the later heads pass 2**31 (offsets must be taken in int64). Its storage is
    virtual memory, touched only where rows are (None where it cannot be had)."""
    stride_h, before = 2 ** 30, 64               # (64 elements of the storage precede the view)
    try:
        big = torch.empty(before + (heads - 1) * stride_h + tokens * values, dtype=dtype, device=DEVICE)
    except RuntimeError:                         # no address space for it here
        return None
    return big.as_strided((tokens, heads, values), (values, stride_h, 1), before)


def test_rows_whose_heads_lie_past_32_bit_offsets_are_refused():
    """The kernels take head * stride(1) in 32 bits where Triton passes the stride so: a source or
    destination whose last head starts 2**31 elements or more in raises ValueError naming it (it was
    written at wrapped addresses), for writers, gathers and the append."""
    m, s = module("mxfp8_kv"), module("mxfp8_v_seqblocked")
    heads, values, page, tokens = 3, 32, 32, 2
    x = _far_heads(heads, values, tokens)
    if x is None:
        pytest.skip("no 4 GiB of address space for the far-apart heads")
    loc = torch.tensor([3, 40], device=DEVICE)
    cache = m.alloc_cache(2, page, heads=heads, values=values, device=DEVICE)
    rows = torch.ones(tokens, heads, values, device=DEVICE)
    raises(r"k: head 2 ends 2147483679 elements past its token's first \(heads 1073741824 apart\)", m.quantize_store, x,
           rows, loc, cache, page)
    raises(r"out \(k\): head 2 ends 2147483679", m.gather_dequant, cache, loc, page, out=(x, torch.empty_like(rows)))
    raises(r"v: head 2 ends", s.append, x, loc, s.alloc_cache(2, page, heads=heads, values=values, device=DEVICE), page)
    near = x.as_strided((tokens, 2, values), (values, 2 ** 31 - values // 2, 1), x.storage_offset())   # the row's end passes
    raises(r"k: head 1 ends 2147483663", m.quantize_store, near, near, loc, m.alloc_cache(2, page, heads=2, values=values,
                                                                                         device=DEVICE), page)
    m.quantize_store(x[:, :2], rows[:, :2], loc, m.alloc_cache(2, page, heads=2, values=values, device=DEVICE), page)   # 2**30 in: fine


def assert_same_reads(m, cache, want, ids, page: int, what: str) -> None:
    """Where the layout has gather_dequant: the rows of `ids` read from both caches are the same bytes."""
    if "gather_dequant" in m.OPS:
        for a, b in zip(per_plane(m, m.gather_dequant(cache, ids, page, **given(m))),
                        per_plane(m, m.gather_dequant(want, ids, page, **given(m)))):
            assert_same_bytes(a, b, what)


@pytest.mark.parametrize("name", cases("quantize_store") + cases("append"))
def test_cache_tensors_of_dtypes_triton_lacks_are_written_as_bytes(name):
    """Cache tensors may hold any dtype where alloc_cache gives an integer one (the kernels address
    bytes): a 1-byte uint8 field viewed as float8_e8m0fnu (sglang passes e8m0 scale tensors) is
    written, read and reset as its uint8 self, and a 1-byte float one (fp8 codes) as a uint8 view.
    A field alloc_cache gives a float dtype is refused in another float dtype, whose values would
    not be the stored ones."""
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(42)
    plain = fresh_cache(m, 3, page, heads, values, gen)
    odd = m.Cache(*(t.clone().view(torch.uint8 if t.dtype.is_floating_point else torch.float8_e8m0fnu)
                    if t.element_size() == 1 else t.clone() for t in plain))
    assert any(u.dtype != t.dtype for u, t in zip(odd, plain))
    for i, t in enumerate(plain):
        if t.dtype.is_floating_point:
            other = next(d for d in (torch.float8_e5m2, torch.float8_e4m3fn, torch.float16, torch.bfloat16)
                         if d != t.dtype and d.itemsize == t.element_size())
            wrong = m.Cache(*(u.view(other) if j == i else u for j, u in enumerate(plain)))
            raises(rf"^cache\.{m.Cache._fields[i]}: dtype {other}, but this layout reads and writes {t.dtype} there",
                   m.reset_pages, wrong, torch.tensor([0], device=DEVICE), page)
    rows = [scaled_normal((4, heads, values), gen).to(DEVICE) for _ in m.PLANES]
    loc = torch.tensor([1, page + 2, 2 * page + 3, 5], device=DEVICE)
    writer = m.quantize_store if "quantize_store" in m.OPS else m.append
    for cache in (plain, odd):
        writer(*sources(m, rows), loc, cache, page, **given(m))
    assert_same_cache(m, odd, plain, f"{name} written through float8_e8m0fnu views")
    assert_same_reads(m, odd, plain, loc, page, f"{name} read through float8_e8m0fnu views")
    pages = torch.tensor([1], device=DEVICE)
    m.reset_pages(odd, pages, page)
    m.reset_pages(plain, pages, page)
    assert_same_cache(m, odd, plain, f"{name} reset through float8_e8m0fnu views")


def test_cache_tensors_of_other_heads_values_or_order_are_refused():
    """A page-major cache tensor in alloc_cache's rank and element size must have its shape: one
    allocated for other heads and values (with as many bytes a page), or a scale buffer in another
    order, would have its bytes laid out otherwise. Views that merge or split its dims stay bytes."""
    m = module("mxfp8_kv")
    ids = torch.arange(1, 3, device=DEVICE)
    a = m.alloc_cache(3, 32, heads=2, values=64, device=DEVICE)
    b = m.alloc_cache(3, 32, heads=4, values=32, device=DEVICE)
    rows = scaled_normal((2, 2, 64), generator(45)).to(DEVICE)
    told = r"^cache\.v_cache: shape \(3, 32, 4, 32\) torch.float8_e4m3fn, but alloc_cache gives \(3, 32, 2, 64\)"
    for mixed in (m.Cache(a.k_cache, a.k_sf, b.v_cache, a.v_sf), m.Cache(a.k_cache, a.k_sf, b.v_cache, b.v_sf)):
        raises(told, m.gather_dequant, mixed, ids, 32)
        raises(told, m.quantize_store, rows, rows, ids, mixed, 32)
        raises(told, m.reset_pages, mixed, ids, 32)
    raises(r"^cache\.v_sf: shape \(3, 4, 32, 1, 1\) torch.uint8, but alloc_cache gives \(3, 2, 32, 1, 2\)",
           m.gather_dequant, m.Cache(a.k_cache, a.k_sf, a.v_cache, b.v_sf), ids, 32)
    flat = m.Cache(*(t.view(t.shape[0], -1) if i % 2 else t for i, t in enumerate(a)))   # scales as (pages, bytes)
    m.quantize_store(rows, rows, ids, flat, 32)
    # token-major (a RawCache's (num_pages * page_size, heads, values)) as page-major
    raw = m.RawCache(a.k_cache.view(-1, 2, 64), a.k_sf, b.v_cache.view(-1, 4, 32), a.v_sf)
    raises(r"^cache\.v_cache: shape \(96, 4, 32\) torch.float8_e4m3fn, but alloc_cache gives \(3, 32, 2, 64\)",
           m.gather_dequant, raw, ids, 32)
    m.quantize_store(rows, rows, ids, m.RawCache(a.k_cache.view(-1, 2, 64), a.k_sf, a.v_cache.view(-1, 2, 64), a.v_sf), 32)
    # the seq-blocked V cache's scales in another order (sglang's seed asserts their shape)
    sb = module("mxfp8_v_seqblocked")
    c = sb.alloc_cache(2, 64, heads=2, values=32, device=DEVICE)
    raises(r"^cache\.v_sf: shape \(2, 2, 2, 32\) torch.uint8, but alloc_cache gives \(2, 2, 32, 2\)", sb.append,
           rows[:, :, :32], ids, sb.Cache(c.v_cache, c.v_sf.transpose(2, 3).contiguous()), 64)
    # a records tensor that counts its heads and values in elements of another size
    v = module("vllm_fp8")
    c = v.alloc_cache(3, 16, heads=2, values=64, device=DEVICE)
    half = torch.zeros(3, 16, 2, 32, dtype=torch.int16, device=DEVICE)         # as many bytes a page
    raises(r"^cache\.v_cache: shape \(3, 16, 2, 32\) torch.int16, but alloc_cache gives \(3, 16, 2, 64\)",
           v.gather_dequant, v.Cache(c.k_cache, half), ids, 16, **given(v))


# Each shipped layout's cache fields' alignment where a field stores fp32 scales (4) or raw bf16 values (2)
# through typed pointers (codes, one-byte scales and word reads, which check their own alignment: 1).
FIELD_ALIGN = {"ds32_indexer": (4,), "ds32_indexer_ue8m0": (4,), "ds32_mla": (4,), "vllm_ds_mla": (4,),
               "vllm_fp8_per_token_head": (4,), "dsv4_k": (2,), "dsv4_mxfp4": (2,), "dsv4_nvfp4": (2,)}


def test_the_alignment_table_is_each_fields_widest_typed_access():
    for name in SPECS:
        m = module(name)
        assert m._FIELD_ALIGN == FIELD_ALIGN.get(name, (1,) * len(m.Cache._fields)), name


@pytest.mark.parametrize("name", [n for n in LAYOUTS if max(module(n)._FIELD_ALIGN) > 1])
def test_a_cache_that_starts_off_its_values_alignment_is_refused(name):
    """The kernels store fp32 scales and raw bf16 values through typed pointers, which must be aligned
    (on the GPU a misaligned one is a sticky CUDA error): a cache field that starts off that
    alignment is a ValueError naming it, before any launch; one a whole alignment further is taken."""
    m = module(name)
    heads, values, page = dims(m)
    cache = m.alloc_cache(2, page, heads=heads, values=values, device=DEVICE)
    ids = torch.arange(2, device=DEVICE)
    for i, align in enumerate(m._FIELD_ALIGN):
        t = cache[i]
        pool = torch.zeros(t.numel() * t.element_size() + 32, dtype=torch.uint8, device=DEVICE)
        base = (-pool.data_ptr()) % 16                     # a 16-byte boundary in the pool
        for shift in (1, align // 2, align) if align > 1 else (1,):
            start = base + shift
            moved = pool[start:start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            odd = m.Cache(*(moved if j == i else u for j, u in enumerate(cache)))
            if shift % align:
                raises(rf"^cache\.{m.Cache._fields[i]}: starts at byte address 0x[0-9a-f]+, not a multiple of {align}",
                       m.reset_pages, odd, ids, page)
                raises(rf"^cache\.{m.Cache._fields[i]}: starts at", m.gather_dequant, odd, ids, page, **given(m))
            else:
                m.reset_pages(odd, ids, page)


def test_quantized_tensors_are_refused():
    """A quantized tensor's bytes are not plain elements to torch's views (the references' byte
    views of one crash the process), so none is taken as a cache tensor or a source."""
    m = module("dsv4_k")
    heads, values, page = dims(m)
    cache = m.alloc_cache(2, page, heads=heads, values=values, device="cpu")
    with warnings.catch_warnings():           # (torch deprecates quantized tensors)
        warnings.simplefilter("ignore")
        q = torch._make_per_tensor_quantized_tensor(cache.k_cache, 1.0, 0)
    ids = torch.arange(2)
    for fn in (m.gather_dequant_ref, m.reset_pages_ref, m.gather_dequant):
        raises(r"^cache\.k_cache: is a quantized tensor \(torch.quint8\)", fn, m.Cache(q), ids, page)


@pytest.mark.parametrize("name", [n for n in LAYOUTS if module(n).PAGE_SIZE_MULTIPLE > 1])
def test_a_page_size_off_the_layouts_multiple_is_named(name):
    """Readers and reset_pages name page_size as writers do when it is no multiple of the layout's,
    also where K's and V's tensors have one shape (they were named as each other's)."""
    m = module(name)
    heads, values, page = dims(m)
    cache = m.alloc_cache(2, page, heads=heads, values=values, device=DEVICE)
    ids = torch.arange(2, device=DEVICE)
    for wrong in (page - 1, page + 1, page + m.PAGE_SIZE_MULTIPLE // 2):
        told = rf"^page_size: page_size must be a multiple of {m.PAGE_SIZE_MULTIPLE}"
        raises(told, m.reset_pages, cache, ids, wrong)
        if "gather_dequant" in m.OPS:
            raises(told, m.gather_dequant, cache, ids, wrong, **given(m))


def test_the_source_that_disagrees_with_loc_and_the_cache_is_named():
    """Of two planes' sources of different shapes, the one that disagrees with loc's length and the
    cache's heads and values is named, whichever plane it is."""
    m, cache, x, loc = kv_setup()
    for bad, what in ((x[..., :32], r"\(8, 2, 32\)"), (torch.ones(8, 4, 64), r"\(8, 4, 64\)"),
                      (torch.ones(9, 2, 64), r"\(9, 2, 64\)")):
        bad = bad.to(DEVICE)
        raises(rf"^k: shape {what} differs from v's \(8, 2, 64\)$", m.quantize_store, bad, x, loc, cache, 32)
        raises(rf"^v: shape {what} differs from k's \(8, 2, 64\)$", m.quantize_store, x, bad, loc, cache, 32)


def test_another_layouts_cache_is_refused():
    a, b = module("mxfp8_kv"), module("mxfp8_kv_128x4")
    cache = b.alloc_cache(2, 128, heads=1, values=256, device=DEVICE)
    x = torch.ones(2, 1, 256, device=DEVICE)
    loc = torch.tensor([1, 2], device=DEVICE)
    raises(r"cache: is a .*mxfp8_kv_128x4\.Cache, not this layout's mxfp8_kv\.Cache", a.quantize_store, x, x, loc, cache, 128)
    raises(r"cache: is a .*mxfp8_kv_128x4\.Cache", a.gather_dequant, cache, loc, 128)
    a.quantize_store(x, x, loc, tuple(a.alloc_cache(2, 128, heads=1, values=256, device=DEVICE)), 128)   # a plain tuple is fine


def test_another_layouts_tensors_in_a_plain_tuple_are_refused():
    """A plain tuple of another layout's tensors with as many bytes a page: scales in more dims than
    this layout's that cut the bytes elsewhere (mxfp8_kv_128x4's (pages, heads, 2, 32, 4, 4) passed to
    mxfp8_kv, whose are (pages, heads, 32, 4, 8)) are refused; views that split this layout's dims,
    and views of fewer dims (a caller's own 2-D or logical view of swizzled scales), stay bytes."""
    a, b = module("mxfp8_kv"), module("mxfp8_kv_128x4")
    x = scaled_normal((3, 2, 256), generator(46)).to(DEVICE)
    loc = torch.tensor([1, 40, 100], device=DEVICE)
    theirs = tuple(b.alloc_cache(1, 128, heads=2, values=256, device=DEVICE))
    told = (r"^cache\.k_sf: shape \(1, 2, 2, 32, 4, 4\) torch.uint8 cuts its bytes where alloc_cache's "
            r"\(1, 2, 32, 4, 8\) torch.uint8 \(page_size=128, heads=2, values=256\) does not")
    raises(told, a.quantize_store, x, x, loc, theirs, 128)
    raises(told, a.gather_dequant, theirs, loc, 128)
    ours = a.alloc_cache(1, 128, heads=2, values=256, device=DEVICE)
    want = a.alloc_cache(1, 128, heads=2, values=256, device=DEVICE)
    a.quantize_store(x, x, loc, want, 128)
    for shape in ((1, -1), (1, 2, -1), (1, 2, 32, 32), (1, 2, 32, 4, 2, 4)):
        views = a.Cache(ours.k_cache, ours.k_sf.view(shape), ours.v_cache, ours.v_sf.view(shape))
        a.quantize_store(x, x, loc, views, 128)
    assert_same_cache(a, ours, want, "scales passed as views that merge or split their dims")
    got = b.alloc_cache(1, 128, heads=2, values=256, device=DEVICE)
    want = b.alloc_cache(1, 128, heads=2, values=256, device=DEVICE)
    b.quantize_store(x, x, loc, want, 128)
    logical = b.Cache(got.k_cache, got.k_sf.view(1, 2, 128, 8), got.v_cache, got.v_sf.view(1, 256, 8))
    b.quantize_store(x, x, loc, logical, 128)
    assert_same_cache(b, got, want, "128x4 scales passed as a logical (pages, heads, slots, groups) view")


@pytest.mark.parametrize("name", ["mxfp8_kv", "vllm_fp8_per_token_head"])
def test_a_records_view_of_a_wider_dtype_is_named_by_writers_and_readers(name):
    """A records tensor that gives heads and values, viewed as a wider dtype, counts values no
    geometry of the layout takes: the writer and the reader both name the cache tensor, not the
    source nor the size rule."""
    m = module(name)
    cache = m.alloc_cache(2, 32, heads=2, values=64, device=DEVICE)
    wide = cache._replace(**{m._RECORDS_NAME: getattr(cache, m._RECORDS_NAME).view(torch.uint8).view(torch.int32)})
    x = scaled_normal((3, 2, 64), generator(47)).to(DEVICE)
    loc = torch.tensor([1, 2, 3], device=DEVICE)
    told = rf"^cache\.{m._RECORDS_NAME}: shape \(2, 32, 2, \d+\) torch.int32 gives 2 head\(s\) of \d+ values, counted in 4-byte"
    raises(told, m.quantize_store, *[x] * len(m.PLANES), loc, wide, 32, **given(m))
    raises(told, m.gather_dequant, wide, loc, 32, **given(m))


@pytest.mark.parametrize("name", ["vllm_fp8", "mxfp8_v_seqblocked", "ds41_mla"])
def test_pdl_is_true_false_or_none(name):
    """`pdl` is a launch option of True, False or None: a truthy string is refused by each op and
    its reference (which ignores it otherwise), reset_pages too, in empty calls too."""
    m = module(name)
    heads, values, page = dims(m)
    cache = m.alloc_cache(2, page, heads=heads, values=values, device=DEVICE)
    x = scaled_normal((2, heads, values), generator(48)).to(DEVICE)
    loc = torch.tensor([1, 2], device=DEVICE)
    writer = "append" if "append" in m.OPS else "quantize_store"
    calls = {writer: (*sources(m, [x] * len(m.PLANES)), loc, cache, page),
             "gather_dequant": (cache, loc, page), "quantize": (x[:, 0],), "reset_pages": (cache, loc[:1], page)}
    empty = {writer: (*sources(m, [x[:0]] * len(m.PLANES)), loc[:0], cache, page), "gather_dequant": (cache, loc[:0], page),
             "quantize": (x[:0, 0],), "reset_pages": (cache, loc[:0], page)}
    for op, args in calls.items():
        if op not in m.OPS + ("reset_pages",):
            continue
        kwargs = given(m) if op in (writer, "gather_dequant") else {}
        for fn in (getattr(m, op), getattr(m, f"{op}_ref")):
            for call in (args, empty[op]):           # an empty call too: its launch is skipped, not its checks
                raises(r"^pdl: expected True, False or None .* got 'false' \(str\)$", fn, *call, pdl="false", **kwargs)
            fn(*args, pdl=False, **kwargs)


def test_lazy_views_sparse_tensors_and_written_tensors_that_require_grad_are_refused():
    m, cache, x, loc = kv_setup()
    raises(r"k: is a lazily negated or conjugated view", m.quantize_store, torch._neg_view(x), x, loc, cache, 32)
    raises(r"x: is a torch.sparse_coo tensor", m.quantize, x[:, 0].to_sparse())
    raises(r"cache.k_cache: requires grad", m.gather_dequant,
           m.Cache(cache.k_cache.float().requires_grad_().detach().requires_grad_(), *cache[1:]), loc, 32)
    out = torch.empty(loc.shape[0], 2, 64, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    raises(r"out \(k\): requires grad", m.gather_dequant, cache, loc, 32, out=(out, out.detach().clone()))
    m.quantize_store(x.requires_grad_(), x, loc, cache, 32)           # a source that requires grad is only read


@pytest.mark.parametrize("name", cases("dequantize"))
def test_dequantize_takes_only_views_that_name_the_same_bytes(name):
    """data: quantize's dtype or a uint8/int8 view; another 1-byte float format (e5m2, e4m3fnuz,
    e8m0) would name other values and is refused; scales likewise."""
    m = module(name)
    heads, values, page = dims(m)
    x = scaled_normal((4, values), generator(43)).to(DEVICE)
    data, scale = m.quantize(x)
    want = m.dequantize(data, scale)
    for view in (torch.uint8, torch.int8):
        assert_same_bytes(m.dequantize(data.view(view), scale), want, f"data as {view}")
    for other in (torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e8m0fnu):
        if other != data.dtype:
            raises(r"data: expected .* records", m.dequantize, data.view(other), scale)
    if scale.element_size() == 1:
        for view in m._DEQUANTIZE_SCALE_DTYPES:
            assert_same_bytes(m.dequantize(data, scale.view(view)), want, f"scale as {view}")
        raises(r"scale: expected", m.dequantize, data, scale.view(torch.float8_e5m2))
    else:
        raises(r"scale: expected float32 scales", m.dequantize, data, scale.view(torch.int32))


def test_references_write_nothing_when_no_row_lands():
    """A call whose every slot is skipped (or with no rows) leaves the cache as it was, in the
    reference as in the kernel (fp32 scales: ds32_indexer)."""
    m = module("ds32_indexer")
    heads, values, page = dims(m)
    gen = generator(44)
    cache = fresh_cache(m, 2, page, heads, values, gen)
    before = clone(m, cache)
    k = scaled_normal((3, values), gen).to(DEVICE)
    for rows, loc in ((k, torch.tensor([-1, -5, 10 ** 6], device=DEVICE)), (k[:0], torch.zeros(0, dtype=torch.int64, device=DEVICE))):
        m.quantize_store_ref(rows, loc, cache, page)
        m.quantize_store(rows, loc, cache, page)
        assert_same_cache(m, cache, before, "no row lands")
    assert m.quantize_ref(torch.randn(0, values, device=DEVICE))[1].shape == (0, m.geometry(page, 1, values)["DENSE_SCALES"])


def test_compat_functions_name_their_own_parameters():
    """A compat function's argument errors name its own parameters (sfk, vLLM's slot_mapping and
    key_cache, also where the text names another argument) or the expression it passed (x.data); a
    parameter that cannot give an argument computed from it (a None or 1-D cache's shape[1]) is
    named in a ValueError too."""
    mx = pytest.importorskip("generated.compat.sglang_mxfp8")
    flash = pytest.importorskip("generated.compat.vllm_flash")
    m, cache, x, loc = kv_setup()
    raises(r"^sfk: holds 1 pages", mx.quant_store_kv_mxfp8, x, x, loc, cache.k_cache, cache.v_cache, cache.k_sf[:1],
           cache.v_sf, 32)
    raises(r"^v_cache: cannot take v_cache\.shape\[1\] from a NoneType", mx.update_mxfp8_v_cache_seqblocked, x, loc, None,
           cache.v_sf)
    raises(r"^x: cannot take x\.data from a tuple", mx.from_mxfp8, ())
    raises(r"^x\.data: expected", mx.from_mxfp8, mx.MXFP8Tensor(torch.zeros(3, 32), torch.zeros(3, 1, dtype=torch.uint8)))
    v = module("vllm_fp8")
    vc = v.alloc_cache(2, 16, heads=2, values=64, device=DEVICE)
    rows = torch.ones(3, 2, 64, device=DEVICE)
    slots = torch.tensor([1, 2, 3], device=DEVICE)
    scales = [torch.ones(1, device=DEVICE)] * 2
    raises(r"^slot_mapping: dtype torch.float32", flash.reshape_and_cache_flash, rows, rows, vc.k_cache, vc.v_cache,
           slots.float(), "fp8", *scales)
    raises(r"^key_cache: cannot take key_cache\.shape\[1\] from a torch.uint8 tensor of shape \(7,\)",
           flash.reshape_and_cache_flash, rows, rows, torch.zeros(7, dtype=torch.uint8, device=DEVICE), vc.v_cache, slots, "fp8",
           *scales)
    raises(r"^value: ", flash.reshape_and_cache_flash, rows, rows[:, :1], vc.k_cache, vc.v_cache, slots, "fp8", *scales)
    # plain names inside the text too, where it names an argument by them (k's, overlaps k in memory)
    raises(r"^value: shape \(3, 1, 64\) differs from key's \(3, 2, 64\)$", flash.reshape_and_cache_flash, rows,
           torch.ones(3, 1, 64, device=DEVICE), vc.k_cache, vc.v_cache, slots, "fp8", *scales)
    inside = vc.k_cache.view(torch.uint8).view(-1)[:rows.numel() * 4].view(torch.float32).view(rows.shape)
    raises(r"^key_cache: overlaps key in memory", flash.reshape_and_cache_flash, inside, rows, vc.k_cache, vc.v_cache,
           slots, "fp8", *scales)


def test_clear_plans_takes_a_changed_launch_shape(monkeypatch):
    """README: change LAUNCH, call clear_plans(), and later calls launch with the new shape (the
    memoized launch shapes are forgotten with the plans)."""
    m = module("mxfp8_kv")
    before = m._launch_shape("quantize", 128)
    monkeypatch.setitem(m.LAUNCH, "quantize", {**m.LAUNCH["quantize"], "elements": 512, "num_warps": 8})
    m.clear_plans()
    after = m._launch_shape("quantize", 128)
    assert (after["BLOCK_T"], after["num_warps"]) == (4, 8) != (before["BLOCK_T"], before["num_warps"])
    monkeypatch.undo()
    m.clear_plans()
    assert m._launch_shape("quantize", 128) == before


def test_vllm_flashinfer_halves_are_written_as_contiguous_caches():
    """vLLM's FlashInfer backend passes kv_cache[:, 0] and kv_cache[:, 1] of a (num_blocks, 2, ...)
    tensor to reshape_and_cache_flash: every other page of its storage. They get the bytes
    separate contiguous caches get. Its HND views (heads before slots in each page) are no layout's
    order: the ValueError names the caller's tensor and shows its strides, and nothing is written."""
    flash = pytest.importorskip("generated.compat.vllm_flash")
    kv = torch.zeros(4, 2, 16, 2, 64, dtype=torch.uint8, device=DEVICE)
    key = scaled_normal((3, 2, 64), generator(47)).to(DEVICE)
    value = scaled_normal((3, 2, 64), generator(48)).to(DEVICE)
    slots = torch.tensor([0, 5, 37], device=DEVICE)
    scale = torch.full((1,), 0.25, device=DEVICE)
    flash.reshape_and_cache_flash(key, value, kv[:, 0], kv[:, 1], slots, "fp8", scale, scale)
    k_cache, v_cache = torch.zeros(2, 4, 16, 2, 64, dtype=torch.uint8, device=DEVICE)
    flash.reshape_and_cache_flash(key, value, k_cache, v_cache, slots, "fp8", scale, scale)
    assert k_cache.any() and torch.equal(kv[:, 0], k_cache) and torch.equal(kv[:, 1], v_cache)
    hnd = torch.zeros(4, 2, 2, 16, 64, dtype=torch.uint8, device=DEVICE)     # (num_blocks, 2, heads, slots, dim)
    raises(r"^key_cache: shape \(4, 16, 2, 64\) with strides \(4096, 64, 1024, 1\) is not a tensor of whole "
           r"contiguous pages; ",
           flash.reshape_and_cache_flash, key, value, hnd[:, 0].transpose(1, 2), hnd[:, 1].transpose(1, 2), slots,
           "fp8", scale, scale)
    assert not hnd.any()


def test_vllm_compat_writers_count_tokens_as_vllm_does():
    """vLLM's writers take their token count from slot_mapping (reshape_and_cache_flash,
    concat_and_cache_mla: key rows padded for CUDA graphs follow) or from k (indexer_k_quant_and_cache):
    rows or entries past it are not read, and the bytes are those of the trimmed call; fewer are an
    error naming the short tensor."""
    flash = pytest.importorskip("generated.compat.vllm_flash")
    mla = pytest.importorskip("generated.compat.vllm_mla")
    ds32 = pytest.importorskip("generated.compat.vllm_ds32")
    gen = generator(46)
    slots = torch.tensor([3, 17, 1], device=DEVICE)
    v = module("vllm_fp8")
    want, got = (v.alloc_cache(2, 16, heads=2, values=64, device=DEVICE) for _ in range(2))
    rows = scaled_normal((5, 2, 64), gen).to(DEVICE)          # 3 real rows, 2 of padding
    scales = [torch.full((1,), 0.5, device=DEVICE)] * 2
    flash.reshape_and_cache_flash(rows[:3], rows[:3].flip(1), *want, slots, "fp8", *scales)
    flash.reshape_and_cache_flash(rows, rows.flip(1), *got, slots, "fp8", *scales)
    assert_same_cache(v, got, want, "reshape_and_cache_flash with padded key and value rows")
    raises(r"^key: has 2 along its first dim, fewer than the 3 tokens slot_mapping counts", flash.reshape_and_cache_flash,
           rows[:2], rows[:2], *got, slots, "fp8", *scales)
    # an error about a trimmed tensor says its shapes are of the rows read
    raises(r"^key: shape \(3, 1, 64\) differs from value's \(3, 2, 64\) \(shapes as read: key's first 3 of its 5 rows, "
           r"one per token slot_mapping counts; value's first 3 of its 5 rows, one per token slot_mapping counts\)$",
           flash.reshape_and_cache_flash, rows[:, :1], rows, *got, slots, "fp8", *scales)
    raises(r"^key: shape \(3, 1, 64\) differs from value's \(3, 2, 64\) \(shapes as read: key's first 3 of its 5 rows, "
           r"one per token slot_mapping counts\)$", flash.reshape_and_cache_flash, rows[:, :1], rows[:3], *got, slots,
           "fp8", *scales)
    m = module("vllm_ds_mla")
    want, got = (torch.zeros(2, 16, 656, dtype=torch.uint8, device=DEVICE) for _ in range(2))
    kv_c, k_pe = scaled_normal((5, 512), gen).to(DEVICE), scaled_normal((5, 64), gen).to(DEVICE)
    mla.concat_and_cache_mla(kv_c[:3], k_pe[:3], want, slots, "fp8_ds_mla", None)
    mla.concat_and_cache_mla(kv_c, k_pe, got, slots, "fp8_ds_mla", None)
    assert_same_cache(m, (got,), (want,), "concat_and_cache_mla with padded rows")
    mla.concat_and_cache_ds_mla(kv_c, k_pe, got, slots)
    assert_same_cache(m, (got,), (want,), "concat_and_cache_ds_mla with padded rows")
    raises(r"^kv_c: .*\(shapes as read: kv_c's first 3 of its 5 rows, one per token slot_mapping counts\)$",
           mla.concat_and_cache_mla, kv_c[:, :256], k_pe, got, slots, "fp8_ds_mla", None)
    ind = module("ds32_indexer")
    want, got = (torch.zeros(2, 16, 132, dtype=torch.uint8, device=DEVICE) for _ in range(2))
    k = scaled_normal((3, 128), gen).to(DEVICE)
    padded = torch.tensor([3, 17, 1, 5, 9], device=DEVICE)
    ds32.indexer_k_quant_and_cache(k, want, slots, 128, "")
    ds32.indexer_k_quant_and_cache(k, got, padded, 128, "")
    assert_same_cache(ind, (got,), (want,), "indexer_k_quant_and_cache with slot entries past k's rows")
    raises(r"^slot_mapping: has 2 along its first dim, fewer than the 3 tokens k counts", ds32.indexer_k_quant_and_cache,
           k, got, slots[:2], 128, "")
    raises(r"^slot_mapping: expected 1 dims, got shape \(3, 1\) \(shapes as read: slot_mapping's first 3 of its 5 rows, "
           r"one per token k counts\)$", ds32.indexer_k_quant_and_cache, k, got, padded[:, None], 128, "")


def test_compat_writer_takes_e8m0_scale_tensors_as_the_seed_did():
    mx = pytest.importorskip("generated.compat.sglang_mxfp8")
    m, cache, x, loc = kv_setup()
    odd = clone(m, cache)
    mx.quant_store_kv_mxfp8(x, x, loc, cache.k_cache, cache.v_cache, cache.k_sf, cache.v_sf, 32)
    mx.quant_store_kv_mxfp8(x, x, loc, odd.k_cache, odd.v_cache, odd.k_sf.view(torch.float8_e8m0fnu),
                            odd.v_sf.view(torch.float8_e8m0fnu), 32)
    assert_same_cache(m, odd, cache, "e8m0 scale tensors")


def test_compat_writers_refuse_caches_the_seed_would_fill_otherwise():
    """The seed converts codes to its cache's own dtype, so an fp8 cache of another format than
    e4m3fn would get other codes: refused, named in the seed's terms (uint8 takes the bytes); and
    the seq-blocked append refuses a scale buffer of another shape, as the seed asserts."""
    mx = pytest.importorskip("generated.compat.sglang_mxfp8")
    m, cache, x, loc = kv_setup()
    for other in (torch.float8_e5m2, torch.float8_e4m3fnuz):
        raises(rf"^v_cache: dtype {other}, but this layout reads and writes torch.float8_e4m3fn there", mx.quant_store_kv_mxfp8,
               x, x, loc, cache.k_cache, cache.v_cache.view(other), cache.k_sf, cache.v_sf, 32)
    as_bytes = clone(m, cache)
    mx.quant_store_kv_mxfp8(x, x, loc, *(t.view(torch.uint8) for t in (as_bytes.k_cache, as_bytes.v_cache)),
                            as_bytes.k_sf, as_bytes.v_sf, 32)
    mx.quant_store_kv_mxfp8(x, x, loc, cache.k_cache, cache.v_cache, cache.k_sf, cache.v_sf, 32)
    assert_same_cache(m, as_bytes, cache, "uint8 caches")
    sb = module("mxfp8_v_seqblocked")
    c = sb.alloc_cache(2, 64, heads=2, values=32, device=DEVICE)
    raises(r"^sfv: shape \(2, 2, 2, 32\) torch.uint8, but mxfp8_v_seqblocked\.alloc_cache gives \(2, 2, 32, 2\)",
           mx.update_mxfp8_v_cache_seqblocked, x[:, :, :32], loc, c.v_cache, c.v_sf.transpose(2, 3).contiguous())
    raises(r"^v_cache: dtype torch.float8_e5m2", mx.update_mxfp8_v_cache_seqblocked, x[:, :, :32], loc,
           c.v_cache.view(torch.float8_e5m2), c.v_sf)


def _token_major(t: torch.Tensor, slots: int) -> torch.Tensor:
    """A page-major cache tensor as a serving stack may keep it: its first dims (pages, page_size)
    merged into slots where it has them, else (slots, rest) where its bytes divide (else as it is)."""
    if t.dim() >= 3 and t.shape[0] * t.shape[1] == slots:
        return t.view(slots, *t.shape[2:])
    return t.view(slots, -1) if t.numel() % slots == 0 else t


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_raw_cache_takes_token_major_and_flat_tensors(name):
    """A RawCache's tensors may be token-major or flat forms of the cache's bytes (as a serving stack
    keeps them): every op writes, reads and resets the bytes it does through the page-major Cache,
    replays included. A plain Cache refuses those forms, and a RawCache a tensor whose first dim
    counts neither pages nor slots of the page size given."""
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(43)
    base = fresh_cache(m, 3, page, heads, values, gen)
    # (where heads or values come from the records tensor's last dims, it keeps them: token-major
    # where its pages are, else page-major; flat, it would give none)
    free = m.HEADS is None or m.VALUES is None
    forms = {"token-major": lambda i, t: t if i == m._RECORDS_INDEX and free and t.shape[1] != page
             else _token_major(t, 3 * page),
             "flat": lambda i, t: t if i == m._RECORDS_INDEX and free else t.view(-1)}
    rows = [scaled_normal((4, heads, values), gen).to(DEVICE) for _ in m.PLANES]
    loc = torch.tensor([1, page + 2, 2 * page + 3, 5], device=DEVICE)
    writer = m.quantize_store if "quantize_store" in m.OPS else getattr(m, "append", None)
    want = clone(m, base)
    if writer is not None:
        writer(*sources(m, rows), loc, want, page, **given(m))
    tried = []
    for form, shaped in forms.items():
        got = clone(m, base)
        raw = m.RawCache(*(shaped(i, t) for i, t in enumerate(got)))
        if all(a.shape == b.shape for a, b in zip(raw, got)):
            continue                     # (no tensor of the layout has this form: bytes per page not per slot)
        tried.append(form)
        if any(t.shape[0] != 3 for t in raw):
            # (a token-major view of (pages, page bytes) tensors is a cache of 1-slot pages)
            raises(r"^cache\.\w+: shape .* is not \(num_pages, \.\.\.\) of|^page_size: cache\.\w+ was allocated for "
                   r"page_size=1 ", m.reset_pages, m.Cache(*raw),
                   torch.tensor([0], device=DEVICE), page)
        for _ in range(2):               # the second call replays where plans exist
            if writer is not None:
                writer(*sources(m, rows), loc, raw, page, **given(m))
        assert_same_cache(m, got, want, f"{name} written through a {form} RawCache")
        assert_same_reads(m, raw, want, loc, page, f"{name} read through a {form} RawCache")
        m.reset_pages(raw, torch.tensor([1], device=DEVICE), page)
        assert all(int(t.view(torch.uint8).view(3, -1)[1].count_nonzero()) == 0 for t in got), form
    assert tried, "no form differs from the page-major cache"
    four = m.alloc_cache(4, page, heads=heads, values=values, device=DEVICE)
    for t in four:
        random_bytes(t, gen)
    raises(r"^page_size: cache\.\w+ was allocated for page_size=%d .* but page_size=%d was passed" % (page, 2 * page),
           m.reset_pages, m.RawCache(*four), torch.tensor([0], device=DEVICE), 2 * page)


def test_compat_writer_takes_sglangs_token_major_caches_and_flat_scales():
    """sglang calls quant_store_kv_mxfp8 on its pool's token-major views (kc8.view(-1, h_kv, D)) with
    e8m0 scale buffers, page-major or flat, at the default page_size=128, as the seed takes them: the
    bytes are the page-major call's. A token-major cache that is no whole number of 128-slot pages
    is refused, naming the cache parameter."""
    mx = pytest.importorskip("generated.compat.sglang_mxfp8")
    m = module("mxfp8_kv")
    gen = generator(44)
    pages, page, heads, values = 3, 128, 2, 64
    base = fresh_cache(m, pages, page, heads, values, gen)
    k, v = (scaled_normal((6, heads, values), gen).to(DEVICE) for _ in range(2))
    loc = torch.tensor([0, 1, 127, 128, 300, 383], device=DEVICE)
    want = clone(m, base)
    m.quantize_store(k, v, loc, want, page)
    for form in ("page-major e8m0 scales", "flat e8m0 scales"):
        got = clone(m, base)
        sf = [t.view(torch.float8_e8m0fnu) for t in (got.k_sf, got.v_sf)]
        if form.startswith("flat"):
            sf = [t.view(-1) for t in sf]
        mx.quant_store_kv_mxfp8(k, v, loc, got.k_cache.view(-1, heads, values), got.v_cache.view(-1, heads, values), *sf)
        assert_same_cache(m, got, want, f"token-major caches, {form}")
    four = m.alloc_cache(4, 32, heads=heads, values=values, device=DEVICE)     # one page of 128 slots in bytes
    raises(r"^page_size: sfk was allocated for page_size=32 \(shape \(4, 2, 32, 1, 2\): 4 pages of 128 bytes\), but "
           r"page_size=128 was passed", mx.quant_store_kv_mxfp8, k, v, loc % 128,
           four.k_cache.view(-1, heads, values), four.v_cache.view(-1, heads, values), four.k_sf, four.v_sf)
    small = m.alloc_cache(5, 32, heads=heads, values=values, device=DEVICE)
    raises(r"^k_cache: .* not a whole number of 16384-byte pages \(page_size=128\)", mx.quant_store_kv_mxfp8, k, v,
           loc % 160, small.k_cache.view(-1, heads, values), small.v_cache.view(-1, heads, values), small.k_sf.view(-1),
           small.v_sf.view(-1))


COMPILED_ON_CPU = """
import torch
import generated.mxfp8_kv as kv, generated.mxfp8_v_seqblocked as vs
cache = kv.alloc_cache(2, 32, heads=1, values=64)
x, ids = torch.ones(2, 1, 64), torch.tensor([1, 2])
calls = [("quantize", lambda: kv.quantize(torch.ones(2, 64))),
         ("dequantize", lambda: kv.dequantize(*kv.quantize_ref(torch.ones(2, 64)))),
         ("quantize_store", lambda: kv.quantize_store(x, x, ids, cache, 32)),
         ("gather_dequant", lambda: kv.gather_dequant(cache, ids, 32)),
         ("reset_pages", lambda: kv.reset_pages(cache, ids, 32)),
         ("append", lambda: vs.append(x, ids, vs.alloc_cache(2, 32, heads=1, values=64), 32))]
for op, call in calls:
    try:
        call()
        print(op, "returned")
    except ValueError as err:
        print(op, "ValueError", err)
"""


def test_cpu_tensors_for_compiled_kernels_are_refused_before_launch():
    """Without the interpreter the kernels are compiled for a GPU: CPU tensors get a ValueError naming
    the argument and the way out (a launch would fail inside Triton, 'no active driver')."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILED_ON_CPU], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ops = ("quantize", "dequantize", "quantize_store", "gather_dequant", "reset_pages", "append")
    lines = proc.stdout.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [[op, "ValueError"] for op in ops]
    for line, name in zip(lines, ("x", "data", "loc", "token_ids", "page_ids", "loc")):
        assert line.split(" ", 2)[2].startswith(f"{name}: the tensors are on the CPU"), line
        module_name = "generated.mxfp8_v_seqblocked" if line.startswith("append") else "generated.mxfp8_kv"
        assert f"TRITON_INTERPRET=1 before importing the module, or call {module_name}'s _ref functions" in line, line
