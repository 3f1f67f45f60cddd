"""`kvlayout bench`: every spec x op on the GPU, in realistic scenarios, against a device copy.

Scenarios:
  decode   a batch of sequences appending one token each into scattered pages
  prefill  contiguous runs of slots (whole sequences written at once)
  batch    (append) a prefill of a batch of sequences of random lengths (1-4096 tokens; at the small
           size 1-300), each from a page boundary: a sequence's blocks start at any entry of the
           call, and most sequences end in a partial block
  gather   page tables of whole sequences: random pages, contiguous within a page
  random   uniformly random slots (the worst case)
  grow     (append) a decode step in which every value index's exponent grows: the block's other
           rows are rescaled; timed as (fresh step + growing step) minus the fresh step
  typical  (append) a decode step into blocks holding earlier rows of the same N(0, 1) data: nearly
           every step grows some exponent (the `decode` row replays one in which none grows); timed
           as (restoring the touched pages' exponents + the step) minus the restore
  dense    plain (rows, values) tensors
Bytes are counted minimally: each input read once, each output written once (a scale shared by a
block of tokens once per distinct block; an append reads and writes its exponents). The device copy
(read + write of 1 GiB) is measured in the same run. Times are medians of triton.testing.do_bench;
small sizes, and appends of every size, also report the per-call time of 100 calls replayed from one
CUDA graph, and their GB/s and % of copy come from that GPU time: a small call's eager time is
mostly Python's launch overhead, and an append's eager time includes the gap before its second
kernel's launch whenever the host is slower than the GPU. Small sizes also report that graph time
with the op's dependent_launch knob on ("pdl us": each call a programmatic dependent launch of the
one before, sm_90+).

    python -m bench.run [--quick] [--json PATH] [--only LAYOUT[.OP]]
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import platform
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parent.parent      # the checkout (or, installed, the kvlayout package)

COPY_BYTES = 1 << 30
GRAPH_CALLS = 100
SMALL_TOKENS = 2048
LONG_SEQUENCE = 4096        # the longest sequence of the large append batch
SHORT_SEQUENCE = 300        # ... and of the small one (a batched prefill of prompts)


@dataclass
class Case:
    layout: str
    op: str
    scenario: str
    size: str
    bytes: int                  # minimal bytes moved (read + write)
    fn: object = None           # the call to time
    working_set: int = 0        # bytes of the tensors involved
    small: bool = False
    graph: bool = False         # time CUDA-graph replays too (always for small calls)
    baseline: object = None     # a call timed alike and subtracted (it sets up fn's state)
    package: str = "generated"  # where the layout module came from


@dataclass
class Result:
    layout: str
    op: str
    scenario: str
    size: str
    us: float
    gbps: float
    pct_copy: float
    graph_us: float | None
    working_set_mb: float
    pdl_graph_us: float | None = None    # small calls: graph_us with every call a programmatic dependent launch


def device_copy_gbps() -> float:
    a = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * COPY_BYTES / ms / 1e6


def nonzero_normal(shape, dtype=torch.bfloat16):
    """Random data with per-row scales over 2^-8..2^8 (never all zero)."""
    x = torch.randn(shape, device="cuda", dtype=torch.float32)
    k = torch.randint(-8, 9, shape[:1] + (1,) * (len(shape) - 1), device="cuda").float()
    return (x * torch.exp2(k)).to(dtype)


def filled_cache(m, num_pages, page, heads, values):
    cache = m.alloc_cache(num_pages, page, heads=heads, values=values, device="cuda")
    for t in cache:
        t.view(torch.uint8).random_(0, 255)
    return cache


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def decode_slots(batch: int, num_pages: int, page: int) -> torch.Tensor:
    """One token per sequence: each sequence owns a random page and appends at a random offset."""
    pages = torch.randperm(num_pages, device="cuda")[:batch]
    return pages * page + torch.randint(0, page, (batch,), device="cuda")


def paged_slots(tokens: int, num_pages: int, page: int) -> torch.Tensor:
    """Sequences laid out by a page table: random pages, consecutive slots within each page."""
    pages = torch.randperm(num_pages, device="cuda")[: -(-tokens // page)]
    return (pages[:, None] * page + torch.arange(page, device="cuda")[None, :]).flatten()[:tokens]


prefill_slots = paged_slots   # a prefill writes whole sequences: contiguous runs of slots
gather_ids = paged_slots      # a reader walks the same page tables


def batch_slots(tokens: int, num_pages: int, page: int, longest: int = LONG_SEQUENCE) -> torch.Tensor:
    """A prefill of a batch of sequences of random lengths (1..longest tokens), one after another,
    each from the first slot of random pages of its own: a sequence's runs start at any entry."""
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(min(int(torch.randint(1, longest + 1, (1,))), tokens - sum(lengths)))
    pages = torch.randperm(num_pages, device="cuda")
    slots, used = [], 0
    for n in lengths:
        count = -(-n // page)
        own = pages[used: used + count]
        used += count
        slots.append((own[:, None] * page + torch.arange(page, device="cuda")[None, :]).flatten()[:n])
    return torch.cat(slots)


def random_slots(tokens: int, num_slots: int) -> torch.Tensor:
    return torch.randperm(num_slots, device="cuda")[:tokens]


def growing_decode(name, m, geo, cache, num_pages, page, tokens, heads, values) -> Case:
    """One token per sequence into the second slot of a block whose first slot was just written
    with rows 2^24 times smaller: every exponent grows, so the block's other rows are rescaled.
    Counted: the token's bytes plus reading and writing the block's other rows."""
    block = m.SCALE_GROUP_TOKENS
    first = decode_slots(tokens, num_pages, page) // block * block
    small = [nonzero_normal((tokens, heads, values)) for _ in m.PLANES]
    large = [(x.float() * 2.0 ** 24).to(x.dtype) for x in small]
    second = first + 1
    return rescaling_case(name, m, geo, cache, num_pages, page, "grow", second, heads, values,
                          setup=lambda: m.append(*small, first, cache, page),
                          step=lambda: m.append(*large, second, cache, page))


def typical_decode(name, m, geo, cache, num_pages, page, tokens, heads, values) -> Case:
    """One token per sequence at a random slot of its block, whose earlier slots hold rows of the same
    N(0, 1) data, written by append itself: with heads x values exponents per block a new row grows
    some of them in nearly every step, so the block's other rows are rescaled. Each call first
    restores the touched pages' exponents (the uint8 buffers; the baseline), so every replay grows
    alike. Counted as `grow`: the token's bytes plus reading and writing the block's other rows."""
    block = m.SCALE_GROUP_TOKENS
    loc = decode_slots(tokens, num_pages, page)
    earlier = loc % block
    run_start = torch.cumsum(earlier, 0) - earlier
    offset = torch.arange(int(earlier.sum()), device="cuda") - run_start.repeat_interleave(earlier)
    prefix = (loc - earlier).repeat_interleave(earlier) + offset
    m.append(*[torch.randn(prefix.numel(), heads, values, device="cuda").to(torch.bfloat16) for _ in m.PLANES],
             prefix, cache, page)
    srcs = [torch.randn(tokens, heads, values, device="cuda").to(torch.bfloat16) for _ in m.PLANES]
    pages = torch.unique(loc // page)
    exponents = [t for t in cache if t.dtype == torch.uint8]
    saved = [t[pages].clone() for t in exponents]

    def restore():
        for t, s in zip(exponents, saved):
            t.index_copy_(0, pages, s)

    return rescaling_case(name, m, geo, cache, num_pages, page, "typical", loc, heads, values,
                          setup=restore, step=lambda: m.append(*srcs, loc, cache, page))


def rescaling_case(name, m, geo, cache, num_pages, page, scenario, loc, heads, values, setup, step) -> Case:
    """An append decode step that rescales its blocks, timed after `setup` (which puts the cache in
    the state the step rescales) minus `setup` alone. Counted: each token's bytes, its block's
    exponents read and written, and the block's other rows read and written."""
    def setup_then_step():
        setup()
        step()

    tokens = loc.numel()
    moved = (rows_bytes(m, geo, tokens, heads, values) + 2 * scale_bytes(m, geo, loc, heads) + nbytes(loc)
             + 2 * tokens * len(m.PLANES) * heads * (m.SCALE_GROUP_TOKENS - 1) * values)
    return Case(name, "append", scenario, f"{tokens} tok, {num_pages}x{page}", moved, setup_then_step,
                nbytes(*cache) + moved, True, baseline=setup)


def rows_bytes(m, geo, tokens, heads, values) -> int:
    """Each token's records (no padding) and bf16 rows, every plane and head."""
    return tokens * len(m.PLANES) * heads * (geo["RECORD_BYTES"] + values * 2)


def given_scales(m) -> dict:
    """The call-time scale arguments of a module's ops (vLLM's k_scale, v_scale), as device tensors."""
    return {name: torch.tensor([0.0371], dtype=torch.float32, device="cuda") for name in m._GIVEN_SCALES}


def scale_bytes(m, geo, slots, heads) -> int:
    """The scale bytes a call needs once: each record's own for value groups; for token groups, each
    distinct block's (one scale per block, head and value index)."""
    if m.SCALE_GROUP_TOKENS == 1:
        return slots.numel() * len(m.PLANES) * heads * geo.get("DENSE_SCALE_BYTES", 0)
    blocks = torch.unique(slots[slots >= 0] // m.SCALE_GROUP_TOKENS).numel()
    return blocks * len(m.PLANES) * heads * sum(v for k, v in geo.items() if k.endswith("_TILES"))


def sources(m, rows) -> list:
    """A writer's tensors for one (T, heads, values) row tensor per plane: the rows, or where the layout
    takes them in parts (its INPUTS) views of their columns, as callers pass slices."""
    inputs = getattr(m, "INPUTS", ())
    if not inputs:
        return list(rows)
    by_plane = dict(zip(m.PLANES, rows, strict=True))
    return [by_plane[plane][..., first:first + width] for _, plane, first, width in inputs]


def cases_for(name: str, quick: bool, package: str = "generated") -> list:
    """The benchmark cases of one layout: every op it generates, small (decode-size) and large."""
    m = importlib.import_module(f"{package}.{name}")
    torch.manual_seed(zlib.crc32(name.encode()))   # the same inputs for every package's module of a layout
    heads, values = m.HEADS or 8, m.VALUES or 128
    page = 64 if m.PAGE_SIZE_MULTIPLE == 1 else 128
    geo = m.geometry(page, heads, values)
    large = 1 << 17 if not quick else 1 << 15
    # DSv4 reads are measured at the seed's benchmark size: 2^20 ids over 16384 pages of 64.
    read_large = 1 << 20 if name == "dsv4_k" and not quick else large
    out = []
    given = given_scales(m)

    def cache_for(tokens):
        num_pages = max(2 * SMALL_TOKENS, 2 * -(-tokens // page), 16384 if name == "dsv4_k" else 0)
        return filled_cache(m, num_pages, page, heads, values), num_pages

    if "gather_dequant" in m.OPS:
        for tokens in (SMALL_TOKENS, read_large):
            cache, num_pages = cache_for(tokens)
            for scenario, ids in (("gather", gather_ids(tokens, num_pages, page)),
                                  ("random", torch.randint(0, num_pages * page, (tokens,), device="cuda"))):
                ids = ids.to(torch.int32)
                dests = tuple(torch.empty(tokens, heads, values, dtype=torch.bfloat16, device="cuda")
                              for _ in m.PLANES)
                dest = dests if len(dests) > 1 else dests[0]
                moved = rows_bytes(m, geo, tokens, heads, values) + scale_bytes(m, geo, ids, heads) + nbytes(ids)
                out.append(Case(name, "gather_dequant", scenario, f"{tokens} ids, {num_pages}x{page}", moved,
                                lambda c=cache, i=ids, o=dest: m.gather_dequant(c, i, page, out=o, **given),
                                nbytes(*cache) + moved, tokens <= SMALL_TOKENS))
    for op in ("quantize_store", "append"):
        if op not in m.OPS:
            continue
        fn = getattr(m, op)
        for tokens in (SMALL_TOKENS, large):
            cache, num_pages = cache_for(tokens)
            scenarios = [("prefill", prefill_slots(tokens, num_pages, page))]
            if tokens <= SMALL_TOKENS:
                scenarios.insert(0, ("decode", decode_slots(tokens, num_pages, page)))
            if op == "quantize_store":
                scenarios.append(("random", random_slots(tokens, num_pages * page)))
            if op == "append":
                # an append's blocks need not start at a program's first entry
                longest = SHORT_SEQUENCE if tokens <= SMALL_TOKENS else LONG_SEQUENCE
                scenarios.append(("batch", batch_slots(tokens, num_pages, page, longest)))
            for scenario, loc in scenarios:
                srcs = [nonzero_normal((tokens, heads, values)) for _ in m.PLANES]
                # an append reads the stored exponents and writes the new ones
                scales = scale_bytes(m, geo, loc, heads) * (2 if op == "append" else 1)
                moved = rows_bytes(m, geo, tokens, heads, values) + scales + nbytes(loc)
                out.append(Case(name, op, scenario, f"{tokens} tok, {num_pages}x{page}", moved,
                                lambda s=sources(m, srcs), l=loc, c=cache: fn(*s, l, c, page, **given), nbytes(*cache) + moved,
                                tokens <= SMALL_TOKENS, graph=op == "append"))
            if op == "append" and tokens <= SMALL_TOKENS:
                out.append(growing_decode(name, m, geo, cache, num_pages, page, tokens, heads, values))
                out.append(typical_decode(name, m, geo, cache, num_pages, page, tokens, heads, values))
    if "quantize" in m.OPS:
        # small: one call's K rows (2048 tokens x heads x values); large: the seed's 65536 x 4096
        # (DSv4: 2^18 records of 512).
        small_width = m.VALUES or heads * values
        large_width = m.VALUES or 4096
        for rows, width in ((SMALL_TOKENS, small_width), ((1 << 28) // large_width // (8 if quick else 1), large_width)):
            x = nonzero_normal((rows, width))
            data, scale = m.quantize(x)
            moved = nbytes(x, data, scale)
            small = rows <= SMALL_TOKENS
            out.append(Case(name, "quantize", "dense", f"{rows}x{width}", moved, lambda x=x: m.quantize(x), moved, small))
            out.append(Case(name, "dequantize", "dense", f"{rows}x{width}", moved,
                            lambda d=data, s=scale: m.dequantize(d, s), moved, small))
    for case in out:
        case.package = package
    return out


def graph_us(fn) -> float:
    """Per-call time of GRAPH_CALLS calls captured in one CUDA graph (launch overhead removed)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    ms = triton.testing.do_bench(graph.replay, warmup=20, rep=100, return_mode="median")
    return ms * 1e3 / GRAPH_CALLS


def measure(case: Case, copy_gbps: float) -> Result:
    def timed(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")

    ms = timed(case.fn) - (timed(case.baseline) if case.baseline else 0.0)
    graph = None
    if case.small or case.graph:
        graph = graph_us(case.fn) - (graph_us(case.baseline) if case.baseline else 0.0)
    # Where there is a graph time the rate is the GPU time's (eager: launch overhead, host gaps).
    gbps = case.bytes / (graph / 1e3 if graph else ms) / 1e6
    return Result(case.layout, case.op, case.scenario, case.size, ms * 1e3, gbps, 100 * gbps / copy_gbps,
                  graph, case.working_set / 2 ** 20, pdl_graph_us(case) if case.small else None)


def pdl_graph_us(case: Case) -> float:
    """The graph time of a small call with the op's dependent_launch knob on: a stream of calls that
    are programmatic dependent launches, each one's launch overlapping the previous call (sm_90+)."""
    m = importlib.import_module(f"{case.package}.{case.layout}")
    saved = m.LAUNCH[case.op]
    m.LAUNCH[case.op] = {**saved, "dependent_launch": True}
    m.clear_plans()
    try:
        return graph_us(case.fn) - (graph_us(case.baseline) if case.baseline else 0.0)
    finally:
        m.LAUNCH[case.op] = saved
        m.clear_plans()


@triton.jit
def _empty_kernel(x_ptr):
    pass


def launch_floor_us() -> float:
    """Per-call GPU time of an empty one-program Triton kernel replayed from a CUDA graph."""
    x = torch.empty(1, device="cuda")
    return graph_us(lambda: _empty_kernel[(1,)](x))


SWEEP = {
    "default": [{"elements": e, "num_warps": w} for e in (1024, 2048, 4096, 8192, 16384) for w in (2, 4, 8)],
    "append": [{"entries": e, "columns": c, "num_warps": w} for e in (16, 32, 64) for c in (64, 128) for w in (1, 2, 4)],
    "append_small": [{"lone_heads": h, "lone_columns": c, "lone_warps": w}
                     for h in (2, 4, 8) for c in (64, 128) for w in (1, 2, 4)],
}


def sweep(cases, copy_gbps: float) -> str:
    """Time every case under every launch shape of SWEEP; print each op's best (by geometric mean)."""
    lines, best = [], {}
    for case in cases:
        m = importlib.import_module(f"{case.package}.{case.layout}")
        saved = dict(m.LAUNCH[case.op])
        kind = case.op + ("_small" if case.op == "append" and case.small else "")
        shapes = SWEEP.get(kind, SWEEP["default"])
        for knobs in shapes:
            m.LAUNCH[case.op] = {**saved, **knobs}
            m._launch_shape.cache_clear()
            m.clear_plans()
            try:
                if case.small:   # decode-size calls: GPU time from CUDA-graph replays (eager: launch overhead)
                    ms = (graph_us(case.fn) - (graph_us(case.baseline) if case.baseline else 0.0)) / 1e3
                else:
                    ms = triton.testing.do_bench(case.fn, warmup=10, rep=40, return_mode="median")
                    if case.baseline:
                        ms -= triton.testing.do_bench(case.baseline, warmup=10, rep=40, return_mode="median")
            except Exception as exc:  # noqa: BLE001 - a launch shape the kernel cannot take
                lines.append(f"{case.layout}.{case.op} {case.scenario} {case.size} {knobs}: {type(exc).__name__}")
                continue
            pct = 100 * case.bytes / ms / 1e6 / copy_gbps
            best.setdefault((case.layout, kind), {}).setdefault(tuple(sorted(knobs.items())), []).append(pct)
            lines.append(f"{case.layout}.{case.op} {case.scenario:<8} {case.size:<26} {knobs}: {pct:5.1f}% of copy")
        m.LAUNCH[case.op] = saved
        m._launch_shape.cache_clear()
        m.clear_plans()
    lines.append("best launch shape per op (geometric mean of % of copy over its cases):")
    chosen = {}
    for (layout, op), by_knobs in best.items():
        score = {k: math.exp(sum(math.log(max(v, 1e-3)) for v in vs) / len(vs)) for k, vs in by_knobs.items()
                 if len(vs) == max(len(x) for x in by_knobs.values())}
        knobs, value = max(score.items(), key=lambda kv: kv[1])
        lines.append(f"  {layout}.{op}: {dict(knobs)} -> {value:.1f}%")
        chosen[layout, op] = dict(knobs)
    lines.append(tuning_blocks(chosen))
    return "\n".join(lines)


def tuning_blocks(chosen: dict) -> str:
    """Each layout's best knobs as a `tuning:` block to paste into its spec. `chosen` maps
    (layout, sweep kind) to knobs; append's decode-size kind (append_small) joins append's."""
    by_layout: dict = {}
    for (layout, kind), knobs in chosen.items():
        op = kind.removesuffix("_small")
        by_layout.setdefault(layout, {}).setdefault(op, {}).update(knobs)
    out = []
    for layout, ops in by_layout.items():
        out.append(f"# specs/{layout}.yaml")
        out.append("tuning:")
        for op, knobs in ops.items():
            items = ", ".join(f"{k}: {'null' if v is None else str(v).lower() if isinstance(v, bool) else v}"
                              for k, v in sorted(knobs.items()))
            out.append(f"  {op}: {{{items}}}")
    return "\n".join(out)


def table(results, copy_gbps: float) -> str:
    lines = [f"device copy: {copy_gbps:.0f} GB/s (read + write, 1 GiB)",
             f"{'layout':<19} {'op':<15} {'scenario':<8} {'size':<26} {'us':>9} {'graph us':>9} {'GB/s':>7} {'% copy':>7}"
             f" {'pdl us':>7}"]
    for r in results:
        g = f"{r.graph_us:9.2f}" if r.graph_us is not None else " " * 9
        pdl = f" {r.pdl_graph_us:7.2f}" if r.pdl_graph_us is not None else ""
        lines.append(f"{r.layout:<19} {r.op:<15} {r.scenario:<8} {r.size:<26} {r.us:9.1f} {g} {r.gbps:7.0f} "
                     f"{r.pct_copy:6.1f}%{pdl}")
    return "\n".join(lines)


def gpu_us(r: Result) -> float:
    """The figure two runs of a case compare: GPU time from graph replays for small calls, else eager."""
    return r.graph_us if r.graph_us is not None else r.us


def compare_table(pairs, package: str, against: str) -> str:
    lines = [f"{package} against {against} (each case measured for both, back to back; us: graph time for "
             "small calls, eager for large)",
             f"{'layout':<19} {'op':<15} {'scenario':<8} {'size':<26} {against[-12:]:>12} {package[-12:]:>12} {'ratio':>6}"]
    for new, old in pairs:
        lines.append(f"{new.layout:<19} {new.op:<15} {new.scenario:<8} {new.size:<26} {gpu_us(old):12.2f} "
                     f"{gpu_us(new):12.2f} {gpu_us(new) / gpu_us(old):6.3f}")
    return "\n".join(lines)


def environment() -> dict:
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="kvlayout bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller large sizes")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--only", action="append", default=[], help="LAYOUT or LAYOUT.OP (repeatable)")
    p.add_argument("--sweep", action="store_true", help="time each case under several launch shapes instead")
    p.add_argument("--package", default="generated", help="import the layout modules from this package")
    p.add_argument("--specs", type=Path, default=ROOT / "specs", help="the layout specs to bench (one module each)")
    p.add_argument("--against", metavar="PACKAGE", help="also time each case with this package's modules (e.g. an "
                   "earlier generated/ kept in an ignored folder), back to back, and print both side by side")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("kvlayout bench needs a CUDA GPU", file=sys.stderr)
        return 4                 # bad usage here (2 is a bad spec's code)
    torch.manual_seed(0)
    copy_gbps = device_copy_gbps()
    floor = launch_floor_us()
    layouts = sorted(p.stem for p in args.specs.glob("*.yaml"))
    results, pairs = [], []
    for name in layouts:
        if args.only and not any(o.split(".")[0] == name for o in args.only):
            continue
        cases = [c for c in cases_for(name, args.quick, args.package)
                 if not args.only or any(o in (name, f"{name}.{c.op}") for o in args.only)]
        if args.sweep:
            print(sweep(cases, copy_gbps), flush=True)
        elif args.against and importlib.util.find_spec(f"{args.against}.{name}") is None:
            results.extend(measure(case, copy_gbps) for case in cases)    # a layout the other package lacks
        elif args.against:
            olds = {(c.op, c.scenario, c.size): c for c in cases_for(name, args.quick, args.against)}
            for case in cases:
                pairs.append((measure(case, copy_gbps), measure(olds[case.op, case.scenario, case.size], copy_gbps)))
            results.extend(new for new, _ in pairs[-len(cases):])
            del olds
        else:
            results.extend(measure(case, copy_gbps) for case in cases)
        del cases
        torch.cuda.empty_cache()
    if args.sweep:
        return 0
    print(table(results, copy_gbps))
    if pairs:
        print(compare_table(pairs, args.package, args.against))
    print(f"launch floor: {floor:.2f} us per empty Triton kernel replayed from a CUDA graph")
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(), "copy_gbps": copy_gbps,
                                         "launch_floor_us": floor,
                                         "results": [asdict(r) for r in results],
                                         **({"against": args.against, "against_results": [asdict(o) for _, o in pairs]}
                                            if pairs else {})}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
