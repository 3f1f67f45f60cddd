"""`kvlayout explain`: the resolved byte map of one layout for concrete sizes."""
from __future__ import annotations

import itertools
import math

from . import language
from .expr import as_expr
from .model import HEADS, PAGE_SIZE, VALUES, Layout

SAMPLE_SLOTS = 4
TENSOR_BYTES = 2 ** 62       # the most bytes a torch tensor holds (alloc_cache's bound)


def accepts(layout: Layout, sizes: dict) -> bool:
    """Whether the layout's call-time checks (e.g. values a multiple of 128) pass at these sizes."""
    return all(expr.evaluate(sizes) % multiple == 0 for expr, multiple, _ in layout.runtime_checks)


def default_sizes(layout: Layout) -> dict:
    """Sizes to show a layout at: a page of at least 64 slots, and where they are free 8 heads and
    128 values, else the first of a few round counts the layout's checks accept, else the first
    count that they accept (a group of 48 values, heads split by 16), else a multiple of the checks'
    divisors (a group of 5000 values)."""
    page = max(layout.page_size_multiple, 64)
    page = -(-page // layout.page_size_multiple) * layout.page_size_multiple
    heads = (layout.heads.const_value(),) if layout.heads.is_const else _ROUND_HEADS
    values = (layout.values.const_value(),) if layout.values.is_const else _ROUND_VALUES
    all_heads = heads if layout.heads.is_const else (*heads, *range(1, _SEARCHED + 1))
    all_values = values if layout.values.is_const else (*values, *range(1, _SEARCHED + 1))
    # past the searched counts: multiples of the largest check divisor (a group of 5000 values), then
    # of every one's
    divisors = [n for _, n, _ in layout.runtime_checks] or [1]
    far = values if layout.values.is_const else itertools.chain(
        *(range(step, language.MAX_VALUES + 1, step) for step in (max(divisors), math.lcm(*divisors))))
    pairs = itertools.chain(itertools.product(heads, values), itertools.product(heads, all_values),
                            ((h, v) for v in values for h in all_heads),
                            itertools.product(all_heads[:_BOTH_SEARCHED], all_values), itertools.product(heads, far))
    fits = (sizes for h, v in pairs if accepts(layout, sizes := {PAGE_SIZE: page, HEADS: h, VALUES: v}))
    return next(fits, {PAGE_SIZE: page, HEADS: heads[0], VALUES: values[0]})


# Counts default_sizes tries first where the layout leaves them free, and how far it then searches.
_ROUND_HEADS = (8, 16, 32, 64, 1, 2, 4)
_ROUND_VALUES = (128, 256, 512, 1024, 2048, 4096, 8192)
_SEARCHED = 4096
_BOTH_SEARCHED = 64          # heads tried against every value count, where neither round count fits


# How often a call-time scale (group: tensor) occurs.
_GIVEN_PER = "one per plane or per head, given at call time"


def plane_buffers(layout: Layout) -> str:
    """Which buffers are one tensor per plane and which hold every plane."""
    shared = [b.name for b in layout.buffers if b.shared]
    if not shared:
        return "each has its own buffers"
    if len(shared) == len(layout.buffers):
        return "every buffer holds them all"
    return f"{', '.join(shared)} hold(s) them all; each has its own of the other buffers"


def explain(layout: Layout, sizes: dict) -> str:
    env = dict(sizes)
    ev = _ev(layout, env)
    lines = [f"{layout.name} ({layout.spec_path}) at page_size={env[PAGE_SIZE]}, heads={env[HEADS]}, values={env[VALUES]}",
             f"planes: {', '.join(layout.planes)} ({plane_buffers(layout)})"]
    if layout.inputs:
        parts = [f"{src.name} = {src.plane} values [{src.first}, {src.first + ev(src.width)}) ({', '.join(src.segments)})"
                 for src in layout.inputs]
        lines.append(f"quantize_store inputs: {'; '.join(parts)}")
    lines.append(f"record: {ev(layout.record_bytes)} bytes per token and head")
    for start, end, s, inline in layout.record_parts:
        start, end = ev(start), ev(end)
        if inline is not None:
            n = ev(inline.padded_count)
            lines.append(f"  bytes [{start:>5}, {end:>5})  {inline.name:<6} {n:>4} x {inline.format.name:<11} "
                         f"scales of {inline.segment}, in the record")
            continue
        v0, nv = ev(s.value_offset), ev(s.values)
        scale = ""
        if s.quantized:
            g = s.scale
            size = ev(as_expr(g.size))
            per = {"values": f"one per {size} values", "tokens": f"one per {size} slots per value index",
                   "tensor": _GIVEN_PER}[g.kind]
            floor = f", at least {g.scale_floor!r}" if g.scale_floor is not None else ""
            if g.two_level:
                floor += f" over the call's {'/'.join(f'{p}_{g.global_name}' for p in layout.planes)}"
            if g.rounding == "products":
                floor += ", codes by comparisons"
            if g.poison:
                floor += ", a NaN poisons its group"
            scale = f"  scales: {g.name} ({g.format.name}, {g.rule}{floor}, {per})"
        lines.append(f"  bytes [{start:>5}, {end:>5})  {s.name:<6} {nv:>4} x {s.dtype:<11} "
                     f"values [{v0}, {v0 + nv}){scale}")
    for b in layout.buffers:
        page_bytes = ev(b.page_bytes)
        used = sum(ev(r.nbytes) for r in b.regions if not r.inline)
        lines.append(f"buffer {b.name}: {page_bytes} bytes per page, alloc shape "
                     f"(num_pages, {', '.join(str(ev(d)) for d in b.shape)}) {b.torch_dtype}")
        for r in b.regions:
            dims = ", ".join(f"{t.text}:{ev(t.extent)}" for t in r.terms)
            strides = ", ".join(f"{t.text}={ev(t.stride)}" for t in r.terms)
            if r.inline:
                lines.append(f"    in each record at +{ev(r.record_offset)}: {r.holds} scales [{dims}] x "
                             f"{ev(r.element_bytes)} B; strides {strides}")
                continue
            what = "records" if r.holds == "records" else f"{r.holds} scales"
            lines.append(f"  bytes [{ev(r.offset):>7}, {ev(r.offset) + ev(r.nbytes):>7})  {what} [{dims}] "
                         f"x {ev(r.element_bytes)} B; strides {strides}")
        if page_bytes > used:
            lines.append(f"  bytes [{used:>7}, {page_bytes:>7})  padding (never written)")
    lines.append(f"sample slots (head 0, plane {layout.planes[0]}):")
    page_size = env[PAGE_SIZE]
    samples = sorted({0, 1, page_size - 1, page_size + 1, 3 * page_size + page_size // 2 + 1})[:SAMPLE_SLOTS + 1]
    for loc in samples:
        page, slot = divmod(loc, page_size)
        coords = {"slot": slot, "head": 0, "page": page, "plane": 0}
        parts = []
        rec = layout.records
        parts.append(f"record at {rec.buffer.name}+{ev(rec.offset(coords))}")
        for g in layout.stored_scales:
            r = layout.scales_of(g.name)
            if g.kind == "values":
                first = ev(r.offset({**coords, "scale": 0}))
                steps = {t.text: ev(t.stride) for t in r.term("scale")}
                if len(steps) == 1:
                    step = f"+{next(iter(steps.values()))} each"
                else:   # a split scale coordinate: each half's stride
                    step = ", ".join(f"+{v} per {k}" for k, v in steps.items())
                parts.append(f"{g.name} scales at {r.buffer.name}+{first} ({step}, {ev(g.count)})")
            else:
                first = ev(r.offset({**coords, "block": slot // g.size, "dim": 0}))
                step = ev(r.term("dim")[0].stride)
                parts.append(f"{g.name} block scale at {r.buffer.name}+{first} (+{step} per value index)")
        sink = " (sink: never written)" if layout.sink == loc else ""
        lines.append(f"  slot {loc} (page {page}, slot {slot}){sink}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


# --- the page map: the same facts as data (explain --json), a picture (--svg), the ABI (diff) --------

def _ev(layout: Layout, sizes: dict):
    """An evaluator of the layout's expressions at these sizes; ValueError where its checks refuse them."""
    env = dict(sizes)
    for expr, multiple, message in layout.runtime_checks:
        if expr.evaluate(env) % multiple:
            raise ValueError(f"{message} (page_size={env[PAGE_SIZE]}, heads={env[HEADS]}, values={env[VALUES]})")
    for b in layout.buffers:         # alloc_cache refuses these too: no tensor holds one such page
        if b.page_bytes.evaluate(env) >= TENSOR_BYTES:
            raise ValueError(f"one page of {b.name} would take {b.page_bytes.evaluate(env)} bytes, more than a tensor "
                             f"holds (2**62) (page_size={env[PAGE_SIZE]}, heads={env[HEADS]}, values={env[VALUES]})")
    return lambda e: e.evaluate(env)


def _group(g, ev) -> dict:
    return {"name": g.name, "format": g.format.name, "rule": g.rule, "amax_floor": g.amax_floor,
            "scale_floor": g.scale_floor, "exponents": [g.exponent_lo, g.exponent_hi], "global": g.global_name,
            "rounding": g.rounding, "nan": g.nan, "zero_byte": g.zero_byte,
            "ff_byte": g.ff_byte, "group": {g.kind: ev(as_expr(g.size))}, "segment": g.segment, "element": g.element.name}


def record_map(layout: Layout, ev) -> list:
    """One record in byte order: segments, inline scales, and the pad bytes between or after them."""
    parts, at = [], 0
    for start, end, s, inline in layout.record_parts:
        start, end = ev(start), ev(end)
        if start > at:
            parts.append({"kind": "pad", "name": "pad", "start": at, "end": start})
        if inline is not None:
            parts.append({"kind": "scales", "name": inline.name, "start": start, "end": end,
                          "format": inline.format.name, "count": ev(inline.count),
                          "pad": ev(inline.padded_count) - ev(inline.count), "of": inline.segment})
        else:
            v0 = ev(s.value_offset)
            parts.append({"kind": "segment", "name": s.name, "start": start, "end": end, "dtype": s.dtype,
                          "values": [v0, v0 + ev(s.values)], "scales": s.scale.name if s.quantized else None})
        at = max(at, end)
    total = ev(layout.record_bytes)
    if total > at:
        parts.append({"kind": "pad", "name": "pad", "start": at, "end": total})
    return parts


def page_map(layout: Layout, sizes: dict) -> dict:
    """Every byte of one page of each buffer (and of one record) at concrete sizes, as plain data."""
    ev = _ev(layout, sizes)
    buffers = []
    for b in layout.buffers:
        regions, used = [], 0
        for r in b.regions:
            entry = {"holds": r.holds, "inline": r.inline,
                     "dims": {t.text: ev(t.extent) for t in r.terms},
                     "strides": {t.text: ev(t.stride) for t in r.terms},
                     "element_bytes": ev(r.element_bytes)}
            if r.inline:
                entry["record_offset"] = ev(r.record_offset)
            else:
                entry.update(start=ev(r.offset), end=ev(r.offset) + ev(r.nbytes))
                used = max(used, entry["end"])
            regions.append(entry)
        page_bytes = ev(b.page_bytes)
        buffers.append({"name": b.name, "page_bytes": page_bytes, "dtype": b.torch_dtype,
                        "shape": ["num_pages", *(ev(d) for d in b.shape)], "regions": regions,
                        "padding": [used, page_bytes] if page_bytes > used else None})
    return {"layout": layout.name, "spec": layout.spec_path, "sizes": dict(sizes), "planes": list(layout.planes),
            "sink": layout.sink, "record_bytes": ev(layout.record_bytes), "record": record_map(layout, ev),
            "scales": [_group(g, ev) for g in layout.scales], "buffers": buffers, "ops": list(layout.ops)}


# Colours by what the bytes hold; scale groups take the warm ones in spec order.
_SEGMENT_COLOURS = {"fp4": "#b39ddb", "fp8": "#90caf9", "bf16": "#a5d6a7", "fp16": "#c5e1a5", "fp32": "#80cbc4"}
_SCALE_COLOURS = ("#ffb74d", "#f48fb1", "#ffe082", "#bcaaa4")
_PAD = "#e0e0e0"
_RECORDS = "#bbdefb"
_WIDTH, _BAR, _ROW, _LEFT = 960, 34, 18, 10


def _segment_colour(dtype: str) -> str:
    return next((c for key, c in _SEGMENT_COLOURS.items() if dtype.startswith(key)), "#cfd8dc")


def _esc(text) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _bar(y: int, title: str, total: int, cells: list) -> tuple:
    """One bar of `total` bytes: (svg lines, height). cells: (start, end, colour, label, note)."""
    out = [f'<text x="{_LEFT}" y="{y + 13}" class="t">{_esc(title)}</text>']
    y += 20
    scale = (_WIDTH - 2 * _LEFT) / max(total, 1)
    ticks = sorted({0, total, *(c[0] for c in cells), *(c[1] for c in cells)})
    for start, end, colour, label, _ in cells:
        x, w = _LEFT + start * scale, max((end - start) * scale, 1.5)
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_BAR}" fill="{colour}" stroke="#455a64" '
                   f'stroke-width="0.5"><title>{_esc(label)} [{start}, {end})</title></rect>')
        if w > 7 * len(label):
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + _BAR / 2 + 4}" class="c">{_esc(label)}</text>')
    last = -99.0
    for t in ticks:                        # offsets under the bar, where they do not collide
        x = _LEFT + t * scale
        if x - last >= 34 or t == total:
            anchor = "end" if t == total else "middle" if t else "start"
            out.append(f'<line x1="{x:.1f}" y1="{y + _BAR}" x2="{x:.1f}" y2="{y + _BAR + 4}" stroke="#455a64"/>')
            out.append(f'<text x="{x:.1f}" y="{y + _BAR + 15}" class="o" text-anchor="{anchor}">{t}</text>')
            last = x
    y += _BAR + 22
    for start, end, colour, label, note in cells:   # the key: every cell with its exact range
        out.append(f'<rect x="{_LEFT}" y="{y}" width="12" height="12" fill="{colour}" stroke="#455a64" stroke-width="0.5"/>')
        out.append(f'<text x="{_LEFT + 18}" y="{y + 10}" class="k">bytes [{start}, {end})  {_esc(label)}'
                   f'{"  " + _esc(note) if note else ""}</text>')
        y += _ROW
    return out, y + 10


def svg(layout: Layout, sizes: dict) -> str:
    """A byte-map picture of one page of every buffer and of one record, offsets labelled."""
    m = page_map(layout, sizes)
    colour = {g["name"]: _SCALE_COLOURS[i % len(_SCALE_COLOURS)] for i, g in enumerate(m["scales"])}
    groups = {g["name"]: g for g in m["scales"]}
    lines, y = [], 10
    s = m["sizes"]
    lines.append(f'<text x="{_LEFT}" y="{y + 14}" class="h">{_esc(layout.name)}: one page at page_size={s[PAGE_SIZE]}, '
                 f'heads={s[HEADS]}, values={s[VALUES]} (planes: {", ".join(m["planes"])}; {_esc(plane_buffers(layout))})</text>')
    y += 30
    cells = []
    for p in m["record"]:
        if p["kind"] == "segment":
            note = f"values [{p['values'][0]}, {p['values'][1]})"
            if p["scales"]:
                g = groups[p["scales"]]
                kind, size = next(iter(g["group"].items()))
                per = _GIVEN_PER if kind == "tensor" else f"one per {size} {kind}"
                note += f", scaled by {g['name']} ({g['format']}, {g['rule']}, {per})"
            cells.append((p["start"], p["end"], _segment_colour(p["dtype"]), f"{p['name']} {p['dtype']}", note))
        elif p["kind"] == "scales":
            cells.append((p["start"], p["end"], colour[p["name"]], f"{p['name']} scales",
                          f"{p['count']} x {p['format']} of {p['of']}"
                          + (f" and {p['pad']} pad" if p["pad"] else "") + ", in the record"))
        else:
            cells.append((p["start"], p["end"], _PAD, "pad", "never written"))
    part, y = _bar(y, f"one record: {m['record_bytes']} bytes per token and head", m["record_bytes"], cells)
    lines += part
    for b in m["buffers"]:
        cells = []
        for r in b["regions"]:
            if r["inline"]:
                continue
            dims = " x ".join(f"{k}:{v}" for k, v in r["dims"].items())
            if r["holds"] == "records":
                cells.append((r["start"], r["end"], _RECORDS, "records", f"[{dims}] x {r['element_bytes']} B"))
            else:
                g = groups[r["holds"]]
                cells.append((r["start"], r["end"], colour[r["holds"]], f"{r['holds']} scales",
                              f"[{dims}] x {g['format']}, strides "
                              + ", ".join(f"{k}={v}" for k, v in r["strides"].items())))
        if b["padding"]:
            cells.append((*b["padding"], _PAD, "padding", "never written"))
        shape = ", ".join(str(d) for d in b["shape"])
        part, y = _bar(y, f"buffer {b['name']}: one page, {b['page_bytes']} bytes (alloc ({shape}) {b['dtype']})",
                       b["page_bytes"], cells)
        lines += part
    # (an XML comment may not hold "--": a path with one is written with a hyphen and a dot between)
    header = f"<!-- Code generated by kvlayout from {layout.spec_path.replace('--', '-.-')}. DO NOT EDIT. -->"
    style = ("<style>text{font-family:ui-monospace,Menlo,Consolas,monospace;fill:#263238}.h{font-size:14px;"
             "font-weight:bold}.t{font-size:13px}.c{font-size:11px;text-anchor:middle}.o{font-size:10px}"
             ".k{font-size:11px}</style>")
    body = "\n".join(lines)
    return (f'{header}\n<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{y}" '
            f'viewBox="0 0 {_WIDTH} {y}">\n{style}\n<rect width="100%" height="100%" fill="#ffffff"/>\n{body}\n</svg>\n')
