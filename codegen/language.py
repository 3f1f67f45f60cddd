"""The spec language, v1: every field a spec may hold, its type, default and meaning.

This table is the single source of truth: ``build`` validates specs against it, and
``generate`` derives ``generated/spec.schema.json`` and ``generated/SPEC_REFERENCE.md`` from it.
"""
from __future__ import annotations

from . import formats
from .schema import IDENT, Bool, Field, Float, Int, ListOf, MapOf, Null, Obj, OneOf, Str
ANY = Str(enum=("any",))
# Bounds on every size a spec states: far above any real layout, low enough that what the validator
# accepts also compiles (Triton's tensors hold at most 2^20 elements) and fits an int32 offset.
MAX_HEADS = 4096
MAX_SEGMENTS = 64             # runs of a record (a real one has 1-4; each adds code to every kernel)
MAX_VALUES = 1 << 16          # values of one segment or scale group, and scale entries per token
MAX_GROUP_TOKENS = 1024       # slots that share one scale
MAX_PAGE_SIZE = 1 << 16
MAX_ALIGN = 1 << 20
MAX_TILE = 1 << 16            # values one program handles per step
MAX_BLOCK = 1024              # tokens, entries, columns or heads per program
MAX_PROGRAMS = 1 << 20

# The names a spec may use come from the format tables (codegen/formats.py): a new format is an entry there.
ELEMENT_DTYPES = tuple(formats.ELEMENT_FORMATS)
RAW_DTYPES = tuple(formats.RAW_DTYPES)
SCALE_FORMATS = tuple(formats.SCALE_FORMATS)
SCALE_RULES = formats.RULES
OPS = ("gather_dequant", "quantize_store", "quantize", "dequantize", "append")
COORDINATE = r"(slot|head|scale|dim|block|plane)( (%|//) [1-9][0-9]{0,5})?"       # splits by at most 999999

SEGMENT = Obj(title="a record segment", fields={
    "name": Field(Str(pattern=IDENT, what="an identifier (a-z, 0-9, _; at most 64 characters)"), "name of this run of values (e.g. nope, rope)"),
    "values": Field(OneOf((Int(minimum=1, maximum=MAX_VALUES), ANY)),
                    "how many logical values the segment holds; 'any' (only for a one-segment record) "
                    "takes the width from the tensors at call time"),
    "dtype": Field(Str(enum=ELEMENT_DTYPES + RAW_DTYPES),
                   "how each value is stored: an element format, fp8 or fp4 (needs 'scale'), or a raw dtype copied as is"),
    "scale": Field(OneOf((Str(pattern=IDENT, what="a scale group name"), Null())),
                   "the scale group (key of 'scales') that quantizes this segment", None),
})

INLINE_SCALES = Obj(title="a group's scales inside the record", fields={
    "scales": Field(Str(pattern=IDENT, what="a scale group name"),
                    "a {values: N} scale group (key of 'scales') whose entries for the token and head sit here, in the "
                    "record, in scale order (pad_to entries, padding included); such a group has no buffer region"),
})

SCALE_GROUP = Obj(title="a scale group", fields={
    "format": Field(Str(enum=SCALE_FORMATS),
                    "how one scale is stored: ue8m0 = one byte, the power-of-two exponent + 127; fp32 = the scale "
                    "as a float (4 bytes); e4m3 = one fp8 e4m3fn code (NVFP4's block scales; rule exact: amax / fmax "
                    "rounded to the nearest code, ties to even, saturated at 448)"),
    "rule": Field(Str(enum=SCALE_RULES),
                  "how the scale follows from the group's amax (fmax = the element format's largest finite value, "
                  "emax = floor(log2 fmax)): rceil = smallest power of two s with amax/s <= fmax (the seeds); "
                  "floor = 2^(floor(log2 amax) - emax) (OCP MX); ceil = 2^(ceil(log2 amax) - emax); even = floor "
                  "after rounding amax to the element's mantissa width (torchao EVEN); nearest = 2^round(log2(amax/"
                  "fmax)); exact = amax / fmax itself (fp32, or rounded to e4m3); given = no rule: the scale is a call-time "
                  "argument (with group: tensor). See docs/numerics.md"),
    "amax_floor": Field(OneOf((Float(exclusive_minimum=0.0), Null())),
                        "amax is raised to at least this before the rule (1.0e-8 DSv4, 1.0e-30 MXFP8), a normal fp32 number "
                        "up to 3.0e+38; null: no floor",
                        None),
    "scale_floor": Field(OneOf((Float(exclusive_minimum=0.0), Null())),
                         "rule exact: the scale is raised to at least this after the division, max(amax / fmax, floor) "
                         "(vLLM per-token-head: 1.0e-6), a normal fp32 number up to 3.0e+38; pow2 rules say the same with "
                         "exponent_range; null: no floor",
                         None),
    "exponent_range": Field(OneOf((ListOf(Int(minimum=-127, maximum=127), min_items=2, max_items=2), Null())),
                            "[lo, hi]: clamp the unbiased scale exponent (MXFP8 seeds: [-127, 127]); null: only the "
                            "storage range", None),
    "group": Field(OneOf((
        Obj(title="{values: N}", fields={"values": Field(OneOf((Int(minimum=1, maximum=MAX_VALUES), ANY)),
                                                         "N consecutive values of one token and head share a scale; 'any': "
                                                         "all of the segment's values (one scale per token and head, "
                                                         "whatever its width, e.g. vLLM's per-token-head scales)")}),
        Obj(title="{tokens: N}", fields={"tokens": Field(Int(minimum=1, maximum=MAX_GROUP_TOKENS), "N consecutive slots share a scale per head and value index "
                                                                          "(seq-blocked V)")}),
        Str(enum=("tensor",)),
    )), "what one scale covers; 'tensor': the whole plane, one fp32 scale given at call time (rule: given) as a "
        "float32 tensor <plane>_<group> of one element, or one per head (vLLM's k_scale, v_scale), so calls stay "
        "CUDA-graph capturable; codes are value / scale, values code * scale; no cache bytes"),
    "global": Field(OneOf((Str(pattern=IDENT, what="an identifier"), Null())),
                    "two-level scales (NVFP4; e4m3 format): each plane's call-time global scale, a float32 tensor "
                    "<plane>_<global> of one element or one per head (FlashInfer's k_scale, sglang's global_scale): "
                    "block scales are s = e4m3(amax / (fmax * g)), codes x / (s * g), values code * s * g; null: none",
                    None),
    "rounding": Field(Str(enum=("quotient", "products")),
                      "rule exact: how values become codes: 'quotient' = the code nearest the correctly rounded "
                      "x / scale (ties to even); 'products' (fp4 e2m1) = |x| compared with scale times each midpoint "
                      "between codes, each product rounded to fp32 (sglang's NVFP4 encoder, no division)",
                      "quotient"),
    "nan": Field(Str(enum=("ignore", "poison")),
                 "what a NaN among a group's values does: 'ignore' = amax skips it and it alone becomes the NaN "
                 "code (the GPU's max.f32: the seeds, vLLM's fmaxf, sglang's Triton writers); 'poison' = the whole "
                 "group is NaN, its scale stored as NaN (ue8m0 0xFF, fp32 the canonical NaN, e4m3 0x7F) and every "
                 "code the NaN code (torch-amax references: FlashMLA's tests/quant.py, torchao's to_mx); fp8 "
                 "elements and {values: N} groups only",
                 "ignore"),
    "ue8m0_zero": Field(Str(enum=("zero", "pow2")),
                        "what scale byte 0x00 decodes to: 'pow2' = 2^-127 exactly (OCP MX); 'zero' = 0.0, what a GPU "
                        "exp2 of -127 gives (DSv4 seed)",
                        "pow2"),
    "ue8m0_ff": Field(Str(enum=("inf", "nan")),
                      "what scale byte 0xFF decodes to: 'inf' = +inf, as both seeds do (2^(255 - 127) overflows); "
                      "'nan' = NaN, as OCP MX v1.0 and torch's float8_e8m0fnu define it. Writers store 0xFF only "
                      "for a group that nan: poison makes NaN",
                      "inf"),
    "pad_to": Field(OneOf((Int(minimum=1, maximum=MAX_VALUES), Null())),
                    "for {values: N} groups: scale entries stored per token and head, padding included (DSv4: 7 -> 8); "
                    "pad entries are never written", None),
})

REGION = Obj(title="a page region", fields={
    "holds": Field(Str(pattern=IDENT, what="'records' or a scale group name"),
                   "what this region stores: 'records' (the byte records) or the name of a scale group"),
    "order": Field(ListOf(Str(pattern=COORDINATE, what="a coordinate such as slot, head, scale, 'slot % 32', 'slot // 32'"),
                          min_items=1, unique=True),
                   "the region's byte order inside one page, outermost first: records use slot and head; {values} scales "
                   "use slot, head, scale; {tokens} scales use block, head, dim. 'slot % N' and 'slot // N' split a "
                   "coordinate (both must appear); slot, head and scale split, block, dim and plane do not "
                   "(e.g. FlashInfer's 128x4 tiles: [head, scale // 4, slot % 32, slot // 32, scale % 4]). 'plane' "
                   "(every region of the buffer, or none) makes the buffer one tensor that holds every plane, e.g. "
                   "[slot, head, plane]: a (slot, head)'s K record, then its V record"),
})

SLOTS = Obj(title="slot rules", fields={
    "sink": Field(OneOf((Int(minimum=0, maximum=MAX_PAGE_SIZE - 1), Null())),
                  "a padding slot that writers never touch (CUDA-graph padding); null: none", None),
})

PAGE = Obj(title="page rules", fields={
    "size_multiple_of": Field(Int(minimum=1, maximum=MAX_PAGE_SIZE), "the runtime page_size must be a multiple of this", 1),
    "align": Field(Int(minimum=1, maximum=MAX_ALIGN), "each page's bytes are rounded up to a multiple of this (DSv4: 576)", 1),
})

LAUNCH = Obj(title="launch knobs of one op", fields={
    "elements": Field(Int(minimum=32, maximum=MAX_TILE), "values one program handles per step (a power of two); sets tokens per program", None),
    "block_tokens": Field(OneOf((Int(minimum=1, maximum=MAX_BLOCK), Null())), "tokens per program (a power of two; with head_rows, (token, head) rows); null: elements / values, fewer when a call is too small to give every SM a program", None),
    "num_warps": Field(Int(minimum=1, maximum=32), "warps per program (append: of blocks with several new rows)", None),
    "head_rows": Field(Bool(), "quantize_store: a program's rows are (token, head) pairs, every head of its tokens, and it "
                       "writes them for every plane, so that a token's adjacent records are written at once (small "
                       "records that do not fill whole 32-byte sectors); false: one (plane, head)'s tokens per program. "
                       "Fixed when the module is generated (it decides the kernel's code; not in LAUNCH). Not with "
                       "call-time scales", None),
    "lane_group": Field(Int(minimum=1, maximum=MAX_BLOCK), "gather_dequant: (plane, head) lanes whose programs run side by side, token block "
                        "by token block (at most this many: the largest divisor of the lanes)", None),
    "columns": Field(Int(minimum=1, maximum=MAX_BLOCK), "append: value indices per program of blocks with several new rows (a power of two)", None),
    "entries": Field(Int(minimum=1, maximum=MAX_BLOCK), "append: loc entries per program of blocks with several new rows (a power of two)", None),
    "lone_heads": Field(Int(minimum=1, maximum=MAX_BLOCK), "append: heads per tile of rows alone in their block (a power of two; the "
                        "lone check is made once for all of them)", None),
    "lone_columns": Field(Int(minimum=1, maximum=MAX_BLOCK), "append: value indices per program of rows alone in their block (a power of two)", None),
    "lone_warps": Field(Int(minimum=1, maximum=32), "append: warps per program of rows alone in their block", None),
    "lone_programs": Field(Int(minimum=1, maximum=MAX_PROGRAMS), "append: a call's entries are scanned for lone rows by at most this many "
                           "programs per head tile (more entries per program in big calls)", None),
    "lone_registers": Field(OneOf((Int(minimum=16, maximum=255), Null())),
                            "append: the most registers per thread of a program of rows alone in their block when it "
                            "takes one entry (calls of up to lone_programs entries, a decode step's), so that more of "
                            "them fit an SM at once; null: the compiler's choice. Programs scanning several entries "
                            "are never capped", None),
    "lone_fresh_runs": Field(Bool(), "append: in calls of up to lone_programs entries, the programs of rows alone in their "
                             "block also write the fresh runs (a block's entries consecutive and its slots in order "
                             "from the first, as in a prefill: whole blocks and each sequence's last), slices of the "
                             "block's value indices (of at least one value index per thread) dealt out to its entries; "
                             "false: the kernel of blocks with several new rows writes them", None),
    "dependent_launch": Field(Bool(), "on sm_90+: launch the op (append: its first kernel) as a programmatic dependent of "
                              "the stream's previous kernel, which waits for that kernel's end before touching memory; "
                              "a call's pdl= argument overrides it", None),
    "early_release": Field(Bool(), "with dependent_launch: let the stream's next kernel launch at the op's start (append: "
                           "its second kernel's) instead of its end; that kernel still waits for this one's end", None),
})
TUNING = MapOf(LAUNCH, key_pattern="|".join(OPS))

LAYOUT = Obj(title="a layout spec", fields={
    "kvlayout": Field(Int(minimum=1, maximum=1), "spec language version; always 1"),
    "name": Field(Str(pattern=IDENT, what="an identifier (a-z, 0-9, _; at most 64 characters)"), "layout name; must equal the file name, and names generated/<name>.py"),
    "summary": Field(Str(), "one line saying what the layout is and where it comes from"),
    "planes": Field(ListOf(Str(pattern=IDENT, what="an identifier (a-z, 0-9, _; at most 64 characters)"), min_items=1, unique=True),
                    "the tensors stored with this layout, written and read together in one launch (e.g. [k] or [k, v])"),
    "heads": Field(OneOf((Int(minimum=1, maximum=MAX_HEADS), ANY)), "heads per token; 'any' takes it from the tensors at call time"),
    "page": Field(PAGE, "page-size constraint and per-page byte padding", {"size_multiple_of": 1, "align": 1}),
    "slots": Field(SLOTS, "which slots are never written (negative slots and slots past the cache always are)",
                   {"sink": None}),
    "record": Field(ListOf(OneOf((SEGMENT, INLINE_SCALES)), min_items=1, max_items=MAX_SEGMENTS),
                    "the byte record of one token and head in byte order: segments of values, and the scales of groups "
                    "stored inline ({scales: <group>})"),
    "scales": Field(MapOf(SCALE_GROUP), "scale groups by name", {}),
    "buffers": Field(MapOf(ListOf(REGION, min_items=1), min_items=1),
                     "the cache tensors of one plane (or, with a 'plane' coordinate, of all planes), by name; each is a "
                     "run of pages and each page the listed regions in order"),
    "ops": Field(ListOf(Str(enum=OPS), min_items=1, unique=True), "the operations to generate"),
    "inputs": Field(MapOf(MapOf(ListOf(Str(pattern=IDENT, what="a segment name"), min_items=1, unique=True),
                                min_items=1)),
                    "quantize_store's sources, where a plane's values come in parts: per plane, parameter name -> "
                    "the record segments it holds, in record order (vLLM's kv_c [nope] and k_pe [rope]); each part "
                    "is a (T, heads, width) tensor of its own strides, read in the same launch; every plane and "
                    "segment named once; fixed-width segments only; not with quantize or append (they take whole "
                    "rows). {}: one tensor per plane, named after it", {}),
    "tuning": Field(TUNING, "launch shape per op, overriding kvlayout's defaults (see bench/RESULTS.md)", {}),
})

PARAM = r"[a-z_][a-z0-9_]*(=(None|-?[0-9]+|torch\.[a-z0-9_]+))?"
ARG = r"None|[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*|\.shape\[-?[0-9]+\])?"

# The values a compat parameter may be required to take, or be matched against.
REQUIRED_VALUES = ListOf(OneOf((Int(), Str(pattern=r"[A-Za-z0-9_.+-]*", what="a plain string (letters, digits, _ . + -)"),
                                Null())), min_items=1)

COMPAT_CASE = Obj(title="a compat case", fields={
    "when": Field(MapOf(REQUIRED_VALUES, key_pattern=r"[a-z_][a-z0-9_]*", min_items=1),
                  "{parameter: values}: the case is taken where the parameter has one of the values (as require: "
                  "compares them); one parameter, the same in every case of the function"),
    "layout": Field(Str(pattern=IDENT, what="a layout name"), "the layout whose op (call:'s op) is called in this case"),
})

COMPAT_FUNCTION = Obj(title="a compat function", fields={
    "name": Field(Str(pattern=r"[a-z_][a-z0-9_]*", what="a Python name"), "the seed's function name"),
    "doc": Field(Str(), "docstring of the generated function"),
    "params": Field(ListOf(Str(pattern=PARAM, what="a parameter such as 'x' or 'page_size=128'")),
                    "the seed's parameters, in order, with defaults"),
    "call": Field(Str(pattern=r"[a-z][a-z0-9_]*\.[a-z_]+", what="'<layout>.<op>' or '<layout>.<op>_ref'"),
                  "the generated operation this function calls"),
    "args": Field(MapOf(OneOf((Str(pattern=ARG, what="a parameter expression"),
                               MapOf(Str(pattern=ARG, what="a parameter expression")))), key_pattern=r"[a-z_][a-z0-9_]*"),
                  "the operation's arguments: a parameter name, 'p.attr', 'p.shape[i]', or for 'cache' a mapping of "
                  "buffer field to parameter"),
    "returns": Field(OneOf((Str(pattern=r"[A-Z][A-Za-z0-9]*", what="a type name"), Null())),
                     "wrap the result in this named tuple type (declared under 'types')", None),
    "require": Field(MapOf(REQUIRED_VALUES, key_pattern=r"[a-z_][a-z0-9_]*"),
                     "the values a parameter may take (e.g. the seed's format strings this layout implements): any "
                     "other raises ValueError naming the parameter before anything runs", {}),
    "cases": Field(ListOf(COMPAT_CASE),
                   "where a parameter takes one of some values, the same op of another layout is called instead, with "
                   "the same args (its op must take the same parameters, its Cache the same fields, and it must have "
                   "the same planes): e.g. a seed whose format string picks another scale rule. Every case matches "
                   "the same parameter, each value once; any other value takes call:", []),
    "trim": Field(MapOf(Str(pattern=r"[a-z_][a-z0-9_]*", what="a parameter name"), key_pattern=r"[a-z_][a-z0-9_]*"),
                  "{tensor parameter: the parameter whose length counts the seed's tokens}: rows of the first past the "
                  "second's length are dropped before the call, as the seed never reads them (vLLM takes num_tokens "
                  "from slot_mapping, and passes key rows padded for CUDA graphs); an error about a dropped-from tensor "
                  "notes that its shapes are of the rows read", {}),
    "unused": Field(ListOf(Str(pattern=r"[a-z_][a-z0-9_]*", what="a parameter name")),
                    "parameters the seed takes and ignores (vLLM's scale of fp8_ds_mla): accepted and never read; "
                    "every other parameter must be passed on (args), required, or count a trim, so that a caller's "
                    "value is never silently dropped", []),
    "raw_cache": Field(Bool(), "the seed takes its cache tensors as raw contiguous buffers of whole pages in any "
                       "shape (sglang's pool.view(-1, heads, values), a flat scale buffer): pass them as the layout's "
                       "RawCache, which also takes token-major and flat tensors (their page size is then checked only "
                       "as far as their bytes hold whole pages)", False),
})

COMPAT = Obj(title="a compat spec", fields={
    "kvlayout": Field(Int(minimum=1, maximum=1), "spec language version; always 1"),
    "compat": Field(Str(pattern=IDENT, what="an identifier (a-z, 0-9, _; at most 64 characters)"), "module name: generated/compat/<compat>.py; must equal the file name"),
    "summary": Field(Str(), "what the module replaces"),
    "seed": Field(Str(), "the file whose names and signatures this module reproduces"),
    "types": Field(MapOf(ListOf(Str(pattern=IDENT), min_items=1), key_pattern=r"[A-Z][A-Za-z0-9]{0,63}"),
                   "named tuple types, by name, with their fields", {}),
    "constants": Field(MapOf(OneOf((Int(), Str(pattern=r"torch\.[a-z0-9_]+", what="a torch dtype such as "
                                                                                   "torch.float8_e4m3fn"))),
                             key_pattern=r"[A-Za-z][A-Za-z0-9_]{0,63}"),
                       "the seed module's constants, {NAME: an int or a torch dtype}: defined at the module's top "
                       "for callers that import them (e.g. DIM_NOPE: 448)", {}),
    "functions": Field(ListOf(COMPAT_FUNCTION, min_items=1), "the functions to generate"),
})
