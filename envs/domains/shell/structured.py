"""Config files judged as config: parsed on the host, values compared at their keys.

A text check (``contains``/``regex``) on a config file passes a matching line
anywhere, e.g. ``port = 9090`` added to the wrong section, and says nothing about
the settings the task asked to keep or change. A ``config`` check instead parses
the file the way its program would (``format``: ini, json, yaml or toml) and
compares ``values``, a mapping from a dotted key (``section.key`` for INI,
``a.b.c`` for nested mappings) to the expected value. An INI value is compared
the way ``configparser`` would read it for the expected type: a boolean by
``getboolean``'s states (``off``/``false``/``0``/``no``), an integer as an
integer, anything else as the stripped string. A file that does not parse, a
duplicate section or key, or a missing key fails the check.
"""

from __future__ import annotations

import configparser
import json
import tomllib
from collections.abc import Mapping
from typing import Any

import yaml

FORMATS = ("ini", "json", "yaml", "toml")
_MISSING = object()


def parse_config(text: str, fmt: str) -> Any:
    """The parsed document; raises ValueError naming the format when ``text`` is not valid ``fmt``."""
    try:
        if fmt == "ini":
            parser = configparser.ConfigParser(strict=True, interpolation=None)
            parser.read_string(text)
            return parser
        if fmt == "json":
            return json.loads(text)
        if fmt == "yaml":
            return yaml.safe_load(text)
        if fmt == "toml":
            return tomllib.loads(text)
    except (configparser.Error, ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"not valid {fmt}: {str(exc)[:200]}") from None
    raise ValueError(f"format: expected one of {FORMATS}, got {fmt!r}")


def value_at(doc: Any, key: str, fmt: str) -> Any:
    """The value at dotted ``key`` of a parsed document, or ``_MISSING``."""
    if fmt == "ini":
        section, _, option = key.partition(".")
        if not doc.has_section(section) or not doc.has_option(section, option):
            return _MISSING
        return doc.get(section, option)
    node = doc
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _ini_equal(found: str, expected: Any) -> bool:
    text = found.strip()
    if isinstance(expected, bool):
        state = configparser.ConfigParser.BOOLEAN_STATES.get(text.lower())
        return state is expected
    if isinstance(expected, int):
        try:
            return int(text) == expected
        except ValueError:
            return False
    return text == str(expected)


def judge_config(c: Mapping[str, Any], obs: Mapping[str, Any]) -> tuple[bool, str]:
    """The verdict on a ``config`` check from the observed text of its file."""
    path, fmt = c["path"], c.get("format", "")
    if "text" not in obs:
        return False, f"{path}: {obs.get('read_error', 'content not observed')}"
    if obs.get("truncated"):
        return False, f"{path} is too large to parse as {fmt}"
    try:
        doc = parse_config(str(obs["text"]), fmt)
    except ValueError as exc:
        return False, f"{path}: {exc}"
    for key, expected in c["values"].items():
        found = value_at(doc, key, fmt)
        if found is _MISSING:
            return False, f"{path}: no setting {key!r}"
        same = _ini_equal(found, expected) if fmt == "ini" else (found == expected and type(found) is type(expected))
        if not same:
            return False, f"{path}: {key} is {found!r:.80}, expected {expected!r:.80}"
    return True, "ok"


def validate_config_check(check: Mapping[str, Any], where: str) -> None:
    """Raises ValueError naming ``where`` unless a ``config`` check has a known format and non-empty values."""
    if check.get("format") not in FORMATS:
        raise ValueError(f"{where}.format: expected one of {FORMATS}, got {check.get('format')!r}")
    values = check.get("values")
    if not isinstance(values, Mapping) or not values:
        raise ValueError(f"{where}.values: expected a non-empty mapping of dotted keys to values")
