"""Make Triton's CPU interpreter patch triton.language once per launch, not again at every helper call.

When a kernel launches, the interpreter swaps triton.language's functions for numpy ones
(``interpreter._patch_lang``, undone at the launch's end). At every call of a @triton.jit helper
inside the kernel it patches the modules that helper sees again, identically, and never undoes that
patch (the helper's scope is dropped). kvlayout's kernels call small helpers in their inner loops
(``_magnitude_bits``, the encoders, ...), and those repeats took about a third of ``test_append``'s
time (cProfile). With this, a helper called inside a launch reuses what the launch has patched so
far: the launch's own modules, and those a helper patched earlier in the launch (Triton's
``tl.max``, ``tl.sum``, ``tl.zeros``, ... see ``triton.language.core`` where kernels see
``triton.language``; repeating their patch cost a quarter of ``test_append_batch_prefill``'s time).
A helper that sees a module not yet patched in the launch is patched as before. What runs does not
change: the functions in place are the same either way, since a helper's patch is never undone.

Applied only under TRITON_INTERPRET=1 and only where the interpreter has the structure described
(Triton 3.6 to 3.9); otherwise the interpreter is left as it is.
"""
from __future__ import annotations

import inspect

import triton.language as tl
from triton.runtime import interpreter

_original = getattr(interpreter, "_patch_lang", None)
_launches: list = []     # the language modules patched in each running launch (launches do not nest)
_seen: dict = {}         # each jit function's language modules (its globals, a module's, do not change)


def _languages(fn) -> frozenset:
    languages = _seen.get(fn)
    if languages is None:
        languages = _seen[fn] = frozenset(id(value) for value in fn.__globals__.values()
                                          if inspect.ismodule(value) and value in (tl, tl.core))
    return languages


def _patch_lang_once(fn):
    languages = _languages(fn)
    if _launches:
        if languages <= _launches[-1]:
            return interpreter._LangPatchScope()      # patched in the running launch: nothing to add or undo
        _launches[-1] |= languages                    # a helper that sees other modules: patched as before,
        return _original(fn)                          # and its patch stays for the rest of the launch
    scope = _original(fn)                             # a launch: patch, and forget it when undone
    _launches.append(languages)
    restore = scope.restore

    def restore_and_forget():
        try:
            restore()
        finally:
            _launches.pop()

    scope.restore = restore_and_forget
    return scope


def install() -> bool:
    """Patch once per launch; False (nothing changed) where the interpreter is not as expected."""
    if _original is None or not hasattr(interpreter, "_LangPatchScope"):
        return False
    interpreter._patch_lang = _patch_lang_once
    return True
