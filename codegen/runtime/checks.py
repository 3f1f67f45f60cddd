"""Host-side helpers every generated module carries: sizes, argument checks, launch shapes.

Everything below the COPY marker is copied into each generated module (see host.py), except the
optional helpers a module's ops do not call (render._carried). The code is layout-free: it
reads the layout's facts from the module-level names each generated module defines first (its
HEADS, PLANES, LAUNCH, _geometry, ...), which are declared here as stand-ins so that this file
imports and lints on its own.
"""
from __future__ import annotations

import functools

import torch
import triton

# Names each generated module defines (stand-ins; see the module for their meaning).
LAYOUT = "stand-in"
HEADS: int | None = None
VALUES: int | None = None
PAGE_SIZE_MULTIPLE = 1
_DENSE_HEADS = 1
PLANES: tuple = ()
LAUNCH: dict = {}
INDEX_DTYPES = (torch.int32, torch.int64)
SOURCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
Cache = RawCache = tuple
_PLANS: dict = {}
_RECORDS_FIELD, _RECORDS_NAME, _RECORDS_INDEX, _RECORDS_DTYPE = "cache.stand_in", "stand_in", 0, torch.uint8
_CACHE_NAMES: tuple = ()
_PAGE_BYTES_NAMES: tuple = ()
_PAGE_STRIDE_NAMES: tuple = ()
_RECORD_FIELDS: tuple = ()
_FIELD_ALIGN: tuple = ()
_WORD_SCALES: tuple | None = None
INPUTS: tuple = ()
_STORE_NAMES: tuple = ()
_STORE_WRITTEN: tuple = ()
_GIVEN_SCALES: tuple = ()
_ROW_PLANES, _CODES_PER_BYTE, _RECORD_OVERHEAD = 1, 1, 0
_geometry = _index = _check_apart = _wait_for_previous = cache_shapes = _segment_tiles = None

# --- COPY: everything below is copied into each generated module ------------------------------


def clear_plans() -> None:
    """Forget every op's launch plans and launch shapes, so that later calls launch afresh: call it
    after changing LAUNCH (a plan keeps the launch shape of its first call; DEPENDENT_LAUNCH is part
    of its key)."""
    for plans in _PLANS.values():
        plans.clear()
    shapes = globals().get("_launch_shape")      # (an append-only module has none)
    if shapes is not None:
        shapes.cache_clear()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _cdiv(a: int, b: int) -> int:
    """Ceiling division on the host (triton.cdiv is a constexpr function: microseconds a call)."""
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _prev_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def geometry(page_size: int, heads: int, values: int) -> dict:
    """Byte strides and offsets for one call shape, as kernel constexprs (raises ValueError): a
    dict of the caller's own (the kernels launch from a cached one, which it must not change)."""
    return dict(_checked_geometry(page_size, heads, values))


def _cache_dims(cache) -> tuple:
    """(heads, values) of a cache: from the spec, else from the records field's last two dims (its
    last dim: _ROW_PLANES records, each of values' codes and _RECORD_OVERHEAD bytes)."""
    if not isinstance(cache, tuple) or len(cache) != len(Cache._fields):
        raise ValueError(f"cache: expected a {LAYOUT}.Cache with fields {', '.join(Cache._fields)}")
    if HEADS is not None and VALUES is not None:
        return HEADS, VALUES
    records = cache[_RECORDS_INDEX]
    _check_tensor(_RECORDS_FIELD, records)
    if records.dim() < 3:
        raise ValueError(f"{_RECORDS_FIELD}: expected (..., heads, values) trailing dims, got shape {tuple(records.shape)}")
    heads = records.shape[-2] if HEADS is None else HEADS
    if VALUES is not None:
        return heads, VALUES
    width, rows = records.shape[-1], _ROW_PLANES
    if (rows > 1 or _RECORD_OVERHEAD) and (width % rows or width // rows <= _RECORD_OVERHEAD):
        raise ValueError(f"{_RECORDS_FIELD}: a last dim of {width} is not {rows} record(s) of values"
                         + (f" and {_RECORD_OVERHEAD} scale bytes" if _RECORD_OVERHEAD else ""))
    return heads, (width // rows - _RECORD_OVERHEAD) * _CODES_PER_BYTE


def _checked_geometry(page_size: int, heads: int, values: int) -> dict:
    """geometry()'s cached dict itself, for the ops (which only read it)."""
    return _geometry(_index(page_size, "page_size"), _index(heads, "heads"), _index(values, "values"))


def _sized_geometry(page_size: int, heads: int, values: int, name: str, shape) -> dict:
    """_checked_geometry(), a size error naming the tensor whose shape gave heads and values."""
    try:
        return _checked_geometry(page_size, heads, values)
    except ValueError as err:
        if str(err).startswith("page_size:"):
            raise
        raise ValueError(f"{name}: shape {tuple(shape)}: {err}") from None


def _dense_geometry(values: int, name: str, shape) -> dict:
    """The geometry dense ops (quantize, dequantize) read a row's record and scale offsets from, which
    no page size or head count changes: at _DENSE_HEADS heads and the first page size the layout takes
    with this value count; a value count none takes is an error naming the tensor, in values alone."""
    told = None
    for k in (1, 2, 4, 8, 16, 32, 64, 128):          # page sizes, in PAGE_SIZE_MULTIPLEs
        try:
            return _checked_geometry(PAGE_SIZE_MULTIPLE * k, _DENSE_HEADS, values)
        except ValueError as err:
            if told is None or str(err).startswith("values:") and not told.startswith("values:"):
                told = str(err)
    reason, sizes, _ = told.partition(" (page_size=")     # the sizes geometry() tells, given only where it did
    raise ValueError(f"{name}: shape {tuple(shape)}: {reason}" + (f" (values={values})" if sizes else ""))


def _check_allocation(shapes: dict, device) -> None:
    """alloc_cache's arguments beyond the sizes: a device torch knows and this process has (None:
    torch's default device), and tensors whose bytes torch can count (2**62 at most)."""
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"device: {device!r} is not a torch device ({str(err).splitlines()[0]})") from None
        if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
            raise ValueError(f"device: {device} is not available in this process "
                             f"({torch.cuda.device_count() if torch.cuda.is_available() else 'no'} CUDA devices); "
                             "pass device='cpu' or an available one (None: torch's default device)")
        if device.type != "cuda":
            try:                 # another backend's own error (not built in, no such device) is its to tell
                torch.empty(0, device=device)
            except Exception as err:
                raise ValueError(f"device: {device} cannot hold tensors in this process "
                                 f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    for field, (shape, dtype) in shapes.items():
        page_bytes = dtype.itemsize
        for n in shape[1:]:
            page_bytes *= n
        if page_bytes * shape[0] >= 2 ** 62:
            told = "num_pages" if page_bytes < 2 ** 62 else "page_size, heads and values"
            raise ValueError(f"{told}: {shape[0]} page(s) of {page_bytes} bytes of cache.{field} take more than a "
                             "tensor holds (2**62 bytes)")


def _check_tensor(name: str, t, dtypes=None, ndims=None, device=None, written: bool = False) -> None:
    """A tensor argument: dense, stored as its values say, of the dtypes, dims and device given;
    one the kernels write (written) must not require grad."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_meta:
        raise ValueError(f"{name}: is a meta tensor (it holds no data)")
    if t.layout is not torch.strided or t.is_nested:
        raise ValueError(f"{name}: is a {'nested' if t.is_nested else t.layout} tensor; expected a dense (strided) one")
    if t.is_quantized:                 # (its bytes are not its storage's plain elements to torch's views)
        raise ValueError(f"{name}: is a quantized tensor ({t.dtype}); pass a plain one (e.g. its .int_repr())")
    if t.is_neg() or t.is_conj():      # lazy views: the kernels read and write the stored bytes, not the view's values
        raise ValueError(f"{name}: is a lazily negated or conjugated view; materialize it first "
                         "(resolve_neg() / resolve_conj())")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported; use one of {', '.join(map(str, dtypes))}")
    if ndims is not None and t.dim() not in ndims:
        raise ValueError(f"{name}: expected {' or '.join(map(str, ndims))} dims, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: is on {t.device}, but the other tensors are on {device}")
    if written and t.requires_grad:
        raise ValueError(f"{name}: requires grad; the kernels write it in place, outside autograd (detach it)")


def _check_index(name: str, t, device, length=None) -> None:
    _check_tensor(name, t, INDEX_DTYPES, (1,), device)
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name}: has {t.shape[0]} entries, expected {length} (one per token)")
    if t.stride(0) != 1 and t.shape[0] > 1:
        raise ValueError(f"{name}: must be contiguous")


def _check_rows(name: str, t, device, values=None) -> torch.Tensor:
    """A (T, heads, values) source or destination; (T, heads * values) is viewed as 3-D where heads is fixed."""
    _check_tensor(name, t, None, (2, 3), device)
    if t.dim() == 2:
        if HEADS is None:
            raise ValueError(f"{name}: expected (tokens, heads, values), got shape {tuple(t.shape)}")
        if t.shape[1] % HEADS:
            raise ValueError(f"{name}: last dim {t.shape[1]} is not a multiple of {HEADS} heads")
        t = t.view(t.shape[0], HEADS, t.shape[1] // HEADS)
    if t.stride(2) != 1 and t.shape[2] > 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(t.stride())}")
    if t.shape[1] == 0 or t.shape[2] == 0:
        raise ValueError(f"{name}: shape {tuple(t.shape)} has no heads or no values")
    if HEADS is not None and t.shape[1] != HEADS:
        raise ValueError(f"{name}: expected {HEADS} head(s), got shape {tuple(t.shape)}")
    if values is not None and t.shape[2] != values:
        raise ValueError(f"{name}: expected {values} values per head, got shape {tuple(t.shape)}")
    _check_head_offsets(name, t)
    return t


def _check_head_offsets(name: str, t) -> None:
    """A (T, heads, values) tensor whose rows the kernels reach: they take head * stride(1) + value
    index in 32 bits where Triton passes the stride so (below 2**31), so rows that end 2**31
    elements or more past their token's first are refused."""
    reach = (t.shape[1] - 1) * t.stride(1) + t.shape[2] - 1
    if t.stride(1) < 2 ** 31 <= reach:
        raise ValueError(f"{name}: head {t.shape[1] - 1} ends {reach} elements past its token's first (heads "
                         f"{t.stride(1)} apart), past the kernels' 32-bit head offsets (2**31 - 1); pass a tensor "
                         "with closer heads (e.g. .contiguous())")


def _check_cache(cache, page_size: int, heads: int, values: int, device, dims_from: tuple | None = None) -> tuple:
    """Validate every Cache tensor; returns (geometry, num_pages). dims_from: (name, shape) of the
    tensor that gave heads and values, for size errors (None: the cache's records tensor)."""
    if not isinstance(cache, tuple) or len(cache) != len(Cache._fields):
        raise ValueError(f"cache: expected a {LAYOUT}.Cache with fields {', '.join(Cache._fields)}")
    if type(cache) not in (tuple, Cache, RawCache) and hasattr(type(cache), "_fields"):   # another layout's
        raise ValueError(f"cache: is a {type(cache).__module__}.{type(cache).__qualname__}, not this layout's "
                         f"{LAYOUT}.Cache; pass its Cache (another layout's lays its bytes out another way) or a "
                         "plain tuple of its fields")
    _check_fields_apart(cache)
    try:
        return _check_cache_tensors(cache, page_size, heads, values, device, dims_from)
    except ValueError as err:
        swapped = _swap_error(cache, page_size, None if dims_from is None else (heads, values), device)
        if swapped is None:
            raise
        raise ValueError(swapped) from err


# Why two cache fields may not share bytes (the writers' and readers' refusal, checked path and replays).
_FIELDS_APART = "each cache field needs a buffer of its own"


def _check_fields_apart(cache) -> None:
    """Each cache field is a buffer of its own: where two share bytes (one tensor passed for both),
    one field's bytes would be read or written as the other's; interleaved page-strided views (vLLM's
    kv_cache[:, 0] and [:, 1]) are apart. Tensors the later checks refuse (not dense, pages not
    contiguous, no data, on another device) are left to them."""
    if not all(isinstance(t, torch.Tensor) and t.layout is torch.strided and not (t.is_nested or t.is_meta)
               and (t.is_contiguous() or _pages_contiguous(t)) for t in cache) or len({t.device for t in cache}) > 1:
        return
    _check_apart(_CACHE_NAMES, tuple(cache), tuple(range(len(cache))), _FIELDS_APART)


def _pages_contiguous(t: torch.Tensor) -> bool:
    """Whether t is a tensor of whole pages, each contiguous, whatever the step between them: every
    dim but the first contiguous (a page-strided view: vLLM's kv_cache[:, 0] of a (num_blocks, 2,
    ...) tensor, or a cache padded per page)."""
    if t.dim() < 2:
        return False
    expected = 1
    for n, s in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _page_stride(field: str, t: torch.Tensor, page_bytes: int, align: int) -> int:
    """The bytes from one page of a page-strided cache tensor to the next (its first dim's stride),
    checked: positive, at least a page (pages may not overlap) and a multiple of the field's alignment
    (the kernels' typed loads stay aligned)."""
    stride = t.stride(0) * t.element_size()
    if t.shape[0] > 1 and stride < page_bytes:
        raise ValueError(f"cache.{field}: its pages are {stride} bytes apart (strides {tuple(t.stride())}), fewer than "
                         f"the {page_bytes} bytes of a page: pages would overlap; pass a view whose pages are at "
                         "least a page apart")
    if stride % align:
        raise ValueError(f"cache.{field}: its pages are {stride} bytes apart (strides {tuple(t.stride())}), not a "
                         f"multiple of {align}: the kernels load and store {align}-byte values in it; pass a view "
                         f"whose pages are a multiple of {align} bytes apart")
    return stride


def _swap_error(cache, page_size: int, dims: tuple | None, device) -> str | None:
    """An error naming two cache tensors passed in each other's places, where the cache passes its
    checks with them exchanged (dims: the sources' (heads, values); None: the records tensor's);
    None where no exchange of two does."""
    fields = Cache._fields
    if dims is not None:
        try:
            _check_cache_tensors(cache, page_size, *dims, device)
            return None                 # the cache holds whole pages as passed: the fault is elsewhere
        except ValueError:
            pass
    for i in range(len(fields)):
        for j in range(i + 1, len(fields)):
            a, b = cache[i], cache[j]
            alike = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() > 0 and b.dim() > 0
                     and (a.shape[0], a.nbytes) == (b.shape[0], b.nbytes))
            if a is b or alike:
                continue                # as many pages of as many bytes: the checks cannot tell them apart
            tensors = list(cache)
            tensors[i], tensors[j] = cache[j], cache[i]
            exchanged = type(cache)(*tensors) if type(cache) in (Cache, RawCache) else tuple(tensors)
            try:
                _check_cache_tensors(exchanged, page_size, *(dims or _cache_dims(exchanged)), device)
            except ValueError:
                continue
            return (f"cache.{fields[i]} and cache.{fields[j]}: hold each other's tensors (exchanged, every cache "
                    f"tensor holds whole pages of page_size={page_size}); pass each tensor in its own place "
                    f"({', '.join('cache.' + f for f in fields)})")
    return None


def _check_cache_tensors(cache, page_size: int, heads: int, values: int, device, dims_from: tuple | None = None) -> tuple:
    """_check_cache for a tuple of the layout's field count."""
    raw = type(cache) is RawCache
    from_records = dims_from is None and None in (HEADS, VALUES)     # the records tensor gave heads and values
    if dims_from is None:
        _check_tensor(_RECORDS_FIELD, cache[_RECORDS_INDEX])
        dims_from = (_RECORDS_FIELD, cache[_RECORDS_INDEX].shape)
    try:
        geo = _sized_geometry(page_size, heads, values, *dims_from)
    except ValueError:
        # heads and values from a records tensor of another dtype, or of another field, are no sizes of its own
        misplaced = (_records_dtype_error(cache[_RECORDS_INDEX], heads, values) or _misplaced_records_error(cache)
                     if from_records else None)
        if misplaced is None:
            raise
        raise ValueError(misplaced) from None
    pages, strides = {}, {}
    for i, (field, t, page_bytes) in enumerate(zip(Cache._fields, cache, (geo[name] for name in _PAGE_BYTES_NAMES))):
        _check_tensor(f"cache.{field}", t, None, None, device, written=True)
        strided = not t.is_contiguous()
        if strided and not _pages_contiguous(t):   # (a view of some heads or values of each page, or transposed)
            raise ValueError(f"cache.{field}: shape {tuple(t.shape)} with strides {tuple(t.stride())} is not a tensor "
                             "of whole contiguous pages; pass a contiguous tensor, or a view whose first dim steps "
                             "over whole pages (such as vLLM's kv_cache[:, 0])")
        nbytes = t.numel() * t.element_size()
        # The first dim counts pages, so a cache read or written with another page size than it
        # was allocated for is caught even when its bytes happen to divide; a RawCache's tensor may
        # instead be flat or count slots first (contiguous only).
        whole = nbytes > 0 and nbytes % page_bytes == 0
        page_major = whole and t.dim() >= 2 and t.shape[0] * page_bytes == nbytes
        token_major_or_flat = whole and raw and (t.dim() == 1 or t.shape[0] * page_bytes == nbytes * page_size)
        if page_major or token_major_or_flat and not strided:
            pages[field] = nbytes // page_bytes
            if strided:
                strides[_PAGE_STRIDE_NAMES[i]] = _page_stride(field, t, page_bytes, _FIELD_ALIGN[i])
            continue
        if token_major_or_flat:         # (a strided flat tensor is no tensor of whole pages: refused above)
            raise ValueError(f"cache.{field}: a token-major tensor (shape {tuple(t.shape)}, strides {tuple(t.stride())}) "
                             "must be contiguous; only a page-major view (pages in its first dim) may step over bytes "
                             "between its pages")
        raise ValueError(_cache_tensor_error(field, t, nbytes, page_bytes, page_size, heads, values, raw, from_records))
    if strides:                          # the kernels step through a strided field's pages by its stride
        geo = {**geo, **strides}
    counts = list(pages.values())
    num_pages = max(counts, key=counts.count)        # the count most tensors share
    odd = [field for field, n in pages.items() if n != num_pages]
    if len(odd) == 1 and counts.count(num_pages) > 1:  # one tensor the others disagree with: named
        raise ValueError(f"cache.{odd[0]}: holds {pages[odd[0]]} pages, the other tensors {num_pages}")
    if odd:
        raise ValueError(", ".join(f"cache.{field}" for field in pages) + ": hold different numbers of pages (" +
                         ", ".join(map(str, pages.values())) + "); pass the tensors of one cache")
    allocated = cache_shapes(num_pages, page_size, heads=heads, values=values)
    for i, (field, t) in enumerate(zip(Cache._fields, cache)):
        _check_field_form(i, field, t, *allocated[field], page_size, heads, values, raw)
    return geo, num_pages


def _check_field_form(i: int, field: str, t, shape: tuple, dtype, page_size: int, heads: int, values: int,
                      raw: bool = False) -> None:
    """Cache tensor t of field i (holding whole pages) against alloc_cache's shape and dtype for it:
    - a float dtype only as alloc_cache's: another float format's values are not the stored ones
      (an integer view of the bytes is taken as bytes);
    - page-major in alloc_cache's rank (or token-major, its first two dims merged), only its shape
      where its elements are as wide, or where its last two dims give heads and values: another
      shape is a tensor of other heads, values or scale order (another plane's, transposed scales);
    - in more dims than alloc_cache's (but a RawCache's), only a view that splits them: more dims that
      cut the bytes elsewhere are another layout's order (see _nested); fewer are taken as bytes (a
      caller's (num_pages, bytes), or its own 2-D view of swizzled scales);
    - its start aligned for the widest value the kernels load or store in it."""
    if dtype.is_floating_point and t.dtype.is_floating_point and t.dtype != dtype:
        raise ValueError(f"cache.{field}: dtype {t.dtype}, but this layout reads and writes {dtype} there "
                         f"(alloc_cache's dtype); a cache of {t.dtype} values needs a layout of that format (a "
                         f"tensor whose bytes are {dtype} codes may be passed as {dtype} or as uint8)")
    dims_from_tensors = i in _RECORD_FIELDS and None in (HEADS, VALUES)    # its last two dims count heads and values
    # page-major in alloc_cache's rank, or with its first two dims merged (token-major records)
    merged = t.dim() == len(shape) - 1 >= 2 and t.shape[0] == shape[0] * shape[1]
    if ((t.dim() == len(shape) and t.shape[0] == shape[0] and tuple(t.shape) != tuple(shape)
            or merged and tuple(t.shape[1:]) != tuple(shape[2:]))
            and (t.element_size() == dtype.itemsize or dims_from_tensors)):
        raise ValueError(f"cache.{field}: shape {tuple(t.shape)} {t.dtype}, but alloc_cache gives {tuple(shape)} "
                         f"{dtype} for page_size={page_size}, heads={heads}, values={values}; pass this cache's "
                         "own tensor, shaped as alloc_cache gives it (one of other heads, values or order lays "
                         "its bytes out otherwise)")
    if not raw and t.dim() > len(shape) and not _nested(tuple(t.shape), tuple(shape)):
        raise ValueError(f"cache.{field}: shape {tuple(t.shape)} {t.dtype} cuts its bytes where alloc_cache's "
                         f"{tuple(shape)} {dtype} (page_size={page_size}, heads={heads}, values={values}) does not: "
                         "a tensor of another layout or order; pass this cache's own tensor, or a view that only "
                         "merges or splits its dims, such as (num_pages, bytes)")
    align = _FIELD_ALIGN[i]
    if t.data_ptr() % align:
        raise ValueError(f"cache.{field}: starts at byte address {t.data_ptr():#x}, not a multiple of {align}: the "
                         f"kernels load and store {align}-byte values in it; pass a tensor that starts on a "
                         f"{align}-byte boundary")


def _nested(a: tuple, b: tuple) -> bool:
    """Whether two shapes of the same bytes cut them compatibly: the row counts of one's outer dims
    (prod(shape[:k]), the last dim aside: its elements may be of another size) are all among the
    other's, so one shape only merges or splits the other's dims."""
    def cuts(shape: tuple) -> set:
        rows, found = 1, set()
        for n in shape[:-1]:
            rows *= n
            found.add(rows)
        return found
    return cuts(a) <= cuts(b) or cuts(b) <= cuts(a)


def _cache_tensor_error(field: str, t, nbytes: int, page_bytes: int, page_size: int, heads: int, values: int,
                       raw: bool, from_records: bool) -> str:
    """Why cache tensor `field` does not hold whole pages of page_size, naming the argument at fault:
    page_size where the tensor is shaped for another one; the cache where it is another field's tensor;
    the records tensor where its dims gave heads and values (from_records) and it is the one at fault."""
    allocated = _allocated_page_size(field, t, nbytes, heads, values) if nbytes and t.dim() >= 2 else None
    if allocated is not None:
        return (f"page_size: cache.{field} was allocated for page_size={allocated} (shape {tuple(t.shape)}: "
                f"{t.shape[0]} pages of {nbytes // t.shape[0]} bytes), but page_size={page_size} was passed; pass the "
                "page_size it was allocated with")
    other = _misplaced_error(field, t, heads, values)
    if other is not None:
        return other
    # (a RawCache's records tensor may be token-major: its pages are then told by their bytes, below)
    whole_pages = nbytes >= page_bytes and not nbytes % page_bytes
    if from_records and field == _RECORDS_NAME and (not (raw or whole_pages) or
                                                    _records_dtype_error(t, heads, values)):
        return _records_error(t, nbytes, page_bytes, page_size, heads, values)
    if 0 < nbytes < page_bytes:
        return f"page_size: a page of page_size={page_size} takes {page_bytes} bytes of cache.{field}, which holds {nbytes}"
    if nbytes == 0 or nbytes % page_bytes:
        return (f"cache.{field}: {nbytes} bytes is not a whole number of {page_bytes}-byte pages "
                f"(page_size={page_size}); allocate it with alloc_cache/cache_shapes")
    forms = "(num_pages, ...), (num_pages * page_size, ...) or flat" if raw else "(num_pages, ...)"
    return (f"cache.{field}: shape {tuple(t.shape)} is not {forms} of {page_bytes}-byte pages for "
            f"page_size={page_size}; pass the page_size it was allocated with, or a tensor shaped as "
            "alloc_cache/cache_shapes give it")


def _records_error(t, nbytes: int, page_bytes: int, page_size: int, heads: int, values: int) -> str:
    """The error for a records tensor that gave heads and values itself (its trailing dims) and then
    holds no whole number of their pages, or counts them in elements of another size: its shape or
    dtype is taken to be the fault, not page_size."""
    whole = f"{nbytes // page_bytes} page(s) and {nbytes % page_bytes} bytes" if nbytes > page_bytes else f"{nbytes} bytes"
    return _records_dtype_error(t, heads, values) or (
        f"{_RECORDS_FIELD}: shape {tuple(t.shape)} {t.dtype} gives {heads} head(s) of {values} values, whose pages "
        f"of page_size={page_size} take {page_bytes} bytes, but it holds {whole}; pass it shaped as alloc_cache "
        "gives it, (num_pages, ..., heads, values)")


def _records_dtype_error(t, heads: int, values: int) -> str | None:
    """An error for a records tensor whose trailing dims gave heads and values counted in elements of
    another size than alloc_cache's dtype for it (so they count other bytes, whether or not a
    geometry of theirs is valid); None otherwise."""
    dtype = _RECORDS_DTYPE
    if dtype.itemsize == t.element_size() or None not in (HEADS, VALUES):    # (else its dims gave nothing)
        return None
    return (f"{_RECORDS_FIELD}: shape {tuple(t.shape)} {t.dtype} gives {heads} head(s) of {values} values, counted in "
            f"{t.element_size()}-byte elements, but alloc_cache gives it as {dtype}; pass it as alloc_cache gives "
            f"it (a {dtype.itemsize}-byte dtype: e.g. .view({dtype}) of its bytes)")


def _misplaced_error(field: str, t, heads: int, values: int) -> str | None:
    """An error for cache tensor `field` where t has the shape and dtype alloc_cache gives another field
    (at some page size): the cache's tensors were passed out of field order. None otherwise."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.numel():
        return None
    nbytes = t.numel() * t.element_size()
    own = _allocated_page_size(field, t, nbytes, heads, values)
    if own is not None and cache_shapes(1, own, heads=heads, values=values)[field][1] == t.dtype:
        return None   # shaped as alloc_cache gives its own field too (K's and V's tensors look alike)
    others = {}       # other field: the page size t has its alloc_cache shape at
    for other in Cache._fields:
        page_size = None if other == field else _allocated_page_size(other, t, nbytes, heads, values)
        if page_size is not None and cache_shapes(1, page_size, heads=heads, values=values)[other][1] == t.dtype:
            others[other] = page_size
    if not others:
        return None
    return (f"cache.{field}: shape {tuple(t.shape)} {t.dtype} is what alloc_cache gives "
            + " or ".join(f"cache.{other} (page_size={page_size})" for other, page_size in others.items())
            + f"; pass each tensor in its own place ({', '.join('cache.' + f for f in Cache._fields)})")


def _misplaced_records_error(cache) -> str | None:
    """Where the records tensor gave heads and values that the layout does not take: an error naming it
    as another field's tensor (a scales tensor passed twice), at the heads and values another
    tensor of the cache gives in the records' place (the other plane's records); None where none does."""
    records = cache[_RECORDS_INDEX]
    for i, other in enumerate(cache):
        if i == _RECORDS_INDEX or other is records:
            continue
        try:
            heads, values = _cache_dims(tuple(other if j == _RECORDS_INDEX else t for j, t in enumerate(cache)))
            _checked_geometry(PAGE_SIZE_MULTIPLE, heads, values)
        except ValueError:
            continue
        error = _misplaced_error(_RECORDS_NAME, records, heads, values)
        if error is not None:
            return error
    return None


def _allocated_page_size(field: str, t, nbytes: int, heads: int, values: int) -> int | None:
    """The page size cache field `field` was allocated for, if t has the
    shape alloc_cache gives it at some page size: the caller's page_size is then the argument at
    fault. A field's page bytes grow with the page size (the build refuses padding that would hide
    one), so a bisection over the multiples finds the one whose pages t.shape[0] splits t into;
    None where none does (a tensor shaped otherwise, e.g. a token-major view, is the fault)."""
    if nbytes % t.shape[0]:
        return None
    want, name = nbytes // t.shape[0], _PAGE_BYTES_NAMES[Cache._fields.index(field)]
    lo, hi = 1, max(1, want)          # page bytes grow by a byte or more a step
    try:
        while lo <= hi:
            mid = (lo + hi) // 2
            got = _geometry.__wrapped__(mid * PAGE_SIZE_MULTIPLE, heads, values)[name]
            if got == want:
                page_size = mid * PAGE_SIZE_MULTIPLE
                shape = cache_shapes(t.shape[0], page_size, heads=heads, values=values)[field][0]
                return page_size if tuple(shape) == tuple(t.shape) else None
            lo, hi = (mid + 1, hi) if got < want else (lo, mid - 1)
    except ValueError:
        return None
    return None


# Tensor dtypes every supported Triton takes as typed pointers. The kernels address cache bytes
# themselves, so a cache tensor of any other dtype (e8m0 scales, packed fp4, bits8) goes to them
# as a uint8 view of its bytes.
_POINTER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                             torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2})


def _kernel_cache(cache: tuple) -> tuple:
    """The checked cache tensors as the kernels take them: uint8 views of the ones whose dtype
    Triton does not take."""
    return tuple(t if t.dtype in _POINTER_DTYPES else t.view(torch.uint8) for t in cache)


def _check_given_scales(scales: tuple, device, heads: int) -> None:
    """The call-time scales (_GIVEN_SCALES): each a float32 tensor on the op's device (read by the
    kernel itself, so calls stay CUDA-graph capturable) of one element (the plane's scale) or, as
    vLLM's per-head scales, `heads` contiguous ones."""
    for name, t in zip(_GIVEN_SCALES, scales, strict=True):
        _check_tensor(name, t, (torch.float32,), None, device)
        if t.numel() not in (1, heads):
            raise ValueError(f"{name}: expected one element (the plane's scale) or {heads} (one per head), got shape "
                             f"{tuple(t.shape)}")
        if t.numel() > 1 and not t.is_contiguous():
            raise ValueError(f"{name}: one scale per head must be contiguous, got strides {tuple(t.stride())}")


def _given_steps(scales: tuple) -> dict:
    """Each call-time scale's constexpr <NAME>_STEP, the step from one head's scale to the next: 1
    for one scale per head, 0 for one for the plane."""
    return {f"{name.upper()}_STEP": int(t.numel() > 1) for name, t in zip(_GIVEN_SCALES, scales)}


def _prepare_store(srcs: tuple, loc, cache, page_size: int, scales: tuple = ()) -> tuple:
    """Checks for the writers: one (T, heads, values) source per plane (and the call-time scales);
    returns (3-D sources, geometry, pages)."""
    first = srcs[0]
    device = first.device if isinstance(first, torch.Tensor) else None
    views = []
    for plane, src in zip(PLANES, srcs):
        src = _check_rows(plane, src, device)
        _check_tensor(plane, src, SOURCE_DTYPES)
        if views and src.shape != views[0].shape:
            odd, other = _odd_source((PLANES[0], views[0].shape), (plane, src.shape), loc, cache)
            raise ValueError(f"{odd[0]}: shape {tuple(odd[1])} differs from {other[0]}'s {tuple(other[1])}")
        views.append(src)
    n_tokens, heads, values = views[0].shape
    cache_heads, cache_values = _cache_dims(cache)
    _check_fields_apart(cache)       # (before the dims a misplaced tensor gave are compared)
    if (heads, values) != (cache_heads, cache_values):
        records = cache[_RECORDS_INDEX]
        raise ValueError(_swap_error(cache, page_size, (heads, values), device) or
                         _misplaced_error(_RECORDS_NAME, records, heads, values) or
                         _records_dtype_error(records, cache_heads, cache_values) or
                         f"{PLANES[0]}: shape {tuple(views[0].shape)} has {heads} head(s) of {values} values, but "
                         f"{_RECORDS_FIELD}'s shape {tuple(records.shape)} gives {cache_heads} of {cache_values}")
    _check_index("loc", loc, device, n_tokens)
    geo, num_pages = _check_cache(cache, page_size, heads, values, device, (PLANES[0], views[0].shape))
    _check_given_scales(scales, device, heads)
    tensors = (loc, *views, *cache, *scales)
    _check_apart(_STORE_NAMES, tensors, _STORE_WRITTEN)
    return tuple(views), geo, num_pages


def _odd_source(first: tuple, later: tuple, loc, cache, dims: int = 3) -> tuple:
    """(odd, other) of two sources of different shapes, each (name, shape), compared on their first
    `dims` dims: the first source is the odd one where it, and not the later one, disagrees with the
    call's (tokens, heads, values) as loc and the cache give them; else the later one (also where
    they cannot be read)."""
    try:
        want = (loc.shape[0], *_cache_dims(cache))[:dims]
    except (AttributeError, IndexError, TypeError, ValueError):
        return later, first
    agree = [tuple(shape[:dims]) == want for _, shape in (first, later)]
    return (first, later) if agree == [False, True] else (later, first)


def _prepare_store_inputs(parts: tuple, loc, cache, page_size: int, scales: tuple = ()) -> tuple:
    """Checks for a writer that reads each plane's rows in parts (INPUTS: parameter, plane, first
    value, values): each part (T, heads, its values), all of one T, heads and dtype (and the
    call-time scales); returns (3-D parts, geometry, pages)."""
    first = parts[0]
    device = first.device if isinstance(first, torch.Tensor) else None
    views, row_head = [], {}        # row_head: each plane's first part (name, tensor)
    for (name, plane, _, width), part in zip(INPUTS, parts, strict=True):
        part = _check_rows(name, part, device, width)
        _check_tensor(name, part, SOURCE_DTYPES)
        if views and part.shape[:2] != views[0].shape[:2]:
            odd, other = _odd_source((INPUTS[0][0], views[0].shape), (name, part.shape), loc, cache, dims=2)
            raise ValueError(f"{odd[0]}: shape {tuple(odd[1])} has other tokens or heads than {other[0]}'s "
                             f"{tuple(other[1])}")
        head, head_part = row_head.setdefault(plane, (name, part))
        if part.dtype != head_part.dtype:
            # a row's parts are one dtype, as a whole row is (a raw segment copies its bits)
            raise ValueError(f"{name}: dtype {part.dtype}, {head}'s is {head_part.dtype}; pass the parts of "
                             f"plane {plane}'s rows in one dtype")
        views.append(part)
    n_tokens, heads, _ = views[0].shape
    cache_heads, values = _cache_dims(cache)
    _check_fields_apart(cache)       # (before the dims a misplaced tensor gave are compared)
    if heads != cache_heads:
        records = cache[_RECORDS_INDEX]
        raise ValueError(_swap_error(cache, page_size, (heads, values), device) or
                         _misplaced_error(_RECORDS_NAME, records, heads, values) or
                         _records_dtype_error(records, cache_heads, values) or
                         f"{INPUTS[0][0]}: shape {tuple(views[0].shape)} has {heads} head(s), but {_RECORDS_FIELD}'s "
                         f"shape {tuple(records.shape)} gives {cache_heads}")
    _check_index("loc", loc, device, n_tokens)
    geo, num_pages = _check_cache(cache, page_size, heads, values, device, (INPUTS[0][0], views[0].shape))
    _check_given_scales(scales, device, heads)
    tensors = (loc, *views, *cache, *scales)
    _check_apart(_STORE_NAMES, tensors, _STORE_WRITTEN)
    return tuple(views), geo, num_pages


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device `index`."""
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=256)
def _launch_shape(op: str, values: int, cap: int = 64) -> dict:
    """Tokens per program (at most `cap`, see _rows_cap, unless the op's block_tokens says), tile-loop
    chunks (a power of two of each quantized segment's scale tiles, within `elements` per program)
    and warps of one op for one value count."""
    knobs = LAUNCH[op]
    elements = knobs["elements"]
    rows = knobs["block_tokens"] or _prev_pow2(max(1, min(64, cap, elements // values)))
    chunks = {name: _prev_pow2(min(_next_pow2(tiles), max(1, elements // (rows * tile))))
              for name, tiles, tile in _segment_tiles(values)}
    return dict(BLOCK_T=rows, num_warps=knobs["num_warps"], **chunks)


def _rows_cap(rows: int, lanes: int, device: torch.device) -> int:
    """The most rows per program (a power of two) with which a call of `rows` rows, `lanes` programs
    per group of rows (planes x heads), still gives every SM of a CUDA device a program: a decode-size
    call spreads over the whole GPU instead of queueing on a few SMs. No cap elsewhere (the interpreter)."""
    if device.type != "cuda":
        return 64
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return _prev_pow2(max(1, rows * lanes // sms))


def _lane_group(lanes: int, most: int) -> int:
    """The largest divisor of `lanes` (planes x heads) that is at most `most`: the lanes of a gather
    whose programs run side by side (see _gather_dequant_kernel)."""
    return max(d for d in range(1, min(lanes, most) + 1) if lanes % d == 0)


@functools.lru_cache(maxsize=16)
def _compute_capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


# Set to False to launch every kernel plainly (a driver or graph runtime without programmatic
# dependent launch); the bytes written are the same either way.
DEPENDENT_LAUNCH = True


def _dependent_launch(device: torch.device) -> bool:
    """Whether kernels can launch as programmatic dependents of the stream's previous kernel (sm_90
    and later; compiled kernels only, never under Triton's interpreter). Such a kernel's programs may
    be scheduled while the previous kernel still runs; each waits for its end (and its writes) before
    its first memory access (_wait_for_previous), so the bytes are those of a plain launch."""
    return (DEPENDENT_LAUNCH and isinstance(_wait_for_previous, triton.runtime.JITFunction) and device.type == "cuda"
            and _compute_capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9)


def _check_pdl(pdl) -> None:
    """`pdl` is True, False or None (the op's dependent_launch knob): a string such as "false" would
    be truthy."""
    if pdl is not None and type(pdl) is not bool:
        raise ValueError(f"pdl: expected True, False or None (the op's dependent_launch setting), got {pdl!r} "
                         f"({type(pdl).__name__})")


def _chain(op: str, device: torch.device, pdl: bool | None) -> dict:
    """An op's launch arguments for its place in the stream. PDL: launched as a programmatic dependent
    of the previous kernel (see _dependent_launch), as `pdl` says, else as the op's dependent_launch
    knob does. EARLY_RELEASE (the op's early_release knob, with PDL): it lets the stream's next kernel
    launch at its own start. Both pay off in a stream of such kernels (the next one's launch overlaps
    this one); next to plain launches the H200 took about 0.5 us more per call (bench/RESULTS.md)."""
    knobs = LAUNCH[op]         # (pdl: checked first by each op, _check_pdl)
    on = _dependent_launch(device) and (knobs["dependent_launch"] if pdl is None else pdl)
    return dict(PDL=on, EARLY_RELEASE=on and knobs["early_release"], **({"launch_pdl": True} if on else {}))


def _scale_word_bytes(cache, geo: dict, page_size: int) -> int:
    """Scale bytes per value index and page when they are adjacent (block fastest) and fit an aligned
    2-, 4- or 8-byte word, so a reader loads one word per value index instead of one byte; else 0
    (token-group scales, _WORD_SCALES)."""
    tokens, block, dim, fields, aligned = _WORD_SCALES
    blocks = page_size // tokens
    if blocks not in (2, 4, 8) or geo[block] != 1 or geo[dim] != blocks:
        return 0
    # Every word must be aligned to its size: the buffers, their pages, the region and its other strides.
    starts = [cache[i].data_ptr() for i in fields] + [geo[name] for name in aligned]
    return blocks if all(n % blocks == 0 for n in starts) else 0
