"""The layouts under test: every spec in specs/ (its committed module in generated/) and every
test-only spec in tests/specs/ (the "zoo", generated into a temporary folder per session).
Importing this module sets no environment; tests/conftest.py decides interpreter or GPU."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPECS = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))
ZOO = sorted(p.stem for p in (Path(__file__).parent / "specs").glob("*.yaml"))
LAYOUTS = SPECS + ZOO

from bench.run import sources  # noqa: E402,F401  (quantize_store's tensors for a module's rows; one definition)


@functools.lru_cache(maxsize=None)
def _zoo_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="kvlayout-zoo-"))


@functools.lru_cache(maxsize=None)
def module(name: str):
    """The generated module of a layout (zoo specs are generated on first use)."""
    if name in SPECS:
        return importlib.import_module(f"generated.{name}")
    from codegen import build, render
    kind, tree, display, digest = build.load_spec(Path(__file__).parent / "specs" / f"{name}.yaml", ROOT)
    path = _zoo_dir() / f"{name}.py"
    path.write_text(render.render_layout(build.build_layout(tree, display, digest)))
    spec = importlib.util.spec_from_file_location(f"kvlayout_zoo_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
