"""A small declarative type system for specs: one table drives validation, the JSON Schema
shipped for editors, and the field reference in the docs, so the three cannot drift apart.

``check`` walks a tree from ``marked_yaml`` and returns it normalized (defaults filled in);
every complaint is a ``SpecError`` at the offending key or value, naming the field path and
how to fix it.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import Mark, SpecError, gather
from .marked_yaml import MarkedDict, MarkedList


# A spec's names become Python identifiers, file and constexpr names: at most 64 characters.
IDENT = r"[a-z][a-z0-9_]{0,63}"


def _show(value) -> str:
    return repr(value) if not isinstance(value, (MarkedDict, dict)) else "a mapping"


def _numeric(text: str) -> bool:
    """Whether a string reads as a number (a quoted one, which a type hint tells to unquote)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


class Type:
    doc_name = "value"

    def check(self, value, mark: Mark, where: str):
        raise NotImplementedError

    def json(self) -> dict:
        raise NotImplementedError

    def fail(self, value, mark, where, fix=None):
        err = SpecError(mark, f"{where}: expected {self.doc_name}, got {_show(value)}", fix)
        err.type_mismatch = True          # (OneOf prefers an option whose type matched)
        raise err


@dataclass
class Int(Type):
    minimum: int | None = None
    maximum: int | None = None

    @property
    def doc_name(self):
        if self.minimum is not None and self.minimum == self.maximum:
            return f"the integer {self.minimum}"
        if self.minimum is not None and self.maximum is not None:
            return f"an integer in [{self.minimum}, {self.maximum}]"
        if self.minimum is not None:
            return f"an integer >= {self.minimum}"
        return "an integer"

    def check(self, value, mark, where):
        if isinstance(value, bool) or not isinstance(value, int):
            # a quoted number is told to drop the quotes; a word (or 0o1100, which YAML 1.1 reads as
            # text) to write decimal digits
            unquote = isinstance(value, str) and _numeric(value)
            self.fail(value, mark, where, "write a whole number without quotes" if unquote or not isinstance(value, str)
                      else "write a whole number in decimal digits")
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            if self.minimum == self.maximum:
                self.fail(value, mark, where, f"write {self.minimum}")
            bounds = [f">= {self.minimum}" if self.minimum is not None else "", f"<= {self.maximum}" if self.maximum is not None else ""]
            self.fail(value, mark, where, "use a whole number " + " and ".join(b for b in bounds if b))
        return value

    def json(self):
        out = {"type": "integer"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


@dataclass
class Float(Type):
    exclusive_minimum: float | None = None
    doc_name: str = "a number"

    def check(self, value, mark, where):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(value, mark, where, "write a number such as 1.0e-8 or 1.0e+5 (YAML 1.1 needs the '.' and "
                      "the exponent's sign)")
        if self.exclusive_minimum is not None and not value > self.exclusive_minimum:
            raise SpecError(mark, f"{where}: must be a number above {self.exclusive_minimum:g}, got {value!r}",
                            "use a positive number such as 1.0e-8" if self.exclusive_minimum == 0
                            else f"use a number above {self.exclusive_minimum:g}")
        return float(value)

    def json(self):
        out = {"type": "number"}
        if self.exclusive_minimum is not None:
            out["exclusiveMinimum"] = self.exclusive_minimum
        return out


@dataclass
class Bool(Type):
    doc_name: str = "true or false"

    def check(self, value, mark, where):
        if not isinstance(value, bool):
            self.fail(value, mark, where, "write true or false")
        return value

    def json(self):
        return {"type": "boolean"}


@dataclass
class Str(Type):
    enum: tuple | None = None
    pattern: str | None = None
    what: str = "a string"

    @property
    def doc_name(self):
        if self.enum:
            return "one of " + ", ".join(repr(e) for e in self.enum)
        return self.what

    def check(self, value, mark, where):
        if not isinstance(value, str):
            self.fail(value, mark, where, "write it as a string (quote it if YAML reads it as something else)")
        if self.enum is not None and value not in self.enum:
            close = difflib.get_close_matches(value, self.enum, n=1)
            fix = f"did you mean {close[0]!r}?" if close else "use one of the listed values"
            self.fail(value, mark, where, fix)
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            self.fail(value, mark, where, f"it must match {self.pattern}")
        return value

    def json(self):
        out: dict = {"type": "string"}
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.pattern is not None:
            out["pattern"] = f"^{self.pattern}$"
        return out


@dataclass
class Null(Type):
    doc_name: str = "null"

    def check(self, value, mark, where):
        if value is not None:
            self.fail(value, mark, where, "write null")
        return None

    def json(self):
        return {"type": "null"}


@dataclass
class OneOf(Type):
    options: tuple

    @property
    def doc_name(self):
        return " or ".join(o.doc_name for o in self.options)

    def check(self, value, mark, where):
        errors = []
        for option in self.options:
            try:
                return option.check(value, mark, where)
            except SpecError as err:
                errors.append(err)
        # A mapping: report the error of the mapping option sharing most of its keys (the first on ties);
        # a list: the list option's.
        if isinstance(value, MarkedDict):
            objs = [(option, err) for option, err in zip(self.options, errors) if isinstance(option, Obj)]
            # keys of two alternatives ({values: N} and {tokens: N}) together: say they are alternatives
            hit = [option for option, _ in objs if set(value) & set(option.fields)]
            whole = [option for option in hit if set(option.fields) <= set(value)]
            if len(whole) > 1 and set(value) <= {key for option in whole for key in option.fields}:
                raise SpecError(mark, f"{where}: {' and '.join(o.title for o in whole)} are alternatives, got "
                                f"{', '.join(map(str, value))} together", f"keep one of {', '.join(map(repr, value))}")
            if objs and value and not hit:       # no option's key at all: name every option, and a close key
                keys = [key for option, _ in objs for key in option.fields]
                close = [c for k in value for c in difflib.get_close_matches(str(k), keys, n=1)]
                raise SpecError(value.key_mark(next(iter(value))), f"{where}: unknown field(s) "
                                f"{', '.join(map(repr, value))}", (f"did you mean {close[0]!r}? " if close else "")
                                + f"write one of {', '.join(o.title for o, _ in objs)}")
            if objs:
                raise max(objs, key=lambda oe: len(set(value) & set(oe[0].fields)))[1]
        for option, err in zip(self.options, errors):
            if isinstance(value, MarkedList) and isinstance(option, ListOf):
                raise err
        # A scalar whose option error says more than "expected <type>" (Float's bound, with its own
        # message and fix): that error. (Int and Str bounds report through fail(), as their type.)
        for err in errors:
            if not getattr(err, "type_mismatch", False) and not isinstance(value, (MarkedDict, MarkedList)):
                raise err
        # Otherwise the first option's hint that says more than the type (a range, a close name); where
        # that is a number's hint for a word (heads: one), every option ("write an integer ... or 'any'").
        option, fix = next(((option, err.fix) for option, err in zip(self.options, errors)
                            if err.fix and not isinstance(option, Null)), (None, f"write {self.doc_name}"))
        if isinstance(option, (Int, Float)) and isinstance(value, str) and not _numeric(value):
            fix = f"write {self.doc_name}"
        self.fail(value, mark, where, fix)

    def json(self):
        return {"oneOf": [o.json() for o in self.options]}


@dataclass
class ListOf(Type):
    item: Type
    min_items: int = 0
    max_items: int | None = None
    unique: bool = False

    @property
    def doc_name(self):
        return f"a list of {self.item.doc_name}"

    def check(self, value, mark, where):
        if not isinstance(value, MarkedList):
            self.fail(value, mark, where, "write a YAML list, e.g. [a, b] or one '- item' per line")
        if len(value) < self.min_items:
            raise SpecError(mark, f"{where}: needs at least {self.min_items} item(s), got {len(value)}",
                            f"list at least {self.min_items} item(s), each {self.item.doc_name}")
        if self.max_items is not None and len(value) > self.max_items:
            raise SpecError(mark, f"{where}: takes at most {self.max_items} item(s), got {len(value)}",
                            f"keep at most {self.max_items}")
        out = MarkedList(gather(lambda i=i, v=v: self.item.check(v, value.item_mark(i), f"{where}[{i}]")
                                for i, v in enumerate(value)))
        out.mark, out.item_marks = value.mark, value.item_marks
        if self.unique:
            seen = set()
            for i, v in enumerate(out):
                key = repr(v)
                if key in seen:
                    raise SpecError(value.item_mark(i), f"{where}[{i}]: duplicate entry {v!r}", "list each entry once")
                seen.add(key)
        return out

    def json(self):
        out = {"type": "array", "items": self.item.json()}
        if self.min_items:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        if self.unique:
            out["uniqueItems"] = True
        return out


@dataclass
class MapOf(Type):
    value: Type
    key_pattern: str = IDENT
    min_items: int = 0

    @property
    def doc_name(self):
        return f"a mapping of name to {self.value.doc_name}"

    def check(self, value, mark, where):
        if not isinstance(value, MarkedDict):
            self.fail(value, mark, where, "write a YAML mapping of name: entry")
        if len(value) < self.min_items:
            raise SpecError(mark, f"{where}: needs at least {self.min_items} entry(ies)",
                            f"add at least {self.min_items} name: {self.value.doc_name} entry(ies)")
        out = MarkedDict()
        out.mark, out.key_marks, out.value_marks = value.mark, value.key_marks, value.value_marks
        def entry(k, v):
            if not isinstance(k, str) or not re.fullmatch(self.key_pattern, k):
                raise SpecError(value.key_mark(k), f"{where}: bad name {k!r}",
                                f"names are lowercase identifiers matching {self.key_pattern}")
            return k, self.value.check(v, value.value_mark(k), f"{where}.{k}")

        out.update(gather(lambda k=k, v=v: entry(k, v) for k, v in value.items()))
        return out

    def json(self):
        return {"type": "object", "propertyNames": {"pattern": f"^{self.key_pattern}$"},
                "additionalProperties": self.value.json(), "minProperties": self.min_items}


_REQUIRED = object()


@dataclass
class Field:
    type: Type
    doc: str
    default: Any = _REQUIRED

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclass
class Obj(Type):
    fields: dict = field(default_factory=dict)
    title: str = "a mapping"

    @property
    def doc_name(self):
        return self.title

    def check(self, value, mark, where):
        if not isinstance(value, MarkedDict):
            self.fail(value, mark, where, f"write a mapping with the keys {', '.join(self.fields)}")
        def unknown(k):
            close = difflib.get_close_matches(str(k), list(self.fields), n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(self.fields)}"
            raise SpecError(value.key_mark(k), f"{where + ': ' if where else ''}unknown field {k!r}", fix)

        # A misspelt key is one problem: its field is not reported missing as well.
        misspelt = {c for k in value if k not in self.fields for c in difflib.get_close_matches(str(k), list(self.fields), n=1)}

        def checked(name, f):
            path = f"{where}.{name}" if where else name
            if name in value:
                return name, f.type.check(value[name], value.value_mark(name), path)
            if f.required and name in misspelt:
                return None                  # (the unknown key's error is raised)
            if f.required:
                raise SpecError(value.mark, f"{where or 'spec'}: missing required field {name!r}",
                                f"add '{name}:' ({f.doc})")
            return name, f.default

        out = MarkedDict()
        out.mark, out.key_marks, out.value_marks = value.mark, dict(value.key_marks), dict(value.value_marks)
        # Every problem of the mapping: its unknown keys, then each field's.
        checks = [lambda k=k: unknown(k) for k in value if k not in self.fields]
        results = gather(checks + [lambda n=n, f=f: checked(n, f) for n, f in self.fields.items()])
        out.update(r for r in results if r is not None)
        return out

    def json(self):
        return {
            "type": "object",
            "additionalProperties": False,
            "required": [n for n, f in self.fields.items() if f.required],
            "properties": {n: {**f.type.json(), "description": f.doc} for n, f in self.fields.items()},
        }


def field_rows(obj: Obj, prefix: str = ""):
    """(path, type, default, doc) for every field, depth first: the docs' field reference."""
    for name, f in obj.fields.items():
        path = f"{prefix}{name}"
        default = "required" if f.required else repr(f.default)
        yield path, f.type.doc_name, default, f.doc
        yield from _inner_rows(f.type, path, "")


def _inner_rows(inner, path: str, suffix: str):
    """The field rows of the mappings inside a field's type (every mapping option of a OneOf)."""
    while isinstance(inner, (ListOf, MapOf)):
        inner, suffix = (inner.item, suffix + "[]") if isinstance(inner, ListOf) else (inner.value, suffix + ".<name>")
    if isinstance(inner, OneOf):
        for option in inner.options:
            yield from _inner_rows(option, path, suffix)
    elif isinstance(inner, Obj):
        yield from field_rows(inner, f"{path}{suffix}.")
