"""The record of one episode: every message and every tool call, for storage and replay.

The RL loop stores :meth:`Episode.to_dict` next to the token ids it trained on;
together they reconstruct a trajectory turn by turn (what the model wrote,
which tool ran with which arguments, what came back, how long it took, on
which sandbox image) and the verifier's breakdown at the end.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

TokenCounter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """~4 UTF-8 bytes per token: the default budget meter when no tokenizer is injected."""
    return math.ceil(len(text.encode("utf-8", errors="replace")) / 4)


@dataclasses.dataclass
class ToolCallRecord:
    """One tool call as executed. ``malformed`` calls (unparsable, unknown tool, arguments that
    break the schema) ran nothing; ``error`` says what went wrong either way."""

    turn: int
    index: int
    name: str
    arguments: dict[str, Any]
    output: str
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    error: str | None = None
    malformed: bool = False
    sandbox: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.exit_code in (None, 0)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["duration_s"] = round(self.duration_s, 6)
        return out


@dataclasses.dataclass
class Episode:
    """Everything that happened in one episode, JSON-serialisable via :meth:`to_dict`.

    ``end_reason`` is one of ``submit``, ``final_answer`` (a reply without a tool
    call, in domains where that is the answer), ``max_turns``, ``token_budget``
    or ``sandbox_error``.
    """

    env_id: str
    task_id: str
    domain: str
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    turns: int = 0
    tokens: int = 0
    answer: str | None = None
    submitted: bool = False
    end_reason: str | None = None
    sandbox: dict[str, Any] = dataclasses.field(default_factory=dict)
    started_at: float = dataclasses.field(default_factory=time.time)
    duration_s: float = 0.0

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def tool_time_s(self) -> float:
        return sum(c.duration_s for c in self.tool_calls)

    @property
    def malformed_calls(self) -> int:
        return sum(1 for c in self.tool_calls if c.malformed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "task_id": self.task_id,
            "domain": self.domain,
            "messages": copy.deepcopy(self.messages),
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "turns": self.turns,
            "tokens": self.tokens,
            "answer": self.answer,
            "submitted": self.submitted,
            "end_reason": self.end_reason,
            "sandbox": dict(self.sandbox),
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 6),
            "tool_time_s": round(self.tool_time_s, 6),
        }
