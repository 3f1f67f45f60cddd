"""Compile every generated kernel for Hopper (sm_90) on a machine without a GPU.

Each op's host wrapper is called with CPU tensors while the module's kernels are replaced by
recorders; the recorded arguments become a Triton signature, which `triton.compile` lowers to a
cubin for GPUTarget("cuda", 90, 32). Prints one JSON line per kernel (registers, spills).
Run as a script (the interpreter must be off): python -m tests.compile_sm90
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.layouts import LAYOUTS, module, sources  # noqa: E402


def given(m, heads: int) -> dict:
    """The call-time scale arguments of a module's ops (none for most layouts): the first one per
    head, the others one per plane, so both kernel variants compile."""
    return {name: torch.full((heads if i == 0 else 1,), 0.5) for i, name in enumerate(getattr(m, "_GIVEN_SCALES", ()))}

TARGET = GPUTarget("cuda", 90, 32)
LAUNCH_OPTIONS = {"num_warps", "num_stages", "maxnreg", "launch_pdl"}   # launch keywords that are not kernel arguments


def ptxas_path() -> str:
    """The ptxas Triton itself uses for sm_90 (its bundled copy)."""
    from triton.backends.nvidia import compiler as nvidia
    try:
        return nvidia.get_ptxas(TARGET.arch).path
    except TypeError:  # Triton releases whose get_ptxas takes no arch
        return nvidia.get_ptxas().path
    except AttributeError:  # Triton releases without get_ptxas
        return triton.knobs.nvidia.ptxas.path


def resource_usage(ptx: str) -> dict:
    """Registers, spilled bytes, stack and shared memory per kernel, from ptxas -v (shipped with Triton)."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        text = subprocess.run([ptxas_path(), "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                              capture_output=True, text=True, check=True).stderr
    usage = {}
    for key, pattern in (("registers", r"Used (\d+) registers"), ("spill_stores", r"(\d+) bytes spill stores"),
                         ("spill_loads", r"(\d+) bytes spill loads"), ("stack", r"(\d+) bytes stack frame"),
                         ("shared", r"(\d+) bytes smem")):
        match = re.search(pattern, text)
        usage[key] = int(match.group(1)) if match else 0
    return usage


class Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` records the call."""

    def __init__(self, fn, calls):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.fn, args, kwargs))


def signature(fn, args, kwargs):
    """Types, constexprs and alignment attributes of one call, specialized as Triton's JIT does
    (ints equal to 1 become constexprs; pointers and ints divisible by 16 are marked so)."""
    unknown = set(kwargs) - set(fn.arg_names) - LAUNCH_OPTIONS
    if unknown:   # the GPU's launcher refuses them (the interpreter does not check)
        raise TypeError(f"{fn.__name__}: unknown keyword arguments {sorted(unknown)}")
    sig, constexprs, attrs = {}, {}, {}
    values = dict(zip(fn.arg_names, args), **{k: v for k, v in kwargs.items() if k in fn.arg_names})
    for i, p in enumerate(fn.params):
        v = values[p.name]
        if p.is_constexpr:
            sig[p.name], constexprs[p.name] = "constexpr", v
            continue
        kind, key = native_specialize_impl(BaseBackend, v, False, True, True)
        if kind == "constexpr":
            sig[p.name], constexprs[p.name] = "constexpr", key
            continue
        sig[p.name] = kind
        if key:
            attrs[(i,)] = BaseBackend.parse_attr(key)
    return sig, constexprs, attrs


def calls_for(m, heads, values, page):
    """Run every op's wrapper once on CPU tensors with recorded kernels."""
    calls = []
    for name in dir(m):
        obj = getattr(m, name)
        obj = obj.fn if isinstance(obj, Recorder) else obj   # a module is recorded once per shape
        if name.endswith("_kernel") and hasattr(obj, "arg_names"):
            setattr(m, name, Recorder(obj, calls))
    tokens = 40
    cache = m.alloc_cache(8, page, heads=heads, values=values, device="cpu")
    x = torch.randn(tokens, heads, values, dtype=torch.bfloat16)
    loc = torch.arange(tokens)
    if "quantize_store" in m.OPS:
        m.quantize_store(*sources(m, [x] * len(m.PLANES)), loc, cache, page, **given(m, heads))
    m.reset_pages(cache, torch.arange(3), page)
    if "append" in m.OPS:
        m.append(*([x] * len(m.PLANES)), loc, cache, page)
        # and both kernels as a GPU of sm_90 runs them: the runs kernel a programmatic dependent launch,
        # the lone kernel's rescale on words of codes where the layout has it
        forced = {name: lambda *args: True for name in ("_dependent_launch", "_word_rescale")
                  if hasattr(m, name) and (name != "_word_rescale" or getattr(m, "_WORD_RESCALE_CODES", True))}
        saved = {name: getattr(m, name) for name in forced}
        try:
            for name, fn in forced.items():
                setattr(m, name, fn)
            m.append(*([x] * len(m.PLANES)), loc, cache, page)
        finally:
            for name, fn in saved.items():
                setattr(m, name, fn)
        # and the lone kernel of a big call (one program scanning several groups of entries)
        knobs = m.LAUNCH["append"]
        m.LAUNCH["append"] = {**knobs, "lone_programs": 1}
        try:
            m.append(*([x] * len(m.PLANES)), loc, cache, page)
        finally:
            m.LAUNCH["append"] = knobs
    # and the other ops as a call too small to fill a GPU runs them on sm_90: one row per program (see
    # _rows_cap), each kernel a programmatic dependent launch that releases the next one early (_chain)
    chained = {op: {**knobs, "dependent_launch": True, "early_release": True} for op, knobs in m.LAUNCH.items()}
    for cap in (None, lambda *args: 1):
        saved = m._rows_cap, m._dependent_launch, m.LAUNCH
        m._rows_cap = cap or saved[0]
        m._dependent_launch = (lambda *args: True) if cap else saved[1]
        m.LAUNCH = chained if cap else saved[2]
        try:
            if cap and "quantize_store" in m.OPS:
                m.quantize_store(*sources(m, [x] * len(m.PLANES)), loc, cache, page, **given(m, heads))
            if "gather_dequant" in m.OPS:
                m.gather_dequant(cache, loc, page, **given(m, heads))
            if "quantize" in m.OPS:
                data, scale = m.quantize_ref(x)
                m.quantize(x)
                m.dequantize(data, scale)
        finally:
            m._rows_cap, m._dependent_launch, m.LAUNCH = saved
    return calls


def main() -> int:
    failures = 0
    for name in LAYOUTS:
        m = module(name)
        shapes = {(m.HEADS or 8, m.VALUES or 128, max(64, m.PAGE_SIZE_MULTIPLE))}
        if m.SCALE_GROUP_TOKENS > 1:   # readers load token-group scales as 2-, 4- or 8-byte words by page size
            shapes |= {(m.HEADS or 8, m.VALUES or 128, blocks * m.SCALE_GROUP_TOKENS) for blocks in (4, 8)}
        for heads, values, page in sorted(shapes):
            for fn, args, kwargs in calls_for(m, heads, values, page):
                # compiled with the call's launch options, as the JIT compiles it (Triton's defaults otherwise)
                options = {"num_warps": 4, **{k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}}
                record = {"layout": name, "kernel": fn.__name__, "heads": heads, "values": values, "page": page}
                try:
                    sig, constexprs, attrs = signature(fn, args, kwargs)
                    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                                              target=TARGET, options=options)
                    record.update(ok=bool(compiled.asm["cubin"]), **resource_usage(compiled.asm["ptx"]))
                    if "maxnreg" in options:   # a spec's register cap (lone_registers): spills show here
                        record["maxnreg"] = options["maxnreg"]
                except Exception as exc:  # noqa: BLE001 - report every failure, then fail
                    record.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}")
                failures += not record["ok"]
                print(json.dumps(record), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
