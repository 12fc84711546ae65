"""Weighted combinations of verifiers, built from a config such as ``{"outcome": 1.0, "efficiency": 0.1}``.

A key names either a *role* the environment binds to one of its verifiers
(``outcome`` -> ``hidden_tests`` for repository repair) or a registered
verifier directly (``code_compiles``). A value is a weight, or a mapping with
``weight``, ``gated`` and the verifier's own options::

    verifier = ml_collections.ConfigDict({
        "outcome": 1.0,
        "efficiency": {"weight": 0.1, "gated": True},   # only paid when the outcome passed
        "code_compiles": {"weight": 0.05},
    })

The reward is ``sum(weight * score)`` with gated parts multiplied by the
outcome's ``passed`` (so a bonus for being quick cannot reward giving up
quickly). ``passed`` is the outcome's. If any part is anomalous, the whole
result is anomalous: a half-judged sample must not be scored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from envs.verifiers.base import VERIFIERS, Verification, Verifier, VerifyContext, make_verifier


@dataclasses.dataclass(frozen=True)
class Part:
    """One weighted component of a :class:`WeightedVerifier`."""

    key: str
    verifier: Verifier
    weight: float
    gated: bool

    def __post_init__(self):
        if not isinstance(self.weight, (int, float)) or isinstance(self.weight, bool):
            raise ValueError(f"verifier config [{self.key!r}].weight: expected a number, got {self.weight!r}")


class WeightedVerifier(Verifier):
    """Runs its parts in order (outcome first) and combines them into one :class:`Verification`."""

    name = "weighted"

    def __init__(self, parts: list[Part]):
        super().__init__()
        if not parts:
            raise ValueError("WeightedVerifier(parts=): expected at least one part")
        keys = [p.key for p in parts]
        if len(set(keys)) != len(keys):
            raise ValueError(f"WeightedVerifier(parts=): duplicate keys in {keys}")
        # Gating needs the outcome first; otherwise keep the config's order.
        self.parts = sorted(parts, key=lambda p: p.verifier.role != "outcome")
        self.needs_sandbox = any(p.verifier.needs_sandbox for p in parts)

    def check(self, ctx: VerifyContext) -> Verification:
        results: dict[str, Verification] = {}
        for part in self.parts:
            result = part.verifier.verify(ctx)
            results[part.key] = result
            if result.is_anomaly:
                return Verification.anomalous(
                    f"{part.key}: {result.anomaly}",
                    verifier=self.name,
                    details={key: r.to_dict() for key, r in results.items()},
                )
        outcomes = [results[p.key] for p in self.parts if p.verifier.role == "outcome"]
        passed = all(r.passed for r in outcomes) if outcomes else all(r.passed for r in results.values())
        reward, components = 0.0, {}
        for part in self.parts:
            score = results[part.key].reward
            components[part.key] = score
            if part.gated and not passed:
                continue
            reward += part.weight * score
        return Verification(
            reward=reward,
            passed=passed,
            components=components,
            details={key: r.to_dict() for key, r in results.items()},
            verifier=self.name,
        )


def _as_mapping(config: Any) -> dict[str, Any]:
    if hasattr(config, "to_dict"):  # ml_collections.ConfigDict / FrozenConfigDict
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(f"verifier config: expected a mapping of name -> weight, got {type(config).__name__}")
    return dict(config)


DEFAULT_ROLES = {"process": "tool_format", "efficiency": "turn_efficiency"}


def build_verifier(config: Any, roles: Mapping[str, str] | None = None) -> WeightedVerifier:
    """A :class:`WeightedVerifier` from a config mapping; ``roles`` binds role keys to registered names.

    ``process`` and ``efficiency`` default to ``tool_format`` and ``turn_efficiency``.
    """
    roles = {**DEFAULT_ROLES, **(roles or {})}
    parts = []
    for key, value in _as_mapping(config).items():
        if isinstance(value, Mapping) or hasattr(value, "to_dict"):
            settings = _as_mapping(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            settings = {"weight": value}
        else:
            raise TypeError(f"verifier config [{key!r}]: expected a weight or a mapping, got {value!r}")
        weight = settings.pop("weight", 1.0)
        name = settings.pop("verifier", roles.get(key, key))
        if name not in VERIFIERS:
            raise KeyError(
                f"verifier config [{key!r}]: {name!r} is neither a role of this environment "
                f"({sorted(roles) or 'none'}) nor a registered verifier ({sorted(VERIFIERS)})"
            )
        verifier = make_verifier(name, **{k: v for k, v in settings.items() if k != "gated"})
        gated = bool(settings.get("gated", verifier.role == "efficiency"))
        parts.append(Part(key=key, verifier=verifier, weight=float(weight), gated=gated))
    return WeightedVerifier(parts)
