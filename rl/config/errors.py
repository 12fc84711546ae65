"""Config errors and the checks that raise them: one leaf module every config reader shares.

Each check raises :class:`ConfigError` with one line that names the field by its path
(``config.rollout.group_size: expected an int >= 2, got 1``), so a mistake stops a run
before anything starts. It imports nothing of the project: the settings loader and the
phase modules it reads sections for all import it, and it imports none of them (no circle).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class ConfigError(ValueError):
    """A config field is wrong; the message names it (``config.rollout.group_size: ...``) and the fix."""


def need(cond: bool, field: str, expected: str, value: Any) -> None:
    """Raises ``config.<field>: expected <expected>, got <value>`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"config.{field}: expected {expected}, got {value!r}")


def need_int(value: Any, field: str, low: int = 0) -> int:
    need(isinstance(value, int) and not isinstance(value, bool) and value >= low, field, f"an int >= {low}", value)
    return value


def need_bool(value: Any, field: str) -> bool:
    need(isinstance(value, bool), field, "True or False", value)
    return value


def need_positive(value: Any, field: str) -> float:
    need(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, field, "a number > 0", value)
    return value


def unknown_field_message(path: str, known: Iterable[Any], what: str = "field") -> str:
    """``config.rollout.group_sise: no such field; did you mean group_size?`` (or the ones there are);
    ``what`` names the kind of key (``"domain"``, ``"option of the source 'arithmetic'"``)."""
    name = path.rsplit(".", 1)[-1]
    known = sorted(str(k) for k in known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"expected one of {known}"
    return f"config.{path}: no such {what}; {hint}"


def section(node: Any, where: str, known: tuple[str, ...], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """``node`` as a dict whose keys are among ``known``, each present unless ``optional``."""
    path = (lambda key: f"{where}.{key}") if where else str
    need(isinstance(node, Mapping), where or "<top>", "a section (see configs/common.py)", node)
    for key in node:
        if key not in known:
            raise ConfigError(unknown_field_message(path(key), known))
    missing = [k for k in known if k not in node and k not in optional]
    if missing:
        raise ConfigError(f"config.{path(missing[0])}: missing; build the config with configs/common.py")
    return dict(node)
