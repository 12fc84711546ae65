"""The subset of JSON Schema that tool parameters use, checked with model-readable messages.

Tool arguments come from model text, so a violation is feedback for the model
("missing required argument 'path'"), not an exception. Supported keywords:
``type`` (object, string, integer, number, boolean, array, null, or a list of
them), ``properties``, ``required``, ``additionalProperties: false``, ``enum``,
``minimum``/``maximum``, ``minLength``/``maxLength`` and ``items``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "null": (type(None),),
}


def _type_ok(value: Any, expected: str) -> bool:
    if expected not in _PY_TYPES:
        raise ValueError(f"schema: unsupported type {expected!r}; expected one of {sorted(_PY_TYPES)}")
    if isinstance(value, bool) and expected in ("integer", "number"):
        return False  # JSON true is not 1
    if expected == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PY_TYPES[expected])


def check_value(schema: Mapping[str, Any], value: Any, where: str) -> str | None:
    """Returns a message describing the first violation of ``schema`` by ``value``, or None."""
    expected = schema.get("type")
    if expected is not None:
        options = [expected] if isinstance(expected, str) else list(expected)
        if not any(_type_ok(value, t) for t in options):
            return f"{where} must be of type {' or '.join(options)}, got {type(value).__name__} {value!r:.60}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {list(schema['enum'])}, got {value!r:.60}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be <= {schema['maximum']}, got {value}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{where} must have at least {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where} must have at most {schema['maxLength']} characters, got {len(value)}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = check_value(schema["items"], item, f"{where}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict) and (schema.get("properties") or schema.get("required")):
        return validate_arguments(schema, value, where=where)
    return None


def validate_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any], *, where: str = "") -> str | None:
    """Checks tool ``arguments`` against an object schema; returns a message for the model or None."""
    prefix = f"{where}." if where else ""
    if not isinstance(arguments, Mapping):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = schema.get("properties", {})
    missing = [name for name in schema.get("required", ()) if name not in arguments]
    if missing:
        allowed = ", ".join(f"{n!r}" for n in properties) or "none"
        return f"missing required argument(s) {', '.join(repr(prefix + m) for m in missing)} (arguments: {allowed})"
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            allowed = ", ".join(f"{n!r}" for n in properties) or "none"
            return f"unknown argument(s) {', '.join(repr(prefix + u) for u in unknown)} (arguments: {allowed})"
    for name, value in arguments.items():
        if name in properties:
            problem = check_value(properties[name], value, f"argument {prefix + name!r}")
            if problem:
                return problem
    return None
