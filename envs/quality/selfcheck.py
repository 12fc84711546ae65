"""Runs every verifier on its self-check set and fails unless each is 100% accurate and stable.

    python -m envs.quality.selfcheck                    # bwrap, 3 repeats of every sample
    python -m envs.quality.selfcheck --backend docker --repeats 2 --only hidden_tests

The samples are the self-check sets the domains register
(:func:`envs.quality.hooks.register_selfcheck`): gold and no-op solutions of
real tasks and the known reward hacks (which must score as failures), played
through the domains' real environments, and verifier samples judged directly
(math answers in many notations), plus the samples of the generic process and
efficiency verifiers kept here. Each sample is verified ``--repeats`` times; a
verifier passes only if every verdict is right and all repeats agree (a flaky
verifier is a broken one). Progress is printed per sample; the exit status is
non-zero on any failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym

import envs  # noqa: F401 - registers the environments and their self-check sets
from envs.episode import Episode, ToolCallRecord
from envs.quality.hooks import SELF_CHECKS, Case, Sample, Unavailable
from envs.quality.validate import play
from envs.sandboxes import WarmPool
from envs.tasks import Task
from envs.verifiers import VerifyContext, make_verifier
from sandbox import SandboxSpec

SAMPLE_SANDBOX = SandboxSpec(memory_mb=1024, timeout_s=60.0)


@dataclasses.dataclass
class Outcome:
    verifier: str
    name: str
    expect: bool
    verdicts: list[Any]

    @property
    def correct(self) -> bool:
        return bool(self.verdicts) and all(v is self.expect for v in self.verdicts)

    @property
    def stable(self) -> bool:
        return len(set(map(str, self.verdicts))) == 1


def process_samples() -> list[Sample]:
    """The generic process and efficiency verifiers' samples (every domain composes with them)."""
    task = Task(id="selfcheck/process", domain="process", prompt="selfcheck")

    def episode(*malformed: bool, turns: int = 1) -> Episode:
        calls = [
            ToolCallRecord(turn=1, index=i, name="bash", arguments={}, output="", malformed=m)
            for i, m in enumerate(malformed)
        ]
        return Episode(env_id="selfcheck", task_id=task.id, domain="process", tool_calls=calls, turns=turns)

    module = "def f():\n    return 1\n"
    return [
        Sample("tool_format", "well-formed calls", task, episode(False, False), True, max_turns=8),
        Sample("tool_format", "one malformed call", task, episode(False, True), False, max_turns=8),
        Sample("turn_efficiency", "one turn scores 1.0", task, episode(turns=1), 1.0, max_turns=8),
        Sample("turn_efficiency", "8 of 8 turns scores 0.125", task, episode(turns=8), 0.125, max_turns=8),
        Sample("code_compiles", "valid module", task, files={"pkg/ok.py": module}),
        Sample(
            "code_compiles", "syntax error", task, expect=False, files={"pkg/ok.py": module, "pkg/bad.py": "def f(:\n"}
        ),
    ]


def registered_samples(log=print) -> list[Case | Sample]:
    """Every registered self-check set's samples; a set that cannot run here is skipped, with why."""
    samples: list[Case | Sample] = []
    for name, make in sorted(SELF_CHECKS.items()):
        try:
            samples += list(make())
        except Unavailable as exc:
            log(f"[selfcheck] {name} skipped: {exc}")
    return samples


def judge_sample(sample: Sample, pool: WarmPool) -> Any:
    """One verdict on a direct sample: ``passed``, or for a float ``expect`` whether the reward is exactly it."""
    verifier = make_verifier(sample.verifier)
    sandbox = pool.acquire(SAMPLE_SANDBOX) if sample.files is not None else None
    try:
        if sandbox is not None:
            sandbox.write_files(dict(sample.files))
        ctx = VerifyContext(task=sample.task, sandbox=sandbox, episode=sample.episode, max_turns=sample.max_turns)
        result = verifier.verify(ctx)
    finally:
        if sandbox is not None:
            pool.release(sandbox)
    return result.passed if isinstance(sample.expect, bool) else result.reward == sample.expect


def play_case(case: Case, env: Any) -> Any:
    """One verdict on a scripted agent: ``passed``, or ``"anomaly: ..."``."""
    task = env.tasks.get(case.task_id)
    verification = play(env, task, case.replies(env, task))
    return "anomaly: " + verification["anomaly"] if verification["anomaly"] else verification["passed"]


def selfcheck(backend: str = "bwrap", repeats: int = 3, only: set[str] | None = None, log=print) -> list[Outcome]:
    """Runs the self-check set; returns one :class:`Outcome` per sample."""
    samples = [s for s in process_samples() + registered_samples(log) if only is None or s.verifier in only]
    outcomes: list[Outcome] = []
    with WarmPool(backend) as pool:
        envs_by_id: dict[str, Any] = {}
        try:
            for i, sample in enumerate(samples, 1):
                start = time.monotonic()
                if isinstance(sample, Case):
                    if sample.env_id not in envs_by_id:
                        factory = {"sandbox_factory": pool.acquire, "sandbox_release": pool.release}
                        envs_by_id[sample.env_id] = gym.make(sample.env_id, **factory).unwrapped
                    verdicts = [play_case(sample, envs_by_id[sample.env_id]) for _ in range(repeats)]
                    expect = sample.expect
                else:
                    verdicts = [judge_sample(sample, pool) for _ in range(repeats)]
                    expect = sample.expect if isinstance(sample.expect, bool) else True
                outcome = Outcome(sample.verifier, sample.name, expect, verdicts)
                outcomes.append(outcome)
                mark = "ok " if outcome.correct and outcome.stable else "BAD"
                seconds = time.monotonic() - start
                log(
                    f"[selfcheck {i:3d}/{len(samples)}] {mark} {sample.verifier}: {sample.name} -> {verdicts} ({seconds:.2f}s)"
                )
        finally:
            for env in envs_by_id.values():
                env.close()
    return outcomes


def summarise(outcomes: list[Outcome], log=print) -> bool:
    """Prints per-verifier accuracy; True if every verifier is 100% accurate and stable."""
    by_verifier: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        by_verifier[outcome.verifier].append(outcome)
    ok = True
    for name, group in sorted(by_verifier.items()):
        correct = sum(o.correct for o in group)
        stable = all(o.stable for o in group)
        accuracy = 100.0 * correct / len(group)
        ok = ok and correct == len(group) and stable
        hacks = sum(1 for o in group if o.name.startswith("hack:"))
        log(
            f"[selfcheck] {name:16s} {correct:3d}/{len(group):<3d} correct ({accuracy:5.1f}%), "
            f"{'stable' if stable else 'FLAKY'}, {hacks} reward hacks"
        )
        for o in group:
            if not (o.correct and o.stable):
                log(f"      - {o.name}: expected {o.expect}, got {o.verdicts}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.quality.selfcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    parser.add_argument("--repeats", type=int, default=3, help="verifications per sample (flakiness check)")
    parser.add_argument("--only", action="append", help="check only these verifiers (repeatable)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    start = time.monotonic()
    outcomes = selfcheck(args.backend, args.repeats, set(args.only) if args.only else None)
    ok = summarise(outcomes)
    print(
        f"[selfcheck] {len(outcomes)} samples x {args.repeats} repeats on {args.backend} in {time.monotonic() - start:.1f}s: "
        f"{'all verifiers 100% accurate and stable' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
