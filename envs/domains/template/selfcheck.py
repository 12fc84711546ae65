"""Cases the template's verifier must grade right: each sample task's gold passes, a no-op fails,
and a plausible wrong count fails (run by ``python -m envs.quality.validate`` and the test suite)."""

from __future__ import annotations

from envs import format_tool_call, load_tasks
from envs.domains.template.env import ENV_NAME, NAME, VERIFIER
from envs.quality.hooks import Case, gold_and_noop, register_selfcheck

ENV_ID = f"agentrl/{ENV_NAME}-v0"


def _off_by_one(env, task) -> list[str]:
    return [format_tool_call("submit", {"answer": str(task.hidden["count"] + 1)})]


@register_selfcheck(NAME)
def selfcheck_cases() -> list[Case]:
    ids = [task.id for task in load_tasks(f"{NAME}:0")[:2]]
    wrong = [Case(VERIFIER, f"off by one {i}", ENV_ID, i, _off_by_one, False) for i in ids]
    return gold_and_noop(VERIFIER, ENV_ID, ids) + wrong
