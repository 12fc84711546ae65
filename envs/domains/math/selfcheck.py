"""Self-check samples of ``math_answer``: the same values in many notations, and near misses that must fail.

Each sample is a (reference, reply) pair judged directly by the verifier, with
no episode to play: equal values written differently pass, a different value,
a hedge between two answers or a truncated number fails.
"""

from __future__ import annotations

from envs.episode import Episode
from envs.quality.hooks import Sample, register_selfcheck
from envs.tasks import Task

MATH_SAMPLES: list[tuple[str, str, bool]] = [  # (reference, reply, must pass)
    ("42", "The answer is 42.", True),
    ("42", "Adding them gives \\boxed{42}.", True),
    ("0.5", "So the probability is \\boxed{\\frac{1}{2}}.", True),
    ("\\frac{1}{2}", "0.5", True),
    ("1234", "The total is 1,234 dollars.", True),
    ("12", "It costs \\$12.", True),
    ("18", "\\boxed{18.0}", True),
    ("7\\sqrt{2}", "\\boxed{\\sqrt{98}}", True),
    ("12x", "\\boxed{12x}", True),
    ("5/3", "\\boxed{\\dfrac{5}{3}}", True),
    ("-7", "The final answer: -7.", True),
    ("42", "I first thought 42, but the answer is 41.", False),
    ("42", "", False),
    ("1/3", "0.333", False),
    ("7\\sqrt{2}", "\\boxed{7}", False),
    ("12x", "\\boxed{12}", False),
    ("24", "There are 24 or 25 coins, probably \\boxed{25}.", False),
    ("2315.25", "\\boxed{2315.2}", False),
]


@register_selfcheck("math")
def selfcheck_cases() -> list[Sample]:
    samples = []
    for i, (reference, reply, expect) in enumerate(MATH_SAMPLES):
        task = Task(id=f"selfcheck/math/{i}", domain="math", prompt="selfcheck", hidden={"answer": reference})
        episode = Episode(env_id="selfcheck", task_id=task.id, domain="math", answer=reply)
        samples.append(Sample("math_answer", f"{reference!r} vs {reply!r}", task, episode, expect))
    return samples
