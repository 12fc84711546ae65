"""The arithmetic SFT warm start: demonstrations the quickstart imitates before RL, registered as ``arithmetic``.

They are *systematically* imperfect: most demonstrations answer directly, with
a plausible but wrong number (a model guessing), and only a minority call the
tool. Imitation therefore tops out low; what reinforcement learning adds is
choosing the tool every time.

    from envs.demonstrations import demonstrations
    conversations = demonstrations("arithmetic", {"num_tasks": 4000, "tool_fraction": 0.4, "seed": 0})
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from envs.demonstrations import Conversation, register_demonstrations
from envs.domains.arithmetic.env import ANSWER_PHRASE, arithmetic_tasks, tool_call_reply
from envs.tasks import Task

OPTIONS = {"num_tasks": 2000, "tool_fraction": 0.3, "seed": 0}


def _guess(answer: int, rng: random.Random) -> str:
    """A plausible wrong answer: the right length, one or two digits off."""
    digits = list(str(answer))
    for _ in range(rng.choice((1, 2))):
        i = rng.randrange(len(digits))
        choices = [d for d in "0123456789" if d != digits[i] and (i > 0 or d != "0")]
        digits[i] = rng.choice(choices)
    guess = "".join(digits)
    return guess if guess != str(answer) else str(answer + 1)


def demonstrations(tasks: list[Task], *, tool_fraction: float = 0.3, seed: int = 0) -> list[Conversation]:
    """SFT conversations: ``tool_fraction`` use the tool correctly, the rest answer directly and wrongly.

    A tool demonstration's tool message is exactly what the env's ``python`` tool
    prints, so the warm-started policy sees at training time the observations it
    will see at rollout time.
    """
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"demonstrations(tool_fraction=): expected a fraction in [0, 1], got {tool_fraction!r}")
    rng = random.Random(f"demos/{seed}")
    out = []
    for task in tasks:
        answer = task.hidden["answer"]
        user = {"role": "user", "content": task.prompt}
        if rng.random() < tool_fraction:
            out.append(
                [
                    user,
                    {"role": "assistant", "content": tool_call_reply(task.prompt)},
                    {"role": "tool", "name": "python", "content": f"{answer}\n[exit code: 0]"},
                    {"role": "assistant", "content": ANSWER_PHRASE.format(answer=answer)},
                ]
            )
        else:
            out.append([user, {"role": "assistant", "content": f"The answer is {_guess(int(answer), rng)}."}])
    return out


@register_demonstrations("arithmetic", OPTIONS)
def arithmetic_demonstrations(opts: Mapping[str, Any]) -> list[Conversation]:
    """``num_tasks`` training problems (default 2000) as :func:`demonstrations` (``tool_fraction``, ``seed``)."""
    tasks = arithmetic_tasks("train", int(opts["num_tasks"]), seed=int(opts["seed"]))
    return demonstrations(tasks, tool_fraction=float(opts["tool_fraction"]), seed=int(opts["seed"]))
