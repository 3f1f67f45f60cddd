"""Host runtime shared by every generated module: cheap repeated launches and argument rules.

Everything below the COPY marker is copied verbatim into each generated module (which must stay
one standalone file importing only torch and triton), so it is ordinary, lintable Python here and
reviewed once. It uses only the names imported above the marker.

Launch plans. An op's first call with a given argument *signature* (every tensor's shape,
strides, dtype, device and pointer alignment, and the scalar arguments) validates everything and
launches through Triton's JIT as usual; its launches are recorded as a plan: the compiled kernel,
grid and arguments of each, with the call's tensors left as slots. A later call with the same
signature skips the checks that depend only on the signature (they passed), checks what depends
on the pointers (no written buffer overlaps another argument) and replays the plan with its own
tensors, calling the compiled kernel's launcher directly as Triton's JIT does after its binding.
The signature includes every fact Triton specializes a launch on (dtypes, 16-byte alignment of
pointers, integers equal to 1 or divisible by 16, their width), so a plan's kernel is the one
Triton itself would pick. Plans exist only for compiled kernels on CUDA devices: under the
interpreter every call takes the checked path.
"""
from __future__ import annotations

import inspect
import operator

import torch
import triton

# --- COPY: everything below is copied into each generated module ------------------------------


def _index(value, name: str, least: int = 1) -> int:
    """An integer argument (a Python or numpy integer, not a bool or float) of at least `least`."""
    if isinstance(value, (bool, torch.Tensor)) or not hasattr(type(value), "__index__"):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int, got {value!r}") from None
    if value < least:
        raise ValueError(f"{name}: expected an int >= {least}, got {value}")
    return value


def _signature(tensors: tuple, scalars: tuple):
    """(key, pointers) of a call: the key of its launch plan holds every tensor's shape, strides,
    dtype, device and pointer alignment (low 4 bits), the scalar arguments (with their types, so 64.0
    is not 64) and the current CUDA device. (None, None) when an argument is not a tensor (the
    checked path then names it; tensors may be None for that)."""
    try:
        pointers = [t.data_ptr() for t in tensors]
        parts = [(t.shape, t.stride(), t.dtype, t.get_device(), p & 15) for t, p in zip(tensors, pointers)]
        parts.append(scalars)
        parts.append(tuple(map(type, scalars)))
        parts.append(torch._C._cuda_getDevice() if torch.cuda.is_initialized() else -1)
        key = tuple(parts)
        hash(key)                    # an unhashable scalar (a list for page_size) takes the checked path
    except (AttributeError, TypeError, RuntimeError):
        return None, None
    return key, pointers


def _extent(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to one past its last (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _nested_dims(t: torch.Tensor) -> list | None:
    """(size, byte stride) of t's dims of more than one element, largest stride first, when each
    stride exceeds the bytes all smaller-stride dims span (so no two elements share a byte); None
    when some do (a stride of 0, or an overlapping view)."""
    dims = sorted(((n, s * t.element_size()) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda d: -d[1])
    inner = t.element_size()
    for n, s in reversed(dims):
        if s < inner:
            return None
        inner = s * (n - 1) + inner
    return dims


def _check_distinct_elements(name: str, t: torch.Tensor) -> None:
    """ValueError when a tensor to be written has elements sharing memory (e.g. an expand()ed view)."""
    if t.numel() > 1 and _nested_dims(t) is None:
        raise ValueError(f"{name}: elements overlap in memory (strides {tuple(t.stride())}); pass a tensor whose "
                         "elements each have their own bytes")


def _strided_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one shape, strides and element size share a byte, from the offset
    between them alone (interleaved slices of one workspace do not): the offset must be a sum of
    per-dim steps of fewer than that dim's size, plus less than an element."""
    dims = _nested_dims(a)
    if dims is None or a.shape != b.shape or a.stride() != b.stride() or a.element_size() != b.element_size():
        return True                  # not decided here: taken as overlapping

    def reach(rest: int, k: int) -> bool:
        if k == len(dims):
            return abs(rest) < a.element_size()
        n, s = dims[k]
        q = rest // s
        return any(abs(j) < n and reach(rest - j * s, k + 1) for j in (q, q + 1))
    return reach(b.data_ptr() - a.data_ptr(), 0)


def _check_disjoint(names: tuple, pointers, written: tuple, extents: tuple, tensors: tuple = ()) -> None:
    """ValueError when a written tensor's bytes overlap another argument's (aliasing would race).
    pointers: each tensor's data_ptr(); extents: the bytes each spans (see _extent); tensors (where
    given) let two strided views whose spans cross, but whose elements interleave, pass."""
    spans = sorted(zip(pointers, extents))
    end = 0
    for start, n in spans:           # the usual case, every tensor apart: one pass over the sorted spans
        if n and start < end:
            break
        end = max(end, start + n)
    else:
        return
    spans = [(p, p + n) for p, n in zip(pointers, extents)]
    for w in written:
        lo, hi = spans[w]
        if hi == lo:
            continue
        for i, (a, b) in enumerate(spans):
            if i != w and a < hi and lo < b and (not tensors or _strided_overlap(tensors[w], tensors[i])):
                raise ValueError(f"{names[w]}: overlaps {names[i]} in memory; a written buffer must not alias "
                                 "any other argument")


def _check_apart(names: tuple, tensors: tuple, written: tuple) -> None:
    """_check_disjoint for a call's tensors themselves (the checked path)."""
    _check_disjoint(names, [t.data_ptr() for t in tensors], written, tuple(_extent(t) for t in tensors), tensors)


class _Plan:
    """One call signature's launches: (compiled kernel, grid, arguments, slots) each, the slots
    naming which argument positions take which of the call's tensors."""

    __slots__ = ("launches", "extents", "recordable", "outputs", "disjoint")
    # Triton's launch hooks (profilers add theirs); with none added a launch passes None for them.
    hooks = triton.knobs.runtime

    def __init__(self, extents: tuple):
        self.launches = []
        self.extents = extents        # bytes each of the call's tensors spans (for the aliasing check)
        self.recordable = True
        self.outputs = ()             # (shape, dtype) of each output the op allocates itself
        self.disjoint = None          # the last pointers found free of aliasing (the verdict is theirs alone)

    def check_disjoint(self, names: tuple, pointers: list, written: tuple, tensors: tuple) -> None:
        """_check_disjoint for a replay: skipped when the pointers are the ones last found apart (the
        signature fixes every shape and stride, so the same pointers give the same verdict)."""
        if pointers != self.disjoint:
            _check_disjoint(names, pointers, written, self.extents, tensors)
            self.disjoint = pointers

    def record(self, compiled, grid: tuple, kernel, args: tuple, constexprs: dict, tensors: tuple) -> None:
        """Add a launch: its arguments in the kernel's parameter order, the call's tensors replaced
        by slots (matched in order by identity, or by pointer and dtype for views of them)."""
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            self.recordable = False
            return
        values, slots, used = [], [], set()
        for position, name in enumerate(kernel.arg_names):
            value = args[position] if position < len(args) else constexprs.get(name, _MISSING)
            if value is _MISSING:
                self.recordable = False
                return
            if isinstance(value, torch.Tensor):
                match = _match(value, tensors, used)
                if match is None:
                    self.recordable = False
                    return
                used.add(match)
                slots.append((position, match))
                value = None                  # the plan keeps no tensor alive
            values.append(value)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self.launches.append((compiled, _direct_launcher(compiled), grid, values, tuple(slots)))

    def run(self, tensors: tuple) -> None:
        """Launch every recorded kernel with this call's tensors, on the current stream, as Triton's
        JIT launches a compiled kernel (the launch hooks only when some are set). The launcher takes
        each tensor as its data_ptr(): given an object it would call data_ptr() itself and ask the
        driver whether the address is device memory (cuPointerGetAttribute, per tensor, per call),
        which the plan's signature already settled (every tensor on this CUDA device). Hooks get
        the tensors themselves."""
        stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
        enter, leave = self.hooks.launch_enter_hook, self.hooks.launch_exit_hook
        hooked = getattr(enter, "calls", enter) or getattr(leave, "calls", leave)
        for compiled, direct, grid, values, slots in self.launches:
            args = values.copy()
            for position, index in slots:
                args[position] = tensors[index] if hooked else tensors[index].data_ptr()
            if hooked:
                compiled.run(*grid, stream, compiled.function, compiled.packed_metadata,
                             compiled.launch_metadata(grid, stream, *args), enter, leave, *args)
            elif direct is not None:
                direct(*grid, stream, compiled.function, *args)
            else:
                compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)


_MISSING = object()


def _direct_launcher(compiled):
    """The C launch function of a compiled kernel, bound to its fixed leading arguments, where the
    launcher is Triton 3.6's CudaLauncher (whose __call__ only adds scratch buffers, none here, in
    front of `launch`); None elsewhere (then replays call the launcher as Triton's JIT does)."""
    launcher = compiled.run
    try:
        params = list(inspect.signature(type(launcher).__call__).parameters)
    except (TypeError, ValueError):
        return None
    if (params != ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"] or not hasattr(launcher, "launch")
            or launcher.global_scratch_size or launcher.profile_scratch_size):
        return None
    launch, packed = launcher.launch, compiled.packed_metadata
    coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl

    def direct(grid_x, grid_y, grid_z, stream, function, *args):
        launch(grid_x, grid_y, grid_z, stream, function, coop, pdl, None, None, packed, None, None, None, *args)
    return direct


def _match(value: torch.Tensor, tensors: tuple, used: set):
    """The index of the call tensor a kernel argument is: the tensor itself, else a view of it (the
    same first byte; same dtype preferred), the first not yet used; None if none is, or if distinct
    call tensors share that first byte (which one a view is of cannot be told: no plan then)."""
    free = [i for i in range(len(tensors)) if i not in used]
    sharing = {id(tensors[i]) for i in free if tensors[i].data_ptr() == value.data_ptr()}
    if len(sharing) > 1 and not any(tensors[i] is value for i in free):
        return None
    for same in (lambda t: t is value, lambda t: t.data_ptr() == value.data_ptr() and t.dtype == value.dtype,
                 lambda t: t.data_ptr() == value.data_ptr()):
        match = next((i for i in free if same(tensors[i])), None)
        if match is not None:
            return match
    return None


def _launch(kernel, grid: tuple, args: tuple, constexprs: dict, plan, tensors: tuple) -> None:
    """Launch a @triton.jit kernel through Triton's JIT (which compiles it once per specialization)
    and, for a plan being recorded, add the launch to it."""
    compiled = kernel[grid](*args, **constexprs)
    if plan is not None:
        plan.record(compiled, grid, kernel, args, constexprs, tensors)


def _plan_for(kernel, tensors: tuple, device) -> _Plan | None:
    """A plan to record for a call of compiled kernels on a CUDA device (None elsewhere)."""
    if device.type != "cuda" or not isinstance(kernel, triton.runtime.JITFunction):
        return None
    return _Plan(tuple(_extent(t) for t in tensors))


def _remember(plans: dict, key, plan) -> None:
    """Keep a recorded plan under its call signature (at most _MAX_PLANS per op: a new one past
    that starts the op's plans afresh, so a stream of ever-new shapes cannot grow them)."""
    if key is None or plan is None or not plan.recordable:
        return
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[key] = plan


_MAX_PLANS = 256
