"""register_torch_ops: every layout's ops as PyTorch custom operators. Each operator gives its Python
op's bytes (poisoned outputs, random caches, adversarial rows), passes torch.library.opcheck's fake
tensor and AOT-dispatch tests, and a torch.compile(fullgraph=True) graph of a write and a read gives
eager's bytes, calling the operators in place on the graph's own cache tensors."""
import contextlib
import inspect

import pytest
import torch

from tests.conftest import DEVICE
from tests.corpus import adversarial_rows, generator, scaled_normal
from tests.harness import (LAYOUTS, assert_same_bytes, assert_same_cache, clone, dims, fresh_cache, given, module,
                           pairs, plane_rows, sources, unique_slots)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch inductor's own import
# opcheck's tests that apply to operators, on real data: the schema's mutations are the ones made (the
# cache passed as uint8 views, which its schema test can compare), fake tensors, AOT dispatch (with
# dynamic shapes).
OPCHECK = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def one_per_signature(names) -> list:
    """The first of the layouts whose ops have the same Python signatures and Cache fields: the operators'
    schemas, fakes and argument mapping depend on nothing else (the fakes call the ops' own output
    functions), so opcheck and the compile tests run once per signature, the bytes test on every layout."""
    seen = {}
    for name in names:
        m = module(name)
        key = (tuple((op, str(inspect.signature(getattr(m, op)))) for op in m.OPS), m.Cache._fields)
        seen.setdefault(key, name)
    return list(seen.values())


def fresh_compile():
    """torch.compile without its on-disk caches: a graph compiled by an earlier run (with other operator
    schemas, e.g. other mutations declared) would otherwise be reused, and the test could not fail."""
    import torch._functorch.config
    import torch._inductor.config
    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    return stack


def operators(name: str):
    """The layout's operators in a namespace of the test's own (zoo modules are separate copies)."""
    return module(name).register_torch_ops(f"kvlayout_test_{name}")


def rows(m, heads: int, values: int, gen, tokens: int = 9) -> list:
    """tokens rows per plane: scaled random values with a block of adversarial ones (NaN, inf, ties, ...)."""
    v = scaled_normal((tokens, heads, values), gen)
    special = adversarial_rows(values, gen)
    v.view(-1, values)[:2] = special[torch.randint(0, special.shape[0], (2,), generator=gen)]
    return [r.to(DEVICE) for r in plane_rows(m, v)]


def setup(name: str, seed: int):
    m = module(name)
    heads, values, page = dims(m)
    gen = generator(seed)
    cache = fresh_cache(m, 4, page, heads, values, gen)
    loc = unique_slots(4 * page, 9, gen, extra=(-1,)).to(DEVICE)
    return m, cache, loc, heads, values, page, gen


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_operator_gives_its_python_ops_bytes(name):
    m, cache, loc, heads, values, page, gen = setup(name, 61)
    ops, scales = operators(name), given(m)
    scale_args = [scales[s] for s in m._GIVEN_SCALES]
    writer = next((op for op in ("quantize_store", "append") if op in m.OPS), None)
    if writer is not None:
        srcs = sources(m, rows(m, heads, values, gen))
        if writer == "append":
            loc = torch.arange(3, 12, device=DEVICE)           # append writes a block's rows in order
        by_op, by_python = clone(m, cache), clone(m, cache)
        getattr(ops, writer)(*srcs, loc, *by_op, page, *scale_args)
        getattr(m, writer)(*srcs, loc, by_python, page, **scales)
        assert_same_cache(m, by_op, by_python, f"{name}.{writer} as an operator")
        assert any(not torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(by_op, cache)), "nothing written"
        cache = by_op
    if "gather_dequant" in m.OPS:
        ids = torch.cat([loc, torch.tensor([-1, 4 * page + 3], device=DEVICE)])
        want = m.gather_dequant(cache, ids, page, **scales)
        for plane, got, expected in pairs(m, ops.gather_dequant(*cache, ids, page, *scale_args), want):
            assert_same_bytes(got, expected, f"{name}.gather_dequant as an operator ({plane})")
        outs, wants = ([torch.full((ids.shape[0], heads, values), float("nan"), dtype=torch.float32, device=DEVICE)
                        for _ in m.PLANES] for _ in range(2))
        assert ops.gather_dequant_out(*cache, ids, page, *scale_args, *outs) is None
        m.gather_dequant(cache, ids, page, **scales, out=tuple(wants) if len(wants) > 1 else wants[0])
        for plane, got, expected in zip(m.PLANES, outs, wants, strict=True):
            assert_same_bytes(got, expected, f"{name}.gather_dequant_out ({plane})")
    if "quantize" in m.OPS:
        x = rows(m, heads, values, gen)[0].reshape(3, -1, values)      # (..., values) rows, 3-D
        data, scale = m.quantize(x)
        for got, expected in zip(ops.quantize(x), (data, scale), strict=True):
            assert_same_bytes(got, expected, f"{name}.quantize as an operator")
        for dtype in (None, torch.float16):
            assert_same_bytes(ops.dequantize(data, scale, dtype), m.dequantize(data, scale, dtype or torch.bfloat16),
                              f"{name}.dequantize as an operator ({dtype})")
    pages, reset = torch.tensor([2, -1], device=DEVICE), clone(m, cache)
    ops.reset_pages(*reset, pages, page)
    m.reset_pages(cache, pages, page)
    assert_same_cache(m, reset, cache, f"{name}.reset_pages as an operator")


@pytest.mark.parametrize("name", one_per_signature(LAYOUTS))
def test_operators_pass_opcheck(name):
    """Fake tensors (the shapes, dtypes and devices the compiler sees) match the real outputs, and
    the mutations the schema declares are the ones made, under AOT dispatch with dynamic shapes."""
    m, cache, loc, heads, values, page, gen = setup(name, 62)
    cache = m.Cache(*(t.view(torch.uint8) for t in cache))
    ops, scale_args = operators(name), list(given(m).values())
    # opcheck compares outputs as numbers, NaN unequal to NaN: the gathers read rows written from finite
    # values (random cache bytes hold NaN codes)
    finite = [r.to(DEVICE) for r in plane_rows(m, scaled_normal((loc.shape[0], heads, values), gen))]
    if "quantize_store" in m.OPS:
        m.quantize_store(*sources(m, finite), loc, cache, page, **given(m))
    elif "append" in m.OPS:
        loc = torch.arange(3, 12, device=DEVICE)
        m.reset_pages(cache, torch.arange(4, device=DEVICE), page)
        m.append(*finite, loc, cache, page)
    ids, calls = loc[loc >= 0], []
    if "gather_dequant" in m.OPS:
        calls.append(("gather_dequant", (*cache, ids, page, *scale_args)))
        outs = [torch.empty((ids.shape[0], heads, values), dtype=torch.float16, device=DEVICE) for _ in m.PLANES]
        calls.append(("gather_dequant_out", (*cache, ids, page, *scale_args, *outs)))
    if "quantize" in m.OPS:
        x = finite[0].reshape(3, -1, values)      # (..., values) rows, 3-D
        data, scale = m.quantize(x)
        calls += [("quantize", (x,)), ("dequantize", (data.view(torch.uint8), scale, torch.float32))]
    # the writers last, on a copy (they write adversarial rows' NaN codes)
    cache = clone(m, cache)
    if "quantize_store" in m.OPS:
        calls.append(("quantize_store", (*sources(m, rows(m, heads, values, gen)), loc, *cache, page, *scale_args)))
    if "append" in m.OPS:
        calls.append(("append", (*rows(m, heads, values, gen), loc, *cache, page)))
    calls.append(("reset_pages", (*cache, torch.tensor([1], device=DEVICE), page)))
    for op, args in calls:
        try:
            torch.library.opcheck(getattr(ops, op), args, test_utils=OPCHECK)
        except Exception as e:
            raise AssertionError(op) from e


@pytest.mark.parametrize("name", one_per_signature(n for n in LAYOUTS if "gather_dequant" in module(n).OPS
                                                   and {"quantize_store", "append"} & set(module(n).OPS)))
def test_a_fullgraph_compile_of_a_write_and_a_read_gives_eagers_bytes(name):
    m, cache, loc, heads, values, page, gen = setup(name, 63)
    ops, scales = operators(name), given(m)
    writer = "quantize_store" if "quantize_store" in m.OPS else "append"
    srcs = sources(m, rows(m, heads, values, gen))
    if writer == "append":
        loc = torch.arange(3, 12, device=DEVICE)

    def step(srcs, loc, cache, scales, outs):
        getattr(ops, writer)(*srcs, loc, *cache, page, *scales)
        ops.gather_dequant_out(*cache, loc, page, *scales, *outs)      # outs written in place
        return ops.gather_dequant(*cache, loc, page, *scales)

    def poisoned():
        return [torch.full((loc.shape[0], heads, values), float("nan"), device=DEVICE) for _ in m.PLANES]

    torch._dynamo.reset()
    compiled, eager, compiled_outs, eager_outs = clone(m, cache), clone(m, cache), poisoned(), poisoned()
    with fresh_compile():
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(srcs, loc, compiled, list(scales.values()),
                                                                       compiled_outs)
    want = step(srcs, loc, eager, list(scales.values()), eager_outs)
    assert_same_cache(m, compiled, eager, f"{name}: compiled {writer}")
    for plane, a, b in pairs(m, got, want):
        assert_same_bytes(a, b, f"{name}: compiled gather_dequant ({plane})")
    for plane, a, b in zip(m.PLANES, compiled_outs, eager_outs, strict=True):
        assert_same_bytes(a, b, f"{name}: compiled gather_dequant_out ({plane})")


def test_inductor_calls_the_writer_in_place_on_the_graphs_cache():
    """Inductor keeps a writer as one call on the cache tensors passed in (no copy of the cache in and
    out, which would cost a cache's bytes per step), and a gather's output feeds the graph's math."""
    from torch._inductor.utils import run_and_get_code
    name = "mxfp8_kv"
    m, cache, loc, heads, values, page, gen = setup(name, 64)
    ops = operators(name)
    k, v = rows(m, heads, values, gen)

    def step(k, v, loc, cache):
        ops.quantize_store(k, v, loc, *cache, page)
        keys, _ = ops.gather_dequant(*cache, loc, page)
        return keys.float() * 2

    torch._dynamo.reset()
    compiled, eager = clone(m, cache), clone(m, cache)
    with fresh_compile():
        got, code = run_and_get_code(torch.compile(step, fullgraph=True), k, v, loc, compiled)
    want = step(k, v, loc, eager)
    assert_same_cache(m, compiled, eager, f"{name}: inductor")
    assert_same_bytes(got, want, f"{name}: inductor's output")
    code = "\n".join(code)
    calls = [line.strip() for line in code.splitlines() if "kvlayout_test_mxfp8_kv.quantize_store.default(" in line]
    assert len(calls) == 1 and ".copy_(" not in code and "clone" not in code, calls


def test_registration_errors_and_reuse():
    m, other = module("mxfp8_kv"), module("zoo_two_rules")
    ops = m.register_torch_ops("kvlayout_test_reuse")
    assert m.register_torch_ops("kvlayout_test_reuse") is ops is torch.ops.kvlayout_test_reuse
    with pytest.raises(ValueError, match=r"^namespace: torch\.ops\.kvlayout_test_reuse\.\w+ is already registered"):
        other.register_torch_ops("kvlayout_test_reuse")
    with pytest.raises(ValueError, match=r"^namespace: torch\.ops\.aten\.dequantize is already registered \(by torch"):
        m.register_torch_ops("aten")           # torch's own operator of that name
    for bad in ("has space", "_private", "", 3, "a::b"):
        with pytest.raises(ValueError, match="^namespace: expected an identifier"):
            m.register_torch_ops(bad)
    assert m.register_torch_ops() is torch.ops.kvlayout_mxfp8_kv


def test_a_parameter_without_a_schema_is_refused_before_anything_is_registered(monkeypatch):
    """An op parameter the schema mapping does not know (an optional or keyword-only one) would be
    misstated as a required tensor: registration refuses it and registers no operator."""
    m = module("mxfp8_kv")

    def quantize(x, rounding="rne", *, pdl=None):
        return m.quantize(x, pdl=pdl)

    monkeypatch.setattr(m, "quantize", quantize)
    with pytest.raises(TypeError, match=r"^quantize: parameter 'rounding' has no operator schema"):
        m.register_torch_ops("kvlayout_test_unmapped")
    assert not hasattr(torch.ops.kvlayout_test_unmapped, "quantize_store")


def test_an_operators_bad_argument_is_the_ops_value_error():
    """The operator runs the op's checks: a bad argument raises its ValueError, naming the argument
    as the op does (the cache's fields by name)."""
    m, cache, loc, heads, values, page, gen = setup("mxfp8_kv", 65)
    ops = operators("mxfp8_kv")
    k, v = rows(m, heads, values, gen)
    with pytest.raises(ValueError, match=r"^page_size: cache\.k_cache was allocated for page_size="):
        ops.quantize_store(k, v, loc, *cache, page * 2)
    with pytest.raises(ValueError, match=r"^cache\.k_cache: overlaps cache\.v_cache in memory"):
        ops.gather_dequant(cache.k_cache, cache.k_sf, cache.k_cache, cache.v_sf, loc, page)
