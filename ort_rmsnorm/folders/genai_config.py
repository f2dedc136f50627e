"""``genai_config.json``: read with bounds, and edited with the smallest change to the user's text.

- Bounds: a config over :data:`MAX_CONFIG_BYTES` is refused before it is read (real ones are a few KB), one nested
  deeper than :data:`MAX_NESTING` after parsing (JSON's parser stops far deeper, at Python's recursion limit, which is
  caught too), one holding an integer of more than :data:`MAX_INTEGER_DIGITS` digits as it is parsed. The text must
  be UTF-8.
- Keys are taken literally: a place in the config is a tuple of keys and list indices (:data:`ConfigPath`), never a
  dotted string parsed back (a key may hold ``.`` or ``[0]``); :func:`path_text` spells one for messages.
- Editing: :func:`insert_member` adds one member to one object of the text, after its last member, copying the
  whitespace and the ``:`` spacing its members have; every other byte stays as it was (indentation, key order,
  escapes, line endings), and nothing is parsed or written again beyond the objects on the way to it.
  :func:`insert_members` makes many such edits in one pass (a config with thousands of sections: linear time).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator, Union

MAX_CONFIG_BYTES = 64 * 2**20
MAX_NESTING = 64
MAX_INTEGER_DIGITS = 4300
"""Python's default limit for int <-> str conversion: an integer literal longer than this is refused as the text is
parsed (a real config's integers have a few digits), rather than failing wherever it is later converted."""

ConfigPath = tuple[Union[str, int], ...]
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHITESPACE = re.compile(r"[ \t\n\r]*")


class ConfigError(ValueError):
    """The config is not one this package reads; the message says why (without the file's name)."""


def _integer(text: str) -> int:
    """JSON's integer literal ``text`` as an int, bounded (:data:`MAX_INTEGER_DIGITS`, or the interpreter's own
    lower limit)."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_INTEGER_DIGITS:
        raise ConfigError(f"holds an integer of {digits} digits, over the {MAX_INTEGER_DIGITS} this command reads")
    try:
        return int(text)
    except ValueError:  # the interpreter's limit set lower (PYTHONINTMAXSTRDIGITS)
        raise ConfigError(f"holds an integer of {digits} digits, over what this interpreter converts") from None


_DECODER = json.JSONDecoder(parse_int=_integer)


def path_text(path: ConfigPath) -> str:
    """``model.decoder.pipeline[0]``; a key that is not an identifier is quoted: ``model["vision.x"]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _IDENTIFIER.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part)}]"
    return text


def parse(data: bytes) -> Any:
    """The config's value; :class:`ConfigError` for a config too large, not UTF-8, not JSON or nested too deep."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{len(data)} bytes, over the {MAX_CONFIG_BYTES >> 20} MiB this command reads")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        value = json.loads(text, parse_int=_integer)
    except RecursionError:
        raise ConfigError(f"nested deeper than the {MAX_NESTING} levels this command reads") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"not valid JSON: {error}") from None
    if nesting(value) > MAX_NESTING:
        raise ConfigError(f"nested deeper than the {MAX_NESTING} levels this command reads")
    return value


def nesting(value: Any) -> int:
    """How deep objects and lists nest in ``value`` (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_NESTING:  # deeper is refused anyway: stop counting there
            stack.extend((child, depth + 1) for child in children)
    return deepest


def strings(value: Any) -> set[str]:
    """Every string value in ``value`` (not the keys)."""
    found = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            found.add(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


_MISSING = object()


def get(value: Any, path: ConfigPath, default: Any = _MISSING) -> Any:
    """The value at ``path``; ``default`` (if given, else KeyError) where it is absent or the way holds a value of
    another kind."""
    node = value
    for part in path:
        if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and part in node:
            node = node[part]
        else:
            if default is _MISSING:
                raise KeyError(path_text(path))
            return default
    return node


# --- editing the text ---------------------------------------------------------------------------------------------


def _skip(text: str, index: int) -> int:
    return _WHITESPACE.match(text, index).end()


def _members(text: str, start: int) -> Iterator[tuple[str, int, int, int]]:
    """``(key, key start, value start, value end)`` of each member of the object at ``text[start] == "{"``."""
    index = _skip(text, start + 1)
    if text[index] == "}":
        return
    while True:
        key_start = index
        key, index = json.decoder.scanstring(text, index + 1)
        index = _skip(text, index) + 1  # the ":"
        value_start = _skip(text, index)
        _value, value_end = _DECODER.raw_decode(text, value_start)
        yield key, key_start, value_start, value_end
        index = _skip(text, value_end)
        if text[index] == "}":
            return
        index = _skip(text, index + 1)  # the ","


def _elements(text: str, start: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each element of the list at ``text[start] == "["``."""
    index = _skip(text, start + 1)
    if text[index] == "]":
        return
    while True:
        _value, end = _DECODER.raw_decode(text, index)
        yield index, end
        index = _skip(text, end)
        if text[index] == "]":
            return
        index = _skip(text, index + 1)


def locate(text: str, path: ConfigPath) -> int:
    """Where the value at ``path`` starts in ``text`` (valid JSON). A key present twice counts as JSON's parser
    counts it: the last one. KeyError where there is none."""
    index = _skip(text, 0)
    for part in path:
        found = None
        if isinstance(part, str) and text[index] == "{":
            for key, _key_start, value_start, _value_end in _members(text, index):
                if key == part:
                    found = value_start
        elif isinstance(part, int) and text[index] == "[":
            for position, (start, _end) in enumerate(_elements(text, index)):
                if position == part:
                    found = start
                    break
        if found is None:
            raise KeyError(path_text(path))
        index = found
    return index


def insert_member(text: str, path: ConfigPath, key: str, value: Any) -> tuple[str, int, str]:
    """``text`` with the member ``key: value`` added to the object at ``path`` (which must not have ``key``), after
    its last member and spaced as its members are; returns ``(new text, offset, inserted text)``: the new text is the
    old one with the inserted text at that offset, nothing else changed."""
    start = locate(text, path)
    if text[start] != "{":
        raise KeyError(path_text(path))
    offset, inserted = _insertion(text, start, key, value)
    return text[:offset] + inserted + text[offset:], offset, inserted


def insert_members(text: str, edits: list[tuple[ConfigPath, str, Any]]) -> str:
    """``text`` with each ``(path, key, value)`` of ``edits`` inserted as :func:`insert_member` inserts one (each
    ``path`` an object without ``key``, no path twice). One pass over the text finds every object, and the new text
    is joined once: linear in the text and the edits, where one :func:`insert_member` after another reads and copies
    the whole text for each."""
    wanted = {path[:length] for path, _key, _value in edits for length in range(len(path) + 1)}
    starts = _starts(text, wanted)
    insertions = []
    for path, key, value in edits:
        start = starts.get(path)
        if start is None or text[start] != "{":
            raise KeyError(path_text(path))
        insertions.append(_insertion(text, start, key, value))
    insertions.sort(key=lambda insertion: insertion[0])
    parts, previous = [], 0
    for offset, inserted in insertions:
        parts += [text[previous:offset], inserted]
        previous = offset
    parts.append(text[previous:])
    return "".join(parts)


def _starts(text: str, wanted: set[ConfigPath]) -> dict[ConfigPath, int]:
    """Where the value at each path of ``wanted`` (closed under prefixes) starts in ``text``, the last of a key
    present twice as in :func:`locate`; absent paths are left out. Only the containers on the way are entered."""
    starts: dict[ConfigPath, int] = {}
    stack = [((), _skip(text, 0))]
    while stack:
        path, index = stack.pop()
        starts[path] = index
        children: dict[Union[str, int], int] = {}
        if text[index] == "{":
            for key, _key_start, value_start, _value_end in _members(text, index):
                if (*path, key) in wanted:
                    children[key] = value_start
        elif text[index] == "[":
            for position, (element_start, _end) in enumerate(_elements(text, index)):
                if (*path, position) in wanted:
                    children[position] = element_start
        stack.extend(((*path, part), child) for part, child in children.items())
    return starts


def _insertion(text: str, start: int, key: str, value: Any) -> tuple[int, str]:
    """Where and what to insert for the member ``key: value`` of the object at ``text[start] == "{"``."""
    members = list(_members(text, start))
    encoded = json.dumps(value, ensure_ascii=False)
    if not members:  # {} or { }: the member goes right after the brace
        return start + 1, f"{json.dumps(key, ensure_ascii=False)}: {encoded}"
    # after the last member, separated and spaced as the members are
    _key, key_start, value_start, value_end = members[-1]
    if len(members) > 1:
        separator = text[members[-2][3]:key_start]
    else:
        separator = "," + _WHITESPACE.match(text, start + 1).group()
    colon = text[json.decoder.scanstring(text, key_start + 1)[1]:value_start]
    return value_end, f"{separator}{json.dumps(key, ensure_ascii=False)}{colon}{encoded}"
