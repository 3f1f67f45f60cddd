"""Numerics that do not depend on comparing kernels with references: the scale rule against its
definition, quantization error bounds, and the generated conversions against the GPU's."""
import pytest
import torch
import triton
import triton.language as tl

from tests.conftest import DEVICE, ON_GPU
from tests.corpus import all_bf16, generator, scaled_normal
from tests.harness import LAYOUTS, SPECS, module

FMAX = {"fp8_e4m3fn": 448.0, "fp8_e5m2": 57344.0}


def groups():
    """(layout, group, rule, element format, floor, lo, hi, scale floor) for every scale group of every spec (zoo included)."""
    from codegen.build import build_layout, load_spec
    from tests.layouts import ROOT, SPECS
    out = []
    for name in LAYOUTS:
        folder = ROOT / "specs" if name in SPECS else ROOT / "tests" / "specs"
        kind, tree, display, digest = load_spec(folder / f"{name}.yaml", ROOT)
        layout = build_layout(tree, display, digest)
        for g in layout.stored_scales:       # (a given scale has no rule)
            out.append(pytest.param(name, g.name, g.rule, g.element, g.amax_floor, g.exponent_lo, g.exponent_hi,
                                    g.scale_floor, id=f"{name}.{g.name}-{g.rule}"))
    return out


def amax_corpus() -> torch.Tensor:
    """Every non-negative finite bf16 value, 2^20 random fp32 ones, and fmax-relative boundaries."""
    bf16 = all_bf16().to(torch.float32)
    fp32 = torch.randint(0, 0x7F800000, (1 << 20,), dtype=torch.int32, generator=generator(3)).view(torch.float32)
    return torch.cat([bf16[(bf16 >= 0) & bf16.isfinite()], fp32])


@pytest.mark.parametrize("name,group,rule,element,floor,lo,hi,scale_floor", groups())
def test_scale_rule_matches_its_definition(name, group, rule, element, floor, lo, hi, scale_floor):
    """Each rule, checked exactly in float64 (products of powers of two are exact) against its
    definition, for every non-negative finite bf16 amax and 2^20 random fp32 ones:
    rceil   smallest e with amax <= fmax * 2^e
    floor   2^e <= amax / 2^emax < 2^(e+1)             (OCP MX; emax = floor(log2 fmax))
    ceil    2^(e-1) < amax / 2^emax <= 2^e
    even    floor, after rounding amax to the element's mantissa width (half-up, as torchao EVEN)
    nearest |log2(amax / fmax) - e| <= 1/2
    exact   amax / fmax rounded once to fp32, then at least the scale floor (an fp32 value); e4m3
            scales: the nearest e4m3 code to amax / (fmax * g) rounded once to fp32 (ties to the even
            code, saturated at 448), by the oracle's table of every code, with and without a global g"""
    m = module(name)
    amax = amax_corpus()
    bits = amax.view(torch.int32)
    a = amax.to(torch.float64).clamp(min=floor or 0.0)
    fmax = element.fmax
    emax = element.fmax_exponent
    if m._REF_GROUPS[group].code is not None:
        from tests import oracle
        for g in (None, 0.37, 3.0e-3):
            # fmax times g's fp32 value, rounded to fp32, as the kernels and references compute it
            divisor = fmax if g is None else float(torch.tensor(fmax, dtype=torch.float32) * torch.tensor(g, dtype=torch.float32))
            got = m._ref_exact_scale(m._REF_GROUPS[group], bits, None if g is None else torch.tensor(g))
            q = (a.abs() / divisor).to(torch.float32).numpy()        # (the corpus holds -0: amax is |x|)
            want = oracle.decode("fp8_e4m3fn", oracle.encode("fp8_e4m3fn", q)).astype("float32")
            assert torch.equal(got.view(torch.int32), torch.from_numpy(want).view(torch.int32)), g
        return
    if rule == "exact":
        got = m._ref_exact_scale(m._REF_GROUPS[group], bits)
        want = (a.abs() / fmax).to(torch.float32)          # (the corpus holds -0: amax is |x|)
        if scale_floor is not None:
            assert scale_floor == float(torch.tensor(scale_floor, dtype=torch.float32))
            want = torch.where(want < scale_floor, scale_floor, want)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        return
    e = m._ref_exponent(m._REF_GROUPS[group], bits).to(torch.float64)
    assert bool(((e >= lo) & (e <= hi)).all())
    free = (e > lo) & (e < hi) & (a >= 2.0 ** -126)      # not clamped, amax normal
    p = torch.exp2(e)
    if rule == "rceil":
        ok = (a <= fmax * p) & ((e == lo) | (a > fmax * p / 2))
        ok = ok | (e == hi)
    elif rule == "floor":
        ok = ~free | ((a >= p * 2.0 ** emax) & (a < 2 * p * 2.0 ** emax))
    elif rule == "ceil":
        ok = ~free | ((a > p * 2.0 ** (emax - 1)) & (a <= p * 2.0 ** emax))
    elif rule == "even":
        mant, ex = torch.frexp(a)                        # a = mant * 2^ex, mant in [0.5, 1)
        step = 2.0 ** -(element.mantissa_bits + 1)
        rounded = torch.floor(mant / step + 0.5) * step * torch.exp2(ex.to(torch.float64))
        ok = ~free | ((rounded >= p * 2.0 ** emax) & (rounded < 2 * p * 2.0 ** emax))
    elif rule == "nearest":
        ok = ~free | ((torch.log2(a / fmax) - e).abs() <= 0.5)
    assert bool(ok.all()), amax[~ok][:5]
    # An infinite amax takes the largest exponent.
    assert int(m._ref_exponent(m._REF_GROUPS[group], torch.tensor([float("inf")]).view(torch.int32))) == hi


@triton.jit
def _exponent_probe(bits_ptr, out_ptr, n, EXPONENT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, EXPONENT(tl.load(bits_ptr + i, mask=i < n, other=0)), mask=i < n)


@pytest.mark.parametrize("name,group,rule,element,floor,lo,hi,scale_floor", [g for g in groups() if g.values[2] != "exact"])
def test_kernel_exponent_equals_the_reference(name, group, rule, element, floor, lo, hi, scale_floor):
    """The kernels' integer exponent (a carry into the exponent bits where the rule has one term,
    clamps left out where the floor and fp32's range make them moot) equals the reference's, for
    the amax corpus plus zero and infinity."""
    m = module(name)
    bits = torch.cat([amax_corpus().view(torch.int32), torch.tensor([0, 0x7F800000], dtype=torch.int32)]).to(DEVICE)
    out = torch.empty_like(bits)
    block = 1 << 16
    _exponent_probe[(triton.cdiv(bits.numel(), block),)](bits, out, bits.numel(), getattr(m, f"_{group}_exponent"), block)
    assert torch.equal(out.cpu(), m._ref_exponent(m._REF_GROUPS[group], bits.cpu()).to(torch.int32))


@pytest.mark.parametrize("name", [n for n in SPECS if "quantize" in module(n).OPS])
def test_quantization_error_is_half_an_fp8_step(name):
    """|dequantize(quantize(x)) - x| <= max(|x| * 2^-4, s * 2^-10) for e4m3 (3 mantissa bits,
    subnormal step 2^-9 at scale s), for finite rows over scales 2^-20..2^20."""
    m = module(name)
    values = m.VALUES or 128
    x = scaled_normal((64, values), generator(4), torch.float32).to(torch.bfloat16).to(DEVICE)
    data, scale = m.quantize(x)
    y = m.dequantize(data, scale, torch.float32)
    err = (y - x.float()).abs()
    bound = x.float().abs() * 2.0 ** -4
    # the row's largest scale s bounds the subnormal half step, s * 2^-10 (fp32 scales, or ue8m0 bytes)
    s = scale.to(torch.float32) if scale.dtype == torch.float32 else torch.exp2(scale.to(torch.float32) - 127)
    bound = torch.maximum(bound, s.amax(-1, keepdim=True) * 2.0 ** -10)
    assert bool((err <= bound).all())   # raw segments (DSv4 rope) are exact, so they pass too


@triton.jit
def _map_kernel(x_ptr, y_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, FN(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def _convert_kernel(x_ptr, y_ptr, n, CONVERT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, CONVERT(tl.load(x_ptr + offs, mask=mask), y_ptr.dtype.element_ty), mask=mask)


def apply(fn, x: torch.Tensor, dtype) -> torch.Tensor:
    """A generated @triton.jit element function on every element of x, on the test device (the GPU, or
    the stock interpreter: there the generated code takes its exact integer path)."""
    x = x.to(DEVICE)
    y = torch.empty(x.shape, dtype=dtype, device=DEVICE)
    _map_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), fn, BLOCK=1024)
    return y.cpu()


def convert(m, x: torch.Tensor, dtype) -> torch.Tensor:
    """x converted to dtype by a generated module's _convert."""
    x = x.to(DEVICE)
    y = torch.empty(x.shape, dtype=dtype, device=DEVICE)
    _convert_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), m._convert, BLOCK=1024)
    return y.cpu()


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


FACTS_ENCODE = [  # fp32 value -> e4m3fn code, as cvt.rn.satfinite.e4m3x2.f32 gives on an H200
    (1.0625, 0x38), (1.1875, 0x3A), (126.24, 0x70), (464.0, 0x7E), (480.0, 0x7E), (1e30, 0x7E),
    (float("inf"), 0x7E), (-float("inf"), 0xFE), (float("nan"), 0x7F), (-float("nan"), 0x7F),
    (2.0 ** -9, 0x01), (2.0 ** -10, 0x00), (3 * 2.0 ** -11, 0x01), (-0.0, 0x80), (2.0 ** -7 * 1.0625, 0x04), (2.0 ** -6 * 1.0625, 0x08),
]
FACTS_BF16 = [(1 + 2 ** -8, 0x3F80), (1 + 3 * 2 ** -8, 0x3F82), (float("nan"), 0x7FFF), (-float("nan"), 0x7FFF),
              (3.4e38, 0x7F80), (-2.0 ** -135, -0x8000)]
# Per element format: a layout to take its generated encoder and decoder from, torch's dtype,
# the largest finite value and the NaN code the encoders write.
FORMATS = {
    "fp8_e4m3fn": ("mxfp8_kv", torch.float8_e4m3fn, 448.0, 0x7F),
    "fp8_e5m2": ("zoo_e5m2_floor", torch.float8_e5m2, 57344.0, 0x7F),
    "fp8_e4m3fnuz": ("zoo_fnuz_ceil_fp32", torch.float8_e4m3fnuz, 240.0, 0x80),
}


def random_fp32(n: int, seed: int) -> torch.Tensor:
    """n uniformly random fp32 bit patterns (NaNs, infinities and subnormals among them)."""
    x = torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), dtype=torch.int64, generator=generator(seed))
    return x.to(torch.int32).view(torch.float32)


def test_conversions_match_the_gpu():
    """The generated conversions give the H200's measured results (tools/probe_numerics.py), on the
    GPU and under the stock interpreter alike."""
    m = module("mxfp8_kv")
    x = torch.tensor([v for v, _ in FACTS_ENCODE], dtype=torch.float32)
    assert bits(apply(m._encode_fp8_e4m3fn, x, torch.uint8)).tolist() == [c for _, c in FACTS_ENCODE]
    x = torch.tensor([v for v, _ in FACTS_BF16], dtype=torch.float32)
    assert bits(convert(m, x, torch.bfloat16)).tolist() == [c for _, c in FACTS_BF16]


@pytest.mark.parametrize("element", sorted(FORMATS))
def test_encoder_is_round_to_nearest_even_with_saturation(element):
    """A format's encoder on every bf16 bit pattern and 2^20 random fp32 ones: round to nearest even
    after saturating to +-fmax (infinities included), every NaN to the NaN code: the H200's
    cvt.rn.satfinite for all 2^32 fp32 inputs (tools/probe_numerics.py). This checks the integer
    encoder for e4m3fnuz everywhere, and for every format under the interpreter."""
    name, dtype, fmax, nan_code = FORMATS[element]
    x = torch.cat([all_bf16().to(torch.float32), random_fp32(1 << 20, 5)])
    got = apply(getattr(module(name), f"_encode_{element}"), x, torch.uint8)
    q = torch.where(x.isnan(), x, x.clamp(-fmax, fmax))
    want = torch.where(q.isnan(), nan_code, bits(q.to(dtype)).to(torch.int32)).to(torch.uint8)
    assert torch.equal(got, want)


@pytest.mark.parametrize("element", sorted(FORMATS))
def test_decoder_is_exact_on_every_code(element):
    """A format's decoder on all 256 codes: torch's value, and the canonical NaN for NaN codes."""
    name, dtype, _, _ = FORMATS[element]
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = bits(apply(getattr(module(name), f"_decode_{element}"), codes, torch.float32))
    want = codes.view(dtype).to(torch.float32)
    want = torch.where(want.isnan(), torch.tensor(0x7FFFFFFF, dtype=torch.int32), bits(want))
    assert torch.equal(got, want)


FLOATS = (torch.bfloat16, torch.float16, torch.float32)


@pytest.mark.parametrize("dst", FLOATS, ids=str)
@pytest.mark.parametrize("src", FLOATS, ids=str)
def test_float_conversion_is_the_gpus(src, dst):
    """_convert (every source load, raw copy and output store of a kernel) on every 16-bit pattern, or
    2^20 random fp32 ones and rounding ties, equals the references' cast: round to nearest even, the
    canonical NaN for narrowing and fp16 widening, bf16 widening and same-dtype copies keeping their
    bits. (The stock interpreter alone flushes bf16 subnormals and truncates to bf16.)"""
    m = module("dsv4_k")
    if src == torch.float32:
        ties = torch.tensor([0x7F7FFFFF, 0x7F7F8000, 0x3F808000, 0x3F818000, 0x00008000, 0x80018000], dtype=torch.int64).to(torch.int32)
        x = torch.cat([random_fp32(1 << 20, 6), ties.view(torch.float32)])
    else:
        x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(src)
    assert torch.equal(bits(convert(m, x, dst)), bits(m._ref_cast(x, dst, computed=False)))


@triton.jit
def _doubled(x):
    return x * 2


@triton.jit
def _helper_loop_kernel(x_ptr, out_ptr):
    offsets = tl.arange(0, 8)
    x = tl.load(x_ptr + offsets)
    for _ in tl.static_range(4):
        x = _doubled(x) + tl.max(x, axis=0)
    tl.store(out_ptr + offsets, x)


@pytest.mark.skipif(ON_GPU, reason="checks the CPU interpreter patch")
def test_interpreter_patches_the_language_once_per_launch(monkeypatch):
    """tests/interpreter_patch_once.py: each launch of a kernel (two programs) that calls a helper of
    its own and Triton's tl.max (which sees triton.language.core) four times each patches
    triton.language once and tl.max's modules once, computes the same, and leaves triton.language as
    it was; a helper called from host code first is patched as Triton does and changes none of this."""
    from tests import interpreter_patch_once
    original = interpreter_patch_once._original
    patched, scopes = [], []

    def counted(fn):
        patched.append(fn.__name__)
        scopes.append(original(fn))
        return scopes[-1]

    monkeypatch.setattr(interpreter_patch_once, "_original", counted)
    load = tl.load
    assert _doubled(3.5) == 7.0 and patched == ["_doubled"] and not interpreter_patch_once._launches
    scopes[0].restore()            # Triton leaves a host call's patch in place: undone for the checks below
    assert tl.load is load
    x = torch.arange(8, dtype=torch.float32)
    want = x.clone()
    for _ in range(4):
        want = want * 2 + want.max()
    for launch in range(2):
        out = torch.zeros(8)
        _helper_loop_kernel[(2,)](x, out)
        assert patched == ["_doubled"] + ["_helper_loop_kernel", "max"] * (launch + 1)
        assert torch.equal(out, want)
        assert tl.load is load and not interpreter_patch_once._launches


@pytest.mark.skipif(ON_GPU, reason="checks the CPU interpreter patch")
def test_interpreter_numpy_dtypes_are_the_interpreters():
    """The patch's cached _get_np_dtype answers as Triton's own for every element type, blocks of
    them and pointers (unhashable: asked of Triton each time), the first time and from the cache."""
    from triton.runtime import interpreter

    from tests import interpreter_patch_once
    assert interpreter._get_np_dtype is interpreter_patch_once._get_np_dtype_once
    original = interpreter_patch_once._np_dtype
    elements = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
                tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv, tl.pointer_type(tl.float32)]
    types = elements + [tl.block_type(e, [4, 2]) for e in elements]
    for _ in range(2):
        assert [interpreter._get_np_dtype(t) for t in types] == [original(t) for t in types]
    assert interpreter._get_np_dtype(tl.bfloat16) == torch.empty(0, dtype=torch.uint16).numpy().dtype


@pytest.mark.parametrize("element", ["fp8_e4m3fn", "fp8_e5m2"])
def test_fp16_rescale_route(element):
    """The seq-blocked append's rescale on sm_90 (_rescale_words: codes to f16x2, mul.rn.f16x2 by the
    factor 2^shift in fp16, cvt.rn.satfinite back) against the references' fp32 rescale, for every
    code and every shift a grown exponent can make (-1 .. -254), emulated on the CPU with the GPU's
    conversions (tests/gpu_conversions.py) and torch's fp16 multiply (one rounding: the product of
    two fp16 values is exact in fp32). e4m3fn: the same bytes everywhere. e5m2 (which does not take
    the route) differs where fp16 flushes the factor to zero (shifts past -24): its codes reach
    57344, so their rescaled values are still e5m2 codes there (and infinity times zero is NaN)."""
    from tests.gpu_conversions import gpu_convert
    m = module({"fp8_e4m3fn": "mxfp8_v_seqblocked", "fp8_e5m2": "zoo_tokens_nearest"}[element])
    tl_code = {"fp8_e4m3fn": tl.float8e4nv, "fp8_e5m2": tl.float8e5}[element]
    shifts = torch.arange(-254, 0, dtype=torch.int32)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)[None, :].repeat(len(shifts), 1)
    factor = m._ref_exp2i(shifts)[:, None].expand(codes.shape).contiguous()
    want = m._ref_encode(m._ref_decode(codes, element) * factor, element)
    half_codes = gpu_convert(codes, tl_code, tl.float16).view(torch.float16)
    half_factor = gpu_convert(factor.view(torch.int32), tl.float32, tl.float16).view(torch.float16)
    got = gpu_convert((half_codes * half_factor).view(torch.int16), tl.float16, tl_code)
    differ = got != want
    if element == "fp8_e4m3fn":
        assert not differ.any()
    else:
        assert differ[shifts < -24].any() and not differ[shifts >= -24].any()


@triton.jit
def _scaled_map_kernel(x_ptr, y_ptr, n, scale, FN: tl.constexpr, BLOCK: tl.constexpr):
    """FN(x * scale): an encoder's input as its callers give it, a product (scale a call argument, so
    no compiler folds a product by 1)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, FN(tl.load(x_ptr + offs, mask=mask) * scale), mask=mask)


def test_e2m1_encoder_is_round_to_nearest_even_with_saturation():
    """fp4 e2m1's encoder, given x * 1 as its callers give it products and quotients, on every bf16
    bit pattern and 2^20 random fp32 ones equals the oracle's table of the 16 codes (nearest value,
    ties to the even code, +-6 beyond; a NaN gives +0). Its codes are the low bytes of int32s."""
    from tests import oracle
    x = torch.cat([all_bf16().to(torch.float32), random_fp32(1 << 20, 7)]).to(DEVICE)
    got = torch.empty(x.shape, dtype=torch.int32, device=DEVICE)
    _scaled_map_kernel[(triton.cdiv(x.numel(), 1024),)](x, got, x.numel(), 1.0, module("dsv4_mxfp4")._encode_fp4_e2m1,
                                                        BLOCK=1024)
    want = torch.from_numpy(oracle.encode("fp4_e2m1", x.cpu().numpy()))
    assert torch.equal((got.cpu() & 0xFF).to(torch.uint8), want)
    assert not (got.cpu() & 0xF0).any()          # bits 4..7 clear: the packed walk adds the odd code's nibble


@triton.jit
def _e2m1_paths_kernel(first, scale, mismatches_ptr, BLOCK: tl.constexpr):
    """Every fp32 bit pattern from `first` on (BLOCK per program), times scale: the GPU encoder's
    code (_e2m1_code) against the interpreter's (_e2m1_code_steps)."""
    m = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK) + first
    q = m.to(tl.int32).to(tl.float32, bitcast=True) * scale
    fast = _E2M1_MODULE._e2m1_code(q) & 0xFF
    steps = _E2M1_MODULE._e2m1_code_steps(q)
    tl.atomic_add(mismatches_ptr, tl.sum((fast != steps).to(tl.int32)))


_E2M1_MODULE = module("dsv4_mxfp4")


@pytest.mark.skipif(not ON_GPU, reason="the GPU encoder (inline PTX) runs on the GPU only")
def test_e2m1_gpu_encoder_matches_the_integer_path_on_every_fp32():
    """The GPU's e2m1 encoder (.sat fmas, see _e2m1_code) gives the interpreter path's code for all
    2^32 fp32 bit patterns (each times 1 and times -1, as the callers' products canonicalize NaN)."""
    mismatches = torch.zeros(1, dtype=torch.int32, device="cuda")
    block, chunk = 4096, 1 << 28
    for scale in (1.0, -1.0):
        for first in range(0, 1 << 32, chunk):
            _e2m1_paths_kernel[(chunk // block,)](first, scale, mismatches, BLOCK=block)
    assert int(mismatches) == 0


def test_e2m1_decoder_is_exact_on_every_code():
    from tests import oracle
    codes = torch.arange(16, dtype=torch.int32).to(torch.uint8)
    got = apply(module("dsv4_mxfp4")._decode_fp4_e2m1, codes, torch.float32)
    want = torch.tensor([oracle.code_value("fp4_e2m1", c) for c in range(16)], dtype=torch.float32)
    assert torch.equal(bits(got), bits(want))           # -0.0 (code 8) included


# (layout, [(first value, end, reading of scale byte 0xFF)]): its quantized segments and a raw tail
FF_READINGS = [("dsv4_k", [(0, 448, "inf")], 448),                       # ue8m0_ff: inf (the seeds)
               ("zoo_two_rules", [(0, 128, "inf"), (128, 192, "nan")], 192)]   # group b: ue8m0_ff: nan


@pytest.mark.parametrize("name, groups, raw", FF_READINGS, ids=[c[0] for c in FF_READINGS])
def test_ue8m0_byte_ff_reads_as_the_spec_says(name, groups, raw):
    """Scale byte 0xFF reads as +inf where the spec keeps the seeds' reading, as NaN with ue8m0_ff:
    nan (OCP MX, torch's float8_e8m0fnu); bytes in the normal range read as 2^(b - 127) (torch's
    float8_e8m0fnu). Kernel and reference, every scale byte in turn (row r holds byte r)."""
    m = module(name)
    data, scale = m.quantize_ref(torch.ones(256, m.VALUES, device=DEVICE))
    scale = scale.clone()
    scale.view(torch.uint8)[:] = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)[:, None]
    e8m0 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e8m0fnu).float()
    for got in (m.dequantize(data, scale, torch.float32), m.dequantize_ref(data, scale, torch.float32)):
        got = got.cpu()
        for lo, hi, reading in groups:
            ff = got[255, lo:hi]
            assert (ff.isnan() if reading == "nan" else ff == float("inf")).all(), (name, lo, reading)
            normal = slice(16, 200)                      # products stay normal fp32 numbers
            assert torch.equal(got[normal, lo], got[128, lo] * e8m0[normal] / e8m0[128]), (name, lo)
        assert torch.equal(got[255, raw:], got[128, raw:]), "raw values take no scale"


@triton.jit
def _quotient_kernel(x_ptr, d_ptr, q_ptr, want_ptr, n, DIVISOR: tl.constexpr, QUOTIENT: tl.constexpr,
                     WIDE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    d = tl.load(d_ptr + offs, mask=mask, other=1.0)
    p, dp, r = DIVISOR(d, WIDE)
    tl.store(q_ptr + offs, QUOTIENT(x, p, dp, r), mask=mask)
    tl.store(want_ptr + offs, tl.math.div_rn(x, d), mask=mask)


def assert_quotients(m, x: torch.Tensor, d: torch.Tensor, wide: bool = True, quotient=None) -> None:
    """_quotient(x, d) against div.rn, element by element: the same bits wherever |x / d| is in
    [2^-24, 2^96]; below, under 2^-23 with the quotient's sign; above, over 2^95 (or an infinity)
    with its sign; NaN exactly where the quotient is NaN. wide=False: _divisor without its scaling
    (divisors in [2^-77, 2^126), zeros, infinities). quotient: the function under test (the module's
    _quotient by default)."""
    q, want = (torch.empty_like(x) for _ in range(2))
    _quotient_kernel[(triton.cdiv(x.numel(), 1024),)](x, d, q, want, x.numel(), m._divisor, quotient or m._quotient, wide,
                                                      BLOCK=1024)
    a = want.abs()
    exact = (a >= 2.0 ** -24) & (a <= 2.0 ** 96)
    assert torch.equal(bits(q[exact]), bits(want[exact])), f"{int((bits(q[exact]) != bits(want[exact])).sum())} differ"
    tiny, huge = a < 2.0 ** -24, a > 2.0 ** 96
    assert bool((q[tiny].abs() < 2.0 ** -23).all()) and torch.equal(q[tiny].signbit(), want[tiny].signbit())
    assert bool((q[huge].abs() > 2.0 ** 95).all()) and torch.equal(q[huge].signbit(), want[huge].signbit())
    assert torch.equal(q.isnan(), want.isnan())


def unscaled_divisors(n: int, seed: int) -> torch.Tensor:
    """n random fp32 divisors of either sign, |d| log-uniform over [2^-77, 2^126) (where _divisor need
    not scale them)."""
    gen = generator(seed)
    d = torch.exp2(torch.rand(n, generator=gen, dtype=torch.float64) * 203 - 77).float()
    d = d.clamp(2.0 ** -77, torch.nextafter(torch.tensor(2.0 ** 126), torch.tensor(0.0)).item())
    return torch.where(torch.rand(n, generator=gen) < 0.5, -d, d)


def _interpreter_fma_is_exact() -> bool:
    """Whether this interpreter rounds tl.fma once (Triton 3.9's does; a product rounded first gives 0
    for (1 + 2^-12)^2 - (1 + 2^-11), the exact 2^-24)."""
    a = torch.tensor([1 + 2.0 ** -12]); c = torch.tensor([-(1 + 2.0 ** -11)])
    y = torch.empty(1)
    _fma_kernel[(1,)](a, c, y)
    return y.item() == 2.0 ** -24


@triton.jit
def _fma_kernel(a_ptr, c_ptr, y_ptr):
    a = tl.load(a_ptr + tl.arange(0, 1))
    tl.store(y_ptr + tl.arange(0, 1), tl.fma(a, a, tl.load(c_ptr + tl.arange(0, 1))))


def check_quotients(m, quotient, scales: int, n: int, others: int) -> None:
    """assert_quotients over the corpus: every bf16 value over `scales` of the scales the exact rule
    gives a bf16 amax (RN(amax / 448), FLT_MIN floor; all of them for scales=None), with and without
    the divisors' scaling (for those in [2^-77, 2^126) unscaled, as ScaleGroup.wide_divisors allows);
    n random fp32 pairs of every bit pattern, over scaled and over unscaled divisors, n of normal values
    near each other's range; and the edges (zeros, infinities, NaN, subnormal divisors, the bounds
    2^+-64, 2^-77, 2^126 and their neighbours) against themselves and `others` random values."""
    x = all_bf16().to(torch.float32).to(DEVICE)
    amax = all_bf16().to(torch.float32)
    amax = amax[(amax > 0) & amax.isfinite()]
    every = torch.maximum(amax / 448.0, torch.tensor(2.0 ** -126)).unique()
    chosen = every if scales is None else every[torch.randperm(every.numel(), generator=generator(18))[:scales]]
    for chunk in chosen.to(DEVICE).split(2048):
        assert_quotients(m, x.repeat(chunk.numel()), chunk.repeat_interleave(x.numel()), True, quotient)
        narrow = chunk[chunk >= 2.0 ** -77]
        assert_quotients(m, x.repeat(narrow.numel()), narrow.repeat_interleave(x.numel()), False, quotient)
    assert_quotients(m, random_fp32(n, 11).to(DEVICE), random_fp32(n, 12).to(DEVICE), True, quotient)
    assert_quotients(m, random_fp32(n, 16).to(DEVICE), unscaled_divisors(n, 17).to(DEVICE), False, quotient)
    gen = generator(13)
    near = [torch.randn(n, generator=gen) * torch.exp2(torch.randint(-40, 41, (n,), generator=gen).float())
            for _ in range(2)]
    assert_quotients(m, near[0].to(DEVICE), near[1].to(DEVICE), True, quotient)
    edges = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 2.0 ** -149, 2.0 ** -126,
                          2.0 ** -64, 2.0 ** 64, 2.0 ** -77, 2.0 ** 126, 2.0 ** 127, 3.4028234663852886e38, 1.0,
                          448.0, 6.0])
    edges = torch.cat([edges, -edges, torch.nextafter(edges, torch.tensor(float("inf"))),
                       torch.nextafter(edges, torch.tensor(0.0))])
    values = torch.cat([edges, random_fp32(others, 14), scaled_normal((others,), generator(15), torch.float32)])
    xs, ds = (t.contiguous() for t in torch.cartesian_prod(values, edges).unbind(1))
    assert_quotients(m, xs.to(DEVICE), ds.to(DEVICE), True, quotient)
    assert_quotients(m, ds.to(DEVICE), xs.to(DEVICE), True, quotient)
    narrow = (ds.abs() >= 2.0 ** -77) & (ds.abs() < 2.0 ** 126) | (ds == 0) | ds.isinf()
    assert_quotients(m, xs[narrow].to(DEVICE), ds[narrow].to(DEVICE), False, quotient)


@pytest.mark.skipif(ON_GPU, reason="the GPU test below runs _markstein itself, at full size")
def test_markstein_quotient_under_an_exact_interpreter():
    """The GPU's quotient (_markstein) run by the interpreter, where its fma rounds once: the GPU
    test's corpus at interpreter sizes (6 scales, 2^16 random pairs)."""
    if not _interpreter_fma_is_exact():
        pytest.skip("this Triton's interpreter rounds an fma twice")
    m = module("vllm_ds_mla")
    check_quotients(m, m._markstein, scales=6, n=1 << 16, others=256)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter divides; the GPU multiplies and corrects")
def test_quotient_is_the_correctly_rounded_division():
    """The writers' x / scale (_divisor once per scale, _quotient per value) on the GPU, over every
    scale a bf16 amax gives, 2^26 random pairs of each kind and the edges (check_quotients)."""
    m = module("vllm_ds_mla")
    check_quotients(m, m._quotient, scales=None, n=1 << 26, others=4096)
