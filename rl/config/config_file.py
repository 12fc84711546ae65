"""``config.json``: which experiment a workdir holds, read and compared field by field (no JAX).

A training run writes its resolved config there (:mod:`rl.run.experiment`); a
resumed run must hold the same one, and :mod:`rl.results` shows how runs'
configs differ. Both compare flat ``section.field`` paths, from here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"


def read_config(workdir: str | os.PathLike) -> dict[str, Any]:
    """The workdir's config as JSON data (``{}`` when it has none)."""
    path = Path(workdir) / CONFIG_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are kept whole, as JSON text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
    return out


def differing_fields(
    old: Mapping[str, Any], new: Mapping[str, Any], *, ignore: tuple[str, ...] = ()
) -> list[tuple[str, Any, Any]]:
    """``(field, old value, new value)`` for every flat field that differs (``"<unset>"`` where missing)."""
    a, b = flatten(old), flatten(new)
    fields = sorted(k for k in a.keys() | b.keys() if k not in ignore)
    return [(k, a.get(k, "<unset>"), b.get(k, "<unset>")) for k in fields if a.get(k, "<unset>") != b.get(k, "<unset>")]
