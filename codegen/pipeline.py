"""A project's specs -> {generated path: text}, entirely in memory (nothing is written here)."""
from __future__ import annotations

import os
from pathlib import Path

from . import build, config, explain, render, writer
from .errors import Mark, SpecError


class SpecErrors(Exception):
    """One or more specs failed; ``errors`` holds a SpecError per failing file, in path order."""

    def __init__(self, errors):
        self.errors = errors
        super().__init__("\n".join(e.render() for e in errors))


COMPAT = "compat"


def project_of(where) -> config.Project:
    """A Project as given, or the project of a root directory: its config, or (a library caller's
    folder without one, e.g. a test's) the default folders."""
    if isinstance(where, config.Project):
        return where
    root = Path(where).resolve()
    found = config.config_in(root)
    if found is not None:
        return config.load(found)
    return config.Project(root=root, config=root / config.CONFIG_FILE, specs=(config.DEFAULTS["specs"],),
                          output=config.DEFAULTS["output"], package=config.DEFAULTS["package"])


def _folders(project: config.Project, kind: str) -> list:
    """The folders that hold specs of a kind: the spec folders, or their compat/ folders."""
    return [project.root / s / (COMPAT if kind == "compat" else "") for s in project.specs]


def resolve(project, path) -> Path:
    """A spec path from the command line: as given if it exists, else relative to the root; made
    absolute without following symlinks (a linked spec is named by its place in a spec folder)."""
    project = project_of(project)
    root = project.root
    path = Path(os.path.abspath(Path(path) if Path(path).exists() or Path(path).is_absolute() else root / path))
    parent = path.parent.resolve()
    for folder in _folders(project, "layout") + _folders(project, "compat"):
        if parent == folder.resolve():       # (also through a symlinked checkout)
            return folder / path.name
    return path


def spec_files(project) -> list:
    """Every spec in the spec folders, and every file there that looks like one under another suffix
    (.yml, .YAML: build_all refuses them, rather than generate removing their output as orphans) or
    in a subfolder other than compat/ (build_all says where it must sit: none is quietly skipped)."""
    project = project_of(project)
    found = [p for kind in ("layout", COMPAT) for folder in _folders(project, kind) for p in sorted(folder.glob("*"))
             if p.suffix == ".yaml" or (p.suffix.lower() in (".yaml", ".yml") and p.is_file())]
    for folder in _folders(project, "layout"):
        seen = {os.path.realpath(folder)}
        for below, dirs, files in os.walk(folder, followlinks=True):
            # (a linked folder is walked once: a link back up would loop)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and os.path.realpath(os.path.join(below, d)) not in seen)
            seen.update(os.path.realpath(os.path.join(below, d)) for d in dirs)
            if Path(below) not in (folder, folder / COMPAT):
                found += [Path(below) / f for f in sorted(files) if Path(f).suffix.lower() in (".yaml", ".yml")]
    return found


def placed_specs(project, kind: str) -> list:
    """The specs of a kind where they belong: the .yaml files of the spec folders, or of their compat/."""
    return [p for folder in _folders(project_of(project), kind) for p in sorted(folder.glob("*.yaml")) if p.is_file()]


def _shown_folders(project, kind: str) -> str:
    return " or ".join(f"{p.relative_to(project.root).as_posix()}/" for p in _folders(project, kind))


def _check_place(project, path: Path, kind: str, display: str) -> None:
    """Layout specs live in a spec folder, compat specs in its compat/ (what `check` reads), nowhere else."""
    if not any(path.parent.resolve() == f.resolve() for f in _folders(project, kind)):
        where = _shown_folders(project, kind)
        first = _folders(project, kind)[0].relative_to(project.root).as_posix()
        raise SpecError(Mark(display, 1, 1), f"a {kind} spec must sit in {where} (kvlayout generates and checks "
                        "only the specs there)", f"move it to {first}/{path.name}")


def _check_spec_file(path: Path, root: Path) -> None:
    """A spec path names a regular file whose name ends in .yaml."""
    if path.is_dir():
        raise SpecError(Mark(build.display_path(path, root), 1, 1), "is a directory, not a spec file",
                        "rename or remove the directory")
    if not path.is_file():
        raise SpecError(Mark(build.display_path(path, root), 1, 1), "no such spec file")
    if path.suffix != ".yaml":
        raise SpecError(Mark(build.display_path(path, root), 1, 1), f"a spec file's name ends in .yaml, not "
                        f"{path.suffix} (kvlayout reads only .yaml specs)", f"rename it to {path.stem}.yaml")


def build_all(project, paths=None, *, earlier: bool = False) -> tuple:
    """Validate specs into models: returns ({name: Layout}, {name: Compat}). Raises SpecErrors.
    earlier: the specs are a revision's, read by `diff` (see build.build_layout)."""
    project = project_of(project)
    root = project.root
    # (a spec named twice on the command line is read once: else it would clash with its own name)
    paths = spec_files(project) if paths is None else list(dict.fromkeys(resolve(project, p) for p in paths))
    errors, layouts, compats, pending = [], {}, {}, []
    for path in paths:
        try:
            _check_spec_file(path, root)
            kind, tree, display, digest = build.load_spec(path, root, earlier=earlier)
            _check_place(project, path, kind, display)
            if kind == "layout":
                layout = build.build_layout(tree, display, digest, earlier=earlier)
                if layout.name in layouts:
                    raise SpecError(tree.value_mark("name"), f"name: {layout.name!r} is also the name of "
                                    f"{layouts[layout.name].spec_path}; spec names are unique across spec folders",
                                    "rename one of the two files (and its name:)")
                layouts[layout.name] = layout
            else:
                pending.append((tree, display, digest))
        except SpecError as err:
            errors.append(err)
    if pending:
        # Compat specs name layouts: make sure every layout is known, requested or not.
        requested = {p.resolve() for p in paths}
        compat_folders = {f.resolve() for f in _folders(project, COMPAT)}
        for path in spec_files(project):
            if path.resolve() in requested or path.parent.resolve() in compat_folders:
                continue
            try:
                _check_spec_file(path, root)
                kind, tree, display, digest = build.load_spec(path, root, earlier=earlier)
                _check_place(project, path, kind, display)
                layout = build.build_layout(tree, display, digest, earlier=earlier)
                layouts.setdefault(layout.name, layout)
            except SpecError as err:
                errors.append(err)
        # (a layout spec's name is its file's: the ones that did not build)
        failed = {p.stem for p in (*paths, *placed_specs(project, "layout")) if p.parent.resolve() not in compat_folders} - set(layouts)
        for tree, display, digest in pending:
            if {f["call"].split(".")[0] for f in tree["functions"]} & failed:
                continue        # it calls a layout whose spec failed: that spec's errors say why
            try:
                if tree["compat"] in layouts:
                    raise SpecError(tree.value_mark("compat"), f"compat: {tree['compat']!r} is also a layout's name "
                                    f"({layouts[tree['compat']].spec_path}); spec names are unique across spec folders",
                                    f"rename this file and its compat: to, e.g., {tree['compat']}_compat")
                compat = build.build_compat(tree, display, digest, layouts)
                compats[compat.name] = compat
            except SpecError as err:
                errors.append(err)
    if errors:
        raise SpecErrors(errors)
    return layouts, compats


def render_all(project, paths=None) -> dict:
    """Every generated file, keyed by its path relative to the root, in sorted order: the output
    package (a module per spec, the package files, the schema and the spec reference) and, where
    the project keeps them, a byte-map picture per layout."""
    project = project_of(project)
    layouts, compats = build_all(project, paths)
    root = project.root
    requested = None if paths is None else {resolve(project, p) for p in paths}

    def wanted(model) -> bool:
        return requested is None or Path(os.path.abspath(root / model.spec_path)) in requested

    out_dir = project.output
    out = {}
    for name, layout in layouts.items():
        if wanted(layout):
            out[f"{out_dir}/{name}.py"] = render.render_layout(layout)
            if project.svg:
                out[f"{project.svg}/{name}.svg"] = explain.svg(layout, explain.default_sizes(layout))
    for name, compat in compats.items():
        if wanted(compat):
            out[f"{out_dir}/{COMPAT}/{name}.py"] = render.render_compat(compat)
    # The package files list every spec's module (by file name, which each spec's name equals), so a
    # run for some specs keeps them whole too.
    # (a spec build_all would refuse for its place or suffix names no module)
    placed = {kind: {p.stem for p in placed_specs(project, kind)} for kind in ("layout", COMPAT)}
    sources = ", ".join(f"{s}/" for s in project.specs)
    out[f"{out_dir}/__init__.py"] = _package_init(sorted(placed["layout"]),
                                                  "kvlayout generated modules, one per layout spec.", sources)
    out[f"{out_dir}/{COMPAT}/__init__.py"] = _package_init(sorted(placed[COMPAT]),
                                                           "Drop-in modules for existing callers.", sources)
    out[f"{out_dir}/{writer.SCHEMA_FILE}"] = render.render_schema()
    out[f"{out_dir}/{writer.REFERENCE_FILE}"] = render.render_reference()
    return dict(sorted(out.items()))


def _package_init(names, doc: str, sources: str) -> str:
    listing = "".join(f"  {n}\n" for n in names)
    return f'# Code generated by kvlayout from {sources}. DO NOT EDIT.\n"""{doc}\n\n{listing}"""\n'
