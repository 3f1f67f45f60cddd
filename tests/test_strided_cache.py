"""Page-strided cache views: each op writes and reads through them the bytes it does through
alloc_cache's contiguous tensors, and never a byte between their pages.

Two arrangements of every layout's Cache, both of poisoned workspaces:
- "halves": the fields of one shape and dtype as [:, j] of one (num_pages, fields + 1, ...) tensor,
  as vLLM's FlashInfer backend passes kv_cache[:, 0] and kv_cache[:, 1] of (num_blocks, 2, ...),
  the last entry a gap no op may touch;
- "pages": every field side by side in each page of one uint8 workspace, a gap after each (fields
  of other shapes interleaved, as in a cache padded per page).
The kernels run on the views and the references on contiguous copies; the references on the views
too. On a GPU each op's second call replays its launch plan (the replay's own aliasing checks)."""
import pytest
import torch

from tests.conftest import DEVICE, ON_GPU
from tests.corpus import adversarial_rows, generator, random_bytes, scaled_normal
from tests.harness import (assert_same_bytes, assert_same_cache, cases, dims, fresh_cache, given, module,
                           pairs, plane_rows, sources, unique_slots)

ARRANGEMENTS = ("halves", "pages")
GAP = 16              # bytes after each field's page in "pages" (a multiple of every field's alignment)


def _groups(cache) -> list:
    """The Cache field indices grouped by shape and dtype, in field order."""
    groups = {}
    for i, t in enumerate(cache):
        groups.setdefault((tuple(t.shape), t.dtype), []).append(i)
    return list(groups.values())


def workspaces_for(cache, arrangement: str, gap: int = GAP) -> list:
    """The tensors an arrangement's views of `cache` lie in: per group of like fields a (num_pages,
    fields + 1, ...) tensor ("halves"), or one uint8 row per page of every field's bytes, each followed
    by `gap` bytes ("pages")."""
    if arrangement == "halves":
        return [torch.empty((cache[g[0]].shape[0], len(g) + 1, *cache[g[0]].shape[1:]), dtype=cache[g[0]].dtype,
                            device=DEVICE) for g in _groups(cache)]
    spans = [t[0].numel() * t.element_size() for t in cache]
    return [torch.empty((cache[0].shape[0], sum(spans) + gap * len(spans)), dtype=torch.uint8, device=DEVICE)]


def views_in(cache, workspaces: list, arrangement: str, gap: int = GAP) -> tuple:
    """Page-strided views shaped as cache's tensors, laid out in `workspaces` as the arrangement says."""
    views = [None] * len(cache)
    if arrangement == "halves":
        for work, fields in zip(workspaces, _groups(cache), strict=True):
            for j, i in enumerate(fields):
                views[i] = work[:, j]
        return tuple(views)
    start = 0
    for i, t in enumerate(cache):
        span = t[0].numel() * t.element_size()
        views[i] = workspaces[0][:, start:start + span].view(t.dtype).view(t.shape)
        start += span + gap
    return tuple(views)


def strided_copy(m, cache, arrangement: str, gen, gap: int = GAP) -> tuple:
    """(workspaces, a Cache of page-strided views holding cache's bytes), the workspaces' other bytes random."""
    workspaces = [random_bytes(w, gen) for w in workspaces_for(cache, arrangement, gap)]
    views = views_in(cache, workspaces, arrangement, gap)
    for v, t in zip(views, cache):
        assert not v.is_contiguous()
        v.copy_(t)
    return workspaces, m.Cache(*views)


def assert_only_pages_written(workspaces, before, want, arrangement: str, what: str) -> None:
    """The workspaces hold `want`'s bytes in the views and `before`'s everywhere else."""
    expected = [w.clone() for w in before]
    for v, t in zip(views_in(want, expected, arrangement), want):
        v.copy_(t)
    for i, (got, exp) in enumerate(zip(workspaces, expected)):
        assert_same_bytes(got, exp, f"{what}: workspace {i} (pages and the bytes between them)")


def rows(m, tokens: int, heads: int, values: int, gen) -> torch.Tensor:
    """(tokens, heads, values) bf16: some adversarial rows (NaN, inf, ties, zero groups), the rest random."""
    adv = adversarial_rows(values, gen, torch.float32)[: tokens * heads // 3]
    x = torch.cat([adv, scaled_normal((tokens * heads - adv.shape[0], values), gen, torch.float32)])
    return x[torch.randperm(x.shape[0], generator=gen)].view(tokens, heads, values).to(torch.bfloat16).to(DEVICE)


def _twice(call) -> None:
    """Call twice: on a GPU the second call replays the first's launch plan."""
    call()
    call()


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("name", cases("quantize_store"))
def test_quantize_store_gather_and_reset_through_strided_views(name, arrangement):
    m = module(name)
    gen = generator(70)
    heads, values, page = dims(m)
    tokens = 24
    num_pages = -(-tokens * 3 // 2 // page) + 1
    num_slots = num_pages * page
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    workspaces, views = strided_copy(m, cache, arrangement, gen)
    before = [w.clone() for w in workspaces]
    extra = [-1, num_slots] + ([m.SINK_SLOT] if m.SINK_SLOT is not None else [])
    loc = unique_slots(num_slots, tokens, gen, extra).to(DEVICE)
    srcs = sources(m, [rows(m, tokens, heads, values, gen) for _ in m.PLANES])
    ref_views = strided_copy(m, cache, arrangement, gen)[1]
    _twice(lambda: m.quantize_store(*srcs, loc, views, page, **given(m)))
    m.quantize_store_ref(*srcs, loc, cache, page, **given(m))
    m.quantize_store_ref(*srcs, loc, ref_views, page, **given(m))
    assert_same_cache(m, views, cache, f"{name}.quantize_store ({arrangement})")
    assert_same_cache(m, ref_views, cache, f"{name}.quantize_store_ref ({arrangement})")
    assert_only_pages_written(workspaces, before, cache, arrangement, f"{name}.quantize_store ({arrangement})")

    if "gather_dequant" in m.OPS:
        ids = torch.cat([loc, torch.tensor([-3, num_slots + 1], device=DEVICE)])
        got = []
        _twice(lambda: got.append(m.gather_dequant(views, ids, page, **given(m))))
        want = m.gather_dequant_ref(cache, ids, page, **given(m))
        for plane, a, b in pairs(m, got[-1], want) + pairs(m, m.gather_dequant_ref(views, ids, page, **given(m)), want):
            assert_same_bytes(a, b, f"{name}.gather_dequant ({arrangement}, {plane})")

    ids = torch.tensor([num_pages - 1, -1, 0, num_pages], device=DEVICE)
    _twice(lambda: m.reset_pages(views, ids, page))
    m.reset_pages_ref(cache, ids, page)
    m.reset_pages_ref(ref_views, ids, page)
    assert_same_cache(m, views, cache, f"{name}.reset_pages ({arrangement})")
    assert_same_cache(m, ref_views, cache, f"{name}.reset_pages_ref ({arrangement})")
    assert_only_pages_written(workspaces, before, cache, arrangement, f"{name}.reset_pages ({arrangement})")


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("name", cases("append"))
def test_append_through_strided_views(name, arrangement):
    """A prefill into random slots, then decode steps whose magnitudes grow block exponents (kept rows
    rescaled in place), through page-strided views."""
    m = module(name)
    gen = generator(71)
    heads, values, page = dims(m)
    num_pages = 4
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    m.reset_pages_ref(cache, torch.arange(num_pages, device=DEVICE), page)
    workspaces, views = strided_copy(m, cache, arrangement, gen)
    before = [w.clone() for w in workspaces]
    ref_views = strided_copy(m, cache, arrangement, gen)[1]
    starts = [0, page + 3, 3 * page - 5]
    steps = [torch.tensor([s + t for s in starts for t in range(6)] + [-1])]
    steps += [torch.tensor([s + 6 + i for s in starts]) for i in range(3)]
    for i, loc in enumerate(steps):
        v = (scaled_normal((loc.numel(), heads, values), gen, torch.float32) * 4.0 ** i).to(torch.bfloat16).to(DEVICE)
        loc = loc.to(DEVICE)
        m.append(*plane_rows(m, v), loc, views, page)
        m.append_ref(*plane_rows(m, v), loc, cache, page)
        m.append_ref(*plane_rows(m, v), loc, ref_views, page)
        assert_same_cache(m, views, cache, f"{name}.append step {i} ({arrangement})")
        assert_same_cache(m, ref_views, cache, f"{name}.append_ref step {i} ({arrangement})")
    assert_only_pages_written(workspaces, before, cache, arrangement, f"{name}.append ({arrangement})")


def _word_read_layouts() -> list:
    """Layouts whose gather reads token-group scales as 4-byte words from alloc_cache's tensors at
    pages of 4 blocks, and whose fields take any byte alignment."""
    names = []
    for name in cases("gather_dequant"):
        m = module(name)
        if m._WORD_SCALES is None or set(m._FIELD_ALIGN) != {1}:
            continue
        heads, values, _ = dims(m)
        page = 4 * m.SCALE_GROUP_TOKENS
        cache = m.alloc_cache(1, page, heads=heads, values=values)
        if m._scale_word_bytes(cache, m._check_cache(cache, page, heads, values, cache[0].device)[0], page) == 4:
            names.append(name)
    return names


@pytest.mark.parametrize("name", _word_read_layouts())
def test_word_reads_follow_the_page_stride(name):
    """Token-group scales are read as words only where every page of the view starts word-aligned: a
    view whose pages lie an odd number of bytes apart is read byte by byte, to the same values."""
    m = module(name)
    gen = generator(72)
    heads, values, _ = dims(m)
    page = 4 * m.SCALE_GROUP_TOKENS                       # a 4-byte word of block exponents per value index
    cache = fresh_cache(m, 3, page, heads, values, gen)
    geo, _ = m._check_cache(cache, page, heads, values, cache[0].device)
    _, views = strided_copy(m, cache, "pages", gen, gap=1)
    odd, _ = m._check_cache(views, page, heads, values, cache[0].device)
    assert m._scale_word_bytes(cache, geo, page) == 4 and m._scale_word_bytes(views, odd, page) == 0
    ids = torch.arange(-1, 3 * page + 1, device=DEVICE)
    for plane, a, b in pairs(m, m.gather_dequant(views, ids, page, **given(m)), m.gather_dequant_ref(cache, ids, page, **given(m))):
        assert_same_bytes(a, b, f"{name}.gather_dequant, pages an odd number of bytes apart ({plane})")


def _layout_with_scale_buffer():
    """A layout with a Cache field of 4-byte alignment (fp32 scales, in a buffer of their own or inline)."""
    for name in cases("quantize_store"):
        m = module(name)
        if any(a == 4 for a in m._FIELD_ALIGN):
            return name
    raise AssertionError("no layout with an fp32 scale field")


def test_strided_views_that_no_kernel_can_address_are_refused():
    """Views that are not whole contiguous pages, pages closer than a page or misaligned for the
    field's typed loads, strided tensors that do not count pages first, and two fields' pages that
    meet: each a ValueError naming the field, before any launch."""
    m = module("vllm_fp8")
    heads, values, page = 2, 64, 16
    cache = m.alloc_cache(4, page, heads=heads, values=values, device=DEVICE)
    k = torch.randn(3, heads, values, device=DEVICE)
    loc = torch.arange(3, device=DEVICE)
    scales = given(m)
    kv = torch.zeros(4, 2, page, heads, values, dtype=torch.uint8, device=DEVICE)

    def refused(match: str, *fields):
        with pytest.raises(ValueError, match=match):
            m.quantize_store(k, k, loc, m.Cache(*fields), page, **scales)

    refused(r"cache\.v_cache: shape \(4, 16, 1, 64\) .* is not a tensor of whole contiguous pages",
            cache.k_cache, cache.v_cache[:, :, :1])                         # one head of each page
    refused(r"cache\.k_cache: .* is not a tensor of whole contiguous pages",
            cache.k_cache.transpose(1, 2).contiguous().transpose(1, 2), cache.v_cache)   # HND storage
    close = torch.zeros(4 * page * heads * values, dtype=torch.uint8, device=DEVICE)
    overlapping = close.as_strided((4, page, heads, values), (page * heads * values // 2, heads * values, values, 1))
    refused(r"cache\.k_cache: its pages are 1024 bytes apart .* fewer than the 2048 bytes of a page", overlapping,
            cache.v_cache)
    refused(r"cache\.k_cache: overlaps cache\.v_cache in memory", kv[:, 0], kv[:, 0])
    tokens = torch.zeros(4 * page * 2, heads, values, dtype=torch.uint8, device=DEVICE)[::2]
    with pytest.raises(ValueError, match=r"cache\.k_cache: a token-major tensor \(shape \(64, 2, 64\), strides "
                                         r"\(256, 64, 1\)\) must be contiguous"):
        m.quantize_store(k, k, loc, m.RawCache(tokens, cache.v_cache), page, **scales)
    # a page-strided view read with another page size: the page size it holds is named, as for a contiguous one
    with pytest.raises(ValueError, match=r"^page_size: cache\.k_cache was allocated for page_size=16 .* but page_size=32 was passed"):
        m.quantize_store(k, k, loc, m.Cache(kv[:, 0], kv[:, 1]), 2 * page, **scales)
    # (the reference refuses them alike)
    with pytest.raises(ValueError, match=r"cache\.k_cache: overlaps cache\.v_cache"):
        m.quantize_store_ref(k, k, loc, m.Cache(kv[:, 0], kv[:, 0]), page, **scales)

    # an fp32 scale field's pages 2 bytes further apart than a multiple of 4, as a (pages, bytes) uint8 view
    name = _layout_with_scale_buffer()
    s = module(name)
    sh, sv, sp = dims(s)
    fields = list(s.alloc_cache(3, sp, heads=sh, values=sv, device=DEVICE))
    field = s._FIELD_ALIGN.index(4)
    span = fields[field][0].numel() * fields[field].element_size()
    fields[field] = torch.zeros(3, span + 2, dtype=torch.uint8, device=DEVICE)[:, :span]
    with pytest.raises(ValueError, match=rf"cache\.{s.Cache._fields[field]}: its pages are {span + 2} bytes apart .* "
                                         r"not a multiple of 4"):
        s.gather_dequant(s.Cache(*fields), torch.arange(2, device=DEVICE), sp, **given(s))


def test_interleaved_fields_of_other_shapes_that_meet_are_refused():
    """Fields side by side in each page are apart only while their bytes do not meet: one starting
    inside the other's page is refused (the exact page-interval check, not a span test)."""
    m = module("vllm_fp8")
    heads, values, page = 2, 64, 16
    span = page * heads * values
    work = torch.zeros(4, 2 * span + 64, dtype=torch.uint8, device=DEVICE)
    k = work[:, :span].view(4, page, heads, values)
    apart = work[:, span + 64:].view(4, page, heads, values)
    into = work[:, span - 64:2 * span - 64].view(4, page, heads, values)      # reaches 64 bytes into k's pages
    x = torch.randn(3, heads, values, device=DEVICE)
    loc = torch.arange(3, device=DEVICE)
    m.quantize_store(x, x, loc, m.Cache(k, apart), page, **given(m))
    with pytest.raises(ValueError, match=r"cache\.k_cache: overlaps cache\.v_cache"):
        m.quantize_store(x, x, loc, m.Cache(k, into), page, **given(m))
    # the next page's k bytes, one page stride on: apart from v's last page but not from its first
    shifted = work.view(-1)[2 * span + 64:].as_strided((3, page, heads, values), (2 * span + 64, heads * values, values, 1))
    with pytest.raises(ValueError, match=r"overlaps"):
        m.gather_dequant(m.Cache(k[:3], shifted), loc, page, **given(m))


@pytest.mark.skipif(not ON_GPU, reason="launch plans exist only for compiled kernels on a GPU")
def test_a_replay_checks_strided_fields_apart():
    """A plan recorded for interleaved halves replays for other halves of the same strides, and
    refuses one tensor passed for both fields (same shapes and strides: only the pointers differ)."""
    m = module("vllm_fp8")
    heads, values, page = 2, 64, 16
    kv = torch.zeros(4, 2, page, heads, values, dtype=torch.uint8, device=DEVICE)
    x = torch.randn(3, heads, values, device=DEVICE)
    loc = torch.arange(3, device=DEVICE)
    m.quantize_store(x, x, loc, m.Cache(kv[:, 0], kv[:, 1]), page, **given(m))
    m.quantize_store(x, x, loc, m.Cache(kv[:, 1], kv[:, 0]), page, **given(m))
    with pytest.raises(ValueError, match=r"cache\.k_cache: overlaps cache\.v_cache"):
        m.quantize_store(x, x, loc, m.Cache(kv[:, 0], kv[:, 0]), page, **given(m))


def _bytes_of(t: torch.Tensor) -> set:
    """Every byte offset in its storage that t's elements occupy (the brute-force oracle)."""
    size = t.element_size()
    first = torch.as_strided(torch.arange(t.untyped_storage().nbytes() // size), t.shape, t.stride(), t.storage_offset())
    return {p * size + e for p in first.flatten().tolist() for e in range(size)}


def test_aliasing_check_never_misses_a_shared_byte():
    """The aliasing check on random views of one buffer (pages of any step, other dtypes, a few with
    strided last dims) against the set of bytes each occupies: it never passes two views that share a
    byte, and it refuses views that share none only rarely (where it takes spans whole)."""
    m = module("vllm_fp8")
    gen = generator(73)
    buf = torch.zeros(4096, dtype=torch.uint8)

    def draw(n: int) -> int:
        return int(torch.randint(n, (), generator=gen))

    def view() -> torch.Tensor:
        dtype = (torch.uint8, torch.int16, torch.int32)[draw(3)]
        shape = [1 + draw(5) for _ in range(1 + draw(3))]
        strides, inner = [0] * len(shape), 1
        for d in range(len(shape) - 1, 0, -1):
            strides[d], inner = inner, inner * shape[d]
        strides[0] = 1 + draw(3 * inner + 3) if draw(10) < 7 else inner
        if len(shape) > 1 and draw(5) == 0:
            strides[-1] = 1 + draw(3)
        return buf.view(dtype).as_strided(shape, strides, draw(200))

    checked = refused_apart = 0
    while checked < 600:
        a, b = view(), view()
        if m._nested_dims(a) is None or m._nested_dims(b) is None:
            continue                 # (a view whose own elements overlap is refused before this check)
        checked += 1
        shared, found = bool(_bytes_of(a) & _bytes_of(b)), m._strided_overlap(a, b)
        assert found or not shared, (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(), b.storage_offset())
        refused_apart += found and not shared
    assert refused_apart < checked // 50


def test_reset_pages_through_a_view_with_a_size_one_dim_of_any_stride():
    """A dim of one entry may have any stride (torch's contiguity ignores it): such a page-strided view
    of int32 words is reset by the kernel and by the reference (which zeroes a contiguous copy) alike,
    the bytes between pages untouched."""
    m = module("ds32_indexer")
    heads, values, page = dims(m)
    gen = generator(74)
    span = m.alloc_cache(1, page, heads=heads, values=values)[0].nbytes
    work = random_bytes(torch.empty(3, span + 12, dtype=torch.uint8, device=DEVICE), gen)
    words = work.view(torch.int32)[:, :span // 4].unsqueeze(1).transpose(1, 2)    # (3, span / 4, 1), strides (.., 1, ..)
    assert words.stride(-1) != 1
    before = work.clone()
    ids = torch.tensor([1, 5], device=DEVICE)
    m.reset_pages(m.Cache(words), ids, page)
    by_kernel = work.clone()
    work.copy_(before)
    m.reset_pages_ref(m.Cache(words), ids, page)
    assert_same_bytes(work, by_kernel, "reset_pages_ref against reset_pages")
    assert not work[1, :span].any()
    assert torch.equal(work[:, span:], before[:, span:]) and torch.equal(work[[0, 2]], before[[0, 2]])


def test_replayed_aliasing_checks_agree_with_the_checked_path():
    """A launch plan's replay checks (check_fields_apart, then check_disjoint, which skips the fields'
    pairs) for halves of one tensor, a page of gap after each half's page: other halves pass; one
    half for both fields, and a source inside a page, are refused naming the right tensors, as the
    checked path names them; a source in the bytes between pages passes."""
    m = module("vllm_fp8")
    heads, values, page = 2, 64, 16
    full = torch.zeros(4, 2, 2 * page, heads, values, dtype=torch.uint8, device=DEVICE)
    kv = full[:, :, :page]
    rows = 3 * heads * values * 4                                   # bytes of a (3, heads, values) fp32 source

    def source(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1)[:rows].view(torch.float32).view(3, heads, values)

    loc, k, v = torch.arange(3, device=DEVICE), torch.randn(3, heads, values, device=DEVICE), torch.randn(3, heads, values, device=DEVICE)
    scales = tuple(given(m).values())
    first = m._STORE_WRITTEN[0]
    plan = m._Plan(tuple(m._extent(t) for t in (loc, k, v, kv[:, 0], kv[:, 1], *scales)))

    def replay(cache, k=k):
        tensors = (loc, k, v, *cache, *scales)
        pointers = [t.data_ptr() for t in tensors]
        plan.check_fields_apart(pointers, first, tensors)
        plan.check_disjoint(m._STORE_NAMES, pointers, m._STORE_WRITTEN, tensors, first)

    def checked(cache, k=k):
        m.quantize_store_ref(k, v, loc, m.Cache(*cache), page, **given(m))

    replay((kv[:, 0], kv[:, 1]))
    replay((kv[:, 1], kv[:, 0]))
    replay((kv[:, 0], kv[:, 1]), source(full[0, 0, page:]))        # k in the gap after K's first page
    checked((kv[:, 0], kv[:, 1]), source(full[0, 0, page:]))
    for cache, k_, error in (((kv[:, 0], kv[:, 0]), k, r"^cache\.k_cache: overlaps cache\.v_cache in memory; each cache"),
                             ((kv[:, 0], kv[:, 1]), source(kv[2, 1]), r"^cache\.v_cache: overlaps k in memory")):
        for path in (replay, checked):
            with pytest.raises(ValueError, match=error):
                path(cache, k_)
