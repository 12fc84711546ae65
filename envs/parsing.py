"""Tool calls in model text: the Qwen2.5 / Hermes ``<tool_call>`` convention.

A model calls a tool by emitting, anywhere in its reply, one block per call::

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls -la"}}
    </tool_call>

``arguments`` is a JSON object (a JSON *string* holding an object is accepted
too, as OpenAI-style models emit). Several blocks in one reply run in order.
The closing tag of the *last* block may be missing, because samplers often stop
on ``</tool_call>`` and drop the stop string. Text outside the blocks is the
model's reasoning and is kept as ``content``.

Parsing never raises on model output: every problem becomes a
:class:`ToolCallError` whose message is written for the model (what was wrong,
what is expected) and is returned to it as the tool's observation.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
MAX_CALLS_PER_TURN = 8
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_EXPECTED = '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}\n</tool_call>'


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its JSON-object arguments."""

    name: str
    arguments: Mapping[str, Any]
    index: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments), "index": self.index}


@dataclasses.dataclass(frozen=True)
class ToolCallError:
    """A block that could not be understood; ``message`` is what the model is told."""

    message: str
    raw: str
    index: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "raw": self.raw, "index": self.index}


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    """Everything in one model reply: calls and errors in the order they appeared."""

    content: str
    items: tuple[ToolCall | ToolCallError, ...]

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(i for i in self.items if isinstance(i, ToolCall))

    @property
    def errors(self) -> tuple[ToolCallError, ...]:
        return tuple(i for i in self.items if isinstance(i, ToolCallError))

    @property
    def has_tool_syntax(self) -> bool:
        """True if the reply tried to call a tool at all (even if malformed)."""
        return bool(self.items)


def parse_tool_calls(text: str, *, max_calls: int = MAX_CALLS_PER_TURN) -> ParsedAction:
    """Splits a model reply into tool calls, malformed-call errors and free text. Never raises."""
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls(text=): expected str, got {type(text).__name__}")
    items: list[ToolCall | ToolCallError] = []
    spans = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        spans.append(match.span())
        if index >= max_calls:
            items.append(
                ToolCallError(f"at most {max_calls} tool calls are run per reply; this one was ignored", "", index)
            )
            continue
        items.append(_parse_block(match.group(1), index))
    content = _strip_spans(text, spans)
    if CLOSE_TAG in content:
        items.append(
            ToolCallError(
                f"found {CLOSE_TAG} without a matching {OPEN_TAG}; a tool call must look like:\n{_EXPECTED}",
                "",
                len(items),
            )
        )
    return ParsedAction(content=content.strip(), items=tuple(items))


def _parse_block(body: str, index: int) -> ToolCall | ToolCallError:
    raw = body.strip()
    fenced = _FENCE.match(raw)
    if fenced:
        raw = fenced.group(1)
    if not raw:
        return ToolCallError(f"empty tool call; expected:\n{_EXPECTED}", body, index)
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return ToolCallError(
            f"the tool call is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected:\n"
            f'{_EXPECTED}\nRemember to escape newlines (\\n) and quotes (\\") inside JSON strings.',
            body,
            index,
        )
    if not isinstance(obj, dict):
        return ToolCallError(
            f"the tool call must be a JSON object, got a {_json_type(obj)}; expected:\n{_EXPECTED}", body, index
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(f'the tool call has no "name" string; expected:\n{_EXPECTED}', body, index)
    unknown = sorted(set(obj) - {"name", "arguments"})
    if unknown:
        return ToolCallError(
            f'unexpected key(s) {unknown} in the tool call for {name!r}; only "name" and "arguments" are allowed',
            body,
            index,
        )
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI style: arguments serialised as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCallError(f'"arguments" of {name!r} is a string that is not valid JSON ({exc.msg})', body, index)
    if not isinstance(arguments, dict):
        return ToolCallError(
            f'"arguments" of {name!r} must be a JSON object, got a {_json_type(arguments)}', body, index
        )
    return ToolCall(name=name, arguments=arguments, index=index)


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _strip_spans(text: str, spans: list[tuple[int, int]]) -> str:
    out, pos = [], 0
    for start, end in spans:
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    return "".join(out)


def format_tool_call(name: str, arguments: Mapping[str, Any] | None = None) -> str:
    """The text a model emits to call ``name``: used by scripted policies, gold solutions and tests."""
    payload = json.dumps({"name": name, "arguments": dict(arguments or {})}, ensure_ascii=False)
    return f"{OPEN_TAG}\n{payload}\n{CLOSE_TAG}"


def tool_response_block(content: str) -> str:
    """How the Qwen2.5 chat template wraps one tool message; used for the plain-text observation."""
    return f"<tool_response>\n{content}\n</tool_response>"


def observation_text(messages: list[dict[str, Any]]) -> str:
    """The observation a policy reads for the messages a step appended: tool results as
    :func:`tool_response_block` s, other messages (corrections) as their text, one per line.
    The one rendering both rollouts and SFT demonstrations use, so the two never differ."""
    return "\n".join(tool_response_block(m["content"]) if m["role"] == "tool" else m["content"] for m in messages)
