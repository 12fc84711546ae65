"""``learned``: a verifier whose score comes from a judge injected from outside (a learned reward model).

``envs`` never imports the policy code, so the judge is a plain callable that whoever runs the
environments registers by name before building them (``rl`` does it from a saved reward model, see
:mod:`rl.phases.learned_reward`)::

    register_scorer("default", scorer)          # scorer(messages) -> float in [0, 1], or a mapping
    build_verifier({"outcome": 1.0, "learned": 0.2}, roles=...)

The scorer sees the episode's transcript only: a fresh copy of each message's ``role``, ``content``
and tool ``name`` (never the sandbox, the task's hidden fields or any object the episode's code could
have touched), so the candidate can influence the score through the text it wrote and nothing else.
It returns a bounded score in [0, 1], or a mapping ``{"score": s, ...}`` whose other JSON-able
entries become details. A scorer that raises, returns a non-finite value or one outside [0, 1] makes
the verification an anomaly (:meth:`Verifier.verify`), never a score.

Role ``process``: the judge's opinion joins the reward with its weight but never decides ``passed``
next to an outcome verifier. Alone (a learned-only reward), ``passed`` is ``score > 0.5``: the judge
prefers the transcript to its average held-out one — an opinion, not ground truth.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier

Scorer = Callable[[Sequence[Mapping[str, str]]], "float | Mapping[str, Any]"]
DEFAULT_SCORER = "default"
PASS_ABOVE = 0.5

_SCORERS: dict[str, Scorer] = {}
_LOCK = threading.Lock()


def register_scorer(name: str, scorer: Scorer) -> None:
    """Makes ``scorer`` the judge of every ``learned`` verifier whose ``scorer`` option is ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_scorer(name=): expected a non-empty str, got {name!r}")
    if not callable(scorer):
        raise TypeError(f"register_scorer(scorer=): expected a callable, got {type(scorer).__name__}")
    with _LOCK:
        _SCORERS[name] = scorer


def unregister_scorer(name: str, scorer: Scorer | None = None) -> None:
    """Removes the scorer ``name`` (only if it is ``scorer``, when given)."""
    with _LOCK:
        if name in _SCORERS and (scorer is None or _SCORERS[name] is scorer):
            del _SCORERS[name]


def get_scorer(name: str) -> Scorer:
    with _LOCK:
        scorer = _SCORERS.get(name)
    if scorer is None:
        raise LookupError(
            f"verifier 'learned': no scorer registered as {name!r} (registered: {sorted(_SCORERS) or 'none'}); "
            "an agentrl run registers one from config.learned_reward (configs.common.learned_reward)"
        )
    return scorer


def transcript(episode: Any) -> list[dict[str, str]]:
    """The episode's messages as plain text: ``role``, ``content`` and a tool message's ``name``."""
    messages = getattr(episode, "messages", None)
    if not messages:
        raise ValueError("verifier 'learned': the episode has no messages to judge")
    out = []
    for m in messages:
        message = {"role": str(m["role"]), "content": str(m.get("content") or "")}
        if m.get("name") is not None:
            message["name"] = str(m["name"])
        out.append(message)
    return out


@register_verifier("learned")
class LearnedVerifier(Verifier):
    """The bounded score of an injected judge (see the module docstring).

    Options: ``scorer``: the registered name of the judge (default ``"default"``).
    """

    role = "process"
    needs_sandbox = False
    OPTIONS = {"scorer": DEFAULT_SCORER}

    def __init__(self, **options: Any):
        super().__init__(**options)
        get_scorer(self.options["scorer"])  # fail when the environment is built, not at the first episode

    def check(self, ctx: VerifyContext) -> Verification:
        out = get_scorer(self.options["scorer"])(transcript(ctx.episode))
        details = dict(out) if isinstance(out, Mapping) else {}
        score = details.pop("score", None) if isinstance(out, Mapping) else out
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValueError(f"scorer {self.options['scorer']!r} returned {score!r}, not a finite number")
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"scorer {self.options['scorer']!r} returned {score!r}, outside [0, 1]")
        return self.result(score, passed=score > PASS_ABOVE, details=details)
