"""Strict YAML for fleet files.

PyYAML's loaders follow YAML 1.1: duplicate keys silently keep the last value, `yes`/`on`/`NO`
become booleans, `017` octal, `22:22` sexagesimal and `2024-01-02` a date. A fleet file is a
contract reviewed in pull requests, so none of that is acceptable here. This module builds its own
small node tree from PyYAML's *event* stream (libyaml when available), which gives us:

- YAML 1.2 core scalars only: `true`/`false`, `null`/`~`, decimal integers, decimal floats;
  everything else (including `yes`, `017`, `0x1F`, `22:22`, dates) stays a string, so a schema that
  wants an integer or a boolean reports it instead of a silent coercion;
- duplicate keys, non-string keys, merge keys and custom tags reported with line and column;
- bounded input: file size, nesting depth, the expanded size of anchors/aliases (a YAML bomb
  fails fast instead of exhausting memory), integers of at most MAX_INT_DIGITS digits and floats that
  stay finite (`1e999` is not read as infinity);
- a position for every node, so later stages can report `file:line:col` for a JSON pointer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fleetllm.core.fleet.jsonvalue import JSON

try:  # libyaml is an order of magnitude faster; fall back to the pure-Python parser.
    from yaml import CSafeLoader as _EventLoader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _EventLoader  # type: ignore[assignment]

MAX_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 2_000_000
# Longest integer a fleet file may hold. Python refuses to convert one of more than 4,300 digits
# (sys.get_int_max_str_digits) with a ValueError; no fleet value needs more than a few digits.
MAX_INT_DIGITS = 100

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAGS = {None, "!", "tag:yaml.org,2002:map"}
_SEQ_TAGS = {None, "!", "tag:yaml.org,2002:seq"}

_NULL = {"", "~", "null", "Null", "NULL"}
_TRUE = {"true", "True", "TRUE"}
_FALSE = {"false", "False", "FALSE"}
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+)(?:[eE][-+]?[0-9]+)?")


@dataclass(frozen=True, order=True)
class Mark:
    """A 1-based line and column in the source file."""

    line: int
    column: int


@dataclass(frozen=True)
class Problem:
    """Something wrong with the YAML itself (as opposed to its content)."""

    message: str
    mark: Mark
    rule: str


class Node:
    """One node of the tree: a scalar, a mapping or a sequence, with its position."""

    __slots__ = ("kind", "mark", "raw", "scalar", "pairs", "items", "weight")

    def __init__(self, kind: str, mark: Mark) -> None:
        self.kind = kind  # "scalar" | "map" | "seq"
        self.mark = mark
        self.raw = ""  # source text of a scalar
        self.scalar: JSON = None
        self.pairs: dict[str, tuple[Node, Node]] = {}  # mapping: key -> (key node, value node)
        self.items: list[Node] = []  # sequence items
        self.weight = 1  # number of nodes once aliases are expanded


class _FatalError(Exception):
    def __init__(self, message: str, mark: Mark, rule: str) -> None:
        super().__init__(message)
        self.problem = Problem(message, mark, rule)


@dataclass
class Document:
    """A parsed YAML file: its value, its node tree and the problems found while reading it."""

    path: str
    root: Node | None
    value: JSON
    problems: list[Problem]

    @property
    def empty(self) -> bool:
        return self.root is None or (self.root.kind == "scalar" and self.root.scalar is None)

    def node_at(self, path: Sequence[str | int]) -> Node | None:
        """The deepest node reachable along `path` (a JSON-pointer-like list of keys/indexes)."""
        node = self.root
        for part in path:
            if node is None:
                return None
            nxt: Node | None = None
            if node.kind == "map" and isinstance(part, str) and part in node.pairs:
                nxt = node.pairs[part][1]
            elif node.kind == "seq" and isinstance(part, int) and 0 <= part < len(node.items):
                nxt = node.items[part]
            if nxt is None:
                return node
            node = nxt
        return node

    def mark_at(self, path: Sequence[str | int]) -> Mark:
        node = self.node_at(path)
        return node.mark if node is not None else Mark(1, 1)

    def key_mark(self, path: Sequence[str | int], key: str) -> Mark:
        """The position of `key` inside the mapping at `path` (the mapping's own if absent)."""
        node = self.node_at(path)
        if node is not None and node.kind == "map" and key in node.pairs:
            return node.pairs[key][0].mark
        return node.mark if node is not None else Mark(1, 1)

    def raw_at(self, path: Sequence[str | int]) -> str | None:
        """Source text of the scalar at `path`, as written (before resolution)."""
        node = self.node_at(path)
        if node is None or node.kind != "scalar":
            return None
        return node.raw


def resolve_plain(text: str) -> JSON:
    """YAML 1.2 core-schema resolution of a plain (unquoted) scalar, minus infinities and NaN."""
    if text in _NULL:
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text) and not (len(text.lstrip("+-")) > 1 and text.lstrip("+-")[0] == "0"
                                        and text.lstrip("+-")[1].isdigit()):
        return float(text)
    return text


_YAML11_BOOL = {"y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
                "on", "On", "ON", "off", "Off", "OFF"}


def yaml11_reading(text: str) -> str | None:
    """How a YAML 1.1 loader (PyYAML, many editors) would misread a plain scalar, if it would."""
    if text in _YAML11_BOOL:
        value = text.lower() in {"y", "yes", "on"}
        return f"a boolean ({str(value).lower()})"
    if re.fullmatch(r"[-+]?0[0-7]+", text):
        return f"octal {int(text, 8)}"
    if re.fullmatch(r"[-+]?0x[0-9a-fA-F_]+", text):
        return "a hexadecimal number"
    if re.fullmatch(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+", text):
        return "a sexagesimal (base 60) number"
    if re.fullmatch(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?", text):
        return "a date"
    if re.fullmatch(r"[-+]?[0-9][0-9_]*_[0-9_]*", text):
        return "a number with the underscores dropped"
    return None


def _resolve_number_checked(text: str, mark: Mark) -> JSON:
    """resolve_plain, refusing a number beyond what a fleet file can mean: an integer of more than
    MAX_INT_DIGITS digits (Python itself refuses more than 4,300 with a ValueError) or a float that
    would be infinity."""
    digits = len(text.lstrip("+-"))
    if digits > MAX_INT_DIGITS and _INT.fullmatch(text):
        raise _FatalError(f"an integer of {digits:,} digits; a fleet file's integers have at most "
                          f"{MAX_INT_DIGITS} (quote it if it is meant as a string)", mark, "yaml-number-too-large")
    value = resolve_plain(text)
    if isinstance(value, float) and math.isinf(value):
        shown = f"{text[:40]}..." if len(text) > 40 else text
        raise _FatalError(f"{shown} is a number too large for a float (it would read as infinity)", mark,
                          "yaml-number-too-large")
    return value


def _mark(event: Any) -> Mark:
    return Mark(event.start_mark.line + 1, event.start_mark.column + 1)


def _events(data: str) -> Iterator[Any]:
    loader = _EventLoader(data)
    try:
        while loader.check_event():
            yield loader.get_event()
    finally:
        loader.dispose()


class _Builder:
    """Turns the event stream into a Node tree, checking limits as it goes."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.anchors: dict[str, Node] = {}
        # Each open collection: (node, anchor, key node waiting for its value).
        self.stack: list[tuple[Node, str | None, list[Node | None]]] = []
        self.root: Node | None = None
        self.documents = 0

    def build(self, data: str) -> Node | None:
        for event in _events(data):
            self._event(event)
        return self.root

    def _event(self, event: Any) -> None:
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise _FatalError("more than one YAML document in this file; keep one", _mark(event),
                             "yaml-multiple-documents")
        elif isinstance(event, yaml.ScalarEvent):
            self._add(self._scalar(event), event.anchor)
        elif isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor or "")
            if target is None:
                raise _FatalError(f"alias *{event.anchor} refers to no anchor defined before it", _mark(event),
                             "yaml-syntax")
            self._attach(target)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            is_map = isinstance(event, yaml.MappingStartEvent)
            if len(self.stack) >= MAX_DEPTH:
                raise _FatalError(f"nesting deeper than {MAX_DEPTH} levels", _mark(event), "yaml-too-deep")
            allowed = _MAP_TAGS if is_map else _SEQ_TAGS
            if event.tag not in allowed:
                self.problems.append(Problem(f"YAML tag {event.tag} is not allowed in fleet files",
                                             _mark(event), "yaml-tag"))
            self.stack.append((Node("map" if is_map else "seq", _mark(event)), event.anchor, [None]))
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            node, anchor, _ = self.stack.pop()
            self._add(node, anchor)

    def _scalar(self, event: Any) -> Node:
        node = Node("scalar", _mark(event))
        node.raw = event.value
        if event.tag not in (None, "!", _STR_TAG):
            self.problems.append(Problem(f"YAML tag {event.tag} is not allowed in fleet files",
                                         node.mark, "yaml-tag"))
        plain = not event.style and event.tag is None  # libyaml reports plain style as ""
        node.scalar = _resolve_number_checked(event.value, node.mark) if plain else event.value
        return node

    def _add(self, node: Node, anchor: str | None) -> None:
        if anchor is not None:
            self.anchors[anchor] = node
        self._attach(node)

    def _attach(self, node: Node) -> None:
        if not self.stack:
            self.root = node
            return
        parent, _, pending = self.stack[-1]
        parent.weight += node.weight
        if parent.weight > MAX_NODES:
            raise _FatalError(f"this file expands to more than {MAX_NODES:,} nodes (anchors and aliases "
                         "multiplying?); fleet files must stay small", node.mark, "yaml-too-large")
        if parent.kind == "seq":
            parent.items.append(node)
            return
        key = pending[0]
        if key is None:
            pending[0] = node
            return
        pending[0] = None
        self._pair(parent, key, node)

    def _pair(self, parent: Node, key: Node, value: Node) -> None:
        if key.kind != "scalar":
            self.problems.append(Problem("mapping keys must be plain strings, not collections",
                                         key.mark, "yaml-key-type"))
            return
        if key.raw == "<<" and key.scalar == "<<":
            self.problems.append(Problem("merge keys (<<) are YAML 1.1 only and not supported; write "
                                         "the keys out", key.mark, "yaml-merge-key"))
            return
        if not isinstance(key.scalar, str):
            kind = "null" if key.scalar is None else type(key.scalar).__name__
            self.problems.append(Problem(f"mapping key {key.raw!r} reads as {kind}; keys must be strings: "
                                         f"quote it ('{key.raw}')", key.mark, "yaml-key-type"))
            return
        first = parent.pairs.get(key.scalar)
        if first is not None:
            self.problems.append(Problem(f"duplicate key {key.scalar!r} (first defined at line "
                                         f"{first[0].mark.line}); YAML keeps only one of them",
                                         key.mark, "yaml-duplicate-key"))
            return
        parent.pairs[key.scalar] = (key, value)


def _construct(node: Node, cache: dict[int, JSON]) -> JSON:
    if node.kind == "scalar":
        return node.scalar
    cached = cache.get(id(node))
    if cached is not None:
        return cached
    value: JSON
    if node.kind == "map":
        value = {k: _construct(v, cache) for k, (_, v) in node.pairs.items()}
    else:
        value = [_construct(item, cache) for item in node.items]
    cache[id(node)] = value
    return value


def _tab_at(data: str, mark: Any) -> bool:
    """Whether the parser stopped on a tab (it says "found character that cannot start any token")."""
    if mark is None:
        return False
    lines = data.split("\n")
    line = lines[mark.line] if 0 <= mark.line < len(lines) else ""
    return 0 <= mark.column < len(line) and line[mark.column] == "\t"


def load(data: str | bytes, path: str) -> Document:
    """Parse one YAML file strictly. Never raises for bad input: problems are in the result."""
    if len(data) > MAX_BYTES:
        return Document(path, None, None, [Problem(
            f"file is {len(data):,} bytes; the limit is {MAX_BYTES:,}", Mark(1, 1), "yaml-too-large")])
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Document(path, None, None, [Problem(
                f"not UTF-8 text (byte {exc.start})", Mark(1, 1), "yaml-encoding")])
    builder = _Builder()
    try:
        root = builder.build(data)
    except _FatalError as fatal:
        return Document(path, None, None, [*builder.problems, fatal.problem])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Mark(mark.line + 1, mark.column + 1) if mark is not None else Mark(1, 1)
        message = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        if _tab_at(data, mark) or "tab character" in message:
            message = ("a tab character: YAML indents with spaces only; replace the tab with spaces "
                       f"(the parser: {message})")
        return Document(path, None, None, [*builder.problems, Problem(
            f"YAML syntax error: {message}", where, "yaml-syntax")])
    except yaml.YAMLError as exc:  # reader errors: control characters and the like
        return Document(path, None, None, [*builder.problems, Problem(
            f"YAML error: {exc}", Mark(1, 1), "yaml-syntax")])
    value = _construct(root, {}) if root is not None else None
    return Document(path, root, value, builder.problems)
