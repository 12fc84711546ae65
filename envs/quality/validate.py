"""Screens task sets before they are trained or evaluated on; exits non-zero if any task is unsound.

    python -m envs.quality.validate builtin:repair builtin:shell --backend bwrap --repeats 2 --report runs/validate.json

For every task, on a real sandbox and through the task's own environment:

* the environment builds (``reset`` succeeds: files written, setup ran);
* the oracle is unreachable: neither the task's own prompt and files
  (:func:`envs.quality.leaks.static_leaks`) nor anything in the fresh sandbox (git
  objects, stray files, process environments: :func:`envs.quality.leaks.probe_oracle`)
  reveals the gold solution or the hidden tests — nor, while the no-op runs and
  is verified and after it (:func:`envs.quality.leaks.play_watched`), anything a
  process of the agent's uid can read;
* the gold solution, replayed as agent actions, passes — every repeat;
* a no-op (submit at once, or an empty answer) fails — every repeat;
* no verification is an anomaly (that would be the harness failing);
* every near miss scores 0: the task's authored ones and the generated mutants of the
  mutators registered for its domain (:mod:`envs.quality.near_misses`); a surviving
  mutant is named, and the mutation score (killed/total) is printed per domain;
* the task can be graded as it stands (its environment's
  :meth:`~envs.core.AgentEnv.ungradable` says why not: a function task whose
  checks cannot be turned into data). Loaders leave such tasks out, so they
  never train; those are listed as *excluded* (:func:`envs.tasks.excluded_tasks`),
  not unsound, while one handed over anyway is unsound.

Across the given sets, eval/test tasks must not (near-)duplicate train tasks
(:func:`envs.quality.leaks.find_split_leaks`). The JSON report lists every task's
verdicts; progress goes to stdout as each task finishes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs.core import AgentEnv, env_for_domain
from envs.quality.leaks import find_split_leaks, play_watched, probe_oracle, static_leaks, summarise_leaks
from envs.quality.near_misses import check_mutants, mutation_scores
from envs.sandboxes import WarmPool
from envs.tasks import Task, TaskSource, excluded_tasks, load_tasks


@dataclasses.dataclass
class TaskReport:
    task_id: str
    domain: str
    problems: list[str] = dataclasses.field(default_factory=list)
    gold: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    noop: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    oracle: list[str] = dataclasses.field(default_factory=list)
    mutants_killed: int = 0
    mutants_total: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def play(env: AgentEnv, task: Task, actions: Sequence[str]) -> dict[str, Any]:
    """Replays ``actions`` as an agent would; returns the final verification (or why there was none)."""
    env.reset(options={"task": task})
    info: dict[str, Any] = {}
    for action in actions:
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    if "verification" not in info:
        raise RuntimeError(f"the episode did not end after {len(actions)} scripted actions")
    return info["verification"]


def validate_task(
    env: AgentEnv, task: Task, *, repeats: int = 2, probe: bool = True, mutants: bool = True
) -> TaskReport:
    """Runs every check of the module docstring on one task."""
    report = TaskReport(task.id, task.domain)
    start = time.monotonic()
    try:
        env.reset(options={"task": task})
    except Exception as exc:  # noqa: BLE001 - any failure to build is the finding
        report.problems.append(f"environment does not build: {type(exc).__name__}: {exc}")
        return report
    report.problems += [f"oracle visible: {finding}" for finding in static_leaks(task)]
    ungradable = env.ungradable(task)
    if ungradable:
        report.problems.append(ungradable)
        report.seconds = time.monotonic() - start
        return report
    if probe:
        report.oracle = probe_oracle(env.sandbox, task)
        report.problems += [f"oracle reachable: {finding}" for finding in report.oracle]
    for kind, actions, want in (("gold", env.gold_actions(task), True), ("noop", env.noop_actions(task), False)):
        results = getattr(report, kind)
        for _ in range(repeats):
            try:
                if probe and kind == "noop":  # watched: hidden material must stay out of reach during and after
                    verification, findings = play_watched(env, task, actions)
                    report.problems += [f"oracle reachable: {finding}" for finding in findings]
                else:
                    verification = play(env, task, actions)
            except Exception as exc:  # noqa: BLE001
                report.problems.append(f"{kind} run crashed: {type(exc).__name__}: {exc}")
                break
            results.append({k: verification[k] for k in ("reward", "passed", "anomaly", "components")})
            if verification["anomaly"]:
                report.problems.append(f"{kind} verification is an anomaly: {verification['anomaly']}")
            elif verification["passed"] is not want:
                detail = json.dumps(verification["details"])[:600]
                report.problems.append(f"{kind} solution {'fails' if want else 'passes'}: {detail}")
        verdicts = {(r["passed"], r["reward"]) for r in results}
        if len(verdicts) > 1:
            report.problems.append(f"{kind} verdict is unstable over {repeats} repeats: {sorted(verdicts)}")
    if mutants:
        mutation = check_mutants(env, task, play)
        report.mutants_killed, report.mutants_total = mutation.killed, mutation.total
        report.problems += mutation.problems
    report.seconds = time.monotonic() - start
    return report


def validate(
    tasks: TaskSource | Sequence[Task],
    *,
    backend: str = "bwrap",
    repeats: int = 2,
    probe: bool = True,
    mutants: bool = True,
    env_kwargs: dict[str, Any] | None = None,
    log=print,
) -> tuple[list[TaskReport], list[Any]]:
    """Validates ``tasks`` (any mix of domains); returns per-task reports and split leaks."""
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_domain[task.domain].append(task)
    reports: list[TaskReport] = []
    total, done = len(list(tasks)), 0
    with WarmPool(backend) as pool:
        for domain, domain_tasks in sorted(by_domain.items()):
            cls = env_for_domain(domain)
            env = cls(domain_tasks, sandbox_factory=pool.acquire, sandbox_release=pool.release, **(env_kwargs or {}))
            try:
                for task in domain_tasks:
                    report = validate_task(env, task, repeats=repeats, probe=probe, mutants=mutants)
                    reports.append(report)
                    done += 1
                    status = "ok " if report.ok else "BAD"
                    log(f"[validate {done:4d}/{total}] {status} {task.id} ({report.seconds:.2f}s)")
                    for problem in report.problems:
                        log(f"      - {problem[:400]}")
            finally:
                env.close()
    leaks = find_split_leaks(tasks)
    return reports, leaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.quality.validate", description=__doc__.split("\n")[0])
    parser.add_argument("tasks", nargs="+", help="task specs: builtin:NAME, a JSONL path, humaneval, gsm8k:PATH ...")
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    parser.add_argument("--repeats", type=int, default=2, help="runs of gold and no-op per task (stability)")
    parser.add_argument("--split", default=None, help="validate only this split")
    parser.add_argument("--limit", type=int, default=None, help="validate only the first N tasks of each spec")
    parser.add_argument("--no-probe", action="store_true", help="skip the oracle-reachability probe")
    parser.add_argument("--no-mutants", action="store_true", help="skip the near misses and mutants")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    tasks: list[Task] = []
    excluded: dict[str, str] = {}
    for spec in args.tasks:
        source = load_tasks(spec, split=args.split)
        tasks += list(source)[: args.limit] if args.limit else list(source)
        excluded.update(excluded_tasks(spec))
    for task_id, why in sorted(excluded.items()):
        print(f"[validate] excluded {task_id}: {why}")
    start = time.monotonic()
    print(f"[validate] {len(tasks)} tasks from {', '.join(args.tasks)} on {args.backend}, {args.repeats} repeats")
    reports, leaks = validate(
        tasks, backend=args.backend, repeats=args.repeats, probe=not args.no_probe, mutants=not args.no_mutants
    )
    bad = [r for r in reports if not r.ok]
    print(f"[validate] split leaks: {summarise_leaks(leaks)}")
    for domain, (killed, total) in sorted(mutation_scores(reports).items()):
        print(f"[validate] mutation score {domain}: {killed}/{total} near misses and mutants score 0")
    print(
        f"[validate] {len(reports) - len(bad)}/{len(reports)} tasks sound, {len(leaks)} leaks, "
        f"{len(excluded)} excluded (left out by their loaders), {time.monotonic() - start:.1f}s"
    )
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "tasks": [dataclasses.asdict(r) | {"ok": r.ok} for r in reports],
            "leaks": [leak.to_dict() for leak in leaks],
            "sound": len(reports) - len(bad),
            "total": len(reports),
            "excluded": excluded,
            "mutation_scores": mutation_scores(reports),
        }
        args.report.write_text(json.dumps(payload, indent=1))
        print(f"[validate] report written to {args.report}")
    return 1 if bad or leaks else 0


if __name__ == "__main__":
    sys.exit(main())
