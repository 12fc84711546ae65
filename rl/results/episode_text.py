"""Episodes as text for a terminal or a notebook: turn by turn, or two side by side.

Everything shown comes from a model or a sandbox, so control characters are
escaped (a sampled byte can be a terminal escape) and long outputs are cut in
the middle, where they are least informative.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _clean(text: Any, max_chars: int) -> str:
    """Control characters escaped (a sampled byte can be a terminal escape) and long text cut in the middle."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    if len(text) > max_chars:
        cut = len(text) - max_chars
        text = f"{text[: max_chars // 2]}\n[... {cut} characters cut ...]\n{text[-max_chars // 2 :]}"
    return text


def final_answer(record: Mapping[str, Any]) -> str:
    """The last reply of an episode ('' if it never answered)."""
    turns = record.get("turns") or []
    if turns:
        return str(turns[-1].get("completion", ""))
    replies = [m.get("content", "") for m in record.get("messages", []) if m.get("role") == "assistant"]
    return replies[-1] if replies else ""  # runs written before turns were stored


def _tool_call_lines(call: Mapping[str, Any], max_chars: int) -> list[str]:
    exit_code = "—" if call.get("exit_code") is None else call.get("exit_code")
    flags = [f"exit {exit_code}", f"{float(call.get('duration_s') or 0.0) * 1000:.1f} ms"]
    flags += [flag for flag in ("timed_out", "malformed") if call.get(flag)]
    name = call.get("name") or "<unparsed>"
    lines = [f"  → tool call {name}({_clean(json.dumps(call.get('arguments', {})), max_chars)})  [{', '.join(flags)}]"]
    output = str(call.get("output", ""))
    if call.get("error") and str(call["error"]) not in output:
        output = f"error: {call['error']}\n{output}"
    return lines + ["    " + line for line in _clean(output, max_chars).splitlines()]


def format_episode(record: Mapping[str, Any], *, max_chars: int = 2000) -> str:
    """One episode turn by turn: prompt, each reply, its tool calls with outputs and exit codes, the verdict.

    ``record`` is a full record (:meth:`Run.episode` or :meth:`Run.records`); text longer
    than ``max_chars`` is cut in the middle.
    """
    if not isinstance(record, Mapping) or "task_id" not in record:
        raise TypeError(
            f"format_episode(record=): expected an episode record (Run.episode), got {type(record).__name__}"
        )
    v = record.get("verification") or {}
    where = f"{record.get('kind', 'train')} step {record.get('step')} row {record.get('row')}"
    out = [
        f"══ {record['task_id']} ({record.get('domain')}) · {where} · group {record.get('group')} #{record.get('index')}",
        f"reward {float(record.get('reward', 0.0)):.3f} · passed {record.get('passed')} · anomaly {record.get('anomaly')}"
        f" · end {record.get('end_reason')} · {record.get('num_turns')} turns · {record.get('num_tokens')} tokens"
        f" ({record.get('sampled_tokens')} sampled)",
    ]
    messages = list(record.get("messages", []))
    first_reply = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    for m in messages[:first_reply]:
        out += ["", f"[{m.get('role')}]", _clean(m.get("content", ""), max_chars)]
    turns = record.get("turns") or []
    calls_by_turn: dict[int, list[Mapping[str, Any]]] = {}
    for call in record.get("tool_calls") or []:  # stored once per episode, each with its turn (1-based)
        calls_by_turn.setdefault(int(call.get("turn") or 0), []).append(call)
    for i, turn in enumerate(turns, 1):
        out += ["", f"── turn {i} · assistant ({turn.get('tokens')} tokens, finish {turn.get('finish_reason')})"]
        out.append(_clean(turn.get("completion", ""), max_chars))
        for call in turn.get("tool_calls") or calls_by_turn.get(i, []):  # older runs kept a copy per turn
            out += _tool_call_lines(call, max_chars)
        observation = turn.get("observation")
        if isinstance(observation, str):  # what came back without a tool call (a corrective message)
            out += ["  [user] " + _clean(observation, max_chars)]
        for m in observation if isinstance(observation, list) else []:  # older runs: messages
            if m.get("role") != "tool":
                out += [f"  [{m.get('role')}] " + _clean(m.get("content", ""), max_chars)]
    if not turns:  # e.g. an episode whose reset failed: show whatever conversation there is
        out += [f"\n[{m.get('role')}]\n{_clean(m.get('content', ''), max_chars)}" for m in messages[first_reply:]]
    out += ["", f"══ verification by {v.get('verifier') or '?'}: reward {float(v.get('reward', 0.0)):.3f}, "]
    out[-1] += f"passed {v.get('passed')}, anomaly {v.get('anomaly')}"
    for name, value in (v.get("components") or {}).items():
        out.append(f"  {name:<16s} {value:.3f}")
    for key, detail in (v.get("details") or {}).items():
        if isinstance(detail, Mapping) and "verifier" in detail:  # a part of a weighted verifier
            head = f"{detail['verifier']}: reward {detail.get('reward')}, passed {detail.get('passed')}"
            key, detail = f"{key} <- {head}", detail.get("details", {})
        out.append(f"  {key}: " + _clean(json.dumps(detail, default=str), max_chars))
    return "\n".join(out)


def side_by_side(left: str, right: str, *, width: int = 60, titles: tuple[str, str] = ("A", "B")) -> str:
    """Two texts in two columns (each line wrapped at ``width``), for diffing answers by eye."""

    def wrap(text: str) -> list[str]:
        return [w for line in text.splitlines() for w in (textwrap.wrap(line, width) or [""])]

    a, b = wrap(left), wrap(right)
    rows = [f"{titles[0]:<{width}} │ {titles[1]}", f"{'─' * width}─┼─{'─' * width}"]
    rows += [
        f"{x:<{width}} │ {y}" for x, y in zip(a + [""] * (len(b) - len(a)), b + [""] * (len(a) - len(b)), strict=True)
    ]
    return "\n".join(rows)
