"""Every compat function against the layout op it calls (which tests/test_oracle.py checks against the
oracle): the same bytes on adversarial rows and random cache bytes, outputs poisoned first, so an
argument the function maps wrongly (or drops, like a caller's `out`) shows. The vLLM writers are
also checked against vLLM's own kernels, restated, in tests/test_peers.py."""
import importlib

import pytest
import torch

from tests.conftest import DEVICE, ROOT
from tests.corpus import adversarial_rows, generator, random_bytes, scaled_normal
from tests.harness import assert_same_bytes, assert_same_cache, clone, fresh_cache


def compat(name: str):
    return importlib.import_module(f"generated.compat.{name}")


def layout(name: str):
    return importlib.import_module(f"generated.{name}")


def rows(count: int, values: int, gen, specials: int = 12) -> torch.Tensor:
    """`count` fp32 rows: special values (NaN, inf, +-0, subnormals, ties, past fmax), then random ones."""
    x = scaled_normal((count, values), gen, torch.float32)
    n = min(count, specials)
    x[:n] = adversarial_rows(values, gen, torch.float32)[-specials:][:n]
    return x


def test_sglang_dsv4_constants_are_dsv4_ks_geometry():
    """The seed module's constants restate dsv4_k's record: a spec edit that moves the record makes
    them wrong, which nothing else would notice (compat constants are plain numbers)."""
    from codegen import config, pipeline
    layouts, _ = pipeline.build_all(config.at_root(ROOT))
    dsv4 = layouts["dsv4_k"]
    nope, rope = dsv4.segments
    mod = compat("sglang_dsv4")
    assert (mod.DIM_NOPE, mod.DIM_ROPE) == (nope.values.const_value(), rope.values.const_value())
    assert (mod.TILE_SIZE, mod.NUM_SCALE_TILES) == (nope.scale.tile, nope.scale.count.const_value())
    assert mod.PADDED_SCALE_PER_TOKEN == nope.scale.padded_count.const_value()
    assert mod.NOPE_ROPE_BYTES == dsv4.record_bytes.const_value()
    assert mod.fp8_dtype == getattr(torch, nope.element.torch_dtype)


def test_sglang_dsv4_writer_and_readers_are_dsv4_k():
    mod, dsv4 = compat("sglang_dsv4"), layout("dsv4_k")
    gen = generator(51)
    page, num_pages, tokens = 64, 3, 40
    cache = fresh_cache(dsv4, num_pages, page, 1, 512, gen)
    k = rows(tokens, 512, gen).to(torch.bfloat16).to(DEVICE)
    loc = torch.randperm(num_pages * page, generator=gen)[:tokens]
    loc[:2] = torch.tensor([-1, 5])
    loc = loc.to(DEVICE)
    got, want = clone(dsv4, cache), clone(dsv4, cache)
    mod.quantize_k_cache_paged(k, loc, got.k_cache, page)
    dsv4.quantize_store(k.view(tokens, 1, 512), loc, want, page)
    assert_same_cache(dsv4, got, want, "quantize_k_cache_paged vs dsv4_k.quantize_store")
    ids = torch.arange(-2, num_pages * page + 2, device=DEVICE)
    want = dsv4.gather_dequant(got, ids, page)
    out = torch.full((ids.numel(), 1, 512), 7.0, dtype=torch.bfloat16, device=DEVICE)     # a poisoned workspace
    result = mod.dequantize_k_cache_paged(got.k_cache, ids, page, out=out)
    assert result.data_ptr() == out.data_ptr(), "the caller's out is the result"
    assert_same_bytes(out, want, "dequantize_k_cache_paged(out=) vs dsv4_k.gather_dequant")
    assert_same_bytes(mod.dequantize_k_cache_paged(got.k_cache, ids, page), want, "dequantize_k_cache_paged")
    assert_same_bytes(mod.dequantize_k_cache_paged_ref(got.k_cache, ids, page), want, "dequantize_k_cache_paged_ref")
    out.fill_(7.0)
    assert mod.dequantize_k_cache_paged_ref(got.k_cache, ids, page, out=out).data_ptr() == out.data_ptr()
    assert_same_bytes(out, want, "dequantize_k_cache_paged_ref(out=)")


def test_compat_errors_point_to_the_layout_modules_allocators():
    """A compat module has no alloc_cache: its errors name the layout module's."""
    mod = compat("sglang_dsv4")
    with pytest.raises(ValueError, match=r"^quant_k_cache: .* allocate it with dsv4_k\.alloc_cache/dsv4_k\.cache_shapes$"):
        mod.dequantize_k_cache_paged(torch.zeros(37440 * 2 + 5, dtype=torch.uint8, device=DEVICE),
                                     torch.arange(3, device=DEVICE), 64)


def test_compat_references_take_every_parameter_of_their_twins():
    import inspect
    names = sorted(path.stem for path in (ROOT / "generated" / "compat").glob("*.py") if path.stem != "__init__")
    refs = [(mod, f) for mod in map(compat, names) for f in mod.__all__ if f.endswith("_ref")]
    assert refs
    for mod, ref in refs:
        twin = inspect.signature(getattr(mod, ref[:-4])).parameters
        assert list(inspect.signature(getattr(mod, ref)).parameters) == list(twin), ref


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sglang_mxfp8_dense_functions_are_mxfp8_kv(out_dtype):
    """to_mxfp8 over every bf16 pattern and special rows; from_mxfp8 over every code and scale byte;
    the round trip."""
    mod, mx = compat("sglang_mxfp8"), layout("mxfp8_kv")
    gen = generator(52)
    x = adversarial_rows(256, gen, torch.bfloat16).to(DEVICE)
    t = mod.to_mxfp8(x)
    data, scale = mx.quantize(x)
    assert isinstance(t, mod.MXFP8Tensor)
    assert_same_bytes(t.data, data, "to_mxfp8 data vs mxfp8_kv.quantize")
    assert_same_bytes(t.scale, scale, "to_mxfp8 scale vs mxfp8_kv.quantize")
    assert_same_bytes(mod.from_mxfp8(t, out_dtype), mx.dequantize(data, scale, out_dtype), "from_mxfp8(to_mxfp8(x))")
    assert mod.from_mxfp8(t).dtype == torch.bfloat16, "from_mxfp8's default out_dtype is the seed's"
    codes, scales = random_bytes(data.clone(), gen), random_bytes(scale.clone(), gen)
    codes.view(torch.uint8).view(-1)[:256] = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)
    scales.view(-1)[:256] = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)
    assert_same_bytes(mod.from_mxfp8(mod.MXFP8Tensor(codes, scales), out_dtype), mx.dequantize(codes, scales, out_dtype),
                      "from_mxfp8 vs mxfp8_kv.dequantize")


def test_sglang_mxfp8_writers_are_their_layouts():
    """quant_store_kv_mxfp8 is mxfp8_kv.quantize_store (page_size passed and defaulted), and
    update_mxfp8_v_cache_seqblocked is mxfp8_v_seqblocked.append (page size read off v_cache)."""
    mod, mx, seq = compat("sglang_mxfp8"), layout("mxfp8_kv"), layout("mxfp8_v_seqblocked")
    gen = generator(53)
    heads, values, tokens = 2, 64, 24
    for page in (32, 128):
        cache = fresh_cache(mx, 2, page, heads, values, gen)
        k, v = (rows(tokens * heads, values, gen).view(tokens, heads, values).to(torch.bfloat16).to(DEVICE) for _ in "kv")
        loc = torch.randperm(2 * page, generator=gen)[:tokens]
        loc[:2] = torch.tensor([-1, 0])                   # skipped, and the sink
        loc = loc.to(DEVICE)
        got, want = clone(mx, cache), clone(mx, cache)
        args = (k, v, loc, got.k_cache, got.v_cache, got.k_sf, got.v_sf) + ((page,) if page != 128 else ())
        mod.quant_store_kv_mxfp8(*args)
        mx.quantize_store(k, v, loc, want, page)
        assert_same_cache(mx, got, want, f"quant_store_kv_mxfp8 (page {page}) vs mxfp8_kv.quantize_store")
    for page in (32, 64):                                 # (the page size v_cache's shape gives)
        cache = seq.alloc_cache(3, page, heads=heads, values=values, device=DEVICE)    # zeroed, as the seed asks
        got, want = clone(seq, cache), clone(seq, cache)
        for step, loc in enumerate(([*range(0, 35), *range(64, 70), -1], [35, 36, 70], [71 + t for t in range(25)])):
            v = (rows(len(loc) * heads, values, gen) * 4.0 ** step).view(len(loc), heads, values).to(torch.bfloat16)
            loc = torch.tensor(loc, device=DEVICE)
            mod.update_mxfp8_v_cache_seqblocked(v.to(DEVICE), loc, got.v_cache, got.v_sf)
            seq.append(v.to(DEVICE), loc, want, page)
            assert_same_cache(seq, got, want, f"update_mxfp8_v_cache_seqblocked (page {page}) step {step} vs "
                              "mxfp8_v_seqblocked.append")


def test_vllm_ds32_writer_is_ds32_indexer():
    """indexer_k_quant_and_cache on vLLM's (num_blocks, block_size, 132) cache: ds32_indexer's
    quantize_store, slot_mapping entries past k's rows not read."""
    mod, ds = compat("vllm_ds32"), layout("ds32_indexer")
    gen = generator(54)
    page, tokens = 64, 30
    cache = fresh_cache(ds, 2, page, 1, 128, gen)
    k = rows(tokens, 128, gen).to(DEVICE)
    loc = torch.randperm(2 * page, generator=gen)[:tokens + 4]
    loc[0] = -1
    loc = loc.to(DEVICE)
    got, want = clone(ds, cache), clone(ds, cache)
    mod.indexer_k_quant_and_cache(k, got.k_cache.view(2, page, 132), loc, 128, None)
    ds.quantize_store(k, loc[:tokens], want, page)
    assert_same_cache(ds, got, want, "indexer_k_quant_and_cache vs ds32_indexer.quantize_store")


@pytest.mark.parametrize("scale_fmt", ["ue8m0", "", None])
def test_vllm_ds32_scale_fmt_picks_the_scale_rule(scale_fmt):
    """scale_fmt "ue8m0" (DeepSeek-V3.2's) stores vLLM's power-of-two scales, 2^ceil(log2(max(amax,
    1e-4) / 448)), through ds32_indexer_ue8m0 on the same pages; "" and None, the fp32 quotient: on
    the finite rows, the rule restated in float64 (bf16 keys: no quotient lies within a rounding of
    a power of two); on every row, the layout's reference."""
    mod = compat("vllm_ds32")
    gen = generator(55)
    page, tokens = 16, 40
    k = rows(tokens, 128, gen).to(torch.bfloat16).to(DEVICE)
    k[12:14] = 0                                  # amax floored at 1e-4
    k[14, 7] = 448 * 2.0 ** -3                    # amax / 448 a power of two: both rules store it
    loc = torch.randperm(3 * page, generator=gen)[:tokens].to(DEVICE)
    cache = torch.full((3, page, 132), 0xA5, dtype=torch.uint8, device=DEVICE)
    mod.indexer_k_quant_and_cache(k, cache, loc, 128, scale_fmt)
    flat = cache.view(3, -1)
    page_of, slot = loc // page, loc % page
    scales = torch.stack([flat[p, page * 128 + 4 * s:page * 128 + 4 * s + 4] for p, s in zip(page_of.tolist(), slot.tolist())])
    got = scales.contiguous().view(torch.float32).view(-1).double().cpu()
    quotient = k.double().abs().amax(-1).clamp(min=1e-4).cpu() / 448
    want = torch.exp2(torch.ceil(torch.log2(quotient))) if scale_fmt == "ue8m0" else quotient.float().double()
    finite = k.isfinite().all(-1).cpu()
    assert finite.sum() > 20 and torch.equal(got[finite], want[finite]), (scale_fmt, (got != want).nonzero()[:5])
    layout_name = "ds32_indexer_ue8m0" if scale_fmt == "ue8m0" else "ds32_indexer"
    ds = layout(layout_name)
    want_cache = ds.Cache(k_cache=torch.full((3, page * 132), 0xA5, dtype=torch.uint8, device=DEVICE))
    ds.quantize_store_ref(k, loc, want_cache, page)
    assert torch.equal(flat, want_cache.k_cache), f"indexer_k_quant_and_cache({scale_fmt!r}) vs {layout_name}"
