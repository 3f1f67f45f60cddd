"""kvlayout in a repository of one's own: the config found by walking up (never a fallback), init and
new, output only where the config says, diff's breaking-change check, explain's JSON and SVG, and
(end to end) the built wheel installed into a fresh virtual environment."""
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from codegen import config, pipeline
from tests.harness import ROOT
from tests.test_cli import edit

GIT = shutil.which("git")


def run(cmd, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GIT_CONFIG_GLOBAL": os.devnull, **kw.pop("env", {})}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw)


def kv(*args, cwd):
    """The checkout's kvlayout, run from `cwd` (no --root: the config is found from there)."""
    return run([sys.executable, "-m", "codegen", *args], cwd=cwd)


def git(cwd, *args):
    proc = run([GIT, "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# --- the config ---------------------------------------------------------------------------------

def test_no_config_is_an_error_that_suggests_init(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "codegen").mkdir()                   # what the old root discovery looked for
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")   # no [tool.kvlayout]: passed by
    for verb in (["generate"], ["check"], ["lint"], ["explain", "specs/x.yaml"], ["diff", "--against", "HEAD"]):
        proc = kv(*verb, cwd=tmp_path)
        assert proc.returncode == 4 and "kvlayout init" in proc.stderr and "Traceback" not in proc.stderr, (verb, proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codegen", "pyproject.toml", "specs"], "nothing written"


def test_the_config_is_found_walking_up_and_named_by_root_or_config(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.kvlayout]\nspecs = "layouts"\noutput = "src/kv"\npackage = "kv"\n')
    (tmp_path / "layouts").mkdir()
    (tmp_path / "layouts" / "dsv4_k.yaml").write_text((ROOT / "specs" / "dsv4_k.yaml").read_text())
    deep = tmp_path / "layouts" / "a" / "b"
    deep.mkdir(parents=True)
    proc = kv("generate", cwd=deep)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "src" / "kv" / "dsv4_k.py").is_file() and not (tmp_path / "generated").exists()
    assert kv("check", cwd=deep).returncode == 0
    for args in (["--root", str(tmp_path), "check"], ["check", "--root", str(tmp_path)],
                 ["--config", str(tmp_path / "pyproject.toml"), "check"], ["check", "--config", str(tmp_path / "pyproject.toml")]):
        proc = kv(*args, cwd="/")
        assert proc.returncode == 0, (args, proc.stderr)
    proc = kv("--root", str(deep), "check", cwd="/")      # --root names the config's own folder
    assert proc.returncode == 4 and "no kvlayout config there" in proc.stderr
    proc = kv("--config", str(tmp_path), "check", cwd="/")     # a folder for --config: name its file, or --root
    assert proc.returncode == 4 and "is a folder; name its config file" in proc.stderr and "--root" in proc.stderr


@pytest.mark.parametrize("text, words", [
    ('specs = "specs"\nouput = "gen"\n', ["unknown key(s) ouput"]),
    ('output = "specs/gen"\n', ["overlaps the spec folder"]),
    ('output = "../elsewhere"\n', ["must be a folder inside"]),
    ('output = "/abs"\n', ["must be a folder inside"]),
    ('output = "gen"\npackage = "generated"\n', ["does not end in the output folder's name"]),
    ('package = "not a name"\n', ["dotted Python import name"]),
    ('output = "class"\n', ["package = 'class' (the output folder's name, the default) must be a dotted Python "
                            "import name (no part a keyword)"]),
    ('output = "src/generated"\npackage = "import.generated"\n', ["no part a keyword"]),
    ('svg = "generated/pics"\n', ["overlaps output"]),
    ('specs = [\n', ["not valid TOML"]),
])
def test_a_bad_config_is_one_line_and_exit_4(tmp_path, text, words):
    (tmp_path / "kvlayout.toml").write_text(text)
    proc = kv("check", cwd=tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


def test_an_output_folder_that_leads_outside_through_a_link_is_refused(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "project" / "kvlayout.toml").write_text('output = "link/gen"\npackage = "gen"\n')
    proc = kv("generate", cwd=tmp_path / "project")
    assert proc.returncode == 4 and "leads outside" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not any((tmp_path / "outside").iterdir())


def test_a_tree_that_cannot_be_written_stops_generate_before_any_is(tmp_path):
    """The pictures folder is a file: generate fails with one line and writes no tree, not even the
    modules' (each tree is checked before any is written); a NUL in a folder name is a config error."""
    assert kv("init", cwd=tmp_path).returncode == 0
    (tmp_path / "pics").write_text("a file")
    (tmp_path / "kvlayout.toml").write_text((tmp_path / "kvlayout.toml").read_text() + 'svg = "pics"\n')
    proc = kv("generate", cwd=tmp_path)
    assert proc.returncode == 3 and "pics: is not a directory" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "generated" / "example.py").exists()
    (tmp_path / "kvlayout.toml").write_text((tmp_path / "kvlayout.toml").read_text().replace('svg = "pics"', 'svg = "p\\u0000x"'))
    proc = kv("generate", cwd=tmp_path)
    assert proc.returncode == 4 and "control character" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_generate_writes_only_the_configured_trees_and_keeps_what_it_did_not_write(tmp_path):
    (tmp_path / "kvlayout.toml").write_text('output = "out/kv"\npackage = "kv"\nsvg = "pics"\n')
    (tmp_path / "specs").mkdir()
    shutil.copy(ROOT / "specs" / "dsv4_k.yaml", tmp_path / "specs")
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "old.py").write_text("# Code generated by kvlayout from specs/old.yaml. DO NOT EDIT.\n")
    for tree in ("out/kv", "pics"):
        (tmp_path / tree).mkdir(parents=True)
        (tmp_path / tree / "NOTES.md").write_text("mine\n")
    assert kv("generate", cwd=tmp_path).returncode == 0
    assert (tmp_path / "generated" / "old.py").is_file(), "a folder the config does not name is never touched"
    assert (tmp_path / "pics" / "dsv4_k.svg").is_file() and (tmp_path / "out" / "kv" / "dsv4_k.py").is_file()
    assert all((tmp_path / t / "NOTES.md").read_text() == "mine\n" for t in ("out/kv", "pics"))
    (tmp_path / "pics" / "dsv4_k.svg").write_text("<!-- Code generated by kvlayout from specs/dsv4_k.yaml. DO NOT EDIT. -->\n<svg/>")
    proc = kv("check", cwd=tmp_path)
    assert proc.returncode == 1 and "changed: pics/dsv4_k.svg" in proc.stdout
    assert kv("generate", cwd=tmp_path).returncode == 0 and kv("check", cwd=tmp_path).returncode == 0
    (tmp_path / "specs" / "dsv4_k.yaml").unlink()
    proc = kv("generate", cwd=tmp_path)
    assert proc.returncode == 0 and "removed pics/dsv4_k.svg" in proc.stdout and "removed out/kv/dsv4_k.py" in proc.stdout
    assert all((tmp_path / t / "NOTES.md").is_file() for t in ("out/kv", "pics"))


def test_this_repository_is_a_project_and_its_pictures_are_in_sync():
    project = config.find(ROOT / "tests")
    assert project.root == ROOT and project.specs == ("specs",) and project.svg == "docs/layouts"
    files = pipeline.render_all(project)
    pictures = sorted(k for k in files if k.startswith("docs/layouts/"))
    assert pictures == sorted(f"docs/layouts/{p.stem}.svg" for p in (ROOT / "specs").glob("*.yaml"))
    for rel in pictures:
        assert (ROOT / rel).read_text() == files[rel], f"{rel} is stale: run `kvlayout generate`"


# --- init, new, explain, diff ---------------------------------------------------------------------

def test_two_configs_in_one_folder_are_an_error(tmp_path):
    """A kvlayout.toml beside a pyproject.toml with [tool.kvlayout]: neither silently wins (exit 4)."""
    (tmp_path / "kvlayout.toml").write_text('specs = "specs"\n')
    (tmp_path / "pyproject.toml").write_text('[tool.kvlayout]\noutput = "other_out"\n')
    (tmp_path / "specs").mkdir()
    for cwd in (tmp_path, tmp_path / "specs"):
        proc = kv("check", cwd=cwd)
        assert proc.returncode == 4 and "holds two kvlayout configs" in proc.stderr, proc.stderr
    assert kv("--root", str(tmp_path), "lint", cwd="/").returncode == 4


def test_init_inside_another_project_needs_root(tmp_path):
    """init below a project's config would start a second project that the folder's commands find
    instead: refused (exit 4, nothing written) unless --root names the folder."""
    assert kv("init", cwd=tmp_path).returncode == 0
    inner = tmp_path / "services" / "attn"
    inner.mkdir(parents=True)
    proc = kv("init", cwd=inner)
    assert proc.returncode == 4 and "is inside the project of" in proc.stderr and "--root" in proc.stderr, proc.stderr
    assert not any(inner.iterdir())
    proc = kv("init", "--root", str(inner), cwd=inner)
    assert proc.returncode == 0 and (inner / "kvlayout.toml").is_file(), proc.stderr


def test_init_into_an_output_path_that_is_a_file_writes_nothing(tmp_path):
    (tmp_path / "generated").write_text("a file")
    proc = kv("init", cwd=tmp_path)
    assert proc.returncode == 4 and "exists and is not a folder" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["generated"]


def test_init_then_new_give_specs_that_lint_and_generate(tmp_path):
    proc = kv("init", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("spec.schema.json", "SPEC_REFERENCE.md"):
        assert (tmp_path / "generated" / name).read_text() == (ROOT / "generated" / name).read_text(), name
    example = (tmp_path / "specs" / "example.yaml").read_text()
    assert example.startswith("# yaml-language-server: $schema=../generated/spec.schema.json\n") and "name: example " in example
    assert kv("init", cwd=tmp_path).returncode == 4, "a second init writes nothing"
    mine = tmp_path / "mine"
    (mine / "generated").mkdir(parents=True)
    (mine / "generated" / "SPEC_REFERENCE.md").write_text("my notes\n")
    proc = kv("init", "--root", ".", cwd=mine)          # (a project of its own inside tmp_path's)
    assert proc.returncode == 4 and "generated/SPEC_REFERENCE.md: a file of yours" in proc.stderr, proc.stderr
    assert sorted(p.name for p in mine.rglob("*")) == ["SPEC_REFERENCE.md", "generated"], "init wrote nothing"
    proc = kv("init", "--root", ".", "--config", "kvlayout.toml", cwd=mine)
    assert proc.returncode == 4 and "init takes --root DIR" in proc.stderr
    assert kv("new", "mine", "--like", "mxfp8_kv", cwd=tmp_path).returncode == 0
    assert "name: mine\n" in (tmp_path / "specs" / "mine.yaml").read_text()
    assert kv("new", "mine", cwd=tmp_path).returncode == 4, "new never overwrites"
    assert kv("new", "bad-name", cwd=tmp_path).returncode == 4
    for name in ("class", "compat"):
        proc = kv("new", name, cwd=tmp_path)
        assert proc.returncode == 4 and "cannot name a Python module" in proc.stderr and ".yaml:" not in proc.stderr
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    proc = kv("new", "x", "--like", str(tmp_path / "latin1.yaml"), cwd=tmp_path)
    assert proc.returncode == 4 and "is not UTF-8 text" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = kv("new", "x", "--like", "nosuch", cwd=tmp_path)
    assert proc.returncode == 4 and "dsv4_k" in proc.stderr, "the shipped specs are listed"
    assert kv("new", "plain", cwd=tmp_path).returncode == 0
    proc = kv("generate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in (tmp_path / "generated").glob("*.py")} == {"__init__.py", "example.py", "mine.py", "plain.py"}


def test_new_prints_a_next_command_that_runs_as_pasted(tmp_path):
    """The explain command `new` suggests runs from a subfolder as printed, a spec folder with a space in it too."""
    root = tmp_path / "my proj"
    root.mkdir()
    assert kv("init", "--specs", "my specs", cwd=root).returncode == 0
    (root / "sub dir").mkdir()
    proc = kv("new", "a_one", "--like", "dsv4_k", cwd=root / "sub dir")
    assert proc.returncode == 0, proc.stderr
    command = re.search(r"`kvlayout (explain [^`]*)`", proc.stdout).group(1)
    proc = kv(*shlex.split(command), cwd=root / "sub dir")
    assert proc.returncode == 0 and proc.stdout.startswith("a_one (my specs/a_one.yaml)"), (command, proc.stderr)


def test_explain_json_and_svg_are_the_same_bytes_as_the_text(tmp_path):
    proc = kv("explain", "specs/ds32_mla.yaml", "--json", cwd=ROOT)
    m = json.loads(proc.stdout)
    assert [(p["kind"], p["start"], p["end"]) for p in m["record"]] == [("segment", 0, 512), ("scales", 512, 528),
                                                                         ("segment", 528, 656)]
    assert m["buffers"][0]["page_bytes"] == 656 * m["sizes"]["page_size"]
    mx = json.loads(kv("explain", "specs/dsv4_mxfp4.yaml", "--json", cwd=ROOT).stdout)
    scales = next(p for p in mx["record"] if p["kind"] == "scales")
    assert (scales["start"], scales["end"], scales["count"], scales["pad"]) == (224, 240, 14, 2)
    out = tmp_path / "k.svg"
    assert kv("explain", "specs/dsv4_k.yaml", "--svg", str(out), cwd=ROOT).returncode == 0
    text = out.read_text()
    assert text.startswith("<!-- Code generated by kvlayout from specs/dsv4_k.yaml. DO NOT EDIT. -->\n")
    keys = [e.text for e in ET.fromstring(text.split("\n", 1)[1]).iter("{http://www.w3.org/2000/svg}text")
            if e.get("class") == "k"]
    assert "bytes [36864, 37376)  nope scales  [slot:64 x head:1 x scale:8] x ue8m0, strides slot=8, head=8, scale=1" in keys
    assert "bytes [37376, 37440)  padding  never written" in keys
    assert kv("explain", "specs/dsv4_mxfp4.yaml", "--svg", str(out), cwd=ROOT).returncode == 0   # its own: replaced
    assert "from specs/dsv4_mxfp4.yaml" in out.read_text().split("\n", 1)[0]


def test_explain_never_replaces_a_file_of_the_users(tmp_path):
    """--svg given the spec itself (a slip), a file of the user's, a symlink or a folder: exit 3, the
    file untouched."""
    spec = tmp_path / "specs" / "dsv4_k.yaml"
    spec.parent.mkdir()
    (tmp_path / "kvlayout.toml").write_text('specs = "specs"\n')
    spec.write_bytes((ROOT / "specs" / "dsv4_k.yaml").read_bytes())
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    (tmp_path / "link.svg").symlink_to(notes)
    (tmp_path / "folder.svg").mkdir()
    for target, before in ((spec, spec.read_bytes()), (notes, b"mine\n"), (tmp_path / "link.svg", b"mine\n")):
        proc = kv("explain", "specs/dsv4_k.yaml", "--svg", str(target), cwd=tmp_path)
        assert proc.returncode == 3 and "a file of yours" in proc.stderr and "nothing was written" in proc.stderr, proc.stderr
        assert target.read_bytes() == before
    assert kv("explain", "specs/dsv4_k.yaml", "--svg", "folder.svg", cwd=tmp_path).returncode == 3


def _git_project(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "kvlayout.toml").write_text('specs = "specs"\n')
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "specs")
    return tmp_path


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_reports_a_bad_spec_in_the_format_asked(tmp_path):
    import json
    root = _git_project(tmp_path)
    spec = root / "specs" / "dsv4_k.yaml"
    spec.write_text(edit(spec.read_text(), "heads: 1", "heads: one"))
    proc = kv("diff", "--against", "HEAD", "--format", "json", cwd=root)
    assert proc.returncode == 2, proc.stderr
    (found,) = json.loads(proc.stdout)
    assert (found["file"], found["line"]) == ("specs/dsv4_k.yaml", 9) and found["fix"], found


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_compares_the_commit_that_removes_an_invisible_character(tmp_path):
    """An earlier revision's spec may hold what today's refuses (a zero-width space, written raw or
    as an escape): diff reads it, so the fix itself can be compared."""
    root = _git_project(tmp_path)
    spec = root / "specs" / "dsv4_k.yaml"
    good = spec.read_text()
    quoted = re.sub(r"summary: >-\n(  .*\n)+", lambda m: 'summary: "a\\u200b"\n', good, count=1)
    for bad in (edit(good, "summary: >-\n", "summary: >-\n  a\u200b"), quoted):
        assert bad != good
        spec.write_text(bad)
        assert kv("lint", cwd=root).returncode == 2
        git(root, "commit", "-qam", "an invisible character")
        spec.write_text(good)
        proc = kv("diff", "--against", "HEAD", cwd=root)
        assert proc.returncode == 0, proc.stderr
        git(root, "commit", "-qam", "removed")


def test_a_broken_pyproject_of_another_tool_is_passed_by(tmp_path):
    """A kvlayout.toml beside a pyproject.toml kvlayout cannot read, or init below one: not kvlayout's
    config, so no error of its."""
    (tmp_path / "kvlayout.toml").write_text('specs = "specs"\n')
    (tmp_path / "pyproject.toml").write_text("[tool.black\n")
    (tmp_path / "specs").mkdir()
    proc = kv("lint", cwd=tmp_path)
    assert proc.returncode == 0 and "0 spec(s) OK" in proc.stdout, proc.stderr
    (tmp_path / "kvlayout.toml").unlink()
    (tmp_path / "inner").mkdir()
    proc = kv("init", cwd=tmp_path / "inner")
    assert proc.returncode == 0 and (tmp_path / "inner" / "kvlayout.toml").is_file(), proc.stderr


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_classifies_breaking_and_compatible_changes(tmp_path):
    root = _git_project(tmp_path)
    assert kv("diff", "--against", "HEAD", cwd=root).returncode == 0
    spec = root / "specs" / "dsv4_k.yaml"
    good = spec.read_text()
    spec.write_text(edit(good, "amax_floor: 1.0e-8", "amax_floor: 1.0e-6"))      # the quantizer's choice only
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 0 and "compatible: scale group nope: amax_floor" in proc.stdout and "breaking" not in proc.stdout
    spec.write_text(edit(good, "align: 576", "align: 192"))     # same bytes at 64 and 128 slots, not at 1
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and ("breaking: buffer cache: page bytes: 1152 -> 768 (at page_size=1, heads=1, "
                                     "values=512; page.align 576 -> 192)") in proc.stdout, proc.stdout
    per_head = root / "specs" / "vllm_fp8_per_token_head.yaml"
    per_head_good = per_head.read_text()
    spec.write_text(good)
    per_head.write_text(edit(per_head_good, "scale_floor: 1.0e-6", "scale_floor: 1.0e-5"))   # exact scales are stored
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 0 and "compatible: scale group head: scale_floor: 1e-06 -> 1e-05" in proc.stdout, proc.stdout
    per_head.write_text(per_head_good)
    kv_spec = root / "specs" / "mxfp8_kv.yaml"                # head sizes other than 128 become unreadable
    kv_good = kv_spec.read_text()
    kv_spec.write_text(edit(kv_good, "values: any, dtype", "values: 128, dtype"))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and ("specs/mxfp8_kv.yaml: breaking: page_size=64, heads=8, values=256: taken by the old layout, "
                                     "refused by the new") in proc.stdout, proc.stdout
    kv_spec.write_text(kv_good)
    nvfp4 = root / "specs" / "flashinfer_nvfp4.yaml"          # codes decode as code x s, not code x s x g
    nvfp4_good = nvfp4.read_text()
    nvfp4.write_text(edit(nvfp4_good, "    global: scale ", "    # global: scale "))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "breaking: scale group scale_x: global: scale -> None" in proc.stdout, proc.stdout
    nvfp4.write_text(nvfp4_good)
    spec.write_text(edit(good, "pad_to: 8 ", "pad_to: 16"))                        # every page's bytes move
    proc = kv("diff", "--against", "HEAD", "--format", "json", cwd=root)
    changes = json.loads(proc.stdout)
    assert proc.returncode == 1 and all(c["breaking"] for c in changes)
    assert {"spec": "specs/dsv4_k.yaml", "breaking": True,
            "change": "buffer cache: page bytes: 37440 -> 38016 (at page_size=64, heads=1, values=512)"} in changes
    spec.write_text(good)
    tiles = root / "specs" / "mxfp8_kv_128x4.yaml"            # 128x8 tiles: values must be a multiple of 256
    tiles_good = tiles.read_text()
    tiles.write_text(tiles_good.replace("scale // 4", "scale // 8").replace("scale % 4", "scale % 8"))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "specs/mxfp8_kv_128x4.yaml: breaking: buffer sf" in proc.stdout, proc.stdout
    assert kv("generate", cwd=root).returncode == 0, "its picture is drawn at sizes it accepts"
    tiles.write_text(tiles_good)
    (root / "specs" / "mxfp8_kv.yaml").unlink()
    (root / "specs" / "compat" / "sglang_mxfp8.yaml").unlink()
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "breaking: layout mxfp8_kv removed" in proc.stdout
    assert kv("diff", "--against", "no-such-rev", cwd=root).returncode == 4


GIVEN_TWO = """kvlayout: 1
name: given_two
summary: Two call-time scales, one per segment.
planes: [k, v]
heads: 2
record:
  - {name: x, values: 32, dtype: fp8_e4m3fn, scale: s}
  - {name: y, values: 32, dtype: fp8_e5m2, scale: t}
scales:
  s: {format: fp32, rule: given, group: tensor}
  t: {format: fp32, rule: given, group: tensor}
buffers:
  cache: [{holds: records, order: [slot, head]}]
ops: [gather_dequant, quantize_store]
"""


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_finds_what_callers_pass_by_position(tmp_path):
    """Two call-time scales or two buffers swapped place no byte elsewhere, but a caller passing them
    by position (the torch operators do) reads one as the other; a fixed head count made free takes
    alloc_cache's default away. All breaking; a removed group's quantizer-only facts are not listed
    as compatible beside its removal. The stride of a dim of one entry (heads: 1) is no change."""
    root = _git_project(tmp_path)
    spec = root / "specs" / "given_two.yaml"
    spec.write_text(GIVEN_TWO)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "given_two")
    lines = GIVEN_TWO.splitlines(keepends=True)
    s, t = (lines.index(f"  {g}: {{format: fp32, rule: given, group: tensor}}\n") for g in "st")
    lines[s], lines[t] = lines[t], lines[s]
    spec.write_text("".join(lines))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1, proc.stdout
    assert ("specs/given_two.yaml: breaking: gather_dequant: parameters (cache, token_ids, page_size, k_s, k_t, v_s, "
            "v_t, out) -> (cache, token_ids, page_size, k_t, k_s, v_t, v_s, out)") in proc.stdout, proc.stdout
    assert "breaking: quantize_store: parameters (k, v, loc, cache, page_size, k_s, k_t" in proc.stdout
    spec.write_text(GIVEN_TWO)
    mx = root / "specs" / "mxfp8_kv.yaml"             # the buffers' order is the Cache tuple's
    good = mx.read_text()
    records, scales = good.index("  cache:"), good.index("  sf:")
    end = good.index("ops:")
    mx.write_text(good[:records] + good[scales:end] + good[records:scales] + good[end:])
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and ("specs/mxfp8_kv.yaml: breaking: Cache fields (k_cache, k_sf, v_cache, v_sf) -> "
                                     "(k_sf, k_cache, v_sf, v_cache)") in proc.stdout, proc.stdout
    mx.write_text(good)
    dsv4 = root / "specs" / "dsv4_k.yaml"           # heads: 1, so the head stride places no byte
    dsv4.write_text(edit(dsv4.read_text(), "order: [slot, head, scale]", "order: [head, slot, scale]"))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 0 and "dsv4_k" not in proc.stdout, proc.stdout
    mla = root / "specs" / "ds32_mla.yaml"
    mla.write_text(edit(mla.read_text(), "heads: 1", "heads: any"))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and ("specs/ds32_mla.yaml: breaking: alloc_cache, cache_shapes: heads has no default "
                                     "any more (was 1") in proc.stdout, proc.stdout
    git(root, "checkout", "-q", "--", "specs")
    kv_spec = root / "specs" / "zoo_two_rules.yaml"
    shutil.copy(ROOT / "tests" / "specs" / "zoo_two_rules.yaml", kv_spec)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "two rules")
    text = kv_spec.read_text()
    for line in ("  b: {format: ue8m0, rule: nearest, exponent_range: [-60, 60], group: {values: 16}, pad_to: 6, "
                 "ue8m0_ff: nan}\n", "    - {holds: b, order: [slot % 8, head, slot // 8, scale]}\n"):
        text = edit(text, line, "")
    kv_spec.write_text(edit(text, "values: 64, dtype: fp8_e5m2, scale: b}", "values: 64, dtype: fp16}"))   # b: raw
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "breaking: scale group b: format: removed (was ue8m0)" in proc.stdout, proc.stdout
    assert "compatible" not in proc.stdout, proc.stdout


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_finds_every_moved_region_and_a_stricter_page_size(tmp_path):
    """For every shipped layout: reversing a buffer's regions (where it has two) moves bytes, and a
    page multiple the old one is not a multiple of refuses pages the old layout took: both breaking;
    the reverse page change (less strict) is compatible."""
    root = _git_project(tmp_path)
    layouts, _ = pipeline.build_all(config.at_root(root))
    reversed_ = []
    for name, layout in sorted(layouts.items()):
        spec = root / "specs" / f"{name}.yaml"
        good = spec.read_text()
        block = good[good.index("buffers:"):good.index("ops:")]
        items = [line for line in block.splitlines() if line.strip().startswith("- {holds:")]
        buffers = [line for line in block.splitlines() if re.match(r"  [a-z_]+:", line)]
        if len(items) == 2 and len(buffers) == 1:                   # one buffer of two regions: swap them
            spec.write_text(good.replace(block, block.replace(items[0], "\0").replace(items[1], items[0])
                                                     .replace("\0", items[1])))
            proc = kv("diff", "--against", "HEAD", cwd=root)
            assert proc.returncode == 1 and f"specs/{name}.yaml: breaking: buffer " in proc.stdout, (name, proc)
            reversed_.append(name)
        multiple = layout.page_size_multiple
        stricter = (good.replace(f"size_multiple_of: {multiple}", f"size_multiple_of: {multiple * 2}", 1)
                    if "size_multiple_of:" in good else edit(good, "kvlayout: 1\n", "kvlayout: 1\npage: {size_multiple_of: 2}\n"))
        spec.write_text(stricter)
        proc = kv("diff", "--against", "HEAD", cwd=root)
        assert proc.returncode == 1 and "breaking: page sizes" in proc.stdout, (name, proc.stdout, proc.stderr)
        spec.write_text(good)
    assert len(reversed_) >= 3, reversed_
    git(root, "commit", "-qam", "stricter", "--allow-empty")
    spec = root / "specs" / "mxfp8_kv.yaml"
    good = spec.read_text()
    spec.write_text(good.replace("size_multiple_of: 32", "size_multiple_of: 64", 1))
    git(root, "commit", "-qam", "stricter")
    spec.write_text(good)
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 0 and "compatible: page sizes: a multiple of 64 -> of 32" in proc.stdout, proc.stdout


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_follows_a_renamed_spec_folder(tmp_path):
    """The revision's specs are read from the folders its own config named: a spec folder renamed in
    the working tree is compared spec by spec (a breaking edit made with the move is found, and an
    unchanged spec is no change), not taken for new layouts; a bad config at the revision is an error
    naming it (exit 4)."""
    root = _git_project(tmp_path)
    git(root, "mv", "specs", "layouts")
    (root / "kvlayout.toml").write_text('specs = "layouts"\n')
    assert kv("diff", "--against", "HEAD", cwd=root).returncode == 0
    spec = root / "layouts" / "dsv4_k.yaml"
    spec.write_text(edit(spec.read_text(), "align: 576", "align: 192"))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "layouts/dsv4_k.yaml: breaking: buffer cache: page bytes" in proc.stdout, proc
    assert "added" not in proc.stdout, proc.stdout
    git(root, "commit", "-qam", "moved")
    for bad in ('specs = "../elsewhere"\n', 'specs = ["layouts", "layouts"]\n'):
        (root / "kvlayout.toml").write_text(bad)
        git(root, "commit", "-qam", "a config this kvlayout refuses")
        (root / "kvlayout.toml").write_text('specs = "layouts"\n')
        proc = kv("diff", "--against", "HEAD", cwd=root)
        assert proc.returncode == 4 and "HEAD:kvlayout.toml: spec" in proc.stderr, proc
        assert "Traceback" not in proc.stderr and "kvlayout-diff-" not in proc.stderr, proc.stderr
    git(root, "commit", "-qam", "good again")
    # the config moved into pyproject.toml along with the folder: still followed
    (root / "kvlayout.toml").unlink()
    (root / "pyproject.toml").write_text('[tool.kvlayout]\nspecs = "kv"\n')
    git(root, "mv", "layouts", "kv")
    spec = root / "kv" / "mxfp8_kv.yaml"
    spec.write_text(spec.read_text().replace("size_multiple_of: 32", "size_multiple_of: 64", 1))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "kv/mxfp8_kv.yaml: breaking: page sizes" in proc.stdout, proc
    assert "added" not in proc.stdout, proc.stdout


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_reads_a_symlinked_spec_folder_as_the_revision_has_it(tmp_path):
    """A spec folder renamed with a symlink left at its old name (the config unchanged) is read at the
    revision where it was then, not through today's link (every layout "added", exit 0, a breaking
    edit passed); a folder the revision holds as a symlink is followed in the revision's tree, and one
    leading outside the repository is an error."""
    root = _git_project(tmp_path)
    git(root, "mv", "specs", "kv")
    (root / "specs").symlink_to("kv")
    spec = root / "kv" / "mxfp8_kv.yaml"
    spec.write_text(spec.read_text().replace("size_multiple_of: 32", "size_multiple_of: 64", 1))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "specs/mxfp8_kv.yaml: breaking: page sizes" in proc.stdout, proc
    assert "added" not in proc.stdout, proc.stdout
    git(root, "add", "-A")
    git(root, "commit", "-qm", "a link at the old name")
    spec.write_text(spec.read_text().replace("size_multiple_of: 64", "size_multiple_of: 128", 1))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and "page sizes: a multiple of 64 -> of 128" in proc.stdout and "added" not in proc.stdout, proc
    (root / "specs").unlink()
    (tmp_path / "outside").mkdir()
    (root / "specs").symlink_to(tmp_path / "outside")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "a link leading outside")
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 4 and "leads outside the git repository" in proc.stderr, proc


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_of_compat_calls(tmp_path):
    root = _git_project(tmp_path)
    spec = root / "specs" / "compat" / "sglang_mxfp8.yaml"
    good = spec.read_text()
    cases = [("params: [x, out_dtype=torch.bfloat16]", "params: [x, out_dtype=torch.float16]", True,
              "default of out_dtype: torch.bfloat16 -> torch.float16"),
             ("params: [x, out_dtype=torch.bfloat16]", "params: [x, out_dtype]", True, "default of out_dtype: dropped"),
             ("MXFP8Tensor: [data, scale]", "MXFP8Tensor: [scale, data]", True, "type MXFP8Tensor: fields"),
             ("    returns: MXFP8Tensor\n", "", True, "returns MXFP8Tensor -> the op result"),
             ("params: [x]\n", "params: [x, y=None]\n    unused: [y]\n", False, "parameter y added (default None)"),
             ("    raw_cache: true\n", "", True, "quant_store_kv_mxfp8: flat and token-major cache tensors refused")]
    for old, new, breaking, words in cases:
        spec.write_text(edit(good, old, new))
        proc = kv("diff", "--against", "HEAD", cwd=root)
        assert proc.returncode == int(breaking) and words in proc.stdout, (old, proc.stdout, proc.stderr)
    spec.write_text(good)
    dsv4 = root / "specs" / "compat" / "sglang_dsv4.yaml"
    good = dsv4.read_text()
    dsv4.write_text(edit(good, "    call: dsv4_k.gather_dequant\n", "    call: dsv4_k.gather_dequant\n    raw_cache: true\n"))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 0 and "dequantize_k_cache_paged: flat and token-major cache tensors taken" in proc.stdout
    dsv4.write_text(good)
    vllm = root / "specs" / "compat" / "vllm_ds32.yaml"
    good = vllm.read_text()
    for old, new, breaking, words in (
            ('scale_fmt: ["", null, ue8m0]', 'scale_fmt: ["", ue8m0]', True, "scale_fmt now takes only"),
            ('scale_fmt: ["", null, ue8m0]', 'scale_fmt: ["", null, ue8m0, fp32]', False, "scale_fmt takes"),
            # a value the function took now reaches another layout: another scale rule in callers' caches
            ("when: {scale_fmt: [ue8m0]}", "when: {scale_fmt: [ue8m0, '']}", True,
             "where scale_fmt is '', calls ds32_indexer.quantize_store -> ds32_indexer_ue8m0.quantize_store"),
            ("    cases:\n      - {when: {scale_fmt: [ue8m0]}, layout: ds32_indexer_ue8m0}\n", "", True,
             "where scale_fmt is 'ue8m0', calls ds32_indexer_ue8m0.quantize_store -> ds32_indexer.quantize_store")):
        vllm.write_text(edit(good, old, new))
        proc = kv("diff", "--against", "HEAD", cwd=root)
        assert proc.returncode == int(breaking) and f"function indexer_k_quant_and_cache: {words}" in proc.stdout, proc.stdout
    vllm.write_text(good)


def test_spec_folders_must_exist_not_overlap_and_names_stay_unique(tmp_path):
    (tmp_path / "kvlayout.toml").write_text('specs = "spec"\n')              # a typo: no such folder
    (tmp_path / "specs").mkdir()
    proc = kv("generate", cwd=tmp_path)
    assert proc.returncode == 4 and "specs = 'spec': no such folder" in proc.stderr
    (tmp_path / "kvlayout.toml").write_text('specs = ["specs", "specs/more"]\n')
    (tmp_path / "specs" / "more").mkdir()
    assert "overlap" in kv("lint", cwd=tmp_path).stderr
    (tmp_path / "more").mkdir()
    (tmp_path / "kvlayout.toml").write_text('specs = ["specs", "more"]\n')
    for folder in ("specs", "more"):
        shutil.copy(ROOT / "specs" / "dsv4_k.yaml", tmp_path / folder)
    proc = kv("lint", cwd=tmp_path)
    assert proc.returncode == 2 and "spec names are unique across spec folders" in proc.stderr, proc.stderr
    assert kv("new", "dsv4_k", cwd=tmp_path).returncode == 4, "new looks in every spec folder"
    proc = kv("new", "import", cwd=tmp_path)
    assert proc.returncode == 4 and not (tmp_path / "specs" / "import.yaml").exists(), "a keyword NAME is bad usage"
    (tmp_path / "broken.yaml").write_text((ROOT / "specs" / "dsv4_k.yaml").read_text().replace("heads: 1", "heads: 0"))
    proc = kv("new", "other", "--like", str(tmp_path / "broken.yaml"), cwd=tmp_path)
    assert proc.returncode == 2 and "would not lint" in proc.stderr, proc.stderr
    assert not (tmp_path / "specs" / "other.yaml").exists(), "nothing that fails lint stays"


def test_a_linked_config_keeps_its_own_folder_as_the_root(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "kvlayout.toml").write_text('specs = "specs"\n')
    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "dsv4_k.yaml", repo / "specs")
    (repo / "kvlayout.toml").symlink_to(shared / "kvlayout.toml")
    assert kv("generate", cwd=repo).returncode == 0
    assert (repo / "generated" / "dsv4_k.py").is_file() and not (shared / "generated").exists()


def test_a_config_of_another_name_and_a_stray_tool_key(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "ci.toml").write_text('specs = "specs"\n')
    assert kv("--config", str(tmp_path / "ci.toml"), "lint", cwd=tmp_path).returncode == 0
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pyproject.toml").write_text("tool = 3\n")
    proc = kv("lint", cwd=tmp_path / "sub")
    assert proc.returncode == 4 and "[tool] must be a table" in proc.stderr and "Traceback" not in proc.stderr


def test_staging_keeps_folder_modes(tmp_path):
    (tmp_path / "kvlayout.toml").write_text('specs = "specs"\n')
    (tmp_path / "specs").mkdir()
    shutil.copy(ROOT / "specs" / "dsv4_k.yaml", tmp_path / "specs")
    private = tmp_path / "generated" / "private"
    private.mkdir(parents=True)
    private.chmod(0o700)
    (tmp_path / "generated").chmod(0o750)
    assert kv("generate", cwd=tmp_path).returncode == 0
    assert private.stat().st_mode & 0o777 == 0o700 and (tmp_path / "generated").stat().st_mode & 0o777 == 0o750


# --- the wheel, end to end --------------------------------------------------------------------------

def _tree_digest(path: Path) -> dict:
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _tree_listing(path: Path) -> dict:
    """(size, mtime) of every file below `path` (a cheaper fingerprint for a large tree)."""
    out = {}
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            st = os.lstat(os.path.join(folder, f))
            out[os.path.join(folder, f)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_the_wheel_in_a_fresh_environment_and_repository(tmp_path):
    """Build the wheel from a copy of the sources, install it into a new virtual environment (the test
    environment's torch and triton reached through a .pth file, no network), and in a new git
    repository run init, new, generate, check, lint, diff and explain; then import the generated module
    and round-trip data through its reference ops. Nothing outside that repository changes."""
    source = tmp_path / "src"
    for part in ("codegen", "generated", "bench", "specs"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    bare = {"PYTHONPATH": ""}            # (the checkout on the path would count as kvlayout installed)
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                str(tmp_path / "dist"), str(source)], cwd=tmp_path, env=bare)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("kvlayout-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"kvlayout", wheel.name.split("-py3")[0] + ".dist-info"}
    for data in ("kvlayout/generated/spec.schema.json", "kvlayout/generated/SPEC_REFERENCE.md",
                 "kvlayout/templates/example_spec.yaml.j2", "kvlayout/specs/dsv4_k.yaml", "kvlayout/generated/dsv4_k.py"):
        assert data in names, data

    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env=bare).returncode == 0
    python = venv / "bin" / "python"
    proc = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                str(wheel)], cwd=tmp_path, env=bare)
    assert proc.returncode == 0, proc.stderr
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=tmp_path, env=bare).stdout.strip())
    (site / "zz_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")   # torch, triton, jinja2, yaml
    installed = _tree_digest(site)
    test_env = _tree_listing(Path(sysconfig.get_paths()["purelib"]))
    checkout = run([GIT, "status", "--porcelain", "--ignored"], cwd=ROOT).stdout if (ROOT / ".git").exists() else None

    repo = tmp_path / "repo"
    repo.mkdir()
    env = {"PYTHONPATH": "", "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    def kvl(*args):
        proc = run([str(venv / "bin" / "kvlayout"), *args], cwd=repo, env=env)
        transcript.append(f"$ kvlayout {' '.join(args)}  # exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc

    transcript = []
    git(repo, "init", "-q")
    assert kvl("--version").stdout.startswith("kvlayout 0.")
    assert kvl("init").returncode == 0
    assert kvl("new", "my_dsv4", "--like", "dsv4_k").returncode == 0
    proc = kvl("generate")
    assert proc.returncode == 0 and "wrote generated/my_dsv4.py" in proc.stdout, proc.stderr
    assert kvl("check").returncode == 0
    module = repo / "generated" / "my_dsv4.py"
    text = module.read_text()
    assert text.startswith("# Code generated by kvlayout from specs/my_dsv4.yaml. DO NOT EDIT.\n")
    module.write_text(text + "# an edit\n")
    proc = kvl("check")
    assert proc.returncode == 1 and "changed: generated/my_dsv4.py" in proc.stdout and "-# an edit" in proc.stdout
    assert kvl("generate").returncode == 0 and kvl("check").returncode == 0
    assert kvl("lint").returncode == 0
    spec = repo / "specs" / "my_dsv4.yaml"
    good = spec.read_text()
    spec.write_text(edit(good, "heads: 1", "heads: one"))
    proc = kvl("lint", "--format", "github")
    assert proc.returncode == 2 and "::error file=specs/my_dsv4.yaml,line=" in proc.stdout
    spec.write_text(good)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "layouts")
    spec.write_text(edit(good, "amax_floor: 1.0e-8", "amax_floor: 1.0e-6"))
    proc = kvl("diff", "--against", "HEAD")
    assert proc.returncode == 0 and "compatible" in proc.stdout
    spec.write_text(edit(good, "pad_to: 8 ", "pad_to: 16"))
    proc = kvl("diff", "--against", "HEAD")
    assert proc.returncode == 1 and "breaking: buffer cache: page bytes" in proc.stdout
    spec.write_text(good)
    assert kvl("explain", "specs/my_dsv4.yaml", "--svg", "my_dsv4.svg").returncode == 0
    assert ET.fromstring((repo / "my_dsv4.svg").read_text().split("\n", 1)[1]).tag.endswith("svg")

    roundtrip = """
import torch, generated.my_dsv4 as m, kvlayout.generated.dsv4_k as shipped
g = torch.Generator().manual_seed(0)
x = torch.randn(40, 1, 512, generator=g).to(torch.bfloat16)
data, scale = m.quantize_ref(x)
assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip((data, scale), shipped.quantize_ref(x)))
y = m.dequantize_ref(data, scale, torch.float32)
assert ((y - x.float()).abs() <= x.float().abs().amax(-1, keepdim=True) / 8).all()
cache = m.alloc_cache(3, 16, device="cpu")
loc = torch.randperm(48, generator=g)[:40]
m.quantize_store_ref(x, loc, cache, 16)
out = m.gather_dequant_ref(cache, loc, 16)
want = m.dequantize_ref(data, scale, out.dtype)
assert torch.equal(out.view(torch.int16), want.view(torch.int16)), "the cache round trip is quantize's"
print("round trip ok", m.__file__)
"""
    proc = run([str(python), "-c", roundtrip], cwd=repo, env=env)
    assert proc.returncode == 0 and f"round trip ok {module}" in proc.stdout, proc.stderr
    for name in ("codegen", "generated", "bench"):
        proc = run([str(python), "-c", f"import {name}"], cwd=tmp_path, env=env)
        assert proc.returncode != 0, f"the wheel installs no top-level {name!r}"
    assert _tree_digest(site) == installed, "the fresh environment's packages are unchanged"
    assert _tree_listing(Path(sysconfig.get_paths()["purelib"])) == test_env, "the test environment is unchanged"
    if checkout is not None:
        assert run([GIT, "status", "--porcelain", "--ignored"], cwd=ROOT).stdout == checkout, "the checkout is unchanged"
    print("\n".join(transcript))


def test_the_two_test_processes_run_every_test_once():
    """make test's runner (tests/run.py): one process takes tests/test_kernels.py less the moved
    tests (deselected by their parametrized ids, so test_quantize_store stays) and the files beside
    it, the other every other test file and the moved tests. pytest collects test_kernels.py's part
    of each: together they are the file's tests, none twice."""
    from tests import run
    kernels, others = run.groups()
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py"))
    alone = len(files) - 1 - len(run.BESIDE)             # the files of the other process
    assert kernels[: 1 + len(run.BESIDE)] == [run.KERNELS, *run.BESIDE]
    assert sorted([run.KERNELS, *run.BESIDE, *others[:alone]]) == files
    assert others[alone:] == list(run.MOVED)
    jobs = [subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for args in ([run.KERNELS], kernels, list(run.MOVED))]
    whole, kept, moved = ({line for line in job.communicate()[0].splitlines() if line.startswith(f"{run.KERNELS}::")}
                          for job in jobs)
    assert whole and kept and all(any(t.startswith(f"{test}[") for t in moved) for test in run.MOVED)
    assert not kept & moved and kept | moved == whole

def test_the_runner_fails_when_a_process_fails_or_none_selects_a_test():
    from tests.run import NO_TESTS, status
    assert status([0, 0]) == 0 and status([NO_TESTS, 0]) == 0 and status([0, NO_TESTS]) == 0
    assert status([1, 0]) == 1 and status([NO_TESTS, 2]) == 2 and status([0, 1]) == 1
    assert status([NO_TESTS, NO_TESTS]) == NO_TESTS


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_diff_compares_with_a_revision_this_release_would_refuse(tmp_path):
    """A revision's spec whose page.size_multiple_of allows page sizes that misalign a region (refused
    now, checked per call before) is still read by diff, so the change that fixes it is compared."""
    root = tmp_path
    git(root, "init", "-q")
    (root / "kvlayout.toml").write_text('specs = "specs"\n')
    (root / "specs").mkdir()
    spec = root / "specs" / "dsv4_k.yaml"
    good = (ROOT / "specs" / "dsv4_k.yaml").read_text()
    spec.write_text(edit(edit(good, "align: 576 ", "align: 1   "), "pad_to: 8 ", "pad_to: 7 "))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "odd page sizes misalign the rope values")
    proc = kv("lint", cwd=root)
    assert proc.returncode == 2 and "page.size_multiple_of: 1 allows page_size=1" in proc.stderr, proc.stderr
    spec.write_text(edit(spec.read_text(), "size_multiple_of: 1", "size_multiple_of: 2"))
    proc = kv("diff", "--against", "HEAD", cwd=root)
    assert proc.returncode == 1 and proc.stdout == ("specs/dsv4_k.yaml: breaking: page sizes: a multiple of 1 -> of 2 "
                                                    "(some pages the old layout took are refused)\n"), proc.stderr
