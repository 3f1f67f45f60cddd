"""Spec file -> validated model. All semantic checks live here; each names file:line:col."""
from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import hashlib
import keyword
import math
import re
from pathlib import Path

from . import language, marked_yaml
from .errors import Mark, SpecError
from .expr import Expr, FloorDiv, RoundUp, const, divisible, round_up, round_up_operand, sym
from .formats import ELEMENT_FORMATS, RAW_DTYPES, SCALE_FORMATS, fp32_bits, fp32_value, rule_terms
from .model import (HEADS, PAGE_SIZE, VALUES, Buffer, Compat, CompatFunction, Layout, Region,
                    ScaleGroup, Segment, Source, Term, op_params)

FP32_MIN_NORMAL = 2.0 ** -126
FLOOR_MAX = 3.0e38            # the largest amax_floor / scale_floor: a normal fp32 number with headroom below FLT_MAX
MIN_GROUP_TOKENS = 8        # slots of the smallest {tokens: N} group (runtime/append.py rescales 8 slots at a time)
OPS_BY_SCALE_KIND = {
    "values": ("gather_dequant", "quantize_store", "quantize", "dequantize"),
    "tokens": ("gather_dequant", "append"),
    "tensor": ("gather_dequant", "quantize_store"),
    None: ("gather_dequant", "quantize_store"),
}
# Parameters and local names of the cache ops' host functions, which a given scale's argument name
# (<plane>_<group>) must not take; its kernel parameter <name>_ptr must not take another's either.
OP_PARAMETERS = ("cache", "token_ids", "page_size", "out", "loc", "pdl")
OP_LOCALS = ("given", "tensors", "key", "pointers", "plan", "outs", "geo", "num_pages", "n_tokens", "num_slots",
             "lanes", "launch", "group", "grid", "args", "constexprs", "srcs", "heads", "values")
COORDS_BY_HOLDING = {"records": ("slot", "head"), "values": ("slot", "head", "scale"), "tokens": ("block", "head", "dim")}


def spec_digest(text: str) -> str:
    """The spec text's sha256, line breaks as \\n: a checkout with CRLF endings (git's autocrlf on
    Windows) generates the same files (a BOM is dropped when the file is read)."""
    return hashlib.sha256(text.replace("\r\n", "\n").replace("\r", "\n").encode()).hexdigest()


def display_path(path: Path, root: Path) -> str:
    """How messages name a spec file: relative to the project root where it lies inside it."""
    return path.relative_to(root).as_posix() if path.is_absolute() and path.is_relative_to(root) else path.as_posix()


def load_spec(path: Path, root: Path, *, earlier: bool = False):
    """Read and type-check one spec; returns ('layout' | 'compat', tree, display path, digest).
    earlier: a revision's spec, read by `diff` (see build_layout): invisible characters pass."""
    display = display_path(path, root)
    data = path.read_bytes()
    if len(data) > marked_yaml.MAX_BYTES:
        raise SpecError(Mark(display, 1, 1), f"the file has {len(data)} bytes; a spec is at most {marked_yaml.MAX_BYTES}",
                        "is this the right file?")
    text = marked_yaml.decode(data, display)
    tree = marked_yaml.load(text, display, invisible=earlier)
    if not isinstance(tree, marked_yaml.MarkedDict):
        raise SpecError(Mark(display, 1, 1), "a spec must be a YAML mapping", "start from one of the specs in specs/")
    if "compat" in tree and "name" in tree:
        in_compat = path.parent.name == "compat"
        raise SpecError(tree.key_mark("name" if in_compat else "compat"), "a spec is a layout (name:) or a compat module "
                        "(compat:), not both", "remove name: from this compat spec" if in_compat else
                        "remove compat: from this layout spec (compat modules are files of their own in specs/compat/)")
    kind = "compat" if "compat" in tree else "layout"
    tree = (language.COMPAT if kind == "compat" else language.LAYOUT).check(tree, tree.mark, "")
    return kind, tree, display, spec_digest(text)


# --- layouts -------------------------------------------------------------------------------------

# Python's builtins (the site module's too, so a check does not depend on how Python started): the
# generated host code calls len, isinstance, tuple, ..., which a parameter of that name would shadow.
BUILTIN_NAMES = frozenset(n for n in vars(builtins) if not n.startswith("_")) | {
    "copyright", "credits", "exit", "help", "license", "quit"}
# Names a plane may not take: the writers' other parameters and locals (planes are their parameters),
# the names whose parameters model.op_signature writes out (out=None, out_dtype's default), the
# modules' imports and the builtins.
RESERVED_PLANES = frozenset({"loc", "cache", "page_size", "pdl", "out", "out_dtype", "tensors", "key", "pointers",
                             "plan", "srcs", "geo", "num_pages", "n_tokens", "heads", "values", "launch", "grid", "args",
                             "torch", "triton", "tl", "functools", "inspect", "operator"}) | BUILTIN_NAMES


@functools.cache
def _template_text() -> str:
    """Every template's text, in file name order (what the generated modules' function names are read off)."""
    return "\n".join(t.read_text() for t in sorted((Path(__file__).parent / "templates").glob("*.j2")))


@functools.cache
def _module_names() -> frozenset:
    """The functions a generated module defines whatever its spec says: the runtime's (codegen/runtime)
    and the templates' own (a spec name that makes one of these again would redefine it)."""
    names = set(re.findall(r"^def (_\w+)\(", _template_text(), re.M))
    for path in (Path(__file__).parent / "runtime").glob("*.py"):
        names.update(n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    return frozenset(names)


def templated_functions(var: str) -> tuple:
    """The functions the templates define per segment (var 's', `def _quantize_{{ s.name }}(`) or
    per scale group ('g'), as format patterns ('_quantize_{}'), read off the templates themselves."""
    found = re.findall(r"^def (\w*)\{\{ %s\.name \}\}(\w*)\(" % re.escape(var), _template_text(), re.M)
    return tuple(dict.fromkeys(f"{head}{{}}{tail}" for head, tail in found))     # in the templates' order


# The functions a layout's module defines per segment and per scale group.
SEGMENT_FUNCTIONS = templated_functions("s")
GROUP_FUNCTIONS = templated_functions("g")


def _check_derived_names(tree) -> None:
    """Segment and scale group names may not make a function the module defines anyway (a segment
    'segment' would make a second _quantize_segment, a group 'ref' a second _ref_exact_scale)."""
    taken = dict.fromkeys(_module_names(), "the runtime")       # function -> what defines it
    record = tree["record"]
    named = [(seg["name"], seg.value_mark("name"), f"record[{i}].name", SEGMENT_FUNCTIONS, "segment")
             for i, seg in enumerate(record) if "name" in seg]
    named += [(name, tree["scales"].key_mark(name), f"scales.{name}", GROUP_FUNCTIONS, "scale group")
              for name in tree["scales"]]
    for name, mark, where, functions, kind in named:
        again = [f"{made} (after {taken[made]})" for made in (f.format(name) for f in functions) if made in taken]
        if again:
            raise SpecError(mark, f"{where}: {name!r} would make the generated module define a second time: "
                            f"{', '.join(again)}", f"rename the {kind}")
        taken.update((f.format(name), where) for f in functions)


def _check_names(tree) -> None:
    """Names that become Python identifiers in the generated module must be usable as such."""
    _check_derived_names(tree)
    if keyword.iskeyword(tree["name"]) or tree["name"] == "compat":
        raise SpecError(tree.value_mark("name"), f"name: {tree['name']!r} cannot name a Python module here",
                        "choose another layout name (and file name)")
    planes = tree["planes"]
    for i, plane in enumerate(planes):
        if keyword.iskeyword(plane) or plane in RESERVED_PLANES:
            raise SpecError(planes.item_mark(i), f"planes[{i}]: {plane!r} is a Python keyword or a name the "
                            "generated module uses itself", "name the plane k, v or another word")


def build_layout(tree, display: str, digest: str, *, earlier: bool = False) -> Layout:
    """The validated model of a layout spec. earlier: the spec is a revision's, read by `diff` to
    compare with: a page.size_multiple_of that allows misaligning page sizes (which this release
    refuses, and earlier ones checked per call) is taken, so the fix itself can be compared."""
    _check_names(tree)
    stem = Path(display).stem
    if tree["name"] != stem:
        raise SpecError(tree.value_mark("name"), f"name: {tree['name']!r} must equal the file name {stem!r}",
                        f"rename the file to {tree['name']}.yaml or set name: {stem}")
    heads = sym(HEADS) if tree["heads"] == "any" else const(tree["heads"])
    page = tree["page"]
    multiple, align = page["size_multiple_of"], page["align"]
    checks: list = []
    if multiple > 1:
        checks.append((sym(PAGE_SIZE), multiple, f"page_size must be a multiple of {multiple}"))

    groups = _scale_groups(tree)
    segments, record_bytes, values, inline = _segments(tree, groups, checks)
    groups = {name: _finish_group(g, segments, tree, multiple, checks) for name, g in groups.items()}
    segments = tuple(_attach_scale(s, groups) for s in segments)
    if len({g.kind for g in groups.values()}) > 1:
        raise SpecError(tree.value_mark("scales"), "scales: a layout cannot mix {values: N}, {tokens: N} and tensor "
                        "groups", "split it into two layouts")
    planes = tuple(tree["planes"])
    if any(g.kind == "tokens" for g in groups.values()) and len(segments) != 1:
        raise SpecError(tree.value_mark("record"), "record: a {tokens: N} scale group needs a one-segment record",
                        "drop the other segments")

    ctx = dict(heads=heads, multiple=multiple, record_bytes=record_bytes, values=values, groups=groups,
               checks=checks, inline=inline, planes=len(tree["planes"]))
    buffers = tuple(_buffer(name, tree["buffers"], ctx, align, segments) for name in tree["buffers"])
    _check_placement(tree, buffers, groups)
    records = next(r for b in buffers for r in b.regions if r.holds == "records")
    if "append" in tree["ops"]:
        for b in buffers:
            for i, r in enumerate(b.regions):
                split = next((t for t in r.terms if t.op is not None), None)
                if split is not None:
                    raise SpecError(tree["buffers"][b.name].item_mark(i), f"buffers.{b.name}[{i}].order: an append "
                                    f"layout cannot split a coordinate ({split.text!r})",
                                    f"order the {r.holds} by whole coordinates")
    if (heads.symbols() or values.symbols()) and [t.text for t in records.terms if t.coord != "plane"][-1] != "head":
        raise SpecError(tree.value_mark("buffers"), "buffers: with heads or values 'any', the records order must end "
                        "with 'head' (or 'head', 'plane')", "readers take (heads, values) from the records buffer's last two dims")
    records_buffer = next(b for b in buffers if b.name == records.buffer)
    if (heads.symbols() or values.symbols()) and len(records_buffer.shape) < 2:
        # A buffer of records and scale regions, or padded pages, is allocated as a page of bytes: a
        # reader could not take (heads, values) from its shape.
        other = next((r.holds for r in records_buffer.regions if r.holds != "records" and not r.inline), None)
        why = f"also holds {other!r}" if other else f"pads its pages (page.align: {align})"
        if heads.symbols():
            mark, field = tree.value_mark("heads"), "heads"
        else:             # the one segment of values: any
            i = next(i for i, seg in enumerate(tree["record"]) if "scales" not in seg and seg["values"] == "any")
            mark, field = tree["record"][i].value_mark("values"), f"record[{i}].values"
        raise SpecError(mark, f"{field}: 'any' is taken from the records buffer's last two "
                        f"dims, but buffer {records.buffer!r} {why}, so it is allocated as (num_pages, page_bytes) bytes",
                        "give a fixed count, or keep the records alone in their buffer with page.align: 1")
    _check_page_size_is_seen(tree, buffers, multiple, align)
    if "append" in tree["ops"] and any(b.shared for b in buffers):
        raise SpecError(tree["ops"].item_mark(tree["ops"].index("append")), "ops: 'append' is not available for a "
                        "buffer that holds every plane ('plane' in its order)", "give each plane its own buffers")
    owners: dict = {}                 # Cache field name -> the buffer (and plane) it holds
    for p in planes:
        for b in buffers:
            field, owner = Layout.field(p, b), (b.name if b.shared else (p, b.name))
            if owners.setdefault(field, owner) != owner:
                raise SpecError(tree.value_mark("buffers"), f"buffers: two buffers give the cache field name {field!r}",
                                "rename a buffer")
    # names the kernels give their pointer parameters (<name>_ptr): planes, their outputs, cache fields
    pointers = planes + tuple(f"{p}_out" for p in planes) + tuple(owners)
    arguments: dict = {}            # <plane>_<argument> -> the group that takes it
    for name, g in groups.items():
        for plane in planes if g.argument else ():
            argument = f"{plane}_{g.argument}"
            if arguments.setdefault(argument, name) != name:
                raise SpecError(tree["scales"][name].value_mark("global") if g.two_level else tree["scales"].key_mark(name),
                                f"scales.{name}: plane {plane}'s call-time scale would be named {argument}, as group "
                                f"{arguments[argument]!r}'s is", "give each group's call-time scale its own name")
            if argument in OP_PARAMETERS + OP_LOCALS + pointers or argument.startswith(tuple(f"{p}_stride" for p in planes)):
                raise SpecError(tree["scales"][name].value_mark("global") if g.two_level else tree["scales"].key_mark(name),
                                f"scales.{name}{'.global' if g.two_level else ''}: plane {plane}'s "
                                f"{'global ' if g.two_level else ''}scale argument would be named {argument}, which "
                                "the generated ops already use",
                                "rename the global scale" if g.two_level else "rename the scale group")
    # A buffer of every plane is a Cache field and a kernel argument <name>_ptr by its bare name.
    taken = set(RESERVED_PLANES) | set(OP_PARAMETERS) | set(planes) | {f"{p}_out" for p in planes}
    for b in buffers:
        if b.shared and (keyword.iskeyword(b.name) or b.name in taken
                         or b.name.startswith(tuple(f"{p}_stride" for p in planes))):
            raise SpecError(tree["buffers"].key_mark(b.name), f"buffers.{b.name}: a buffer that holds every plane is a "
                            f"Cache field and kernel argument named {b.name!r}, a name the generated ops already use",
                            "rename the buffer, e.g. kv_cache")
        # A buffer per plane is a Cache field and kernel argument <plane>_<name>: not a plane's output
        # (<plane>_out) or strides.
        fields = () if b.shared else tuple((p, f"{p}_{b.name}") for p in planes)
        clash = next(((p, f) for p, f in fields if f in taken or f.startswith(tuple(f"{q}_stride" for q in planes))), None)
        if clash is not None:
            raise SpecError(tree["buffers"].key_mark(b.name), f"buffers.{b.name}: plane {clash[0]!r} would have it as the "
                            f"Cache field and kernel argument {clash[1]}, a name the generated ops already use",
                            "rename the buffer, e.g. cache")
    for s in segments:
        if s.raw is not None:
            _check_alignment(records, buffers, s.raw.nbytes, f"{s.dtype} segment {s.name!r}", tree, checks, multiple,
                             earlier)
    for g in groups.values():
        if g.format.nbytes > 1 and not g.given:
            region = next(r for b in buffers for r in b.regions if r.holds == g.name)
            _check_alignment(records if region.inline else region, buffers, g.format.nbytes,
                             f"{g.format.name} scales of {g.name!r}", tree, checks, multiple, earlier)

    # Buffer, region and coordinate names join into the constexpr names kernels take (buffer a's
    # group b_c and buffer a_b's group c both give A_B_C_OFFSET): they must come out distinct.
    constexprs = [b.page_bytes_name for b in buffers] + [r.offset_name for b in buffers for r in b.regions] + \
        [t.const_name for b in buffers for r in b.regions for t in r.terms]
    clash = next((n for n in constexprs if constexprs.count(n) > 1), None)
    if clash:
        raise SpecError(tree.value_mark("buffers"), f"buffers: two buffers and regions give the generated name {clash}",
                        "rename a buffer or scale group so that buffer_group pairs differ")

    ops = tuple(tree["ops"])
    kind = next(iter({g.kind for g in groups.values()}), None)
    for i, op in enumerate(ops):
        if op not in OPS_BY_SCALE_KIND[kind]:
            raise SpecError(tree["ops"].item_mark(i), f"ops[{i}]: {op!r} is not available for "
                            f"{'a ' + kind + '-grouped' if kind else 'an unscaled'} layout",
                            f"use {', '.join(OPS_BY_SCALE_KIND[kind])}")
    for i, op in enumerate(ops):
        if op in ("quantize", "dequantize") and inline:
            raise SpecError(tree["ops"].item_mark(i), f"ops[{i}]: {op!r} returns records and scales apart, which a "
                            "layout with scales in the record does not have (yet)",
                            "drop quantize and dequantize; quantize_store and gather_dequant work")
    two_level = next((g for g in groups.values() if g.two_level), None)
    packed_any = next((s for s in segments if s.quantized and s.element.packing > 1 and not s.values.is_const), None)
    for i, op in enumerate(ops):
        if op in ("quantize", "dequantize") and packed_any is not None:
            raise SpecError(tree["ops"].item_mark(i), f"ops[{i}]: {op!r} takes its width from a dense tensor's last dim, "
                            f"which for segment {packed_any.name!r} ({packed_any.dtype}, values: any) would count bytes",
                            "drop quantize and dequantize, or give the segment a fixed width")
        if op in ("quantize", "dequantize") and two_level is not None:
            raise SpecError(tree["ops"].item_mark(i), f"ops[{i}]: {op!r} takes no global scale, which group "
                            f"{two_level.name!r} is relative to", "drop quantize and dequantize; quantize_store and "
                            "gather_dequant take the global scales")
    if {"quantize", "dequantize"} & set(ops) and len({g.format.name for g in groups.values()}) > 1:
        raise SpecError(tree.value_mark("scales"), "scales: quantize/dequantize return one scale tensor, so their "
                        "scale groups must share one format", "use one format, or drop the dense ops")
    sink = tree["slots"]["sink"]
    launch = _launch(tree, ops)
    if launch.get("quantize_store", {}).get("head_rows") and any(g.argument for g in groups.values()):
        knobs = tree["tuning"]["quantize_store"]
        raise SpecError(knobs.value_mark("head_rows"), "tuning.quantize_store.head_rows: not with call-time scales "
                        "(their kernels read one scale per program)", "remove head_rows")
    inputs = _inputs(tree, segments, planes, ops, set(pointers) | set(arguments))
    return Layout(
        name=tree["name"], summary=tree["summary"], spec_path=display, spec_sha256=digest,
        planes=tuple(tree["planes"]), heads=heads, values=values, page_size_multiple=multiple, page_align=align,
        sink=sink, segments=segments, record_bytes=record_bytes,
        scales=tuple(groups.values()), buffers=buffers, ops=ops, launch=launch,
        runtime_checks=tuple(dict.fromkeys(checks)), inputs=inputs,
    )


# The quantize_store kernel's own locals that an input's <name>_row must not take.
KERNEL_ROWS = ("x", "rec", "sc")


def _inputs(tree, segments, planes, ops, taken) -> tuple:
    """The spec's inputs: per plane, the tensors holding its record segments, as Sources."""
    spec = tree["inputs"]
    if not spec:
        return ()
    mark = tree.value_mark("inputs")
    for op in ("quantize", "append"):
        if op in ops:
            raise SpecError(mark, f"inputs: {op!r} takes whole rows, not parts", f"drop inputs, or drop {op} from ops")
    wide = next((s for s in segments if not s.values.is_const), None)
    if wide is not None:
        raise SpecError(mark, f"inputs: segment {wide.name!r} has values: any, and a part needs a fixed width",
                        "drop inputs (one tensor per plane takes any width)")
    for plane in spec:
        if plane not in planes:
            raise SpecError(spec.key_mark(plane), f"inputs.{plane}: no plane named {plane!r}",
                            f"planes: {', '.join(planes)}")
    missing = [p for p in planes if p not in spec]
    if missing:
        raise SpecError(mark, f"inputs: plane {missing[0]!r} has no inputs", "name every plane's tensors, or none")
    names = {s.name: s for s in segments}
    order = [s.name for s in segments]
    taken = set(taken) | set(RESERVED_PLANES) | set(OP_PARAMETERS) | set(OP_LOCALS) | set(planes) | set(KERNEL_ROWS)
    seen: dict = {}
    out = []
    for plane in planes:
        parts, covered = spec[plane], []
        for name, held in parts.items():
            where = f"inputs.{plane}.{name}"
            if keyword.iskeyword(name) or name in taken or name.startswith(tuple(f"{p}_stride" for p in planes)):
                raise SpecError(parts.key_mark(name), f"{where}: {name!r} is a Python keyword or a name the generated "
                                "op already uses", "name the tensor after the caller's argument, e.g. kv_c")
            if name in seen:
                raise SpecError(parts.key_mark(name), f"{where}: plane {seen[name]!r} has an input named {name!r} too",
                                "give each input its own name")
            seen[name] = plane
            for j, seg in enumerate(held):
                if seg not in names:
                    raise SpecError(held.item_mark(j), f"{where}[{j}]: no segment named {seg!r}",
                                    f"segments: {', '.join(order)}")
                if seg in covered:
                    raise SpecError(held.item_mark(j), f"{where}[{j}]: segment {seg!r} is in another input of "
                                    f"plane {plane!r} too", "name each segment once")
                if seg != order[len(covered)]:
                    raise SpecError(held.item_mark(j), f"{where}[{j}]: segment {seg!r} out of order; a plane's "
                                    f"inputs take its segments in record order ({', '.join(order)})",
                                    f"expected {order[len(covered)]!r} here")
                covered.append(seg)
            first = names[held[0]].value_offset
            width = sum((names[seg].values for seg in held), const(0))
            out.append(Source(name=name, plane=plane, first=first.const_value(), width=width, segments=tuple(held),
                              part=True))
        if len(covered) != len(order):
            raise SpecError(spec.value_mark(plane), f"inputs.{plane}: segment {order[len(covered)]!r} is in no input",
                            "add it to an input")
    return tuple(out)


# Default launch shapes (a good middle in the H200 sweeps, `kvlayout bench --sweep`); a spec's `tuning` overrides them per op.
DEFAULT_LAUNCH = {
    "gather_dequant": {"elements": 4096, "block_tokens": None, "num_warps": 4, "lane_group": 4,
                       "dependent_launch": False, "early_release": False},
    "quantize_store": {"elements": 4096, "block_tokens": None, "num_warps": 4, "head_rows": False,
                       "dependent_launch": False, "early_release": False},
    "quantize": {"elements": 4096, "block_tokens": None, "num_warps": 4, "dependent_launch": False, "early_release": False},
    "dequantize": {"elements": 4096, "block_tokens": None, "num_warps": 4, "dependent_launch": False, "early_release": False},
    "append": {"columns": 128, "entries": 32, "num_warps": 1,
               "lone_heads": 8, "lone_columns": 128, "lone_warps": 2, "lone_programs": 2048, "lone_registers": None,
               "lone_fresh_runs": True,
               "dependent_launch": True, "early_release": True},
}
POWER_OF_TWO_KNOBS = ("elements", "block_tokens", "columns", "entries", "lone_heads", "lone_columns", "num_warps",
                      "lone_warps")


def _launch(tree, ops) -> dict:
    out = {op: dict(DEFAULT_LAUNCH[op]) for op in ops}
    tuning = tree["tuning"]
    for op, knobs in tuning.items():
        where = f"tuning.{op}"
        if op not in ops:
            raise SpecError(tuning.key_mark(op), f"{where}: the spec does not generate {op!r}",
                            f"tune one of {', '.join(ops)}")
        for knob, value in knobs.items():
            if value is None:
                continue
            if knob not in DEFAULT_LAUNCH[op]:
                raise SpecError(knobs.key_mark(knob), f"{where}.{knob}: {op} has no such knob",
                                f"its knobs are {', '.join(DEFAULT_LAUNCH[op])}")
            if knob in POWER_OF_TWO_KNOBS and value & (value - 1):
                raise SpecError(knobs.value_mark(knob), f"{where}.{knob}: {value} is not a power of two",
                                f"use {1 << (value.bit_length() - 1)}")
            out[op][knob] = value
    return out


def _scale_groups(tree) -> dict:
    out = {}
    for name, g in tree["scales"].items():
        mark = tree["scales"].value_mark(name)
        fmt = SCALE_FORMATS[g["format"]]
        lo, hi = fmt.exponent_min, fmt.exponent_max
        given = g["group"] == "tensor"
        if given != (g["rule"] == "given"):
            raise SpecError(g.value_mark("rule" if given else "group"),
                            f"scales.{name}: " + ("a group: tensor scale is given at call time, so its rule is 'given'"
                                                  if given else "rule 'given' (a call-time scale) covers a whole plane"),
                            "set rule: given" if given else "set group: tensor, or pick a rule that computes the scale")
        if given:
            _check_given_group(name, g)
        if g["rule"] == "exact":
            if g["format"] not in ("fp32", "e4m3"):
                raise SpecError(g.value_mark("rule"), f"scales.{name}.rule: 'exact' scales (amax / fmax) are not powers "
                                "of two, so they need format: fp32 (or e4m3, rounded to a code)",
                                "set format: fp32, or pick a power-of-two rule")
            if g["exponent_range"] is not None:
                raise SpecError(g.value_mark("exponent_range"), f"scales.{name}.exponent_range: 'exact' scales have no "
                                "exponent to clamp", "remove exponent_range")
        if g["format"] == "e4m3":
            _check_e4m3_group(name, g)
        elif g["global"] is not None:
            raise SpecError(g.key_mark("global"), f"scales.{name}.global: a global scale divides fp8 block scales "
                            f"(two-level NVFP4 scaling), and this group's format is {g['format']}",
                            "set format: e4m3, or remove global")
        if g["rounding"] != "quotient" and g["rule"] != "exact":
            raise SpecError(g.key_mark("rounding"), f"scales.{name}.rounding: only rule exact divides by a scale that "
                            "is not a power of two (a power of two scales every value exactly)", "remove rounding")
        for key, byte in (("ue8m0_zero", "0x00"), ("ue8m0_ff", "0xFF")):
            if key in g.key_marks and g["format"] != "ue8m0":
                raise SpecError(g.key_mark(key), f"scales.{name}.{key}: only ue8m0 scales have a byte {byte}",
                                f"remove {key}")
        if g["exponent_range"] is not None:
            lo_s, hi_s = g["exponent_range"]
            if lo_s >= hi_s:
                raise SpecError(g.value_mark("exponent_range"), f"scales.{name}.exponent_range: lo {lo_s} is not "
                                f"below hi {hi_s} (one exponent for every group quantizes most values to 0 or fmax)",
                                "write [lo, hi] with lo < hi, e.g. [-127, 127]")
            lo, hi = max(lo, lo_s), min(hi, hi_s)
        floor = g["amax_floor"]
        for key in ("amax_floor", "scale_floor"):
            value = g[key]
            if value is not None and not FP32_MIN_NORMAL <= value <= FLOOR_MAX:
                raise SpecError(g.value_mark(key), f"scales.{name}.{key}: {value!r} is not a normal fp32 number of "
                                f"at most {FLOOR_MAX:.1e}", f"use a value from 1.2e-38 to {FLOOR_MAX:.1e}, "
                                "e.g. 1.0e-30")
        if g["scale_floor"] is not None and g["rule"] != "exact":
            lo_floor = math.ceil(math.log2(g["scale_floor"]))
            raise SpecError(g.key_mark("scale_floor"), f"scales.{name}.scale_floor: a {g['rule']!r} scale is a power of "
                            "two, so its floor is a least exponent", f"remove scale_floor and set exponent_range: "
                            f"[{lo_floor}, 127] (2^{lo_floor} is the least power of two >= {g['scale_floor']!r})")
        (kind, size), = g["group"].items() if not given else (("tensor", 1),)
        if kind == "values" and size == "any":
            size = None                          # the whole segment: its width, known once it is placed
        scale_floor = g["scale_floor"]
        out[name] = dict(name=name, mark=mark, tree=g, format=fmt, rule=g["rule"], terms=None, amax_floor=floor,
                         amax_floor_bits=fp32_bits(floor) if floor is not None else 0,
                         scale_floor=fp32_value(scale_floor) if scale_floor is not None else None,
                         exponent_lo=lo, exponent_hi=hi, zero_byte=g["ue8m0_zero"], ff_byte=g["ue8m0_ff"], kind=kind, size=size, segment=None,
                         global_name=g["global"], rounding=g["rounding"], nan=g["nan"])
    return out


def _check_e4m3_group(name: str, g) -> None:
    """e4m3 block scales: rule exact, rounded to a code; no floors (a code already bounds the scale)."""
    if g["rule"] != "exact":
        raise SpecError(g.value_mark("rule"), f"scales.{name}.rule: e4m3 scales are amax / fmax rounded to an fp8 "
                        f"code (NVFP4), not a {g['rule']!r} power of two", "set rule: exact, or format: ue8m0")
    for key in ("amax_floor", "scale_floor"):
        if g[key] is not None:
            raise SpecError(g.key_mark(key), f"scales.{name}.{key}: not supported for e4m3 scales (a zero amax gives "
                            "scale code 0 and every value code 0)", f"remove {key}")


def _check_given_group(name: str, g) -> None:
    """A call-time scale: an fp32 tensor, with none of the fields that shape a computed scale."""
    if g["format"] != "fp32":
        raise SpecError(g.value_mark("format"), f"scales.{name}.format: a given scale is a float32 tensor",
                        "set format: fp32")
    for key in ("amax_floor", "scale_floor", "exponent_range", "pad_to"):
        if g[key] is not None:
            raise SpecError(g.key_mark(key), f"scales.{name}.{key}: a given scale is not computed from amax, "
                            "nor stored in the cache", f"remove {key}")
    if g["nan"] != "ignore":
        raise SpecError(g.key_mark("nan"), f"scales.{name}.nan: a given scale is not computed from the values, so "
                        "a NaN among them cannot poison it", "remove nan")


def _segments(tree, groups, checks):
    """The record's value segments and where each group stored inline sits: (segments as dicts,
    record bytes, values, {group: (record byte offset, mark)})."""
    record = tree["record"]
    names = set()
    value_offset = const(0)
    out = {}
    for i, seg in enumerate(record):
        if "scales" in seg:
            continue
        mark = record.item_mark(i)
        where = f"record[{i}]"
        if seg["name"] in names:
            raise SpecError(seg.value_mark("name"), f"{where}.name: duplicate segment name {seg['name']!r}",
                            "give each segment its own name")
        names.add(seg["name"])
        if seg["values"] == "any":
            if sum("scales" not in item for item in record) != 1:
                raise SpecError(seg.value_mark("values"), f"{where}.values: 'any' is only allowed in a one-segment record",
                                "give the width as a number")
            if seg["dtype"] not in ELEMENT_FORMATS:
                raise SpecError(seg.value_mark("values"), f"{where}.values: 'any' needs a quantized (fp8) dtype",
                                "give the raw segment a fixed width")
            nvalues: Expr = sym(VALUES)
        else:
            nvalues = const(seg["values"])
        dtype = seg["dtype"]
        element, raw = ELEMENT_FORMATS.get(dtype), RAW_DTYPES.get(dtype)
        if element is not None and seg["scale"] is None:
            raise SpecError(mark, f"{where}: {dtype} values need a scale group", "add 'scale: <group name>'")
        if raw is not None and seg["scale"] is not None:
            raise SpecError(seg.value_mark("scale"), f"{where}.scale: raw {dtype} values are copied, not scaled",
                            "remove 'scale', or use an fp8 dtype")
        if seg["scale"] is not None:
            g = groups.get(seg["scale"])
            if g is None:
                raise SpecError(seg.value_mark("scale"), f"{where}.scale: no scale group named {seg['scale']!r}",
                                f"define it under 'scales:' (known: {', '.join(groups) or 'none'})")
            if g["segment"] is not None:
                raise SpecError(seg.value_mark("scale"), f"{where}.scale: group {seg['scale']!r} already scales "
                                f"segment {g['segment']!r}", "give each quantized segment its own scale group")
            g["segment"] = seg["name"]
        packing = element.packing if element is not None else 1
        if packing > 1 and not nvalues.is_const:
            checks.append((sym(VALUES), packing, f"the value count must be a multiple of {packing} ({dtype} packs "
                           f"{packing} values per byte)"))
        elif packing > 1 and nvalues.const_value() % packing:
            raise SpecError(seg.value_mark("values"), f"{where}.values: {dtype} packs {packing} values per byte, "
                            f"and {nvalues.const_value()} is not a multiple of {packing}", f"use a multiple of {packing}")
        out[i] = dict(name=seg["name"], dtype=dtype, values=nvalues, value_offset=value_offset, byte_offset=None,
                      nbytes=nvalues * raw.nbytes if raw else nvalues // packing, element=element, raw=raw,
                      scale=seg["scale"], mark=mark)
        value_offset = value_offset + nvalues
    for name, g in groups.items():
        if g["segment"] is None:
            raise SpecError(g["mark"], f"scales.{name}: no segment uses this scale group",
                            f"add 'scale: {name}' to a segment, or remove the group")
    record_bytes, inline = _place_record_items(record, out, groups, checks)
    return [out[i] for i in sorted(out)], record_bytes, value_offset, inline


def _place_record_items(record, out: dict, groups, checks) -> tuple:
    """Byte offsets in record order, of the value segments (`out`, by record index: filled in) and of
    the groups stored inline; returns (record bytes, {group: (record byte offset, mark)})."""
    byte_offset = const(0)
    inline = {}
    for i, item in enumerate(record):
        mark, where = record.item_mark(i), f"record[{i}]"
        if i in out:
            s = out[i]
            raw = s["raw"]
            if raw is not None and byte_offset.is_const and byte_offset.const_value() % raw.nbytes:
                raise SpecError(mark, f"{where}: {s['dtype']} segment starts at record byte {byte_offset.const_value()}, "
                                f"not a multiple of {raw.nbytes}", "reorder the segments so wider dtypes come first")
            s["byte_offset"] = byte_offset
            byte_offset = byte_offset + s["nbytes"]
            continue
        name = item["scales"]
        g = groups.get(name)
        if g is None:
            raise SpecError(item.value_mark("scales"), f"{where}.scales: no scale group named {name!r}",
                            f"define it under 'scales:' (known: {', '.join(groups) or 'none'})")
        if name in inline:
            raise SpecError(item.value_mark("scales"), f"{where}.scales: group {name!r} is already stored at record "
                            f"byte {inline[name][0].render()}", "store a group's scales once")
        if g["kind"] == "tensor":
            raise SpecError(item.value_mark("scales"), f"{where}.scales: group {name!r} is given at call time, so the "
                            "record holds none of it", "remove this record item")
        if g["kind"] != "values":
            raise SpecError(item.value_mark("scales"), f"{where}.scales: only {{values: N}} groups sit in the record "
                            f"({name!r} is a {{tokens: N}} group, shared by slots)", f"place {name} in a buffer region")
        seg = next(s for s in out.values() if s["name"] == g["segment"])
        pad = g["tree"]["pad_to"]
        count = const(pad) if pad is not None else const(1) if g["size"] is None else seg["values"] // g["size"]
        if not count.is_const:
            raise SpecError(item.value_mark("scales"), f"{where}.scales: group {name!r} has a scale count known only at "
                            "call time, so the record would have no fixed size", "give the segment a fixed width")
        size = g["format"].nbytes
        if not byte_offset.is_const:      # after a segment of call-time width: checked per call
            if not divisible(byte_offset, size):
                checks.append((byte_offset, size, f"the value count must be a multiple of {size}, so that the "
                               f"{g['format'].name} scales of {name!r} after the values are aligned"))
        elif byte_offset.const_value() % size:
            raise SpecError(mark, f"{where}: {g['format'].name} scales of {name!r} start at record byte "
                            f"{byte_offset.const_value()}, not a multiple of {size}",
                            "reorder the record so wider entries come first")
        inline[name] = (byte_offset, mark)
        byte_offset = byte_offset + count * size
    return byte_offset, inline


def _finish_group(g, segments, tree, multiple, checks) -> ScaleGroup:
    seg = next(s for s in segments if s["name"] == g["segment"])
    pad = g["tree"]["pad_to"]
    where = f"scales.{g['name']}"
    if g["kind"] == "values" and g["size"] is None:
        # {values: any}: one scale per token and head over the whole segment, whatever its width
        g["size"] = seg["values"].const_value() if seg["values"].is_const else seg["values"]
        count = const(1)
        padded = const(pad) if pad is not None else count
    elif g["kind"] == "values":
        n = g["size"]
        if seg["values"].is_const:
            if seg["values"].const_value() % n:
                raise SpecError(g["tree"].value_mark("group"), f"{where}.group: {n} does not divide segment "
                                f"{seg['name']!r}'s {seg['values'].const_value()} values",
                                f"use a group size that divides {seg['values'].const_value()}")
        else:
            checks.append((sym(VALUES), n, f"the value count must be a multiple of {n}"))
        count = seg["values"] // n
        padded = count
        if pad is not None:
            if not count.is_const:
                raise SpecError(g["tree"].value_mark("pad_to"), f"{where}.pad_to: cannot pad a count that is only known "
                                "at call time", "remove pad_to or give the segment a fixed width")
            if pad < count.const_value():
                raise SpecError(g["tree"].value_mark("pad_to"), f"{where}.pad_to: {pad} is less than the "
                                f"{count.const_value()} scales per token", f"use pad_to >= {count.const_value()}")
            padded = const(pad)
    elif g["kind"] == "tensor":
        count = padded = seg["values"]           # one value per tile: the walk steps through the values
    else:
        if pad is not None:
            raise SpecError(g["tree"].value_mark("pad_to"), f"{where}.pad_to: only {{values: N}} groups are padded",
                            "remove pad_to")
        if g["size"] & (g["size"] - 1):
            raise SpecError(g["tree"].value_mark("group"), f"{where}.group: {{tokens: {g['size']}}} is not a power of "
                            "two (an append walks a block's slots as one power-of-two tile)",
                            f"use {{tokens: {1 << (g['size'].bit_length() - 1)}}} or {{tokens: {1 << g['size'].bit_length()}}}")
        if g["size"] < MIN_GROUP_TOKENS and "append" in tree["ops"]:
            raise SpecError(g["tree"].value_mark("group"), f"{where}.group: {{tokens: {g['size']}}} is below "
                            f"{MIN_GROUP_TOKENS} slots (an append rescales a block's slots {MIN_GROUP_TOKENS} at a time)",
                            f"use {{tokens: {MIN_GROUP_TOKENS}}} or more")
        if multiple % g["size"]:
            raise SpecError(tree["page"].value_mark("size_multiple_of") if "size_multiple_of" in getattr(
                                tree["page"], "key_marks", {}) else g["tree"].value_mark("group"),
                            f"{where}.group: {{tokens: {g['size']}}} needs page.size_multiple_of to be a multiple of "
                            f"{g['size']} (it is {multiple})", f"set page.size_multiple_of: {g['size']}")
        count = padded = seg["values"]
    packing = seg["element"].packing
    if packing > 1 and g["kind"] == "tensor":
        raise SpecError(g["tree"].value_mark("group"), f"{where}.group: a given scale for {seg['dtype']} (two codes per "
                        "byte) is not supported", "use an fp8 element format, or a {values: N} group")
    if packing > 1 and g["kind"] == "values" and not isinstance(g["size"], int):
        raise SpecError(g["tree"].value_mark("group"), f"{where}.group: a {seg['dtype']} scale group over the whole "
                        "segment of call-time width is not supported (a packed walk needs a power-of-two group known "
                        "when the module is generated)", "use {values: 16} or {values: 32}")
    if packing > 1 and (g["kind"] != "values" or g["size"] % packing):
        raise SpecError(g["tree"].value_mark("group"), f"{where}.group: {seg['dtype']} packs {packing} values per byte, "
                        f"so a scale covers a whole number of bytes: {{values: N}} with N a multiple of {packing}",
                        f"use {{values: {max(packing, g['size'] - g['size'] % packing)}}}")
    if packing > 1 and g["kind"] == "values" and isinstance(g["size"], int) and g["size"] & (g["size"] - 1):
        fit = g["size"] & -g["size"]               # the largest power of two dividing the width
        raise SpecError(g["tree"].value_mark("group"), f"{where}.group: {seg['dtype']} scale groups of {g['size']} values "
                        "are not supported (a packed walk splits a power-of-two group into byte pairs)",
                        f"use {{values: {fit}}}, a power of two that divides {g['size']}")
    if g["kind"] == "tokens" and (g["format"].name != "ue8m0" or g["rule"] == "exact"):
        raise SpecError(g["tree"].value_mark("format"), f"{where}: {{tokens: N}} groups rescale stored codes by powers "
                        "of two, so they need format: ue8m0 and a power-of-two rule", "use format: ue8m0")
    if g["nan"] == "poison" and (seg["element"].specials == "none" or g["kind"] != "values"):
        raise SpecError(g["tree"].value_mark("nan"), f"{where}.nan: 'poison' writes the NaN code for every value of "
                        + (f"a group, and {seg['dtype']} has none" if seg["element"].specials == "none" else
                           "a group of values, and a {tokens: N} group rescales stored codes"),
                        "remove nan (ignore)")
    if g["rounding"] == "products" and g["format"].name != "e4m3":
        raise SpecError(g["tree"].value_mark("rounding"), f"{where}.rounding: 'products' is sglang's NVFP4 encoder, "
                        f"for e4m3 block scales (this group's format is {g['format'].name})",
                        "remove rounding, or set format: e4m3")
    if g["rounding"] == "products" and seg["element"].name != "fp4_e2m1":
        raise SpecError(g["tree"].value_mark("rounding"), f"{where}.rounding: 'products' compares values with the "
                        f"scale times each midpoint between fp4 e2m1 codes, and segment {seg['name']!r} is {seg['dtype']}",
                        "remove rounding (quotient), or store the segment as fp4_e2m1")
    fields = {k: v for k, v in g.items() if k not in ("mark", "tree", "terms")}
    terms = None if g["rule"] in ("exact", "given") else rule_terms(g["rule"], seg["element"])
    return ScaleGroup(count=count, padded_count=padded, terms=terms, element=seg["element"], **fields)


def _attach_scale(s: dict, groups) -> Segment:
    fields = {k: v for k, v in s.items() if k != "mark"}
    fields["scale"] = groups[s["scale"]] if s["scale"] else None
    return Segment(**fields)


_COORD = re.compile(r"(\w+)(?: (%|//) (\d+))?")


def _buffer(name, buffers_tree, ctx, align, segments) -> Buffer:
    regions_tree = buffers_tree[name]
    offset: Expr = const(0)
    regions = []
    for i, rt in enumerate(regions_tree):
        where = f"buffers.{name}[{i}]"
        holds = rt["holds"]
        if holds in ctx["inline"]:
            line = ctx["inline"][holds][1].line
            raise SpecError(rt.value_mark("holds"), f"{where}.holds: the scales of {holds!r} are stored in the record "
                            f"(line {line}), not in a region", f"remove this region, or the record's {{scales: {holds}}}")
        if holds == "records":
            kind, element_bytes = "records", ctx["record_bytes"]
        elif holds in ctx["groups"]:
            g = ctx["groups"][holds]
            if g.kind == "tensor":
                raise SpecError(rt.value_mark("holds"), f"{where}.holds: {holds!r} is given at call time, so the cache "
                                "holds none of it", "remove this region")
            kind, element_bytes = g.kind, const(g.format.nbytes)
        else:
            raise SpecError(rt.value_mark("holds"), f"{where}.holds: {holds!r} is neither 'records' nor a scale group",
                            f"use 'records' or one of: {', '.join(ctx['groups']) or '(no scale groups)'}")
        extents = _base_extents(kind, ctx, holds)
        terms = _terms(rt, where, kind, extents, ctx, name, holds)
        # Strides: innermost coordinate moves by one element; each outer one by the inner span.
        strides = []
        span = element_bytes
        for t in reversed(terms):
            strides.append(span)
            span = span * t["extent"]
        strides.reverse()
        prefix = f"{name}_{holds}".upper()
        region_terms = tuple(Term(coord=t["coord"], op=t["op"], n=t["n"], extent=t["extent"], stride=s,
                                  const_name=f"{prefix}_{t['suffix']}_STRIDE") for t, s in zip(terms, strides))
        regions.append(Region(buffer=name, holds=holds, terms=region_terms, element_bytes=element_bytes,
                              offset=offset, nbytes=span, offset_name=f"{prefix}_OFFSET"))
        offset = offset + span
    with_plane = [any(t.coord == "plane" for t in r.terms) for r in regions]
    if any(with_plane) and not all(with_plane):
        i = with_plane.index(not with_plane[0])
        raise SpecError(regions_tree.item_mark(i), f"buffers.{name}[{i}].order: a buffer holds every plane ('plane' in "
                        "each region's order) or one (in none)", "list 'plane' in every region of the buffer, or in none")
    records = next((r for r in regions if r.holds == "records"), None)
    if records is not None:
        regions.extend(_inline_region(records, name, ctx["groups"][g], at) for g, (at, _) in ctx["inline"].items())
    page_bytes = round_up(offset, align)
    dtype, shape = _natural_shape(regions, page_bytes, align, segments)
    return Buffer(name=name, regions=tuple(regions), page_bytes=page_bytes, align=align,
                  page_bytes_name=f"{name.upper()}_PAGE_BYTES", torch_dtype=dtype, shape=shape, shared=any(with_plane))


def _check_page_size_is_seen(tree, buffers, multiple: int, align: int):
    """The ops check a call's page_size against the cache tensors' page bytes, so some buffer's page
    bytes must differ for every allowed page size: padding to page.align must not round two of them to
    one size (a page of 656-byte records padded to 4096 bytes is 4096 bytes for page sizes 1 to 6)."""
    if align == 1:
        return   # page bytes grow with page_size
    # With padded pages heads and values are fixed (see the 'any' check), so page bytes before padding
    # are a fixed number of bytes per page_size step plus a constant.
    growth = _page_growth(buffers, multiple)
    if growth < align:
        raise SpecError(tree["page"].value_mark("align"), f"page.align: padding pages to {align} bytes gives "
                        f"different page sizes the same page bytes (a page grows by only {growth} bytes per "
                        f"{multiple} slot(s)), so the ops could not check a call's page_size against the cache",
                        f"use page.align of at most {growth}, or page.size_multiple_of of at least "
                        f"{multiple * -(-align // growth)}")


def _page_growth(buffers, multiple: int) -> int:
    """The bytes the largest unpadded page grows by per page_size step (`multiple` slots)."""
    return max(round_up_operand(b.page_bytes).evaluate({PAGE_SIZE: 2 * multiple})
               - round_up_operand(b.page_bytes).evaluate({PAGE_SIZE: multiple}) for b in buffers)


def _inline_region(records: Region, buffer: str, g: ScaleGroup, at: Expr) -> Region:
    """A group's scales inside each record: the records' coordinates and strides, then the scale
    index (entry by entry), `at` bytes into the record."""
    prefix, records_prefix = f"{buffer}_{g.name}".upper(), f"{buffer}_records".upper()
    terms = tuple(Term(coord=t.coord, op=t.op, n=t.n, extent=t.extent, stride=t.stride,
                       const_name=prefix + t.const_name.removeprefix(records_prefix)) for t in records.terms)
    size = const(g.format.nbytes)
    terms += (Term(coord="scale", op=None, n=None, extent=g.padded_count, stride=size, const_name=f"{prefix}_SCALE_STRIDE"),)
    return Region(buffer=buffer, holds=g.name, terms=terms, element_bytes=size, offset=records.offset + at,
                  nbytes=g.padded_count * size, offset_name=f"{prefix}_OFFSET", inline=True, record_offset=at)


def _base_extents(kind, ctx, holds) -> dict:
    P = sym(PAGE_SIZE)
    plane = {"plane": const(ctx["planes"])}       # a buffer that holds every plane
    if kind == "records":
        return {"slot": P, "head": ctx["heads"], **plane}
    g = ctx["groups"][holds]
    if kind == "values":
        return {"slot": P, "head": ctx["heads"], "scale": g.padded_count, **plane}
    return {"block": P // g.size, "head": ctx["heads"], "dim": ctx["values"], **plane}


def _terms(rt, where, kind, extents, ctx, buffer, holds):
    order = rt["order"]
    wanted = COORDS_BY_HOLDING[kind]
    seen: dict = {}
    terms = []
    for j, text in enumerate(order):
        mark = order.item_mark(j)
        coord, op, n = _COORD.fullmatch(text).groups()
        if coord == "plane":
            if ctx["planes"] == 1:
                raise SpecError(mark, f"{where}.order[{j}]: 'plane' orders the planes of a buffer that holds several, "
                                "and this layout has one", "remove 'plane'")
            if op is not None:
                raise SpecError(mark, f"{where}.order[{j}]: 'plane' cannot be split", "keep 'plane' whole")
        elif coord not in wanted:
            raise SpecError(mark, f"{where}.order[{j}]: {coord!r} is not a coordinate of {holds}",
                            f"{holds} regions are ordered by {', '.join(wanted)}")
        n = int(n) if n else None
        limit = language.MAX_HEADS if coord == "head" else language.MAX_VALUES
        if n is not None and n > limit:
            raise SpecError(mark, f"{where}.order[{j}]: splits {coord} by {n}, more than any {coord} extent "
                            f"(at most {limit})", f"split {coord} by a number up to {limit}")
        seen.setdefault(coord, []).append((op, n, mark))
        extent = extents[coord]
        if op == "%":
            term_extent, suffix = const(n), f"{coord.upper()}_MOD{n}"
        elif op == "//":
            term_extent, suffix = extent // n, f"{coord.upper()}_DIV{n}"
        else:
            term_extent, suffix = extent, coord.upper()
        if op is not None and coord == "dim":
            raise SpecError(mark, f"{where}.order[{j}]: {coord!r} cannot be split",
                            f"keep {coord!r} whole")
        if op is not None:
            what = None
            if coord == "scale":       # a values group's scale count is values / size: say it in values
                size = ctx["groups"][holds].size
                what = f"the value count must be a multiple of {size * n} ({coord} is split by {n}, one per {size} values)"
            _check_divides(extent, n, coord, mark, where, ctx, what)
        terms.append(dict(coord=coord, op=op, n=n, extent=term_extent, suffix=suffix))
    for coord in wanted:
        if coord not in seen:
            raise SpecError(order.mark, f"{where}.order: missing coordinate {coord!r}",
                            f"list each of {', '.join(wanted)} once (split ones as 'c % N' and 'c // N')")
        forms = seen[coord]
        ops = sorted(op or "" for op, _, _ in forms)
        ns = {n for _, n, _ in forms}
        if not (ops == [""] or (ops == ["%", "//"] and len(ns) == 1)):
            raise SpecError(forms[-1][2], f"{where}.order: coordinate {coord!r} must appear once, or split exactly "
                            f"as '{coord} % N' and '{coord} // N'", f"write {coord} once, or both halves of one split")
    return terms


def _check_divides(extent: Expr, n: int, coord: str, mark, where, ctx, what: str | None = None):
    if extent.is_const:
        if extent.const_value() % n:
            raise SpecError(mark, f"{where}: {n} does not divide the {coord} extent {extent.const_value()}",
                            f"split by a divisor of {extent.const_value()}")
    elif coord == "slot" or coord == "block":
        step = ctx["multiple"] if coord == "slot" else None
        if step is None or step % n:
            raise SpecError(mark, f"{where}: splitting {coord} by {n} needs page.size_multiple_of to be a multiple "
                            f"of {n}", f"set page.size_multiple_of: {n}")
    else:
        ctx["checks"].append((extent, n, what or f"the {coord} extent must be a multiple of {n}"))


def _natural_shape(regions, page_bytes: Expr, align: int, segments):
    inline = any(r.inline for r in regions)
    regions = [r for r in regions if not r.inline]
    if len(regions) == 1 and align == 1:
        r = regions[0]
        dims = tuple(t.extent for t in r.terms)

        def row(width):
            """dims and the innermost width; a trailing plane joins the width: a (slot, head)'s row
            of every plane's record, as vLLM's per-token-head K|V rows."""
            if r.terms[-1].coord == "plane":
                return dims[:-1] + (dims[-1] * width,)
            return dims + (width,)
        if r.holds == "records":
            # a record of one fp8 segment (no scales inside it) is that segment's values
            if len(segments) == 1 and segments[0].element is not None and segments[0].element.packing == 1 and not inline:
                return segments[0].element.torch_dtype, row(segments[0].values)
            return "uint8", row(r.element_bytes)
        one_byte = r.element_bytes.is_const and r.element_bytes.const_value() == 1
        group = next((s.scale for s in segments if s.scale is not None and s.scale.name == r.holds), None)
        if one_byte and group is not None and group.code_format is not None:
            return group.code_format.torch_dtype, dims     # fp8 scale codes: e4m3 scales as float8_e4m3fn (FlashInfer's)
        return "uint8", dims if one_byte else row(r.element_bytes)     # every scale's bytes (fp32: 4)
    return "uint8", (page_bytes,)


def _check_placement(tree, buffers, groups):
    placed: dict = {}
    for b in buffers:
        for i, r in enumerate(b.regions):
            if r.holds in placed:
                raise SpecError(tree["buffers"][b.name].item_mark(i), f"buffers.{b.name}[{i}]: {r.holds!r} is already "
                                f"placed in buffer {placed[r.holds]!r}", "place each of records and scale groups once")
            placed[r.holds] = b.name
    for need in ("records", *(name for name, g in groups.items() if g.kind != "tensor")):
        if need not in placed:
            raise SpecError(tree.value_mark("buffers"), f"buffers: {need!r} is not placed in any buffer",
                            f"add '- {{holds: {need}, order: [...]}}' to a buffer")


def _check_alignment(region: Region, buffers, size: int, subject: str, tree, checks, multiple: int,
                     earlier: bool = False):
    """Every address of `region` must be a multiple of `size` (a raw bf16 segment, an fp32 scale);
    earlier: see build_layout."""
    buf = next(b for b in buffers if b.name == region.buffer)
    for what, e in (("the element size", region.element_bytes), (f"the {region.holds} region offset", region.offset),
                    (f"the page size of buffer {buf.name!r}", buf.page_bytes)):
        if e.is_const:
            if e.const_value() % size:
                raise SpecError(tree.value_mark("buffers"), f"buffers.{buf.name}: {what} ({e.const_value()} bytes) is "
                                f"not a multiple of {size}, so {subject} would be misaligned",
                                "pad the record or the page (page.align), or reorder the regions")
        elif isinstance(e, RoundUp) and e.multiple % size and not divisible(e, size):
            # padding to the page's align would misalign some page sizes' pages: refused here, not
            # per call (explain, diff and the pictures show a layout at 64 and 128 slots)
            if _padding_misaligns(e, size, multiple):
                growth = _page_growth(buffers, multiple)
                lcm = math.lcm(e.multiple, size)
                fix = lcm if lcm <= growth else max(size, e.multiple // size * size)
                raise SpecError(tree["page"].value_mark("align"), f"page.align: {e.multiple} is not a multiple of "
                                f"{size}, so padded pages of buffer {buf.name!r} would misalign {subject}",
                                f"use a multiple of {size}, e.g. {fix}")
        elif not divisible(e, size):
            if not e.symbols() - {PAGE_SIZE} and not earlier:
                _check_page_sizes_align(e, size, multiple, what, subject, tree)
            checks.append((e, size, f"{what} must be a multiple of {size} bytes, or {subject} would be misaligned"))


def _check_page_sizes_align(e, size: int, multiple: int, what: str, subject: str, tree) -> None:
    """An address that depends on page_size alone is checked here at every page size the spec allows
    (multiples of page.size_multiple_of), so a spec never declares page sizes every call would refuse.
    e is page_size times a constant plus a constant, with terms floor-divided or rounded by constants
    (_divisors): e(multiple * k) % size repeats within size * lcm(divisors) steps of k."""
    steps = range(1, min(size * math.lcm(1, *_divisors(e)), 4096) + 1)
    bad = next((multiple * k for k in steps if e.evaluate({PAGE_SIZE: multiple * k}) % size), None)
    if bad is None:
        return
    fixes = (m for m in range(2 * multiple, min(64 * multiple, language.MAX_PAGE_SIZE) + 1, multiple))
    fix = next((f"set page.size_multiple_of: {m}" for m in fixes
                if all(e.evaluate({PAGE_SIZE: m * k}) % size == 0 for k in steps)),
               "pad the record or the page (page.align), or reorder the regions")
    page = tree.get("page")
    mark = (page.value_mark("size_multiple_of") if "size_multiple_of" in getattr(page, "key_marks", {})
            else tree.value_mark("buffers"))
    raise SpecError(mark, f"page.size_multiple_of: {multiple} allows page_size={bad}, where {what} "
                    f"({e.evaluate({PAGE_SIZE: bad})} bytes) is not a multiple of {size}, so {subject} would be "
                    "misaligned", fix)


def _divisors(e) -> list:
    """The constant divisors of e's floor divisions (and rounding multiples), anywhere in it."""
    found = [e.den] if isinstance(e, FloorDiv) else [e.multiple] if isinstance(e, RoundUp) else []
    for part in vars(e).values() if hasattr(e, "__dataclass_fields__") else ():
        for item in part if isinstance(part, tuple) else (part,):
            if isinstance(item, Expr):
                found += _divisors(item)
    return found


def _padding_misaligns(e: RoundUp, size: int, multiple: int) -> bool:
    """Whether some allowed page size's padded page bytes are not a multiple of `size`. The page
    bytes before padding depend on page_size alone (heads and values are fixed with padded pages), so
    the page sizes multiple * k for k up to lcm(align, size) cover every residue; True where the
    bytes depend on other sizes (not proven)."""
    if e.num.symbols() - {PAGE_SIZE}:
        return True
    return any(e.evaluate({PAGE_SIZE: multiple * k}) % size for k in range(1, math.lcm(e.multiple, size) + 1))


# --- compat modules -------------------------------------------------------------------------------

# The torch names a compat parameter's default may be: the dtypes a caller passes for out_dtype-like
# parameters (any other torch.<name> could fail at the generated module's import).
TORCH_DEFAULTS = frozenset({"bfloat16", "float16", "float32", "float64", "half", "float", "double", "uint8", "int8",
                            "int16", "int32", "int64", "bool", "float8_e4m3fn", "float8_e5m2"})
# Builtins a module-level name of a compat module would shadow for its own code (isinstance, ValueError).
BUILTIN_NAMES = frozenset(dir(builtins))


def build_compat(tree, display: str, digest: str, layouts: dict) -> Compat:
    stem = Path(display).stem
    if tree["compat"] != stem:
        raise SpecError(tree.value_mark("compat"), f"compat: {tree['compat']!r} must equal the file name {stem!r}",
                        f"set compat: {stem}")
    types = tuple((name, tuple(fields)) for name, fields in tree["types"].items())
    for name, fields in tree["types"].items():
        for j, field_name in enumerate(fields):
            if keyword.iskeyword(field_name) or field_name.startswith("_") or list(fields).count(field_name) > 1:
                raise SpecError(fields.item_mark(j), f"types.{name}[{j}]: {field_name!r} cannot be a field of a "
                                "named tuple (a keyword, a leading underscore, or a repeated name)",
                                "rename the field")
    # Names the module's own code uses: the layout modules it imports, its types, torch, NamedTuple, re
    # and its helpers (codegen/runtime/compat_host.py); a leading underscore marks the module's own
    # names (helpers, and the locals _<argument> it computes arguments into).
    module_names = set(layouts) | set(tree["types"]) | {"torch", "NamedTuple", "annotations", "re"}
    constants = tree["constants"]
    for name, value in constants.items():
        if keyword.iskeyword(name) or name in module_names or name in BUILTIN_NAMES:
            raise SpecError(constants.key_mark(name), f"constants: {name!r} is a Python keyword or builtin, or a "
                            "name the generated module uses itself (a layout it imports, a type, torch, re)",
                            "rename it")
        if isinstance(value, str) and value[len("torch."):] not in TORCH_DEFAULTS:
            raise SpecError(constants.value_mark(name), f"constants.{name}: {value} is not one of the torch dtypes "
                            "a constant may be (another torch name could fail the module's import)",
                            f"one of {', '.join(f'torch.{d}' for d in sorted(TORCH_DEFAULTS))}")
    module_names |= set(constants)
    seen_functions: dict = {}
    functions = []
    used_layouts = []
    for i, f in enumerate(tree["functions"]):
        where = f"functions[{i}]"
        layout_name, op = f["call"].split(".", 1)
        layout = layouts.get(layout_name)
        if layout is None:
            raise SpecError(f.value_mark("call"), f"{where}.call: no layout named {layout_name!r}",
                            f"known layouts: {', '.join(sorted(layouts))}")
        base = op[:-4] if op.endswith("_ref") else op
        if base not in layout.ops:
            raise SpecError(f.value_mark("call"), f"{where}.call: layout {layout_name!r} does not generate {base!r}",
                            f"it generates {', '.join(layout.ops)}")
        if f["name"] in seen_functions:
            raise SpecError(f.value_mark("name"), f"{where}.name: a second function named {f['name']!r} (the first is "
                            f"functions[{seen_functions[f['name']]}])", "give each function its own name")
        seen_functions[f["name"]] = i
        if (keyword.iskeyword(f["name"]) or f["name"] in module_names or f["name"] in BUILTIN_NAMES
                or f["name"].startswith("_")):
            raise SpecError(f.value_mark("name"), f"{where}.name: {f['name']!r} is a Python keyword or builtin, or a "
                            "name the generated module uses itself (a layout it imports, a type, torch, re, a name "
                            "starting with _)",
                            "choose another name")
        params = []
        for j, p in enumerate(f["params"]):
            name, _, default = p.partition("=")
            mark = f["params"].item_mark(j)
            if keyword.iskeyword(name) or name in module_names or name.startswith("_"):
                raise SpecError(mark, f"{where}.params[{j}]: {name!r} is a Python keyword or a name the generated module "
                                "uses itself (its own names start with '_')", "rename the parameter")
            if default.startswith("torch.") and default[len("torch."):] not in TORCH_DEFAULTS:
                raise SpecError(mark, f"{where}.params[{j}]: default {default} is not one of the torch dtypes a "
                                "default may be (another torch name could fail the module's import)",
                                f"one of {', '.join(f'torch.{d}' for d in sorted(TORCH_DEFAULTS))}")
            if not default and params and params[-1][1] is not None:
                raise SpecError(mark, f"{where}.params[{j}]: {name!r} has no default but follows a parameter with one",
                                f"give it a default ({name}=None) or move it before {params[-1][0]!r}")
            params.append((name, default or None))
        param_names = [p for p, _ in params]
        if len(set(param_names)) != len(param_names):
            raise SpecError(f.value_mark("params"), f"{where}.params: duplicate parameter", "name each parameter once")
        wanted = op_params(layout, op)
        args = f["args"]
        for k in args:
            if k not in wanted:
                raise SpecError(args.key_mark(k), f"{where}.args: {op} has no parameter {k!r}",
                                f"its parameters are {', '.join(wanted)}")
        missing = [k for k in wanted if k not in args and k not in ("out", "out_dtype")]
        if missing:
            raise SpecError(f.value_mark("args"), f"{where}.args: missing {', '.join(missing)}",
                            f"map every parameter of {op}: {', '.join(wanted)}")
        rendered, derived, renames = [], [], []

        def passed(name: str, local: str, src: str) -> str:
            """The source the call passes for argument `name`: a parameter itself, or a local
            computed from one before the call (errors then name the parameter)."""
            if src == "None":
                return src
            root = _arg_root(src)
            if src != root:
                derived.append((local, src, root))
                renames.append((name, src))
                return local
            if src != name:
                renames.append((name, src))
            return src
        for k in wanted:
            if k not in args:
                continue
            v = args[k]
            if k == "cache":
                if not isinstance(v, dict):
                    raise SpecError(args.value_mark(k), f"{where}.args.cache: expected a mapping of buffer field to "
                                    "parameter", f"fields: {', '.join(n for n, _, _ in layout.cache_fields)}")
                fields = [n for n, _, _ in layout.cache_fields]
                if sorted(v) != sorted(fields):
                    raise SpecError(args.value_mark(k), f"{where}.args.cache: must map exactly {', '.join(fields)}",
                                    "add the missing fields / remove the unknown ones")
                for fk, fv in v.items():
                    _check_arg(fv, param_names, v.value_mark(fk), f"{where}.args.cache.{fk}")
                src = f"{layout_name}.Cache(" + ", ".join(f"{fk}={passed(f'cache.{fk}', f'_{fk}', v[fk])}"
                                                           for fk in fields) + ")"
            else:
                if isinstance(v, dict):
                    raise SpecError(args.value_mark(k), f"{where}.args.{k}: expected a parameter expression",
                                    "write a parameter name such as 'x'")
                _check_arg(v, param_names, args.value_mark(k), f"{where}.args.{k}")
                src = passed(k, f"_{k}", v)
            rendered.append((k, src))
        if "cache" in args:         # the op's errors point to the layout module's allocators, which this one lacks
            renames += [(helper, f"{layout_name}.{helper}") for helper in ("alloc_cache", "cache_shapes")]
        if f["raw_cache"] and "cache" not in wanted:
            raise SpecError(f.key_mark("raw_cache"), f"{where}.raw_cache: {op} takes no cache",
                            "remove raw_cache: (it is how the cache tensors of a writer or reader are passed)")
        size_from = re.match(r"([a-z_][a-z0-9_]*)\.shape\[", str(args.get("page_size", "")))
        if f["raw_cache"] and size_from and size_from.group(1) in args["cache"].values():
            raise SpecError(f.key_mark("raw_cache"), f"{where}.raw_cache: page_size is read off the cache tensor "
                            f"{size_from.group(1)}'s shape, which a RawCache's token-major or flat tensor does not "
                            "hold (its shape[1] would be the head count)",
                            "remove raw_cache: or pass page_size as a parameter")
        if f["returns"] is not None and f["returns"] not in dict(types):
            raise SpecError(f.value_mark("returns"), f"{where}.returns: unknown type {f['returns']!r}",
                            "declare it under 'types:'")
        require = f["require"]
        for p in require:
            if p not in param_names:
                raise SpecError(require.key_mark(p), f"{where}.require: {p!r} is not a parameter of this function",
                                f"parameters: {', '.join(param_names)}")
        trim = f["trim"]
        for p, counter in trim.items():
            if p not in param_names:
                raise SpecError(trim.key_mark(p), f"{where}.trim: {p!r} is not a parameter of this function",
                                f"parameters: {', '.join(param_names)}")
            if counter not in param_names or counter == p:
                raise SpecError(trim.value_mark(p), f"{where}.trim.{p}: {counter!r} is not another parameter of this "
                                "function (the one whose length counts the tokens)",
                                f"parameters: {', '.join(n for n in param_names if n != p)}")
        # (a trimmed parameter is used only if it is passed on: trim: drops rows of what is passed)
        used = ({_arg_root(src) for k, v in args.items() for src in (v.values() if isinstance(v, dict) else (v,))}
                | set(require) | set(trim.values()) | {p for case in f["cases"] for p in case["when"]})
        unused = f["unused"]
        for j, name in enumerate(unused):
            if name not in param_names or name in used or name in unused[:j]:
                raise SpecError(unused.item_mark(j), f"{where}.unused[{j}]: {name!r} is " + (
                    "not a parameter of this function" if name not in param_names else "listed twice"
                    if name in unused[:j] else "used (passed on, required, a trim's counter, or a case's)"),
                    f"list only parameters the function ignores (parameters: {', '.join(param_names)})")
        for j, name in enumerate(param_names):
            if name not in used and name not in unused:      # a caller's value would be silently ignored
                raise SpecError(f["params"].item_mark(j), f"{where}.params[{j}]: {name!r} is never used: no "
                                f"argument of {op} is taken from it, nor is it required, a trim's counter or a case's",
                                f"pass it on under args: (to one of {op}'s parameters: {', '.join(wanted)}), give "
                                "it a require:, or, if the seed ignores it too, list it under unused:")
        function = CompatFunction(name=f["name"], doc=f["doc"], params=tuple(params), layout=layout_name,
                                  op=op, args=tuple(rendered), returns=f["returns"],
                                  require=tuple((p, tuple(v)) for p, v in require.items()),
                                  trim=tuple(trim.items()),
                                  derived=tuple(derived), renames=tuple(renames), raw_cache=f["raw_cache"],
                                  page_size_from=(size_from.group(1), args["page_size"]) if size_from else None)
        cases = _compat_cases(f, where, function, layouts, param_names)
        functions.append(dataclasses.replace(function, cases=cases))
        for name in (layout_name, *(case.layout for _, _, case in cases)):
            if name not in used_layouts:
                used_layouts.append(name)
    return Compat(name=tree["compat"], summary=tree["summary"], seed=tree["seed"], spec_path=display,
                  spec_sha256=digest, layouts=tuple(sorted(used_layouts)), types=types, functions=tuple(functions),
                  constants=tuple(constants.items()))


def _compat_cases(f, where: str, function: CompatFunction, layouts: dict, param_names: list) -> tuple:
    """A function's cases: ((parameter, values, the function calling the case's layout), ...). All
    match one parameter, each value once, so the order of the cases never matters; a value a case
    matches must be one require: lets through (_case_values). Each case's layout must take the call
    as written (_case_layout)."""
    out, taken = [], {}
    for i, case in enumerate(f["cases"]):
        at = f"{where}.cases[{i}]"
        when = case["when"]
        if len(when) != 1:
            raise SpecError(case.value_mark("when"), f"{at}.when: one parameter per case, got {', '.join(when)}",
                            "match one parameter in every case of the function")
        (param, values), = when.items()
        if param not in param_names:
            raise SpecError(when.key_mark(param), f"{at}.when: {param!r} is not a parameter of this function",
                            f"parameters: {', '.join(param_names)}")
        first = next(iter(f["cases"][0]["when"]))
        if param != first:
            raise SpecError(when.key_mark(param), f"{at}.when: matches {param!r}, cases[0] matches {first!r}",
                            f"match {first!r} in every case of the function (one parameter picks the layout)")
        _case_values(f"{at}.when.{param}", f"cases[{i}].when.{param}", values, dict(function.require).get(param), taken)
        other = _case_layout(at, case, function, layouts)
        out.append((param, tuple(values), _called_on(function, other.name)))
    return tuple(out)


def _case_values(at: str, label: str, values, allowed, taken: dict) -> None:
    """A case's values: each let through by require: (`allowed`, None: any) and matched once (`taken`:
    the values earlier cases match, by their place)."""
    for k, value in enumerate(values):
        mark = values.item_mark(k)
        if allowed is not None and value not in allowed:
            raise SpecError(mark, f"{at}[{k}]: {value!r} is refused by require: before any case is tried",
                            f"add it to require.{at.rsplit('.', 1)[1]} or remove it here")
        if repr(value) in taken:
            raise SpecError(mark, f"{at}[{k}]: {value!r} is also matched by {taken[repr(value)]}",
                            "match each value once")
        taken[repr(value)] = f"{label}[{k}]"


def _case_layout(at: str, case, function: CompatFunction, layouts: dict):
    """The layout a case calls, which must take the function's call as written: another layout that
    generates the op, with the same planes (as many results), op parameters and Cache fields."""
    layout = layouts[function.layout]
    base = function.op[:-4] if function.op.endswith("_ref") else function.op
    other = layouts.get(case["layout"])
    mark = case.value_mark("layout")
    if other is None:
        raise SpecError(mark, f"{at}.layout: no layout named {case['layout']!r}",
                        f"known layouts: {', '.join(sorted(layouts))}")
    if other.name == layout.name:
        raise SpecError(mark, f"{at}.layout: {other.name!r} is call:'s own layout",
                        "name another layout, or remove the case")
    if base not in other.ops:
        raise SpecError(mark, f"{at}.layout: {other.name!r} does not generate {base!r}",
                        f"it generates {', '.join(other.ops)}")
    if tuple(other.planes) != tuple(layout.planes):
        raise SpecError(mark, f"{at}.layout: {other.name}'s planes are {', '.join(other.planes)}, not "
                        f"{', '.join(layout.planes)}", "name a layout of the same planes")
    if op_params(other, function.op) != op_params(layout, function.op):
        raise SpecError(mark, f"{at}.layout: {other.name}.{base} takes ({', '.join(op_params(other, function.op))}), "
                        f"not call:'s ({', '.join(op_params(layout, function.op))})",
                        "name a layout whose op takes the same arguments")
    fields = [n for n, _, _ in layout.cache_fields]
    if "cache" in dict(function.args) and [n for n, _, _ in other.cache_fields] != fields:
        raise SpecError(mark, f"{at}.layout: {other.name}'s Cache has the fields "
                        f"({', '.join(n for n, _, _ in other.cache_fields)}), not ({', '.join(fields)})",
                        "name a layout whose cache has the same buffers")
    return other


def _called_on(function: CompatFunction, other: str) -> CompatFunction:
    """The function calling the same op of layout `other`: its Cache and allocator names are other's."""
    def moved(src: str) -> str:
        return re.sub(rf"^{function.layout}\.", f"{other}.", src)
    return dataclasses.replace(function, layout=other, args=tuple((k, moved(v)) for k, v in function.args),
                               renames=tuple((k, moved(v)) for k, v in function.renames))


def _arg_root(src: str) -> str | None:
    """The parameter an argument expression reads ('k' of 'k.shape[1]'); None for the literal None."""
    return None if src == "None" else re.match(r"[a-z_][a-z0-9_]*", src).group(0)


def _check_arg(src: str, params, mark, where):
    if src == "None":
        return
    root = _arg_root(src)
    if root not in params:
        raise SpecError(mark, f"{where}: {root!r} is not a parameter of this function",
                        f"parameters: {', '.join(params)}")
