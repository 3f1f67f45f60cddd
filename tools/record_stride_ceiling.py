"""The ceiling of writing records that do not start on 16-byte boundaries: a bare Triton kernel (no
quantization, no scales) that reads bf16 rows of 128 values and writes one byte per value into rows
`stride` bytes apart (128: aligned; 132: vllm_fp8_per_token_head's head_size + 4), contiguously, as
% of the same run's device copy.

Run on a CUDA machine: python tools/record_stride_ceiling.py (bench/RESULTS.md quotes it).
"""
import torch
import triton
import triton.language as tl

ROWS, VALUES = (1 << 17) * 16, 128        # 131072 tokens of 8 heads, two planes


@triton.jit
def _rows_to_bytes(x_ptr, y_ptr, n_rows, STRIDE: tl.constexpr, BLOCK_R: tl.constexpr, D: tl.constexpr):
    """BLOCK_R rows per program: each value's high byte, at row * STRIDE + value."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, D)
    ok = (r < n_rows)[:, None]
    x = tl.load(x_ptr + r[:, None] * D + d[None, :], mask=ok)
    code = (x.to(tl.int16, bitcast=True) >> 8).to(tl.uint8)
    tl.store(y_ptr + r[:, None] * STRIDE + d[None, :], code, mask=ok)


def main() -> None:
    x = torch.randn(ROWS, VALUES, device="cuda", dtype=torch.bfloat16)
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy = 2 * a.numel() / triton.testing.do_bench(lambda: b.copy_(a)) / 1e6
    print(f"device copy {copy:.0f} GB/s")
    moved = x.numel() * 2 + ROWS * VALUES
    for stride in (128, 132, 144):
        y = torch.empty(ROWS * stride, dtype=torch.uint8, device="cuda")
        for rows, warps in ((8, 2), (16, 4), (32, 4)):
            grid = (triton.cdiv(ROWS, rows),)
            ms = triton.testing.do_bench(lambda: _rows_to_bytes[grid](x, y, ROWS, stride, rows, VALUES, num_warps=warps))
            print(f"rows {stride} bytes apart, {rows} rows and {warps} warps per program: {moved / ms / 1e6 / copy:6.1%} of copy")


if __name__ == "__main__":
    main()
