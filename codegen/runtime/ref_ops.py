"""The pure-torch references of every generated module's ops: the same bytes as the kernels, on any
device, written as plain loops over the layout's segments.

A generated module describes its layout to this code with a reference sheet (templates/_ref_sheet.j2):
  _ref_segments(G)                           what each record segment holds, for one geometry G;
  _ref_record_row(G, plane, page, slot, head)  the byte address of a record in its plane's buffer;
  _ref_<group>_row(G, plane, page, slot, head, block)  the address of a scale group's first entry there
                                             (entry k sits k * segment.scale_stride further);
  _REF_RECORDS, _REF_PLANE_FIELDS,          the records' buffer within a plane, each plane's Cache field
  _REF_DENSE_DTYPES                          of each buffer (a buffer of every plane is one field), the dense op dtypes.
Addresses come from the model's Placement (Layout.records / Layout.scales_of), so the references and
the kernels read one placement; tests/oracle.py checks both against an independent byte builder.

Everything below the COPY marker is copied into each generated module, except the functions of ops
or rules the layout does not have (render._carried).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import torch

from .ref_numerics import (_E2M1_MIDPOINTS, _ref_bytes, _ref_cast, _ref_decode, _ref_encode, _ref_exp2i,
                           _ref_magnitude_bits, _ref_pack, _ref_unpack)

# Each generated module defines these (see the module docstring).
PLANES: tuple = ()
SINK_SLOT = None
SCALE_GROUP_TOKENS = 1
Cache = tuple
_REF_RECORDS = 0
_REF_PLANE_FIELDS: tuple = ((0,),)
_REF_DENSE_DTYPES = (torch.uint8, torch.uint8)
INPUTS: tuple = ()
_index = _prepare_gather = _prepare_store = _prepare_store_inputs = _prepare_quantize = None
_prepare_dequantize = _out_dtype = None
_ref_segments = _ref_record_row = None
_CODE_DTYPES: dict = {}

# --- COPY: everything below is copied into each generated module ------------------------------


def _ref_mode(*written):
    """The autograd mode a reference op runs in, so that it behaves as its kernel: no autograd record
    (a scale or source that requires grad makes no output require it), and inference mode where a
    tensor it writes (an out, a cache field; tuples are looked into) was made in inference mode:
    a kernel writes such a tensor through its pointer, torch updates it in place only in that mode."""
    tensors = [t for w in written for t in (w if isinstance(w, (tuple, list)) else (w,))]
    if any(isinstance(t, torch.Tensor) and t.is_inference() for t in tensors):
        return torch.inference_mode()
    return torch.no_grad()


_FP32_EXPONENT_ALL_ONES = 0x7F800000   # fp32 bits at and above which a magnitude is inf (NaN is masked out before)
_FP32_MANTISSA_MASK = 0x7FFFFF


class _RefGroup(NamedTuple):
    """A scale group as the references need it (the model's ScaleGroup and its ScaleFormat)."""
    name: str
    exact: bool               # rule exact: fp32 amax / fmax; else a power of two from amax's bits
    format: str               # "ue8m0" (one biased exponent byte) or "fp32"
    nbytes: int               # bytes of one stored scale
    bias: int                 # ue8m0's exponent bias
    exponent_max: int         # the largest exponent the format stores
    zero_is_pow2: bool        # ue8m0 byte 0x00 reads as 2^-127 (else as 0)
    floor_bits: int           # fp32 bits of the amax floor; 0: none
    fmax: float               # largest finite value of the element format
    fmax_exponent: int        # its exponent
    above: int | None         # the rule's mantissa terms (formats.RuleTerms)
    at_least: int | None
    below: int | None
    exponent_lo: int          # the clamp of the rule's exponent
    exponent_hi: int
    ff_is_nan: bool = False   # ue8m0 byte 0xFF reads as NaN (else as +inf)
    scale_floor: float = 0.0  # rule exact: the least scale (0: none)
    given: bool = False       # a call-time scale (one fp32 per plane, an op argument; nothing stored)
    code: str | None = None   # an fp8 scale format's codes (a _CODE_DTYPES key): each scale rounded to one
    two_level: bool = False   # block scales relative to a call-time global scale (see _ref_quantize_rows)
    products: bool = False    # codes from comparisons of |x| with scale * midpoint (_ref_encode_products)
    poison: bool = False      # a group holding a NaN is NaN as a whole: its scale and every code


class _RefSegment(NamedTuple):
    """A record segment for one geometry: its values, bytes and (quantized) scales."""
    name: str
    value_offset: int
    values: int
    byte_offset: int
    nbytes: int
    code: str | None          # element format of a quantized segment (a _CODE_DTYPES key)
    packing: int              # codes per byte (2: fp4, see _ref_pack)
    raw: torch.dtype | None   # dtype of a raw segment
    group: _RefGroup | None
    tiles: int                # scales of one token and head (values groups) or values (slot groups)
    scale_field: int          # the Cache field, within a plane, holding the scales
    scale_row: object         # _ref_<group>_row (None without cache ops)
    scale_stride: int         # bytes from one of a row's scales to the next (split: to the next N)
    dense_column: int         # first byte of the segment's scales in a dense scale row
    scale_split: int = 1      # N where the region splits scale as scale // N and scale % N
    scale_lo: int = 0         # then: bytes from one scale to the next within N
    given_index: int = 0      # a given or two-level group's place among the layout's call-time scales (in a plane's)

    @property
    def tile(self) -> int:
        """Values of one token and head that share a scale (1 for groups along slots)."""
        return self.values // self.tiles

    @property
    def columns(self) -> slice:
        return slice(self.value_offset, self.value_offset + self.values)

    @property
    def bytes(self) -> slice:
        return slice(self.byte_offset, self.byte_offset + self.nbytes)


def _ref_exponent(g: _RefGroup, amax_bits: torch.Tensor) -> torch.Tensor:
    """A power-of-two rule: the unbiased exponent from amax's fp32 bits (the kernels' _<group>_exponent):
    the exponent of amax / fmax, bumped by the rule's mantissa terms; infinity gives the largest."""
    a = amax_bits.to(torch.int32).clamp(min=g.floor_bits)
    mantissa = a & _FP32_MANTISSA_MASK
    e = (a >> 23) - (127 + g.fmax_exponent)
    if g.above is not None:
        e = e + (mantissa > g.above).to(torch.int32)
    if g.at_least is not None:
        e = e + (mantissa >= g.at_least).to(torch.int32)
    if g.below is not None:
        e = e - (mantissa < g.below).to(torch.int32)
    e = torch.where(a >= _FP32_EXPONENT_ALL_ONES, g.exponent_hi, e)
    return e.clamp(g.exponent_lo, g.exponent_hi)


def _ref_exact_scale(g: _RefGroup, amax_bits: torch.Tensor, global_scale=None) -> torch.Tensor:
    """Rule exact: amax (floored) / fmax in fp32, correctly rounded (a float64 quotient of two fp32
    values rounds to the correctly rounded fp32 one; torch's CUDA division by a scalar multiplies by
    its reciprocal, which is not), then raised to the scale floor. Two-level: amax / (fmax * g), the
    product rounded to fp32. An fp8 scale format: that scale rounded to its nearest code (saturated),
    as the code's fp32 value."""
    a = amax_bits.to(torch.int32).clamp(min=g.floor_bits)
    divisor = torch.tensor(g.fmax, dtype=torch.float32, device=a.device)
    if global_scale is not None:
        divisor = divisor * global_scale
    scale = (a.view(torch.float32).to(torch.float64) / divisor.to(torch.float64)).to(torch.float32)
    if g.code is not None:
        return _ref_decode(_ref_encode(scale, g.code), g.code)
    return scale.clamp(min=g.scale_floor) if g.scale_floor else scale


def _ref_scale_store(g: _RefGroup, flat: torch.Tensor, addr: torch.Tensor, scale: torch.Tensor) -> None:
    """Write scales (exact fp32 values, or exponents) at byte addresses `addr` of the uint8 view `flat`."""
    if g.format == "ue8m0":
        flat[addr] = (scale + g.bias).to(torch.uint8)
        return
    if g.code is not None:
        flat[addr] = _ref_encode(scale, g.code)
        return
    value = scale if g.exact else _ref_exp2i(scale)
    if g.poison:                 # a poisoned group's scale (NaN, or the exponent above the range): the canonical NaN
        nan = (value.isnan() if g.exact else scale > g.exponent_max)
        value = torch.where(nan, torch.tensor(0x7FFFFFFF, dtype=torch.int32, device=value.device).view(torch.float32), value)
    # (flattened first: an empty tensor may have a last stride of 0, which a view to bytes refuses)
    flat[addr[..., None] + torch.arange(4, device=addr.device)] = value.reshape(-1).view(torch.uint8).view(*scale.shape, 4)


def _ref_scale_load(g: _RefGroup, flat: torch.Tensor, addr: torch.Tensor) -> torch.Tensor:
    """Read scales at byte addresses `addr` as fp32 (the kernels' _<group>_load)."""
    if g.format == "ue8m0":
        bits = flat[addr].to(torch.int32) << 23
        if g.zero_is_pow2:
            bits = torch.where(bits == 0, 1 << 22, bits)        # 2^-127, a subnormal
        if g.ff_is_nan:
            bits = torch.where(bits == 0xFF << 23, 0x7FFFFFFF, bits)   # the GPU's canonical NaN
        return bits.view(torch.float32)
    if g.code is not None:
        return _ref_decode(flat[addr], g.code)
    return flat[addr[..., None] + torch.arange(4, device=addr.device)].view(torch.float32)[..., 0]


def _ref_encode_products(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """x / d -> fp4 e2m1 codes by comparing |x| with d times each midpoint, each product an fp32
    (the kernels' _encode_e2m1_products): the sign is x's bit, a NaN's too; d = 0 gives +0."""
    a = x.abs()
    code = sum(((a >= d * m) if tie_up else (a > d * m)).to(torch.int32) for m, tie_up in _E2M1_MIDPOINTS)
    code = code | ((x.view(torch.int32) >> 28) & 0x8)
    return torch.where(d > 0, code, 0).to(torch.uint8)


def _ref_quantize_rows(seg: _RefSegment, rows: torch.Tensor, global_scale=None) -> tuple:
    """rows (..., seg.values) -> (the segment's bytes (..., seg.nbytes): its codes, packed where the
    format packs two, and the fp32 scales or exponents (..., tiles)). global_scale: a two-level
    group's call-time scale g, shaped to broadcast over the scales: values are divided by scale * g."""
    g = seg.group
    x = _ref_cast(rows, torch.float32, computed=False).unflatten(-1, (seg.tiles, -1))   # as the GPU widens: NaN signs
    amax = _ref_magnitude_bits(x).amax(-1)
    if g.exact:
        scale = _ref_exact_scale(g, amax, global_scale)
        d = (scale if global_scale is None else scale * global_scale)[..., None]
        if g.products:
            codes = _ref_encode_products(x, d).flatten(-2)
            return (_ref_pack(codes) if seg.packing == 2 else codes), scale
        q = torch.where(d > 0, (x.to(torch.float64) / d.to(torch.float64)).to(torch.float32), 0.0)
    else:
        scale = _ref_exponent(g, amax)
        q = x * _ref_exp2i(-scale)[..., None]
    codes = _ref_encode(q, seg.code)
    if g.poison:                 # a NaN among a group's values: every code the NaN code, the scale NaN
        nan = x.isnan().any(-1)
        codes = torch.where(nan[..., None], _CODE_DTYPES[seg.code][2], codes).to(torch.uint8)
        scale = torch.where(nan, float("nan"), scale) if g.exact else torch.where(nan, g.exponent_max + 1, scale)
    codes = codes.flatten(-2)
    return (_ref_pack(codes) if seg.packing == 2 else codes), scale


def _ref_given_codes(seg: _RefSegment, rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """rows (..., seg.values) divided by a call-time fp32 scale (correctly rounded, as a float64
    quotient of two fp32 values rounded to fp32 is) -> the segment's codes."""
    q = (rows.to(torch.float32).to(torch.float64) / scale.to(torch.float64)).to(torch.float32)
    return _ref_encode(q, seg.code)


def _ref_given_scale(seg: _RefSegment, scales: tuple, plane: int) -> torch.Tensor:
    """A given segment's call-time scale for one plane (scales are plane-major, then by group), shaped
    to multiply (tokens, heads, values) rows: one for the plane, or one per head."""
    scale = scales[plane * (len(scales) // len(PLANES)) + seg.given_index].reshape(-1)
    return scale[:, None] if scale.numel() > 1 else scale.reshape(())


def _ref_codes(seg: _RefSegment, stored: torch.Tensor) -> torch.Tensor:
    """A segment's bytes (..., seg.nbytes) as fp32 code values (..., seg.values)."""
    return _ref_decode(_ref_unpack(stored) if seg.packing == 2 else stored, seg.code)


def _ref_pages(cache) -> tuple:
    """The cache fields as the references address them (flat bytes, pages back to back): each
    checked tensor itself, or a contiguous copy of a page-strided view (_ref_put_back writes it back)."""
    return tuple(t if t.is_contiguous() else t.contiguous() for t in cache)


def _ref_put_back(cache, fields: tuple) -> None:
    """Copy _ref_pages' copies of page-strided views back into them (the bytes between pages untouched)."""
    for t, f in zip(cache, fields):
        if f is not t:
            t.copy_(f)


def _ref_plane_fields(cache, plane: int, index: int) -> torch.Tensor:
    """The uint8 view of the Cache field holding a plane's `index`-th buffer."""
    return _ref_bytes(cache[_REF_PLANE_FIELDS[plane][index]])


def _ref_written(loc: torch.Tensor, num_pages: int, page_size: int) -> torch.Tensor:
    """Which slots a writer stores: inside the cache, and not the sink slot."""
    ok = (loc >= 0) & (loc < num_pages * page_size)
    return ok if SINK_SLOT is None else ok & (loc != SINK_SLOT)


def _ref_slot_coords(G, loc: torch.Tensor) -> tuple:
    """(page, slot, block, head) index tensors of slot ids `loc`: (n, 1) each, heads (1, heads)."""
    page = (loc // G.PAGE_SIZE)[:, None]
    slot = (loc % G.PAGE_SIZE)[:, None]
    return page, slot, slot // SCALE_GROUP_TOKENS, torch.arange(G.HEADS, device=loc.device)[None, :]


def _ref_segment_bytes(seg: _RefSegment, rec_row: torch.Tensor) -> torch.Tensor:
    """Byte addresses of a segment in the records at `rec_row` (..., 1): (..., seg.nbytes)."""
    return rec_row + seg.byte_offset + torch.arange(seg.nbytes, device=rec_row.device)


def _ref_scale_addresses(seg: _RefSegment, G, plane, page, slot, head, block) -> torch.Tensor:
    """Byte addresses of a segment's scales for each (slot, head) row of a plane: (..., seg.tiles)."""
    first = seg.scale_row(G, plane, page, slot, head, block)[..., None]
    entry = torch.arange(seg.tiles, device=first.device)
    if seg.scale_split == 1:
        return first + entry * seg.scale_stride
    return first + entry // seg.scale_split * seg.scale_stride + entry % seg.scale_split * seg.scale_lo


def _ref_quantize_store(srcs: tuple, loc: torch.Tensor, cache, page_size: int, scales: tuple = ()) -> None:
    page_size = _index(page_size, "page_size")
    srcs, geo, num_pages = _prepare_store(srcs, loc, cache, page_size, scales)
    fields = _ref_pages(cache)
    _ref_store_rows(srcs, loc, fields, page_size, geo, num_pages, scales)
    _ref_put_back(cache, fields)


def _ref_quantize_store_inputs(parts: tuple, loc: torch.Tensor, cache, page_size: int, scales: tuple = ()) -> None:
    """_ref_quantize_store of rows that come in parts (INPUTS): checked as the kernel checks them, then
    joined into each plane's rows."""
    page_size = _index(page_size, "page_size")
    parts, geo, num_pages = _prepare_store_inputs(parts, loc, cache, page_size, scales)
    rows = tuple(torch.cat([part for (_, owner, _, _), part in zip(INPUTS, parts) if owner == plane], dim=-1)
                 for plane in PLANES)
    fields = _ref_pages(cache)
    _ref_store_rows(rows, loc, fields, page_size, geo, num_pages, scales)
    _ref_put_back(cache, fields)


def _ref_store_rows(srcs: tuple, loc: torch.Tensor, cache, page_size: int, geo: dict, num_pages: int, scales: tuple) -> None:
    """Quantize checked (T, heads, values) rows, one per plane, into the cache at slots loc."""
    G = SimpleNamespace(**geo)
    loc = loc.to(torch.int64)
    token = _ref_written(loc, num_pages, page_size).nonzero().flatten()
    page, slot, block, head = _ref_slot_coords(G, loc[token])
    segments = _ref_segments(G)
    for plane, x in enumerate(srcs):
        x = x[token]                                                   # (n, heads, values)
        records = _ref_plane_fields(cache, plane, _REF_RECORDS)
        rec_row = _ref_record_row(G, plane, page, slot, head)[..., None]
        for seg in segments:
            if seg.group is None:
                raw = _ref_cast(x[..., seg.columns], seg.raw, computed=False).contiguous().view(torch.uint8)
                records[_ref_segment_bytes(seg, rec_row)] = raw
                continue
            if seg.group.given:
                records[_ref_segment_bytes(seg, rec_row)] = _ref_given_codes(seg, x[..., seg.columns],
                                                                             _ref_given_scale(seg, scales, plane))
                continue
            g = _ref_given_scale(seg, scales, plane) if seg.group.two_level else None
            codes, scale = _ref_quantize_rows(seg, x[..., seg.columns], g)
            records[_ref_segment_bytes(seg, rec_row)] = codes
            _ref_scale_store(seg.group, _ref_plane_fields(cache, plane, seg.scale_field),
                             _ref_scale_addresses(seg, G, plane, page, slot, head, block), scale)


def _ref_gather_dequant(cache, token_ids: torch.Tensor, page_size: int, out, scales: tuple = ()):
    page_size = _index(page_size, "page_size")
    outs, geo, num_pages = _prepare_gather(cache, token_ids, page_size, out, scales)
    cache = _ref_pages(cache)
    G = SimpleNamespace(**geo)
    ids = token_ids.to(torch.int64)
    ok = ((ids >= 0) & (ids < num_pages * page_size))[:, None, None]
    page, slot, block, head = _ref_slot_coords(G, torch.where(ok[:, 0, 0], ids, 0))
    segments = _ref_segments(G)
    for plane, o in enumerate(outs):
        records = _ref_plane_fields(cache, plane, _REF_RECORDS)
        rec_row = _ref_record_row(G, plane, page, slot, head)[..., None]
        for seg in segments:
            if seg.group is None:
                raw = torch.where(ok, records[_ref_segment_bytes(seg, rec_row)].view(seg.raw), 0.0)
                o[..., seg.columns] = _ref_cast(raw, o.dtype, computed=False)
                continue
            codes = records[_ref_segment_bytes(seg, rec_row)]
            if seg.group.given:
                x = _ref_codes(seg, codes) * _ref_given_scale(seg, scales, plane)
            else:
                scale = _ref_scale_load(seg.group, _ref_plane_fields(cache, plane, seg.scale_field),
                                        _ref_scale_addresses(seg, G, plane, page, slot, head, block))
                x = _ref_codes(seg, codes) * scale.repeat_interleave(seg.tile, -1)
                if seg.group.two_level:
                    x = x * _ref_given_scale(seg, scales, plane)
            o[..., seg.columns] = _ref_cast(torch.where(ok, x, 0.0), o.dtype, computed=True)
    if out is not None:       # returned as passed: a 2-D out's 3-D view was written
        outs = (out,) if len(PLANES) == 1 else tuple(out)
    return outs[0] if len(PLANES) == 1 else outs


def _ref_quantize(x: torch.Tensor):
    x2, lead, geo = _prepare_quantize(x)
    G = SimpleNamespace(**geo)
    n_rows = x2.shape[0]
    data = torch.empty((n_rows, G.RECORD_BYTES), dtype=torch.uint8, device=x.device)
    scale = torch.empty((n_rows, G.DENSE_SCALES), dtype=_REF_DENSE_DTYPES[1], device=x.device)
    rows = torch.arange(n_rows, device=x.device)[:, None] * G.DENSE_SCALE_BYTES
    for seg in _ref_segments(G):
        if seg.group is None:
            data[:, seg.bytes] = _ref_cast(x2[:, seg.columns], seg.raw, computed=False).contiguous().view(torch.uint8)
            continue
        codes, group_scale = _ref_quantize_rows(seg, x2[:, seg.columns])
        data[:, seg.bytes] = codes
        tile = torch.arange(group_scale.shape[-1], device=x.device) * seg.group.nbytes
        _ref_scale_store(seg.group, _ref_bytes(scale), rows + seg.dense_column + tile, group_scale)
    return data.view(_REF_DENSE_DTYPES[0]).view(*lead, G.RECORD_BYTES), scale.view(*lead, G.DENSE_SCALES)


def _ref_dequantize(data: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype | None) -> torch.Tensor:
    out_dtype = _out_dtype(out_dtype)
    data2, scale2, lead, geo = _prepare_dequantize(data, scale, out_dtype)
    G = SimpleNamespace(**geo)
    out = torch.empty((data2.shape[0], G.VALUES), dtype=out_dtype, device=data.device)
    rows = torch.arange(data2.shape[0], device=data.device)[:, None] * G.DENSE_SCALE_BYTES
    for seg in _ref_segments(G):
        if seg.group is None:
            out[:, seg.columns] = _ref_cast(data2[:, seg.bytes].contiguous().view(seg.raw), out_dtype, computed=False)
            continue
        tile = torch.arange(seg.tiles, device=data.device) * seg.group.nbytes
        scale_f32 = _ref_scale_load(seg.group, _ref_bytes(scale2), rows + seg.dense_column + tile)
        x = _ref_codes(seg, data2[:, seg.bytes]) * scale_f32.repeat_interleave(seg.tile, -1)
        out[:, seg.columns] = _ref_cast(x, out_dtype, computed=True)
    return out.view(*lead, G.VALUES)


def _ref_append(srcs: tuple, loc: torch.Tensor, cache, page_size: int) -> None:
    """One leader at a time: each slot whose block has no valid slot among the SCALE_GROUP_TOKENS rows
    before it leads the rows of its block in the window after it (see docs/design.md, append)."""
    page_size = _index(page_size, "page_size")
    srcs, geo, num_pages = _prepare_store(srcs, loc, cache, page_size)
    fields = _ref_pages(cache)
    G = SimpleNamespace(**geo)
    n_tokens, heads, values = srcs[0].shape
    T = SCALE_GROUP_TOKENS
    (seg,) = _ref_segments(G)
    g = seg.group
    device = loc.device
    loc = loc.to(torch.int64)
    valid = _ref_written(loc, num_pages, page_size)
    block_of = torch.where(valid, loc // T, -1)
    index = torch.arange(n_tokens, device=device)
    window = torch.arange(T, device=device)
    before = index[:, None] - T + window[None, :]
    led_before = ((before >= 0) & (block_of[before.clamp(min=0)] == block_of[:, None]) & valid[before.clamp(min=0)]).any(1)
    head = torch.arange(heads, device=device)[:, None]
    dim = torch.arange(values, device=device)[None, :]
    for n in (valid & ~led_before).nonzero().flatten().tolist():
        after = n + window
        after = after[after < n_tokens]
        hit = after[valid[after] & (block_of[after] == block_of[n])]
        first_loc = int(block_of[n]) * T
        page = first_loc // page_size
        block = (first_loc % page_size) // T
        new_slots = loc[hit] % page_size
        fresh = bool(((loc[hit] % T) == 0).any())
        written = set((new_slots % T).tolist())
        kept = torch.tensor([s for s in range(T) if s not in written], dtype=torch.int64, device=device)
        kept_slot = first_loc % page_size + kept
        for plane, x in enumerate(srcs):
            records = _ref_plane_fields(fields, plane, _REF_RECORDS)
            scales = _ref_plane_fields(fields, plane, seg.scale_field)
            sc_addr = seg.scale_row(G, plane, page, None, head, block) + dim * seg.scale_stride   # (heads, values)
            stored = scales[sc_addr].to(torch.int32) - g.bias
            rows = x[hit].to(torch.float32)                                              # (hits, heads, values)
            exponent_new = _ref_exponent(g, _ref_magnitude_bits(rows).amax(0))
            exponent_old = torch.full_like(stored, g.exponent_lo) if fresh else stored
            exponent = torch.maximum(exponent_old, exponent_new)
            # kept slots of a block in use: rescale the columns whose exponent grew (a fresh block's are stale)
            kept_row = _ref_record_row(G, plane, page, kept_slot[:, None, None], head) + seg.byte_offset + dim   # (kept, heads, values)
            grew = (exponent > exponent_old)[None].expand(kept_row.shape) & (not fresh)
            old = _ref_decode(records[kept_row], seg.code) * _ref_exp2i(exponent_old - exponent)
            records[kept_row[grew]] = _ref_encode(old, seg.code)[grew]
            # new rows at the block's exponent
            multiplier = torch.where(exponent > g.exponent_max, 0.0, _ref_exp2i(-exponent))
            new_row = _ref_record_row(G, plane, page, new_slots[:, None, None], head) + seg.byte_offset + dim
            records[new_row] = _ref_encode(rows * multiplier, seg.code)
            scales[sc_addr] = (exponent + g.bias).to(torch.uint8)
    _ref_put_back(cache, fields)
