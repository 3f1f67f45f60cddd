"""Probe the GPU's numeric conversions that kvlayout's kernels and references depend on.

Run on a CUDA machine: python tools/probe_numerics.py. Prints one line per finding.
Exhaustive where it is cheap (all 2^32 fp32 bit patterns for the fp32 -> 8/16-bit casts).
"""
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mul_kernel(x_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    s = tl.load(s_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * s, mask=mask)


@triton.jit
def _div_kernel(x_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    s = tl.load(s_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x / s, mask=mask)


@triton.jit
def _exp2_log2_kernel(e_ptr, x_ptr, exp2_ptr, log2_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = tl.load(e_ptr + offs, mask=mask)
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(exp2_ptr + offs, tl.exp2(e), mask=mask)
    tl.store(log2_ptr + offs, tl.log2(x), mask=mask)


def cast(x, dtype):
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    n = x.numel()
    _cast_kernel[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
    return y


def bits(t):
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]


def hexset(t, limit=8):
    vals = sorted(set(t.flatten().tolist()))
    return "{" + ", ".join(hex(v & 0xFFFFFFFF) for v in vals[:limit]) + (" ..." if len(vals) > limit else "") + "}"


def sat_ref(x, dtype, fmax):
    """RNE with saturation to +-fmax (NaN stays NaN): the guide's claim for cvt.rn.satfinite."""
    return torch.where(x.isnan(), x, x.clamp(-fmax, fmax)).to(dtype)


def exhaustive_f32(dst, ref_fn, name):
    chunk = 1 << 28
    total = 0
    nan_out = set()
    inf_in_out = {}
    examples = []
    for start in range(0, 1 << 32, chunk):
        b = torch.arange(start, start + chunk, dtype=torch.int64, device="cuda").to(torch.int32)
        x = b.view(torch.float32)
        got = cast(x, dst).view(bits(torch.empty(0, dtype=dst)))
        ref = ref_fn(x).view(got.dtype)
        isnan = x.isnan()
        bad = (got != ref) & ~isnan
        total += int(bad.sum())
        if bad.any() and len(examples) < 6:
            idx = bad.nonzero().flatten()[:3]
            examples += [(hex(int(b[i]) & 0xFFFFFFFF), hex(int(got[i]) & 0xFFFF), hex(int(ref[i]) & 0xFFFF)) for i in idx]
        nan_out |= set((got[isnan].unique().to(torch.int64) & 0xFFFF).tolist())
        isinf = x.isinf()
        if isinf.any():
            for i in isinf.nonzero().flatten().tolist():
                inf_in_out[float(x[i])] = hex(int(got[i]) & 0xFFFF)
        del b, x, got, ref
    print(f"{name}: non-NaN mismatches vs reference = {total}; examples (in, gpu, ref) {examples}")
    print(f"{name}: NaN inputs -> {sorted(hex(v) for v in nan_out)}; inf -> {inf_in_out}")


def cpu_vs_cuda_torch():
    """The exhaustive checks use torch's CUDA casts as reference; CI uses torch's CPU casts."""
    g = torch.Generator(device="cuda").manual_seed(0)
    b = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 26,), dtype=torch.int32, device="cuda", generator=g)
    x = b.view(torch.float32)
    for name, fn in [("e4m3fn", lambda x: sat_ref(x, torch.float8_e4m3fn, 448.0)),
                     ("e5m2", lambda x: sat_ref(x, torch.float8_e5m2, 57344.0)),
                     ("bf16", lambda x: x.to(torch.bfloat16)), ("f16", lambda x: x.to(torch.float16))]:
        a = fn(x)
        c = fn(x.cpu())
        ab, cb = a.view(bits(a)).cpu(), c.view(bits(c))
        bad = (ab != cb) & ~x.cpu().isnan()
        nan_a = hexset(ab[x.cpu().isnan()]); nan_c = hexset(cb[x.cpu().isnan()])
        print(f"torch cuda vs cpu {name}: non-NaN mismatches {int(bad.sum())} of {x.numel()}; NaN -> cuda {nan_a} cpu {nan_c}")


def widening_nans():
    """Do bf16 -> fp32 and fp16 -> fp32 keep NaN payloads (a shift) or canonicalize them?"""
    for dt, nans in ((torch.bfloat16, [0x7FC0, 0x7FC1, 0xFFC0, 0x7F81]), (torch.float16, [0x7E00, 0x7E01, 0xFE00, 0x7C01])):
        x = torch.tensor(nans, dtype=torch.int32, device="cuda").to(torch.int16).view(dt)
        got = cast(x, torch.float32).view(torch.int32)
        print(f"{dt} NaN -> fp32 bits:", [hex(int(v) & 0xFFFFFFFF) for v in got])


def main():
    assert torch.cuda.is_available()
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    widening_nans()
    if "--quick" in sys.argv:
        return 0
    cpu_vs_cuda_torch()
    exhaustive_f32(torch.float8_e4m3fn, lambda x: sat_ref(x, torch.float8_e4m3fn, 448.0), "f32->e4m3fn")
    exhaustive_f32(torch.float8_e5m2, lambda x: sat_ref(x, torch.float8_e5m2, 57344.0), "f32->e5m2")
    exhaustive_f32(torch.bfloat16, lambda x: x.to(torch.bfloat16), "f32->bf16")
    exhaustive_f32(torch.float16, lambda x: x.to(torch.float16), "f32->f16")
    try:
        y = cast(torch.randn(1024, device="cuda"), torch.float8_e4m3fnuz)
        print("f32->e4m3fnuz: compiled and ran on this GPU")
    except Exception as exc:  # noqa: BLE001
        print("f32->e4m3fnuz: unsupported:", type(exc).__name__, str(exc).splitlines()[0][:160])

    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = torch.arange(256, dtype=torch.int32, device="cuda").to(torch.uint8).view(dt)
        for out in (torch.float32, torch.bfloat16, torch.float16):
            got = cast(codes, out)
            ref = codes.to(out)
            gb, rb = got.view(bits(got)), ref.view(bits(ref))
            bad = ((gb != rb)).nonzero().flatten().tolist()
            print(f"decode {dt} -> {out}: bit mismatches at codes {[hex(c) for c in bad]}; gpu bits there {[hex(int(gb[c]) & 0xFFFFFFFF) for c in bad]}; ref {[hex(int(rb[c]) & 0xFFFFFFFF) for c in bad]}")

    # NaN payloads after arithmetic: NaN * scale, and bf16 of that.
    codes = torch.tensor([0x7F, 0xFF], dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    s = torch.tensor([2.0, 0.5], device="cuda")
    y = torch.empty(2, device="cuda")
    _mul_kernel[(1,)](codes, s, y, 2, BLOCK=2)
    print("fp8 NaN * scale -> f32 bits", hexset(y.view(torch.int32)), "-> bf16", hexset(cast(y, torch.bfloat16).view(torch.int16)))

    # Subnormal results of fp32 multiply (ftz or not).
    x = torch.tensor([2.0**-9, 2.0**-60, -(2.0**-70)], device="cuda").to(torch.float8_e4m3fn)
    x = torch.tensor([2.0**-9, 1.0, -1.0], device="cuda").to(torch.float8_e4m3fn)
    s = torch.tensor([2.0**-126, 2.0**-140, 2.0**-149], device="cuda")
    y = torch.empty(3, device="cuda")
    _mul_kernel[(1,)](x, s, y, 3, BLOCK=4)
    print("subnormal products (expect 2^-135, 2^-140, -2^-149):", [float(v) for v in y.cpu().double()], "bf16:", hexset(cast(y, torch.bfloat16).view(torch.int16)))

    # Division by powers of two: exact? (all bf16 values x all k in [-126, 127])
    xb = torch.arange(0, 1 << 16, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    bad_div = 0
    bad_examples = []
    for k in range(-126, 128):
        s = torch.full((1 << 16,), 2.0**k, device="cuda")
        y = torch.empty(1 << 16, device="cuda")
        _div_kernel[(16,)](xb, s, y, 1 << 16, BLOCK=4096)
        ref = (xb.double() / (2.0**k)).float()
        bad = (y.view(torch.int32) != ref.view(torch.int32)) & ~ref.isnan()
        bad_div += int(bad.sum())
        if bad.any() and len(bad_examples) < 4:
            i = int(bad.nonzero()[0])
            bad_examples.append((k, float(xb[i]), float(y[i]), float(ref[i])))
    print("x / 2^k (div.full) mismatches vs exact over all bf16 x, k in [-126,127]:", bad_div, bad_examples)

    # exp2 of integers, log2 of powers of two (the seeds' scale math).
    e = torch.arange(-160, 140, dtype=torch.float32, device="cuda")
    x = torch.exp2(e.double()).float()
    ex = torch.empty_like(e)
    lg = torch.empty_like(e)
    _exp2_log2_kernel[(1,)](e, x, ex, lg, e.numel(), BLOCK=512)
    ok = x > 0
    print("exp2(int) != 2^int at e =", e[(ex != x)].tolist()[:12], "...")
    print("log2(2^k) != k at k =", e[ok & (lg != e)].tolist()[:12])

    # device copy bandwidth (read + write)
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    print(f"device copy 1 GiB: {2 * n / ms / 1e6:.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
