"""What a verifier returns (:class:`Verification`), what it sees (:class:`VerifyContext`), and its registry.

A verifier turns a finished episode into a multi-dimensional result: an
``outcome`` (did the task get solved: test pass rate, answer equivalence,
final state), ``process`` signals (well-formed tool calls, code that compiles)
and ``efficiency`` (turns used). One verifier computes one component; a
:class:`~envs.verifiers.compose.WeightedVerifier` combines them.

The one rule that matters most: when the *harness* fails (the sandbox died,
an :class:`sandbox.SandboxInfraError`, the verifier itself crashed) the result
carries an ``anomaly`` cause and must be retried or dropped, never scored as a
model failure. :meth:`Verifier.verify` enforces that for every verifier, so a
component's :meth:`Verifier.check` only needs to judge the model's work.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
import time
import traceback
from collections.abc import Mapping
from typing import Any, ClassVar

from sandbox import SandboxInfraError

ROLES = ("outcome", "process", "efficiency")


@dataclasses.dataclass(frozen=True)
class Verification:
    """The graded result of one episode. JSON-serialisable via :meth:`to_dict`.

    Attributes:
      reward: the scalar the RL loss uses.
      passed: the task counts as solved (for pass rates and difficulty tracking).
      components: named scores in [0, 1] (``outcome``, ``process``, ``efficiency``, ...).
      details: the breakdown behind them (per-test outcomes, diffs, parsed answers).
      anomaly: None, or why the harness could not judge (``"sandbox_vanished: ..."``).
      verifier: which verifier produced this.
      duration_s: time spent verifying.
    """

    reward: float
    passed: bool
    components: Mapping[str, float] = dataclasses.field(default_factory=dict)
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    anomaly: str | None = None
    verifier: str = ""
    duration_s: float = 0.0

    def __post_init__(self):
        if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)) or not math.isfinite(self.reward):
            raise ValueError(f"Verification.reward: expected a finite float, got {self.reward!r}")
        if not isinstance(self.passed, bool):
            raise ValueError(f"Verification.passed: expected a bool, got {self.passed!r}")
        for name, value in self.components.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"Verification.components[{name!r}]: expected a finite float, got {value!r}")
        if self.anomaly is not None and (not isinstance(self.anomaly, str) or not self.anomaly):
            raise ValueError(f"Verification.anomaly: expected None or a non-empty cause string, got {self.anomaly!r}")
        if self.anomaly is not None and self.passed:
            raise ValueError("Verification.passed: an anomalous result cannot be passed")
        try:
            json.dumps(self.details, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Verification.details: must be JSON-serialisable ({exc})") from exc
        object.__setattr__(self, "reward", float(self.reward))
        object.__setattr__(self, "components", {k: float(v) for k, v in self.components.items()})

    @property
    def is_anomaly(self) -> bool:
        return self.anomaly is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "passed": self.passed,
            "components": dict(self.components),
            "details": json.loads(json.dumps(self.details)),
            "anomaly": self.anomaly,
            "verifier": self.verifier,
            "duration_s": round(self.duration_s, 6),
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Verification:
        return cls(**dict(record))

    @classmethod
    def anomalous(cls, cause: str, *, verifier: str = "", details: Mapping[str, Any] | None = None) -> Verification:
        """A result that must not be scored: reward 0, not passed, ``anomaly=cause``."""
        return cls(reward=0.0, passed=False, anomaly=cause, verifier=verifier, details=dict(details or {}))


@dataclasses.dataclass
class VerifyContext:
    """What a verifier sees once the agent has finished.

    Attributes:
      task: the task (including ``hidden`` and ``gold``).
      sandbox: the episode's sandbox, in the state the agent left it (None for
        verifiers that need none, e.g. math answers).
      episode: the episode record (``answer``, ``turns``, ``tool_calls``, ...).
      max_turns: the turn budget the episode ran under.
    """

    task: Any
    sandbox: Any = None
    episode: Any = None
    max_turns: int = 1

    @property
    def answer(self) -> str | None:
        return getattr(self.episode, "answer", None)


class Verifier(abc.ABC):
    """Judges one aspect of a finished episode. Subclasses implement :meth:`check`.

    ``options`` (keyword arguments from the config) must be declared in
    :attr:`OPTIONS` with their defaults, so a typo in a config is an error.
    """

    name: ClassVar[str] = ""
    role: ClassVar[str] = "outcome"
    needs_sandbox: ClassVar[bool] = True
    OPTIONS: ClassVar[dict[str, Any]] = {}

    def __init__(self, **options: Any):
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ValueError(
                f"verifier {self.name!r}: unknown option(s) {unknown}; options: {sorted(self.OPTIONS) or 'none'}"
            )
        self.options = {**self.OPTIONS, **options}

    @abc.abstractmethod
    def check(self, ctx: VerifyContext) -> Verification:
        """Judges the model's work. Infra errors may propagate: :meth:`verify` turns them into anomalies."""

    def verify(self, ctx: VerifyContext) -> Verification:
        """Runs :meth:`check`; a harness failure becomes an anomaly, never a low score."""
        start = time.monotonic()
        if self.needs_sandbox and (ctx.sandbox is None or getattr(ctx.sandbox, "closed", False)):
            return Verification.anomalous("no_sandbox: the episode's sandbox is gone", verifier=self.name)
        try:
            result = self.check(ctx)
        except SandboxInfraError as exc:
            return Verification.anomalous(f"sandbox_{exc.cause}: {exc}", verifier=self.name)
        except Exception as exc:  # noqa: BLE001 - a verifier bug must not become a model failure
            tb = traceback.format_exc(limit=4)
            return Verification.anomalous(
                f"verifier_error: {type(exc).__name__}: {exc}", verifier=self.name, details={"traceback": tb}
            )
        return dataclasses.replace(result, verifier=self.name, duration_s=time.monotonic() - start)

    def result(
        self, score: float, *, passed: bool | None = None, details: Mapping[str, Any] | None = None
    ) -> Verification:
        """A result whose component under this verifier's name is ``score``."""
        score = float(score)
        return Verification(
            reward=score,
            passed=score >= 1.0 if passed is None else passed,
            components={self.name: score},
            details=dict(details or {}),
            verifier=self.name,
        )


VERIFIERS: dict[str, type[Verifier]] = {}


def register_verifier(name: str):
    """Class decorator: registers a :class:`Verifier` under ``name`` (also sets ``cls.name``)."""

    def wrap(cls: type[Verifier]) -> type[Verifier]:
        if not (isinstance(cls, type) and issubclass(cls, Verifier)):
            raise TypeError(f"register_verifier({name!r}): expected a Verifier subclass, got {cls!r}")
        if name in VERIFIERS and VERIFIERS[name] is not cls:
            raise ValueError(f"register_verifier: {name!r} is already registered to {VERIFIERS[name].__name__}")
        if cls.role not in ROLES:
            raise ValueError(f"{cls.__name__}.role: expected one of {ROLES}, got {cls.role!r}")
        cls.name = name
        VERIFIERS[name] = cls
        return cls

    return wrap


def make_verifier(name: str, **options: Any) -> Verifier:
    """Instantiates a registered verifier; the error lists the registered names."""
    if name not in VERIFIERS:
        raise KeyError(f"verifier: unknown name {name!r}; registered: {sorted(VERIFIERS)}")
    return VERIFIERS[name](**options)
