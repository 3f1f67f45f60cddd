"""The kvlayout CLI: spec errors point at file:line:col with exit 2; generate/check/explain."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

GOOD = (ROOT / "specs" / "dsv4_k.yaml").read_text()


def kvlayout(*args, root=ROOT, workspace=None):
    """The checkout's CLI on `root`, as if in a GitHub workflow whose repository is at `workspace`."""
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_WORKSPACE"} | {"PYTHONPATH": str(ROOT)}
    if workspace is not None:
        env["GITHUB_WORKSPACE"] = str(workspace)
    return subprocess.run([sys.executable, "-m", "codegen", "--root", str(root), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


CONFIG = 'specs = "specs"\noutput = "generated"\npackage = "generated"\n'


def copy_repo(tmp_path: Path) -> Path:
    """The repository's specs and generated package under a config of their own (no pictures)."""
    for part in ("specs", "generated"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "kvlayout.toml").write_text(CONFIG)
    return tmp_path


def with_spec(tmp_path: Path, text: str, name: str = "dsv4_k.yaml") -> Path:
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "kvlayout.toml").write_text(CONFIG)
    (tmp_path / "specs" / name).write_text(text)
    return tmp_path


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


BAD_SPECS = [
    # (what, edited spec, "line:col", words the message must contain)
    ("wrong type", edit(GOOD, "heads: 1", "heads: one"), "9:8", ["heads", "expected an integer", "'one'",
                                                                 "(fix: write an integer in [1, 4096] or one of 'any')"]),
    ("a quoted number", edit(GOOD, "heads: 1", 'heads: "2"'), "9:8", ["(fix: write a whole number without quotes)"]),
    ("a number YAML 1.1 reads as text", edit(GOOD, "align: 576", "align: 0o1100"), None,
     ["expected an integer", "'0o1100'", "(fix: write a whole number in decimal digits)"]),
    ("alternatives together", edit(GOOD, "group: {values: 64}", "group: {values: 64, tokens: 2}"), "23:12",
     ["{values: N} and {tokens: N} are alternatives", "(fix: keep one of 'values', 'tokens')"]),
    ("no alternative's field", edit(GOOD, "group: {values: 64}", "group: {tokenz: 2}"), "23:13",
     ["unknown field(s) 'tokenz'", "did you mean 'tokens'? write one of {values: N}, {tokens: N}"]),
    ("a segment's misspelt field", edit(GOOD, "dtype: fp8_e4m3fn, scale: nope}", "dtype: fp8_e4m3fn, scales: nope}"),
     "16:50", ["record[0]: unknown field 'scales'", "did you mean 'scale'"]),
    ("a name's pattern", edit(GOOD, "scale: nope}", "scale: Nope-1}"), "16:57", ["it must match"]),
    ("a floor above the bound", edit(GOOD, "amax_floor: 1.0e-8", "amax_floor: 3.4e+38"), "22:17",
     ["not a normal fp32 number of at most 3.0e+38", "use a value from 1.2e-38 to 3.0e+38"]),
    ("unknown field", edit(GOOD, "record:", "recrod:"), "15:1", ["unknown field 'recrod'", "did you mean 'record'"]),
    ("group does not divide", edit(GOOD, "group: {values: 64}", "group: {values: 60}"), "23:12",
     ["60 does not divide", "448"]),
    ("missing field", edit(GOOD, "planes: [k]\n", ""), "2:1", ["missing required field 'planes'"]),
    ("unknown scale group", edit(GOOD, "scale: nope}", "scale: nop}"), "16:57", ["no scale group named 'nop'"]),
    ("order misses a coordinate", edit(GOOD, "order: [slot, head, scale]", "order: [slot, scale]"), "29:28",
     ["missing coordinate 'head'"]),
    ("split needs page multiple", edit(GOOD, "order: [slot, head]}", "order: [slot % 32, slot // 32, head]}"),
     "28:32", ["page.size_multiple_of"]),
    ("name mismatch", edit(GOOD, "name: dsv4_k", "name: dsv5"), "3:7", ["must equal the file name"]),
    ("bad enum", edit(GOOD, "dtype: fp8_e4m3fn", "dtype: fp8_e4m3"), "16:38", ["did you mean 'fp8_e4m3fn'"]),
    ("YAML syntax", edit(GOOD, "heads: 1", "heads: [1"), "10:5", ["YAML syntax error"]),
    ("exact needs fp32", edit(GOOD, "rule: rceil ", "rule: exact "), "21:11", ["need format: fp32"]),
    ("ue8m0 option on fp32", edit(GOOD, "format: ue8m0", "format: fp32"), "24:5", ["only ue8m0 scales have a byte"]),
    ("ue8m0_ff on fp32", edit(edit(GOOD, "format: ue8m0", "format: fp32"), "ue8m0_zero: zero ", "ue8m0_ff: nan    "),
     "24:5", ["ue8m0_ff: only ue8m0 scales have a byte 0xFF"]),
    ("tokens group is not padded", edit(edit(GOOD, "group: {values: 64}", "group: {tokens: 64}"), "size_multiple_of: 1",
                                        "size_multiple_of: 64"), "25:13", ["only {values: N} groups are padded"]),
    ("tokens group not a power of two", edit(edit(edit(GOOD, "group: {values: 64}", "group: {tokens: 24}"), "size_multiple_of: 1",
                                              "size_multiple_of: 24"), "    pad_to: 8 ", "    # "), "23:12",
     ["{tokens: 24} is not a power of two", "{tokens: 16}"]),
    ("misaligned raw", edit(edit(GOOD, "values: 448", "values: 447"), "group: {values: 64}", "group: {values: 447}"),
     None, ["not a multiple of 2"]),
    # escapes of a quoted string that no generated file can hold (a NUL in Python source, a lone surrogate in UTF-8)
    ("escaped NUL", edit(GOOD, "summary: >-\n", 'summary: "a\\0b"\nabout: >-\n'), "4:10",
     ["the string holds U+0000", "from an escape", "fix: remove the escape"]),
    ("escaped surrogate", edit(GOOD, "summary: >-\n", 'summary: "a\\ud800b"\nabout: >-\n'), "4:10", ["U+D800"]),
    # bidi controls and invisible characters, which a generated docstring would show otherwise than it holds
    ("escaped bidi override", edit(GOOD, "summary: >-\n", 'summary: "a\\u202eb"\nabout: >-\n'), "4:10",
     ["U+202E", "invisible or bidi character"]),
    ("bidi override", edit(GOOD, "summary: >-\n", "summary: a\u202eb\nabout: >-\n"), "4:11",
     ["an invisible or bidi control character U+202E in the file"]),
    ("zero-width space", edit(GOOD, "summary: >-\n", "summary: a\u200bb\nabout: >-\n"), "4:11", ["U+200B"]),
    ("tag character", edit(GOOD, "summary: >-\n", "summary: a\U000e0041b\nabout: >-\n"), "4:11", ["U+E0041"]),
    ("key not a plain scalar", GOOD + "~: 2\n", None, ["mapping keys must be plain scalars", "fix: write the key"]),
    # page sizes of 1 slot would put the 64 bf16 rope values at odd addresses: refused where the spec says so
    ("page sizes that misalign", edit(edit(GOOD, "align: 576 ", "align: 1   "), "pad_to: 8 ", "pad_to: 7 "), "11:21",
     ["page.size_multiple_of: 1 allows page_size=1", "bf16 segment 'rope' would be misaligned",
      "fix: set page.size_multiple_of: 2"]),
]


@pytest.mark.parametrize("what,text,where,words", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_reported_at_its_position(tmp_path, what, text, where, words):
    root = with_spec(tmp_path, text)
    for verb in (["generate"], ["check"], ["explain", "specs/dsv4_k.yaml"]):
        proc = kvlayout(*verb, root=root)
        assert proc.returncode == 2, (verb, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        line = next(l for l in proc.stderr.splitlines() if l.startswith("specs/dsv4_k.yaml:"))
        if where:
            assert line.startswith(f"specs/dsv4_k.yaml:{where}: "), line
        for w in words:
            assert w in line, (w, line)
    assert not (root / "generated").exists(), "a failed generate must not write"


def test_failed_generate_leaves_generated_untouched(tmp_path):
    root = copy_repo(tmp_path)
    before = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    (root / "specs" / "mxfp8_kv.yaml").write_text(edit((root / "specs" / "mxfp8_kv.yaml").read_text(),
                                                       "group: {values: 32}", "group: {valuez: 32}"))
    (root / "specs" / "dsv4_k.yaml").write_text(edit(GOOD, "align: 576", "align: 577"))  # valid change
    proc = kvlayout("generate", root=root)
    assert proc.returncode == 2 and "specs/mxfp8_kv.yaml:" in proc.stderr
    after = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    assert after == before


def test_check_is_clean_on_the_repo():
    proc = kvlayout("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_names_changed_missing_and_orphan_files(tmp_path):
    root = copy_repo(tmp_path)
    assert kvlayout("check", root=root).returncode == 0
    changed = root / "generated" / "dsv4_k.py"
    changed.write_text(changed.read_text().replace('LAYOUT = "dsv4_k"', 'LAYOUT = "edited"'))
    (root / "generated" / "compat" / "sglang_mxfp8.py").unlink()
    (root / "generated" / "stray.py").write_text("# Code generated by kvlayout from specs/stray.yaml. DO NOT EDIT.\n")
    (root / "generated" / "NOTES.md").write_bytes(b"the user's own notes, not UTF-8: \xe9\n")
    proc = kvlayout("check", root=root)
    assert proc.returncode == 1
    assert "changed: generated/dsv4_k.py" in proc.stdout and '+LAYOUT = "dsv4_k"' in proc.stdout
    assert "missing: generated/compat/sglang_mxfp8.py" in proc.stdout
    assert "orphan: generated/stray.py" in proc.stdout
    assert "NOTES.md" not in proc.stdout, "a file kvlayout did not write is no orphan"
    # generate repairs exactly those files, and then check is clean again; the notes stay
    proc = kvlayout("generate", root=root)
    assert proc.returncode == 0
    assert sorted(l for l in proc.stdout.splitlines() if l.startswith(("wrote", "removed"))) == [
        "removed generated/stray.py", "wrote generated/compat/sglang_mxfp8.py", "wrote generated/dsv4_k.py"]
    assert (root / "generated" / "NOTES.md").read_bytes() == b"the user's own notes, not UTF-8: \xe9\n"
    assert kvlayout("check", root=root).returncode == 0
    proc = kvlayout("generate", root=root)
    assert "0 written, 0 removed" in proc.stdout


def test_generate_one_spec_writes_only_its_module(tmp_path):
    root = copy_repo(tmp_path)
    (root / "generated" / "mxfp8_kv.py").unlink()
    (root / "generated" / "stray.py").write_text("# Code generated by kvlayout from specs/stray.yaml. DO NOT EDIT.\n")
    proc = kvlayout("generate", "specs/mxfp8_kv.yaml", root=root)
    assert proc.returncode == 0, proc.stderr
    assert [l for l in proc.stdout.splitlines() if l.startswith("wrote")] == ["wrote generated/mxfp8_kv.py"]
    assert (root / "generated" / "stray.py").exists(), "orphans are only removed by a full generate"


def test_generating_a_new_spec_lists_it_in_the_package(tmp_path):
    root = copy_repo(tmp_path)
    (root / "specs" / "zz.yaml").write_text(edit(GOOD, "name: dsv4_k", "name: zz"))
    proc = kvlayout("generate", "specs/zz.yaml", root=root)
    assert proc.returncode == 0, proc.stderr
    assert sorted(l for l in proc.stdout.splitlines() if l.startswith("wrote")) == [
        "wrote generated/__init__.py", "wrote generated/zz.py"]
    assert "  zz\n" in (root / "generated" / "__init__.py").read_text()
    assert kvlayout("check", root=root).returncode == 0


SPEC_PLACES = [
    # (what, where the spec file goes, the path given to generate, words of the error)
    ("a layout spec in specs/compat/", "specs/compat/dsv4_k.yaml", "specs/compat/dsv4_k.yaml", ["must sit in specs/"]),
    ("a spec in a subfolder", "specs/sub/zz.yaml", "specs/sub/zz.yaml", ["must sit in specs/", "specs/zz.yaml"]),
    ("a spec outside the root", "../elsewhere/dsv4_k.yaml", "ELSEWHERE", ["must sit in specs/"]),
]


@pytest.mark.parametrize("what,place,given,words", SPEC_PLACES, ids=[c[0] for c in SPEC_PLACES])
def test_specs_outside_their_folder_are_rejected(tmp_path, what, place, given, words):
    root = copy_repo(tmp_path / "repo")
    path = (root / place).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(edit(GOOD, "name: dsv4_k", f"name: {path.stem}"))
    before = {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()}
    for verb in (["generate"], ["check"]) if place.startswith("specs/compat") else (["generate", str(path) if given == "ELSEWHERE" else given],):
        proc = kvlayout(*verb, root=root)
        assert proc.returncode == 2, (verb, proc.stdout, proc.stderr)
        assert all(w in proc.stderr for w in words), proc.stderr
        assert "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in (root / "generated").rglob("*") if p.is_file()} == before


def test_a_compat_spec_named_like_a_layout_is_rejected(tmp_path):
    root = copy_repo(tmp_path)
    text = (root / "specs" / "compat" / "sglang_dsv4.yaml").read_text().replace("compat: sglang_dsv4", "compat: dsv4_k")
    (root / "specs" / "compat" / "dsv4_k.yaml").write_text(text)
    proc = kvlayout("generate", root=root)
    assert proc.returncode == 2 and "specs/compat/dsv4_k.yaml:" in proc.stderr and "unique across spec folders" in proc.stderr


def test_a_symlinked_spec_is_named_by_its_place_in_specs(tmp_path):
    root = copy_repo(tmp_path / "repo")
    target = tmp_path / "shared" / "zz.yaml"
    target.parent.mkdir()
    target.write_text(edit(GOOD, "name: dsv4_k", "name: zz"))
    (root / "specs" / "zz.yaml").symlink_to(target)
    assert kvlayout("generate", "specs/zz.yaml", root=root).returncode == 0
    assert (root / "generated" / "zz.py").read_text().startswith("# Code generated by kvlayout from specs/zz.yaml.")
    assert kvlayout("check", root=root).returncode == 0


def test_explain_dsv4_byte_map():
    proc = kvlayout("explain", "specs/dsv4_k.yaml", "--page-size", "64")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # The seed's layout: 576-byte records, the 8-byte scale trailer at 64 * 576, pages of 37440 bytes.
    assert "record: 576 bytes per token and head" in out
    assert "buffer cache: 37440 bytes per page" in out
    assert "bytes [  36864,   37376)  nope scales [slot:64, head:1, scale:8] x 1 B" in out
    assert "bytes [  37376,   37440)  padding" in out
    assert "slot 65 (page 1, slot 1): record at cache+38016; nope scales at cache+74312" in out


def test_explain_mxfp8_interleaved_scales():
    proc = kvlayout("explain", "specs/mxfp8_kv.yaml", "--page-size", "128", "--heads", "8", "--values", "128")
    assert proc.returncode == 0, proc.stderr
    assert "sf: 1024 bytes per page" not in proc.stdout
    assert "buffer sf: 4096 bytes per page, alloc shape (num_pages, 8, 32, 4, 4) uint8" in proc.stdout


def test_explain_rejects_sizes_the_spec_forbids():
    """Sizes the layout refuses are a bad argument (usage, exit 4), not a bad spec."""
    proc = kvlayout("explain", "specs/mxfp8_kv.yaml", "--page-size", "48")
    assert proc.returncode == 4 and "page_size must be a multiple of 32" in proc.stderr
    proc = kvlayout("explain", "specs/dsv4_k.yaml", "--heads", "5")      # the spec fixes one head
    assert proc.returncode == 4 and "--heads: dsv4_k has 1 heads (the spec fixes them), not 5" in proc.stderr


def test_every_type_problem_of_a_file_is_reported(tmp_path):
    """Each field is checked: a file's type problems come out together, one line each, in file order (a
    misspelt key once, not also as its missing field)."""
    text = edit(edit(edit(edit(GOOD, "heads: 1", "heads: one"), "record:", "record:\n  - {name: x, valuez: 2, dtype: bf16}"),
                     "amax_floor: 1.0e-8", "amax_floor: -1"), "ops: [gather_dequant,", "ops: [gather_dequant, launch,")
    root = with_spec(tmp_path, text)
    proc = kvlayout("check", root=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("specs/dsv4_k.yaml:")]
    assert [l.split(": ", 2)[1] for l in lines] == ["heads", "record[0]", "scales.nope.amax_floor", "ops[1]"], lines
    assert all("(fix: " in l for l in lines)
    assert [int(l.split(":")[1]) for l in lines] == sorted(int(l.split(":")[1]) for l in lines)
    assert "must be a number above 0, got -1" in proc.stderr


def test_a_layout_with_a_stray_compat_key_blames_that_key(tmp_path):
    root = with_spec(tmp_path, GOOD + "compat: dsv4_k\n")
    proc = kvlayout("check", root=root)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"specs/dsv4_k.yaml:{len(GOOD.splitlines()) + 1}:1: a spec is a layout (name:) or a "
                                  "compat module (compat:), not both"), proc.stderr


def test_an_unclosed_quote_is_reported_where_it_opens(tmp_path):
    root = with_spec(tmp_path, edit(GOOD, "name: dsv4_k", "name: 'dsv4_k"))
    proc = kvlayout("check", root=root)
    assert proc.returncode == 2
    assert proc.stderr.startswith("specs/dsv4_k.yaml:3:7: YAML syntax error: a quoted string opens here"), proc.stderr


def test_explain_rejects_sizes_below_one(tmp_path):
    proc = kvlayout("explain", "specs/dsv4_k.yaml", "--page-size", "0")
    assert proc.returncode == 4 and "--page-size must be at least 1, got 0" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [("specs/dsv4_k.yaml", "--page-size", str(2 ** 62 // 584 + 64)),
                                  ("specs/vllm_fp8.yaml", "--heads", str(2 ** 40), "--values", str(2 ** 30))])
def test_explain_rejects_a_page_no_tensor_holds(args):
    """alloc_cache refuses a page of 2**62 bytes or more, so explain draws none (its offsets would be fiction)."""
    proc = kvlayout("explain", *args)
    assert proc.returncode == 4 and "more than a tensor holds (2**62)" in proc.stderr and "Traceback" not in proc.stderr
    fits = kvlayout("explain", "specs/dsv4_k.yaml", "--page-size", str(2 ** 62 // 584 - 64))
    assert fits.returncode == 0, fits.stderr


def test_spec_text_with_quotes_and_backslashes_stays_inside_the_docstrings(tmp_path):
    """A summary or doc holding \"\"\" or a backslash (C:\\x) is text of the generated docstring."""
    root = copy_repo(tmp_path)
    odd = 'has """ quotes and C:\\x\\ backslashes'
    spec = root / "specs" / "dsv4_k.yaml"
    spec.write_text(edit(spec.read_text(), "summary: >-\n", f"summary: >-\n  {odd}\n"))
    compat = root / "specs" / "compat" / "sglang_dsv4.yaml"
    compat.write_text(edit(edit(compat.read_text(), "summary: ", f"summary: {odd} "), "doc: Pure-torch", f"doc: {odd} Pure-torch"))
    assert kvlayout("generate", root=root).returncode == 0
    for rel in ("generated/dsv4_k.py", "generated/compat/sglang_dsv4.py"):
        text = (root / rel).read_text()
        namespace = {}
        exec(compile(text.split("\nfrom ", 1)[0], rel, "exec"), namespace)   # the module docstring alone
        assert odd in namespace["__doc__"], rel
        compile(text, rel, "exec")


def test_lint_reports_every_problem_in_three_formats(tmp_path):
    """lint writes nothing: exit 0 with a count on a good tree; on a bad spec exit 2 with every
    problem as text lines, a JSON list, or GitHub annotations."""
    import json
    ok = kvlayout("lint")
    assert ok.returncode == 0 and "spec(s) OK" in ok.stdout
    root = with_spec(tmp_path, edit(edit(GOOD, "heads: 1", "heads: one"), "amax_floor: 1.0e-8", "amax_floor: -1"))
    text = kvlayout("lint", root=root)
    assert text.returncode == 2 and [l.split(":")[1] for l in text.stderr.splitlines()] == ["9", "22"], text.stderr
    js = kvlayout("lint", "--format", "json", root=root)
    assert js.returncode == 2
    found = json.loads(js.stdout)
    assert [(f["file"], f["line"]) for f in found] == [("specs/dsv4_k.yaml", 9), ("specs/dsv4_k.yaml", 22)]
    assert all(f["message"] and f["fix"] for f in found)
    gh = kvlayout("lint", "--format", "github", root=root)
    assert gh.returncode == 2
    assert gh.stdout.splitlines()[0].startswith("::error file=specs/dsv4_k.yaml,line=9,col=8,title=kvlayout::heads: ")
    # in a workflow, GitHub resolves file= against the repository's root: a project in a subfolder says so
    for workspace, shown in ((tmp_path.parent, f"{tmp_path.name}/specs/dsv4_k.yaml"), (root, "specs/dsv4_k.yaml"),
                             (tmp_path / "elsewhere", "specs/dsv4_k.yaml")):
        gh = kvlayout("lint", "--format", "github", root=root, workspace=workspace)
        assert gh.stdout.startswith(f"::error file={shown},line=9,col=8,"), (workspace, gh.stdout)
    assert not (root / "generated").exists()


def test_version_usage_errors_and_root_after_the_verb(tmp_path):
    proc = kvlayout("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("kvlayout ")
    proc = kvlayout("frobnicate")
    assert proc.returncode == 4 and "invalid choice" in proc.stderr      # usage: not a bad spec's 2
    root = copy_repo(tmp_path / "repo")
    stale = root / "generated" / "dsv4_k.py"
    stale.write_text(stale.read_text() + "# edited\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (["check", "--root", str(root)], ["--root", str(root), "check"]):
        proc = subprocess.run([sys.executable, "-m", "codegen", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "changed: generated/dsv4_k.py" in proc.stdout, (argv, proc.stderr)
    other = copy_repo(tmp_path / "other")
    for argv, told in ((["--root", str(root), "check", "--root", str(other)], "--root is given twice"),
                       (["--root", str(root), "check", "--config", str(other / "kvlayout.toml")], "give one"),
                       (["check", "--config", str(root / "kvlayout.toml"), "--config=" + str(other / "kvlayout.toml")],
                        "--config is given twice")):
        proc = subprocess.run([sys.executable, "-m", "codegen", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 4 and told in proc.stderr and not proc.stdout, (argv, proc.stderr)
    proc = subprocess.run([sys.executable, "-m", "codegen", "--root", str(root), "check", "--root",
                           os.path.relpath(root, tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, "the same project named twice (spelt two ways) is one project"


def test_explain_refuses_a_compat_spec():
    proc = kvlayout("explain", "specs/compat/sglang_dsv4.yaml")
    assert proc.returncode == 4 and "is not a layout spec" in proc.stderr and "record:" not in proc.stdout


def test_bench_usage_errors_are_exit_4_not_a_bad_specs_2():
    """Without a GPU, or with an unknown option, bench is used wrongly (exit 4): 2 means a bad spec."""
    import torch
    proc = kvlayout("bench", "--bogus")
    assert proc.returncode == 4 and "unrecognized arguments: --bogus" in proc.stderr, proc.stderr
    if not torch.cuda.is_available():
        for args in (("bench", "--quick"), ("bench", "--host")):
            proc = kvlayout(*args)
            assert proc.returncode == 4 and "needs a CUDA GPU" in proc.stderr, (args, proc.stderr)


def test_lint_names_specs_as_given_and_reads_a_spec_named_twice_once(tmp_path):
    """A spec named twice on the command line (also as ./path) is read once, not a clash with its own
    name; a missing spec file is named relative to the root, as every other problem is."""
    root = with_spec(tmp_path, GOOD)
    proc = kvlayout("lint", "specs/dsv4_k.yaml", "./specs/dsv4_k.yaml", str(root / "specs" / "dsv4_k.yaml"), root=root)
    assert proc.returncode == 0 and "1 spec(s) OK" in proc.stdout, proc.stderr
    proc = kvlayout("lint", "specs/nope.yaml", root=root)
    assert proc.returncode == 2 and proc.stderr.startswith("specs/nope.yaml:1:1: no such spec file"), proc.stderr


def test_spec_files_that_are_directories_or_not_yaml_are_named(tmp_path):
    """A directory named like a spec, and a spec named .yml or .YAML, are errors naming them, so
    generate never takes a misnamed spec's module for an orphan; also where only a compat spec is
    named (its layouts are read from the whole folder)."""
    root = copy_repo(tmp_path)
    (root / "specs" / "extra.yaml").mkdir()
    proc = kvlayout("lint", root=root)
    assert proc.returncode == 2 and "specs/extra.yaml:1:1: is a directory, not a spec file" in proc.stderr, proc.stderr
    (root / "specs" / "extra.yaml").rmdir()
    before = (root / "generated" / "dsv4_k.py").read_bytes()
    for suffix in (".yml", ".YAML"):
        (root / "specs" / "dsv4_k.yaml").rename(root / "specs" / f"dsv4_k{suffix}")
        proc = kvlayout("generate", root=root)
        assert proc.returncode == 2, proc.stderr
        assert (f"specs/dsv4_k{suffix}:1:1: a spec file's name ends in .yaml, not {suffix}" in proc.stderr
                and "(fix: rename it to dsv4_k.yaml)" in proc.stderr), proc.stderr
        assert (root / "generated" / "dsv4_k.py").read_bytes() == before
        (root / "specs" / f"dsv4_k{suffix}").rename(root / "specs" / "dsv4_k.yaml")
    (root / "specs" / "other.yml").write_text(GOOD.replace("name: dsv4_k", "name: other"))
    proc = kvlayout("lint", "specs/compat/sglang_dsv4.yaml", root=root)
    assert proc.returncode == 2 and "specs/other.yml:1:1: a spec file's name ends in .yaml" in proc.stderr, proc.stderr


def test_specs_in_subfolders_are_named_not_skipped(tmp_path):
    """A spec in a subfolder of a spec folder (compat/ aside: there compat specs sit) is read
    nowhere: lint and generate name it with where it must sit (exit 2, nothing written), a broken one
    too; hidden folders (an editor's) are passed by."""
    root = with_spec(tmp_path, GOOD)
    (root / "specs" / "models").mkdir()
    (root / "specs" / "models" / "nested.yaml").write_text(GOOD.replace("name: dsv4_k", "name: nested"))
    (root / "specs" / "models" / "deeper").mkdir()
    (root / "specs" / "models" / "deeper" / "bad.yml").write_text("name: [")
    (root / "specs" / ".cache").mkdir()
    (root / "specs" / ".cache" / "old.yaml").write_text("name: [")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "linked.yaml").write_text(GOOD.replace("name: dsv4_k", "name: linked"))
    (tmp_path / "shared" / "up").symlink_to(tmp_path / "specs")           # a loop: walked once
    (root / "specs" / "more").symlink_to(tmp_path / "shared")
    for verb in ("lint", "generate"):
        proc = kvlayout(verb, root=root)
        assert proc.returncode == 2, proc.stderr
        assert ("specs/models/nested.yaml:1:1: a layout spec must sit in specs/" in proc.stderr
                and "(fix: move it to specs/nested.yaml)" in proc.stderr), proc.stderr
        assert "specs/models/deeper/bad.yml:1:1:" in proc.stderr and ".cache" not in proc.stderr, proc.stderr
        assert "specs/more/linked.yaml:1:1: a layout spec must sit in specs/" in proc.stderr, proc.stderr
    assert not (root / "generated" / "nested.py").exists()
    proc = kvlayout("generate", "specs/dsv4_k.yaml", root=root)        # the named spec alone: the package lists it alone
    assert proc.returncode == 0, proc.stderr
    assert "nested" not in (root / "generated" / "__init__.py").read_text()


def test_github_annotations_escape_what_ends_their_fields():
    """GitHub workflow commands: %, CR and LF escaped in the message; ':' and ',' too in file=."""
    from codegen import cli
    assert cli._github("a%b\r\nc: d, e") == "a%25b%0D%0Ac: d, e"
    assert cli._github("my,specs/x:y.yaml", True) == "my%2Cspecs/x%3Ay.yaml"


def test_crlf_line_endings_and_a_bom_generate_the_same_files(tmp_path):
    """A checkout whose git writes CRLF line endings (core.autocrlf), into the specs and the generated
    files alike, or a spec with a BOM, is no drift: the spec digest and the comparison read line breaks as \\n."""
    root = copy_repo(tmp_path)
    for path in [*(root / "specs").rglob("*.yaml"), *(root / "generated").rglob("*.*")]:
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    for name in ("specs/dsv4_k.yaml", "specs/compat/sglang_dsv4.yaml"):
        (root / name).write_bytes(b"\xef\xbb\xbf" + (root / name).read_bytes())
    proc = kvlayout("check", root=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = kvlayout("generate", root=root)
    assert proc.returncode == 0 and "0 written, 0 removed" in proc.stdout, proc.stdout + proc.stderr
    spec = root / "specs" / "dsv4_k.yaml"
    spec.write_bytes(spec.read_bytes() + b"# edited\r\n")
    assert kvlayout("check", root=root).returncode == 1, "a real edit is still drift"
