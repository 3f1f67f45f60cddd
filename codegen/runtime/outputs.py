"""Host side of the ops that return tensors (gather_dequant, quantize, dequantize): their argument
checks, their destinations, and their outputs for the compiler's fake tensors.

Everything below the COPY marker is copied into each generated module (see host.py), except the
helpers of ops the layout does not have (render._carried). The layout's facts are the
module-level names each generated module defines (declared here as stand-ins).
"""
from __future__ import annotations

import torch

# Names each generated module defines before this code (stand-ins; see the module for their meaning).
PLANES: tuple = ()
HEADS: int | None = None
VALUES: int | None = None
OUT_DTYPES = SOURCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_GIVEN_SCALES: tuple = ()
_OUT_NAMES: tuple = ()
_GATHER_NAMES: tuple = ()
_GATHER_WRITTEN: tuple = ()
_DENSE_DATA_DTYPE = _DENSE_SCALE_DTYPE = torch.uint8
_DEQUANTIZE_DATA_DTYPES = _DEQUANTIZE_SCALE_DTYPES = (torch.uint8,)
_cache_dims = _check_index = _check_cache = _check_given_scales = _check_tensor = None
_check_distinct_elements = _check_head_offsets = _check_apart = _dense_geometry = None

# --- COPY: everything below is copied into each generated module ------------------------------


def _prepare_gather(cache, token_ids, page_size: int, out, scales: tuple = ()) -> tuple:
    """Checks for the readers (and the call-time scales); returns (one destination per plane, geometry, pages)."""
    heads, values = _cache_dims(cache)
    device = token_ids.device if isinstance(token_ids, torch.Tensor) else None
    _check_index("token_ids", token_ids, device)
    geo, num_pages = _check_cache(cache, page_size, heads, values, device)
    if _GIVEN_SCALES:
        _check_given_scales(scales, device, heads)
    n_tokens = token_ids.shape[0]
    if out is None:
        out = _gather_outputs(cache, token_ids)
    elif len(PLANES) == 1:
        out = (out,)
    if not isinstance(out, (tuple, list)) or len(out) != len(PLANES):
        raise ValueError(f"out: expected a tuple of {len(PLANES)} tensors ({', '.join(PLANES)})")
    views = []
    for name, o in zip(_OUT_NAMES, out):
        _check_tensor(name, o, OUT_DTYPES, (3,) if HEADS is None else (2, 3), device, written=True)
        _check_distinct_elements(name, o)
        # (T, heads, values), or where heads is fixed (T, heads * values) as the writers take it too
        shape = (n_tokens, heads, values) if o.dim() == 3 else (n_tokens, heads * values)
        if tuple(o.shape) != shape or (o.stride(-1) != 1 and shape[-1] > 1):
            shapes = f"{(n_tokens, heads, values)}" + ("" if HEADS is None else f" or {(n_tokens, heads * values)}")
            raise ValueError(f"{name}: expected shape {shapes} with a contiguous last dim, "
                             f"got {tuple(o.shape)} strides {tuple(o.stride())}")
        if o.dim() == 2:
            o = o.view(n_tokens, heads, values)
        _check_head_offsets(name, o)
        views.append(o)
    if len({o.dtype for o in views}) > 1:
        raise ValueError("out: all planes must share one dtype")
    _check_apart(_GATHER_NAMES, (token_ids, *cache, *scales, *out), _GATHER_WRITTEN)
    return tuple(views), geo, num_pages


def _gather_outputs(cache, token_ids) -> tuple:
    """gather_dequant's destinations where no out is passed: one bf16 (T, heads, values) tensor per plane."""
    heads, values = _cache_dims(cache)
    return tuple(torch.empty((token_ids.shape[0], heads, values), dtype=torch.bfloat16, device=token_ids.device)
                 for _ in PLANES)


def _gather_dequant_fake(cache, token_ids, *args):
    """gather_dequant's outputs (no out passed), of the compiler's fake tensors (see register_torch_ops)."""
    outs = _gather_outputs(cache, token_ids)
    return outs[0] if len(PLANES) == 1 else outs


def _prepare_quantize(x) -> tuple:
    """Checks for quantize; returns (2-D rows with a contiguous last dim, leading shape, geometry)."""
    _check_tensor("x", x, SOURCE_DTYPES)
    if x.dim() == 0:
        raise ValueError("x: expected at least one dim")
    values = x.shape[-1]
    geo = _dense_geometry(values, "x", x.shape)
    x2 = x.reshape(-1, values)
    if x2.stride(1) != 1 and values > 1:
        x2 = x2.contiguous()
    return x2, tuple(x.shape[:-1]), geo


def _quantize_outputs(x, lead: tuple, geo: dict) -> tuple:
    """quantize's (data, scale) for rows of leading shape `lead`."""
    return (torch.empty((*lead, geo["RECORD_BYTES"]), dtype=_DENSE_DATA_DTYPE, device=x.device),
            torch.empty((*lead, geo["DENSE_SCALES"]), dtype=_DENSE_SCALE_DTYPE, device=x.device))


def _quantize_fake(x):
    """quantize's outputs, of the compiler's fake tensors (see register_torch_ops)."""
    _, lead, geo = _prepare_quantize(x)
    return _quantize_outputs(x, lead, geo)


def _dtype_names(dtypes: tuple) -> str:
    """Torch dtypes as an error message names them: "uint8/int8"."""
    return "/".join(str(d).removeprefix("torch.") for d in dtypes)


def _prepare_dequantize(data, scale, out_dtype) -> tuple:
    """Checks for dequantize; returns (2-D uint8 records, 2-D scales as the kernel reads them, leading
    shape, geometry)."""
    _check_tensor("data", data)
    _check_tensor("scale", scale, None, None, data.device)
    if data.dtype not in _DEQUANTIZE_DATA_DTYPES or data.dim() == 0:
        raise ValueError(f"data: expected {_dtype_names(_DEQUANTIZE_DATA_DTYPES)} records (..., record bytes), "
                         f"got {data.dtype} {tuple(data.shape)}")
    if scale.dtype not in _DEQUANTIZE_SCALE_DTYPES:
        raise ValueError(f"scale: expected {_dtype_names(_DEQUANTIZE_SCALE_DTYPES)} scales, got {scale.dtype}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: {out_dtype} is not supported; use one of {', '.join(map(str, OUT_DTYPES))}")
    values = VALUES if VALUES is not None else data.shape[-1]
    geo = _dense_geometry(values, "data", data.shape)
    if data.shape[-1] != geo["RECORD_BYTES"]:
        raise ValueError(f"data: last dim must be {geo['RECORD_BYTES']} record bytes, got {tuple(data.shape)}")
    lead = tuple(data.shape[:-1])
    if tuple(scale.shape) != lead + (geo["DENSE_SCALES"],):
        raise ValueError(f"scale: expected shape {lead + (geo['DENSE_SCALES'],)}, got {tuple(scale.shape)}")
    data2 = data.reshape(-1, geo["RECORD_BYTES"]).contiguous().view(torch.uint8)
    scale2 = scale.reshape(-1, geo["DENSE_SCALES"]).contiguous()
    if _DENSE_SCALE_DTYPE == torch.uint8:      # one-byte scales: their bytes, whichever view was passed
        scale2 = scale2.view(torch.uint8)
    return data2, scale2, lead, geo


def _out_dtype(out_dtype):
    """dequantize's output dtype: None is the default, bf16 (the torch operator's schema reads it so)."""
    return torch.bfloat16 if out_dtype is None else out_dtype


def _dequantize_output(data, lead: tuple, geo: dict, out_dtype) -> torch.Tensor:
    """dequantize's destination for records of leading shape `lead`."""
    return torch.empty((*lead, geo["VALUES"]), dtype=out_dtype, device=data.device)


def _dequantize_fake(data, scale, out_dtype=torch.bfloat16):
    """dequantize's output, of the compiler's fake tensors (see register_torch_ops)."""
    _, _, lead, geo = _prepare_dequantize(data, scale, out_dtype)
    return _dequantize_output(data, lead, geo, out_dtype)
