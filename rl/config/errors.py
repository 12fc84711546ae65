"""Config errors and the checks that raise them: one leaf module every config reader shares.

Each check raises :class:`ConfigError` with one line that names the field by its path
(``config.rollout.group_size: expected an int >= 2, got 1``), so a mistake stops a run
before anything starts. It imports nothing of the project: the settings loader and the
phase modules it reads sections for all import it, and it imports none of them (no circle).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A config field is wrong; the message names it (``config.rollout.group_size: ...``) and the fix."""


def need_at(cond: bool, path: str, expected: str, value: Any) -> None:
    """Raises ``<path>: expected <expected>, got <value>`` unless ``cond`` (``path``: ``config.loop.steps``,
    or ``LearnerConfig.b2`` for a dataclass built directly)."""
    if not cond:
        raise ConfigError(f"{path}: expected {expected}, got {value!r}")


def need(cond: bool, field: str, expected: str, value: Any) -> None:
    """Raises ``config.<field>: expected <expected>, got <value>`` unless ``cond``."""
    need_at(cond, f"config.{field}", expected, value)


def unknown_field_message(path: str, known: Iterable[Any], what: str = "field") -> str:
    """``config.rollout.group_sise: no such field; did you mean group_size?`` (or the ones there are);
    ``what`` names the kind of key (``"domain"``, ``"option of the source 'arithmetic'"``)."""
    name = path.rsplit(".", 1)[-1]
    known = sorted(str(k) for k in known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"expected one of {known}"
    return f"config.{path}: no such {what}; {hint}"
