"""Shipped specs against their peers' published quantizers, re-derived here from each peer's own
source (FlashMLA's tests/quant.py, sglang's and vLLM's kernels and tests; the rules are restated,
not copied), and against the peers' page layouts. Each test pins down exactly which values differ and
why: where a peer departs from the spec's rule the mismatches must lie in the class the docstring
names (docs/numerics.md has the table), everywhere else the bytes are equal.
"""
from __future__ import annotations

import pytest
import torch

from tests.corpus import adversarial_rows, generator, scaled_normal
from tests.conftest import DEVICE
from tests.layouts import module

F32_FLOOR_1E4 = torch.tensor(1e-4, dtype=torch.float32)     # a C literal 1e-4 passed to fmaxf


def peer_rows(width: int, seed: int) -> torch.Tensor:
    """bf16 rows: fresh random ones over 2^-20 .. 2^20, tiny ones (amax below 0.0448), and the
    adversarial corpus (every bf16 pattern, NaN/inf, ties, zero rows)."""
    gen = generator(seed)
    tiny = scaled_normal((64, width), gen) * 2.0 ** -12
    return torch.cat([scaled_normal((256, width), gen), tiny.to(torch.bfloat16), adversarial_rows(width, gen)])


def satfinite_e4m3(q: torch.Tensor) -> torch.Tensor:
    """CUDA's __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3) / cvt.rn.satfinite.e4m3x2: round to
    nearest even, saturate at +-448, any NaN -> 0x7F."""
    codes = q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(q.isnan(), 0x7F, codes).to(torch.uint8)


def amax_fmaxf(tiles: torch.Tensor) -> torch.Tensor:
    """A CUDA fmaxf reduction of |x| from 0: NaN operands drop out."""
    mag = tiles.abs()
    return torch.where(mag.isnan(), 0.0, mag).amax(-1)


def tiles_with(tiles: torch.Tensor, bad) -> torch.Tensor:
    return bad(tiles).any(-1)


# --- ds41_mla: DeepSeek-V4.1, 512 e4m3 + 16 ue8m0 per token ------------------------------------------

def flashmla_v41(x: torch.Tensor) -> tuple:
    """FlashMLA tests/quant.py (KVCacheLayout.V41_FP8Sparse): s = 2^ceil(log2(max(amax / 448, 1e-4)))
    per 32 values in fp32 torch ops, codes (x / s).to(float8_e4m3fn), scales s as float8_e8m0fnu."""
    t = x.float().unflatten(-1, (-1, 32))
    amax = t.abs().amax(-1)                                          # torch's amax: NaN propagates
    s = torch.pow(2, torch.clamp_min(amax / 448.0, 1e-4).log2().ceil())
    codes = (t / s[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).flatten(-2)
    return codes, s.to(torch.float8_e8m0fnu).view(torch.uint8)


def sglang_v41(x: torch.Tensor) -> tuple:
    """sglang deepseek_v4 v41::store_row_fp8: biased byte e = max((bits(amax) >> 23) - 8 +
    (mantissa(amax) > 0x600000), 114) with amax an fmaxf reduction, codes x * 2^(127 - e) through
    cvt.rn.satfinite."""
    t = x.float().unflatten(-1, (-1, 32))
    bits = amax_fmaxf(t).view(torch.int32)
    byte = ((bits >> 23) - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)).clamp(min=114)
    inverse = torch.exp2((127 - byte).double()).float()
    return satfinite_e4m3(t * inverse[..., None]).flatten(-2), byte.to(torch.uint8)


def vllm_v41(x: torch.Tensor) -> tuple:
    """vLLM deepseek_v41 _quantize_and_insert_k_mxfp8_kernel: amax = max(max |x|, 1e-4) (the floor on
    amax), e = ceil(log2(amax * (1 / 448))) in fp32, codes clamp(x * 2^-e, +-448) cast to e4m3,
    byte clamp(e + 127, 0, 255). log2 is taken exactly here (Triton's GPU log2 is approximate)."""
    t = x.float().unflatten(-1, (-1, 32))
    amax = torch.maximum(amax_fmaxf(t), F32_FLOOR_1E4)
    e = torch.ceil(torch.log2((amax * torch.tensor(1 / 448, dtype=torch.float32)).double()))
    codes = satfinite_e4m3(t * torch.exp2(-e).float()[..., None])
    return codes.flatten(-2), (e + 127).clamp(0, 255).to(torch.uint8)


def ds41_quantized(x: torch.Tensor) -> tuple:
    data, scale = module("ds41_mla").quantize_ref(x)
    return data.view(torch.uint8), scale.view(torch.uint8)


def _mismatched_tiles(ours: tuple, theirs: tuple, tile: int) -> torch.Tensor:
    """Per (row, scale tile): whether its codes or its scale differ."""
    (codes, scales), (peer_codes, peer_scales) = ours, theirs
    differ = (codes != peer_codes).unflatten(-1, (-1, tile)).any(-1)
    return differ | (scales != peer_scales)


def test_ds41_mla_equals_sglangs_integer_rule_on_every_input():
    """sglang's writer is the spec's rule exactly, NaN and inf included (fmaxf drops a NaN from the
    amax, an infinite amax gives byte 247 = 2^120)."""
    x = peer_rows(512, 41)
    assert not _mismatched_tiles(ds41_quantized(x), sglang_v41(x), 32).any()


def test_ds41_mla_equals_flashmlas_reference_except_where_it_propagates_nan():
    """FlashMLA's reference takes torch's amax, which propagates NaN: a tile holding a NaN or an
    infinity gets a NaN scale (byte 0xFF) and NaN codes there. Every other tile is equal."""
    x = peer_rows(512, 41)
    tiles = x.float().unflatten(-1, (-1, 32))
    differ = _mismatched_tiles(ds41_quantized(x), flashmla_v41(x), 32)
    poisoned = tiles_with(tiles, lambda t: ~t.isfinite())
    assert bool(differ[poisoned].all()) and not differ[~poisoned].any()


def test_nan_poison_reproduces_flashmlas_reference_on_every_nan_tile():
    """The same records with the spec's `nan: poison` (tests/specs/zoo_poison_v41.yaml): every tile
    holding a NaN is now FlashMLA's (scale 0xFF, every code a NaN code: 0x7F here, 0x7F or 0xFF there,
    the sign of whichever NaN the CPU's division returns); only the tiles with an infinity and no NaN
    still differ (FlashMLA's amax / 448 is inf there: scale 0xFF, finite codes 0, where the spec takes
    the largest exponent, 2^120)."""
    x = peer_rows(512, 41)
    tiles = x.float().unflatten(-1, (-1, 32))
    data, scale = module("zoo_poison_v41").quantize_ref(x)
    codes, scales = flashmla_v41(x)
    assert not (data.view(torch.uint8) == 0xFF).any()        # the spec's NaN code is 0x7F
    theirs = (torch.where(codes == 0xFF, 0x7F, codes).to(torch.uint8), scales)
    differ = _mismatched_tiles((data.view(torch.uint8), scale.view(torch.uint8)), theirs, 32)
    nan, inf = tiles_with(tiles, torch.isnan), tiles_with(tiles, torch.isinf)
    assert nan.any() and not differ[nan].any()
    assert bool(differ[inf & ~nan].all()) and not differ[~inf & ~nan].any()


def fp32_boundary_rows(width: int, tile: int) -> torch.Tensor:
    """fp32 rows whose tiles' amax lie at and one ulp around 448 * 2^k, k = -16 .. 24 (the other
    values of a tile a quarter of it, signs alternating), plus fresh random fp32 rows."""
    edges = torch.tensor([448.0 * 2.0 ** k for k in range(-16, 25)])
    amax = torch.cat([edges, torch.nextafter(edges, edges * 2), torch.nextafter(edges, edges / 2)])
    tiles = (amax[:, None] / 4).repeat(1, tile) * torch.tensor([1.0, -1.0]).repeat(tile // 2)
    tiles[:, 3] = amax
    rows = tiles.flatten()[: tiles.numel() // width * width].view(-1, width)
    return torch.cat([rows, scaled_normal((64, width), generator(width), torch.float32)])


def flashmla_log2_rounds_down(amax: torch.Tensor) -> torch.Tensor:
    """Where FlashMLA's fp32 ops choose a scale one power of two below the spec's: the quotient
    q = fp32(max(amax / 448, 1e-4)) lies above 2^k yet fp32 log2(q) rounds
    to the integer k, so ceil keeps 2^k (and the amax codes as 448 by the cast's rounding)."""
    q = torch.clamp_min(amax / 448.0, 1e-4)
    log2 = q.log2()
    return (log2 == log2.round()) & (q > torch.exp2(log2))


def test_fp32_sources_differ_from_flashmlas_reference_where_its_log2_rounds_to_an_integer():
    """With fp32 sources, a tile whose amax is an ulp above 448 * 2^k has a quotient amax / 448 an
    ulp above 2^k; for k in [-13, -5] and k >= 4 fp32's log2 of it rounds to k exactly, and FlashMLA
    (tests/quant.py, V41 and V32) takes 2^k where the spec's exact rule takes 2^(k+1). Exactly those
    tiles differ; bf16 and fp16 sources (8 and 11 significant bits) never come that close to
    448 * 2^k without being on it. V32's rope is left out (FlashMLA keeps the source's dtype there)."""
    x = fp32_boundary_rows(512, 32)
    tiles = x.unflatten(-1, (-1, 32))
    differ = _mismatched_tiles(ds41_quantized(x), flashmla_v41(x), 32)
    rounds_down = flashmla_log2_rounds_down(amax_fmaxf(tiles))
    assert rounds_down.any() and torch.equal(differ, rounds_down)

    x = fp32_boundary_rows(512, 128)
    x = torch.cat([x, scaled_normal((x.shape[0], 64), generator(3)).float()], -1)   # a bf16-valued rope
    tiles = x[:, :512].unflatten(-1, (4, 128))
    ours = ds32_mla_records(x)[:, :528]
    theirs = flashmla_v32(x)[:, :528]
    differ = (ours != theirs)[:, :512].unflatten(-1, (4, 128)).any(-1)
    differ |= (ours != theirs)[:, 512:].unflatten(-1, (4, 4)).any(-1)
    rounds_down = flashmla_log2_rounds_down(amax_fmaxf(tiles))
    assert rounds_down.any() and torch.equal(differ, rounds_down)


def test_ds41_mla_differs_from_vllms_writer_only_below_its_amax_floor():
    """vLLM floors amax at 1e-4 (scale >= 2^-22) where FlashMLA floors amax / 448 (scale >= 2^-13):
    the tiles with amax < 448e-4 get another scale byte; an infinite amax gives vLLM's byte 255
    (e = +inf, clamped) where sglang's bit form gives 247. All other tiles are equal. (A NaN's fate
    in vLLM's Triton max is not modelled: those tiles are not compared.)"""
    x = peer_rows(512, 41)
    tiles = x.float().unflatten(-1, (-1, 32))
    differ = _mismatched_tiles(ds41_quantized(x), vllm_v41(x), 32)
    small = amax_fmaxf(tiles) < 448 * 1e-4
    infinite = tiles_with(tiles, lambda t: t.isinf())
    compared = ~tiles_with(tiles, lambda t: t.isnan())
    assert bool(differ[infinite & compared].all())
    assert not differ[~small & ~infinite & compared].any()
    # every small tile whose vLLM exponent falls below -13 differs in its byte, the others not
    e_vllm = vllm_v41(x)[1].to(torch.int32) - 127
    assert torch.equal(differ[small & compared], (e_vllm < -13)[small & compared])


def test_ds41_mla_pages_are_flashmlas():
    """FlashMLA V41 pages: [page_size x 512 code bytes][page_size x 16 scale bytes], rounded up to a
    multiple of 512; slot s of page p at p * page_bytes + s * 512, its scales at + P * 512 + s * 16."""
    m = module("ds41_mla")
    page = 48                                             # not a multiple of 32: the page is padded
    page_bytes = -(-page * 528 // 512) * 512
    x = peer_rows(512, 7)[:96]
    loc = torch.randperm(4 * page, generator=generator(8))[:96]
    cache = m.alloc_cache(4, page)
    m.quantize_store_ref(x, loc, cache, page)
    assert cache.k_cache.numel() == 4 * page_bytes
    flat = cache.k_cache.view(-1)
    codes, scales = ds41_quantized(x)
    base = (loc // page) * page_bytes
    slot = loc % page
    assert torch.equal(flat[(base + slot * 512)[:, None] + torch.arange(512)], codes)
    assert torch.equal(flat[(base + page * 512 + slot * 16)[:, None] + torch.arange(16)], scales)


# --- ds32_indexer: DeepSeek-V3.2 indexer K, 128 e4m3 + one fp32 scale per token ----------------------

def vllm_indexer(x: torch.Tensor) -> tuple:
    """vLLM indexer_k_quant_and_cache, fp32 scale format: scale = fmaxf(amax, 1e-4) / 448 (an fp32
    division), codes __nv_cvt_float_to_fp8(x / scale, SATFINITE) (an fp32 division)."""
    t = x.float()
    scale = (torch.maximum(amax_fmaxf(t), F32_FLOOR_1E4).double() / 448).float()
    codes = satfinite_e4m3((t.double() / scale.double()[:, None]).float())
    return codes, scale


def vllm_indexer_test_reference(x: torch.Tensor) -> tuple:
    """vLLM tests' kv_cache_cast_to_fp8: sf = amax.clamp(1e-4) / 448, codes (x * (1.0 / sf)) cast to
    float8_e4m3fn (torch's amax: NaN propagates)."""
    t = x.float()
    sf = t.abs().amax(-1).clamp(1e-4) / 448.0
    return (t * (1.0 / sf)[:, None]).to(torch.float8_e4m3fn).view(torch.uint8), sf


def ds32_quantized(x: torch.Tensor) -> tuple:
    data, scale = module("ds32_indexer").quantize_ref(x)
    return data.view(torch.uint8), scale[:, 0]


def _indexer_mismatches(ours: tuple, theirs: tuple) -> tuple:
    (codes, scale), (peer_codes, peer_scale) = ours, theirs
    same_scale = scale.view(torch.int32) == peer_scale.view(torch.int32)
    return codes != peer_codes, ~same_scale


def test_ds32_indexer_equals_vllms_kernel_on_every_input():
    x = peer_rows(128, 32)
    codes, scales = _indexer_mismatches(ds32_quantized(x), vllm_indexer(x))
    assert not codes.any() and not scales.any()


def test_ds32_indexer_differs_from_vllms_test_reference_by_its_reciprocal():
    """vLLM's test reference multiplies by a rounded reciprocal (two roundings): some codes land on
    the neighbouring code, and only in rows whose scale is not a power of two (else the reciprocal
    is exact); rows holding a NaN or infinity are NaN there (torch's amax). The scales of all
    finite rows are equal."""
    x = peer_rows(128, 32)
    ours, theirs = ds32_quantized(x), vllm_indexer_test_reference(x)
    codes, scales = _indexer_mismatches(ours, theirs)
    finite = x.float().isfinite().all(-1)
    assert not scales[finite].any()
    power_of_two = (ours[1].view(torch.int32) & 0x7FFFFF) == 0
    assert not codes[finite & power_of_two].any()
    off = codes & finite[:, None]
    assert off.any()                                  # the corpus does reach the double rounding
    assert bool(((ours[0].to(torch.int32) - theirs[0].to(torch.int32)).abs()[off] == 1).all())


def sglang_act_quant(x: torch.Tensor, round_scale: bool) -> tuple:
    """sglang dsa/triton_kernel.py act_quant, the NSA indexer's K quantizer: amax = max(max |x|, 1e-4),
    scale = amax * fp32(1 / 448), or with a scale_fmt (round_scale) 2^ceil(log2 of that), codes
    clamp(x / scale, +-448) converted to e4m3. Restated in IEEE fp32 with an exact log2 (Triton's `/`
    and its GPU log2 / exp2 are approximate: not modelled); rows holding a NaN or an infinity are not
    compared."""
    t = x.float()
    amax = torch.maximum(amax_fmaxf(t), F32_FLOOR_1E4)
    scale = amax * torch.tensor(1 / 448, dtype=torch.float32)
    if round_scale:
        scale = torch.exp2(torch.ceil(torch.log2(scale.double()))).float()
    return satfinite_e4m3((t.double() / scale.double()[:, None]).float()), scale


def test_ds32_indexer_differs_from_sglangs_act_quant_by_its_rounded_reciprocal():
    """sglang's index K buffer has vLLM's page layout (ds32_indexer), but its act_quant multiplies by
    a rounded 1 / 448: without a scale_fmt its fp32 scale is one ulp off the spec's amax / 448 in some
    finite rows, and codes differ only in those; with DeepSeek-V3.2's scale_fmt "ue8m0" it is the
    power of two of ds32_indexer_ue8m0 (vLLM's ue8m0 format), equal on every finite row."""
    x = peer_rows(128, 34)
    finite = x.float().isfinite().all(-1)
    ours, theirs = ds32_quantized(x), sglang_act_quant(x, round_scale=False)
    codes, scales = _indexer_mismatches(ours, theirs)
    ulps = (ours[1].view(torch.int32) - theirs[1].view(torch.int32)).abs()
    assert scales[finite].any() and bool((ulps[finite & scales] == 1).all())
    assert not codes[finite & ~scales].any()

    data, scale = module("ds32_indexer_ue8m0").quantize_ref(x)
    codes, scales = _indexer_mismatches((data.view(torch.uint8), scale[:, 0]), sglang_act_quant(x, round_scale=True))
    assert not codes[finite].any() and not scales[finite].any()


def test_ds32_indexer_pages_are_vllms():
    """vLLM's indexer cache (num_blocks, block_size, 132) uint8: per block [block_size x 128 codes]
    then [block_size x fp32 scale]; slot s of block b at b * P * 132 + s * 128, its scale at
    b * P * 132 + P * 128 + s * 4."""
    m = module("ds32_indexer")
    page = 64
    x = peer_rows(128, 9)[:200]
    loc = torch.randperm(4 * page, generator=generator(10))[:200]
    cache = m.Cache(torch.zeros(4, page, 132, dtype=torch.uint8))
    m.quantize_store_ref(x, loc, cache, page)
    flat = cache.k_cache.view(-1)
    codes, scale = ds32_quantized(x)
    base = (loc // page) * page * 132
    slot = loc % page
    assert torch.equal(flat[(base + slot * 128)[:, None] + torch.arange(128)], codes)
    assert torch.equal(flat[(base + page * 128 + slot * 4)[:, None] + torch.arange(4)], scale[:, None].contiguous().view(torch.uint8).view(-1, 4))


# --- ds32_mla: DeepSeek-V3.2 "fp8_ds_mla", 656-byte records with inline fp32 scales ------------------

def _v32_record(codes: torch.Tensor, scales: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[512 codes][4 x fp32 scale][64 bf16 rope] per token."""
    rope = x[:, 512:].contiguous().view(torch.uint8)
    return torch.cat([codes, scales.contiguous().view(torch.uint8).view(-1, 16), rope], -1)


def flashmla_v32(x: torch.Tensor) -> torch.Tensor:
    """FlashMLA tests/quant.py (V32_FP8Sparse): per 128 latent values s = 2^ceil(log2(max(amax / 448,
    1e-4))) in fp32 torch ops (torch's amax), codes (x / s).to(float8_e4m3fn), s stored as fp32; the
    rope values copied as bf16."""
    t = x[:, :512].float().unflatten(-1, (4, 128))
    s = torch.pow(2, torch.clamp_min(t.abs().amax(-1) / 448.0, 1e-4).log2().ceil())
    codes = (t / s[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).flatten(-2)
    return _v32_record(codes, s, x)


def vllm_ds_mla(x: torch.Tensor) -> torch.Tensor:
    """vLLM concat_and_cache_ds_mla_kernel: tile_scale = fmaxf(amax / 448, FLT_MIN) (an fp32 division,
    fmaxf amax; not a power of two), codes __nv_cvt_float_to_fp8(x / tile_scale, SATFINITE)."""
    t = x[:, :512].float().unflatten(-1, (4, 128))
    scale = torch.clamp_min((amax_fmaxf(t).double() / 448).float(), 2.0 ** -126)
    codes = satfinite_e4m3((t.double() / scale.double()[..., None]).float()).flatten(-2)
    return _v32_record(codes, scale, x)


def sglang_ds32_mla(x: torch.Tensor) -> torch.Tensor:
    """sglang nsa quant_k_cache.py, its Triton writer (_quantize_k_cache_fast_kernel), restated in
    IEEE fp32: per 128 latent values s = amax / 448 (tl.max of |x|: NaN-skipping; no floor, not a
    power of two), codes (x * (1 / s)) clamped to +-448 and converted to e4m3 nearest even."""
    t = x[:, :512].float().unflatten(-1, (4, 128))
    s = (amax_fmaxf(t).double() / 448).float()
    inverse = (1.0 / s.double()).float()
    codes = satfinite_e4m3((t.double() * inverse.double()[..., None]).float()).flatten(-2)
    return _v32_record(codes, s, x)


def ds32_mla_records(x: torch.Tensor, page: int = 64) -> torch.Tensor:
    """The spec's records of rows x at slots 0.., in vLLM's (num_blocks, block_size, 656) cache."""
    m = module("ds32_mla")
    cache = m.Cache(torch.full((-(-x.shape[0] // page), page, 656), 0xA5, dtype=torch.uint8))
    m.quantize_store_ref(x, torch.arange(x.shape[0]), cache, page)
    return cache.k_cache.view(-1, 656)[: x.shape[0]]


def vllm_ds_mla_records(x: torch.Tensor, page: int = 64) -> torch.Tensor:
    """vllm_ds_mla's records of rows x at slots 0.., from the latent and rope parts of x."""
    m = module("vllm_ds_mla")
    cache = m.Cache(torch.full((-(-x.shape[0] // page), page, 656), 0xA5, dtype=torch.uint8))
    m.quantize_store_ref(x[:, None, :512], x[:, None, 512:], torch.arange(x.shape[0]), cache, page)
    return cache.k_cache.view(-1, 656)[: x.shape[0]]


def _v32_tiles_differ(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """Per (row, 128-value tile): whether its codes or its fp32 scale differ; the rope bytes must not."""
    assert torch.equal(ours[:, 528:], theirs[:, 528:])
    codes = (ours[:, :512] != theirs[:, :512]).unflatten(-1, (4, 128)).any(-1)
    scales = (ours[:, 512:528] != theirs[:, 512:528]).unflatten(-1, (4, 4)).any(-1)
    return codes | scales


def test_ds32_mla_records_are_vllms_pages():
    """vLLM's kv_cache (num_blocks, block_size, 656): slot s of block b at b * P * 656 + s * 656, its
    codes there, the 4 fp32 scales at +512, the rope at +528 as bf16 (FlashMLA's record, built
    here from finite rows); slots written out of order land there too."""
    m = module("ds32_mla")
    page = 16
    x = scaled_normal((40, 576), generator(5))
    loc = torch.randperm(4 * page, generator=generator(6))[:40]
    cache = m.Cache(torch.zeros(4, page, 656, dtype=torch.uint8))
    m.quantize_store_ref(x, loc, cache, page)
    flat = cache.k_cache.view(-1)
    assert torch.equal(flat[(loc * 656)[:, None] + torch.arange(656)], flashmla_v32(x))


def test_ds32_mla_equals_flashmlas_reference_except_where_it_propagates_nan():
    x = peer_rows(576, 32)
    tiles = x[:, :512].float().unflatten(-1, (4, 128))
    differ = _v32_tiles_differ(ds32_mla_records(x), flashmla_v32(x))
    poisoned = tiles_with(tiles, lambda t: ~t.isfinite())
    assert bool(differ[poisoned].all()) and not differ[~poisoned].any()


def test_ds32_mla_differs_from_vllms_writer_where_its_scale_is_no_power_of_two():
    """vLLM's writer stores amax / 448 itself (FlashMLA's reference, and its SM90 reader's bf16 scale,
    assume a power of two): a finite tile differs exactly where that quotient is not a power of two
    of at least 2^-13 (the floor)."""
    x = peer_rows(576, 32)
    tiles = x[:, :512].float().unflatten(-1, (4, 128))
    differ = _v32_tiles_differ(ds32_mla_records(x), vllm_ds_mla(x))
    finite = ~tiles_with(tiles, lambda t: ~t.isfinite())
    scale = torch.clamp_min((amax_fmaxf(tiles).double() / 448).float(), 2.0 ** -126)
    power_of_two = ((scale.view(torch.int32) & 0x7FFFFF) == 0) & (scale >= 2.0 ** -13)
    assert torch.equal(differ[finite], ~power_of_two[finite])


def test_ds32_mla_differs_from_sglangs_writer_where_its_scale_is_no_power_of_two():
    """sglang's fp8_ds_mla writer stores amax / 448 itself, unfloored, and multiplies by its
    reciprocal: a finite tile with a nonzero amax differs exactly where that quotient is not a power
    of two of at least 2^-13 (where it is one, the reciprocal is exact and the codes are the spec's).
    Zero and non-finite tiles are not compared: there s = 0 or inf makes x * (1 / s) NaN, and what
    tl.clamp does with a NaN is not modelled."""
    x = peer_rows(576, 35)
    tiles = x[:, :512].float().unflatten(-1, (4, 128))
    differ = _v32_tiles_differ(ds32_mla_records(x), sglang_ds32_mla(x))
    amax = amax_fmaxf(tiles)
    compared = ~tiles_with(tiles, lambda t: ~t.isfinite()) & (amax > 0)
    scale = (amax.double() / 448).float()
    power_of_two = ((scale.view(torch.int32) & 0x7FFFFF) == 0) & (scale >= 2.0 ** -13)
    assert bool(power_of_two[compared].any()) and not bool(power_of_two[compared].all())
    assert torch.equal(differ[compared], ~power_of_two[compared])


def test_vllm_ds_mla_differs_from_sglangs_writer_by_its_reciprocal():
    """vllm_ds_mla is the spec closest to sglang's writer: on every finite tile whose amax / 448 is at
    least FLT_MIN (vLLM's floor) the fp32 scales are equal, and codes differ only by one step, only where
    the scale is not a power of two (x * (1 / s) rounds twice, x / s once)."""
    x = peer_rows(576, 35)
    tiles = x[:, :512].float().unflatten(-1, (4, 128))
    ours, theirs = vllm_ds_mla_records(x), sglang_ds32_mla(x)
    scale = (amax_fmaxf(tiles).double() / 448).float()
    compared = ~tiles_with(tiles, lambda t: ~t.isfinite()) & (scale >= 2.0 ** -126)
    assert torch.equal(ours[:, 512:528].view(-1, 4, 4)[compared], theirs[:, 512:528].view(-1, 4, 4)[compared])
    codes = (ours[:, :512] != theirs[:, :512]).unflatten(-1, (4, 128)) & compared[..., None]
    power_of_two = (scale.view(torch.int32) & 0x7FFFFF) == 0
    assert codes.any() and not codes[power_of_two].any()
    step = (ours[:, :512].to(torch.int32) - theirs[:, :512].to(torch.int32)).abs().unflatten(-1, (4, 128))[codes]
    assert bool((step == 1).all())


def test_vllm_ds_mla_is_vllms_concat_and_cache_mla():
    """0 mismatching bytes: vllm_ds_mla's records are vLLM's fp8_ds_mla writer's on random and
    adversarial rows (NaN and inf tiles too: fmaxf drops a NaN, an inf amax gives an inf scale), through
    the compat function on vLLM's (num_blocks, block_size, 656) cache, from kv_c and k_pe as vLLM
    passes them: two tensors, k_pe a (T, 1, 64) slice of a wider one; other format strings refused."""
    compat = pytest.importorskip("generated.compat.vllm_mla")
    x = peer_rows(576, 33)
    tokens, block_size = x.shape[0], 16
    blocks = -(-tokens // block_size) + 2
    slots = torch.randperm(blocks * block_size, generator=generator(34))[:tokens]
    slots[::11] = -1
    kv_c = x[:, :512].clone()
    wide = torch.zeros(tokens, 1, 128, dtype=torch.bfloat16)
    wide[:, 0, 32:96] = x[:, 512:]
    cache = torch.full((blocks, block_size, 656), 0xA5, dtype=torch.uint8)
    want = cache.clone()
    keep = slots >= 0
    want.view(-1, 656)[slots[keep]] = vllm_ds_mla(x)[keep]
    got = cache.to(DEVICE)
    args = (kv_c.to(DEVICE), wide.to(DEVICE)[:, :, 32:96], got, slots.to(DEVICE))
    compat.concat_and_cache_mla(*args, "fp8_ds_mla", torch.ones(1, device=DEVICE))
    differ = int((got.cpu() != want).sum())
    assert differ == 0, f"{differ} of {want.numel()} bytes differ from vLLM's rule"
    again = cache.to(DEVICE)
    compat.concat_and_cache_ds_mla(args[0], args[1], again, args[3])
    assert torch.equal(again, got)
    for dtype in ("auto", "fp8", "fp8_e4m3"):
        with pytest.raises(ValueError, match="^kv_cache_dtype: "):
            compat.concat_and_cache_mla(*args[:2], again, args[3], dtype, torch.ones(1, device=DEVICE))
    assert torch.equal(again, got)


# --- dsv4_mxfp4: DeepSeek-V4 K in MXFP4, 368-byte records ---------------------------------------------

E2M1_LADDER = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def sglang_dsv4_mxfp4(x: torch.Tensor) -> torch.Tensor:
    """sglang dsv4 mxfp4_k_cache.py, its torch reference: per 32 nope values the byte
    round(log2(max(amax, 1e-40)) - log2 6) + 127 clamped to [0, 255] (fp32 math, torch.round), d its
    power of two; a code counts the midpoints |x| passes against d (> or >=, ties to even), the sign
    of x as bit 3 (a NaN passes none: +-0 by its sign); two codes per byte, the even value low."""
    t = x[:, :448].float().unflatten(-1, (14, 32))
    amax = t.abs().amax(-1)
    r = torch.log2(torch.clamp_min(amax, 1e-40)) - 2.584962500721156
    byte = (torch.round(r) + 127).clamp(0, 255)
    d = torch.exp2(byte.double() - 127).float()[..., None]
    a = t.abs()
    codes = sum(((a >= m * d) if up else (a > m * d)).to(torch.int32) for m, up in E2M1_LADDER)
    codes = (codes | ((t.view(torch.int32) >> 28) & 0x8)).flatten(-2)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    pad = torch.zeros(x.shape[0], 2, dtype=torch.uint8)
    return torch.cat([packed, byte.to(torch.uint8), pad, x[:, 448:].contiguous().view(torch.uint8)], -1)


def dsv4_mxfp4_records(x: torch.Tensor, page: int = 64) -> torch.Tensor:
    m = module("dsv4_mxfp4")
    cache = m.Cache(torch.zeros(-(-x.shape[0] // page), page * 368, dtype=torch.uint8))
    m.quantize_store_ref(x, torch.arange(x.shape[0]), cache, page)
    return cache.k_cache.view(-1, 368)[: x.shape[0]]


def test_dsv4_mxfp4_equals_sglangs_codec_except_on_nan_and_inf():
    """Equal on every tile of finite values (codes, scale bytes; rope and pad bytes everywhere). A
    tile holding a NaN or an infinity may differ: sglang keeps a negative NaN's sign (-0, code 8)
    where kvlayout's codes give +0, and an infinite amax is its byte 255 (log2 inf) where kvlayout
    stores the largest exponent, 254."""
    x = peer_rows(512, 4)
    ours, theirs = dsv4_mxfp4_records(x), sglang_dsv4_mxfp4(x)
    assert torch.equal(ours[:, 224 + 14:], theirs[:, 224 + 14:])
    tiles = x[:, :448].float().unflatten(-1, (14, 32))
    differ = (ours[:, :224] != theirs[:, :224]).unflatten(-1, (14, 16)).any(-1) | (ours[:, 224:238] != theirs[:, 224:238])
    finite = ~tiles_with(tiles, lambda t: ~t.isfinite())
    assert not differ[finite].any()
    assert differ[~finite].any()                         # the corpus does hold such tiles


def flashinfer_128x4(scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's SfLayout.layout_128x4 of a (rows, cols) matrix of scale bytes, restated from the
    CUTLASS block-scaled atom (as torchao's to_blocked builds it): rows padded to 128 and cols to 4,
    128x4 tiles in row-block-major order, and in a tile the byte of (row r, col c) at
    (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, cols = scales.shape
    padded = torch.zeros(-(-rows // 128) * 128, -(-cols // 4) * 4, dtype=scales.dtype)
    padded[:rows, :cols] = scales
    r_blocks, c_blocks = padded.shape[0] // 128, padded.shape[1] // 4
    tiles = padded.view(r_blocks, 128, c_blocks, 4).permute(0, 2, 1, 3)       # (rb, cb, 128, 4)
    tiles = tiles.reshape(r_blocks, c_blocks, 4, 32, 4).transpose(2, 3)        # (rb, cb, r % 32, r // 32, c)
    return tiles.reshape(-1)


def test_mxfp8_kv_128x4_scales_are_flashinfers_layout_128x4():
    """At page size 128, each head's scale bytes of a page are FlashInfer's layout_128x4 of its
    (slot, scale) matrix; the codes and the scale values are mxfp8_kv's (the same rule, another
    place). Also checked against torchao's to_blocked where torchao is installed."""
    m, plain = module("mxfp8_kv_128x4"), module("mxfp8_kv")
    page, heads, values, pages = 128, 2, 256, 3                  # 8 scales a token: two tiles per head
    gen = generator(41)
    k, v = (scaled_normal((pages * page, heads, values), gen).to(DEVICE) for _ in range(2))
    loc = torch.arange(pages * page, device=DEVICE)                  # (slot 0, the sink, is skipped)
    caches = [m.alloc_cache(pages, page, heads=heads, values=values, device=DEVICE) for _ in range(2)]
    for c in caches:
        for t in c:
            t.view(torch.uint8).fill_(0xA5)                          # poisoned: the sink's bytes stay so
    ref = plain.alloc_cache(pages, page, heads=heads, values=values, device=DEVICE)
    m.quantize_store(k, v, loc, caches[0], page)                     # the kernel
    m.quantize_store_ref(k, v, loc, caches[1], page)
    plain.quantize_store_ref(k, v, loc, ref, page)
    ours, theirs = caches[0], caches[1]
    for plane in ("k", "v"):
        codes, sf = getattr(ours, f"{plane}_cache"), getattr(ours, f"{plane}_sf")
        assert torch.equal(sf.view(torch.uint8), getattr(theirs, f"{plane}_sf").view(torch.uint8)), plane
        slots = codes.view(torch.uint8).reshape(pages * page, -1)
        assert torch.equal(slots[1:], getattr(ref, f"{plane}_cache").view(torch.uint8).reshape(pages * page, -1)[1:])
        assert (slots[0] == 0xA5).all(), "the sink slot is never written"
        # mxfp8_kv's sf: (pages, heads, 32, page / 32, values / 32): slot m at [m % 32, m // 32]
        plain_sf = getattr(ref, f"{plane}_sf").view(pages, heads, 32, page // 32, values // 32).permute(0, 1, 3, 2, 4)
        plain_sf = plain_sf.reshape(pages, heads, page, values // 32).cpu().clone()   # (page, head, slot, scale)
        plain_sf[0, :, 0] = 0xA5                                     # the sink slot: never written
        got = sf.view(torch.uint8).reshape(pages, heads, -1).cpu()
        for p in range(pages):
            for h in range(heads):
                assert torch.equal(got[p, h], flashinfer_128x4(plain_sf[p, h])), (plane, p, h)
                if to_blocked is not None:
                    assert torch.equal(got[p, h], to_blocked(plain_sf[p, h]).view(torch.uint8).reshape(-1))


try:                     # torchao's MX helpers, where installed: the 128x4 swizzle as a package defines it
    from torchao.prototype.mx_formats.utils import to_blocked
except ImportError:
    to_blocked = None


# --- vllm_fp8: vLLM's reshape_and_cache_flash, kv_cache_dtype "fp8" -----------------------------------

def vllm_scaled_convert(x: torch.Tensor, scale) -> torch.Tensor:
    """vLLM's fp8 cache write (csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh, scaled_convert):
    the input widened to fp32, x / scale in IEEE fp32 division (that file is built without fast
    math), then __nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3). Division here in float64 on
    the CPU, rounded to fp32 once: the correctly rounded quotient."""
    scale = torch.tensor(scale, dtype=torch.float32).double()
    q = (x.float().double() / (scale[:, None] if scale.dim() else scale)).float()   # per head: k_scale[head]
    return satfinite_e4m3(q)


def vllm_flash_cache(x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, scale) -> torch.Tensor:
    """reshape_and_cache_flash's placement: slot s of block s // block_size at offset s % block_size
    of a (num_blocks, block_size, heads, head_size) cache; negative slots skipped. scale: a float, or
    a list of one per head (vLLM's [num_heads] scales, k_scale[head * kv_scale_stride])."""
    out = cache.clone()
    block_size = cache.shape[1]
    keep = slots >= 0
    out[slots[keep] // block_size, slots[keep] % block_size] = vllm_scaled_convert(x[keep], scale)
    return out


@pytest.mark.parametrize("scale", [1.0, 0.0371, 3.7, 2.0 ** -100, [0.0371, 5.0]], ids=str)
def test_vllm_fp8_is_vllms_reshape_and_cache_flash(scale):
    """0 mismatches on random and adversarial rows at four per-tensor scales and one per-head pair,
    both planes, through the compat function on vLLM's own uint8 caches (its kv_cache_dtype "fp8"
    allocation)."""
    compat = pytest.importorskip("generated.compat.vllm_flash")
    heads, head_size, blocks, block_size = 2, 128, 20, 16
    x = peer_rows(head_size, 21)
    x = x[: x.shape[0] // heads * heads].view(-1, heads, head_size)
    tokens = min(x.shape[0], blocks * block_size - 8)
    key, value = x[:tokens], (x[:tokens].float() * -0.75).to(torch.bfloat16)
    slots = torch.randperm(blocks * block_size, generator=generator(22))[:tokens]
    slots[::9] = -1
    caches = [torch.full((blocks, block_size, heads, head_size), 0xA5, dtype=torch.uint8) for _ in range(2)]
    v_scale = 1.0 / 3 if scale == 1.0 else [1 / s for s in scale] if isinstance(scale, list) else 1.0 / scale
    want = [vllm_flash_cache(key, slots, caches[0], scale), vllm_flash_cache(value, slots, caches[1], v_scale)]
    got = [c.to(DEVICE) for c in caches]
    scales = [torch.tensor(s if isinstance(s, list) else [s], dtype=torch.float32, device=DEVICE) for s in (scale, v_scale)]
    compat.reshape_and_cache_flash(key.to(DEVICE), value.to(DEVICE), got[0], got[1], slots.to(DEVICE), "fp8", *scales)
    for plane, a, b in zip("kv", got, want, strict=True):
        differ = int((a.cpu() != b).sum())
        assert differ == 0, f"{plane}: {differ} of {b.numel()} bytes differ from vLLM's rule"
    before = [g.clone() for g in got]
    for dtype in ("auto", "fp8_e5m2", "fp8_ds_mla"):
        with pytest.raises(ValueError, match="^kv_cache_dtype: "):
            compat.reshape_and_cache_flash(key.to(DEVICE), value.to(DEVICE), got[0], got[1], slots.to(DEVICE), dtype,
                                           *scales)
    three = torch.ones(heads + 1, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="^k_scale: expected one element"):
        compat.reshape_and_cache_flash(key.to(DEVICE), value.to(DEVICE), got[0], got[1], slots.to(DEVICE), "fp8",
                                       three, scales[1])
    assert all(torch.equal(a, b) for a, b in zip(got, before))


# --- vllm_fp8_per_token_head: vLLM's kv_cache_dtype "fp8_per_token_head" ------------------------------

F32_FLOOR_1E6 = float(torch.tensor(1e-6, dtype=torch.float32))     # tl.maximum(..., 1e-6) in fp32


def vllm_per_token_head_reference(x: torch.Tensor) -> tuple:
    """vLLM's tests/quantization/test_per_token_kv_cache.py (_quantize_per_token_head_ref) for fp8:
    s = (amax / 448).clamp(min=1e-6) per (token, head), codes (x * (1.0 / s)).clamp(+-448) cast to
    float8_e4m3fn (torch's amax: NaN propagates). Each fp32 operation here in float64, rounded to
    fp32 once (what IEEE fp32 arithmetic gives)."""
    t = x.float()
    scale = (t.abs().amax(-1).double() / 448).float().clamp(min=F32_FLOOR_1E6)
    inverse = (1.0 / scale.double()).float()
    q = (t.double() * inverse.double()[..., None]).float()
    return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8), scale


def per_token_head_quantized(x: torch.Tensor) -> tuple:
    """vllm_fp8_per_token_head's reference writer on rows x (tokens, heads, D) as K (V: -x), read back
    from K's records: (codes (tokens, heads, D), scales (tokens, heads))."""
    m = module("vllm_fp8_per_token_head")
    tokens, heads, width = x.shape
    cache = m.alloc_cache(tokens, 1, heads=heads, values=width)
    m.quantize_store_ref(x, -x, torch.arange(tokens), cache, 1)
    records = cache.kv_cache.view(tokens, heads, 2, width + 4)[:, :, 0]
    return records[..., :width], records[..., width:].contiguous().view(torch.float32)[..., 0]


@pytest.mark.parametrize("width", [128, 80])
def test_vllm_fp8_per_token_head_differs_from_vllms_reference_by_its_reciprocal(width):
    """vLLM multiplies by a rounded reciprocal of the scale (two roundings; its Triton kernel also
    divides approximately), the spec divides once, correctly rounded: some codes land on the
    neighbouring code, only in heads whose scale is not a power of two (else the reciprocal is
    exact). Heads holding a NaN are NaN throughout there (torch's amax), and an infinity gives NaN
    codes for the head's finite values there (x * (1 / inf) is 0, but inf * 0 is NaN), so only
    finite heads are compared; their scales are equal, the scale floor included."""
    x = peer_rows(width, 41)
    x = x[: x.shape[0] // 2 * 2].view(-1, 2, width)
    ours, theirs = per_token_head_quantized(x), vllm_per_token_head_reference(x)
    finite = x.float().isfinite().all(-1)
    assert torch.equal(ours[1][finite].view(torch.int32), theirs[1][finite].view(torch.int32))
    assert bool((ours[1][finite] >= F32_FLOOR_1E6).all()) and bool((ours[1][finite] == F32_FLOOR_1E6).any())
    codes = (ours[0] != theirs[0]) & finite[..., None]
    power_of_two = (ours[1].view(torch.int32) & 0x7FFFFF) == 0
    assert not codes[power_of_two].any()
    assert codes.any()                                    # the corpus does reach the double rounding
    step = (ours[0].to(torch.int32) - theirs[0].to(torch.int32)).abs()[codes]
    assert bool((step == 1).all())


def test_vllm_fp8_per_token_head_records_are_vllms_views():
    """vLLM's cache for this dtype: one (num_blocks, block_size, heads, 2 (D + 4)) uint8 tensor (NHD);
    its writer and reader split the last dim into key_cache [..., :D + 4] and value_cache
    [..., D + 4:], read as fp8 codes [..., :D], and their scales as fp32 tensors as_strided over the
    same bytes (strides of the block, slot and head in 4-byte units, offsets D / 4 and (2 D + 4) / 4:
    triton_attn.py's _pth_key_value_caches and _ensure_scale_caches). Both planes' codes and scales
    there are those the spec's writer stored."""
    m = module("vllm_fp8_per_token_head")
    blocks, block_size, heads, width = 5, 16, 2, 96
    gen = generator(43)
    tokens = 50
    key, value = scaled_normal((tokens, heads, width), gen), scaled_normal((tokens, heads, width), gen)
    loc = torch.randperm(blocks * block_size, generator=gen)[:tokens]
    cache = m.alloc_cache(blocks, block_size, heads=heads, values=width)
    m.quantize_store_ref(key, value, loc, cache, block_size)
    kv = cache.kv_cache
    assert kv.shape == (blocks, block_size, heads, 2 * (width + 4)) and kv.dtype == torch.uint8
    key_cache, value_cache = kv.split(width + 4, -1)
    s0, s1, s2, _ = (s // 4 for s in kv.stride())
    block, slot = loc // block_size, loc % block_size
    for view, offset, x in ((key_cache, width // 4, key), (value_cache, (2 * width + 4) // 4, value)):
        scale_view = torch.as_strided(kv.view(torch.float32), (blocks, block_size, heads), (s0, s1, s2), offset)
        codes, scales = per_token_head_quantized(x)       # x's records, as the writer stores them
        assert torch.equal(view[..., :width][block, slot], codes)
        assert torch.equal(scale_view[block, slot].view(torch.int32), scales.view(torch.int32))


# --- dsv4_nvfp4 and flashinfer_nvfp4: NVFP4, e4m3 block scales over a global scale ---------------------

NVFP4_GLOBALS = [1.0, 0.0371, 2.0 ** -10, 7.5]


def sglang_dsv4_nvfp4(x: torch.Tensor, g: float) -> torch.Tensor:
    """sglang dsv4 nvfp4_k_cache.py, its torch path: per 16 nope values s = e4m3(clamp(amax / (6 g),
    0, 448)) (torch's conversion, nearest even), d = fp32(s) * g; a code counts the midpoints |x|
    passes against m * d (> or >=: ties to even), the sign of x as bit 3, every code 0 where d is not
    above 0; two codes per byte, the even value low; then the 28 scale bytes and the bf16 rope."""
    g32 = torch.tensor([g], dtype=torch.float32)
    t = x[:, :448].float().unflatten(-1, (28, 16))
    scale = (t.abs().amax(-1) / (6.0 * g32)).clamp(min=0.0, max=448.0).to(torch.float8_e4m3fn)
    d = (scale.float() * g32)[..., None]
    a = t.abs()
    codes = sum(((a >= d * m) if up else (a > d * m)).to(torch.int32) for m, up in E2M1_LADDER)
    codes = torch.where(d > 0, codes | ((t.view(torch.int32) >> 28) & 0x8), 0).flatten(-2)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return torch.cat([packed, scale.view(torch.uint8), x[:, 448:].contiguous().view(torch.uint8)], -1)


def dsv4_nvfp4_records(x: torch.Tensor, g: float, page: int = 64) -> torch.Tensor:
    m = module("dsv4_nvfp4")
    cache = m.Cache(torch.zeros(-(-x.shape[0] // page), page * 380, dtype=torch.uint8))
    m.quantize_store_ref(x, torch.arange(x.shape[0]), cache, page, torch.tensor([g], dtype=torch.float32))
    return cache.k_cache.view(-1, 380)[: x.shape[0]]


@pytest.mark.parametrize("g", NVFP4_GLOBALS, ids=str)
def test_dsv4_nvfp4_equals_sglangs_torch_path_except_where_it_propagates_nan(g):
    """Equal bytes (codes, scales, rope) on every block without a NaN, infinities included. A block
    holding a NaN differs: sglang's torch amax is NaN there (scale byte 0x7F, every code +0), where
    kvlayout's amax ignores the NaN, as sglang's Triton writer does (tl.max drops NaN operands)."""
    x = peer_rows(512, 51)
    ours, theirs = dsv4_nvfp4_records(x, g), sglang_dsv4_nvfp4(x, g)
    assert torch.equal(ours[:, 252:], theirs[:, 252:])
    blocks = x[:, :448].float().unflatten(-1, (28, 16))
    differ = (ours[:, :224] != theirs[:, :224]).unflatten(-1, (28, 8)).any(-1) | (ours[:, 224:252] != theirs[:, 224:252])
    nan = tiles_with(blocks, torch.isnan)
    assert not differ[~nan].any()
    assert differ[nan].all()                             # each NaN block: sglang's NaN scale


def flashinfer_nvfp4_block(t: torch.Tensor, g: float, reciprocal: bool) -> tuple:
    """FlashInfer's nvfp4_append_quantize_block (include/flashinfer/page.cuh) in IEEE fp32 (it builds
    with fast math: its division and reciprocal are approximate, not modelled): amax an fmaxf
    reduction (NaN dropped), sf = e4m3 satfinite(amax / (6 g)) where amax > 0 (else 0), then each
    value times 1 / (fp32(sf) g) (or, reciprocal=False, divided by fp32(sf) g) onto e2m1 by its
    comparisons (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0;
    above 5: 6), the sign bit of the product kept (signed zeros, a NaN's sign). (codes, scale bytes)."""
    g32 = torch.tensor(g, dtype=torch.float32)
    amax = amax_fmaxf(t)
    sf = torch.where(amax > 0, amax / (6.0 * g32), 0.0)
    sf8 = satfinite_e4m3(sf)
    d = sf8.view(torch.float8_e4m3fn).float() * g32
    live = (amax > 0) & (d > 0)
    if reciprocal:
        q = t * torch.where(live, 1.0 / d, 0.0)[..., None]
    else:
        q = torch.where(live[..., None], t / d[..., None], t * 0.0)
    mag = q.abs()
    code = sum(((mag >= m) if up else (mag > m)).to(torch.int32) for m, up in E2M1_LADDER)
    return (code | ((q.view(torch.int32) >> 28) & 0x8)).to(torch.uint8), sf8


def flashinfer_nvfp4_cache(x: torch.Tensor, g: float) -> tuple:
    """The spec's caches for K = x at slots 0.. of pages of 16: (codes (T, heads, 128), scale bytes
    (T, heads, 8)), unpacked, as FlashInfer's [pages, P, H, 64] / [pages, P, H, 8] tensors read."""
    m = module("flashinfer_nvfp4")
    page, heads = 16, x.shape[1]
    cache = m.alloc_cache(-(-x.shape[0] // page), page, heads=heads, values=128)
    gs = torch.tensor([g], dtype=torch.float32)
    m.quantize_store_ref(x, x, torch.arange(x.shape[0]), cache, page, gs, gs)
    assert cache.k_cache.shape[-1] == 64 and cache.k_sf.shape[-1] == 8
    packed = cache.k_cache.reshape(-1, heads, 64)[: x.shape[0]]
    codes = torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2)
    assert cache.k_sf.dtype == torch.float8_e4m3fn                 # FlashInfer's dtype for its scale caches
    return codes, cache.k_sf.view(torch.uint8).reshape(-1, heads, 8)[: x.shape[0]]


def test_flashinfer_nvfp4_differs_from_flashinfers_writer_by_its_reciprocal_and_signed_zeros():
    """At each global scale: scale bytes equal everywhere. Codes: with FlashInfer's division restated
    exactly, equal except where FlashInfer keeps a sign kvlayout's codes drop (a negative zero or NaN
    in a block whose scale is 0, a negative NaN anywhere: its code 8, kvlayout's 0); with its
    reciprocal (x * (1 / (s g))), also codes one apart where the rounded reciprocal moves a value
    across a midpoint (some at these scales: the corpus reaches the double rounding)."""
    x = peer_rows(256, 52).view(-1, 2, 128)
    t = x.float().unflatten(-1, (8, 16))
    moved_total = 0
    for g in NVFP4_GLOBALS:
        codes, scales = flashinfer_nvfp4_cache(x, g)
        div_codes, their_scales = flashinfer_nvfp4_block(t, g, reciprocal=False)
        rcp_codes, _ = flashinfer_nvfp4_block(t, g, reciprocal=True)
        assert torch.equal(scales, their_scales), g
        ours = codes.unflatten(-1, (8, 16))
        zero_scale = (their_scales == 0)[..., None]
        signed = ((t.view(torch.int32) < 0) & (zero_scale | t.isnan())) & (ours == (div_codes & 0x7))
        assert torch.equal(ours[~signed], div_codes[~signed]), g
        assert signed.any(), g
        moved = (ours != rcp_codes) & ~signed
        step = (ours.to(torch.int32) - rcp_codes.to(torch.int32)).abs()[moved]
        assert bool((step == 1).all()), g
        moved_total += int(moved.sum())
    assert moved_total > 0
