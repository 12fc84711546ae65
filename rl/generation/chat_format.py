"""The ChatML chat format with Hermes-style tool calls, as Qwen2.5 renders it, in plain Python.

Rendering matches Qwen2.5's Jinja chat template character for character (the tests compare it
with ``transformers``' own template rendering), without a Jinja dependency:

    <|im_start|>system\\n{system}\\n\\n# Tools\\n...<tools>\\n{tool schema JSON}\\n</tools>...<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{tool result}\\n</tool_response><|im_end|>\\n   (consecutive tool
                                                   messages share one user turn)
    <|im_start|>assistant\\n                         (the generation prompt)

The RL loop never renders a finished conversation: it samples the assistant *completion* (the
text after the generation prompt, up to and including ``<|im_end|>``) and appends a
*continuation* (:meth:`ChatMLFormat.render_continuation`: the newline that ends the assistant
turn, the new user/tool turns, the next generation prompt). Prompt + completion + continuation
+ ... is exactly :meth:`ChatMLFormat.render` of the whole conversation, and because every piece
boundary is next to a special token, tokenizing the pieces separately gives the same ids as
tokenizing the whole. Parsing tool calls out of model text is the environments' job
(:func:`envs.parse_tool_calls`), not the policy's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from envs import observation_text, tool_response_block

Message = Mapping[str, Any]
ROLES = ("system", "user", "assistant", "tool")
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def _tojson(value: Any) -> str:
    # transformers' `tojson` filter: json.dumps with ensure_ascii=False and default separators.
    return json.dumps(value, ensure_ascii=False)


def _check_message(message: Message, where: str) -> None:
    if not isinstance(message, Mapping):
        raise TypeError(f"{where}: expected a mapping with 'role' and 'content', got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}['role']: expected one of {ROLES}, got {role!r}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError(f"{where}['content']: expected a str or None, got {type(content).__name__}")
    if message.get("tool_calls") and role != "assistant":
        raise ValueError(f"{where}['tool_calls']: only assistant messages carry tool calls (role={role!r})")


def _tool_call_text(call: Mapping[str, Any], where: str) -> str:
    call = call.get("function", call)
    name, args = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}['name']: expected a non-empty str, got {name!r}")
    if isinstance(args, str):  # OpenAI-style JSON string arguments
        args = json.loads(args)
    return '\n<tool_call>\n{"name": "' + name + '", "arguments": ' + _tojson(args) + "}\n</tool_call>"


@dataclasses.dataclass(frozen=True)
class ChatMLFormat:
    """ChatML + Hermes tool calls (Qwen2.5's convention).

    Attributes:
      default_system_prompt: system text used when the conversation has no system message
        (Qwen2.5 injects its own; ``None`` omits the system turn, or with tools starts the system
        turn directly with the tools block, as Qwen3 does).
      im_start, im_end: the turn delimiters (special tokens of the tokenizer).
      tool_role: how ``tool`` messages render: ``"user"`` (Hermes: consecutive results in one user
        turn, each in a ``<tool_response>`` block) or ``"tool"`` (each its own ``tool`` turn with the
        bare content, as templates that render every role alike do, e.g. SmolLM2's). Environments'
        observations are user turns either way (:meth:`render_observation`).
    """

    default_system_prompt: str | None = QWEN_DEFAULT_SYSTEM
    im_start: str = "<|im_start|>"
    im_end: str = "<|im_end|>"
    tool_role: str = "user"

    def __post_init__(self) -> None:
        if self.tool_role not in ("user", "tool"):
            raise ValueError(f"ChatMLFormat.tool_role: expected 'user' or 'tool', got {self.tool_role!r}")

    @classmethod
    def from_template(cls, template: str) -> ChatMLFormat:
        """The format a ChatML Jinja chat template renders: its default system prompt (the system
        turn it writes when the conversation has none) and how it renders tool messages.

        Only the two shapes the tests compare with ``transformers``' own rendering are recognised: a
        Hermes template (``<tool_response>``, Qwen's) and one that renders every message as
        ``<|im_start|>{role}\\n{content}<|im_end|>`` (SmolLM2's). Anything else is refused by name.
        """
        if cls.im_start not in template or cls.im_end not in template:
            raise ValueError("chat_template: not a ChatML template (no <|im_start|> / <|im_end|>)")
        found = re.search(r"<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>", template, re.S)
        system = found.group(1).replace("\\n", "\n") if found else None
        if system is not None and ("{" in system or "'" in system):  # a Jinja expression, not a literal
            system = None
        if "tool_response" in template:
            return cls(default_system_prompt=system)
        if re.search(r"message\[['\"]role['\"]\]|message\.role", template):
            return cls(default_system_prompt=system, tool_role="tool")
        raise ValueError("chat_template: a ChatML template whose tool messages this format cannot render")

    @property
    def generation_prompt(self) -> str:
        return f"{self.im_start}assistant\n"

    def _system(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None) -> str:
        first = messages[0] if messages and messages[0]["role"] == "system" else None
        text = first["content"] if first is not None else self.default_system_prompt
        if tools:
            tools_block = _TOOLS_HEADER + "".join("\n" + _tojson(t) for t in tools) + _TOOLS_FOOTER
            prefix = text + "\n\n" if text is not None else ""
            return f"{self.im_start}system\n{prefix}{tools_block}{self.im_end}\n"
        return f"{self.im_start}system\n{text}{self.im_end}\n" if text is not None else ""

    def _body(self, messages: Sequence[Message], offset: int = 0) -> str:
        out = []
        for i, m in enumerate(messages):
            where = f"messages[{i + offset}]"
            _check_message(m, where)
            role, content = m["role"], m.get("content") or ""
            if role in ("user", "system"):
                out.append(f"{self.im_start}{role}\n{content}{self.im_end}\n")
            elif role == "assistant":
                out.append(f"{self.im_start}assistant" + self._completion(m, where) + "\n")
            elif self.tool_role == "tool":
                out.append(f"{self.im_start}tool\n{content}{self.im_end}\n")
            else:  # tool: consecutive tool results share one user turn
                if i == 0 or messages[i - 1]["role"] != "tool":
                    out.append(f"{self.im_start}user")
                out.append("\n" + tool_response_block(content))  # the environment's own rendering
                if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                    out.append(f"{self.im_end}\n")
        return "".join(out)

    def _completion(self, message: Message, where: str) -> str:
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if not calls:
            return f"\n{content}{self.im_end}"
        text = f"\n{content}" if content else ""
        text += "".join(_tool_call_text(c, f"{where}['tool_calls'][{j}]") for j, c in enumerate(calls))
        return text + self.im_end

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The whole conversation, as Qwen2.5's template renders it."""
        if not messages:
            raise ValueError("messages: expected at least one message")
        _check_message(messages[0], "messages[0]")
        has_system = messages[0]["role"] == "system"
        text = self._system(messages, tools) + self._body(messages[1:] if has_system else messages, int(has_system))
        return text + (self.generation_prompt if add_generation_prompt else "")

    def render_completion(self, message: Message) -> str:
        """What the model emits after the generation prompt for ``message`` (ends with ``im_end``)."""
        _check_message(message, "message")
        if message["role"] != "assistant":
            raise ValueError(f"message['role']: a completion is an assistant message, got {message['role']!r}")
        return self._completion(message, "message")[1:]

    def render_observation(self, observation: str) -> str:
        """An environment's rendered observation as the user turn after a completion ending in ``im_end``.

        The environment renders tool results once (``<tool_response>`` blocks, or a corrective
        message); this only wraps that text in the turn delimiters, exactly as :meth:`render_continuation`
        would render the same results given as messages.
        """
        return f"\n{self.im_start}user\n{observation}{self.im_end}\n{self.generation_prompt}"

    def render_results(self, messages: Sequence[Message]) -> str:
        """Messages that follow a completion (tool results, corrections) as a rollout shows them: the
        environment's observation text (:func:`envs.observation_text`) in one user turn. Equal to
        :meth:`render_continuation` for Hermes tool turns; with ``tool_role="tool"`` this, not the
        template's ``tool`` turns, is what a policy reads in a rollout, so demonstrations use it too."""
        for i, m in enumerate(messages):
            _check_message(m, f"messages[{i}]")
        return self.render_observation(observation_text([dict(m) for m in messages]))

    def render_continuation(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """Turns appended after a completion that ended with ``im_end``.

        Starts with the newline that closes the assistant turn; with ``add_generation_prompt``
        ends with the next assistant generation prompt.
        """
        if not messages:
            raise ValueError("messages: expected at least one message to append")
        return "\n" + self._body(messages) + (self.generation_prompt if add_generation_prompt else "")
