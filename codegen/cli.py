"""The kvlayout command line: generate, check, explain (and bench on a GPU machine)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import explain as explain_mod
from . import pipeline, writer
from .errors import SpecError
from .model import HEADS, PAGE_SIZE, VALUES

# Exit codes (README): 0 ok; 1 check found drift; 2 a bad spec (or usage); 3 a file could not be read or
# written (nothing was written); 4 an internal error (a bug in kvlayout; never reported as drift).
EXIT_OK, EXIT_DRIFT, EXIT_BAD_SPEC, EXIT_IO, EXIT_INTERNAL = 0, 1, 2, 3, 4


def find_root(start: Path) -> Path:
    for candidate in (start, *start.parents):
        if (candidate / "specs").is_dir() and (candidate / "codegen").is_dir():
            return candidate
    return Path(__file__).resolve().parent.parent


def _report(errors) -> int:
    for err in errors:
        print(err.render(), file=sys.stderr)
    return EXIT_BAD_SPEC


def cmd_generate(args, root: Path) -> int:
    start = time.perf_counter()
    with writer.locked(root):               # runs on one root take turns, from reading the specs on
        try:
            files = pipeline.render_all(root, args.specs or None)
        except pipeline.SpecErrors as exc:
            print("kvlayout generate: nothing written", file=sys.stderr)
            return _report(exc.errors)
        try:
            written, removed = writer.write(root, files, remove_orphans=not args.specs)
        except writer.WriteError as err:
            print(f"kvlayout generate: {err}", file=sys.stderr)
            return EXIT_IO
    for rel in written:
        print(f"wrote {rel}")
    for rel in removed:
        print(f"removed {rel}")
    print(f"{len(files)} files, {len(written)} written, {len(removed)} removed in {time.perf_counter() - start:.2f} s")
    return EXIT_OK


def cmd_check(args, root: Path) -> int:
    try:
        files = pipeline.render_all(root)
    except pipeline.SpecErrors as exc:
        return _report(exc.errors)
    diffs = writer.drift(root, files)
    if diffs:
        for d in diffs:
            sys.stdout.write(d if d.endswith("\n") else d + "\n")
        print(f"kvlayout check: {len(diffs)} file(s) under generated/ differ from specs/; run `kvlayout generate`",
              file=sys.stderr)
        return EXIT_DRIFT
    print(f"kvlayout check: {len(files)} generated files match specs/")
    return EXIT_OK


def cmd_explain(args, root: Path) -> int:
    try:
        layouts, _ = pipeline.build_all(root, [args.spec])
    except pipeline.SpecErrors as exc:
        return _report(exc.errors)
    if not layouts:
        print(f"kvlayout explain: {args.spec} is not a layout spec", file=sys.stderr)
        return EXIT_BAD_SPEC
    layout = next(iter(layouts.values()))
    sizes = explain_mod.default_sizes(layout)
    for key, value in ((PAGE_SIZE, args.page_size), (HEADS, args.heads), (VALUES, args.values)):
        if value is not None:
            if value < 1:
                print(f"kvlayout explain: --{key.replace('_', '-')} must be at least 1, got {value}", file=sys.stderr)
                return EXIT_BAD_SPEC
            sizes[key] = value
    try:
        text = explain_mod.explain(layout, sizes)
    except ValueError as exc:
        print(f"kvlayout explain: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    sys.stdout.write(text)
    return EXIT_OK


def cmd_bench(args, root: Path) -> int:
    if args.rest[:1] == ["--host"]:     # host time per eager call, the seeds side by side
        from bench import host as bench_host
        return bench_host.main(args.rest[1:])
    from bench import run as bench_run  # GPU only; imports torch and the generated modules
    return bench_run.main(args.rest)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvlayout", description="Generate Triton kernels for quantized paged KV caches.")
    p.add_argument("--root", type=Path, help="repository root (default: found from the current directory)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="regenerate generated/ from specs/ (writes only what changed)")
    g.add_argument("specs", nargs="*", help="only these spec files (no orphan removal)")
    sub.add_parser("check", help="exit 1 with a diff if generated/ differs from specs/")
    e = sub.add_parser("explain", help="print the resolved byte map of one layout")
    e.add_argument("spec")
    e.add_argument("--page-size", type=int)
    e.add_argument("--heads", type=int)
    e.add_argument("--values", type=int)
    sub.add_parser("bench", help="benchmark every spec x op on the GPU (options: python -m bench.run --help; "
                   "--host first: host time per eager call, python -m bench.host --help)")
    return p


def _verb_index(argv) -> int | None:
    """Index of the command word, skipping the global options before it."""
    i = 0
    while i < len(argv):
        if argv[i] == "--root":
            i += 2
        elif argv[i].startswith("-"):
            i += 1
        else:
            return i
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = _verb_index(argv)
    if verb is not None and argv[verb] == "bench":  # the rest belongs to bench/run.py's own parser
        args = parser().parse_args(argv[: verb + 1])
        args.rest = argv[verb + 1:]
    else:
        args = parser().parse_args(argv)
    root = (args.root or find_root(Path.cwd())).resolve()
    handler = {"generate": cmd_generate, "check": cmd_check, "explain": cmd_explain, "bench": cmd_bench}[args.command]
    try:
        return handler(args, root)
    except SpecError as err:  # a spec problem found outside build_all
        return _report([err])
    except OSError as err:    # a file that could not be read (writes are reported by cmd_generate)
        print(f"kvlayout {args.command}: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return EXIT_IO
    except Exception:         # a bug: say so, with the traceback, under its own exit code (never drift's 1)
        import traceback
        traceback.print_exc()
        print(f"kvlayout {args.command}: internal error (a bug in kvlayout; please report it)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
