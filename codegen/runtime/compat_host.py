"""Host helpers every generated compat module carries: argument errors in the caller's terms.

Everything below the COPY marker is copied into each compat module (which stays one standalone file
beside the layout modules it imports), so it is ordinary, lintable Python here and reviewed once.
"""
from __future__ import annotations

import numbers
import re

import torch

# --- COPY: everything below is copied into each generated module ------------------------------


def _described(value) -> str:
    """A value as an argument error describes it: a tensor's dtype and shape, else its type."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _supported(value, allowed: tuple) -> bool:
    """Whether value is one of `allowed` (a compat function's require:), and of its kind: an integer
    (a Python or NumPy scalar one; not a bool, a float, an array or a tensor) equal to an int, a str
    equal to a string, None for None. So 128.0 is not 128, and an array is refused, not compared."""
    for want in allowed:
        if want is None or isinstance(want, str):
            if value is want or (isinstance(value, str) and value == want):
                return True
        elif isinstance(value, numbers.Integral) and not isinstance(value, bool) and value == want:
            return True
    return False


def _first_rows(t, counter, names: tuple):
    """t's first rows, as many as `counter` has entries: the seed takes its token count from `counter`
    (vLLM's num_tokens = slot_mapping.size(0)) and never reads rows past it (padding for CUDA graphs);
    fewer rows are an error naming t (names: t's and counter's parameters). t as it is where either
    is no tensor of rows (the op's checks then name it)."""
    if not (isinstance(t, torch.Tensor) and isinstance(counter, torch.Tensor) and t.dim() and counter.dim()):
        return t
    if t.shape[0] < counter.shape[0]:
        raise ValueError(f"{names[0]}: has {t.shape[0]} along its first dim, fewer than the {counter.shape[0]} "
                         f"tokens {names[1]} counts (one per token)")
    return t[:counter.shape[0]]


def _as_read(error: ValueError, given: tuple, trim: tuple, counters: tuple) -> ValueError:
    """error (in the caller's terms) with a note where it names a tensor _first_rows cut: the shapes
    in its text are of the rows read, not of the tensor passed. given: the tensors as passed, in the
    order of trim's (parameter, counter) pairs; counters: the counter tensors, in the same order."""
    text, cut = str(error), []
    for t, (name, counter), rows in zip(given, trim, counters):
        if not (isinstance(t, torch.Tensor) and isinstance(rows, torch.Tensor) and t.dim() and rows.dim()):
            continue
        if t.shape[0] > rows.shape[0] and re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text):
            cut.append(f"{name}'s first {rows.shape[0]} of its {t.shape[0]} rows, one per token {counter} counts")
    return ValueError(f"{text} (shapes as read: {'; '.join(cut)})") if cut else error


def _renamed(error: ValueError, names: dict) -> ValueError:
    """The layout op's ValueError in the caller's terms: the argument it starts with (the text before
    ': ') and the other arguments it mentions become the compat function's parameters, or the
    expressions it passed for them. A compound name (cache.k_cache, page_size) is renamed wherever it
    stands; a plain one (k, v), which could be a word of the text, only where the text names an
    argument by it: "k's shape", "overlaps k in memory". A head that lists arguments ("cache.k_cache
    and cache.k_sf") has its compound names renamed within it."""
    head, sep, rest = str(error).partition(": ")
    if not sep:
        return error
    whole = head in names           # else a head that lists arguments ("cache.k_cache and cache.k_sf") is renamed within
    for inner, outer in names.items():
        word = re.escape(inner)
        compound = "." in inner or "_" in inner
        pattern = (rf"(?<![\w.]){word}(?!\w)" if compound else
                   rf"(?<![\w.]){word}(?='s\b)|(?<=overlaps ){word}(?= in memory)")
        rest = re.sub(pattern, outer, rest)
        if compound and not whole:
            head = re.sub(pattern, outer, head)
    return ValueError(f"{names[head] if whole else head}{sep}{rest}")


def _read_page_size(error: ValueError, tensor: str, source: str) -> ValueError:
    """A renamed error where the page size was read off `tensor` (source: the expression, e.g.
    "kv_cache.shape[1]"), not passed: no page size is the caller's to change, so a tensor allocated
    for another page size is named against the one read, and the fix is tensors of one cache, or
    `tensor` shaped with its page size where it is read."""
    return ValueError(_page_size_read_text(str(error), tensor, source))


def _page_size_read_text(text: str, tensor: str, source: str) -> str:
    said = re.escape(source)
    allocated = re.fullmatch(rf"{said}: (\S+) was allocated for {said}=(\d+) \((.*)\), but {said}=(\d+) was passed; "
                             rf"pass the {said} it was allocated with", text)
    shaped = f"pass {tensor} as (num_pages, page size, ...): its page size is read at {source}"
    if allocated is None:       # the tensor read is named: its shape is the fix; else the named tensor's
        named = text.partition(": ")[0]
        fix = shaped if named == tensor else f"pass {named} with {source} slots per page, of the cache {tensor} belongs to"
        return re.sub(rf"pass the {said} it was allocated with(, or a tensor shaped as (\w+\.)?alloc_cache/"
                      rf"(\w+\.)?cache_shapes give it)?",
                      fix, text)
    other, size, detail, read = allocated.groups()
    if other == tensor:
        return (f"{tensor}: {source}={read} is read as the page size, but {tensor} holds pages of {size} slot(s) "
                f"({detail}); {shaped}")
    return (f"{other}: was allocated for page size {size} ({detail}), but {source}={read}; pass {other} and {tensor} "
            "of one cache")
