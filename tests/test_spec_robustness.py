"""Malformed spec files, derived by code from the shipped specs: every one is a SpecError at
path:line:col with a fix, never a traceback, in bounded time (encodings, control characters, YAML
constructs the language leaves out, and YAML 1.1 readings that differ from the text)."""
import re
import time

import pytest

from codegen import build
from codegen.errors import SpecError
from tests.harness import ROOT, SPECS

SHIPPED = {name: (ROOT / "specs" / f"{name}.yaml").read_text() for name in SPECS}
ZOO = {p.stem: p.read_text() for p in (ROOT / "tests" / "specs").glob("*.yaml")}


def plain_values(text: str):
    """(line index, value) of each `key: value` line whose value is a plain scalar."""
    for i, line in enumerate(text.splitlines()):
        m = re.match(r"^\s*([a-z_]+): ([^\s{\[#'\"][^#\s]*)\s*(#.*)?$", line)
        if m and m.group(1) not in ("summary", "doc"):
            yield i, m.group(2)


def replace_value(text: str, index: int, old: str, new: str) -> str:
    lines = text.splitlines()
    lines[index] = lines[index].replace(f": {old}", f": {new}", 1)
    return "\n".join(lines) + "\n"


def mutations():
    """(id, file bytes, line it must name or None, words the message must hold) for each shipped spec."""
    for name, text in SHIPPED.items():
        values = list(plain_values(text))
        for i, old in values:
            for new, words in (("no", "boolean"), ("on", "boolean"), ("Off", "boolean"), ("YES", "boolean"),
                               ("0576", "octal"), ("0100", "octal"), ("7:28", "base 60"), ("1_024", "digit groups"),
                               ("0b1000", "binary"), ("0x2_40", "digit groups"), ("0x_", "digit groups"),
                               ("!foo 1", "tags"), ("!!int 8", "tags"), ("&a 1", "anchors")):
                yield f"{name}-L{i + 1}-{new}", replace_value(text, i, old, new).encode(), i + 1, [words]
        first = values[0][0]
        lines = text.splitlines()
        yield f"{name}-latin1", ("\n".join(lines[:first] + [lines[first] + " # caf\xe9"]) + "\n").encode("latin-1"), \
            first + 1, ["not UTF-8"]
        yield f"{name}-utf16", text.encode("utf-16"), 1, ["not UTF-8"]
        yield f"{name}-binary", bytes(range(256)) * 4, None, ["not UTF-8"]
        for char in ("\x00", "\x07", "\x1b", "\x85", "\u2028"):    # (U+0085, U+2028: YAML 1.1 line breaks)
            yield f"{name}-control-{ord(char)}", (text[:40] + char + text[40:]).encode(), None, ["control character"]
        yield f"{name}-alias", (text + "extra: &x [1]\nmore: *x\n").encode(), None, ["anchors"]
        yield f"{name}-merge", (text + "tuning:\n  <<: {a: 1}\n").encode(), None, ["merge keys"]
        yield f"{name}-nesting", (text + "deep: " + "[" * 20000 + "]" * 20000 + "\n").encode(), None, ["nests too deeply"]
        yield f"{name}-bomb", (text + "".join(f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 10) if k else '1'}]\n"
                                              for k in range(8))).encode(), None, ["anchors"]
        yield f"{name}-unclosed-quote", replace_value(text, values[1][0], values[1][1], "'open").encode(), None, \
            ["YAML syntax error"]
        yield f"{name}-huge", (text + "# " + "x" * (1 << 20) + "\n").encode(), 1, ["at most"]


CASES = list(mutations())


@pytest.mark.parametrize("data,line,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_spec_is_one_located_error_with_a_fix(tmp_path, data, line, words):
    path = tmp_path / "specs" / "dsv4_k.yaml"
    path.parent.mkdir()
    path.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(SpecError) as err:
        kind, tree, display, digest = build.load_spec(path, tmp_path)
        build.build_layout(tree, display, digest)
    assert time.perf_counter() - start < 2.0
    text = err.value.render()
    m = re.match(r"specs/dsv4_k\.yaml:(\d+):(\d+): ", text)
    assert m, text
    if line is not None:
        assert int(m.group(1)) == line, text
    assert "(fix: " in text, text
    for w in words:
        assert w in text, (w, text)


def test_the_corpus_is_large():
    assert len(CASES) >= 300


def test_quoted_and_plain_decimal_values_still_load():
    """The rejections above are of readings, not of values: quoted strings and decimal numbers load."""
    text = SHIPPED["dsv4_k"].replace("align: 576", "align: 576   # plain decimal")
    from codegen import marked_yaml
    tree = marked_yaml.load(text, "x.yaml")
    assert tree["page"]["align"] == 576
    assert marked_yaml.load("a: 'no'\nb: '0576'\nc: 0x20\nd: 1.0e-8\ne: '0b10'\n", "x.yaml") == \
        {"a": "no", "b": "0576", "c": 32, "d": 1e-8, "e": "0b10"}


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


GOOD = SHIPPED["dsv4_k"]
SEMANTIC = [
    # (what, spec text, file name, words the message must hold): accepted before, broken at import, compile or call
    ("plane is a parameter name", edit(GOOD, "planes: [k]", "planes: [loc]"), "dsv4_k", ["planes[0]", "'loc'"]),
    ("plane is a module name", edit(GOOD, "planes: [k]", "planes: [torch]"), "dsv4_k", ["planes[0]"]),
    ("plane is gather's out", edit(GOOD, "planes: [k]", "planes: [out]"), "dsv4_k", ["planes[0]", "'out'"]),
    ("plane is dequantize's out_dtype", edit(GOOD, "planes: [k]", "planes: [out_dtype]"), "dsv4_k",
     ["planes[0]", "'out_dtype'"]),
    ("plane is a builtin", edit(GOOD, "planes: [k]", "planes: [len]"), "dsv4_k", ["planes[0]", "'len'"]),
    ("plane is a keyword", edit(GOOD, "planes: [k]", "planes: [class]"), "dsv4_k", ["keyword"]),
    ("name is a keyword", edit(GOOD, "name: dsv4_k", "name: def"), "def", ["cannot name a Python module"]),
    ("name is compat", edit(GOOD, "name: dsv4_k", "name: compat"), "compat", ["cannot name a Python module"]),
    ("name too long", edit(GOOD, "name: dsv4_k", "name: " + "a" * 240), "a" * 240, ["at most 64 characters"]),
    ("heads unbounded", edit(GOOD, "heads: 1", "heads: 100000000000000000000"), "dsv4_k", ["heads", "4096"]),
    ("values unbounded", edit(GOOD, "values: 448", "values: 1180591620717411303424"), "dsv4_k", ["values"]),
    ("align unbounded", edit(GOOD, "align: 576", "align: 1000000000000"), "dsv4_k", ["align"]),
    ("pad_to unbounded", edit(GOOD, "pad_to: 8", "pad_to: 1000000000000"), "dsv4_k", ["pad_to"]),
    ("a number of 401 digits", edit(GOOD, "amax_floor: 1.0e-8", "amax_floor: 1" + "0" * 400), "dsv4_k",
     ["a number of 401 digits", "at most 30"]),
    ("a split past any extent", edit(SHIPPED["mxfp8_kv"], "{holds: x, order: [head, slot % 32",
                                     "{holds: x, order: [head // 8192, head % 8192, slot % 32"), "mxfp8_kv",
     ["splits head by 8192", "at most 4096"]),
    ("too many segments", edit(GOOD, "  - {name: rope, values: 64, dtype: bf16}\n",
                               "".join(f"  - {{name: r{i}, values: 1, dtype: bf16}}\n" for i in range(64))), "dsv4_k",
     ["record", "at most 64"]),
    # names that would make the module define a helper of its own a second time
    ("segment named like a runtime helper", edit(GOOD, "{name: nope, values: 448", "{name: segment, values: 448"),
     "dsv4_k", ["record[0].name", "define a second time: ", "_quantize_segment (after the runtime)"]),
    ("segment named like a kernel", edit(GOOD, "{name: nope, values: 448", "{name: kernel, values: 448"), "dsv4_k",
     ["record[0].name", "_quantize_kernel"]),
    ("scale group named like the references' helpers", edit(edit(edit(GOOD, "scale: nope}", "scale: ref}"),
                                                                 "  nope:\n    format", "  ref:\n    format"),
                                                            "{holds: nope,", "{holds: ref,"), "dsv4_k",
     ["scales.ref", "define a second time: ", "_ref_exact_scale (after the runtime)"]),
    ("buffer named out", edit(GOOD, "  cache:                     #", "  out:                       #"), "dsv4_k",
     ["buffers.out", "k_out"]),
    ("a segment's and a group's helpers of one name", edit(edit(edit(edit(GOOD, "{name: rope,", "{name: y_load,"),
                                                                     "scale: nope}", "scale: store_y}"),
                                                                "  nope:\n    format", "  store_y:\n    format"),
                                                           "{holds: nope,", "{holds: store_y,"), "dsv4_k",
     ["scales.store_y", "define a second time: _store_y_load (after record[1].name)"]),
    ("num_warps not a power of two", edit(GOOD, "tuning:\n", "tuning:\n  gather_dequant: {num_warps: 3}\n"), "dsv4_k",
     ["num_warps", "power of two"]),
    ("block_tokens past Triton's tensors", edit(GOOD, "tuning:\n", "tuning:\n  gather_dequant: {block_tokens: 1048576}\n"),
     "dsv4_k", ["block_tokens"]),
    ("one exponent for all", edit(GOOD, "    group: {values: 64}\n", "    group: {values: 64}\n    exponent_range: [127, 127]\n"),
     "dsv4_k", ["exponent_range", "lo < hi"]),
    # the append's kernels rescale 8 slots at a time and compose addresses from whole coordinates
    ("append block below 8 slots", edit(edit(SHIPPED["mxfp8_v_seqblocked"], "group: {tokens: 32}", "group: {tokens: 4}"),
                                        "size_multiple_of: 32", "size_multiple_of: 4"),
     "mxfp8_v_seqblocked", ["{tokens: 4}", "below 8 slots", "{tokens: 8}"]),
    ("append region with a split coordinate", edit(SHIPPED["mxfp8_v_seqblocked"], "{holds: records, order: [slot, head]}",
                                                   "{holds: records, order: [slot // 32, slot % 32, head]}"),
     "mxfp8_v_seqblocked", ["cannot split a coordinate", "'slot // 32'"]),
    # scales in the record ({scales: <group>})
    ("inline scales of an unknown group", edit(SHIPPED["ds32_mla"], "- {scales: nope}", "- {scales: nop}"), "ds32_mla",
     ["record[1].scales", "'nop'", "known: nope"]),
    ("inline scales twice", edit(SHIPPED["ds32_mla"], "- {scales: nope}", "- {scales: nope}\n  - {scales: nope}"),
     "ds32_mla", ["record[2].scales", "already stored at record byte 512"]),
    ("inline scales also in a region", edit(SHIPPED["ds32_mla"], "- {holds: records, order: [slot, head]}",
                                            "- {holds: records, order: [slot, head]}\n    - {holds: nope, order: [slot, head, scale]}"),
     "ds32_mla", ["buffers.cache[1].holds", "stored in the record (line 14)", "remove this region"]),
    ("inline fp32 scales misaligned", edit(SHIPPED["ds32_mla"], "  - {scales: nope}",
                                           "  - {name: pad, values: 1, dtype: bf16}\n  - {scales: nope}"),
     "ds32_mla", ["fp32 scales of 'nope' start at record byte 514", "not a multiple of 4"]),
    ("inline scales of a token group", edit(SHIPPED["mxfp8_v_seqblocked"], "scale: x}", "scale: x}\n  - {scales: x}"),
     "mxfp8_v_seqblocked", ["only {values: N} groups sit in the record"]),
    ("inline scales with a dense op", edit(SHIPPED["ds32_mla"], "ops: [gather_dequant, quantize_store]",
                                           "ops: [gather_dequant, quantize_store, quantize]"),
     "ds32_mla", ["ops[2]", "'quantize'", "drop quantize and dequantize"]),
    # fp4 e2m1: two values per byte
    ("fp4 segment of an odd width", edit(edit(SHIPPED["dsv4_mxfp4"], "values: 448, dtype: fp4_e2m1", "values: 447, dtype: fp4_e2m1"),
                                         "group: {values: 32}", "group: {values: 447}"),
     "dsv4_mxfp4", ["record[0].values", "packs 2 values per byte", "447 is not a multiple of 2"]),
    ("fp4 group of an odd size", edit(edit(SHIPPED["dsv4_mxfp4"], "group: {values: 32}", "group: {values: 7}"),
                                      "pad_to: 16", "pad_to: 64"),
     "dsv4_mxfp4", ["scales.nope.group", "a whole number of bytes", "multiple of 2"]),
    ("fp4 width from the tensors with an odd group", edit(edit(SHIPPED["mxfp8_kv"], "dtype: fp8_e4m3fn", "dtype: fp4_e2m1"),
                                                          "group: {values: 32}", "group: {values: 24}"), "mxfp8_kv",
     ["scales.x.group", "groups of 24 values are not supported", "{values: 8}"]),
    ("fp4 scales along slots", edit(edit(SHIPPED["mxfp8_v_seqblocked"], "dtype: fp8_e4m3fn", "dtype: fp4_e2m1"),
                                    "values: any", "values: 128"),
     "mxfp8_v_seqblocked", ["scales.x.group", "packs 2 values per byte", "{values: N}"]),
    ("inline item with a typo", edit(SHIPPED["ds32_mla"], "- {scales: nope}", "- {scale: nope}"), "ds32_mla",
     ["record[1]"]),
    # scale floors and groups of any width
    ("scale floor on a power-of-two rule", edit(SHIPPED["ds32_mla"], "    group: {values: 128}",
                                                "    group: {values: 128}\n    scale_floor: 1.0e-4"),
     "ds32_mla", ["scales.nope.scale_floor", "a least exponent", "exponent_range: [-13, 127]"]),
    ("scale floor below fp32's normals", edit(SHIPPED["vllm_fp8_per_token_head"], "scale_floor: 1.0e-6", "scale_floor: 1.0e-40"),
     "vllm_fp8_per_token_head", ["scales.head.scale_floor", "not a normal fp32 number"]),
    ("scale floor on a given scale", edit(SHIPPED["vllm_fp8"], "group: tensor}", "group: tensor, scale_floor: 1.0e-6}"),
     "vllm_fp8", ["scales.scale.scale_floor", "not computed from amax"]),
    ("fp4 group of no power of two", edit(SHIPPED["dsv4_mxfp4"], "group: {values: 32}", "group: {values: 28}"),
     "dsv4_mxfp4", ["scales.nope.group", "groups of 28 values are not supported", "{values: 4}"]),
    ("whole-head group of fp4 from the tensors", edit(SHIPPED["vllm_fp8_per_token_head"], "dtype: fp8_e4m3fn", "dtype: fp4_e2m1"),
     "vllm_fp8_per_token_head", ["scales.head.group", "whole segment of call-time width is not supported"]),
    ("head rows with call-time scales", edit(SHIPPED["vllm_fp8"], "quantize_store: {elements: 1024, num_warps: 2}",
                                             "quantize_store: {elements: 1024, num_warps: 2, head_rows: true}"),
     "vllm_fp8", ["tuning.quantize_store.head_rows", "call-time scales", "remove head_rows"]),
    # e4m3 block scales, two-level (global) scales and comparison encoders (NVFP4)
    ("e4m3 scales from a power-of-two rule", edit(SHIPPED["dsv4_nvfp4"], "rule: exact ", "rule: nearest "),
     "dsv4_nvfp4", ["scales.nope.rule", "not a 'nearest' power of two", "set rule: exact"]),
    ("e4m3 scales with a scale floor", edit(SHIPPED["dsv4_nvfp4"], "    group: {values: 16}",
                                            "    group: {values: 16}\n    scale_floor: 1.0e-4"),
     "dsv4_nvfp4", ["scales.nope.scale_floor", "not supported for e4m3", "remove scale_floor"]),
    ("a global scale over ue8m0 scales", edit(SHIPPED["dsv4_mxfp4"], "    group: {values: 32}",
                                              "    group: {values: 32}\n    global: g"),
     "dsv4_mxfp4", ["scales.nope.global", "format is ue8m0", "set format: e4m3"]),
    ("comparison codes under a power-of-two rule", edit(SHIPPED["dsv4_mxfp4"], "    group: {values: 32}",
                                                        "    group: {values: 32}\n    rounding: products"),
     "dsv4_mxfp4", ["scales.nope.rounding", "only rule exact", "remove rounding"]),
    ("comparison codes for fp8 values", edit(edit(SHIPPED["flashinfer_nvfp4"], "dtype: fp4_e2m1", "dtype: fp8_e4m3fn"),
                                             "    group: {values: 16}", "    group: {values: 16}\n    rounding: products"),
     "flashinfer_nvfp4", ["scales.scale_x.rounding", "fp4 e2m1", "remove rounding"]),
    ("a global scale argument that clashes", edit(SHIPPED["dsv4_nvfp4"], "global: global ", "global: out "),
     "dsv4_nvfp4", ["scales.nope.global", "global scale argument", "k_out", "already use"]),
    ("a global scale with a dense op", edit(SHIPPED["flashinfer_nvfp4"].replace("values: any, dtype", "values: 128, dtype"),
                                            "ops: [quantize_store, gather_dequant]",
                                            "ops: [quantize_store, gather_dequant, dequantize]"),
     "flashinfer_nvfp4", ["ops[2]", "takes no global scale", "drop quantize and dequantize"]),
    ("head rows with global scales", edit(SHIPPED["flashinfer_nvfp4"], "quantize_store: {elements: 1024, num_warps: 2}",
                                          "quantize_store: {elements: 1024, num_warps: 2, head_rows: true}"),
     "flashinfer_nvfp4", ["tuning.quantize_store.head_rows", "call-time scales", "remove head_rows"]),
    ("two groups with one global scale name", ZOO["zoo_nvfp4_heads"].replace(
        "  - {name: tail, values: 8, dtype: bf16}", "  - {name: y, values: 32, dtype: fp4_e2m1, scale: y}\n  - {scales: y}\n"
        "  - {name: tail, values: 8, dtype: bf16}").replace(
        "  x: {format: e4m3, rule: exact, global: gs, group: {values: 16}}",
        "  x: {format: e4m3, rule: exact, global: gs, group: {values: 16}}\n  y: {format: e4m3, rule: exact, global: gs, group: {values: 16}}"),
     "zoo_nvfp4_heads", ["scales.y", "k_gs", "as group 'x'", "its own name"]),
    ("fp4 from the tensors with a dense op", edit(SHIPPED["flashinfer_nvfp4"].replace("    global: scale            # the call's k_scale / v_scale\n", ""),
                                                  "ops: [quantize_store, gather_dequant]", "ops: [quantize_store, gather_dequant, dequantize]"),
     "flashinfer_nvfp4", ["ops[2]", "would count bytes", "fixed width"]),
    ("comparison codes with fp32 scales", edit(SHIPPED["vllm_fp8_per_token_head"].replace("dtype: fp8_e4m3fn", "dtype: fp4_e2m1").replace(
        "values: any, dtype", "values: 64, dtype").replace("group: {values: any}     # all of the head's values", "group: {values: 16}"),
        "    scale_floor: 1.0e-6      # vLLM floors the scale, not amax", "    rounding: products"),
     "vllm_fp8_per_token_head", ["scales.head.rounding", "for e4m3 block scales", "set format: e4m3"]),
    # a writer's rows in parts (inputs)
    ("inputs of an unknown plane", edit(SHIPPED["vllm_ds_mla"], "  k: {kv_c: [nope], k_pe: [rope]}", "  v: {kv_c: [nope], k_pe: [rope]}"),
     "vllm_ds_mla", ["inputs.v", "no plane named 'v'"]),
    ("inputs for some planes only", edit(ZOO["zoo_inline_fp4"], "buffers:", "inputs:\n  k: {key: [x]}\nbuffers:"),
     "zoo_inline_fp4", ["inputs: plane 'v' has no inputs", "every plane"]),
    ("an input of an unknown segment", edit(SHIPPED["vllm_ds_mla"], "k_pe: [rope]", "k_pe: [pe]"),
     "vllm_ds_mla", ["inputs.k.k_pe[0]", "no segment named 'pe'"]),
    ("a segment in no input", edit(SHIPPED["vllm_ds_mla"], "{kv_c: [nope], k_pe: [rope]}", "{kv_c: [nope]}"),
     "vllm_ds_mla", ["inputs.k", "'rope' is in no input"]),
    ("a segment in two inputs", edit(SHIPPED["vllm_ds_mla"], "k_pe: [rope]", "k_pe: [nope, rope]"),
     "vllm_ds_mla", ["inputs.k.k_pe[0]", "in another input", "once"]),
    ("inputs out of record order", edit(SHIPPED["vllm_ds_mla"], "{kv_c: [nope], k_pe: [rope]}", "{k_pe: [rope], kv_c: [nope]}"),
     "vllm_ds_mla", ["inputs.k.k_pe[0]", "out of order", "expected 'nope'"]),
    ("an input named as a parameter", edit(SHIPPED["vllm_ds_mla"], "k_pe: [rope]", "loc: [rope]"),
     "vllm_ds_mla", ["inputs.k.loc", "already uses"]),
    ("an input named as a cache field", edit(SHIPPED["vllm_ds_mla"], "k_pe: [rope]", "k_cache: [rope]"),
     "vllm_ds_mla", ["inputs.k.k_cache", "already uses"]),
    ("an input named as a kernel row", edit(SHIPPED["vllm_ds_mla"], "k_pe: [rope]", "rec: [rope]"),
     "vllm_ds_mla", ["inputs.k.rec", "already uses"]),
    ("an input named as a builtin", edit(SHIPPED["vllm_ds_mla"], "k_pe: [rope]", "isinstance: [rope]"),
     "vllm_ds_mla", ["inputs.k.isinstance", "already uses"]),
    ("an input named twice", edit(ZOO["zoo_inline_fp4"], "buffers:", "inputs:\n  k: {rows: [x]}\n  v: {rows: [x]}\nbuffers:"),
     "zoo_inline_fp4", ["inputs.v.rows", "plane 'k' has an input named 'rows' too"]),
    ("inputs of call-time width", edit(SHIPPED["vllm_fp8"], "buffers:", "inputs:\n  k: {key: [x]}\n  v: {value: [x]}\nbuffers:"),
     "vllm_fp8", ["inputs: segment 'x' has values: any", "fixed width"]),
    ("inputs with a dense op", edit(SHIPPED["ds41_mla"], "buffers:", "inputs:\n  k: {whole: [kv]}\nbuffers:"),
     "ds41_mla", ["inputs: 'quantize' takes whole rows"]),
    ("inputs with append", edit(ZOO["zoo_tokens_nearest"], "buffers:", "inputs:\n  v: {whole: [x]}\nbuffers:"),
     "zoo_tokens_nearest", ["inputs: 'append' takes whole rows"]),
    # the NaN policy
    ("nan poison for fp4 values", edit(SHIPPED["dsv4_mxfp4"], "    group: {values: 32}", "    group: {values: 32}\n    nan: poison"),
     "dsv4_mxfp4", ["scales.nope.nan", "fp4_e2m1 has none", "remove nan"]),
    ("nan poison for token groups", edit(SHIPPED["mxfp8_v_seqblocked"], "    group: {tokens: 32}", "    group: {tokens: 32}\n    nan: poison"),
     "mxfp8_v_seqblocked", ["scales.x.nan", "{tokens: N} group rescales"]),
    ("nan poison for a given scale", edit(SHIPPED["vllm_fp8"], "group: tensor}", "group: tensor, nan: poison}"),
     "vllm_fp8", ["scales.scale.nan", "cannot poison it"]),
    # buffers that hold every plane (a `plane` coordinate)
    ("plane in a one-plane layout", edit(SHIPPED["dsv4_k"], "order: [slot, head]", "order: [slot, head, plane]"), "dsv4_k",
     ["order[2]", "'plane' orders the planes", "remove 'plane'"]),
    ("plane split", edit(SHIPPED["vllm_fp8_per_token_head"], "order: [slot, head, plane]", "order: [slot, head, plane % 2, plane // 2]"),
     "vllm_fp8_per_token_head", ["order[2]", "'plane' cannot be split"]),
    ("plane in some regions of a buffer", edit(SHIPPED["mxfp8_kv"].replace("  sf:                        # (num_pages, heads, 32, page_size / 32, values / 32) uint8\n", ""),
                                               "- {holds: records, order: [slot, head]}", "- {holds: records, order: [plane, slot, head]}"),
     "mxfp8_kv", ["buffers.cache[1].order", "every plane", "or in none"]),
    ("a buffer of every plane named as a plane's field", edit(edit(SHIPPED["mxfp8_kv"], "  cache:", "  k_sf:"),
                                                              "- {holds: records, order: [slot, head]}",
                                                              "- {holds: records, order: [plane, slot, head]}"),
     "mxfp8_kv", ["two buffers give the cache field name 'k_sf'", "rename a buffer"]),
    ("a buffer of every plane named as a scale argument", edit(edit(SHIPPED["vllm_fp8"], "  cache:", "  k_scale:"),
                                                               "order: [slot, head]}", "order: [slot, head, plane]}"),
     "vllm_fp8", ["scales.scale", "k_scale", "already use"]),
    ("a buffer of every plane named as a plane", edit(SHIPPED["vllm_fp8_per_token_head"], "  kv_cache:", "  k:"),
     "vllm_fp8_per_token_head", ["buffers.k", "already use", "rename the buffer"]),
    ("a buffer of every plane named as a keyword", edit(SHIPPED["vllm_fp8_per_token_head"], "  kv_cache:", "  class:"),
     "vllm_fp8_per_token_head", ["buffers.class", "already use"]),
    ("a buffer of every plane named as an output", edit(SHIPPED["vllm_fp8_per_token_head"], "  kv_cache:", "  v_out:"),
     "vllm_fp8_per_token_head", ["buffers.v_out", "already use"]),
    ("append with a buffer of every plane", ZOO["zoo_tokens_kv"].replace("order: [slot, head]}", "order: [plane, slot, head]}"),
     "zoo_tokens_kv", ["'append' is not available", "give each plane its own buffers"]),
    # call-time (given) scales
    ("given scale with a computed group", edit(SHIPPED["vllm_fp8"], "group: tensor", "group: {values: 32}"), "vllm_fp8",
     ["scales.scale", "covers a whole plane", "group: tensor"]),
    ("tensor group with a rule", edit(SHIPPED["vllm_fp8"], "rule: given", "rule: rceil"), "vllm_fp8",
     ["scales.scale", "rule is 'given'"]),
    ("given scale stored as ue8m0", edit(SHIPPED["vllm_fp8"], "format: fp32", "format: ue8m0"), "vllm_fp8",
     ["scales.scale.format", "float32 tensor"]),
    ("given scale with an amax floor", edit(SHIPPED["vllm_fp8"], "group: tensor}", "group: tensor, amax_floor: 1.0e-4}"),
     "vllm_fp8", ["scales.scale.amax_floor", "not computed from amax"]),
    ("no planes", edit(GOOD, "planes: [k]", "planes: []"), "dsv4_k", ["planes: needs at least 1 item(s), got 0",
                                                                      "fix: list at least 1 item(s), each an identifier"]),
    ("another language version", edit(GOOD, "kvlayout: 1", "kvlayout: 2"), "dsv4_k",
     ["kvlayout: expected the integer 1, got 2", "fix: write 1"]),
    # page sizes the cache's shape could not tell apart, or heads it could not hold
    ("padding hides the page size", edit(GOOD, "align: 576", "align: 4096"), "dsv4_k",
     ["page.align", "the same page bytes", "grows by only 584 bytes", "at least 8"]),
    ("heads any in a byte page", edit(GOOD, "heads: 1", "heads: any"), "dsv4_k",
     ["heads: 'any'", "also holds 'nope'", "(num_pages, page_bytes)"]),
    ("heads any in padded pages", edit(SHIPPED["mxfp8_kv"], "  size_multiple_of: 32\n",
                                       "  size_multiple_of: 32\n  align: 64\n"), "mxfp8_kv",
     ["heads: 'any'", "pads its pages (page.align: 64)"]),
    # 656-byte records padded to 3 bytes: page 1 of 1-slot pages would start at byte 657
    ("padding misaligns raw values", edit(SHIPPED["ds32_mla"], "heads: 1\n", "heads: 1\npage: {align: 3}\n"),
     "ds32_mla", ["page.align: 3 is not a multiple of 2", "would misalign bf16 segment 'rope'", "e.g. 6"]),
    # 650 is not a multiple of 4, and its lcm with 4 (1300) would pad 656-byte pages to hide page sizes
    ("the fix for misaligning padding keeps page sizes apart", edit(SHIPPED["ds32_mla"], "heads: 1\n",
                                                                    "heads: 1\npage: {align: 650}\n"),
     "ds32_mla", ["page.align: 650 is not a multiple of 4", "e.g. 648)"]),
    ("values any in padded pages", edit(SHIPPED["mxfp8_kv"], "heads: any", "heads: 8").replace(
        "  size_multiple_of: 32\n", "  size_multiple_of: 32\n  align: 64\n"), "mxfp8_kv",
     ["mxfp8_kv.yaml:16:", "record[0].values: 'any'", "pads its pages (page.align: 64)"]),
    ("the fix for hidden page sizes keeps the multiple", edit(SHIPPED["mxfp8_v_seqblocked"], "heads: any", "heads: 2")
     .replace("values: any", "values: 128").replace("  size_multiple_of: 32\n", "  size_multiple_of: 32\n  align: 12288\n"),
     "mxfp8_v_seqblocked", ["page.align", "page.size_multiple_of of at least 64"]),
    ("given scale in a buffer", edit(SHIPPED["vllm_fp8"], "- {holds: records, order: [slot, head]}",
                                     "- {holds: records, order: [slot, head]}\n    - {holds: scale, order: [slot, head, scale]}"),
     "vllm_fp8", ["'scale' is given at call time", "remove this region"]),
    ("given scale in the record", edit(SHIPPED["vllm_fp8"], "scale: scale}", "scale: scale}\n  - {scales: scale}"),
     "vllm_fp8", ["record[1].scales", "given at call time"]),
    ("given scale for fp4", edit(SHIPPED["vllm_fp8"], "values: any, dtype: fp8_e4m3fn", "values: 64, dtype: fp4_e2m1"),
     "vllm_fp8", ["scales.scale.group", "two codes per byte"]),
    ("given scale with a dense op", edit(SHIPPED["vllm_fp8"], "ops: [quantize_store, gather_dequant]",
                                         "ops: [quantize_store, gather_dequant, quantize]"), "vllm_fp8",
     ["ops[2]", "'quantize' is not available"]),
    ("given scale argument clashes", edit(SHIPPED["vllm_fp8"], "planes: [k, v]", "planes: [page, v]").replace(
        "scale: scale}", "scale: size}").replace("  scale: {format", "  size: {format"), "vllm_fp8",
     ["scales.size", "page_size"]),
    ("given scale named as a cache field", edit(SHIPPED["vllm_fp8"], "scale: scale}", "scale: cache}").replace(
        "  scale: {format", "  cache: {format"), "vllm_fp8", ["scales.cache", "k_cache"]),
    ("given scale named as an output", edit(SHIPPED["vllm_fp8"], "scale: scale}", "scale: out}").replace(
        "  scale: {format", "  out: {format"), "vllm_fp8", ["scales.out", "k_out"]),
    # a {tokens: N} group with no page block: the default multiple of 1 is told, where the group is
    ("tokens group without a page block", edit(SHIPPED["mxfp8_v_seqblocked"], "page:\n  size_multiple_of: 32\n", ""),
     "mxfp8_v_seqblocked", ["mxfp8_v_seqblocked.yaml:20:12:", "{tokens: 32} needs page.size_multiple_of to be a multiple of 32",
                            "set page.size_multiple_of: 32"]),
    ("given scale named as a local", edit(SHIPPED["vllm_fp8"], "planes: [k, v]", "planes: [n, v]").replace(
        "scale: scale}", "scale: tokens}").replace("  scale: {format", "  tokens: {format"), "vllm_fp8",
     ["scales.tokens", "n_tokens"]),
]


@pytest.mark.parametrize("text,stem,words", [c[1:] for c in SEMANTIC], ids=[c[0] for c in SEMANTIC])
def test_specs_that_would_break_later_are_rejected(tmp_path, text, stem, words):
    path = tmp_path / "specs" / f"{stem}.yaml"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        build.build_layout(*build.load_spec(path, tmp_path)[1:])
    rendered = err.value.render()
    assert re.match(rf"specs/{stem}\.yaml:\d+:\d+: ", rendered) and "(fix: " in rendered, rendered
    for w in words:
        assert w in rendered, (w, rendered)


CLASH = """kvlayout: 1
name: clash
summary: buffer a holding group b_c beside buffer a_b holding group c
planes: [k]
heads: 1
record:
  - {name: p, values: 64, dtype: fp8_e4m3fn, scale: b_c}
  - {name: q, values: 64, dtype: fp8_e4m3fn, scale: c}
scales:
  b_c: {format: ue8m0, rule: rceil, group: {values: 64}}
  c: {format: ue8m0, rule: rceil, group: {values: 64}}
buffers:
  cache: [{holds: records, order: [slot, head]}]
  a: [{holds: b_c, order: [slot, head, scale]}]
  a_b: [{holds: c, order: [slot, head, scale]}]
ops: [gather_dequant]
"""


def test_no_plane_takes_a_parameter_name_of_the_ops():
    """A plane is its writers' source parameter: their other parameters, and every name
    model.op_signature writes out with a default or annotation of its own (in any op), are reserved."""
    from codegen import model
    layout = build.build_layout(*build.load_spec(ROOT / "specs" / "mxfp8_v_seqblocked.yaml", ROOT)[1:])
    names = set(model._PARAM_TEXT) | {"pdl"}
    for op in ("quantize_store", "append"):
        names |= set(model.op_params(layout, op)) - set(layout.planes)
    assert names <= build.RESERVED_PLANES, names - build.RESERVED_PLANES


def test_generated_constexpr_names_must_not_collide(tmp_path):
    path = tmp_path / "specs" / "clash.yaml"
    path.parent.mkdir()
    path.write_text(CLASH)
    with pytest.raises(SpecError, match=r"clash\.yaml:\d+:\d+: buffers: .*generated name A_B_C_\w+ \(fix: "):
        build.build_layout(*build.load_spec(path, tmp_path)[1:])
    path.write_text(CLASH.replace("a_b:", "z:"))
    build.build_layout(*build.load_spec(path, tmp_path)[1:])        # distinct names: accepted


COMPAT_GOOD = (ROOT / "specs" / "compat" / "sglang_dsv4.yaml").read_text()
COMPAT_BAD = [
    # (what, edited compat spec, words of the error): accepted before, broken at import or call
    ("param after a default", edit(COMPAT_GOOD, "params: [k, loc, quant_k_cache, page_size]",
                                   "params: [k=None, loc, quant_k_cache, page_size]"),
     ["functions[2].params[1]", "'loc' has no default but follows"]),
    ("param is a keyword", edit(COMPAT_GOOD, "params: [k, loc, quant_k_cache, page_size]",
                                "params: [k, loc, quant_k_cache, page_size, lambda=None]"), ["params[4]", "'lambda'"]),
    ("param shadows the layout module", edit(COMPAT_GOOD, "params: [k, loc, quant_k_cache, page_size]",
                                             "params: [k, loc, quant_k_cache, page_size, dsv4_k=None]"),
     ["params[4]", "'dsv4_k'"]),
    ("function named like its layout", edit(COMPAT_GOOD, "name: quantize_k_cache_paged", "name: dsv4_k"),
     ["functions[2].name", "'dsv4_k'"]),
    ("function named like the module's re", edit(COMPAT_GOOD, "name: quantize_k_cache_paged", "name: re"),
     ["functions[2].name", "'re'"]),
    ("function named like a helper", edit(COMPAT_GOOD, "name: quantize_k_cache_paged", "name: _renamed"),
     ["functions[2].name", "'_renamed'"]),
    ("param named like a helper", edit(COMPAT_GOOD, "params: [k, loc, quant_k_cache, page_size]",
                                       "params: [k, loc, quant_k_cache, page_size, _described=None]"),
     ["params[4]", "'_described'"]),
    ("duplicate function", edit(COMPAT_GOOD, "name: quantize_k_cache_paged", "name: dequantize_k_cache_paged"),
     ["functions[2].name", "second function named 'dequantize_k_cache_paged'", "functions[0]"]),
    ("unknown torch default", edit(COMPAT_GOOD, "params: [k, loc, quant_k_cache, page_size]",
                                   "params: [k, loc, quant_k_cache, page_size, dtype=torch.bfloat17]"),
     ["params[4]", "torch.bfloat17 is not one of the torch dtypes", "torch.bfloat16"]),
    ("require names no parameter", edit(COMPAT_GOOD, "    params: [k, loc, quant_k_cache, page_size]\n",
                                        "    params: [k, loc, quant_k_cache, page_size]\n    require: {pagesize: [64]}\n"),
     ["functions[2].require", "'pagesize' is not a parameter"]),
    ("trim names no parameter", edit(COMPAT_GOOD, "    params: [k, loc, quant_k_cache, page_size]\n",
                                     "    params: [k, loc, quant_k_cache, page_size]\n    trim: {k: slots}\n"),
     ["functions[2].trim.k", "'slots' is not another parameter"]),
    ("trim counts by itself", edit(COMPAT_GOOD, "    params: [k, loc, quant_k_cache, page_size]\n",
                                   "    params: [k, loc, quant_k_cache, page_size]\n    trim: {k: k}\n"),
     ["functions[2].trim.k", "'k' is not another parameter"]),
    ("constant named like a layout", edit(COMPAT_GOOD, "  DIM_NOPE: 448\n", "  dsv4_k: 1\n"),
     ["constants", "'dsv4_k' is a Python keyword or builtin, or a name the generated module uses"]),
    ("constant named like a builtin", edit(COMPAT_GOOD, "  DIM_NOPE: 448\n", "  ValueError: 1\n"),
     ["constants", "'ValueError' is a Python keyword or builtin"]),
    ("function named like a builtin", edit(COMPAT_GOOD, "name: quantize_k_cache_paged", "name: isinstance"),
     ["functions[2].name", "'isinstance'"]),
    ("constant of an unknown torch name", edit(COMPAT_GOOD, "  DIM_NOPE: 448\n", "  X: torch.cuda\n"),
     ["constants.X", "torch.cuda is not one of the torch dtypes"]),
    ("function named like a constant", edit(COMPAT_GOOD, "  DIM_NOPE: 448\n", "  quantize_k_cache_paged: 1\n"),
     ["functions[2].name", "'quantize_k_cache_paged'"]),
    ("trim of no parameter", edit(COMPAT_GOOD, "    params: [k, loc, quant_k_cache, page_size]\n",
                                  "    params: [k, loc, quant_k_cache, page_size]\n    trim: {key: loc}\n"),
     ["functions[2].trim", "'key' is not a parameter"]),
    # a parameter passed on to nothing would take a caller's value and drop it (a lost `out: out`)
    ("parameter used nowhere", edit(COMPAT_GOOD, "      page_size: page_size\n      out: out\n", "      page_size: page_size\n"),
     ["functions[0].params[3]", "'out' is never used", "unused:"]),
    ("unused parameter that is used", edit(COMPAT_GOOD, "    params: [k, loc, quant_k_cache, page_size]\n",
                                           "    params: [k, loc, quant_k_cache, page_size]\n    unused: [loc]\n"),
     ["functions[2].unused[0]", "'loc' is used"]),
    ("unused names no parameter", edit(COMPAT_GOOD, "    params: [k, loc, quant_k_cache, page_size]\n",
                                       "    params: [k, loc, quant_k_cache, page_size]\n    unused: [scale]\n"),
     ["functions[2].unused[0]", "'scale' is not a parameter"]),
    ("parameter only trimmed", edit(COMPAT_GOOD, "    params: [k, loc, quant_k_cache, page_size]\n",
                                    "    params: [k, loc, quant_k_cache, page_size, extra=None]\n    trim: {extra: loc}\n"),
     ["functions[2].params[4]", "'extra' is never used", "quantize_store's parameters: k, loc, cache, page_size"]),
]


def test_a_compat_argument_may_be_the_literal_none(tmp_path):
    """`out: None` passes None on (a caller's out is then never taken: the parameter is dropped too)."""
    from codegen import pipeline
    (tmp_path / "specs" / "compat").mkdir(parents=True)
    (tmp_path / "specs" / "dsv4_k.yaml").write_text(SHIPPED["dsv4_k"])
    (tmp_path / "specs" / "compat" / "sglang_dsv4.yaml").write_text(
        edit(edit(COMPAT_GOOD, "      out: out\n", "      out: None\n"), "page_size, out=None]", "page_size]"))
    files = pipeline.render_all(tmp_path)
    assert "page_size=page_size, out=None)" in files["generated/compat/sglang_dsv4.py"]


@pytest.mark.parametrize("text,words", [c[1:] for c in COMPAT_BAD], ids=[c[0] for c in COMPAT_BAD])
def test_compat_specs_that_would_break_later_are_rejected(tmp_path, text, words):
    (tmp_path / "specs" / "compat").mkdir(parents=True)
    (tmp_path / "specs" / "dsv4_k.yaml").write_text(SHIPPED["dsv4_k"])
    (tmp_path / "specs" / "compat" / "sglang_dsv4.yaml").write_text(text)
    assert_one_error(tmp_path, "specs/compat/sglang_dsv4.yaml", words)


def assert_one_error(root, spec: str, words) -> None:
    """The project's specs build into exactly one error, at spec:line:col, with a fix and these words."""
    from codegen import pipeline
    with pytest.raises(pipeline.SpecErrors) as err:
        pipeline.build_all(root)
    (only,) = err.value.errors
    rendered = only.render()
    assert rendered.startswith(f"{spec}:") and re.match(r"[^:]+:\d+:\d+: ", rendered) and "(fix: " in rendered, rendered
    for w in words:
        assert w in rendered, (w, rendered)


DS32_COMPAT = (ROOT / "specs" / "compat" / "vllm_ds32.yaml").read_text()
CASE = "      - {when: {scale_fmt: [ue8m0]}, layout: ds32_indexer_ue8m0}\n"
CASES_BAD = [
    # (what, the case line, words of the error)
    ("two parameters", "      - {when: {scale_fmt: [ue8m0], quant_block_size: [128]}, layout: ds32_indexer_ue8m0}\n",
     ["functions[0].cases[0].when", "one parameter per case"]),
    ("no such parameter", "      - {when: {fmt: [ue8m0]}, layout: ds32_indexer_ue8m0}\n",
     ["functions[0].cases[0].when", "'fmt' is not a parameter"]),
    ("a value require: refuses", "      - {when: {scale_fmt: [fp8]}, layout: ds32_indexer_ue8m0}\n",
     ["functions[0].cases[0].when.scale_fmt[0]", "'fp8' is refused by require:", "add it to require.scale_fmt"]),
    ("a value matched twice", CASE + "      - {when: {scale_fmt: ['', ue8m0]}, layout: ds32_indexer_ue8m0}\n",
     ["functions[0].cases[1].when.scale_fmt[1]", "'ue8m0' is also matched by cases[0].when.scale_fmt[0]"]),
    ("a value listed twice", "      - {when: {scale_fmt: [ue8m0, ue8m0]}, layout: ds32_indexer_ue8m0}\n",
     ["functions[0].cases[0].when.scale_fmt[1]", "'ue8m0' is also matched by cases[0].when.scale_fmt[0]"]),
    ("cases of two parameters", CASE + "      - {when: {quant_block_size: [128]}, layout: ds32_indexer_ue8m0}\n",
     ["functions[0].cases[1].when", "matches 'quant_block_size', cases[0] matches 'scale_fmt'"]),
    ("another plane count", "      - {when: {scale_fmt: [ue8m0]}, layout: ds32_kv}\n",
     ["functions[0].cases[0].layout", "ds32_kv's planes are k, v, not k"]),
    ("no such layout", "      - {when: {scale_fmt: [ue8m0]}, layout: ds32_indexer_e8}\n",
     ["functions[0].cases[0].layout", "no layout named 'ds32_indexer_e8'"]),
    ("call:'s own layout", "      - {when: {scale_fmt: [ue8m0]}, layout: ds32_indexer}\n",
     ["functions[0].cases[0].layout", "'ds32_indexer' is call:'s own layout"]),
    ("an op of other parameters", "      - {when: {scale_fmt: [ue8m0]}, layout: dsv4_nvfp4}\n",
     ["functions[0].cases[0].layout", "dsv4_nvfp4.quantize_store takes (k, loc, cache, page_size, k_global), not "
      "call:'s (k, loc, cache, page_size)"]),
    ("a cache of other fields", "      - {when: {scale_fmt: [ue8m0]}, layout: ds32_pool}\n",
     ["functions[0].cases[0].layout", "ds32_pool's Cache has the fields (k_pool), not (k_cache)"]),
]


@pytest.mark.parametrize("line,words", [c[1:] for c in CASES_BAD], ids=[c[0] for c in CASES_BAD])
def test_a_compat_case_must_take_the_call_as_written(tmp_path, line, words):
    """A case's layout is called with the function's args: an op of other parameters or a Cache of
    other fields is refused at lint, as are values the case can never see or sees twice."""
    (tmp_path / "specs" / "compat").mkdir(parents=True)
    for name in ("ds32_indexer", "ds32_indexer_ue8m0", "dsv4_nvfp4"):
        (tmp_path / "specs" / f"{name}.yaml").write_text(SHIPPED[name])
    (tmp_path / "specs" / "ds32_pool.yaml").write_text(     # ds32_indexer's op, its buffer named pool
        edit(edit(SHIPPED["ds32_indexer"], "name: ds32_indexer\n", "name: ds32_pool\n"), "  cache:", "  pool:"))
    (tmp_path / "specs" / "ds32_kv.yaml").write_text(       # two planes in one shared buffer: the same Cache
        edit(edit(edit(SHIPPED["ds32_indexer"], "name: ds32_indexer\n", "name: ds32_kv\n"), "planes: [k]", "planes: [k, v]"),
             "order: [slot, head]}", "order: [plane, slot, head]}").replace("order: [slot, head, scale]}", "order: [plane, slot, head, scale]}")
        .replace("  cache:", "  kv:"))
    assert CASE in DS32_COMPAT
    (tmp_path / "specs" / "compat" / "vllm_ds32.yaml").write_text(edit(DS32_COMPAT, CASE, line))
    assert_one_error(tmp_path, "specs/compat/vllm_ds32.yaml", words)


def test_a_parameter_a_case_reads_is_used(tmp_path):
    """A parameter only cases: read (no require:) is used, not "never used"; listing it under unused:
    (the seed ignores it) is refused."""
    from codegen import pipeline
    (tmp_path / "specs" / "compat").mkdir(parents=True)
    for name in ("ds32_indexer", "ds32_indexer_ue8m0"):
        (tmp_path / "specs" / f"{name}.yaml").write_text(SHIPPED[name])
    free = edit(DS32_COMPAT, '      scale_fmt: ["", null, ue8m0]\n', "")
    (tmp_path / "specs" / "compat" / "vllm_ds32.yaml").write_text(free)
    pipeline.build_all(tmp_path)
    (tmp_path / "specs" / "compat" / "vllm_ds32.yaml").write_text(edit(free, "    cases:\n", "    unused: [scale_fmt]\n    cases:\n"))
    with pytest.raises(pipeline.SpecErrors, match=r"unused\[0\]: 'scale_fmt' is used \(passed on, required, a trim's "
                                                   r"counter, or a case's\)"):
        pipeline.build_all(tmp_path)


MEMORY_PROBE = """
import resource, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from codegen import build
from codegen.errors import SpecError
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
worst = 0.0
for path in sys.argv[2:]:
    start = time.perf_counter()
    try:
        kind, tree, display, digest = build.load_spec(Path(path), Path(path).parent.parent)
        build.build_layout(tree, display, digest)
    except SpecError:
        pass
    worst = max(worst, time.perf_counter() - start)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base, worst)
"""


def test_the_heaviest_malformed_specs_stay_within_memory_and_time(tmp_path):
    """The corpus' most expensive inputs (alias bombs, 20,000 nested brackets, a 1 MB file, binary
    data, every encoding case): under 200 MB of peak memory above the interpreter's, and 2 s each."""
    import subprocess
    import sys
    heavy = [c for c in CASES if any(k in c[0] for k in ("bomb", "nesting", "huge", "binary", "utf16", "alias", "merge"))]
    paths = []
    for i, (name, data, _, _) in enumerate(heavy):
        path = tmp_path / f"r{i}" / "specs" / "dsv4_k.yaml"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        paths.append(str(path))
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(ROOT), *paths], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    grown_kib, slowest = int(out[0]), float(out[1])
    assert grown_kib < 200 * 1024, f"{grown_kib / 1024:.0f} MB"
    assert slowest < 2.0, slowest


def test_default_sizes_are_ones_the_layout_accepts(tmp_path):
    """explain, the pictures and diff show a layout at sizes its checks accept, also where no round
    count fits (a group of 48 values, heads split by 16) or none of the searched ones (5000 values)."""
    from codegen import explain
    from codegen.model import HEADS, VALUES
    text = edit(edit(SHIPPED["mxfp8_kv"], "group: {values: 32}", "group: {values: 48}"),
                "{holds: x, order: [head, slot % 32", "{holds: x, order: [head // 16, head % 16, slot % 32")
    path = tmp_path / "specs" / "mxfp8_kv.yaml"
    path.parent.mkdir()
    path.write_text(text)
    layout = build.build_layout(*build.load_spec(path, tmp_path)[1:])
    sizes = explain.default_sizes(layout)
    assert explain.accepts(layout, sizes) and sizes[VALUES] % 48 == 0 and sizes[HEADS] % 16 == 0, sizes
    assert "values=" in explain.explain(layout, sizes)
    # a group wider than the searched counts (5000 values): a multiple of it, drawn and explained
    path.write_text(edit(SHIPPED["mxfp8_kv"], "group: {values: 32}", "group: {values: 5000}"))
    layout = build.build_layout(*build.load_spec(path, tmp_path)[1:])
    sizes = explain.default_sizes(layout)
    assert explain.accepts(layout, sizes) and sizes[VALUES] == 5000, sizes
    assert "<svg " in explain.svg(layout, sizes)


def test_the_helpers_made_per_segment_and_group_are_read_off_the_templates():
    """Every templated function named after a segment or scale group uses the loop names the build
    reads (s, g), so a spec name that would redefine one of them is caught. (f: an element format's
    encoder and decoder, named after kvlayout's own format names, and a compat module's functions.)"""
    from codegen import build
    text = "\n".join(t.read_text() for t in (ROOT / "codegen" / "templates").glob("*.j2"))
    assert set(re.findall(r"^def \w*\{\{ (\w+)\.name \}\}", text, re.M)) == {"s", "g", "f"}
    assert {"_quantize_{}", "_load_{}"} <= set(build.SEGMENT_FUNCTIONS)
    assert {"_{}_exact_scale", "_ref_{}_row"} <= set(build.GROUP_FUNCTIONS)


def test_raw_cache_only_where_the_op_takes_a_cache(tmp_path):
    """raw_cache: true on a function whose op takes no cache (to_mxfp8 calls quantize), or whose
    page_size is a cache tensor's shape[1] (a token-major tensor's is its head count), is a spec error
    at its key; on a writer given page_size it is the shipped spec."""
    from codegen import pipeline
    (tmp_path / "specs" / "compat").mkdir(parents=True)
    for name in ("mxfp8_kv", "mxfp8_v_seqblocked"):
        (tmp_path / "specs" / f"{name}.yaml").write_text(SHIPPED[name])
    shipped = (ROOT / "specs" / "compat" / "sglang_mxfp8.yaml").read_text()
    assert "    raw_cache: true\n" in shipped
    spec = tmp_path / "specs" / "compat" / "sglang_mxfp8.yaml"
    spec.write_text(edit(shipped, "    call: mxfp8_kv.quantize\n", "    call: mxfp8_kv.quantize\n    raw_cache: true\n"))
    with pytest.raises(pipeline.SpecErrors) as err:
        pipeline.build_all(tmp_path)
    (only,) = err.value.errors
    rendered = only.render()
    assert re.match(r"specs/compat/sglang_mxfp8\.yaml:\d+:\d+: functions\[0\]\.raw_cache: quantize takes no cache",
                    rendered), rendered
    spec.write_text(edit(shipped, "    call: mxfp8_v_seqblocked.append\n",
                         "    call: mxfp8_v_seqblocked.append\n    raw_cache: true\n"))
    with pytest.raises(pipeline.SpecErrors) as err:
        pipeline.build_all(tmp_path)
    assert "functions[3].raw_cache: page_size is read off the cache tensor v_cache's shape" in err.value.errors[0].render()
    spec.write_text(shipped)
    pipeline.build_all(tmp_path)



@pytest.mark.parametrize("page", ["{size_multiple_of: 3, align: 6}", "{size_multiple_of: 3, align: 3}", "{align: 648}"])
def test_padding_that_keeps_every_page_aligned_is_accepted(tmp_path, page):
    """ds32_mla's 656-byte records hold fp32 scales and bf16 values: padding to 6 or 3 bytes never
    pads when page sizes are multiples of 3 (1968 bytes a step), and 648 is a multiple of 4."""
    path = tmp_path / "specs" / "ds32_mla.yaml"
    path.parent.mkdir()
    path.write_text(edit(SHIPPED["ds32_mla"], "heads: 1\n", f"heads: 1\npage: {page}\n"))
    layout = build.build_layout(*build.load_spec(path, tmp_path)[1:])
    assert layout.page_align == int(page.rsplit(" ", 1)[1].rstrip("}"))


@pytest.mark.parametrize("split", [2, 3])
def test_dense_ops_take_layouts_that_split_heads(tmp_path, split):
    """quantize and dequantize read a row's record and scale offsets, which no page size or head
    count changes: a layout whose scales split heads in two or three (head counts of that multiple
    only) still runs them, and gives its reference's bytes."""
    import importlib.util
    import torch
    from codegen import render
    from tests.conftest import DEVICE
    from tests.corpus import generator, scaled_normal
    from tests.harness import assert_same_bytes
    text = edit(SHIPPED["mxfp8_kv"], "order: [head, slot % 32, slot // 32, scale]",
                f"order: [head % {split}, head // {split}, slot % 32, slot // 32, scale]")
    path = tmp_path / "specs" / "mxfp8_kv.yaml"
    path.parent.mkdir()
    path.write_text(text)
    module_path = tmp_path / f"split{split}.py"
    module_path.write_text(render.render_layout(build.build_layout(*build.load_spec(path, tmp_path)[1:])))
    spec = importlib.util.spec_from_file_location(f"kvlayout_split_heads_{split}", module_path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    x = scaled_normal((6, 2, 64), generator(5)).to(DEVICE, torch.bfloat16)
    (data, scale), (want_data, want_scale) = m.quantize(x), m.quantize_ref(x)
    assert_same_bytes(data, want_data, "quantize data")
    assert_same_bytes(scale, want_scale, "quantize scale")
    assert_same_bytes(m.dequantize(data, scale), m.dequantize_ref(data, scale), "dequantize")
    with pytest.raises(ValueError, match=r"^x: shape \(6, 48\): values: the value count must be a multiple of 32 "
                                         r"\(values=48\)$"):
        m.quantize(torch.ones(6, 48, device=DEVICE))
    assert m._DENSE_HEADS == split
    with pytest.raises(ValueError, match=rf"^heads: the head extent must be a multiple of {split}"):
        m.alloc_cache(1, 32, heads=split + 1, values=64)
