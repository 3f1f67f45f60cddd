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
tensors' addresses, calling the compiled kernel's launcher directly as Triton's JIT does after its
binding. The signature includes every fact Triton specializes a launch on (dtypes, 16-byte
alignment of pointers, integers equal to 1 or divisible by 16, their width), so a plan's kernel is
the one Triton itself would pick. The op's last plan is tried first by a guard (torch's C++ check
of the tensors' metadata, which torch.compile's guards use): a call that passes it, with the plan's
scalars and every pointer 16-byte aligned, has the plan's signature without computing it. Plans
exist only for compiled kernels on CUDA devices: under the interpreter every call takes the
checked path.
"""
from __future__ import annotations

import functools
import inspect
import operator

import torch
import triton

# Names each generated module defines before this code (stand-ins; see the module for their meaning).
_CACHE_NAMES: tuple = ()
_FIELDS_APART = "stand-in"

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
    dtype, device, pointer alignment (low 4 bits) and autograd and lazy-view state (requires_grad,
    negated or conjugated: what the guard's check also holds), the scalar arguments (with their
    types, so 64.0 is not 64) and the current CUDA device, in that order: a part per tensor, then
    the scalars, their types and the device (_guard and _remember read them so). (None, None) when
    an argument is not a tensor (the checked path then names it; tensors may be None for that)."""
    try:
        pointers = [t.data_ptr() for t in tensors]
        parts = [(t.shape, t.stride(), t.dtype, t.get_device(), p & 15, t.requires_grad, t.is_neg() or t.is_conj())
                 for t, p in zip(tensors, pointers)]
        parts.append(scalars)
        parts.append(tuple(map(type, scalars)))
        parts.append(_current_device())
        key = tuple(parts)
        hash(key)                    # an unhashable scalar (a list for page_size) takes the checked path
    except (AttributeError, TypeError, RuntimeError):
        return None, None
    return key, pointers


def _current_device() -> int:
    """The current CUDA device's index (-1 before CUDA is initialized: no plan's launches ran there)."""
    return torch._C._cuda_getDevice() if torch.cuda.is_initialized() else -1


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
    """Whether two tensors share a byte, for views whose spans cross but whose elements may
    interleave (slices of one workspace, vLLM's kv_cache[:, 0] and [:, 1]). Tensors of one shape,
    strides and element size: exactly, from the offset between them alone (it must be a sum of
    per-dim steps of fewer than that dim's size, plus less than an element); others by their first
    dims' entries (pages, _pages_overlap)."""
    dims = _nested_dims(a)
    if dims is None or a.shape != b.shape or a.stride() != b.stride() or a.element_size() != b.element_size():
        return _pages_overlap(a, b)

    def reach(rest: int, k: int) -> bool:
        if k == len(dims):
            return abs(rest) < a.element_size()
        n, s = dims[k]
        q = rest // s
        return any(abs(j) < n and reach(rest - j * s, k + 1) for j in (q, q + 1))
    return reach(b.data_ptr() - a.data_ptr(), 0)


def _pages_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share a byte, each taken as its first dim's entries (pages), each entry the
    whole span of its bytes, one step apart: a's page i and b's page j meet when -(b's page span) <
    offset + (j - i) * step < a's page span. Where both have several pages but their steps differ,
    the smaller tensor counts as one span (exact for a contiguous one, such as a source row block
    beside a cache's pages). True (not decided here) for a tensor whose own elements overlap."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if _nested_dims(a) is None or _nested_dims(b) is None:
        return True
    (count_a, step_a, span_a), (count_b, step_b, span_b) = _page_runs(a), _page_runs(b)
    if count_a > 1 and count_b > 1 and step_a != step_b:
        if _extent(a) <= _extent(b):
            count_a, span_a = 1, _extent(a)
        else:
            count_b, span_b = 1, _extent(b)
    step = step_a if count_a > 1 else step_b
    offset = b.data_ptr() - a.data_ptr()
    lowest = max(1 - count_a, (-span_b - offset) // step + 1)     # the least j - i at which pages meet
    highest = min(count_b - 1, (span_a - offset - 1) // step)     # the most
    return lowest <= highest


def _page_runs(t: torch.Tensor) -> tuple:
    """(entries, byte step, bytes each spans) of t's first dim; one entry of t's whole span for a 0-dim
    tensor or a first dim of one entry (its step, never taken, 1)."""
    if t.dim() == 0 or t.shape[0] == 1:
        return 1, 1, _extent(t)
    return t.shape[0], t.stride(0) * t.element_size(), _extent(t[0])


def _check_disjoint(names: tuple, pointers, written: tuple, extents: tuple, tensors: tuple = (),
                    why: str = "a written buffer must not alias any other argument", apart: range = range(0)) -> None:
    """ValueError when a written tensor's bytes overlap another argument's (aliasing would race).
    pointers: each tensor's data_ptr(); extents: the bytes each spans (see _extent); tensors (where
    given) let two strided views whose spans cross, but whose elements interleave, pass; apart: the
    indices of tensors already found to share no byte with each other (a replay's cache fields,
    which may interleave: vLLM's kv_cache[:, 0] and [:, 1]), not compared again."""
    spans = sorted(zip(pointers, extents))
    end = 0
    for start, n in spans:           # the usual case, every tensor apart: one pass over the sorted spans
        if n and start < end:
            break
        end = max(end, start + n)
    else:
        return
    if apart and _apart_but_within(pointers, extents, apart):
        return
    spans = [(p, p + n) for p, n in zip(pointers, extents)]
    for w in written:
        lo, hi = spans[w]
        if hi == lo:
            continue
        for i, (a, b) in enumerate(spans):
            if (i != w and a < hi and lo < b and not (w in apart and i in apart)
                    and (not tensors or _strided_overlap(tensors[w], tensors[i]))):
                raise ValueError(f"{names[w]}: overlaps {names[i]} in memory; {why}")


def _apart_but_within(pointers, extents: tuple, group: range) -> bool:
    """Whether every two spans are apart, where two of the `group`'s tensors may cross: one pass over
    the sorted spans, each group span checked against the furthest end of the other spans so far,
    each other span against the furthest end of all."""
    end_others = end_group = 0
    for start, n, i in sorted(zip(pointers, extents, range(len(extents)))):
        if not n:
            continue
        if i in group:
            if start < end_others:
                return False
            end_group = max(end_group, start + n)
        else:
            if start < max(end_others, end_group):
                return False
            end_others = max(end_others, start + n)
    return True


def _check_apart(names: tuple, tensors: tuple, written: tuple,
                 why: str = "a written buffer must not alias any other argument") -> None:
    """_check_disjoint for a call's tensors themselves (the checked path)."""
    _check_disjoint(names, [t.data_ptr() for t in tensors], written, tuple(_extent(t) for t in tensors), tensors, why)


try:      # torch's C++ check of tensors' dtype, device, shape, strides and autograd state (torch.compile's guards)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:       # a torch without it: replays find their plan by the call's signature alone
    _TensorGuards = None


@functools.cache
def _guards_sound() -> bool:
    """Whether torch's TensorGuards tells apart what a plan's signature does, on probe tensors: a
    dtype, a shape, strides (it is a private API: a torch where it differs finds plans by the
    signature alone)."""
    if _TensorGuards is None:
        return False
    try:
        t = torch.zeros(2, 3, device="cpu")           # (not torch's default device, which may be meta)
        guard = _TensorGuards(t, dynamic_dims_sizes=[[2, 3]], dynamic_dims_strides=[[3, 1]])
        others = (t.double(), torch.zeros(3, 2, device="cpu"), t.t().contiguous().t(), torch.zeros(2, 4, device="cpu")[:, :3])
        return guard.check(t) is True and not any(guard.check(u) for u in others)
    except Exception:         # any failure of the probe: no guards
        return False


# Scalars a guarded plan compares by value (a type: the Cache class, so another layout's is not replayed).
_PLAIN_SCALARS = (int, bool, float, type(None), torch.dtype, type)


def _guard(tensors: tuple, key: tuple):
    """The guard of a plan recorded for `tensors` (signature `key`); None (the plan is then found by
    its signature alone) where torch has no sound one, where a pointer was not 16-byte aligned (a
    replay's alignment test is that every pointer is; the signature holds each one's low bits), where
    one tensor is passed twice (TensorGuards fails tensors that repeat) or where a scalar is not of a
    plain type (the fast path compares scalars by value: a tensor for `pdl` would sync)."""
    if (any(part[4] for part in key[:len(tensors)]) or len(set(map(id, tensors))) < len(tensors)
            or not all(type(s) in _PLAIN_SCALARS for s in key[-3]) or not _guards_sound()):
        return None
    try:
        return _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                             dynamic_dims_strides=[list(t.stride()) for t in tensors])
    except Exception:         # a tensor the guards do not handle: found by its signature
        return None


class _Plans(dict):
    """One op's launch plans by call signature, and the last one found or recorded (tried first)."""

    __slots__ = ("last",)

    def __init__(self):
        super().__init__()
        self.last = None

    def clear(self) -> None:
        super().clear()
        self.last = None


def _find(plans: _Plans, tensors: tuple | None, scalars: tuple) -> tuple:
    """(plan, key, pointers) of a call: the plan recorded for its signature, or None (then key and
    pointers serve to record one; key None: an argument is not a tensor, see _signature). The last
    plan is tried first: when the scalars (and their types) are its own, the tensors pass its guard,
    the current device is its own and every pointer is 16-byte aligned, the call has its signature,
    which is then not computed (key None)."""
    last = plans.last         # (a plan exists only where CUDA is initialized: its device can be asked)
    if (last is not None and last.guard is not None and tensors is not None and len(tensors) == last.arity
            and tuple(map(type, scalars)) == last.scalar_types and scalars == last.scalars
            and last.guard.check(*tensors) and torch._C._cuda_getDevice() == last.device):
        pointers = [t.data_ptr() for t in tensors]
        if not functools.reduce(operator.or_, pointers) & 15:
            return last, None, pointers
    key, pointers = _signature(tensors, scalars)
    plan = plans.get(key)
    if plan is not None:
        plans.last = plan
    return plan, key, pointers


class _Plan:
    """One call signature's launches: (compiled kernel, launch function, grid, kernel function,
    arguments, slots, count of the launcher's leading arguments) each, the slots naming which
    argument positions take which of the call's tensors' addresses."""

    __slots__ = ("launches", "extents", "recordable", "outputs", "disjoint", "fields_apart", "device", "guard",
                 "scalars", "scalar_types", "arity")
    # Triton's launch hooks (profilers add theirs); with none added a launch passes None for them.
    hooks = triton.knobs.runtime

    def __init__(self, extents: tuple):
        self.launches = []
        self.extents = extents        # bytes each of the call's tensors spans (for the aliasing check)
        self.recordable = True
        self.outputs = ()             # (shape, strides, dtype, device) of each output the op allocates itself
        self.disjoint = None          # the last pointers found free of aliasing (the verdict is theirs alone)
        self.fields_apart = None      # the last cache-field pointers found apart
        self.guard = None             # set by _remember, with the signature's scalars and device
        self.scalars = self.scalar_types = self.device = self.arity = None

    def check_disjoint(self, names: tuple, pointers: list, written: tuple, tensors: tuple, first_field: int) -> None:
        """_check_disjoint for a replay, after check_fields_apart (the cache fields start at index
        `first_field`): skipped when the pointers are the ones last found apart (the signature fixes
        every shape and stride, so the same pointers give the same verdict)."""
        if pointers != self.disjoint:
            fields = range(first_field, first_field + len(_CACHE_NAMES))
            _check_disjoint(names, pointers, written, self.extents, tensors, apart=fields)
            self.disjoint = pointers

    def check_fields_apart(self, pointers: list, first_field: int, tensors: tuple) -> None:
        """For a replay: the cache fields (pointers[first_field:], _CACHE_NAMES, of the call's
        `tensors`) share no byte, as the checked path requires (_check_fields_apart); skipped for the
        fields' pointers last found apart. The signature keeps every field's shape and strides, so
        one tensor passed for two fields, or overlapping views at other addresses, would replay
        unchecked."""
        start, end = first_field, first_field + len(_CACHE_NAMES)
        fields = pointers[start:end]
        if fields != self.fields_apart:
            _check_disjoint(_CACHE_NAMES, fields, tuple(range(len(fields))), self.extents[start:end], tensors[start:end],
                            _FIELDS_APART)
            self.fields_apart = fields

    def own(self, outs: tuple) -> None:
        """Keep the outputs the recorded call allocated itself, to allocate alike on replays."""
        self.outputs = tuple((o.shape, o.stride(), o.dtype, o.device) for o in outs)

    def allocate(self, pointers: list) -> tuple:
        """A replay's own outputs, as the recorded call allocated them; their addresses are appended
        to `pointers` (after the call's tensors', as their slots are)."""
        outs = []
        for shape, strides, dtype, device in self.outputs:
            out = torch.empty_strided(shape, strides, dtype=dtype, device=device)
            pointers.append(out.data_ptr())
            outs.append(out)
        return tuple(outs)

    def record(self, compiled, grid: tuple, kernel, args: tuple, constexprs: dict, tensors: tuple) -> None:
        """Add a launch: its arguments in the kernel's parameter order, the call's tensors replaced
        by slots (matched in order by identity, or by pointer and dtype for views of them)."""
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            self.recordable = False
            return
        call, lead = _launcher(compiled)
        values, slots, used = list(lead), [], set()
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
                slots.append((len(values), match))
                value = None                  # the plan keeps no tensor alive
            values.append(value)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self.launches.append((compiled, call, grid, compiled.function, values, tuple(slots), len(lead)))

    def run(self, pointers: list, tensors: tuple) -> None:
        """Launch every recorded kernel on the current stream with this call's tensors' addresses, as
        Triton's JIT launches a compiled kernel. Given a tensor, Triton's launcher would call its
        data_ptr() and ask the driver whether the address is device memory (per tensor, per call),
        which the plan's signature settled (every tensor on this CUDA device). Launch hooks (only
        when some are set) get the tensors themselves, as from Triton's JIT."""
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        enter, leave = self.hooks.launch_enter_hook, self.hooks.launch_exit_hook
        if getattr(enter, "calls", enter) or getattr(leave, "calls", leave):
            self._run_hooked(tensors, stream, enter, leave)
            return
        for _, call, grid, function, values, slots, _ in self.launches:
            args = values.copy()
            for position, index in slots:
                args[position] = pointers[index]
            call(*grid, stream, function, *args)

    def _run_hooked(self, tensors: tuple, stream, enter, leave) -> None:
        for compiled, _, grid, function, values, slots, lead in self.launches:
            args = values.copy()
            for position, index in slots:
                args[position] = tensors[index]
            args = args[lead:]
            compiled.run(*grid, stream, function, compiled.packed_metadata,
                         compiled.launch_metadata(grid, stream, *args), enter, leave, *args)


_MISSING = object()


def _launcher(compiled) -> tuple:
    """(launch function, leading arguments) that a replay calls with (grid x, y, z, stream,
    function, *leading arguments, *kernel arguments): Triton 3.6's CudaLauncher's C `launch` with
    the launcher's fixed arguments (its __call__ only adds scratch buffers, none here, in front of
    it); elsewhere the launcher itself, as Triton's JIT calls it with no hooks."""
    launcher = compiled.run
    try:
        params = list(inspect.signature(type(launcher).__call__).parameters)
    except (TypeError, ValueError):
        params = None
    if (params == ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"] and hasattr(launcher, "launch")
            and not launcher.global_scratch_size and not launcher.profile_scratch_size):
        return launcher.launch, (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                                 compiled.packed_metadata, None, None, None)
    return launcher, (compiled.packed_metadata, None, None, None)


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


def _check_compiled_device(kernel, name: str, device) -> None:
    """Compiled kernels take device tensors: CPU ones need Triton's interpreter (a compiled launch
    would fail inside Triton with no active driver, or read host memory as device memory)."""
    if device.type == "cpu" and isinstance(kernel, triton.runtime.JITFunction):
        raise ValueError(f"{name}: the tensors are on the CPU, but the kernels are compiled for a GPU; on the CPU set "
                         f"TRITON_INTERPRET=1 before importing the module, or call {kernel.__module__}'s _ref functions")


def _plan_for(kernel, tensors: tuple, device, name: str) -> _Plan | None:
    """A plan to record for a call of compiled kernels on a CUDA device (None elsewhere); `name` is
    the argument `device` is read from (CPU tensors are refused unless the kernels are interpreted)."""
    _check_compiled_device(kernel, name, device)
    if device.type != "cuda" or not isinstance(kernel, triton.runtime.JITFunction):
        return None
    return _Plan(tuple(_extent(t) for t in tensors))


def _remember(plans: _Plans, key, plan, tensors: tuple) -> None:
    """Keep a recorded plan under its call signature, with the guard of the call's `tensors` (the
    ones the signature was computed from), as the op's last plan. At most _MAX_PLANS per op: a new
    one past that starts the op's plans afresh, so a stream of ever-new shapes cannot grow them."""
    if key is None or plan is None or not plan.recordable:
        return
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plan.scalars, plan.scalar_types, plan.device = key[-3:]
    plan.arity, plan.guard = len(tensors), _guard(tensors, key)
    plans[key] = plans.last = plan


_MAX_PLANS = 256
