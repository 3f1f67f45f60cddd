"""`kvlayout explain`: the resolved byte map of one layout for concrete sizes."""
from __future__ import annotations

from .model import HEADS, PAGE_SIZE, VALUES, Layout

SAMPLE_SLOTS = 4


def default_sizes(layout: Layout) -> dict:
    page = max(layout.page_size_multiple, 64)
    page = -(-page // layout.page_size_multiple) * layout.page_size_multiple
    return {PAGE_SIZE: page,
            HEADS: layout.heads.const_value() if layout.heads.is_const else 8,
            VALUES: layout.values.const_value() if layout.values.is_const else 128}


def explain(layout: Layout, sizes: dict) -> str:
    env = dict(sizes)
    ev = lambda e: e.evaluate(env)  # noqa: E731
    for expr, multiple, message in layout.runtime_checks:
        if ev(expr) % multiple:
            raise ValueError(f"{message} (page_size={env[PAGE_SIZE]}, heads={env[HEADS]}, values={env[VALUES]})")
    lines = [f"{layout.name} ({layout.spec_path}) at page_size={env[PAGE_SIZE]}, heads={env[HEADS]}, values={env[VALUES]}",
             f"planes: {', '.join(layout.planes)} (each has its own buffers)",
             f"record: {ev(layout.record_bytes)} bytes per token and head"]
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
            per = f"one per {g.size} values" if g.kind == "values" else f"one per {g.size} slots per value index"
            scale = f"  scales: {g.name} ({g.format.name}, {g.rule}, {per})"
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
    lines.append("sample slots (head 0):")
    page_size = env[PAGE_SIZE]
    samples = sorted({0, 1, page_size - 1, page_size + 1, 3 * page_size + page_size // 2 + 1})[:SAMPLE_SLOTS + 1]
    for loc in samples:
        page, slot = divmod(loc, page_size)
        coords = {"slot": slot, "head": 0, "page": page}
        parts = []
        rec = layout.records
        parts.append(f"record at {rec.buffer.name}+{ev(rec.offset(coords))}")
        for g in layout.scales:
            r = layout.scales_of(g.name)
            if g.kind == "values":
                first = ev(r.offset({**coords, "scale": 0}))
                step = ev(r.term("scale")[0].stride)
                parts.append(f"{g.name} scales at {r.buffer.name}+{first} (+{step} each, {ev(g.count)})")
            else:
                first = ev(r.offset({**coords, "block": slot // g.size, "dim": 0}))
                step = ev(r.term("dim")[0].stride)
                parts.append(f"{g.name} block scale at {r.buffer.name}+{first} (+{step} per value index)")
        sink = " (sink: never written)" if layout.sink == loc else ""
        lines.append(f"  slot {loc} (page {page}, slot {slot}){sink}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"
