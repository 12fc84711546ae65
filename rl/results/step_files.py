"""One step file of episodes into table rows, fast: the conversation is never decoded.

A step file holds one JSON line per episode, and most of each line is the
conversation (``messages``, ``turns``) that the tables never use. Each line is
cut at its top-level keys: only the scalar head (everything before
``"messages"``) and the tail from the top-level ``"tool_calls"`` on (tool
calls, verification, counts) are decoded. The cut is safe: inside a JSON string
every quote is escaped, so ``"tool_calls": `` can only match a key, and a cut at
a nested key leaves brackets unbalanced, which fails to decode; such a line is
decoded whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl.rollout.trajectory import DECODINGS

_HEAD_CUT, _TAIL_CUT = ', "messages": ', '"tool_calls": '
SUMMARY_KEYS = (
    *("step", "row", "task_id", "domain", "group", "index", "seed", "split", "reward", "passed", "anomaly"),
    *("end_reason", "num_turns", "num_tokens", "sampled_tokens", "prompt_len", "advantage", "trained"),
)
NEEDED_KEYS = frozenset((*SUMMARY_KEYS, "verification", "tool_calls"))
_CALL_KEYS = ("turn", "index", "name", "duration_s", "exit_code", "timed_out", "malformed", "error")


def decode_summary(line: str) -> dict[str, Any]:
    """The fields of one episode line the tables use (see the module docstring for the cut)."""
    head_end, tail_start = line.find(_HEAD_CUT), line.rfind(_TAIL_CUT)
    if 0 < head_end < tail_start:
        try:
            record = json.loads(line[:head_end] + "}")
            record.update(json.loads("{" + line[tail_start:]))
            if NEEDED_KEYS.issubset(record):  # any other key order is decoded whole
                return record
        except json.JSONDecodeError:
            pass
    return json.loads(line)


def parse_step(path: Path, kind: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One step file -> (episode rows, tool-call rows)."""
    episodes, tools, seen, decoding = [], [], set(), "greedy"
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = decode_summary(line)
            v, calls = r.get("verification") or {}, r.get("tool_calls") or []
            row = {k: r.get(k) for k in SUMMARY_KEYS}
            row.update(
                tool_calls=len(calls),
                tool_time_s=float(sum(c.get("duration_s") or 0.0 for c in calls)),
                tool_errors=sum(bool(c.get("error") or c.get("timed_out") or c.get("exit_code")) for c in calls),
                malformed_calls=sum(bool(c.get("malformed")) for c in calls),
                verifier=v.get("verifier"),
                verify_s=v.get("duration_s"),
            )
            if kind == "eval":
                # Files name it ("decoding"; "mode" before that). Otherwise, from the order: the
                # evaluator writes the greedy episodes (one per task) first, then the k sampled ones,
                # each numbered from group 0, so the first repeated (group, index) starts them.
                key = (row["group"], row["index"])
                decoding = "sampled" if decoding == "sampled" or key in seen else "greedy"
                seen.add(key)
                recorded = r.get("decoding", r.get("mode"))
                row["decoding"] = recorded if recorded in DECODINGS else decoding
            for name, value in (v.get("components") or {}).items():
                row[f"component/{name}"] = value
            episodes.append(row)
            for c in calls:
                call = {k: c.get(k) for k in _CALL_KEYS}
                call.update(kind=kind, backend=(c.get("sandbox") or {}).get("backend"))
                tools.append({**{k: row[k] for k in ("step", "row", "task_id", "domain")}, **call})
    return episodes, tools
