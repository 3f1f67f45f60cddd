"""`kvlayout bench --host`: eager host time per call of every op, the seeds side by side (GPU).

Serving stacks call cache kernels eagerly whenever CUDA graphs are off (prefill, extend, debug runs),
so the time the host spends per call matters as much as the GPU's. Each row is the wall time of
back-to-back calls with the same arguments and no synchronization, per call (the median of ROUNDS
rounds of CALLS // ROUNDS calls), after a warm-up (the compile and the first call's checks are not counted). The calls are decode-size, so
the GPU finishes each kernel before the host issues the next and the launch queue never fills:
what is timed is the host. A bare `torch.add` of two small tensors is the yardstick (the target is
at most twice its time). The host drifts by a quarter and more within one run, so each row times
it afresh: the op, the yardstick (and the seed kernel on the same inputs where the seeds are given,
`--seeds DIR`, the folder holding the seed files, see shared/seeds/README.md; and another build's
modules with --against) take turns over ROUNDS turns, and each keeps its fastest timing.

    python -m bench.host [--seeds DIR] [--package generated] [--json PATH]
    python -m bench.host --against PACKAGE --json RUN.json   # another build's modules alternately
    python -m bench.host --table RUN.json                    # its Markdown table
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from .run import sources

ROOT = Path(__file__).resolve().parent.parent      # the checkout (or, installed, the kvlayout package)
HAND_MADE = ("dsv4_k", "mxfp8_kv", "mxfp8_v_seqblocked")   # rows of their own below, with their compat modules

CALLS = 2000
ROUNDS = 5
WARMUP = 50
DECODE_IDS = 2048           # a DSv4 decode gather: the seed's decode-size benchmark
DENSE_ROWS = 2048           # to_mxfp8 / from_mxfp8 rows of 512
STORE_TOKENS = 256          # a decode step's K/V rows
OPERATOR = "torch.ops "      # the row prefix of an op called as its custom operator (register_torch_ops)


def host_us(fn) -> float:
    """Host microseconds per call of `fn`: the median of ROUNDS rounds of CALLS // ROUNDS calls each,
    no synchronization between the calls of a round (the host here is shared: single rounds vary)."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    per_round = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS // ROUNDS):
            fn()
        per_round.append((time.perf_counter() - start) / (CALLS // ROUNDS) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_round)


def in_turns(fns: dict) -> dict:
    """host_us of each of `fns` (name -> callable), timed in turns ROUNDS times, the fastest of each:
    a drift of the host hits them all alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            best[name] = min(best[name], host_us(fn))
    return best


def add_yardstick():
    """The yardstick: a bare torch.add of two small CUDA tensors."""
    a, b = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
    return lambda: torch.add(a, b)


@triton.jit
def _empty_kernel(x_ptr, n, y_ptr, BLOCK: tl.constexpr):
    pass


def floors(package: str, specs: Path) -> dict:
    """What a replay cannot go below on this host, timed in turns: an empty Triton kernel launched
    as a replay launches it (a plan recorded by the package's runtime, Plan.run), one
    torch.empty_strided of a quantize's data (2048 x 512 fp8), torch.add with out= (torch's own
    dispatch and launch, no allocation) and the bare torch.add."""
    layout = sorted(p.stem for p in specs.glob("*.yaml"))[0]
    m = importlib.import_module(f"{package}.{layout}")
    x, y, c = (torch.randn(256, device="cuda") for _ in range(3))
    plan = m._Plan((x.nbytes, y.nbytes))
    m._launch(_empty_kernel, (1,), (x, 256, y), {"BLOCK": 128}, plan, (x, y))
    torch.cuda.synchronize()
    plan.device = torch.cuda.current_device()
    pointers = [x.data_ptr(), y.data_ptr()]
    return in_turns({"launch_us": lambda: plan.run(pointers, (x, y)),
                     "empty_strided_us": lambda: torch.empty_strided((DENSE_ROWS, 512), (512, 1),
                                                                     dtype=torch.float8_e4m3fn, device="cuda"),
                     "add_out_us": lambda: torch.add(x, y, out=c),
                     "add_us": add_yardstick()})


def load_seed(folder: Path, name: str, file: str):
    """A seed kernel file as a module (its one sglang import stubbed; triton.jit needs a real file)."""
    text = (folder / file).read_text().split("\n", 2)[2]
    text = text.replace("from sglang.srt.layers.quantization.fp8_kernel import is_fp8_fnuz", "is_fp8_fnuz = lambda: False")
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def rows(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda").to(dtype)


def cases(package: str, seeds: Path | None, specs: Path = ROOT / "specs", partial: bool = False) -> list:
    """(name, size, ours, seed or None): every generated op at decode size, and the compat ops (the
    seed layouts' rows where the package has their modules). `partial`: the package may lack layouts
    (an earlier build timed --against this one): their rows are left out."""
    names = sorted(p.stem for p in specs.glob("*.yaml"))
    if not all(n in names and importlib.util.find_spec(f"{package}.{n}") for n in HAND_MADE) or \
            importlib.util.find_spec(f"{package}.compat.sglang_mxfp8") is None:
        return layout_cases(package, set(), specs, partial)
    dsv4 = importlib.import_module(f"{package}.dsv4_k")
    kv = importlib.import_module(f"{package}.mxfp8_kv")
    sb = importlib.import_module(f"{package}.mxfp8_v_seqblocked")
    compat_dsv4 = importlib.import_module(f"{package}.compat.sglang_dsv4")
    compat_mx = importlib.import_module(f"{package}.compat.sglang_mxfp8")
    seed_dsv4 = load_seed(seeds, "seed_dsv4", "000_16deb6d8ac4f8665.txt") if seeds else None
    seed_mx = load_seed(seeds, "seed_mxfp8", "003_4b64c289c97b569e.txt") if seeds else None
    out = []

    # DSv4: a decode gather of 2048 ids from 4096 pages of 64; the writer of 256 rows
    dpage = 64          # (each section's sizes under their own names: the lambdas read them when called)
    cache = dsv4.alloc_cache(4096, dpage, device="cuda")
    ids = torch.randint(0, 4096 * dpage, (DECODE_IDS,), device="cuda", dtype=torch.int32)
    k = rows(STORE_TOKENS, 1, 512)
    loc = torch.randperm(4096 * dpage, device="cuda")[:STORE_TOKENS]
    dsv4.quantize_store(rows(4096 * dpage // 8, 1, 512), torch.arange(4096 * dpage // 8, device="cuda") * 8, cache, dpage)
    out.append(("dsv4_k.gather_dequant", f"{DECODE_IDS} ids", lambda: dsv4.gather_dequant(cache, ids, dpage), None))
    out.append(("dsv4_k.quantize_store", f"{STORE_TOKENS} tok", lambda: dsv4.quantize_store(k, loc, cache, dpage), None))
    x512 = rows(DENSE_ROWS, 512)
    data, scale = dsv4.quantize(x512)
    out.append(("dsv4_k.quantize", f"{DENSE_ROWS}x512", lambda: dsv4.quantize(x512), None))
    out.append(("dsv4_k.dequantize", f"{DENSE_ROWS}x512", lambda: dsv4.dequantize(data, scale), None))
    out.append(("compat dequantize_k_cache_paged", f"{DECODE_IDS} ids",
                lambda: compat_dsv4.dequantize_k_cache_paged(cache.k_cache, ids, dpage),
                (lambda: seed_dsv4.dequantize_k_cache_paged(cache.k_cache, ids, dpage)) if seeds else None))

    # MXFP8 K/V: 256 decode rows of 8 heads x 128 into 1024 pages of 128
    page, heads, values = 128, 8, 128
    kvc = kv.alloc_cache(1024, page, heads=heads, values=values, device="cuda")
    kk, vv = rows(STORE_TOKENS, heads, values), rows(STORE_TOKENS, heads, values)
    kv_loc = torch.randperm(1024 * page, device="cuda")[:STORE_TOKENS]
    kv_loc[kv_loc == 0] = 1
    kv_ids = kv_loc.to(torch.int32)
    out.append(("mxfp8_kv.quantize_store", f"{STORE_TOKENS} tok", lambda: kv.quantize_store(kk, vv, kv_loc, kvc, page), None))
    out.append(("mxfp8_kv.gather_dequant", f"{STORE_TOKENS} ids", lambda: kv.gather_dequant(kvc, kv_ids, page), None))
    out.append(("mxfp8_kv.quantize", f"{DENSE_ROWS}x512", lambda: kv.quantize(x512), None))
    mxd, mxs = kv.quantize(x512)
    out.append(("mxfp8_kv.dequantize", f"{DENSE_ROWS}x512", lambda: kv.dequantize(mxd, mxs), None))
    if hasattr(kv, "register_torch_ops"):     # the same two calls as custom operators (an earlier build has none)
        ops = kv.register_torch_ops("kvlayout_bench_" + package.replace(".", "_") + "_mxfp8_kv")
        out.append((f"{OPERATOR}mxfp8_kv.quantize_store", f"{STORE_TOKENS} tok",
                    lambda: ops.quantize_store(kk, vv, kv_loc, *kvc, page), None))
        out.append((f"{OPERATOR}mxfp8_kv.gather_dequant", f"{STORE_TOKENS} ids",
                    lambda: ops.gather_dequant(*kvc, kv_ids, page), None))
    out.append(("compat to_mxfp8", f"{DENSE_ROWS}x512", lambda: compat_mx.to_mxfp8(x512),
                (lambda: seed_mx.to_mxfp8(x512)) if seeds else None))
    mx = compat_mx.to_mxfp8(x512)
    seed_tensor = seed_mx.to_mxfp8(x512) if seeds else None
    out.append(("compat from_mxfp8", f"{DENSE_ROWS}x512", lambda: compat_mx.from_mxfp8(mx),
                (lambda: seed_mx.from_mxfp8(seed_tensor)) if seeds else None))
    # as sglang's pool calls it: token-major views of the fp8 caches, e8m0 scale buffers
    pool = (kvc.k_cache.view(-1, heads, values), kvc.v_cache.view(-1, heads, values),
            kvc.k_sf.view(torch.float8_e8m0fnu), kvc.v_sf.view(torch.float8_e8m0fnu))
    if partial:         # an earlier build may not take e8m0 views (Triton has no such pointer type): bytes
        try:
            compat_mx.quant_store_kv_mxfp8(kk, vv, kv_loc, *pool, page)
        except KeyError:
            pool = (*pool[:2], kvc.k_sf, kvc.v_sf)
    out.append(("compat quant_store_kv_mxfp8", f"{STORE_TOKENS} tok",
                lambda: compat_mx.quant_store_kv_mxfp8(kk, vv, kv_loc, *pool, page),
                (lambda: seed_mx.quant_store_kv_mxfp8(kk, vv, kv_loc, *pool, page)) if seeds else None))

    # seq-blocked V: 256 rows of 8 heads x 128, one per sequence, into 1024 pages of 128
    sbc = sb.alloc_cache(1024, page, heads=heads, values=values, device="cuda")
    sb_loc = (torch.randperm(1024, device="cuda")[:STORE_TOKENS] * page + 5).to(torch.int64)
    out.append(("mxfp8_v_seqblocked.append", f"{STORE_TOKENS} tok", lambda: sb.append(vv, sb_loc, sbc, page), None))
    out.append(("mxfp8_v_seqblocked.gather_dequant", f"{STORE_TOKENS} ids",
                lambda: sb.gather_dequant(sbc, sb_loc, page), None))
    out.append(("compat update_mxfp8_v_cache_seqblocked", f"{STORE_TOKENS} tok",
                lambda: compat_mx.update_mxfp8_v_cache_seqblocked(vv, sb_loc, sbc.v_cache, sbc.v_sf),
                (lambda: seed_mx.update_mxfp8_v_cache_seqblocked(vv, sb_loc, sbc.v_cache, sbc.v_sf)) if seeds else None))
    out += layout_cases(package, set(HAND_MADE), specs, partial)
    return out


def layout_cases(package: str, done: set, specs: Path, partial: bool = False) -> list:
    """The ops of every other layout spec, at the same decode sizes: STORE_TOKENS rows written,
    DECODE_IDS ids gathered from 1024 pages, DENSE_ROWS dense rows (heads and values where free:
    8 and 128). `partial`: layouts the package has no module for are skipped (see cases)."""
    out = []
    for path in sorted(specs.glob("*.yaml")):
        if path.stem in done or (partial and importlib.util.find_spec(f"{package}.{path.stem}") is None):
            continue
        m = importlib.import_module(f"{package}.{path.stem}")
        heads, values = m.HEADS or 8, m.VALUES or 128
        page = max(64, m.PAGE_SIZE_MULTIPLE)
        cache = m.alloc_cache(1024, page, heads=heads, values=values, device="cuda")
        planes = [rows(STORE_TOKENS, heads, values) for _ in m.PLANES]
        loc = torch.randperm(1024 * page, device="cuda")[:STORE_TOKENS]
        ids = torch.randint(0, 1024 * page, (DECODE_IDS,), device="cuda", dtype=torch.int32)
        dense = rows(DENSE_ROWS, values)
        given = {name: torch.tensor([0.0371], device="cuda") for name in m._GIVEN_SCALES}   # call-time scales
        for op in m.OPS:
            if op == "quantize_store":
                fn = (lambda m=m, srcs=sources(m, planes), loc=loc, cache=cache, page=page, given=given:
                      m.quantize_store(*srcs, loc, cache, page, **given))
                size = f"{STORE_TOKENS} tok"
            elif op == "append":
                fn = (lambda m=m, planes=planes, loc=loc, cache=cache, page=page: m.append(*planes, loc, cache, page))
                size = f"{STORE_TOKENS} tok"
            elif op == "gather_dequant":
                fn = (lambda m=m, cache=cache, ids=ids, page=page, given=given: m.gather_dequant(cache, ids, page, **given))
                size = f"{DECODE_IDS} ids"
            elif op == "quantize":
                fn, size = (lambda m=m, dense=dense: m.quantize(dense)), f"{DENSE_ROWS}x{values}"
            elif op == "dequantize":
                data, scale = m.quantize(dense)
                fn = (lambda m=m, data=data, scale=scale: m.dequantize(data, scale))
                size = f"{DENSE_ROWS}x{values}"
            else:
                continue
            out.append((f"{path.stem}.{op}", size, fn, None))
    return out


def breakdown(package: str, specs: Path) -> list:
    """Where a replayed call's host time goes, per generated op: finding the call's plan (_find: the
    last plan's guard, else the call's signature), the output allocations (the plan's, timed alone),
    the recorded launches (Plan.run, the launcher included) and the rest (the op's own Python).
    _find and Plan.run are timed by wrapping them, which adds its own small cost to the total. Of
    ROUNDS rounds of CALLS // ROUNDS calls, the fastest round's figures are kept (the host drifts)."""
    rows_out = []
    for name, size, fn, _ in cases(package, None, specs):
        layout, _, op = name.partition(".")
        if name.startswith(("compat ", OPERATOR)):
            continue
        m = importlib.import_module(f"{package}.{layout}")
        fn()
        plan = next(iter(m._PLANS[op].values()), None)
        if plan is None:
            rows_out.append({"op": name, "size": size, "replayed": False})
            continue
        spent = {"find": 0.0, "launch": 0.0}

        def timed(f, what):
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return f(*args, **kwargs)
                finally:
                    spent[what] += time.perf_counter() - start
            return wrapper
        find, run = m._find, m._Plan.run
        m._find, m._Plan.run = timed(find, "find"), timed(run, "launch")
        calls, best = CALLS // ROUNDS, None
        try:
            for _ in range(WARMUP):
                fn()
            for _ in range(ROUNDS):
                torch.cuda.synchronize()
                spent.update(find=0.0, launch=0.0)
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                total = time.perf_counter() - start
                if best is None or total < best[0]:
                    best = (total, spent["find"], spent["launch"])
            torch.cuda.synchronize()
        finally:
            m._find, m._Plan.run = find, run
        alloc = min(host_us(lambda: plan.allocate([])), host_us(lambda: plan.allocate([])))
        total, found, launch = (t / calls * 1e6 for t in best)
        rows_out.append({"op": name, "size": size, "replayed": True, "total_us": total, "find_us": found,
                         "outputs": len(plan.outputs), "alloc_us": alloc, "launches": len(plan.launches),
                         "launch_us": launch, "rest_us": total - found - launch - alloc})
    return rows_out


def markdown(run: dict) -> str:
    """One run's JSON (--json) as a Markdown table; with --against, each op's time with the other
    package's modules (before) beside this one's (after), timed alternately."""
    env = run["environment"]
    lines = [f"{env['device']}, torch {env['torch']}, triton {env['triton']}, {env['date']}; {CALLS} eager calls "
             f"per row, no sync; before: {run.get('before') or '-'}. Bare `torch.add`: {run['torch_add_us']:.1f} us "
             "(the fastest; each row's ratio is to the torch.add timed beside it, where the run has one).",
             "", "| op | size | before us | after us | after / torch.add | seed us |", "|---|---|---:|---:|---:|---:|"]
    for r in run["results"]:
        was = r.get("against_host_us")
        seed = r["seed_host_us"]
        lines.append(f"| {r['op']} | {r['size']} | {'-' if was is None else f'{was:.1f}'} | {r['host_us']:.1f} | "
                     f"{r['host_us'] / r.get('add_us', run['torch_add_us']):.2f} | {'' if seed is None else f'{seed:.1f}'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="kvlayout bench --host", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=Path, help="folder of the seed kernel files, to time them side by side")
    p.add_argument("--package", default="generated", help="import the layout modules from this package")
    p.add_argument("--specs", type=Path, default=ROOT / "specs", help="the layout specs to time (one module each)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--against", metavar="PACKAGE", help="also time each op with this package's modules, alternating "
                   "with ours over ROUNDS rounds (the faster timing of each), side by side; ops it lacks (or "
                   "times at other sizes) are timed with ours alone")
    p.add_argument("--before", metavar="TEXT", help="what the --against package is (e.g. 'the previous build, "
                   "abc1234'), kept in the JSON for --table")
    p.add_argument("--table", type=Path, metavar="JSON", help="print a run's JSON file as a Markdown table (no GPU needed)")
    p.add_argument("--breakdown", action="store_true", help="where each generated op's replayed call spends its "
                   "host time (finding its plan, allocations, launches, the rest), after the timings")
    args = p.parse_args(argv)
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return 0
    if not torch.cuda.is_available():
        print("kvlayout bench --host needs a CUDA GPU", file=sys.stderr)
        return 4                 # bad usage here (2 is a bad spec's code)
    torch.manual_seed(0)
    add = add_yardstick()
    add_us = host_us(add)
    results = []
    # the other build's calls by op and size (one that lacks a seed layout's compat module times that
    # layout's ops at other sizes: those rows are ours alone)
    theirs = {(name, size): fn for name, size, fn, _ in cases(args.against, None, args.specs, partial=True)} \
        if args.against else {}
    for name, size, ours, seed in cases(args.package, args.seeds, args.specs):
        fns = {"host_us": ours, "add_us": add}
        if seed:
            fns["seed_host_us"] = seed
        if (name, size) in theirs:     # (an op the --against package has, at this size)
            fns["against_host_us"] = theirs[name, size]
        row = {"op": name, "size": size, "seed_host_us": None, **in_turns(fns)}
        add_us = min(add_us, row["add_us"])
        results.append(row)
    print(f"host time per eager call ({CALLS} calls, no sync), package {args.package}; bare torch.add timed "
          f"beside each row (fastest {add_us:.1f} us); / add: the row's time over its own torch.add's")
    print(f"{'op':<42} {'size':<12} {'us':>7} {'seed us':>8} {'add us':>7} {'/ add':>6}")
    for r in results:
        seed = f"{r['seed_host_us']:8.1f}" if r["seed_host_us"] is not None else " " * 8
        against = f" {r['against_host_us']:7.1f} {args.against}" if "against_host_us" in r else ""
        print(f"{r['op']:<42} {r['size']:<12} {r['host_us']:7.1f} {seed} {r['add_us']:7.1f} "
              f"{r['host_us'] / r['add_us']:6.2f}{against}")
    parts = breakdown(args.package, args.specs) if args.breakdown else None
    least = floors(args.package, args.specs) if args.breakdown else None
    if parts:
        print(f"\n{'replayed call':<42} {'total':>6} {'find':>6} {'alloc':>9} {'launch':>9} {'rest':>6}  (us)")
        for r in parts:
            if not r["replayed"]:
                print(f"{r['op']:<42} (no launch plan: every call takes the checked path)")
                continue
            print(f"{r['op']:<42} {r['total_us']:6.1f} {r['find_us']:6.1f} {r['alloc_us']:6.1f} x{r['outputs']} "
                  f"{r['launch_us']:6.1f} x{r['launches']} {r['rest_us']:6.1f}")
        print("floors (us): " + ", ".join(f"{k.removesuffix('_us')} {v:.2f}" for k, v in least.items()))
    if args.json:
        from .run import environment
        args.json.write_text(json.dumps({"environment": environment(), "package": args.package, "against": args.against,
                                         "before": args.before or args.against,
                                         "torch_add_us": add_us, "results": results,
                                         **({"breakdown": parts, "floors": least} if parts else {})}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
