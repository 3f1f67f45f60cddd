"""The kvlayout command line: init, new, generate, check, lint, explain, diff (and bench on a GPU machine)."""
from __future__ import annotations

import argparse
import json
import keyword
import os
import re
import shlex
import sys
import time
from pathlib import Path

from . import abi, config, pipeline, render, schema, writer
from . import explain as explain_mod
from .errors import SpecError
from .model import HEADS, PAGE_SIZE, VALUES

# Exit codes (README): 0 ok; 1 check found drift, or diff a breaking change; 2 a bad spec; 3 a file
# could not be read or written (nothing was written); 4 bad usage (arguments, no config or a bad
# one, an unknown revision) or an internal error (a bug in kvlayout; never reported as drift).
EXIT_OK, EXIT_DRIFT, EXIT_BAD_SPEC, EXIT_IO, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_USAGE = EXIT_INTERNAL
FORMATS = ("text", "json", "github")
EXAMPLE = "example"


class UsageError(Exception):
    """A command that cannot run as asked: ``str(err)`` is one line for the user (exit 4)."""


def find_project(args) -> config.Project:
    """The project of a command: --config FILE, or --root DIR's config, or the nearest config at or
    above the current directory. No config is an error (never a fallback)."""
    if getattr(args, "config", None) is not None:
        if Path(args.config).is_dir():
            raise config.ConfigError(f"--config {args.config}: is a folder; name its config file "
                                     f"(kvlayout.toml or pyproject.toml), or pass the folder as --root")
        if not Path(args.config).is_file():
            raise config.ConfigError(f"--config {args.config}: no such file")
        return config.load(args.config)
    if getattr(args, "root", None) is not None:
        return config.at_root(args.root)
    return config.find(Path.cwd())


def _report(errors, form: str = "text", root: Path | None = None) -> int:
    """Print every problem of the failing specs: text lines on stderr (path:line:col: message (fix:
    ...)); or, on stdout, one JSON list, or GitHub Actions error annotations (their paths relative to
    the workspace, the repository's root, where the project `root` lies inside it)."""
    problems = [p for err in errors for p in err.problems]
    if form == "json":
        print(json.dumps([{"file": p.mark.path if p.mark else None, "line": p.mark.line if p.mark else None,
                           "col": p.mark.col if p.mark else None, "message": p.message, "fix": p.fix}
                          for p in problems], indent=1))
    elif form == "github":
        for p in problems:
            where = f"file={_github(_in_workspace(p.mark.path, root), True)},line={p.mark.line},col={p.mark.col}," \
                if p.mark else ""
            text = f"{p.message} (fix: {p.fix})" if p.fix else p.message
            print(f"::error {where}title=kvlayout::{_github(text)}")
    else:
        for err in errors:
            print(err.render(), file=sys.stderr)
    return EXIT_BAD_SPEC


def _in_workspace(path: str, root: Path | None) -> str:
    """A spec's path as GitHub resolves an annotation's file: relative to $GITHUB_WORKSPACE (a project
    in a subfolder of the repository gives services/kv/specs/x.yaml), else as kvlayout names it."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if not workspace or root is None:
        return path
    full, base = (root / path).resolve(), Path(workspace).resolve()
    return full.relative_to(base).as_posix() if full.is_relative_to(base) else path


def _github(text: str, prop: bool = False) -> str:
    """Text in a GitHub Actions workflow command: %, CR and LF escaped, and in a property (file=) also
    the ':' and ',' that would end it."""
    text = str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def cmd_lint(args, project: config.Project) -> int:
    """Validate specs (all of them, or the ones named) without rendering or writing anything."""
    try:
        layouts, compats = pipeline.build_all(project, args.specs or None)
    except pipeline.SpecErrors as exc:
        return _report(exc.errors, args.format, project.root)
    count = len(layouts) + len(compats)
    if args.format == "json":
        print("[]")
    elif args.format == "text":
        print(f"kvlayout lint: {count} spec(s) OK")
    return EXIT_OK


def cmd_generate(args, project: config.Project) -> int:
    start = time.perf_counter()
    with writer.locked(project.root):       # runs on one root take turns, from reading the specs on
        try:
            files = pipeline.render_all(project, args.specs or None)
        except pipeline.SpecErrors as exc:
            print("kvlayout generate: nothing written", file=sys.stderr)
            return _report(exc.errors)
        try:
            written, removed = writer.write(project.root, files, remove_orphans=not args.specs, trees=project.trees)
        except writer.WriteError as err:
            print(f"kvlayout generate: {err}", file=sys.stderr)
            return EXIT_IO
    for rel in written:
        print(f"wrote {rel}")
    for rel in removed:
        print(f"removed {rel}")
    print(f"{len(files)} files, {len(written)} written, {len(removed)} removed in {time.perf_counter() - start:.2f} s")
    return EXIT_OK


def _folders(project: config.Project) -> str:
    return " and ".join(f"{t}/" for t in project.trees)


def cmd_check(args, project: config.Project) -> int:
    try:
        files = pipeline.render_all(project)
    except pipeline.SpecErrors as exc:
        return _report(exc.errors)
    diffs = writer.drift(project.root, files, project.trees)
    if diffs:
        for d in diffs:
            sys.stdout.write(d if d.endswith("\n") else d + "\n")
        yours = sum(d.startswith(writer.OWN_FILE) for d in diffs)
        print(f"kvlayout check: {len(diffs)} file(s) under {_folders(project)} differ from the specs; "
              + (f"move the {yours} file(s) of yours aside, then " if yours else "") + "run `kvlayout generate`",
              file=sys.stderr)
        return EXIT_DRIFT
    print(f"kvlayout check: {len(files)} generated files match the specs")
    return EXIT_OK


def cmd_explain(args, project: config.Project) -> int:
    try:
        layouts, _ = pipeline.build_all(project, [args.spec])
    except pipeline.SpecErrors as exc:
        return _report(exc.errors)
    wanted = pipeline.resolve(project, args.spec)
    layout = next((m for m in layouts.values() if (project.root / m.spec_path) == wanted), None)
    if layout is None:       # a compat spec (build_all also built the layouts it calls)
        raise UsageError(f"{args.spec} is not a layout spec (explain the layouts a compat spec calls)")
    if args.svg == "-" and args.json:
        raise UsageError("--svg - and --json would both write to stdout; give --svg a file")
    sizes = explain_mod.default_sizes(layout)
    for key, value in ((PAGE_SIZE, args.page_size), (HEADS, args.heads), (VALUES, args.values)):
        if value is not None:
            if value < 1:
                raise UsageError(f"--{key.replace('_', '-')} must be at least 1, got {value}")
            fixed = {HEADS: layout.heads, VALUES: layout.values}.get(key)
            if fixed is not None and fixed.is_const and fixed.const_value() != value:
                raise UsageError(f"--{key}: {layout.name} has {fixed.const_value()} {key} (the spec fixes them), not {value}")
            sizes[key] = value
    try:
        if args.svg is not None:
            picture = explain_mod.svg(layout, sizes)
        text = json.dumps(explain_mod.page_map(layout, sizes), indent=1) + "\n" if args.json else \
            explain_mod.explain(layout, sizes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.svg is not None:
        if args.svg == "-":
            sys.stdout.write(picture)
            return EXIT_OK
        target = Path(args.svg)
        resolved = target.resolve()     # (/dev/stdout, a pipe: written through; a link to a file of the user's: no)
        if resolved.is_dir() or resolved.is_file() and not writer.is_generated(resolved.read_bytes()):
            # as generate: a file of the user's (the spec itself, given by mistake) is never replaced
            print(f"kvlayout explain: {args.svg}: a file of yours (a folder, or a file without the 'Code "
                  "generated by kvlayout' header, or a link to one) is there; name another file, or delete it first; "
                  "nothing was written", file=sys.stderr)
            return EXIT_IO
        target.write_text(picture)
        print(f"wrote {args.svg}", file=sys.stderr)
        if not args.json:
            return EXIT_OK
    sys.stdout.write(text)
    return EXIT_OK


def cmd_diff(args, project: config.Project) -> int:
    """The layout ABI change of every spec from a git revision to the working tree; exit 1 if breaking."""
    try:
        changes = abi.diff(project, args.against)
    except pipeline.SpecErrors as exc:
        return _report(exc.errors, args.format)
    except abi.GitError as err:
        raise UsageError(str(err)) from None
    breaking = sum(c.breaking for c in changes)
    if args.format == "json":
        print(json.dumps([{"spec": c.spec, "breaking": c.breaking, "change": c.what} for c in changes], indent=1))
    else:
        for c in changes:
            print(c.render())
        print(f"kvlayout diff: {len(changes)} change(s) since {args.against}, {breaking} breaking"
              if changes else f"kvlayout diff: no layout ABI change since {args.against}", file=sys.stderr)
    return EXIT_DRIFT if breaking else EXIT_OK


# --- init and new: a project of one's own --------------------------------------------------------

def _shipped_specs() -> Path:
    """This kvlayout's own layout specs: kvlayout/specs in a wheel, specs/ in a checkout."""
    here = Path(__file__).resolve().parent
    return here / "specs" if (here / "specs").is_dir() else here.parent / "specs"


def _schema_ref(project: config.Project, spec_dir: Path) -> str:
    return Path(os.path.relpath(project.out_dir / writer.SCHEMA_FILE, spec_dir)).as_posix()


def _spec_text(project: config.Project, name: str, like: str | None) -> str:
    spec_dir = project.spec_dir()
    modeline = f"# yaml-language-server: $schema={_schema_ref(project, spec_dir)}"
    if like is None:
        return render.render_example(name=name, schema=_schema_ref(project, spec_dir),
                                     reference=Path(os.path.relpath(project.out_dir / writer.REFERENCE_FILE,
                                                                    project.root)).as_posix(),
                                     path=f"{project.specs[0]}/{name}.yaml")
    candidates = [Path(like), *(project.root / s / f"{like}.yaml" for s in project.specs),
                  _shipped_specs() / f"{like}.yaml"]
    source = next((c for c in candidates if c.is_file()), None)
    if source is None:
        shipped = ", ".join(sorted(p.stem for p in _shipped_specs().glob("*.yaml")))
        raise UsageError(f"--like {like}: no such spec file, project spec or shipped spec (shipped: {shipped})")
    try:
        text = source.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--like {like}: {source} is not UTF-8 text (byte {exc.start}); a spec is") from None
    if re.search(r"^compat:", text, re.M):
        raise UsageError(f"--like {like}: a compat spec; new scaffolds layout specs")
    if not re.search(r"^name:.*$", text, re.M):
        raise UsageError(f"--like {like}: has no top-level name: to replace")
    text = re.sub(r"^name:.*$", f"name: {name}", text, count=1, flags=re.M)
    if text.startswith("# yaml-language-server:"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
    return f"{modeline}\n{text}"


def cmd_new(args, project: config.Project) -> int:
    """Scaffold a layout spec in the first spec folder: a commented example, or a copy of --like.
    The new file must lint (a name Python or kvlayout reserves does not): otherwise nothing stays."""
    if not re.fullmatch(schema.IDENT, args.name):
        raise UsageError(f"NAME {args.name!r} must be a lowercase identifier: a letter first, then lowercase letters, "
                         "digits or _ (at most 64 characters)")
    if keyword.iskeyword(args.name) or args.name == pipeline.COMPAT:
        raise UsageError(f"NAME {args.name!r} cannot name a Python module here (a keyword, or the compat "
                         "package); choose another name")
    for folder in project.specs:
        other = project.root / folder / f"{args.name}.yaml"
        if other.exists():
            raise UsageError(f"{other.relative_to(project.root).as_posix()} exists already")
    target = project.spec_dir() / f"{args.name}.yaml"
    text = _spec_text(project, args.name, args.like)
    target.write_text(text, encoding="utf-8")
    rel = target.relative_to(project.root).as_posix()
    try:
        pipeline.build_all(project, [target])
    except pipeline.SpecErrors as exc:
        target.unlink()
        print(f"kvlayout new: {rel} would not lint, so it was not written:", file=sys.stderr)
        return _report(exc.errors)
    print(f"wrote {rel}")
    print(f"next: edit {rel}, then `kvlayout explain {shlex.quote(rel)}` and `kvlayout generate`")
    return EXIT_OK


CONFIG_TEMPLATE = """\
# The kvlayout project config (kvlayout's README, "Use kvlayout in your project", documents it).
# Paths are relative to this file. kvlayout writes only into `output` (and `svg`, if set).

# The layout specs (a folder, or a list of them); compat specs sit in its compat/ folder.
specs = "{specs}"
# The generated package: one module per layout spec, and its import name.
output = "{output}"
package = "{package}"
# A byte-map picture per layout spec, kept in sync by `kvlayout check`:
# svg = "docs/layouts"
"""


def _config_above(folder: Path) -> Path | None:
    """The config a command run in `folder` would find above it (find's walk); a config file there
    that does not read (a broken pyproject.toml of another tool's) counts as none."""
    for directory in folder.parents:
        try:
            found = config.config_in(directory)
        except config.ConfigError:
            continue
        if found is not None:
            return found
    return None


def cmd_init(args) -> int:
    """Write a config, the JSON Schema where the specs' modeline finds it, the spec reference beside
    it, and one example spec."""
    if getattr(args, "config", None) is not None:
        raise UsageError("init writes kvlayout.toml into --root DIR (or the current folder); --config names an "
                         "existing config")
    root = Path(args.root or Path.cwd()).resolve()
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    existing = config.config_in(root)
    if existing is not None:
        raise UsageError(f"{existing} is a kvlayout config already; nothing written")
    # Here, inside another project, commands would find this one's config instead of that one's.
    above = None if args.root else _config_above(Path(os.path.abspath(Path.cwd())))
    if above is not None:
        raise UsageError(f"{root} is inside the project of {above}; run commands there, or pass --root {root} to "
                         "make a project of its own here (commands run below it then find this one); nothing written")
    package = args.package or Path(args.output).name
    text = CONFIG_TEMPLATE.format(specs=args.specs, output=args.output, package=package)
    path = root / config.CONFIG_FILE
    spec_dir = root / config.relative_folder(path, "specs", args.specs)      # (the config requires the folder to exist)
    out_rel = config.relative_folder(path, "output", args.output)
    for folder in (spec_dir, root / out_rel):
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{folder}: exists and is not a folder; nothing written")
    # the files init writes, and the package files generate will: none may be one of the user's own
    ours = {f"{out_rel}/{name}": "" for name in (writer.SCHEMA_FILE, writer.REFERENCE_FILE, "__init__.py",
                                                 f"{pipeline.COMPAT}/__init__.py")}
    theirs = writer.foreign(root, writer.existing_files(root, (out_rel,)), ours)
    if theirs:
        raise UsageError(str(writer.foreign_error(theirs[0])))
    made = not spec_dir.exists()
    if made:
        spec_dir.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    try:
        project = config.load(path)
    except config.ConfigError:
        path.unlink()
        if made:
            spec_dir.rmdir()
        raise
    written = [path]
    schema_file = project.out_dir / writer.SCHEMA_FILE
    schema_file.parent.mkdir(parents=True, exist_ok=True)
    schema_file.write_text(render.render_schema(), encoding="utf-8")
    reference = project.out_dir / writer.REFERENCE_FILE      # the example spec's comments point to it
    reference.write_text(render.render_reference(), encoding="utf-8")
    written += [schema_file, reference]
    if not any(spec_dir.glob("*.yaml")):
        example = spec_dir / f"{EXAMPLE}.yaml"
        example.write_text(_spec_text(project, EXAMPLE, None), encoding="utf-8")
        written.append(example)
    for p in written:
        print(f"wrote {p.relative_to(root).as_posix()}")
    print("next: `kvlayout generate` writes the modules; `kvlayout new NAME [--like SPEC]` adds a spec")
    return EXIT_OK


def cmd_bench(args, project: config.Project) -> int:
    host = args.rest[:1] == ["--host"]       # host time per eager call, the seeds side by side
    rest = args.rest[1:] if host else args.rest
    if "--package" not in rest:              # the project's generated modules and their specs
        rest = ["--package", project.package, *rest]
    if "--specs" not in rest:
        rest = ["--specs", str(project.spec_dir()), *rest]
    # GPU only for bench.run; both import torch and the generated modules
    try:
        return _sibling("bench.host" if host else "bench.run").main(rest)
    except SystemExit as stop:               # argparse's usage error is 2, a bad spec's code here
        if stop.code == 2:
            return EXIT_USAGE
        raise


def _sibling(name: str):
    """A module beside this package: bench/ of a checkout (package codegen), kvlayout.bench in a wheel."""
    import importlib
    return importlib.import_module(name if __package__ == "codegen" else f"{__package__}.{name}")


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


GLOBAL_OPTIONS = ("--root", "--config")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvlayout", description="Generate Triton kernels for quantized paged KV caches.")
    p.add_argument("--version", action="version", version=f"kvlayout {_version()}")
    root_help = "the project's directory (its config must be there; default: found from the current directory up)"
    config_help = "the project's config file (kvlayout.toml, or a pyproject.toml with [tool.kvlayout])"
    p.given = []                             # (option, value) of each --root/--config, before or after the verb

    class Given(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            p.given.append((self.dest, values))
            setattr(namespace, self.dest, values)

    p.add_argument("--root", type=Path, action=Given, help=root_help)
    p.add_argument("--config", type=Path, action=Given, help=config_help)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def verb(name, root=root_help, config=config_help, **kwargs):
        v = sub.add_parser(name, **kwargs)
        v.add_argument("--root", type=Path, action=Given, default=argparse.SUPPRESS, help=root)   # after the verb too
        v.add_argument("--config", type=Path, action=Given, default=argparse.SUPPRESS, help=config)
        return v

    i = verb("init", help="write kvlayout.toml, the spec schema and an example spec (in --root or here)",
             root="the folder to make a project of (default: the current folder; inside another project, pass "
                  "it explicitly)",
             config="not taken by init, which writes kvlayout.toml into --root (exit 4)")
    i.add_argument("--specs", default=config.DEFAULTS["specs"], help="spec folder (default: specs)")
    i.add_argument("--output", default=config.DEFAULTS["output"], help="generated package folder (default: generated)")
    i.add_argument("--package", help="its import name (default: the output folder's name)")
    n = verb("new", help="scaffold a layout spec: a commented example, or a copy of --like")
    n.add_argument("name")
    n.add_argument("--like", help="a spec file, a spec of the project, or a shipped spec's name (e.g. dsv4_k)")
    g = verb("generate", help="regenerate the output from the specs (writes only what changed)")
    g.add_argument("specs", nargs="*", help="only these spec files (no orphan removal)")
    verb("check", help="exit 1 with a diff if the output differs from the specs")
    lint = verb("lint", help="validate specs without writing anything: every problem of every file, exit 2 if any")
    lint.add_argument("specs", nargs="*", help="only these spec files (default: every spec)")
    lint.add_argument("--format", choices=FORMATS, default="text",
                      help="text (path:line:col lines on stderr), json (a list on stdout) or github (annotations)")
    e = verb("explain", help="print the resolved byte map of one layout")
    e.add_argument("spec")
    e.add_argument("--page-size", type=int)
    e.add_argument("--heads", type=int)
    e.add_argument("--values", type=int)
    e.add_argument("--json", action="store_true", help="the byte map as JSON on stdout")
    e.add_argument("--svg", metavar="FILE", help="write a byte-map picture of one page to FILE (- for stdout)")
    d = verb("diff", help="the layout ABI change of every spec since a git revision; exit 1 if breaking")
    d.add_argument("--against", required=True, metavar="GIT_REF", help="the revision to compare with (e.g. main)")
    d.add_argument("--format", choices=("text", "json"), default="text")
    verb("bench", help="benchmark every spec x op on the GPU (options: kvlayout bench --help; "
         "--host first: host time per eager call, kvlayout bench --host --help)")
    return p


def _verb_index(argv) -> int | None:
    """Index of the command word, skipping the global options before it."""
    i = 0
    while i < len(argv):
        if argv[i] in GLOBAL_OPTIONS:
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
        for option in GLOBAL_OPTIONS:                # (but --root and --config are kvlayout's, after the verb too)
            if option in rest[:-1]:
                at = rest.index(option)
                argv, rest = argv[:verb] + rest[at:at + 2] + argv[verb:verb + 1], rest[:at] + rest[at + 2:]
                verb = _verb_index(argv)
        p = parser()
        args = p.parse_args(argv[: verb + 1])
        args.rest = rest
    else:
        p = parser()
        args = p.parse_args(argv)
    given = {dest: value.resolve() for dest, value in p.given}
    twice = next((dest for dest, value in p.given if given[dest] != value.resolve()), None)
    if twice or len(given) > 1:              # one project per run: never one option silently over another
        p.error(f"--{twice} is given twice, as {' and '.join(str(v) for d, v in p.given if d == twice)}; give it once"
                if twice else "init takes --root DIR (the folder to write kvlayout.toml in), not --config"
                if args.command == "init" else "--root and --config both name the project; give one (--config FILE, "
                "or --root DIR for the config in DIR)")
    handler = {"generate": cmd_generate, "check": cmd_check, "lint": cmd_lint, "explain": cmd_explain,
               "diff": cmd_diff, "new": cmd_new, "bench": cmd_bench}.get(args.command)
    try:
        if args.command == "init":
            return cmd_init(args)
        return handler(args, find_project(args))
    except (config.ConfigError, UsageError) as err:
        print(f"kvlayout {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except SpecError as err:  # a spec problem found outside build_all
        return _report([err])
    except OSError as err:    # a file that could not be read (writes are reported by cmd_generate)
        where = f"{err.filename}: " if err.filename else ""
        print(f"kvlayout {args.command}: {where}{err.strerror or err}", file=sys.stderr)
        return EXIT_IO
    except Exception:         # a bug: say so, with the traceback, under its own exit code (never drift's 1)
        import traceback
        traceback.print_exc()
        print(f"kvlayout {args.command}: internal error (a bug in kvlayout; please report it)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
