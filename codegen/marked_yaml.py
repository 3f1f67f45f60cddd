"""Load YAML keeping the line and column of every key and value (torchgen style).

Mappings become ``MarkedDict`` and sequences ``MarkedList``; both are ordinary dict/list
subclasses that also remember where each of their entries stands in the file, so that
validation errors can name ``path:line:col``.
"""
from __future__ import annotations

import yaml

from .errors import Mark, SpecError


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
                raise SpecError(_mark(path, key_node), "mapping keys must be plain scalars")
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
    return loader.construct_object(node, deep=True)


def load(text: str, path: str):
    """Parse one YAML document; a YAML syntax error becomes a SpecError with its position."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Mark(path, mark.line + 1, mark.column + 1) if mark else Mark(path, 1, 1)
        raise SpecError(where, f"YAML syntax error: {exc.problem or exc.context}") from None
    finally:
        loader.dispose()
    if node is None:
        raise SpecError(Mark(path, 1, 1), "the spec is empty", "start from one of the specs in specs/")
    return _convert(node, path, yaml.SafeLoader(""))
