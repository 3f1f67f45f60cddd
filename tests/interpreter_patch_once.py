"""Make Triton's CPU interpreter patch each language module once per launch, not again at every helper call.

When a kernel launches (``GridExecutor.__call__``), the interpreter swaps triton.language's
functions for numpy ones (``interpreter._patch_lang``, undone at the launch's end). At every call of
a @triton.jit helper inside the kernel it patches the language modules that helper sees again,
identically, and never undoes that patch (the helper's scope is dropped). kvlayout's kernels call
small helpers in their inner loops (``_magnitude_bits``, the encoders, ...) and Triton's own
``tl.max``, ``tl.sum`` and ``tl.zeros`` (which see ``triton.language.core``, and also
``triton.language`` once first interpreted, where the kernels see ``triton.language``); those
repeats took about a third of ``test_append``'s time (cProfile). With this, a helper called
inside a launch reuses what is patched so far in that launch: the launch's own modules, and those
a helper patched earlier in it. A helper that sees a module not yet patched in the launch, and a
helper called outside any launch, is patched as before. What runs does not change: the functions
in place are the same either way, since a helper's patch is never undone.

It also keeps ``interpreter._get_np_dtype``'s answer per element type, which that function
computes afresh at every call from a table it builds each time (the same answers, pure).

Applied only under TRITON_INTERPRET=1 and only where the interpreter has the structure described
(Triton 3.6 to 3.9); otherwise the interpreter is left as it is.
"""
from __future__ import annotations

import inspect

import triton.language as tl
from triton.runtime import interpreter

_original = getattr(interpreter, "_patch_lang", None)
_np_dtype = getattr(interpreter, "_get_np_dtype", None)
_np_dtypes: dict = {}    # element type -> the numpy dtype the interpreter holds its values in
_executor = getattr(interpreter, "GridExecutor", None)
_launch = getattr(_executor, "__call__", None)
_launches: list = []     # per running launch (they do not nest): [its kernel, the modules patched so far]
_seen: dict = {}         # (jit function, size of its globals) -> the language modules it sees


def _languages(fn) -> frozenset:
    # A function's first interpretation adds the interpreter's globals (tl among them) to its module's:
    # the size of the globals tells that apart.
    key = (fn, len(fn.__globals__))
    languages = _seen.get(key)
    if languages is None:
        languages = _seen[key] = frozenset(id(value) for value in fn.__globals__.values()
                                           if inspect.ismodule(value) and value in (tl, tl.core))
    return languages


def _patch_lang_once(fn):
    if not _launches:
        return _original(fn)                          # a helper called from host code: as before
    launch = _launches[-1]
    languages = _languages(fn)
    if fn is launch[0]:                               # the launch's own patch (a kernel does not call
        launch[1] |= languages                        # itself), undone at the launch's end
        return _original(fn)
    if languages <= launch[1]:
        return interpreter._LangPatchScope()          # patched in the running launch: nothing to add or undo
    launch[1] |= languages                            # a helper that sees other modules: patched as before,
    return _original(fn)                              # and its patch stays for the rest of the launch


def _run_launch(self, *args, **kwargs):
    _launches.append([self.fn, frozenset()])
    try:
        return _launch(self, *args, **kwargs)
    finally:
        _launches.pop()


def _get_np_dtype_once(tt_dtype):
    # interpreter._get_np_dtype builds its table of 19 numpy dtypes at every call (about 9% of an
    # append test's time); its answer for a block is its element type's, so each is computed once.
    element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
    try:
        return _np_dtypes[element]
    except KeyError:
        found = _np_dtypes[element] = _np_dtype(element)
        return found
    except TypeError:                 # an unhashable type (a pointer): asked of the interpreter each time
        return _np_dtype(tt_dtype)


def install() -> bool:
    """Patch once per launch; False (nothing changed) where the interpreter is not as expected."""
    if _original is None or _launch is None or not hasattr(interpreter, "_LangPatchScope"):
        return False
    if "fn" not in inspect.signature(_executor.__init__).parameters:
        return False
    interpreter._patch_lang = _patch_lang_once
    _executor.__call__ = _run_launch
    if _np_dtype is not None:
        interpreter._get_np_dtype = _get_np_dtype_once
    return True
