"""Where SFT conversations come from: a domain's demonstrations, or a JSONL file (``sft.data``).

A config names its data: a demonstration source that an environment domain registers
(:mod:`envs.demonstrations`, e.g. ``"arithmetic"``; the domain knows what its tools print) or
``"jsonl:/path/conversations.jsonl"``. Rendering demonstrations needs the domains, so it lives with
the phases rather than in :mod:`rl.learning.sft`, which only encodes conversations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import envs  # noqa: F401 - registers the domains' demonstration sources
from envs.demonstrations import DEMONSTRATIONS, Conversation, demonstrations

JSONL = "jsonl:"


def sft_sources() -> list[str]:
    """What ``sft.data`` may name: the registered demonstration sources, or ``jsonl:PATH``."""
    return [*sorted(DEMONSTRATIONS), f"{JSONL}PATH"]


def is_sft_source(spec: str) -> bool:
    return isinstance(spec, str) and (spec.startswith(JSONL) or spec in DEMONSTRATIONS)


def load_sft_data(spec: str, options: Mapping[str, Any] | None = None) -> list[Conversation]:
    """The conversations of ``spec`` (see :func:`sft_sources`); ``options`` go to a demonstration source."""
    if not is_sft_source(spec):
        raise ValueError(f"sft.data: expected one of {sft_sources()}, got {spec!r}")
    if not spec.startswith(JSONL):
        return demonstrations(spec, options)
    path = Path(spec.removeprefix(JSONL))
    if not path.exists():
        raise FileNotFoundError(f"sft.data: {path} does not exist")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            record = json.loads(line)
            messages = record["messages"] if isinstance(record, dict) else record
            if not isinstance(messages, list):
                raise ValueError(f"{path}:{n}: expected a list of messages or {{'messages': [...]}}")
            out.append(messages)
    return out
