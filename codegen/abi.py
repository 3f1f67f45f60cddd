"""`kvlayout diff --against REF`: the layout ABI change of every spec between a git revision and the
working tree, each change classified as buf's `breaking` does.

A cache written by one layout must be readable by the other: every fact that places or decodes a
byte (planes, record parts and their element formats, buffers, regions, offsets, strides, page
bytes, scale formats and groups, a global scale, the sink, the heads and values taken) is compared
at concrete sizes (padded page bytes at every page size of a period of the padding), and any
difference is breaking; so is a change in what callers pass by position (the Cache's fields, an op's
parameters, call-time scales among them) or a heads/values default dropped. What only changes how
new bytes are chosen (a scale rule, its floors, exponent range, rounding or NaN handling) is
compatible: old caches still read the same. So are new specs and new ops; a removed spec or op, or a
compat function removed, breaks its callers. The revision's specs are read from the spec folders its
own config names (the working tree's config file as the revision has it; a symlink along a folder's
path followed in the revision's tree, not in today's), so specs moved to another folder are
compared, not taken for new ones; where the revision has no such config, from the working tree's
folders (layouts of a folder the revision lacks then count as added).
"""
from __future__ import annotations

import math
import posixpath
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import config, explain, model, pipeline
from .errors import Mark
from .formats import fp32_value
from .model import HEADS, PAGE_SIZE, VALUES

# Facts of a scale group that only steer the quantizer (old caches decode the same).
ENCODE_ONLY = ("rule", "amax_floor", "scale_floor", "exponents", "rounding", "nan")

# Page sizes the padded page bytes are compared at: the first this many multiples of both layouts'
# page-size step (padding repeats with a period of at most the lcm of the two aligns).
PADDING_SCAN = 4096


class GitError(Exception):
    """The revision or its files could not be read; ``str(err)`` is one line for the user."""


@dataclass(frozen=True)
class Change:
    spec: str                 # the spec's path, as in the working tree (or the revision, if removed)
    breaking: bool
    what: str                 # one line

    def render(self) -> str:
        return f"{self.spec}: {'breaking' if self.breaking else 'compatible'}: {self.what}"


def _git(root: Path, *args) -> str:
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if proc.returncode:
        raise GitError(f"git {' '.join(args)}: {proc.stderr.strip() or 'failed'}")
    return proc.stdout


def checkout_specs(project: config.Project, ref: str, into: Path) -> config.Project:
    """Write the spec folders of `ref` into `into`; returns that copy's Project."""
    try:
        top = Path(_git(project.root, "rev-parse", "--show-toplevel").strip())
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    try:
        _git(project.root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except GitError:
        raise GitError(f"--against {ref}: not a revision of {top}") from None
    folders = _spec_folders_at(project, top, ref, into)
    root = project.root.resolve()
    if not root.is_relative_to(top.resolve()):
        raise GitError(f"the project {root}: outside the git repository {top}")
    for folder in folders:
        # the folder as the revision's tree has it: a symlink there is followed in that tree, and one
        # in the working tree (an old name left pointing at a renamed folder) is not
        rel = _resolve_at(top, ref, posixpath.normpath(posixpath.join(root.relative_to(top.resolve()).as_posix(), folder)))
        for name in _git(top, "ls-tree", "-r", "-z", "--name-only", ref, "--", rel).split("\0"):
            if not name:
                continue
            inner = Path(name).relative_to(rel)
            if inner.suffix != ".yaml" or len(inner.parts) > 2 or (len(inner.parts) == 2 and inner.parts[0] != "compat"):
                continue
            shown = subprocess.run(["git", "-C", str(top), "show", f"{ref}:{name}"], capture_output=True)
            if shown.returncode:
                raise GitError(f"git show {ref}:{name}: {shown.stderr.decode(errors='replace').strip() or 'failed'}")
            data = shown.stdout
            target = into / folder / inner
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return config.Project(root=into, config=into / config.CONFIG_FILE, specs=folders, output=project.output,
                          package=project.package)


def _resolve_at(top: Path, ref: str, rel: str) -> str:
    """A repository path with the symlinks of `ref`'s tree along it followed (a folder committed as a
    link to another): GitError where one leads outside the repository or round in a loop."""
    parts, done, hops = list(PurePosixPath(rel).parts), [], 0
    while parts:
        here = posixpath.join(*done, parts[0])
        if _git(top, "ls-tree", ref, "--", here).startswith("120000 "):
            hops += 1
            target = _git(top, "show", f"{ref}:{here}")
            joined = posixpath.normpath(posixpath.join(*done, target)) if done else posixpath.normpath(target)
            if hops > 40 or posixpath.isabs(target) or joined == ".." or joined.startswith("../"):
                raise GitError(f"spec folder {rel}: at {ref}, {here} is a symlink to {target}, which leads "
                               f"{'round in a loop' if hops > 40 else 'outside the git repository'}")
            parts, done = [p for p in PurePosixPath(joined).parts if p != "."] + parts[1:], []
            continue
        done.append(parts.pop(0))
    return posixpath.join(*done) if done else "."


def _spec_folders_at(project: config.Project, top: Path, ref: str, into: Path) -> tuple:
    """The spec folders `ref` kept its specs in: those its own config names (in the working tree's
    config folder: a --config file's own name, then, as config_in looks, kvlayout.toml, else a
    pyproject.toml with the table), so that specs moved to another folder since are compared, not
    taken for new ones; the working tree's folders where ref has no config there."""
    try:
        folder = project.config.resolve().parent.relative_to(top.resolve()).as_posix()
    except ValueError:                       # a config outside the repository: no revision of it
        return project.specs
    standard = (config.CONFIG_FILE, config.PYPROJECT)
    for name in ((project.config.name,) if project.config.name not in standard else ()) + standard:
        rel = name if folder == "." else f"{folder}/{name}"
        shown = subprocess.run(["git", "-C", str(top), "show", f"{ref}:{rel}"], capture_output=True)
        if shown.returncode:
            continue
        copy = into / ".config-at-ref" / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(shown.stdout)
        try:
            folders = config.spec_folders(copy, config.read_table(copy))
        except config.ConfigError as err:    # in terms of the revision's file
            text = str(err).replace(str(copy), f"{ref}:{rel}").replace(str(copy.parent), f"{ref}:{folder}")
            raise GitError(text) from None
        finally:
            copy.unlink()
        if folders is not None:
            return folders
    return project.specs


def _sizes(layout) -> list:
    """The sizes a layout is compared at: its explain defaults, then twice the page (and 3 heads,
    where heads are free), then (where values are free) another value count it takes."""
    base = explain.default_sizes(layout)
    other = {**base, PAGE_SIZE: 2 * base[PAGE_SIZE]}
    if not layout.heads.is_const:
        other[HEADS] = 3
    sizes = [base, other]
    if not layout.values.is_const:
        v = base[VALUES]
        sizes += [s for s in ({**base, VALUES: n} for n in (2 * v, v // 2, 3 * v) if n) if explain.accepts(layout, s)][:1]
    return sizes


def _takes(layout, sizes: dict) -> bool:
    """Whether a cache of these sizes is one of the layout's: its checks pass and its fixed counts match."""
    return (explain.accepts(layout, sizes) and all(n.const_value() == sizes[key] for n, key in
                                                   ((layout.heads, HEADS), (layout.values, VALUES)) if n.is_const))


def facts(layout, sizes: dict) -> dict:
    """{fact: value} of one layout at concrete sizes, flat, keyed by names (not positions)."""
    m = explain.page_map(layout, sizes)
    out = {"planes": m["planes"], "sink": m["sink"], "record bytes per token and head": m["record_bytes"],
           "quantize_store inputs": [(s.name, s.plane, s.first, s.width.evaluate(sizes)) for s in layout.inputs]}
    for p in m["record"]:
        label = f"record {p['kind']} {p['name']}" + (f" at byte {p['start']}" if p["kind"] == "pad" else "")
        out[label] = {k: v for k, v in p.items() if k not in ("kind", "name")}
    for g in m["scales"]:
        for k, v in g.items():
            if k != "name":
                out[f"scale group {g['name']}: {k}"] = v
    for b in m["buffers"]:
        out[f"buffer {b['name']}: page bytes"] = b["page_bytes"]
        out[f"buffer {b['name']}: allocation"] = [b["shape"], b["dtype"]]
        for r in b["regions"]:
            region = {k: v for k, v in r.items() if k != "holds"}
            # a dim of one entry places no byte by its stride (a fixed heads: 1 in any order)
            region["strides"] = {d: n for d, n in r["strides"].items() if r["dims"].get(d) != 1}
            out[f"buffer {b['name']}: {r['holds']} region"] = region
    return _flat(out)


def _flat(facts: dict, prefix: str = "") -> dict:
    """Nested mappings as one level of keys ("buffer cache: nope region: dims: scale"), so each change
    is reported on its own."""
    out = {}
    for key, value in facts.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}: "))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _show(value) -> str:
    """A fact as the spec would write it: an fp32 value (a floor) by its shortest decimal, 1e-06
    rather than 9.999999974752427e-07."""
    if isinstance(value, float) and math.isfinite(value) and fp32_value(value) == value:
        return next(text for digits in range(1, 10) if fp32_value(float(text := f"{value:.{digits}g}")) == value)
    return str(value)


def _at(sizes: dict) -> str:
    return f"page_size={sizes[PAGE_SIZE]}, heads={sizes[HEADS]}, values={sizes[VALUES]}"


def compare_layout(old, new) -> list:
    changes, seen = [], set()
    spec = new.spec_path
    for op in old.ops:
        if op not in new.ops:
            changes.append(Change(spec, True, f"op {op} removed (its callers break)"))
    for op in new.ops:
        if op not in old.ops:
            changes.append(Change(spec, False, f"op {op} added"))
    changes += _call_changes(old, new)
    if old.page_size_multiple % new.page_size_multiple:
        changes.append(Change(spec, True, f"page sizes: a multiple of {old.page_size_multiple} -> of "
                                          f"{new.page_size_multiple} (some pages the old layout took are refused)"))
    elif new.page_size_multiple != old.page_size_multiple:
        changes.append(Change(spec, False, f"page sizes: a multiple of {old.page_size_multiple} -> of {new.page_size_multiple}"))
    compared = 0
    for sizes in _sizes(old) + _sizes(new):
        # heads or values the old layout took and the new one refuses, at a page size both take (a
        # page-size change is reported above)
        paged = {**sizes, PAGE_SIZE: math.lcm(sizes[PAGE_SIZE], new.page_size_multiple)}
        if _takes(old, paged) and not _takes(new, paged) and "sizes" not in seen:
            seen.add("sizes")
            changes.append(Change(spec, True, f"{_at(paged)}: taken by the old layout, refused by the new (such "
                                              "caches become unreadable)"))
        if not (_takes(old, sizes) and _takes(new, sizes)):
            continue                     # sizes one of the two refuses
        compared += 1
        a, b = facts(old, sizes), facts(new, sizes)
        for key in sorted(set(a) | set(b), key=lambda k: (k not in a, k not in b, k)):
            if a.get(key) == b.get(key) or key in seen:
                continue
            seen.add(key)
            encode_only = key.startswith("scale group ") and key.split(": ")[1] in ENCODE_ONLY
            if encode_only and (key not in a or key not in b):
                continue                 # a group added or removed: its stored facts say so, as breaking
            if key not in a:
                what = f"{key}: added {_show(b[key])}"
            elif key not in b:
                what = f"{key}: removed (was {_show(a[key])})"
            else:
                what = f"{key}: {_show(a[key])} -> {_show(b[key])}"
            changes.append(Change(spec, not encode_only, f"{what} (at {_at(sizes)})" if not encode_only else
                                  f"{what} (new writes differ; caches written before read the same)"))
    if compared and old.page_align * new.page_align > 1:
        changes += _padding_changes(old, new, seen)
    if not compared:
        changes.append(Change(spec, True, "no sizes that both layouts accept (e.g. the head or value counts they "
                                          "allow differ): no cache of one is a cache of the other"))
    return changes


def _call_changes(old, new) -> list:
    """What callers pass by position: the Cache's fields in order (a plain tuple, the torch operators),
    each kept op's parameters in order (call-time scales among them), and alloc_cache/cache_shapes'
    heads and values defaults. Reordered, renamed or newly required, they break callers: a scale
    or a buffer passed by position would be read as another of the same shape."""
    spec, changes = new.spec_path, []
    was, now = [f for f, _, _ in old.cache_fields], [f for f, _, _ in new.cache_fields]
    if was != now:
        changes.append(Change(spec, True, f"Cache fields ({', '.join(was)}) -> ({', '.join(now)}) (a cache passed "
                                          "as a plain tuple or to the torch operators is read by position)"))
    for op in (op for op in old.ops if op in new.ops):
        was, now = model.op_params(old, op), model.op_params(new, op)
        if was != now:
            changes.append(Change(spec, True, f"{op}: parameters ({', '.join(was)}) -> ({', '.join(now)})"))
    for dim, a, b in (("heads", old.heads, new.heads), ("values", old.values, new.values)):
        if a.is_const and not b.is_const:
            changes.append(Change(spec, True, f"alloc_cache, cache_shapes: {dim} has no default any more (was "
                                              f"{a.const_value()}; callers that leave it out break)"))
    return changes


def _padding_changes(old, new, seen: set) -> list:
    """A buffer's page bytes at the first page size, of those both layouts take, where padding makes
    them differ (page.align 64 -> 128 leaves 64-slot pages of 656-byte records alone, not 3-slot ones)."""
    step = math.lcm(old.page_size_multiple, new.page_size_multiple)
    sizes = explain.default_sizes(old)
    shared = [(a, b) for a in old.buffers for b in new.buffers if a.name == b.name]
    for k in range(1, min(math.lcm(old.page_align, new.page_align), PADDING_SCAN) + 1):
        at = {**sizes, PAGE_SIZE: k * step}
        if not (_takes(old, at) and _takes(new, at)):
            continue
        for a, b in shared:
            key = f"buffer {a.name}: page bytes"
            was, now = a.page_bytes.evaluate(at), b.page_bytes.evaluate(at)
            if was != now and key not in seen:
                seen.add(key)
                return [Change(new.spec_path, True, f"{key}: {was} -> {now} (at {_at(at)}; page.align "
                                                    f"{old.page_align} -> {new.page_align})")]
    return []


def compare_compat(old, new) -> list:
    """A compat module's calls: a function removed, a parameter removed, renamed, moved or added
    without a default, a default dropped or changed, another return type, another layout op called,
    or a type's fields changed break callers; new functions and defaulted parameters do not."""
    spec, changes = new.spec_path, []
    was_types, now_types = dict(old.types), dict(new.types)
    for name in sorted(set(was_types) | set(now_types)):
        if name not in now_types:
            changes.append(Change(spec, True, f"type {name} removed"))
        elif name not in was_types:
            changes.append(Change(spec, False, f"type {name} added"))
        elif tuple(was_types[name]) != tuple(now_types[name]):
            changes.append(Change(spec, True, f"type {name}: fields {list(was_types[name])} -> {list(now_types[name])}"))
    was = {f.name: f for f in old.functions}
    now = {f.name: f for f in new.functions}
    for name in sorted(set(was) | set(now)):
        if name not in now:
            changes.append(Change(spec, True, f"function {name} removed (its callers break)"))
            continue
        if name not in was:
            changes.append(Change(spec, False, f"function {name} added"))
            continue
        a, b = was[name], now[name]
        before, after = dict(a.params), dict(b.params)
        names_a, names_b = [p for p, _ in a.params], [p for p, _ in b.params]
        if names_b[: len(names_a)] != names_a:
            changes.append(Change(spec, True, f"function {name}: parameters ({', '.join(names_a)}) -> ({', '.join(names_b)})"))
        else:
            for p in names_b[len(names_a):]:
                changes.append(Change(spec, after[p] is None, f"function {name}: parameter {p} added"
                                      + (" without a default" if after[p] is None else f" (default {after[p]})")))
            for p in names_a:
                if before[p] != after[p] and before[p] is not None:
                    what = "dropped" if after[p] is None else f"{before[p]} -> {after[p]}"
                    changes.append(Change(spec, True, f"function {name}: default of {p}: {what}"))
                elif before[p] != after[p]:
                    changes.append(Change(spec, False, f"function {name}: parameter {p} gets the default {after[p]}"))
        if a.returns != b.returns:
            changes.append(Change(spec, True, f"function {name}: returns {a.returns or 'the op result'} -> "
                                  f"{b.returns or 'the op result'}"))
        if (a.layout, a.op) != (b.layout, b.op):
            changes.append(Change(spec, True, f"function {name}: calls {a.layout}.{a.op} -> {b.layout}.{b.op}"))
        was_req, now_req = dict(a.require), dict(b.require)
        for p in sorted(set(was_req) | set(now_req)):
            before_ok, after_ok = was_req.get(p), now_req.get(p)
            if after_ok is not None and (before_ok is None or set(before_ok) - set(after_ok)):
                changes.append(Change(spec, True, f"function {name}: {p} now takes only {list(after_ok)} "
                                      f"(was {list(before_ok) if before_ok is not None else 'any value'})"))
            elif before_ok != after_ok:
                changes.append(Change(spec, False, f"function {name}: {p} takes "
                                      f"{list(after_ok) if after_ok is not None else 'any value'} (was {list(before_ok)})"))
        changes += _case_changes(spec, name, a, b)
        if a.raw_cache != b.raw_cache:
            changes.append(Change(spec, a.raw_cache, f"function {name}: "
                                  + ("flat and token-major cache tensors refused (raw_cache dropped)" if a.raw_cache
                                     else "flat and token-major cache tensors taken (raw_cache)")))
        if a.args != b.args:
            changes.append(Change(spec, True, f"function {name}: the op's arguments {dict(a.args)} -> {dict(b.args)}"))
    return changes


def _case_changes(spec: str, name: str, a, b) -> list:
    """A value both functions take (require:) that now reaches another layout's op (cases:) breaks
    callers: their caches get another scale rule or placement."""
    def target(f, param, value):
        allowed = dict(f.require).get(param)
        if allowed is not None and value not in allowed:
            return None                      # refused: require:'s change says so
        return next((case.layout for p, values, case in f.cases if p == param and value in values), f.layout)
    changes = []
    matched = dict.fromkeys((p, v) for f in (a, b) for p, values, _ in f.cases for v in values)
    for param, value in matched:
        was, now = target(a, param, value), target(b, param, value)
        if was is not None and now is not None and was != now:
            changes.append(Change(spec, True, f"function {name}: where {param} is {value!r}, calls {was}.{a.op} -> "
                                              f"{now}.{b.op}"))
    return changes


def diff(project: config.Project, ref: str) -> list:
    """Every ABI change from `ref`'s specs to the working tree's. Raises GitError, or
    pipeline.SpecErrors for specs (of either side) that do not build."""
    new_layouts, new_compats = pipeline.build_all(project)
    with tempfile.TemporaryDirectory(prefix="kvlayout-diff-") as tmp:
        old_project = checkout_specs(project, ref, Path(tmp))
        try:
            old_layouts, old_compats = pipeline.build_all(old_project, earlier=True)
        except pipeline.SpecErrors as exc:
            for err in exc.errors:           # name the revision's files as ref:path
                for p in err.problems:
                    if p.mark is not None:
                        p.mark = Mark(f"{ref}:{p.mark.path}", p.mark.line, p.mark.col)
            raise
    changes = []
    for name in sorted(set(old_layouts) | set(new_layouts)):
        if name not in new_layouts:
            changes.append(Change(old_layouts[name].spec_path, True, f"layout {name} removed"))
        elif name not in old_layouts:
            changes.append(Change(new_layouts[name].spec_path, False, f"layout {name} added"))
        else:
            changes += compare_layout(old_layouts[name], new_layouts[name])
    for name in sorted(set(old_compats) | set(new_compats)):
        if name not in new_compats:
            changes.append(Change(old_compats[name].spec_path, True, f"compat module {name} removed"))
        elif name not in old_compats:
            changes.append(Change(new_compats[name].spec_path, False, f"compat module {name} added"))
        else:
            changes += compare_compat(old_compats[name], new_compats[name])
    return changes
