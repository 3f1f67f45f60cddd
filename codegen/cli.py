"""The kvlayout command line: generate, check, lint, explain (and bench on a GPU machine)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import explain as explain_mod
from . import pipeline, writer
from .errors import SpecError
from .model import HEADS, PAGE_SIZE, VALUES

# Exit codes (README): 0 ok; 1 check found drift; 2 a bad spec; 3 a file could not be read or written
# (nothing was written); 4 bad usage or an internal error (a bug in kvlayout; never reported as drift).
EXIT_OK, EXIT_DRIFT, EXIT_BAD_SPEC, EXIT_IO, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_USAGE = EXIT_INTERNAL
FORMATS = ("text", "json", "github")


def find_root(start: Path) -> Path:
    for candidate in (start, *start.parents):
        if (candidate / "specs").is_dir() and (candidate / "codegen").is_dir():
            return candidate
    return Path(__file__).resolve().parent.parent


def _problems(errors) -> list:
    return [p for err in errors for p in err.problems]


def _report(errors, form: str = "text") -> int:
    """Print every problem of the failing specs: text lines on stderr (path:line:col: message (fix:
    ...)); or, on stdout, one JSON list, or GitHub Actions error annotations."""
    problems = _problems(errors)
    if form == "json":
        print(json.dumps([{"file": p.mark.path if p.mark else None, "line": p.mark.line if p.mark else None,
                           "col": p.mark.col if p.mark else None, "message": p.message, "fix": p.fix}
                          for p in problems], indent=1))
    elif form == "github":
        for p in problems:
            where = f"file={p.mark.path},line={p.mark.line},col={p.mark.col}," if p.mark else ""
            text = f"{p.message} (fix: {p.fix})" if p.fix else p.message
            print(f"::error {where}title=kvlayout::{text.replace('%', '%25').replace(chr(10), '%0A')}")
    else:
        for err in errors:
            print(err.render(), file=sys.stderr)
    return EXIT_BAD_SPEC


def cmd_lint(args, root: Path) -> int:
    """Validate specs (all of them, or the ones named) without rendering or writing anything."""
    try:
        layouts, compats = pipeline.build_all(root, args.specs or None)
    except pipeline.SpecErrors as exc:
        return _report(exc.errors, args.format)
    count = len(layouts) + len(compats)
    if args.format == "json":
        print("[]")
    elif args.format == "text":
        print(f"kvlayout lint: {count} spec(s) OK")
    return EXIT_OK


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
    wanted = pipeline.resolve(root, args.spec)
    layout = next((m for m in layouts.values() if (root / m.spec_path) == wanted), None)
    if layout is None:       # a compat spec (build_all also built the layouts it calls)
        print(f"kvlayout explain: {args.spec} is not a layout spec (explain the layouts a compat spec calls)",
              file=sys.stderr)
        return EXIT_BAD_SPEC

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


class _Parser(argparse.ArgumentParser):
    """argparse with kvlayout's usage exit code (argparse's own 2 is a bad spec's here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _version() -> str:
    from importlib import metadata
    try:
        return metadata.version("kvlayout")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvlayout", description="Generate Triton kernels for quantized paged KV caches.")
    p.add_argument("--version", action="version", version=f"kvlayout {_version()}")
    root_help = "repository root (default: found from the current directory)"
    p.add_argument("--root", type=Path, help=root_help)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def verb(name, **kwargs):
        v = sub.add_parser(name, **kwargs)
        v.add_argument("--root", type=Path, default=argparse.SUPPRESS, help=root_help)   # after the verb too
        return v

    g = verb("generate", help="regenerate generated/ from specs/ (writes only what changed)")
    g.add_argument("specs", nargs="*", help="only these spec files (no orphan removal)")
    verb("check", help="exit 1 with a diff if generated/ differs from specs/")
    lint = verb("lint", help="validate specs without writing anything: every problem of every file, exit 2 if any")
    lint.add_argument("specs", nargs="*", help="only these spec files (default: every spec)")
    lint.add_argument("--format", choices=FORMATS, default="text",
                      help="text (path:line:col lines on stderr), json (a list on stdout) or github (annotations)")
    e = verb("explain", help="print the resolved byte map of one layout")
    e.add_argument("spec")
    e.add_argument("--page-size", type=int)
    e.add_argument("--heads", type=int)
    e.add_argument("--values", type=int)
    verb("bench", help="benchmark every spec x op on the GPU (options: python -m bench.run --help; "
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
        rest = argv[verb + 1:]
        if "--root" in rest[:-1]:                    # (but --root is kvlayout's, after the verb too)
            at = rest.index("--root")
            argv, rest = argv[:verb] + rest[at:at + 2] + argv[verb:verb + 1], rest[:at] + rest[at + 2:]
            verb = _verb_index(argv)
        args = parser().parse_args(argv[: verb + 1])
        args.rest = rest
    else:
        args = parser().parse_args(argv)
    root = (args.root or find_root(Path.cwd())).resolve()
    handler = {"generate": cmd_generate, "check": cmd_check, "lint": cmd_lint, "explain": cmd_explain,
               "bench": cmd_bench}[args.command]
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
