"""The ops as PyTorch custom operators (torch.library), which every generated module carries.

A serving stack calls cache writers and gathers inside torch.compile'd model code. Traced as plain
Python, an op's checks and launch plans (data pointers, Triton's launcher) break the graph, and
fullgraph=True fails. register_torch_ops() registers each op as one opaque operator with a schema
and a fake (shape-only) implementation, so the compiler keeps it as one node: it runs the module's
own function, every check and launch plan included, when the compiled graph runs.

The schema is derived from the op's Python signature: a Cache is passed as its tensors, one per
field (the writers mutate them); page_size is an int; the call-time scales are tensors; pdl is a
keyword. gather_dequant returns new tensors; gather_dequant_out writes the caller's `out` tensors.
The cache tensors are taken as a RawCache: page-major tensors, as alloc_cache shapes them, keep
every check; token-major or flat ones are accepted as RawCache accepts them.

Everything below the COPY marker is copied into each generated module (see host.py); it reads the
module's names declared here as stand-ins.
"""
from __future__ import annotations

import inspect

import torch

# Names each generated module defines before this code (stand-ins; see the module for their meaning).
LAYOUT = "stand-in"
PLANES: tuple = ()
OPS: tuple = ()
Cache = RawCache = tuple
_TORCH_FAKES: dict = {}

# --- COPY: everything below is copied into each generated module ------------------------------


# The namespaces this module registered (namespace -> torch.ops.<namespace>).
_TORCH_NAMESPACES: dict = {}
# The ops that write their cache tensors in place.
_CACHE_WRITERS = ("quantize_store", "append", "reset_pages")


def register_torch_ops(namespace: str | None = None):
    """Register this layout's ops as PyTorch custom operators, torch.ops.<namespace>.<op>, so that
    torch.compile (fullgraph=True too) keeps each call as one node instead of tracing its Python.

    namespace: the operators' namespace, kvlayout_<layout> by default; another module that vendors the
    same layout (or another build of it) needs a namespace of its own.
    Each operator takes the op's arguments with the Cache as its tensors, in Cache field order, e.g.
    for a cache of fields (k_cache, k_sf, v_cache, v_sf):
        quantize_store(k, v, loc, k_cache, k_sf, v_cache, v_sf, page_size, *, pdl=None) -> None
    (a layout's call-time scales follow page_size, as in its ops). gather_dequant returns its
    outputs; gather_dequant_out(..., out, *, pdl=None) writes them (one out_<plane> argument per
    plane where there are several). Returns torch.ops.<namespace>; registering the same namespace
    again returns it as well.
    """
    namespace = f"kvlayout_{LAYOUT}" if namespace is None else namespace
    if not isinstance(namespace, str) or not namespace.isidentifier() or namespace.startswith("_"):
        raise ValueError(f"namespace: expected an identifier that does not start with '_', got {namespace!r}")
    if namespace in _TORCH_NAMESPACES:
        return _TORCH_NAMESPACES[namespace]
    ops = [op for op in (*OPS, "reset_pages") if op != "gather_dequant"]
    ops += ["gather_dequant", "gather_dequant_out"] if "gather_dequant" in OPS else []
    taken = [op for op in ops if hasattr(getattr(torch.ops, namespace), op)]
    if taken:
        raise ValueError(f"namespace: torch.ops.{namespace}.{taken[0]} is already registered (by torch, another "
                         "library or another copy of a kvlayout module); pass a namespace of its own")
    schemas = {op: _torch_op_params(op) for op in ops}     # all of them first: a refusal registers nothing
    for op, (args, mutated, params) in schemas.items():
        _register_torch_op(namespace, op, args, mutated, params)
    _TORCH_NAMESPACES[namespace] = getattr(torch.ops, namespace)
    return _TORCH_NAMESPACES[namespace]


def _torch_op_params(op: str) -> tuple:
    """(schema arguments, names the operator mutates, the Python op's parameters) of one operator."""
    python_op = _torch_python_op(op)
    signature = inspect.signature(globals()[python_op]).parameters
    params = list(signature)
    written = op in _CACHE_WRITERS
    args, mutated, letter = [], [], 0
    for name in params:
        if name == "cache":
            for field in Cache._fields:
                args.append(f"Tensor(a{letter}!) {field}" if written else f"Tensor {field}")
                mutated += [field] if written else []
                letter += written
        elif name == "out":
            if op == "gather_dequant_out":
                for out in _torch_out_names():
                    args.append(f"Tensor(a{letter}!) {out}")
                    mutated.append(out)
                    letter += 1
        elif name == "pdl":
            args.append("*, bool? pdl=None")
        elif name == "page_size":
            args.append("int page_size")
        elif name == "out_dtype":
            args.append("ScalarType? out_dtype=None")      # None: the op's default, bf16
        else:     # sources, loc, token or page ids, call-time scales: required positional tensors
            param = signature[name]
            if param.kind is not param.POSITIONAL_OR_KEYWORD or param.default is not param.empty:
                raise TypeError(f"{python_op}: parameter {name!r} has no operator schema (a kvlayout bug)")
            args.append(f"Tensor {name}")
    return tuple(args), tuple(mutated), tuple(params)


def _torch_python_op(op: str) -> str:
    """The module's function an operator runs: gather_dequant_out is gather_dequant with its out."""
    return "gather_dequant" if op == "gather_dequant_out" else op


def _torch_out_names() -> tuple:
    """gather_dequant_out's destination arguments: out, or out_<plane> for each plane."""
    return ("out",) if len(PLANES) == 1 else tuple(f"out_{plane}" for plane in PLANES)


def _torch_op_returns(op: str) -> str:
    if op == "gather_dequant":
        return "Tensor" if len(PLANES) == 1 else "(" + ", ".join("Tensor" for _ in PLANES) + ")"
    return {"quantize": "(Tensor, Tensor)", "dequantize": "Tensor"}.get(op, "()")


def _register_torch_op(namespace: str, op: str, args: tuple, mutated: tuple, params: tuple) -> None:
    schema = f"({', '.join(args)}) -> {_torch_op_returns(op)}"
    run, fake = globals()[_torch_python_op(op)], _TORCH_FAKES.get(op)

    def call(*args, pdl=None):
        """The Python op on the operator's arguments (its writers and gather_dequant_out return nothing)."""
        result = run(*_torch_python_args(op, params, args), pdl=pdl)
        return result if op in _TORCH_FAKES else None

    def shapes(*args, pdl=None):
        """The operator's outputs as fake tensors: shapes, dtypes and devices (the compiler's fake
        tensors hold no data, so no check that reads memory runs here)."""
        return fake(*_torch_python_args(op, params, args)) if fake is not None else None

    custom = torch.library.custom_op(f"{namespace}::{op}", call, mutates_args=mutated, schema=schema)
    custom.register_fake(shapes)


def _torch_python_args(op: str, params: tuple, args: tuple) -> list:
    """The Python op's positional arguments from an operator's: the cache's tensors become a RawCache
    again (page-major tensors keep every check), gather_dequant_out's destinations its out."""
    fields, outs = len(Cache._fields), _torch_out_names()
    given, rest = [], list(args)
    for name in params:
        if name == "cache":
            given.append(RawCache(*rest[:fields]))
            del rest[:fields]
        elif name == "out":
            if op == "gather_dequant_out":
                given.append(rest[0] if len(outs) == 1 else tuple(rest[:len(outs)]))
                del rest[:len(outs)]
            else:
                given.append(None)
        elif name == "out_dtype":
            value = rest.pop(0) if rest else None
            given.append(torch.bfloat16 if value is None else value)
        elif name != "pdl":
            given.append(rest.pop(0))
    return given
