"""Read untrusted YAML with YAML 1.2 core-schema semantics, on top of PyYAML's parser.

PyYAML implements YAML 1.1, whose implicit typing surprises people who write `tau.yaml`
from memory: `on`, `yes` and `off` become booleans (so `retry: {on: [AppError]}` would
silently turn into the key `True`), `1:30` becomes the sexagesimal integer 90, `010` is
octal and `2024-01-01` a date. The 1.2 core schema keeps all of those strings. This module
reuses PyYAML's scanner, parser and composer (they are version-neutral) and replaces the
resolver and the constructor:

- the resolver knows only the 1.2 core patterns (null, bool, int, float);
- the constructor builds plain dicts, lists and scalars from the node graph itself, so it
  can reject duplicate keys (naming the key, its path and both lines), any tag outside the
  core schema (`!!python/object`, `!custom`, `!!binary`, `!!timestamp` ...), and 1.1's merge
  key `<<` is just a string key, as 1.2 says;
- aliases are counted and their expansion is measured before anything is built, so an alias
  bomb ("billion laughs") is refused with a clear error instead of eating memory, and nesting
  depth is capped so that a megabyte of `[` cannot exhaust Python's recursion limit.

Pure: no I/O; the caller decodes bytes (UTF-8) and enforces the size limit.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import yaml
from yaml import composer, nodes, parser, reader, resolver, scanner

from shared import jsonsafe

MAX_ALIASES = 100
"""Most alias uses (`*name`) in one document; a tau.yaml needs a handful at most."""

MAX_NODES = 10_000
"""Most nodes in the document, counted while it is composed (so a megabyte of `[a, a, …]`
stops early instead of costing seconds of CPU first) and again with every alias expanded
(which stops exponential alias bombs). A tau.yaml has a few hundred at most."""

MAX_INT_DIGITS = jsonsafe.MAX_INT_DIGITS
"""Most digits of an integer; a longer one (or `int()` past CPython's 4,300-digit limit) is
refused, quote it to mean text."""

MAX_DEPTH = 50
"""Deepest nesting of collections, aliases expanded; tau.yaml is four levels deep."""

_TAG_PREFIX = "tag:yaml.org,2002:"
TAG_NULL = _TAG_PREFIX + "null"
TAG_BOOL = _TAG_PREFIX + "bool"
TAG_INT = _TAG_PREFIX + "int"
TAG_FLOAT = _TAG_PREFIX + "float"
TAG_STR = _TAG_PREFIX + "str"
TAG_SEQ = _TAG_PREFIX + "seq"
TAG_MAP = _TAG_PREFIX + "map"

_NULL_RE = re.compile(r"(?:~|null|Null|NULL|)\Z")
_BOOL_RE = re.compile(r"(?:true|True|TRUE|false|False|FALSE)\Z")
_INT_DEC_RE = re.compile(r"[-+]?[0-9]+\Z")
_INT_OCT_RE = re.compile(r"0o[0-7]+\Z")
_INT_HEX_RE = re.compile(r"0x[0-9a-fA-F]+\Z")
_INT_RE = re.compile(r"(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)\Z")
_FLOAT_NUM_RE = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?\Z")
_FLOAT_INF_RE = re.compile(r"[-+]?\.(?:inf|Inf|INF)\Z")
_FLOAT_NAN_RE = re.compile(r"\.(?:nan|NaN|NAN)\Z")
_FLOAT_RE = re.compile(
    r"(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)


class YamlError(ValueError):
    """The document is not YAML we accept; `path` and `line` locate it where known."""

    def __init__(self, message: str, *, path: str = "", line: int | None = None) -> None:
        self.message = message
        self.path = path
        self.line = line
        where = f" (line {line})" if line is not None else ""
        super().__init__(f"{message}{where}")


class _CoreResolver(resolver.BaseResolver):
    """Implicit typing of plain scalars per the YAML 1.2 core schema, and nothing else."""


# The order matters: PyYAML takes the first match, and the float pattern matches integers.
_CoreResolver.add_implicit_resolver(TAG_NULL, _NULL_RE, ["~", "n", "N", ""])
_CoreResolver.add_implicit_resolver(TAG_BOOL, _BOOL_RE, list("tTfF"))
_CoreResolver.add_implicit_resolver(TAG_INT, _INT_RE, list("-+0123456789"))
_CoreResolver.add_implicit_resolver(TAG_FLOAT, _FLOAT_RE, list("-+.0123456789"))


class _CountingComposer(composer.Composer):
    """PyYAML's composer with a cap on alias uses and on nesting depth."""

    def __init__(self) -> None:
        super().__init__()
        self._alias_count = 0
        self._depth = 0
        self._nodes = 0

    if TYPE_CHECKING:  # provided by the parser half of the loader; the stubs omit them

        def check_event(self, *choices: type[yaml.Event]) -> bool: ...
        def peek_event(self) -> yaml.Event: ...
        def dispose(self) -> None: ...

    def compose_node(self, parent: nodes.Node | None, index: int) -> nodes.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._alias_count += 1
            if self._alias_count > MAX_ALIASES:
                event = self.peek_event()
                raise YamlError(
                    f"too many aliases: at most {MAX_ALIASES} `*alias` uses are allowed",
                    line=_mark_line(event.start_mark),
                )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            event = self.peek_event()
            msg = f"document too large: more than {MAX_NODES} nodes"
            raise YamlError(msg, line=_mark_line(event.start_mark))
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()
                raise YamlError(
                    f"nesting too deep: at most {MAX_DEPTH} levels are allowed",
                    line=_mark_line(event.start_mark),
                )
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        return node


class _PureLoader(reader.Reader, scanner.Scanner, parser.Parser, _CountingComposer, _CoreResolver):
    """Everything PyYAML needs to turn text into one node graph; no constructor on purpose."""

    def __init__(self, text: str) -> None:
        reader.Reader.__init__(self, text)
        scanner.Scanner.__init__(self)
        parser.Parser.__init__(self)
        _CountingComposer.__init__(self)
        _CoreResolver.__init__(self)


if yaml.__with_libyaml__:
    from yaml import _yaml

    class _FastLoader(_CountingComposer, _yaml.CParser, _CoreResolver):
        """libyaml scans and parses (about 8x faster); our composer still builds the nodes.

        The Python composer comes first in the MRO so that alias counting and the depth cap
        apply; libyaml's own composer is never used.
        """

        def __init__(self, text: str) -> None:
            _yaml.CParser.__init__(self, text)
            _CountingComposer.__init__(self)
            _CoreResolver.__init__(self)

    HAVE_LIBYAML = True
else:  # pragma: no cover - the locked environment has libyaml
    HAVE_LIBYAML = False


def load(text: str, *, fast: bool = True) -> Any:
    """Parse one YAML document into dicts, lists, str, int, float, bool and None.

    Raises `YamlError` for syntax errors, several documents, duplicate keys, tags outside the
    core schema, recursive aliases and alias bombs. An empty document is `None`. `fast`
    uses libyaml's scanner when PyYAML was built with it; the result is the same either way.
    """
    try:
        loader: _CountingComposer = (
            _FastLoader(text) if fast and HAVE_LIBYAML else _PureLoader(text)
        )
    except yaml.YAMLError as err:
        raise YamlError(f"invalid YAML: {err}") from err
    try:
        root = loader.get_single_node()
    except YamlError:
        raise
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        words = [part for part in (err.context, err.problem) if part]
        raise YamlError(f"invalid YAML: {'; '.join(words) or 'syntax error'}", line=line) from err
    except yaml.YAMLError as err:
        raise YamlError(f"invalid YAML: {err}") from err
    finally:
        loader.dispose()
    if root is None:
        return None
    _measure(root, {}, set())
    return _construct(root, "")


def _mark_line(mark: object) -> int | None:
    line = getattr(mark, "line", None)
    return line + 1 if isinstance(line, int) else None


def _line(node: nodes.Node) -> int:
    return int(node.start_mark.line) + 1


def _measure(node: nodes.Node, sizes: dict[int, tuple[int, int]], active: set[int]) -> None:
    """Fill `sizes[id(node)]` with (expanded node count, expanded depth); refuse bombs.

    Memoised on node identity, so the walk is linear in the composed graph even when the
    expanded tree is exponential; `active` holds the nodes on the current path, which finds
    an alias that refers to its own ancestor (a cycle).
    """
    key = id(node)
    if key in sizes:
        return
    if key in active:
        raise YamlError("recursive alias: an alias refers to its own parent", line=_line(node))
    active.add(key)
    count, depth = 1, 1
    children: list[nodes.Node] = []
    if isinstance(node, nodes.SequenceNode):
        children = list(node.value)
    elif isinstance(node, nodes.MappingNode):
        for k, v in node.value:
            children.extend((k, v))
    for child in children:
        _measure(child, sizes, active)
        child_count, child_depth = sizes[id(child)]
        count += child_count
        depth = max(depth, child_depth + 1)
    active.discard(key)
    if count > MAX_NODES:
        raise YamlError(
            f"document too large once aliases are expanded: more than {MAX_NODES} nodes"
            " (an alias bomb?)",
            line=_line(node),
        )
    if depth > MAX_DEPTH:
        raise YamlError(
            f"nesting too deep once aliases are expanded: at most {MAX_DEPTH} levels",
            line=_line(node),
        )
    sizes[key] = (count, depth)


def _describe_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_TAG_PREFIX) if tag.startswith(_TAG_PREFIX) else tag


def _child_path(path: str, key: object) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _construct(node: nodes.Node, path: str) -> Any:
    if isinstance(node, nodes.ScalarNode):
        return _construct_scalar(node, path)
    if isinstance(node, nodes.SequenceNode):
        if node.tag != TAG_SEQ:
            raise _bad_tag(node, path)
        return [_construct(item, _child_path(path, i)) for i, item in enumerate(node.value)]
    if isinstance(node, nodes.MappingNode):
        if node.tag != TAG_MAP:
            raise _bad_tag(node, path)
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, nodes.ScalarNode):
                raise YamlError(
                    "a mapping key must be a plain value, not a list or a mapping",
                    path=path,
                    line=_line(key_node),
                )
            key = _construct_scalar(key_node, path)
            if key in first_line:
                raise YamlError(
                    f"duplicate key {key!r} (first at line {first_line[key]})",
                    path=_child_path(path, key),
                    line=_line(key_node),
                )
            first_line[key] = _line(key_node)
            result[key] = _construct(value_node, _child_path(path, key))
        return result
    raise YamlError(f"unexpected YAML node {type(node).__name__}", path=path)


def _bad_tag(node: nodes.Node, path: str) -> YamlError:
    return YamlError(
        f"tag {_describe_tag(node.tag)} is not allowed; only the YAML 1.2 core types are"
        " (str, int, float, bool, null, seq, map)",
        path=path,
        line=_line(node),
    )


def _construct_scalar(node: nodes.ScalarNode, path: str) -> Any:
    value: str = node.value
    tag = node.tag
    if tag == TAG_STR:
        return value
    if tag == TAG_NULL and _NULL_RE.match(value):
        return None
    if tag == TAG_BOOL and _BOOL_RE.match(value):
        return value.lower() == "true"
    if tag == TAG_INT and _INT_RE.match(value):
        return _parse_int(value, path, _line(node))
    if tag == TAG_FLOAT and (_FLOAT_RE.match(value) or _INT_RE.match(value)):
        if _FLOAT_NAN_RE.match(value):
            return math.nan
        if _FLOAT_INF_RE.match(value):
            return -math.inf if value.startswith("-") else math.inf
        if _FLOAT_NUM_RE.match(value):
            return float(value)
        return float(_parse_int(value, path, _line(node)))
    if tag in {TAG_NULL, TAG_BOOL, TAG_INT, TAG_FLOAT}:
        raise YamlError(
            f"{value!r} is not a valid {_describe_tag(tag)}", path=path, line=_line(node)
        )
    raise _bad_tag(node, path)


def _parse_int(value: str, path: str = "", line: int | None = None) -> int:
    digits = value.lstrip("+-").removeprefix("0o").removeprefix("0x")
    if len(digits) > MAX_INT_DIGITS:
        msg = (
            f"a number of {len(digits)} digits; at most {MAX_INT_DIGITS} are read (quote it to"
            " pass it as text)"
        )
        raise YamlError(msg, path=path, line=line)
    if _INT_OCT_RE.match(value):
        return int(value, 0)
    if _INT_HEX_RE.match(value):
        return int(value, 0)
    return int(value, 10)
