"""Call-time scales (scale groups with `group: tensor`, vLLM's k_scale / v_scale): kernel, reference
and oracle agree bit for bit on adversarial rows and on every stored code, whatever the scale
(normal, subnormal, huge, zero, negative, infinite, NaN; one for the plane or one per head), and the
scale arguments are checked."""
import math

import pytest
import torch

from tests import oracle
from tests.conftest import DEVICE
from tests.corpus import adversarial_rows, generator
from tests.harness import (ROOT, SPECS, assert_same_bytes, assert_same_cache, clone, dims, fresh_cache, given,
                           given_floats, module, pairs, per_plane, sources)

# Layouts with call-time scales: given scales, and global scales of two-level (NVFP4) block scales
# (zoo_nvfp4_heads, whose per-head global scales flashinfer_nvfp4 takes here too, runs the generic tests).
GIVEN = ["vllm_fp8", "zoo_given_e5m2", "dsv4_nvfp4", "flashinfer_nvfp4"]
# Scales a caller may pass: inexact quotients, fp32's smallest normal and subnormal (quotients
# overflow and saturate), the largest finite, 0 (x / 0 = +-inf saturates, 0 / 0 is NaN), a negative
# scale (signs flip), inf (quotients 0 or NaN) and NaN.
SCALES = (1.0, 0.0371, 2.0 ** -126, 2.0 ** -149, 3.4028234663852886e38, 0.0, -2.5, math.inf, math.nan)


def spec_of(name: str) -> oracle.Spec:
    return oracle.Spec((ROOT / "specs" if name in SPECS else ROOT / "tests" / "specs") / f"{name}.yaml")


def scales_of(m, heads: int) -> tuple:
    """The scales a module's call-time scales are tried at: all of SCALES, one for the plane; then, where
    there are several heads, one per head from starts 0, heads, 2 * heads, ... in SCALES, so that each
    head takes every scale of SCALES once. Two-level (NVFP4) layouts, whose kernels are slower to
    interpret, take every other start only, and one of each kind for the plane (inexact, smallest
    normal, zero; with fewer than three heads also negative, infinite and NaN, which three or more
    heads take per head)."""
    starts = tuple(f"heads+{k}" for k in range(0, len(SCALES), heads)) if heads > 1 else ()
    if any(g.two_level for g in m._REF_GROUPS.values()):
        plane = (0.0371, 2.0 ** -126, 0.0) + ((-2.5, math.inf, math.nan) if heads < 3 else ())
        return plane + starts[::2]
    return SCALES + starts


def scales_for(m, value, heads: int = 1) -> dict:
    """Every call-time scale of the module: `value` for the first, 1.5 for the others; value
    "heads+K": one scale per head instead, for every plane, head h of the i-th argument taking
    SCALES[K + h + 3 * i] (cyclically)."""
    if not str(value).startswith("heads+"):
        return given(m, (value, 1.5))
    start = int(value.partition("+")[2])
    return {name: torch.tensor([SCALES[(start + h + 3 * i) % len(SCALES)] for h in range(heads)], dtype=torch.float32,
                               device=DEVICE) for i, name in enumerate(m._GIVEN_SCALES)}


@pytest.mark.parametrize("name", GIVEN)
def test_quantize_store_is_exact_for_every_scale(name):
    m, spec = module(name), spec_of(name)
    gen = generator(41)
    heads, values, page = dims(m)
    x = adversarial_rows(values, gen, torch.float32)               # every bf16 pattern, specials, zero rows
    tokens = x.shape[0] // heads
    x = x[: tokens * heads].view(tokens, heads, values)
    num_pages = -(-(tokens + 3) // page)
    loc = torch.randperm(num_pages * page, generator=gen)[:tokens]
    loc[:2] = torch.tensor([-1, num_pages * page])
    srcs = [x.to(torch.bfloat16)] + [(x * -3.0).to(torch.bfloat16) for _ in m.PLANES[1:]]
    cache = fresh_cache(m, num_pages, page, heads, values, gen)    # unwritten bytes stay random
    # The naive oracle is slow: it checks every token at two scales, and at the others every eighth
    # token and the special rows at the end (the other tokens' slots are skipped, -1, for both).
    sample = torch.where((torch.arange(tokens) % 8 == 0) | (torch.arange(tokens) >= tokens - 16), loc, -1)
    for value in scales_of(m, heads):
        scales = scales_for(m, value, heads)
        oracle_loc = loc if value in (0.0371, "heads+0") else sample
        state = oracle.CacheBytes(spec, cache, page, heads, values)
        oracle.quantize_store(spec, state, srcs, oracle_loc, given_floats(m, scales))
        want = m.Cache(*(t.to(DEVICE) for t in state.tensors(cache)))
        ref, kernel = clone(m, cache), clone(m, cache)
        m.quantize_store_ref(*sources(m, [s.to(DEVICE) for s in srcs]), oracle_loc.to(DEVICE), ref, page, **scales)
        assert_same_cache(m, ref, want, f"{name}.quantize_store_ref, scale {value}, vs the oracle")
        ref = clone(m, cache)
        m.quantize_store_ref(*sources(m, [s.to(DEVICE) for s in srcs]), loc.to(DEVICE), ref, page, **scales)
        m.quantize_store(*sources(m, [s.to(DEVICE) for s in srcs]), loc.to(DEVICE), kernel, page, **scales)
        assert_same_cache(m, kernel, ref, f"{name}.quantize_store, scale {value}, vs its reference")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", GIVEN)
def test_gather_dequant_is_exact_for_every_scale(name, out_dtype):
    """Random cache bytes hold every code; each is read back times every scale above."""
    m, spec = module(name), spec_of(name)
    gen = generator(42)
    heads, values, page = dims(m)
    num_pages = 4
    cache = fresh_cache(m, num_pages, page, heads, values, gen)
    state = oracle.CacheBytes(spec, cache, page, heads, values)
    ids = torch.arange(-2, num_pages * page + 2)               # every slot, and ids outside the cache
    for value in scales_of(m, heads):
        scales = scales_for(m, value, heads)
        want = oracle.gather_dequant(spec, state, ids, out_dtype, given_floats(m, scales))
        outs = tuple(torch.full((ids.numel(), heads, values), 7.0, dtype=out_dtype, device=DEVICE) for _ in m.PLANES)
        kernel_outs = tuple(torch.full_like(o, -5.0) for o in outs)        # poisoned
        ref = m.gather_dequant_ref(cache, ids.to(DEVICE), page, **scales, out=outs if len(outs) > 1 else outs[0])
        kernel = m.gather_dequant(cache, ids.to(DEVICE), page, **scales,
                                  out=kernel_outs if len(outs) > 1 else kernel_outs[0])
        for plane, a, b in zip(m.PLANES, per_plane(m, ref), want, strict=True):
            assert_same_bytes(a.cpu(), b, f"{name}.gather_dequant_ref ({plane}), scale {value}, vs the oracle")
        for plane, a, b in pairs(m, kernel, ref):
            assert_same_bytes(a, b, f"{name}.gather_dequant ({plane}), scale {value}, vs its reference")


def raises(match: str, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


@pytest.mark.parametrize("name", GIVEN)
def test_scale_arguments_are_checked_before_launch(name):
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(43)
    cache = fresh_cache(m, 2, page, heads, values, gen)
    before = clone(m, cache)
    x = torch.ones(3, heads, values, dtype=torch.bfloat16, device=DEVICE)
    loc = torch.arange(2, 5, device=DEVICE)
    first = m._GIVEN_SCALES[0]
    good = given(m)
    bad = [(1.0, "expected a torch.Tensor"), (torch.tensor([1.0], dtype=torch.float64, device=DEVICE), "dtype"),
           (torch.ones(heads + 1, device=DEVICE), "expected one element"), (torch.ones(0, device=DEVICE), "expected one element"),
           (torch.empty(1, device="meta"), "meta tensor")]
    if heads > 1:                     # (one element is contiguous whatever its stride)
        bad.append((torch.ones(2 * heads, device=DEVICE)[::2], "must be contiguous"))
    for value, words in bad:
        scales = {**good, first: value}
        for writer in (m.quantize_store, m.quantize_store_ref):
            raises(f"{first}: .*{words}", writer, *[x] * len(m.PLANES), loc, cache, page, **scales)
        for reader in (m.gather_dequant, m.gather_dequant_ref):
            raises(f"{first}: .*{words}", reader, cache, loc, page, **scales)
    # a scale inside the cache it writes would race with the stores
    aliased = cache[0].view(-1).view(torch.uint8)[:4].view(torch.float32)
    raises(f"cache.{m.Cache._fields[0]}: overlaps {first}", m.quantize_store, *[x] * len(m.PLANES), loc, cache, page,
           **{**good, first: aliased})
    # and one inside an output the gather writes
    outs = tuple(torch.empty(3, heads, values, dtype=torch.float32, device=DEVICE) for _ in m.PLANES)
    inside = outs[0].view(-1)[:1]
    raises(r"out( \(\w+\))?: overlaps " + first, m.gather_dequant, cache, loc, page, **{**good, first: inside},
           out=outs if len(outs) > 1 else outs[0])
    with pytest.raises(TypeError):
        m.quantize_store(*[x] * len(m.PLANES), loc, cache, page)   # the scales have no default
    assert_same_cache(m, cache, before, "refused calls")
