"""The config schema: frozen dataclasses are the only statement of a field, and one walker reads them.

A section of an experiment's config (``config.loop``, ``config.rollout``...) is a frozen
dataclass: each field's name, type, default and one-line doc live there, and :func:`setting`
adds its range or choices. Two generic functions use them and nothing else:

  - :func:`load` reads a section from config data: an unknown field (with the closest name),
    a missing required field, a wrong type and an out-of-range value each raise one
    :class:`ConfigError` line naming the field's path (``config.loop.max_len: expected an
    int >= 1, got 0``). Fields absent from an older config take their default.
  - :func:`to_config` builds the section's ``ConfigDict`` from the defaults and a few values
    (``configs/common.py``), so a builder never restates a default.

Checks that relate two fields, or look outside the config (files, registries), stay with the
loader that knows them (:mod:`rl.config.settings`); a dataclass's own ``__post_init__`` may
check more when it is built directly, and its ``ValueError`` is reported at the field's path.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections as mlc

from rl.config.errors import ConfigError, need, need_at, unknown_field_message

_CHECKS = ("low", "high", "choices", "expected", "check")


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | Any = dataclasses.MISSING,
    low: float | None = None,
    high: float | None = None,
    choices: Iterable[Any] | Callable[[], Iterable[Any]] | None = None,
    expected: str | None = None,
    check: Callable[[Any], bool] | None = None,
    derived: bool = False,
) -> Any:
    """A dataclass field with its range: ``low``/``high`` (inclusive), ``choices`` (a tuple, or a
    function returning a registry's names), or ``check`` with ``expected`` saying what it wants.
    ``derived``: the loader computes it; no config sets it."""
    meta = {k: v for k, v in zip(_CHECKS, (low, high, choices, expected, check), strict=True) if v is not None}
    meta.update({"derived": True} if derived else {})
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


def increasing_ints(default: tuple[int, ...], *, allow_empty: bool = False) -> Any:
    """A field of shape buckets (a sampler's, an engine's): a tuple of increasing ints >= 1, non-empty
    unless ``allow_empty`` (an empty one is then derived by whoever reads it)."""
    return setting(
        default,
        check=lambda b: (
            (not b and allow_empty) or (bool(b) and b[0] >= 1 and all(a < c for a, c in itertools.pairwise(b)))
        ),
        expected="increasing ints >= 1" + (", or [] (derived)" if allow_empty else ""),
    )


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _kind(hint: Any) -> str:
    """What a value of ``hint`` is called in an error: ``an int``, ``a number``..."""
    return {bool: "True or False", int: "an int", float: "a number", str: "a string"}.get(hint, str(hint))


def _bounds(kind: str, meta: Mapping[str, Any]) -> str:
    low, high = meta.get("low"), meta.get("high")
    if low is not None and high is not None:
        return f"{kind} in [{low}, {high}]"
    return f"{kind} >= {low}" if low is not None else f"{kind} <= {high}" if high is not None else kind


def _expected(hint: Any, meta: Mapping[str, Any]) -> str:
    if "expected" in meta:
        return meta["expected"]
    if "choices" in meta:
        return f"one of {_choices(meta)!r}"
    return _bounds(_kind(hint), meta)


def _choices(meta: Mapping[str, Any]) -> Any:
    choices = meta["choices"]
    return sorted(choices()) if callable(choices) else choices


def _in_range(value: Any, meta: Mapping[str, Any]) -> bool:
    if "low" in meta and not value >= meta["low"]:
        return False
    if "high" in meta and not value <= meta["high"]:
        return False
    if "choices" in meta and value not in _choices(meta):
        return False
    return "check" not in meta or bool(meta["check"](value))


def _value(value: Any, hint: Any, meta: Mapping[str, Any], path: str) -> Any:
    """``value`` checked against the field's type and range (errors name ``path``), in the dataclass's form."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else load(hint, value, path.removeprefix("config."))
    if origin is tuple:
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, args[0]) for v in value)
        need_at(ok and _in_range(tuple(value), meta), path, meta.get("expected", f"a list of {_kind(args[0])}s"), value)
        return tuple(value)
    if origin is not None and issubclass(origin, Mapping):
        need_at(isinstance(value, Mapping), path, meta.get("expected", "a mapping"), value)
        inner = args[1] if args else Any
        if dataclasses.is_dataclass(inner):
            return types.MappingProxyType({k: _value(v, inner, {}, f"{path}.{k}") for k, v in value.items()})
        return types.MappingProxyType({k: dict(v) if isinstance(v, Mapping) else v for k, v in value.items()})
    typed = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: _is_real(value),
        str: isinstance(value, str),
    }.get(hint, True)
    need_at(typed and _in_range(value, meta), path, _expected(hint, meta), value)
    return value


def need_field(ok: bool, obj: Any, name: str, expected: str) -> None:
    """A check relating fields of a dataclass built directly: ``Type.name: expected ..., got <its value>``
    (``name`` may be dotted: ``loss.aggregation``)."""
    value = obj
    for part in name.split("."):
        value = getattr(value, part)
    need_at(ok, f"{type(obj).__name__}.{name}", expected, value)


def validate(obj: Any) -> None:
    """Checks every field of dataclass ``obj`` against its type and range, as :func:`load` does, for a
    dataclass built directly (call it from ``__post_init__``): ``LearnerConfig.b2: expected ...``.
    A tuple field given as a list is stored as the tuple (a frozen dataclass stays hashable)."""
    cls = type(obj)
    hints = typing.get_type_hints(cls)
    for name, f in fields(cls).items():
        value, hint, path = getattr(obj, name), hints[name], f"{cls.__name__}.{name}"
        if dataclasses.is_dataclass(hint):  # built directly: a section is its dataclass, not config data
            need_at(isinstance(value, hint), path, f"a {hint.__module__}.{hint.__name__}", value)
        checked = _value(value, hint, f.metadata, path)
        if isinstance(value, list) and isinstance(checked, tuple):
            object.__setattr__(obj, name, checked)


def fields(cls: type, *, only: Iterable[str] | None = None) -> dict[str, dataclasses.Field]:
    """The config fields of ``cls`` (all of them, or those in ``only``), in declaration order."""
    keep = None if only is None else set(only)
    return {
        f.name: f
        for f in dataclasses.fields(cls)
        if f.init and not f.metadata.get("derived") and (keep is None or f.name in keep)
    }


def check_keys(node: Any, where: str, known: Iterable[str], required: Iterable[str] = ()) -> dict[str, Any]:
    """``node`` as a dict: a section (a mapping) whose keys are among ``known``, with every ``required`` one."""
    path = (lambda key: f"{where}.{key}") if where else str
    need(isinstance(node, Mapping), where or "<top>", "a section (see configs/common.py)", node)
    known = list(known)
    for key in node:
        if key not in known:
            raise ConfigError(unknown_field_message(path(key), known))
    for key in required:
        if key not in node:
            raise ConfigError(f"config.{path(key)}: missing; build the config with configs/common.py")
    return dict(node)


def values(
    cls: type, node: Any, where: str, *, only: Iterable[str] | None = None, required: Iterable[str] = ()
) -> dict[str, Any]:
    """The checked values of section ``where`` for the fields of ``cls`` (or ``only`` those): absent
    ones are left out, so the dataclass's default applies; ``required`` ones must be present."""
    known = fields(cls, only=only)
    needed = [
        n for n, f in known.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    node = check_keys(node, where, known, [*needed, *required])
    hints = typing.get_type_hints(cls)
    return {k: _value(v, hints[k], known[k].metadata, f"config.{where}.{k}") for k, v in node.items()}


def load(cls: type, node: Any, where: str, *, only: Iterable[str] | None = None, **extra: Any) -> Any:
    """``cls(**values, **extra)``: the section ``where`` read and checked; a ``ValueError`` of the
    dataclass's own checks is reported at the field's config path."""
    checked = values(cls, node, where, only=only)
    try:
        return cls(**checked, **extra)
    except (TypeError, ValueError) as exc:  # the dataclass's own checks: named by the field's config path
        raise ConfigError(re.sub(rf"^{cls.__name__}\.", f"config.{where}.", str(exc))) from exc


def _data(value: Any) -> Any:
    """Config data of a default: dataclasses and mappings as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value):
        return {name: _data(getattr(value, name)) for name in fields(type(value))}
    if isinstance(value, Mapping):
        return {k: _data(v) for k, v in value.items()}
    return list(value) if isinstance(value, tuple) else value


def defaults(cls: type, *, only: Iterable[str] | None = None) -> dict[str, Any]:
    """The default of every field of ``cls`` that has one, as config data."""
    out, hints = {}, typing.get_type_hints(cls)
    for name, f in fields(cls, only=only).items():
        if f.default is None and any(dataclasses.is_dataclass(a) for a in typing.get_args(hints[name])):
            continue  # an optional sub-section (``model.lora``) is absent until a config sets it
        if f.default is not dataclasses.MISSING:
            out[name] = _data(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[name] = _data(f.default_factory())
    return out


def to_config(cls: type, *, only: Iterable[str] | None = None, **values: Any) -> mlc.ConfigDict:
    """Section ``cls`` as a ``ConfigDict``: its defaults, with ``values`` set (each a field of ``cls``)."""
    known = fields(cls, only=only)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise TypeError(f"{cls.__name__}: no field {unknown[0]!r}; fields: {list(known)}")
    return mlc.ConfigDict({**defaults(cls, only=only), **{k: _data(v) for k, v in values.items()}})
