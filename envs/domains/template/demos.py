"""SFT demonstrations for the template domain (``config.sft.data = NAME``): the gold path, with the
tool message exactly as the ``bash`` tool prints it, so the warm start sees what rollouts will show."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs import format_tool_call, load_tasks
from envs.demonstrations import Conversation, register_demonstrations
from envs.domains.template.env import NAME


@register_demonstrations(NAME)
def demonstrations(options: Mapping[str, Any]) -> list[Conversation]:
    """One conversation per training task (no options)."""
    if options:
        raise ValueError(f"demonstrations({NAME!r}): takes no options, got {sorted(options)}")
    out = []
    for task in load_tasks(f"{NAME}:0"):
        if task.split != "train":
            continue
        count = str(task.hidden["count"])
        out.append(
            [
                {"role": "user", "content": task.prompt},
                {"role": "assistant", "content": format_tool_call("bash", {"command": task.gold["command"]})},
                {"role": "tool", "name": "bash", "content": f"{count}\n[exit code: 0]"},
                {"role": "assistant", "content": format_tool_call("submit", {"answer": count})},
            ]
        )
    return out
