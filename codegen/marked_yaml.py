"""Load YAML keeping the line and column of every key and value (torchgen style).

Mappings become ``MarkedDict`` and sequences ``MarkedList``; both are ordinary dict/list
subclasses that also remember where each of their entries stands in the file, so that
validation errors can name ``path:line:col``.
"""
from __future__ import annotations

import re

import yaml

from .errors import Mark, SpecError

MAX_BYTES = 1 << 20          # a spec is a page of YAML; anything larger is not one
# Plain scalars that YAML 1.1 (PyYAML) reads as something other than they look.
_YAML11_BOOLS = {"yes", "no", "on", "off", "y", "n"}
# Hex (0x240) reads as it looks and stays; binary (0b1010) is a number in YAML 1.1 only (YAML 1.2
# tools, the schema's language server among them, read it as text), and digit groups in any base.
_YAML11_NUMBER = re.compile(r"[-+]?(0[0-9_]+|0b[01_]+|0x[0-9a-fA-F]*_[0-9a-fA-F_]*|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"
                            r"|[0-9.]*_[0-9_.]*)")


class MarkedDict(dict):
    mark: Mark
    key_marks: dict
    value_marks: dict

    def key_mark(self, key) -> Mark:
        return self.key_marks.get(key, self.mark)

    def value_mark(self, key) -> Mark:
        return self.value_marks.get(key, self.mark)


class MarkedList(list):
    mark: Mark
    item_marks: list

    def item_mark(self, index: int) -> Mark:
        return self.item_marks[index] if index < len(self.item_marks) else self.mark


def _mark(path: str, node: yaml.Node) -> Mark:
    return Mark(path, node.start_mark.line + 1, node.start_mark.column + 1)


def _convert(node: yaml.Node, path: str, loader: yaml.SafeLoader):
    if isinstance(node, yaml.MappingNode):
        out = MarkedDict()
        out.mark, out.key_marks, out.value_marks = _mark(path, node), {}, {}
        for key_node, value_node in node.value:
            key = _convert(key_node, path, loader)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise SpecError(_mark(path, key_node), "mapping keys must be plain scalars",
                                "write the key as a plain word (the field's name)")
            if key in out:
                raise SpecError(_mark(path, key_node), f"duplicate key {key!r}",
                                f"keep one {key!r} entry in this mapping")
            out[key] = _convert(value_node, path, loader)
            out.key_marks[key] = _mark(path, key_node)
            out.value_marks[key] = _mark(path, value_node)
        return out
    if isinstance(node, yaml.SequenceNode):
        out = MarkedList(_convert(item, path, loader) for item in node.value)
        out.mark = _mark(path, node)
        out.item_marks = [_mark(path, item) for item in node.value]
        return out
    if isinstance(node, yaml.ScalarNode) and node.style is None:
        _check_plain_scalar(node, path)
    value = loader.construct_object(node, deep=True)
    bad = loader.decoded_bad.search(value) if isinstance(value, str) else None
    if bad:      # an escape of a quoted string ("\0", "\ud800"): generated files would not compile or encode
        raise SpecError(_mark(path, node), f"the string holds U+{ord(bad.group()):04X} (a control, invisible or "
                        "bidi character, or a lone surrogate, from an escape)", "remove the escape (a spec's strings are plain text)")
    return value


# Format characters no spec needs that change how text displays: a soft hyphen, zero-width ones,
# marks and bidi embeddings, overrides and isolates, a byte order mark past the start, tag characters.
_INVISIBLE = "\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f"


# What a decoded string may not hold (tabs and line breaks it may): the file's check (_check_text)
# sees the raw text only, where a quoted string's escapes still stand for these.
_DECODED_CONTROL = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff"
_DECODED_BAD = re.compile(f"[{_DECODED_CONTROL}{_INVISIBLE}]")
_DECODED_BAD_EARLIER = re.compile(f"[{_DECODED_CONTROL}]")       # an earlier revision's (see load)


MAX_DIGITS = 30              # digits of a number in a spec (a byte count or a floor needs far fewer)


def _check_plain_scalar(node: yaml.ScalarNode, path: str) -> None:
    """Reject the plain scalars YAML 1.1 reads otherwise than a reader would (no -> false, 0576 ->
    382, 7:28 -> 448): the spec says what it means or quotes it."""
    text = node.value
    if node.tag.endswith((":int", ":float")) and sum(c.isdigit() for c in text) > MAX_DIGITS:
        raise SpecError(_mark(path, node), f"a number of {sum(c.isdigit() for c in text)} digits",
                        f"a spec's numbers have at most {MAX_DIGITS} digits")
    if node.tag.endswith(":bool") and text.lower() not in ("true", "false"):
        raise SpecError(_mark(path, node), f"{text!r} is read as a boolean by YAML 1.1",
                        f"write true or false, or quote it ('{text}') for the word")
    if node.tag.endswith((":int", ":float")) and _YAML11_NUMBER.fullmatch(text):
        try:
            read = f"the number {yaml.SafeLoader('').construct_object(node)!r}"
        except ValueError:                   # digit groups without a digit (0x_): a number YAML cannot build
            read = "a number"
        raise SpecError(_mark(path, node), f"{text!r} is read by YAML 1.1 as {read} (octal, binary, base 60 or digit "
                        "groups)", "write the number in plain decimal digits, or quote it for a string")


def _reject_anchors_and_tags(text: str, path: str) -> None:
    """Anchors, aliases, merge keys and explicit tags are not part of the spec language (aliases can
    also expand a small file into a huge tree): one pass over the parse events finds them."""
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            where = Mark(path, event.start_mark.line + 1, event.start_mark.column + 1)
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise SpecError(where, "YAML anchors and aliases (&name, *name) are not supported",
                                "write the value out where it is used")
            if getattr(event, "tag", None) is not None:       # set only where the text writes a tag
                raise SpecError(where, f"YAML tags ({event.tag}) are not supported", "remove the tag")
            if isinstance(event, yaml.ScalarEvent) and event.value == "<<" and event.style is None:
                raise SpecError(where, "YAML merge keys (<<) are not supported", "write the merged fields out")
    except yaml.MarkedYAMLError:
        return                       # reported with its position by the composer below


MAX_NESTING = 64             # flow brackets a spec may nest ([ and {; a real spec needs 3)


def _check_nesting(text: str, path: str) -> None:
    """Reject deep flow nesting before the YAML parser sees it (it takes seconds, then recurses)."""
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if ch == "\n":
            quote = None             # (an apostrophe in a comment opens no quote past its line)
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, i) + 1
                raise SpecError(Mark(path, line, i - (text.rfind("\n", 0, i) + 1) + 1), "the YAML nests too deeply",
                                f"a spec nests at most {MAX_NESTING} brackets")
        elif ch in "]}":
            depth = max(0, depth - 1)


def _check_text(text: str, path: str, invisible: bool = False) -> None:
    if len(text) > MAX_BYTES:
        raise SpecError(Mark(path, 1, 1), f"the file has {len(text)} characters; a spec is at most {MAX_BYTES}",
                        "is this the right file?")
    # (C1 controls too, and U+2028/9: YAML 1.1 takes U+0085, U+2028 and U+2029 as line breaks that
    # editors do not show, which can end a comment and start a key)
    # Bidi controls and invisible characters too: copied into a generated docstring they would make
    # the reviewed code read otherwise than it runs ("Trojan Source").
    bad = re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029" + ("" if invisible else _INVISIBLE) + "]", text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        col = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        kind = "an invisible or bidi control character" if re.match(f"[{_INVISIBLE}]", bad.group()) else "control character"
        raise SpecError(Mark(path, line, col), f"{kind} U+{ord(bad.group()):04X} in the file",
                        "remove it (a spec is plain UTF-8 text)")


def decode(data: bytes, path: str) -> str:
    """A spec file's bytes as text: UTF-8 (a BOM is dropped), else a SpecError at the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = data[:exc.start]
        line = start.count(b"\n") + 1
        col = exc.start - (start.rfind(b"\n") + 1) + 1
        raise SpecError(Mark(path, line, col), f"the file is not UTF-8 text (byte 0x{data[exc.start]:02X})",
                        "save it as UTF-8") from None


# A line inside a quoted string that reads like a mapping key: the quote swallowed the spec's next fields.
_SWALLOWED_KEY = re.compile(r"\n[ \t]*(- )?[A-Za-z_][\w-]*:([ \t]|$)", re.M)


def _runaway_quote(text: str, error_line: int):
    """(start, end) marks of a quoted scalar that starts on one line and ends on a later one, at or
    before the line of a syntax error: in a spec, a quote left open (the string then swallows the
    lines up to the next quote, and the error shows up there)."""
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, yaml.ScalarToken) and token.style in ("'", '"') \
                    and token.start_mark.line < token.end_mark.line <= error_line \
                    and _SWALLOWED_KEY.search(text, token.start_mark.index, token.end_mark.index):
                return token.start_mark, token.end_mark
    except yaml.YAMLError:
        pass
    return None


def load(text: str, path: str, *, invisible: bool = False):
    """Parse one YAML document; a YAML syntax error becomes a SpecError with its position.
    invisible: let invisible and bidi characters pass (an earlier revision's spec, read by `diff`)."""
    _check_text(text, path, invisible)
    _check_nesting(text, path)
    _reject_anchors_and_tags(text, path)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        # an unclosed quote or bracket is reported where it opens, not at the end of the file
        opened = exc.context_mark if exc.context and exc.context.startswith("while scanning") else None
        mark = opened or exc.problem_mark or exc.context_mark
        runaway = _runaway_quote(text, mark.line) if mark and not opened else None
        if runaway is not None:
            start, end = runaway
            raise SpecError(Mark(path, start.line + 1, start.column + 1), "YAML syntax error: a quoted string opens "
                            f"here and runs on to line {end.line + 1}", "close the quote on this line") from None
        where = Mark(path, mark.line + 1, mark.column + 1) if mark else Mark(path, 1, 1)
        raise SpecError(where, f"YAML syntax error: {exc.problem or exc.context}",
                        "check the quotes, brackets and indentation here") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise SpecError(Mark(path, 1, 1), f"YAML error: {type(exc).__name__}: {str(exc)[:200]}",
                        "keep to plain YAML mappings, lists and scalars") from None
    finally:
        loader.dispose()
    if node is None:
        raise SpecError(Mark(path, 1, 1), "the spec is empty", "start from one of the specs in specs/")
    constructor = yaml.SafeLoader("")
    constructor.decoded_bad = _DECODED_BAD_EARLIER if invisible else _DECODED_BAD     # what a string may not hold
    try:
        return _convert(node, path, constructor)
    except RecursionError:
        raise SpecError(Mark(path, 1, 1), "the YAML nests too deeply", "a spec is a few levels deep") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = Mark(path, mark.line + 1, mark.column + 1) if mark else Mark(path, 1, 1)
        raise SpecError(where, f"YAML error: {getattr(exc, 'problem', None) or exc}", "keep to plain YAML") from None
