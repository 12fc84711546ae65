"""Oracle reachability: could a process of the agent read hidden material, before, during or after its turn?

Hidden material is what grades the agent and must stay out of its reach: the
gold solution, hidden tests, state checks (their commands, queries, expected
contents), hidden datasets and expected outputs. :func:`secret_lines` takes the
lines of it that no visible file or the prompt contains; three probes search
the sandbox for them with the in-sandbox scanner
(``in_sandbox/oracle_scan.py``), running as the agent's uid so that they
see exactly what the agent's processes could:

* :func:`probe_oracle`, once: before the agent acts (nothing may be there: not a
  file, a git object, a process environment), or after verification (nothing a
  leftover process could still read).
* :func:`watch_oracle`, all along the turn: a detached watcher, like a process
  the agent left running, rescans files and every process it can see (command
  lines, environments, open descriptors, pipes peeked without being drained)
  until it is killed (a verifier that kills the agent's processes first kills
  it too, which is the point) or the sandbox is released.
* :func:`play_watched` plays an episode under a watcher and ends it with the
  probe after verification, returning every finding with when it was made.

The scanner is never handed the secrets, only keyed hashes of them (see its
docstring), so running it next to the agent reveals nothing. Plays that solve
the task legitimately produce expected outputs in the sandbox; watch plays
that do not (a no-op, a hack), or narrow ``lines`` to what no solution writes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.in_sandbox import bundle, shared, source
from envs.tasks import Task
from sandbox import SandboxFileError

ANCHOR = 16
SCANNER = bundle(
    source(Path(__file__).resolve().parent / "in_sandbox" / "oracle_scan.py"), {"git_env": shared("git_env")}
)
# Bookkeeping of hidden material that names things rather than giving them away.
_NOT_SECRET = frozenset({"manifest", "fail_to_pass", "goal_checks", "name", "type"})


def hidden_strings(value: Any) -> list[str]:
    """Every string inside hidden material (checks, tests, datasets, expected outputs), bookkeeping keys aside."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for key, item in value.items() if key not in _NOT_SECRET for s in hidden_strings(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in hidden_strings(item)]
    return []


def secret_lines(task: Task, *, min_len: int = 16) -> list[str]:
    """Lines of the gold solution and hidden material that neither the prompt nor a visible file contains.

    Each hidden string also counts whole (stripped), so that material made of short lines (an expected
    CSV of ``widget,12.5`` rows) is still searched for as the block it is.
    """
    visible = "\n".join([task.prompt, *task.files.values()])
    found: list[str] = []
    gold = task.gold
    if "patch" in gold:
        found += [ln[1:] for ln in gold["patch"].splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    for key in ("script", "completion"):
        if key in gold:
            found += gold[key].splitlines()
    for content in gold.get("files", {}).values():
        found += content.splitlines()
    for text in hidden_strings(task.hidden):
        found += [*text.splitlines(), text]
    return sorted({s.strip() for s in found if len(s.strip()) >= min_len and s.strip() not in visible})


def _digest(text: str, key: bytes) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), key=key, digest_size=8).hexdigest()


def needle_spec(lines: Sequence[str], key: bytes) -> dict[str, Any]:
    """What the scanner is told: keyed hashes of each line's start and whole, as written raw and JSON-escaped."""
    items = []
    for index, line in enumerate(lines):
        for variant in sorted({line, json.dumps(line)[1:-1]}):
            if len(variant) >= ANCHOR:
                items.append([_digest(variant[:ANCHOR], key), len(variant), _digest(variant, key), index])
    return {"key": key.hex(), "items": items}


def _findings(lines: Sequence[str], hits: Mapping[str, Sequence[str]]) -> list[str]:
    out = []
    for index, where in sorted(hits.items(), key=lambda kv: int(kv[0])):
        if int(index) < 0:
            out += [f"could not search everything: {w}" for w in where]
        else:
            out.append(f"{lines[int(index)]!r} readable in {', '.join(sorted(set(where))[:3])}")
    return out


def _scan(sandbox: Any, request: dict[str, Any], timeout: float) -> Any:
    return sandbox.exec(["python3", "-I", "-B", "-c", SCANNER], stdin=json.dumps(request), timeout=timeout)


def probe_oracle(sandbox: Any, task: Task, *, max_needles: int = 200, lines: Sequence[str] | None = None) -> list[str]:
    """Findings (empty when clean): where in ``sandbox`` a secret line of ``task`` can be read right now."""
    needles = list(lines if lines is not None else secret_lines(task))[:max_needles]
    if not needles:
        return []
    result = _scan(sandbox, {"mode": "once", "needles": needle_spec(needles, secrets.token_bytes(16))}, 120)
    if not result.ok:
        return [f"the oracle probe itself failed (exit {result.exit_code}): {result.stderr_text[-300:]}"]
    return _findings(needles, json.loads(result.stdout_text)["hits"])


@dataclasses.dataclass
class OracleWatch:
    """A watcher running in a sandbox (see :func:`watch_oracle`); :meth:`findings` reads what it has seen so far."""

    sandbox: Any
    lines: list[str]
    out: str
    problem: str | None = None

    def findings(self) -> list[str]:
        if self.problem:
            return [self.problem]
        try:
            data = self.sandbox.read_file(f"{self.out}/hits.json", max_bytes=1 << 20)
        except SandboxFileError:
            return []  # the watcher found nothing (it writes only once it has a hit)
        return _findings(self.lines, json.loads(data))


def watch_oracle(
    sandbox: Any,
    task: Task,
    *,
    max_needles: int = 200,
    lines: Sequence[str] | None = None,
    seconds: float = 600.0,
    interval_s: float = 0.1,
) -> OracleWatch:
    """Starts a watcher as the agent's uid that searches for ``task``'s secret lines until it is killed."""
    needles = list(lines if lines is not None else secret_lines(task))[:max_needles]
    watch = OracleWatch(sandbox, needles, f"/tmp/.agentrl-oracle-{secrets.token_hex(8)}")
    if needles:
        request = {"mode": "watch", "needles": needle_spec(needles, secrets.token_bytes(16)), "out": watch.out,
                   "seconds": seconds, "interval": interval_s}  # fmt: skip
        result = _scan(sandbox, request, 30)
        if not result.ok:
            watch.problem = f"the oracle watcher did not start (exit {result.exit_code}): {result.stderr_text[-300:]}"
    return watch


def play_watched(
    env: Any, task: Task, actions: Sequence[str], *, max_needles: int = 200, lines: Sequence[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Plays ``actions`` on ``task`` under a watcher, then probes after verification; (verification, findings).

    The watcher starts once the environment is built and runs through the turn and the verification; the
    closing probe runs when the episode's sandbox is about to be released. Findings are prefixed by when.
    """
    env.reset(options={"task": task})
    watch = watch_oracle(env.sandbox, task, max_needles=max_needles, lines=lines)
    findings: list[str] = []
    release = env._release

    def probe_then_release(sandbox: Any) -> None:
        try:
            if sandbox.healthy:
                findings.extend(f"during the turn or its verification: {f}" for f in watch.findings())
                after = probe_oracle(sandbox, task, max_needles=max_needles, lines=watch.lines)
                findings.extend(f"after verification: {f}" for f in after)
        finally:
            release(sandbox)

    env._release = probe_then_release
    info: dict[str, Any] = {}
    try:
        for action in actions:
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
    finally:
        env._release = release
    if "verification" not in info:
        raise RuntimeError(f"the episode did not end after {len(actions)} scripted actions")
    return info["verification"], findings
