"""A deliberately naive, independent oracle: the expected cache bytes of a spec, from the spec's own
YAML fields (read here with plain yaml), on small sizes.

It shares no code with codegen/: byte positions come from a mixed-radix count over each region's
`order` written out below, codes from a table of every code's value (nearest, ties to the even
code), scale exponents from the rules' definitions on exact fractions (docs/numerics.md), not from
the integer forms the kernels use. Slow by design (Python loops over tokens, heads and groups).
"""
from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
import yaml

# Element formats by their bit fields: (exponent bits, mantissa bits, bias, which codes are not numbers).
# A code is a sign bit above the exponent and mantissa bits; fp4 e2m1 stores two codes per byte, the
# even value's in the low nibble.
ELEMENTS = {"fp8_e4m3fn": (4, 3, 7, "fn"), "fp8_e5m2": (5, 2, 15, "ieee"), "fp8_e4m3fnuz": (4, 3, 8, "fnuz"),
            "fp4_e2m1": (2, 1, 1, "none")}
NAN_CODE = {"fp8_e4m3fn": 0x7F, "fp8_e5m2": 0x7F, "fp8_e4m3fnuz": 0x80, "fp4_e2m1": 0x0}   # e2m1 has no NaN: +0
RAW = {"bf16": (torch.bfloat16, 2), "fp16": (torch.float16, 2), "fp32": (torch.float32, 4)}
NAN16, NAN32 = 0x7FFF, 0x7FFFFFFF           # the GPU's canonical NaNs (bf16 and fp16, fp32)


def parse_term(term: str) -> tuple:
    """An `order` entry as (coordinate, "%" / "//" / None, N or None)."""
    coord, op, k = re.fullmatch(r"(\w+)(?: (%|//) (\d+))?", term).groups()
    return coord, op, int(k) if k else None


# --- numbers ---------------------------------------------------------------------------------------

def sign_bit(fmt: str) -> int:
    ebits, mbits, _, _ = ELEMENTS[fmt]
    return 1 << (ebits + mbits)


def packing(fmt: str) -> int:
    """Codes per byte."""
    return 8 // (1 + sum(ELEMENTS[fmt][:2]))


@functools.lru_cache(maxsize=None)
def code_value(fmt: str, code: int) -> float:
    """The value of one code from its bits (NaN for NaN codes, +-inf for e5m2's infinities)."""
    ebits, mbits, bias, specials = ELEMENTS[fmt]
    sign = -1.0 if code & sign_bit(fmt) else 1.0
    e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    if specials == "fnuz":
        if code == sign_bit(fmt):
            return math.nan
    elif specials == "fn" and e == (1 << ebits) - 1 and m == (1 << mbits) - 1:
        return math.nan
    elif specials == "ieee" and e == (1 << ebits) - 1:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / 2 ** mbits) * 2.0 ** (e - bias)


@functools.lru_cache(maxsize=None)
def fmax(fmt: str) -> float:
    return max(v for v in (code_value(fmt, c) for c in range(sign_bit(fmt))) if math.isfinite(v))


@functools.lru_cache(maxsize=None)
def magnitudes(fmt: str) -> tuple:
    """(codes, values): the non-negative finite codes up to fmax, by value."""
    codes = [c for c in range(sign_bit(fmt)) if math.isfinite(code_value(fmt, c)) and code_value(fmt, c) <= fmax(fmt)]
    values = np.array([code_value(fmt, c) for c in codes])
    values.setflags(write=False)
    return tuple(codes), values


def encode(fmt: str, q: np.ndarray) -> np.ndarray:
    """Codes of q: clamped to +-fmax, the nearest code value, ties to the even code; NaN -> the NaN
    code (e2m1, which has none: +0)."""
    top = fmax(fmt)
    codes, values = magnitudes(fmt)
    with np.errstate(invalid="ignore"):
        mag = np.minimum(np.abs(q.astype(np.float64)), top)
    hi = np.clip(np.searchsorted(values, np.nan_to_num(mag)), 1, len(values) - 1)
    lo = hi - 1
    d_lo, d_hi = mag - values[lo], values[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (np.array(codes)[hi] % 2 == 0))
    out = np.where(pick_hi, np.array(codes)[hi], np.array(codes)[lo]).astype(np.int64)
    negative = np.signbit(q)
    sign = sign_bit(fmt)
    if ELEMENTS[fmt][3] == "fnuz":
        out = np.where(negative & (out != 0), out | sign, out)       # no -0
    else:
        out = np.where(negative, out | sign, out)
    return np.where(np.isnan(q), NAN_CODE[fmt], out).astype(np.uint8)


def decode(fmt: str, codes: np.ndarray) -> np.ndarray:
    table = np.array([code_value(fmt, c) for c in range(2 * sign_bit(fmt))])
    return table[codes.astype(np.int64)]


def pack(fmt: str, codes: np.ndarray) -> np.ndarray:
    """Codes as stored bytes: two 4-bit codes per byte, the first in the low nibble."""
    if packing(fmt) == 1:
        return codes
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


def unpack(fmt: str, data: np.ndarray) -> np.ndarray:
    if packing(fmt) == 1:
        return data
    return np.stack([data & 0xF, data >> 4], -1).reshape(-1)


def floor_log2(r: Fraction) -> int:
    k = r.numerator.bit_length() - r.denominator.bit_length()
    while Fraction(2) ** k > r:
        k -= 1
    while Fraction(2) ** (k + 1) <= r:
        k += 1
    return k


def rule_exponent(rule: str, a: float, fmt: str) -> int:
    """The unclamped exponent of a finite, nonzero a from the rule's definition (docs/numerics.md)."""
    r, f = Fraction(a), Fraction(fmax(fmt))
    emax = floor_log2(f)
    if rule == "rceil":                      # smallest e with a <= fmax * 2^e
        e = floor_log2(r / f)
        return e if r == f * Fraction(2) ** e else e + 1
    if rule == "floor":
        return floor_log2(r) - emax
    if rule == "ceil":
        e = floor_log2(r)
        return (e if r == Fraction(2) ** e else e + 1) - emax
    if rule == "even":                       # a rounded half-up to the element's mantissa width, then floor
        unit = Fraction(2) ** (floor_log2(r) - ELEMENTS[fmt][1])
        return floor_log2(math.floor(r / unit + Fraction(1, 2)) * unit) - emax
    if rule == "nearest":                    # round(log2(a / fmax)): no ties exist
        k = floor_log2(r / f)
        return k + 1 if (r / f) ** 2 >= Fraction(2) ** (2 * k + 1) else k
    raise ValueError(rule)


def f32(x: float) -> float:
    return float(np.float32(x))


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def to_half_bits(x32: np.ndarray, dtype) -> np.ndarray:
    """fp32 values -> bf16 or fp16 bits, rounded to nearest even (torch on the CPU), NaN -> 0x7FFF."""
    bits = torch.from_numpy(np.ascontiguousarray(x32, dtype=np.float32)).to(dtype).view(torch.int16).numpy()
    return np.where(np.isnan(x32), NAN16, bits.astype(np.uint16)).astype(np.uint16)


def widen(x: torch.Tensor) -> tuple:
    """(fp32 values, fp32 bits) of a source row: bf16 by a shift (bits kept), fp16 with the canonical NaN."""
    if x.dtype == torch.bfloat16:
        bits = (x.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << 16)
        return bits.view(np.float32), bits
    v = x.float().numpy()
    bits = v.view(np.uint32).copy()
    if x.dtype == torch.float16:
        bits = np.where(np.isnan(v), NAN32, bits).astype(np.uint32)
    return bits.view(np.float32), bits


def convert_bits(x: torch.Tensor, dtype) -> np.ndarray:
    """A row of any source dtype converted to `dtype`, as its bits (little-endian bytes of the values)."""
    if x.dtype == dtype:
        return x.contiguous().view(torch.uint8).numpy().copy()
    v, bits = widen(x)
    if dtype == torch.float32:
        return bits.astype(np.uint32).view(np.uint8)
    return to_half_bits(v, dtype).view(np.uint8)


# --- the spec ----------------------------------------------------------------------------------------

class Spec:
    """A spec's fields as written (defaults filled in), plus naive byte positions for given sizes."""

    def __init__(self, path: Path):
        t = yaml.safe_load(Path(path).read_text())
        self.name = t["name"]
        self.planes = t["planes"]
        self.heads = t["heads"]
        page = t.get("page") or {}
        self.multiple, self.align = page.get("size_multiple_of", 1), page.get("align", 1)
        self.sink = (t.get("slots") or {}).get("sink")
        self.record = t["record"]
        self.scales = t.get("scales") or {}
        self.buffers = t["buffers"]
        self.ops = t["ops"]

    def shared(self, buffer: str) -> bool:
        """A buffer that holds every plane: its regions order a `plane` coordinate."""
        return any(parse_term(o)[0] == "plane" for r in self.buffers[buffer] for o in r["order"])

    def field(self, plane: str, buffer: str) -> str:
        """The Cache field holding a plane's buffer."""
        return buffer if self.shared(buffer) else f"{plane}_{buffer}"

    # sizes ------------------------------------------------------------------------------------------
    def segment_values(self, seg, values: int) -> int:
        return values if seg["values"] == "any" else seg["values"]

    def item_bytes(self, item, values: int) -> int:
        """Bytes of one record item: a segment's values, or a group's scales stored in the record."""
        if "scales" in item:
            return self.scale_entries(item["scales"], values) * self.scale_bytes(item["scales"])
        if item["dtype"] in ELEMENTS:
            return self.segment_values(item, values) // packing(item["dtype"])
        return self.segment_values(item, values) * RAW[item["dtype"]][1]

    def record_bytes(self, values: int) -> int:
        return sum(self.item_bytes(s, values) for s in self.record)

    def inline_offset(self, name: str, values: int) -> int | None:
        """The record byte where group `name`'s scales start if they sit in the record, else None."""
        b = 0
        for item in self.record:
            if item.get("scales") == name:
                return b
            b += self.item_bytes(item, values)
        return None

    def group_of(self, name: str, values: int | None = None) -> tuple:
        """(kind, size): ("values", N), ("tokens", N), or ("tensor", None) for a call-time scale;
        {values: any} is the whole segment's width (at `values` values per head)."""
        group = self.scales[name]["group"]
        if group == "tensor":
            return "tensor", None
        (kind, size), = group.items()
        if size == "any":
            seg = next(s for s in self.record if s.get("scale") == name)
            size = self.segment_values(seg, values)
        return kind, size

    def scale_entries(self, name: str, values: int) -> int:
        """Scale entries per token and head (values groups, padding included)."""
        seg = next(s for s in self.record if s.get("scale") == name)
        pad = self.scales[name].get("pad_to")
        return pad if pad is not None else self.segment_values(seg, values) // self.group_of(name, values)[1]

    def scale_bytes(self, name: str) -> int:
        return 4 if self.scales[name]["format"] == "fp32" else 1

    def extents(self, holds: str, page: int, heads: int, values: int) -> dict:
        planes = {"plane": len(self.planes)}
        if holds == "records":
            return {"slot": page, "head": heads, **planes}
        kind, size = self.group_of(holds)
        if kind == "values":
            return {"slot": page, "head": heads, "scale": self.scale_entries(holds, values), **planes}
        return {"block": page // size, "head": heads, "dim": values, **planes}

    def element_size(self, holds: str, values: int) -> int:
        return self.record_bytes(values) if holds == "records" else self.scale_bytes(holds)

    def region_span(self, region, page, heads, values) -> int:
        ext = self.extents(region["holds"], page, heads, values)
        n = self.element_size(region["holds"], values)
        for term in region["order"]:
            coord, op, k = parse_term(term)
            n *= ext[coord] if op is None else (k if op == "%" else ext[coord] // k)
        return n

    def page_bytes(self, buffer: str, page, heads, values) -> int:
        total = sum(self.region_span(r, page, heads, values) for r in self.buffers[buffer])
        return -(-total // self.align) * self.align

    def position(self, holds: str, coords: dict, page: int, heads: int, values: int) -> tuple:
        """(buffer, byte offset within a page) of one record (slot, head) or one scale entry
        (slot, head, scale) / (block, head, dim): a mixed-radix count over the region's order;
        scales in the record sit in their slot's record, one entry after the other."""
        inline = self.inline_offset(holds, values) if holds != "records" else None
        if inline is not None:
            buffer, record = self.position("records", coords, page, heads, values)
            return buffer, record + inline + coords["scale"] * self.scale_bytes(holds)
        for buffer, regions in self.buffers.items():
            offset = 0
            for region in regions:
                if region["holds"] == holds:
                    ext = self.extents(holds, page, heads, values)
                    index = 0
                    for term in region["order"]:
                        coord, op, k = parse_term(term)
                        if op is None:
                            digit, radix = coords[coord], ext[coord]
                        elif op == "%":
                            digit, radix = coords[coord] % k, k
                        else:
                            digit, radix = coords[coord] // k, ext[coord] // k
                        assert 0 <= digit < radix
                        index = index * radix + digit
                    return buffer, offset + index * self.element_size(holds, values)
                offset += self.region_span(region, page, heads, values)
        raise KeyError(holds)

    # scales -------------------------------------------------------------------------------------------
    def exponent_bounds(self, name: str) -> tuple:
        lo, hi = -127, 127
        if self.scales[name].get("exponent_range") is not None:
            lo_s, hi_s = self.scales[name]["exponent_range"]
            lo, hi = max(lo, lo_s), min(hi, hi_s)
        return lo, hi

    def amax(self, name: str, x32: np.ndarray) -> float:
        """max |x| ignoring NaN, then the floor (as its fp32 value)."""
        mags = np.abs(x32[~np.isnan(x32)].astype(np.float64))
        a = float(mags.max()) if mags.size else 0.0
        floor = self.scales[name].get("amax_floor")
        return max(a, f32(floor)) if floor is not None else a

    def exponent(self, name: str, fmt: str, a: float) -> int:
        lo, hi = self.exponent_bounds(name)
        if math.isinf(a):
            return hi
        if a == 0.0:
            return lo
        return min(max(rule_exponent(self.scales[name]["rule"], a, fmt), lo), hi)

    def scale_value(self, name: str, stored: bytes) -> float:
        """What a reader takes from one stored scale entry."""
        if self.scales[name]["format"] == "fp32":
            return float(np.frombuffer(stored, dtype=np.float32)[0])
        if self.scales[name]["format"] == "e4m3":
            return code_value("fp8_e4m3fn", stored[0])
        b = stored[0]
        if b == 0xFF:
            return math.nan if self.scales[name].get("ue8m0_ff", "inf") == "nan" else math.inf
        if b == 0:
            return 2.0 ** -127 if self.scales[name].get("ue8m0_zero", "pow2") == "pow2" else 0.0
        return 2.0 ** (b - 127)


# --- cache bytes ---------------------------------------------------------------------------------------

class CacheBytes:
    """Every cache tensor's bytes as one numpy array per (plane, buffer), with page-level access."""

    def __init__(self, spec: Spec, cache, page: int, heads: int, values: int):
        self.spec, self.page, self.heads, self.values = spec, page, heads, values
        self.bytes = {}
        for plane in spec.planes:
            for buffer in spec.buffers:
                field = spec.field(plane, buffer)
                if field in self.bytes:                 # a buffer of every plane: one array for all
                    self.bytes[plane, buffer] = self.bytes[field]
                    continue
                t = getattr(cache, field)
                flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().copy()
                page_bytes = spec.page_bytes(buffer, page, heads, values)
                assert flat.size % page_bytes == 0, f"{field}: {flat.size} bytes, pages of {page_bytes}"
                self.bytes[plane, buffer] = self.bytes[field] = flat
        self.num_pages = flat.size // page_bytes

    def at(self, plane: str, holds: str, page_id: int, coords: dict) -> int:
        coords = {**coords, "plane": self.spec.planes.index(plane)}
        buffer, offset = self.spec.position(holds, coords, self.page, self.heads, self.values)
        return page_id * self.spec.page_bytes(buffer, self.page, self.heads, self.values) + offset, buffer

    def write(self, plane, holds, page_id, coords, data: np.ndarray, skip: int = 0) -> None:
        start, buffer = self.at(plane, holds, page_id, coords)
        start += skip
        self.bytes[plane, buffer][start:start + data.size] = data

    def read(self, plane, holds, page_id, coords, n: int, skip: int = 0) -> np.ndarray:
        start, buffer = self.at(plane, holds, page_id, coords)
        start += skip
        return self.bytes[plane, buffer][start:start + n]

    def tensors(self, like) -> list:
        """The bytes as tensors shaped like `like`'s (a Cache), in its field order."""
        out = []
        for field, t in zip(like._fields, like):
            plane, buffer = next((p, b) for p in self.spec.planes for b in self.spec.buffers
                                 if self.spec.field(p, b) == field)
            raw = torch.from_numpy(self.bytes[plane, buffer].copy())
            out.append(raw.view(t.dtype).view(t.shape) if t.element_size() == 1 else raw.view(t.dtype).view(t.shape))
        return out

    def valid(self, loc: int) -> bool:
        return 0 <= loc < self.num_pages * self.page and loc != self.spec.sink


def _segment_offsets(spec: Spec, values: int):
    """(segment, first value, first record byte) in record order."""
    v = b = 0
    for item in spec.record:
        if "scales" not in item:
            yield item, v, b
            v += spec.segment_values(item, values)
        b += spec.item_bytes(item, values)


def given_scale(given: dict, plane: str, group: str, head: int) -> float:
    """A call-time scale by argument name <plane>_<group>: one float for the plane, or a list per head."""
    scale = given[f"{plane}_{group}"]
    return scale[head] if isinstance(scale, list) else scale


# The midpoints between neighbouring e2m1 magnitudes, and whether a value exactly there takes the
# upper code (the even one): 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0.
E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e4m3_block(group: dict, fmt: str, x: np.ndarray, a: float, given, plane: str, head: int) -> tuple:
    """One block of an e4m3-scaled group (NVFP4): (quotients x / (s g), or the codes themselves
    under rounding 'products', and the stored scale byte). s = the e4m3 code nearest
    amax / (fmax * g) (its fp32 quotient; ties to even, saturated at 448), g the plane's global
    scale (1 without one); a zero s * g gives +0 codes."""
    g = f32(given_scale(given, plane, group["global"], head)) if group.get("global") else 1.0
    with np.errstate(all="ignore"):             # a caller's zero, infinite or NaN g: IEEE quotients
        raw = f32(np.float64(a) / np.float64(f32(fmax(fmt) * g)))
    scale_code = int(encode("fp8_e4m3fn", np.array([raw], dtype=np.float32))[0])
    s = code_value("fp8_e4m3fn", scale_code)
    d = f32(s * g)
    stored = np.array([scale_code], dtype=np.uint8)
    if group.get("rounding") == "products":
        codes = np.zeros(x.size, dtype=np.uint8)
        if d > 0:                                # (not for a NaN d)
            for i, v in enumerate(x.astype(np.float64)):
                k = sum(1 for m, up in E2M1_MIDPOINTS if (abs(v) >= f32(d * m) if up else abs(v) > f32(d * m)))
                codes[i] = k | (sign_bit(fmt) if np.signbit(x[i]) else 0)
        return codes, stored
    with np.errstate(all="ignore"):
        q = (x.astype(np.float64) / d).astype(np.float32) if d > 0 else np.zeros_like(x)
    return q, stored


def quantize_store(spec: Spec, state: CacheBytes, srcs, loc, given: dict | None = None) -> None:
    """The writers' bytes: each valid slot's record and scales, token by token (docs/numerics.md).
    given: the call-time scales by argument name, <plane>_<group> (value / scale, correctly rounded)."""
    values = state.values
    for i, slot_id in enumerate(int(s) for s in loc):
        if not state.valid(slot_id):
            continue
        page_id, slot = divmod(slot_id, state.page)
        for plane, src in zip(spec.planes, srcs):
            for head in range(state.heads):
                row = src[i, head].cpu()
                x32, _ = widen(row)
                for seg, first, byte in _segment_offsets(spec, values):
                    n = spec.segment_values(seg, values)
                    where = {"slot": slot, "head": head}
                    if seg["dtype"] not in ELEMENTS:
                        data = convert_bits(row[first:first + n], RAW[seg["dtype"]][0])
                        state.write(plane, "records", page_id, where, data, skip=byte)
                        continue
                    name, fmt = seg["scale"], seg["dtype"]
                    kind, size = spec.group_of(name, values)
                    if kind == "tensor":
                        with np.errstate(all="ignore"):
                            q = (x32[first:first + n].astype(np.float64) / given_scale(given, plane, name, head)).astype(np.float32)
                        state.write(plane, "records", page_id, where, pack(fmt, encode(fmt, q)), skip=byte)
                        continue
                    for j in range(n // size):
                        x = x32[first + j * size: first + (j + 1) * size]
                        a = spec.amax(name, x)
                        if spec.scales[name].get("nan") == "poison" and np.isnan(x).any():
                            # the whole group NaN: every code the NaN code, the scale the format's NaN
                            codes = np.full(size, NAN_CODE[fmt], dtype=np.uint8)
                            stored = {"ue8m0": np.array([0xFF], dtype=np.uint8), "e4m3": np.array([0x7F], dtype=np.uint8),
                                      "fp32": np.array([NAN32], dtype=np.uint32).view(np.uint8)}[spec.scales[name]["format"]]
                            state.write(plane, "records", page_id, where, pack(fmt, codes), skip=byte + j * size // packing(fmt))
                            state.write(plane, name, page_id, {"slot": slot, "head": head, "scale": j}, stored)
                            continue
                        if spec.scales[name]["format"] == "e4m3":
                            q, stored = e4m3_block(spec.scales[name], fmt, x, a, given, plane, head)
                            codes = q if spec.scales[name].get("rounding") == "products" else encode(fmt, q)
                            state.write(plane, "records", page_id, where, pack(fmt, codes), skip=byte + j * size // packing(fmt))
                            state.write(plane, name, page_id, {"slot": slot, "head": head, "scale": j}, stored)
                            continue
                        if spec.scales[name]["rule"] == "exact":
                            s = f32(a / fmax(fmt)) if math.isfinite(a) else math.inf
                            floor = spec.scales[name].get("scale_floor")
                            s = max(s, f32(floor)) if floor is not None else s
                            with np.errstate(all="ignore"):
                                q = np.zeros_like(x) if s == 0 else (x.astype(np.float64) / s).astype(np.float32)
                            stored = np.float32(s).reshape(1).view(np.uint8)
                        else:
                            e = spec.exponent(name, fmt, a)
                            with np.errstate(all="ignore"):     # (NaN and inf cast as IEEE says)
                                q = (x.astype(np.float64) * 2.0 ** -e).astype(np.float32)
                            stored = (np.array([e + 127], dtype=np.uint8) if spec.scale_bytes(name) == 1
                                      else np.float32(2.0 ** e).reshape(1).view(np.uint8))
                        state.write(plane, "records", page_id, where, pack(fmt, encode(fmt, q)),
                                    skip=byte + j * size // packing(fmt))
                        state.write(plane, name, page_id, {"slot": slot, "head": head, "scale": j}, stored)


def _out_bits(v64: np.ndarray, dtype) -> np.ndarray:
    """Computed values (exact in float64) rounded to fp32, then to the output dtype; canonical NaNs."""
    with np.errstate(all="ignore"):
        v32 = v64.astype(np.float32)
    if dtype == torch.float32:
        return np.where(np.isnan(v32), NAN32, v32.view(np.uint32)).astype(np.uint32).view(np.uint8)
    return to_half_bits(v32, dtype).view(np.uint8)


def gather_dequant(spec: Spec, state: CacheBytes, ids, dtype=torch.bfloat16, given: dict | None = None) -> list:
    """The readers' output per plane: (tokens, heads, values) of dtype; invalid ids give zero rows.
    given: the call-time scales by argument name (code * scale)."""
    heads, values = state.heads, state.values
    width = torch.empty((), dtype=dtype).element_size()
    outs = []
    for plane in spec.planes:
        out = np.zeros((len(ids), heads, values * width), dtype=np.uint8)
        for i, slot_id in enumerate(int(s) for s in ids):
            if not (0 <= slot_id < state.num_pages * state.page):
                continue
            page_id, slot = divmod(slot_id, state.page)
            for head in range(heads):
                where = {"slot": slot, "head": head}
                for seg, first, byte in _segment_offsets(spec, values):
                    n = spec.segment_values(seg, values)
                    cols = slice(first * width, (first + n) * width)
                    if seg["dtype"] not in ELEMENTS:
                        raw_dtype, size = RAW[seg["dtype"]]
                        data = state.read(plane, "records", page_id, where, n * size, skip=byte)
                        row = torch.from_numpy(data.copy()).view(raw_dtype)
                        out[i, head, cols] = convert_bits(row, dtype)
                        continue
                    name, fmt = seg["scale"], seg["dtype"]
                    codes = unpack(fmt, state.read(plane, "records", page_id, where, n // packing(fmt), skip=byte))
                    kind, size = spec.group_of(name, values)
                    if kind == "tensor":
                        scale = np.full(n, given_scale(given, plane, name, head))
                    elif kind == "values":
                        nb = spec.scale_bytes(name)
                        scale = np.repeat([spec.scale_value(name, bytes(state.read(
                            plane, name, page_id, {"slot": slot, "head": head, "scale": j}, nb)))
                            for j in range(n // size)], size)
                    else:
                        scale = np.array([spec.scale_value(name, bytes(state.read(
                            plane, name, page_id, {"block": slot // size, "head": head, "dim": d}, 1)))
                            for d in range(n)])
                    with np.errstate(all="ignore"):
                        if spec.scales[name].get("global"):      # two-level: times the plane's global scale
                            scale = scale * f32(given_scale(given, plane, spec.scales[name]["global"], head))
                        out[i, head, cols] = _out_bits(decode(fmt, codes) * scale, dtype)
        outs.append(torch.from_numpy(out).view(dtype).view(len(ids), heads, values))
    return outs


def append(spec: Spec, state: CacheBytes, srcs, loc) -> None:
    """Seq-blocked appends (groups of tokens), block by block (docs/numerics.md, `append`)."""
    seg = spec.record[0]
    name, fmt = seg["scale"], seg["dtype"]
    size = spec.group_of(name)[1]
    lo, hi = spec.exponent_bounds(name)
    values = state.values
    blocks: dict = {}
    for i, slot_id in enumerate(int(s) for s in loc):
        if state.valid(slot_id):
            page_id, slot = divmod(slot_id, state.page)
            blocks.setdefault((page_id, slot // size), {})[slot % size] = i
    for (page_id, block), rows in blocks.items():
        fresh = 0 in rows
        for plane, src in zip(spec.planes, srcs):
            for head in range(state.heads):
                x32 = np.stack([widen(src[i, head].cpu())[0] for i in rows.values()])      # [rows, values]
                for d in range(values):
                    where = {"block": block, "head": head, "dim": d}
                    old = lo if fresh else int(state.read(plane, name, page_id, where, 1)[0]) - 127
                    new = max(old, spec.exponent(name, fmt, spec.amax(name, x32[:, d])))
                    state.write(plane, name, page_id, where, np.array([new + 127], dtype=np.uint8))
                    for k in range(size):
                        at = {"slot": block * size + k, "head": head}
                        if k in rows:
                            x = x32[list(rows).index(k), d: d + 1]
                            # A stored 0xFF (exponent 128, an infinite scale) encodes values as x * 0.
                            factor = 2.0 ** -new if new <= 127 else 0.0
                            with np.errstate(all="ignore"):
                                code = encode(fmt, (x.astype(np.float64) * factor).astype(np.float32))
                        elif not fresh and new > old:
                            kept = state.read(plane, "records", page_id, at, 1, skip=d)
                            # The factor is an fp32 power of two: 0 below 2^-149 (so an infinite code gives NaN).
                            factor = 2.0 ** (old - new) if old - new >= -149 else 0.0
                            with np.errstate(all="ignore"):
                                code = encode(fmt, (decode(fmt, kept) * factor).astype(np.float32))
                        else:
                            continue
                        state.write(plane, "records", page_id, at, code, skip=d)
