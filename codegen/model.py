"""The validated model of a layout: every byte offset, stride and extent, computed once.

Templates and the renderer read these objects; no template computes an offset or a size.
Extents that depend on call-time sizes are ``Expr`` over the symbols ``page_size``,
``heads`` and ``values`` (see expr.py); everything else is a plain int.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .expr import Expr, RoundUp, const, contains, next_pow2
from .formats import ELEMENT_FORMATS, FP32_MAX_BITS, ElementFormat, RawDtype, RuleTerms, ScaleFormat, fp32_value

# Launch knobs that shape a kernel's code, fixed when its module is generated (not in LAUNCH).
GENERATION_KNOBS = ("head_rows",)

# Call-time symbols and what they mean.
PAGE_SIZE = "page_size"
HEADS = "heads"
VALUES = "values"


@dataclass(frozen=True)
class ScaleGroup:
    name: str
    format: ScaleFormat
    rule: str
    terms: RuleTerms | None       # the integer form of a power-of-two rule; None for `exact`
    amax_floor: float | None
    amax_floor_bits: int          # fp32 bits of the floor; 0 = no floor
    scale_floor: float | None     # rule exact: the least scale (an fp32 value), max(amax / fmax, floor)
    exponent_lo: int              # clamp applied to the rule's exponent (spec range within storage range)
    exponent_hi: int
    zero_byte: str                # "pow2" or "zero": what scale byte 0x00 decodes to
    ff_byte: str                  # "inf" or "nan": what scale byte 0xFF decodes to
    kind: str                     # "values": along a token's values; "tokens": along slots, per value index;
                                  # "tensor": the whole plane, given at call time
    size: int | Expr              # values (or slots) that share one scale; an Expr ({values: any} over a
                                  # segment of call-time width): the segment's width
    count: Expr                   # scales of one token and head ("values" groups)
    padded_count: Expr            # entries stored per token and head, padding included
    segment: str                  # the one segment quantized with this group
    element: ElementFormat        # that segment's element format
    global_name: str | None = None  # two-level scaling (NVFP4): each plane's call-time fp32 scale
                                  # <plane>_<global_name> that every block scale is relative to
    rounding: str = "quotient"    # rule exact: codes of x / scale ("quotient"), or of comparisons of
                                  # |x| with scale times each midpoint ("products", fp4 e2m1 only)
    nan: str = "ignore"           # a NaN among a group's values: skipped by amax ("ignore"), or the
                                  # whole group NaN, its scale and every code ("poison")

    @property
    def exact(self) -> bool:
        return self.rule == "exact"

    @property
    def given(self) -> bool:
        """A call-time scale (group: tensor): one fp32 per plane, passed to the ops, not in the cache."""
        return self.kind == "tensor"

    @property
    def wide_divisors(self) -> bool:
        """Whether the writer's divisors (rule exact, codes of x / scale) may be nonzero and outside
        [2^-77, 2^126), so that its quotients scale them first (runtime numerics._divisor). Inside,
        a one-level group's reciprocals are normal and its remainders exact without that: its floor
        (scale_floor, amax_floor / fmax, e4m3's least code 2^-9) is at least 2^-77, and amax, at most
        fp32's largest value, gives scales below 2^126 (fmax >= 4), as a scale_floor below 2^125 does.
        A global scale or a call-time scale can be anything. A group that does not divide (power-of-two
        rules, products rounding) keeps the kernels' default, True."""
        if self.given or self.global_name is not None or not (self.exact and self.rounding == "quotient"):
            return True
        floor = self.scale_floor or 0.0
        least = max(floor, (fp32_value(self.amax_floor) if self.amax_floor else 0.0) / self.element.fmax,
                    2.0 ** self.format.exponent_min if self.format.code else 0.0)
        return least < 2.0 ** -77 or floor >= 2.0 ** 125 or self.element.fmax < 4.0

    @property
    def two_level(self) -> bool:
        """Block scales relative to a call-time global scale: stored s = fmt(amax / (fmax * g)), values
        divided by s * g and read back as code * s * g."""
        return self.global_name is not None

    @property
    def argument(self) -> str | None:
        """The suffix of this group's call-time tensor per plane (<plane>_<suffix>): a given scale's
        own name, a two-level group's global scale; None for groups computed and stored alone."""
        return self.name if self.given else self.global_name

    @property
    def poison(self) -> bool:
        return self.nan == "poison"

    @property
    def poison_exponent(self) -> int:
        """The exponent a poisoned group of a power-of-two rule takes: one above the format's range
        (ue8m0: byte 0xFF; fp32: stored as NaN by the group's store)."""
        return self.format.exponent_max + 1

    @property
    def code_format(self) -> ElementFormat | None:
        """An fp8 scale format's codes (e4m3: fp8_e4m3fn), whose encoder rounds each scale."""
        return ELEMENT_FORMATS[self.format.code] if self.format.code else None

    @property
    def clamps_lo(self) -> bool:
        """Whether the rule's exponent can fall below exponent_lo (the floor's, or amax 0's, is lower)."""
        return self.terms.exponent(self.amax_floor_bits, self.element.fmax_exponent) < self.exponent_lo

    @property
    def clamps_hi(self) -> bool:
        """Whether a finite amax can give an exponent above exponent_hi (infinity takes it anyway)."""
        return self.terms.exponent(FP32_MAX_BITS, self.element.fmax_exponent) > self.exponent_hi

    @property
    def carry_bias(self) -> int:
        """With a one-term rule (RuleTerms.carry): what the exponent field of amax's bits plus the
        carry addend is reduced by, besides fp32's bias, to give e."""
        return self.element.fmax_exponent - self.terms.carry[1]

    @property
    def walk(self) -> str:
        """The coordinate a segment helper steps through: one scale per tile, or per value index."""
        return "scale" if self.kind in ("values", "tensor") else "dim"

    @property
    def tile(self) -> int | Expr:
        """Values of one token that share a scale: ``size`` for values groups, 1 for tokens groups."""
        return self.size if self.kind == "values" else 1

    @property
    def call_time_width(self) -> bool:
        """A {values: any} group over a segment of call-time width: its kernels take the width and
        its lanes as geometry constexprs (<SEGMENT>_GROUP, <SEGMENT>_LANES)."""
        return self.kind == "values" and not isinstance(self.size, int)

    @property
    def store_function(self) -> str:
        """The runtime/codes.py function that writes this group's scales (an exponent, or an exact value)."""
        if self.poison and self.format.name == "fp32" and not self.exact:
            return "_store_fp32_pow2_poison"     # a poisoned power of two is written as NaN
        return self.format.store_value if self.exact else self.format.store_pow2

    @property
    def store_flags(self) -> str:
        """Extra constexpr arguments of this group's scale stores: a poisoned power of two's exponent."""
        return f", POISON={self.poison_exponent}" if self.store_function == "_store_fp32_pow2_poison" else ""

    @property
    def rule_function(self) -> str:
        """The runtime/numerics.py function that computes this group's scale from amax's bits: the
        exponent of a power-of-two rule, or the value of rule exact (relative to a global scale)."""
        if not self.exact:
            return "_rule_exponent"
        return "_relative_scale" if self.two_level else "_exact_scale"

    @property
    def rule_args(self) -> str:
        """rule_function's constexpr arguments for this group, as keyword arguments (bit patterns in hex)."""
        if self.exact:
            args = {"FMAX": repr(self.element.fmax)}
            if self.amax_floor is not None:
                args["FLOOR_BITS"] = f"0x{self.amax_floor_bits:X}"
            if self.scale_floor is not None:
                args["SCALE_FLOOR"] = repr(self.scale_floor)
        else:
            carry = self.terms.carry
            args = {"BIAS": str(self.carry_bias if carry is not None else self.element.fmax_exponent),
                    "LO": str(self.exponent_lo), "HI": str(self.exponent_hi),
                    "CLAMP_LO": str(self.clamps_lo), "CLAMP_HI": str(self.clamps_hi)}
            if self.amax_floor is not None:
                args["FLOOR_BITS"] = f"0x{self.amax_floor_bits:X}"
            if carry is not None:
                args["CARRY"] = f"0x{carry[0]:X}"
            else:
                args.update({name.upper(): f"0x{t:X}" for name, t in
                             (("above", self.terms.above), ("at_least", self.terms.at_least), ("below", self.terms.below))
                             if t is not None})
        return ", ".join(f"{name}={value}" for name, value in args.items())

    @property
    def load_flags(self) -> str:
        """Extra constexpr arguments of this group's scale loads: ue8m0's reading of byte 0x00."""
        if self.format.name != "ue8m0":
            return ""
        return f", {self.zero_byte == 'pow2'}" + (", FF_IS_NAN=True" if self.ff_byte == "nan" else "")

    @property
    def word_reads(self) -> bool:
        """Readers may load this group's bytes of every block of a page as one word per value index
        (one-byte ue8m0 scales along slots; whether a call's geometry allows it is checked at launch)."""
        return self.kind == "tokens" and self.format.name == "ue8m0"


@dataclass(frozen=True)
class Segment:
    name: str
    dtype: str
    values: Expr                  # logical values in the segment
    value_offset: Expr            # first logical value index
    byte_offset: Expr             # first byte within the record
    nbytes: Expr
    element: ElementFormat | None  # quantized segments
    raw: RawDtype | None           # raw segments
    scale: ScaleGroup | None

    @property
    def quantized(self) -> bool:
        return self.element is not None

    # The constexpr names of this segment's numbers: scale entries per record (geometry), scale entries
    # a tile-loop step handles (the op's launch shape), its column in a dense scale row (geometry).
    @property
    def tiles_name(self) -> str:
        return f"{self.name.upper()}_TILES"

    @property
    def chunk_name(self) -> str:
        return f"{self.name.upper()}_CHUNK"

    @property
    def dense_column_name(self) -> str:
        return f"{self.name.upper()}_DENSE_COLUMN"

    @property
    def quantize_walk(self) -> str:
        """The runtime/segments.py walk that quantizes this segment: one code per byte, or two (fp4)."""
        if self.scale.given:
            return "_quantize_given_segment"
        return "_quantize_segment" if self.element.packing == 1 else "_quantize_packed_segment"

    @property
    def dequantize_walk(self) -> str:
        if self.scale.given:
            return "_dequantize_given_segment"
        return "_dequantize_segment" if self.element.packing == 1 else "_dequantize_packed_segment"

    @property
    def group_constexprs(self) -> tuple:
        """(walk parameter, geometry name) of the group width and lanes the op kernels pass to this
        segment's wrappers, where they are known only at call time; () otherwise."""
        if self.scale is None or not self.scale.call_time_width:
            return ()
        return (("GROUP", f"{self.name.upper()}_GROUP"), ("LANES", f"{self.name.upper()}_LANES"))

    @property
    def walk_group(self) -> tuple:
        """(GROUP, LANES) as the wrappers pass them to the segment walk: the group's width and, where
        it is not a power of two, the lanes above it (None: no lanes argument); names of the
        wrapper's own parameters where they are known only at call time."""
        g = self.scale
        if g.call_time_width:
            return "GROUP", "LANES"
        lanes = next_pow2(const(g.tile)).const_value()
        return str(g.tile), (str(lanes) if lanes != g.tile else None)

    @property
    def quantize_flags(self) -> str:
        """The keyword arguments a stored-scale segment's _quantize_ wrapper adds to its walk beyond
        the defaults: a global scale, products rounding, NaN poisoning, divisors known to be narrow."""
        g = self.scale
        flags = []
        if g.two_level:
            flags.append("GLOBAL=True, g=g")
        if g.rounding == "products":
            flags.append("PRODUCTS=True")
        if g.poison:
            flags.append(f"POISON=True, NAN_CODE=0x{self.element.nan_code:X}, POISON_EXPONENT={g.poison_exponent}")
        if not g.wide_divisors:
            flags.append("WIDE=False")
        return "".join(f", {f}" for f in flags)

    @property
    def byte_end(self) -> Expr:
        """The record byte after the segment."""
        return self.byte_offset + self.nbytes

    @property
    def value_end(self) -> Expr:
        """The value index after the segment."""
        return self.value_offset + self.values

    @property
    def lanes(self) -> int:
        """A tile's width for this (fixed-width) segment's values: their count rounded up to a power of two."""
        return 1 << max(0, self.values.const_value() - 1).bit_length()


@dataclass(frozen=True)
class Term:
    """One coordinate of a region's byte order, e.g. ``slot % 32`` with its extent and byte stride."""

    coord: str                    # slot, head, scale, dim or block
    op: str | None                # "%" or "//" for split coordinates
    n: int | None
    extent: Expr
    stride: Expr                  # bytes between neighbours along this coordinate
    const_name: str               # constexpr name carrying the stride into kernels

    @property
    def text(self) -> str:
        return self.coord if self.op is None else f"{self.coord} {self.op} {self.n}"

    @property
    def kernel_expr(self) -> str:
        """The coordinate as an expression over the kernel variable of the same name."""
        return self.coord if self.op is None else f"({self.coord} {self.op} {self.n})"


@dataclass(frozen=True)
class Region:
    buffer: str
    holds: str                    # "records" or a scale group name
    terms: tuple                  # Term, outermost first
    element_bytes: Expr           # one record, or one scale
    offset: Expr                  # byte offset inside the page
    nbytes: Expr                  # bytes inside one page (inline: inside one record)
    offset_name: str              # constexpr name carrying ``offset``
    inline: bool = False          # a group's scales inside each record (its terms: the records', then scale)
    record_offset: Expr | None = None   # inline: the first scale's byte within the record

    def term(self, coord: str) -> tuple:
        return tuple(t for t in self.terms if t.coord == coord)


@dataclass(frozen=True)
class Buffer:
    name: str
    regions: tuple
    page_bytes: Expr              # bytes per page, padding included
    align: int
    page_bytes_name: str          # constexpr name carrying page_bytes
    torch_dtype: str              # dtype alloc_cache gives it
    shape: tuple                  # Expr per dim after num_pages (alloc_cache's natural shape)
    shared: bool = False          # one tensor for every plane (its regions order a `plane` coordinate)


@dataclass(frozen=True)
class Placement:
    """Where records or one scale group's entries live: the buffer (the Cache field ``<plane>_<name>``
    of each plane, `index`-th within a plane), the region of its pages, and the byte address of one
    entry. Kernels, references, explain and the tests take every address from here."""

    holds: str
    buffer: Buffer
    region: Region
    index: int

    @property
    def terms(self) -> tuple:
        return self.region.terms

    def term(self, coord: str) -> tuple:
        return self.region.term(coord)

    def walk_strides(self, coord: str) -> tuple:
        """(stride constexpr, split N, remainder stride constexpr) of the coordinate a segment walk
        steps through (scale or dim): (its stride, 1, None) when whole; split as `c // N` and
        `c % N`, the quotient's stride, N and the remainder's stride."""
        terms = self.region.term(coord)
        if len(terms) == 1:
            return terms[0].const_name, 1, None
        hi = next(t for t in terms if t.op == "//")
        lo = next(t for t in terms if t.op == "%")
        return hi.const_name, hi.n, lo.const_name

    def stride_name(self, coord: str) -> str:
        """The constexpr carrying the byte stride of an unsplit coordinate (scale, dim, block)."""
        (term,) = self.region.term(coord)
        return term.const_name

    def address(self, names: dict | None = None, skip: tuple = (), prefix: str = "", page_stride: str | None = None) -> str:
        """One entry's byte offset in its buffer as source: page * PAGE_BYTES + OFFSET + a
        coordinate * STRIDE term per coordinate of the region's order, over variables named as the
        coordinates (`names` renames them, and `page`). `skip` leaves out coordinates the caller
        walks itself (a helper's scale or dim); `prefix` qualifies the constants (``G.`` in the
        references); `page_stride` names the constant pages step by instead of the page bytes (a
        kernel's: the Cache field's PAGE_STRIDE, which a page-strided view sets)."""
        names = names or {}
        parts = [f"{names.get('page', 'page')} * {prefix}{page_stride or self.buffer.page_bytes_name}",
                 f"{prefix}{self.region.offset_name}"]
        for t in self.region.terms:
            if t.coord in skip:
                continue
            var = names.get(t.coord, t.coord)
            if var == "0":                  # a coordinate the caller fixes at 0 (plane k) adds nothing
                continue
            if var == "1" and t.op is None:
                parts.append(f"{prefix}{t.const_name}")
                continue
            expr = var if t.op is None else f"({var} {t.op} {t.n})"
            parts.append(f"{expr} * {prefix}{t.const_name}")
        return " + ".join(parts)

    def offset(self, coords: dict) -> Expr:
        """One entry's byte offset in its buffer for integer coordinates (page, slot, head, scale /
        block, head, dim), as an expression over the call-time sizes."""
        total = coords["page"] * self.buffer.page_bytes + self.region.offset
        for t in self.region.terms:
            value = coords[t.coord]
            if t.op == "%":
                value %= t.n
            elif t.op == "//":
                value //= t.n
            total = total + value * t.stride
        return total


@dataclass(frozen=True)
class Source:
    """One tensor quantize_store reads a plane's values from: the whole row (named after the plane),
    or, with the spec's inputs, one part of it (first value .. first + width, whole segments)."""
    name: str                     # the op's parameter
    plane: str
    first: int                    # the part's first value index in the plane's row
    width: Expr                   # its values
    segments: tuple               # names of the record segments it holds
    part: bool                    # one of several parts of the row (the spec's inputs)

    @property
    def ptr(self) -> str:
        """Its kernel pointer parameter."""
        return f"{self.name}_ptr"

    @property
    def row(self) -> str:
        """The kernel's name for a row's element offset in it."""
        return f"{self.name}_row" if self.part else "x_row"

    @property
    def end(self) -> Expr:
        """One past its last value index in the plane's row."""
        return self.width + self.first


@dataclass(frozen=True)
class Layout:
    name: str
    summary: str
    spec_path: str                # e.g. specs/dsv4_k.yaml (as written in headers)
    spec_sha256: str
    planes: tuple
    heads: Expr
    values: Expr                  # logical values per token and head
    page_size_multiple: int
    page_align: int
    sink: int | None
    segments: tuple
    record_bytes: Expr
    scales: tuple                 # ScaleGroup, in spec order
    buffers: tuple                # Buffer, in spec order
    ops: tuple
    launch: dict                  # op -> {knob: value}: the launch shape of each op
    runtime_checks: tuple = field(default=())   # (Expr, n, message): geometry() checks Expr % n == 0
    inputs: tuple = field(default=())   # Source: the spec's inputs (quantize_store's parts of each plane's rows)

    # -- lookups used by templates -------------------------------------------------------
    @property
    def head_rows(self) -> bool:
        """quantize_store's programs take (token, head) rows and write every plane (the spec's
        tuning.quantize_store.head_rows, fixed when the module is generated)."""
        return bool(self.launch.get("quantize_store", {}).get("head_rows"))

    @property
    def sources(self) -> tuple:
        """The tensors quantize_store reads, plane-major: the spec's inputs, else one whole row per plane."""
        if self.inputs:
            return self.inputs
        names = tuple(s.name for s in self.segments)
        return tuple(Source(name=p, plane=p, first=0, width=self.values, segments=names, part=False) for p in self.planes)

    def plane_sources(self, plane: str) -> tuple:
        return tuple(src for src in self.sources if src.plane == plane)

    def source_of(self, plane: str, segment: Segment) -> Source:
        """The source holding a plane's segment."""
        return next(src for src in self.plane_sources(plane) if segment.name in src.segments)

    @property
    def runtime_launch(self) -> dict:
        """The launch knobs as the module's LAUNCH holds them: those its host code reads per call
        (not head_rows, which decides the kernel's code)."""
        return {op: {k: v for k, v in knobs.items() if k not in GENERATION_KNOBS} for op, knobs in self.launch.items()}

    @property
    def size_checks(self) -> tuple:
        """(Expr, n, message, argument) of each runtime check: geometry() raises unless Expr % n == 0,
        naming page_size, or the value or head count (the tensor that gave it, in the ops)."""
        out = []
        for expr, n, message in self.runtime_checks:
            symbols = expr.symbols()
            argument = (PAGE_SIZE if symbols == {PAGE_SIZE} else VALUES if symbols == {VALUES}
                        else HEADS if symbols == {HEADS} else "sizes")
            out.append((expr, n, message, argument))
        return tuple(out)

    @property
    def dense_heads(self) -> int:
        """The head count quantize and dequantize compute their geometry at (a row's record and scales do
        not depend on it): the spec's, else the least every heads-only runtime check takes (scales that
        split heads in k ask for a multiple of k)."""
        if self.heads.is_const:
            return self.heads.const_value()
        checks = [(e, n) for e, n, _, argument in self.size_checks if argument == HEADS]
        return next((h for h in range(1, math.lcm(1, *(n for _, n in checks)) + 1)
                     if all(e.evaluate({HEADS: h}) % n == 0 for e, n in checks)), 1)

    @property
    def scale_kind(self) -> str | None:
        kinds = {g.kind for g in self.scales}
        return kinds.pop() if kinds else None

    @property
    def group_tokens(self) -> int:
        """Slots that share one scale: the token group's size (a layout with token groups has one
        quantized segment, so one group), 1 where each token has its own scales."""
        return self.scales[0].size if self.scale_kind == "tokens" else 1

    def placement(self, holds: str) -> Placement:
        """Where records ("records") or a scale group's entries (its name) live."""
        for index, b in enumerate(self.buffers):
            for r in b.regions:
                if r.holds == holds:
                    return Placement(holds=holds, buffer=b, region=r, index=index)
        raise KeyError(holds)

    @property
    def given_scales(self) -> tuple:
        """(argument name, plane, group) of each call-time scale (given scales, and two-level groups'
        global scales), plane-major: the ops' extra tensors."""
        return tuple((f"{p}_{g.argument}", p, g) for p in self.planes for g in self.scales if g.argument)

    @property
    def given_names(self) -> tuple:
        """The call-time scales' argument names, in the ops' order (k_scale, v_scale, ...)."""
        return tuple(name for name, _, _ in self.given_scales)

    @staticmethod
    def given_step(plane: str, group: ScaleGroup) -> str:
        """The constexpr name of one call-time scale's head step (1: one scale per head, 0: one)."""
        return f"{plane}_{group.argument}".upper() + "_STEP"

    @property
    def given_steps(self) -> tuple:
        return tuple(self.given_step(p, g) for _, p, g in self.given_scales)

    def given_index(self, group: ScaleGroup) -> int:
        """A given group's place among the layout's given groups (its scale within a plane's)."""
        return [g.name for g in self.scales if g.argument].index(group.name)

    @property
    def stored_scales(self) -> tuple:
        """The scale groups whose entries the cache holds (all but the given ones)."""
        return tuple(g for g in self.scales if not g.given)

    @property
    def records(self) -> Placement:
        return self.placement("records")

    def scales_of(self, group: str) -> Placement:
        return self.placement(group)

    @property
    def word_scales(self) -> tuple | None:
        """The token-group scales a reader may load as words, as the generated module's _WORD_SCALES:
        (slots per block, block and dim stride names (1 and the page's block count for adjacent
        words), Cache field indices of each plane's scales, geometry names that must be multiples of
        the word: those fields' page strides, the region offset, other strides); None without such a group."""
        group = next((g for g in self.scales if g.word_reads), None)
        if group is None:
            return None
        where = self.scales_of(group.name)
        others = [t.const_name for t in where.terms if t.coord not in ("block", "dim")]
        fields = tuple(dict.fromkeys(self.field_index(p, where.buffer) for p in self.planes))
        strides = tuple(dict.fromkeys(self.page_stride_name(p, where.buffer) for p in self.planes))
        return (group.size, where.stride_name("block"), where.stride_name("dim"), fields,
                (*strides, where.region.offset_name, *others))

    @property
    def record_overhead(self) -> int:
        """Bytes of a record besides its values' codes, where the values are known only at call time
        (one one-byte code per value: a record of a call's `values` is values + this, e.g. an inline
        fp32 scale's 4): what a reader subtracts from the records tensor's last dim (uint8 bytes)."""
        return (self.record_bytes.evaluate({VALUES: 0}) if not self.values.is_const and not self.record_bytes.is_const
                else 0)

    @property
    def values_per_byte(self) -> int:
        """Codes per byte of the record's segment of call-time width (2: fp4, whose records tensor's
        last dim counts bytes, half the values); 1 otherwise."""
        return next((s.element.packing for s in self.segments if s.quantized and not s.values.is_const), 1)

    @property
    def record_fields(self) -> tuple:
        """The index in the Cache tuple of each plane's records tensor."""
        return tuple(dict.fromkeys(self.field_index(p, self.records.buffer) for p in self.planes))

    @property
    def record_word_aligned(self) -> list:
        """Geometry names that must be multiples of 4 for 32-bit word access to records: each records
        field's page stride, the region's offset and its strides."""
        where = self.records
        strides = list(dict.fromkeys(self.page_stride_name(p, where.buffer) for p in self.planes))
        return strides + [where.region.offset_name] + [t.const_name for t in where.terms]

    @property
    def record_parts(self) -> tuple:
        """The record in byte order: (first byte, end byte, segment or None, inline scale group or None)."""
        parts = [(s.byte_offset, s.byte_end, s, None) for s in self.segments]
        for g in self.stored_scales:
            r = self.scales_of(g.name).region
            if r.inline:
                parts.append((r.record_offset, r.record_offset + r.nbytes, None, g))
        return tuple(sorted(parts, key=lambda p: p[0].const_value() if p[0].is_const else 0))

    @property
    def regions(self) -> tuple:
        return tuple(r for b in self.buffers for r in b.regions)

    @property
    def segment_symbols(self) -> tuple:
        """Call-time symbols the segments' extents and offsets depend on, in a fixed order."""
        used = set()
        for s in self.segments:
            used |= s.values.symbols() | s.value_offset.symbols() | s.byte_offset.symbols() | s.nbytes.symbols()
        return tuple(n for n in (PAGE_SIZE, HEADS, VALUES) if n in used)

    @property
    def symbols(self) -> tuple:
        """Call-time symbols this layout's geometry depends on, in a fixed order."""
        used = set()
        for b in self.buffers:
            used |= b.page_bytes.symbols()
            for r in b.regions:
                used |= r.offset.symbols() | r.nbytes.symbols() | r.element_bytes.symbols()
                for t in r.terms:
                    used |= t.stride.symbols() | t.extent.symbols()
        used |= self.heads.symbols() | self.values.symbols() | self.record_bytes.symbols()
        used.add(PAGE_SIZE)
        return tuple(s for s in (PAGE_SIZE, HEADS, VALUES) if s in used)

    @staticmethod
    def field(plane: str, buffer: Buffer) -> str:
        """The Cache field of a plane's buffer: <plane>_<buffer>, or <buffer> for one that holds every plane."""
        return buffer.name if buffer.shared else f"{plane}_{buffer.name}"

    @property
    def cache_fields(self) -> tuple:
        """(field name, plane, buffer) for every tensor of the Cache tuple, plane-major; a buffer that
        holds every plane is one field, at its first plane's place (plane: None)."""
        out = {}
        for p in self.planes:
            for b in self.buffers:
                out.setdefault(self.field(p, b), (None if b.shared else p, b))
        return tuple((f, p, b) for f, (p, b) in out.items())

    def field_index(self, plane: str, buffer: Buffer) -> int:
        """The index in the Cache tuple of a plane's buffer."""
        return [f for f, _, _ in self.cache_fields].index(self.field(plane, buffer))

    @property
    def plane_fields(self) -> tuple:
        """Per plane, the Cache index of each of its buffers (in buffer order): the references' _REF_PLANE_FIELDS."""
        return tuple(tuple(self.field_index(p, b) for b in self.buffers) for p in self.planes)

    @property
    def row_planes(self) -> int:
        """Planes whose records share one row of the records tensor's last dim (a trailing `plane`
        coordinate: vLLM's K|V rows), else 1: what a reader divides that dim by."""
        last = self.records.terms[-1]
        return len(self.planes) if last.coord == "plane" else 1

    @property
    def page_bytes_names(self) -> tuple:
        """The geometry name of each Cache field's bytes per page, in field order."""
        return tuple(b.page_bytes_name for _, _, b in self.cache_fields)

    def page_stride_name(self, plane: str, buffer: Buffer) -> str:
        """The geometry name of the bytes from one page of a plane's buffer to the next, as its Cache
        field's tensor lays them out: the page bytes for alloc_cache's tensors, more for a view of
        every other page (vLLM's kv_cache[:, 0])."""
        return f"{self.field(plane, buffer).upper()}_PAGE_STRIDE"

    @property
    def page_stride_names(self) -> tuple:
        """Each Cache field's page stride geometry name, in field order."""
        return tuple(self.page_stride_name(p, b) for _, p, b in self.cache_fields)

    @property
    def field_alignments(self) -> tuple:
        """Per Cache field, the byte alignment its tensor's start needs: the widest value the kernels
        load or store there through a typed pointer (an fp32 scale: 4; a raw bf16 value: 2; codes
        and one-byte scales: 1). Page and region offsets are multiples of it (the build checks)."""
        groups = {g.name: g for g in self.scales}
        raw = max((s.raw.nbytes for s in self.segments if s.raw is not None), default=1)

        def widest(region: Region) -> int:
            return raw if region.holds == "records" else groups[region.holds].format.nbytes

        return tuple(max(widest(r) for r in b.regions) for _, _, b in self.cache_fields)

    @property
    def needs(self) -> frozenset:
        """The helper families this layout's ops call, so a module carries the helpers it uses (and
        those they name: render._carried):
        write_values / read_values (per segment and scale group: quantize_store and quantize /
        gather_dequant and dequantize), encode (fp8 encoders), decode, amax (amax, scale rules and
        power-of-two scaling, for stored scales), scale_writes / scale_reads / cache_scales (stored
        scales written, read, addressed in the cache), given_checks / given_writes (call-time scales), store_checks,
        out_checks (gather's outputs the caller passes), launch_shape, lane_group, head_rows / lane_rows
        (quantize_store's rows: (token, head) pairs, or one lane's tokens), store_rows / store_parts (its
        sources: whole rows, or the spec's inputs), slot_blocks (a gather's
        block of slots), round_up (a page padded
        to `align`), the segment walks (runtime/segments.py names, store_raw, load_raw), the element
        and scale formats' functions (runtime/codes.py names) and each op's name (its reference)."""
        ops = set(self.ops)
        writes_values = bool(ops & {"quantize_store", "quantize"})
        reads = bool(ops & {"gather_dequant", "dequantize"})
        writes = writes_values or "append" in ops
        quantized = bool(self.quantized_segments)
        need = set()
        if writes_values:
            need.add("write_values")
            need |= {s.quantize_walk for s in self.quantized_segments}
            if any(s.raw is not None for s in self.segments):
                need.add("store_raw")
        if reads:
            need |= {s.dequantize_walk for s in self.quantized_segments}
            if any(s.raw is not None for s in self.segments):
                need.add("load_raw")
        if reads:
            need.add("read_values")
        if "quantize_store" in ops:
            need.add("head_rows" if self.head_rows else "lane_rows")   # how its programs take rows
            need.add("store_parts" if self.inputs else "store_rows")   # its sources: the spec's inputs, or whole rows
        if "gather_dequant" in ops:
            need |= {"out_checks", "lane_group"}
            if self.scale_kind == "tokens":
                need.add("slot_blocks")
        for g in self.stored_scales:
            if writes_values:
                need.add(g.store_function)
                if g.rounding == "products":
                    need.add("_encode_e2m1_products")
            if quantized and writes:
                need.add(g.rule_function)      # its _<group>_exponent or _<group>_exact_scale (the encode family)
            if reads:
                need.add(g.format.load)
            if g.word_reads and (reads or "append" in ops):
                need.add("_ue8m0_word_bytes")
            if g.word_reads and reads:
                need.add(g.format.load_words)
        need |= {f.encoder for f in self.encoder_formats} | {f.decoder for f in self.decoder_formats}
        if quantized and writes:
            need.add("encode")
        if quantized and (reads or "append" in ops):
            need.add("decode")
        if ops & {"quantize_store", "append"}:
            need.add("store_checks")
        if self.given_scales:
            need.add("given_checks")
            if writes_values and any(g.given for g in self.scales):
                need.add("given_writes")
        if self.stored_scales:
            if writes_values:
                need.add("scale_writes")
            if reads:
                need.add("scale_reads")
            if writes_values or "append" in ops:
                need.add("amax")              # amax, its scale rule and power-of-two scaling
            if ops & {"quantize_store", "gather_dequant"}:
                need.add("cache_scales")
        if self.word_scales is not None:
            need.add("word_scales")
        if ops - {"append"}:
            need.add("launch_shape")
        if any(contains(e, RoundUp) for _, e in self.geometry) or any(contains(e, RoundUp) for b in self.buffers for e in b.shape):
            need.add("round_up")
        need |= ops                       # each op's reference (runtime/ref_ops.py)
        return frozenset(need)

    @property
    def element_formats(self) -> tuple:
        """The distinct element formats of the quantized segments, in order."""
        return tuple({s.element.name: s.element for s in self.segments if s.quantized}.values())

    @property
    def encoded_formats(self) -> tuple:
        """The element formats whose encoder the writers call: all but those of segments whose codes
        come from comparisons (rounding: products)."""
        return tuple({s.element.name: s.element for s in self.segments
                      if s.quantized and s.scale.rounding != "products"}.values())

    @property
    def encoder_formats(self) -> tuple:
        """The formats whose `_encode_<format>` wrapper the module defines: the values' (see
        encoded_formats) where a writer encodes, and fp8 scales' codes where scales are written."""
        writes = bool(set(self.ops) & {"quantize_store", "quantize", "append"})
        scale_codes = bool(set(self.ops) & {"quantize_store", "quantize"})
        return tuple(f for f in self.code_formats
                     if (writes and f in self.encoded_formats) or (scale_codes and f in self.scale_code_formats))

    @property
    def decoder_formats(self) -> tuple:
        """The formats whose `_decode_<format>` wrapper the module defines: the values' where a reader
        (or append) decodes, and fp8 scales' codes wherever scales are written or read."""
        reads = bool(set(self.ops) & {"gather_dequant", "dequantize", "append"})
        scales = bool(set(self.ops) & {"quantize_store", "quantize", "gather_dequant", "dequantize"})
        return tuple(f for f in self.code_formats
                     if (reads and f in self.element_formats) or (scales and f in self.scale_code_formats))

    @property
    def scale_code_formats(self) -> tuple:
        """The element formats of the layout's fp8 scales' codes (e4m3: fp8_e4m3fn)."""
        return tuple({g.code_format.name: g.code_format for g in self.stored_scales if g.code_format is not None}.values())

    @property
    def code_formats(self) -> tuple:
        """The element formats whose codes the layout stores: its segments', then its fp8 scales'."""
        out = {f.name: f for f in self.element_formats}
        out.update((g.code_format.name, g.code_format) for g in self.stored_scales
                   if g.code_format is not None and g.code_format.name not in out)
        return tuple(out.values())

    @property
    def quantized_segments(self) -> tuple:
        return tuple(s for s in self.segments if s.quantized)

    @property
    def dense_scale_columns(self) -> tuple:
        """(segment, first byte) of each quantized segment's scales in a row of the dense scale tensor."""
        out, column = [], const(0)
        for s in self.quantized_segments:
            out.append((s, column))
            column = column + s.scale.count * s.scale.format.nbytes
        return tuple(out)

    @property
    def dense_scale_count(self) -> Expr:
        total = const(0)
        for s in self.quantized_segments:
            total = total + s.scale.count
        return total

    @property
    def dense_scale_bytes(self) -> Expr:
        total = const(0)
        for s in self.quantized_segments:
            total = total + s.scale.count * s.scale.format.nbytes
        return total

    @property
    def dense_scale_dtype(self) -> str:
        """uint8 for ue8m0 scales, float32 for fp32 ones (build checks a dense layout uses one format)."""
        formats = {g.format.name for g in self.scales}
        return "float32" if formats == {"fp32"} else "uint8"

    @property
    def dense_data_views(self) -> tuple:
        """The dtypes dequantize takes the records as: quantize's own and uint8/int8 views of them
        (another 1-byte float format would name other values)."""
        return tuple(dict.fromkeys((self.dense_data[0], "uint8", "int8")))

    @property
    def dense_scale_views(self) -> tuple:
        """The dtypes dequantize takes the dense scales as: float32 alone, or for a 1-byte format
        uint8, an int8 view and the torch dtype that names the format (float8_e8m0fnu for ue8m0)."""
        if self.dense_scale_dtype == "float32":
            return ("float32",)
        return ("uint8", "int8", *sorted({g.format.torch_view for g in self.scales}))

    @property
    def dense_scale_caveat(self) -> str:
        """Where a ue8m0 group reads byte 0x00 or 0xFF otherwise than torch's float8_e8m0fnu (2^-127,
        NaN), what this layout reads them as; "" where they agree or no group is ue8m0."""
        reads = sorted({f"{byte} as {value}" for g in self.scales if g.format.name == "ue8m0"
                        for byte, value, torch_reads in (("0x00", "0" if g.zero_byte == "zero" else "2^-127", "2^-127"),
                                                         ("0xFF", "inf" if g.ff_byte == "inf" else "NaN", "NaN"))
                        if value != torch_reads})
        return "; a float8_e8m0fnu view's bytes are read as this layout's (%s)" % ", ".join(reads) if reads else ""

    @property
    def dense_data(self) -> tuple:
        """(torch dtype, trailing width) of the dense ``quantize`` output: the record itself."""
        if len(self.segments) == 1 and self.segments[0].quantized and self.segments[0].element.packing == 1:
            return self.segments[0].element.torch_dtype, self.values
        return "uint8", self.record_bytes

    @property
    def geometry(self) -> tuple:
        """(constexpr name, Expr) for every number a kernel needs, in emission order."""
        out = [("RECORD_BYTES", self.record_bytes)]
        out.extend((s.tiles_name, s.scale.count) for s in self.quantized_segments)
        for s in self.quantized_segments:
            if s.group_constexprs:
                out.append((f"{s.name.upper()}_GROUP", s.values))
                out.append((f"{s.name.upper()}_LANES", next_pow2(s.values)))
        if self.scale_kind == "values":  # the dense quantize/dequantize scale tensor
            out.append(("DENSE_SCALES", self.dense_scale_count))
            out.append(("DENSE_SCALE_BYTES", self.dense_scale_bytes))
            out.extend((s.dense_column_name, column) for s, column in self.dense_scale_columns)
        for b in self.buffers:
            out.append((b.page_bytes_name, b.page_bytes))
            for r in b.regions:
                out.append((r.offset_name, r.offset))
                out.extend((t.const_name, t.stride) for t in r.terms)
        # Each field's pages lie its page bytes apart, unless a call passes a page-strided view (the
        # ops then set its stride).
        out.extend((name, b.page_bytes) for name, (_, _, b) in zip(self.page_stride_names, self.cache_fields))
        return tuple(out)


@dataclass(frozen=True)
class CompatFunction:
    name: str
    doc: str
    params: tuple                 # (name, default source or None)
    layout: str
    op: str                       # e.g. gather_dequant or gather_dequant_ref
    args: tuple                   # (op parameter, python source)
    returns: str | None
    require: tuple = ()           # (parameter, allowed values): anything else raises ValueError
    trim: tuple = ()              # (tensor parameter, the parameter counting the tokens): rows past it dropped
    # (local name, python source, the parameter it reads) of each argument computed from a
    # parameter (x.data, v_cache.shape[1]): evaluated before the call, a failure names the parameter
    derived: tuple = ()
    # (the op's argument name, the caller's parameter or expression): its ValueErrors say the latter
    renames: tuple = ()
    raw_cache: bool = False       # the cache is passed as the layout's RawCache (seed-shaped buffers)
    # (tensor parameter, expression) where page_size is read off a tensor's shape (v_cache.shape[1])
    page_size_from: tuple | None = None
    # (parameter, values, CompatFunction calling another layout's op): where the parameter has one of
    # the values (one parameter, each value once), that function's call instead of this one's
    cases: tuple = ()

    @property
    def call_args(self) -> tuple:
        """(op parameter, python source) as the call passes them: args, with the cache a RawCache
        where asked."""
        cache = f"{self.layout}.Cache("
        return tuple((k, f"{self.layout}.RawCache({src[len(cache):]}" if self.raw_cache and k == "cache" else src)
                     for k, src in self.args)

    @property
    def error_source(self) -> str | None:
        """The expression the function raises for the op's ValueError `error`, in the caller's terms:
        renamed, the page size named as read off a tensor, trimmed tensors noted; None where the
        op's error is already in those terms."""
        if not (self.renames or self.trim):
            return None
        source = f"_renamed(error, {dict(self.renames)!r})" if self.renames else "error"
        if self.page_size_from:
            source = f"_read_page_size({source}, {', '.join(map(repr, self.page_size_from))})"
        if self.trim:
            counters = ", ".join(counter for _, counter in self.trim) + ("," if len(self.trim) == 1 else "")
            source = f"_as_read({source}, _passed, {self.trim!r}, ({counters}))"
        return source


@dataclass(frozen=True)
class Compat:
    name: str
    summary: str
    seed: str
    spec_path: str
    spec_sha256: str
    layouts: tuple                # layout names imported
    types: tuple                  # (type name, fields)
    functions: tuple
    constants: tuple = ()         # (name, an int or a "torch.<dtype>" source): the seed module's constants

    @property
    def needs(self) -> frozenset:
        """The optional compat_host helpers the functions call (render.RUNTIME_OPTIONAL)."""
        return frozenset(({"read_page_size"} if any(f.page_size_from for f in self.functions) else set())
                         | ({"trim"} if any(f.trim for f in self.functions) else set())
                         | ({"require"} if any(f.require or f.cases for f in self.functions) else set()))


# Annotations and defaults of the ops' parameters (a call-time tensor otherwise), and their results.
_PARAM_TEXT = {"cache": "cache: Cache", "page_size": "page_size: int", "out": "out=None",
               "out_dtype": "out_dtype: torch.dtype | None = torch.bfloat16"}


def op_signature(layout: Layout, op: str) -> tuple:
    """The parameters of a generated operation's def, annotated, and of its ``_ref``'s (the same):
    op_params, then the keyword-only launch option pdl."""
    return (*(_PARAM_TEXT.get(name, f"{name}: torch.Tensor") for name in op_params(layout, op)),
            "*", "pdl: bool | None = None")


def op_returns(layout: Layout, op: str) -> str:
    """The result annotation of a generated operation (and of its ``_ref``)."""
    if op == "gather_dequant":
        return "torch.Tensor" if len(layout.planes) == 1 else "tuple"
    return {"quantize_store": "None", "append": "None", "quantize": "tuple", "dequantize": "torch.Tensor"}[op]


def op_params(layout: Layout, op: str) -> tuple:
    """The parameters of a generated operation (and of its ``_ref``), in order."""
    base = op[:-4] if op.endswith("_ref") else op
    planes = tuple(layout.planes)
    given = tuple(name for name, _, _ in layout.given_scales)
    return {
        "gather_dequant": ("cache", "token_ids", "page_size") + given + ("out",),
        "quantize_store": tuple(src.name for src in layout.sources) + ("loc", "cache", "page_size") + given,
        "append": planes + ("loc", "cache", "page_size"),
        "quantize": ("x",),
        "dequantize": ("data", "scale", "out_dtype"),
    }[base]
