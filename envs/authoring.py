"""Compiles the human-written task sources (``envs/data/src/*.yaml``) into the shipped JSONL sets.

Tasks are written as YAML because code and CSV read naturally in block
literals; what ships and what environments load is JSONL (``envs/data/*.jsonl``).
Compilation derives what a person should not write by hand:

* repair: the gold patch (a unified diff from ``files`` to ``fix``), the
  hidden-test manifest and the fail-to-pass ids (those failing on the original
  code), from running the hidden tests as verification does (a judge process,
  the repository behind a plain-data proxy) on the gold and the original code in
  fresh sandboxes, cross-checked with plain pytest
  (:mod:`envs.verifiers.repair_reference`);
* shell: the goal checks (those failing in the initial state, found in a sandbox);
* pipeline: the expected output of every dataset (visible and hidden variants),
  computed by running the gold config through ``pipeline_runner.py``, plus the
  visible ``expected.csv``.

    python -m envs.authoring build                 # all sets
    python -m envs.authoring build --only repair   # one set
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from envs.tasks import DATA_DIR, Task, TaskError, write_jsonl

SOURCES = DATA_DIR / "src"


def unified_patch(before: dict[str, str], after: dict[str, str]) -> str:
    """A ``git diff``-style patch (``a/``, ``b/`` prefixes) turning ``before`` into ``after`` for changed paths."""
    chunks = []
    for path in sorted(after):
        old, new = before.get(path, ""), after[path]
        if old == new:
            continue
        diff = difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}" if path in before else "/dev/null",
            tofile=f"b/{path}",
        )
        chunks.append("".join(diff))
    if not chunks:
        raise TaskError("unified_patch: the fix changes nothing")
    return "".join(chunks)


def _common(rec: dict[str, Any], domain: str) -> dict[str, Any]:
    missing = [k for k in ("id", "prompt", "difficulty", "split") if k not in rec]
    if missing:
        raise TaskError(f"{domain} source {rec.get('id')!r}: missing {missing}")
    return {
        "id": rec["id"],
        "domain": domain,
        "prompt": rec["prompt"],
        "difficulty": rec["difficulty"],
        "split": rec["split"],
    }


def compile_math(records: list[dict[str, Any]], **_: Any) -> list[Task]:
    return [
        Task(
            **_common(r, "math"),
            hidden={"answer": str(r["answer"])},
            gold={"answer": str(r["answer"])},
            metadata={"source": "agentrl", "tags": r.get("tags", [])},
        )
        for r in records
    ]


def compile_repair(records: list[dict[str, Any]], *, backend: str = "bwrap", **_: Any) -> list[Task]:
    """Repair tasks, one fresh-sandbox reference each: see :func:`compile_repair_record`."""
    return [compile_repair_record(r, backend=backend) for r in records]


def compile_repair_record(r: dict[str, Any], *, backend: str = "bwrap") -> Task:
    """One repair task from its source record (``files``, ``fix``, ``hidden_tests``, ...).

    The manifest and the ``fail_to_pass`` tests come from running the hidden tests the
    way verification will (a judge process with the repository behind a proxy) on the
    gold repository and the original files, each in a fresh sandbox, cross-checked with
    plain pytest (:func:`envs.verifiers.repair_reference.build_reference`).
    """
    from envs.verifiers.repair_reference import ReferenceError, build_reference

    files, fix = dict(r["files"]), dict(r["fix"])
    import_roots = r.get("import_roots", ["/workspace"])
    protected = r.get("protected", ["tests/*"])
    try:
        reference = build_reference(
            r["hidden_tests"], files, fix, backend=backend, import_roots=import_roots, protected=protected
        )
    except ReferenceError as exc:
        raise TaskError(f"repair source {r['id']!r}: {exc}") from exc
    metadata = {
        "source": "agentrl",
        "test_command": r.get("test_command", "python3 -m pytest -q tests"),
        "protected": protected,
    }
    if "import_roots" in r:
        metadata["import_roots"] = list(import_roots)
    print(
        f"  {r['id']}: {len(reference.manifest)} hidden tests, {len(reference.fail_to_pass)} fail before the fix",
        flush=True,
    )
    return Task(
        **_common(r, "repair"),
        files=files,
        hidden=reference.hidden(r["hidden_tests"]),
        gold={"patch": unified_patch(files, fix)},
        metadata=metadata,
    )


def compile_shell(records: list[dict[str, Any]], *, backend: str = "bwrap", **_: Any) -> list[Task]:
    from envs.verifiers.state import run_state_checks, validate_checks
    from sandbox import SandboxSpec, get_backend

    tasks = []
    with get_backend(backend).create(SandboxSpec(timeout_s=120)) as sandbox:
        pristine = sandbox.snapshot()
        for r in records:
            validate_checks(r["checks"], f"shell source {r['id']!r} checks")
            sandbox.restore(pristine)
            if r.get("files"):
                sandbox.write_files(dict(r["files"]))
            if r.get("setup") and not sandbox.exec(r["setup"], timeout=60).ok:
                raise TaskError(f"shell source {r['id']!r}: setup failed")
            initial = run_state_checks(sandbox, r["checks"])
            goals = [c["name"] for c in initial if not c["ok"]]
            if not goals:
                raise TaskError(f"shell source {r['id']!r}: every check already holds before the agent acts")
            tasks.append(
                Task(
                    **_common(r, "shell"),
                    files=dict(r.get("files", {})),
                    hidden={"checks": list(r["checks"]), "goal_checks": goals},
                    gold={"script": r["gold"]},
                    metadata={
                        "source": "agentrl",
                        "setup": r.get("setup", ""),
                        **{k: r[k] for k in ("keep_services", "reset_before_cron") if k in r},
                    },
                )
            )
            print(f"  {r['id']}: {len(r['checks'])} checks, {len(goals)} fail in the initial state", flush=True)
    return tasks


def load_pipeline_runner():
    spec = importlib.util.spec_from_file_location("agentrl_pipeline_runner", DATA_DIR / "pipeline_runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_pipeline_locally(config: str, data: dict[str, str]) -> tuple[str, str]:
    """(output path, output text) of ``config`` over ``data``, run on the host in a scratch directory."""
    runner = load_pipeline_runner()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for path, content in {**data, "pipeline.yaml": config}.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
        out, _ = runner.run(str(root / "pipeline.yaml"))
        return str(Path(out).relative_to(root)), Path(out).read_text()


def compile_pipeline(records: list[dict[str, Any]], **_: Any) -> list[Task]:
    tasks = []
    for r in records:
        data = dict(r["data"])
        output, expected = run_pipeline_locally(r["gold"], data)
        datasets = [{"name": "visible", "files": data, "expected": expected}]
        for variant in r.get("variants", []):
            _, variant_expected = run_pipeline_locally(r["gold"], variant["data"])
            datasets.append({"name": variant["name"], "files": dict(variant["data"]), "expected": variant_expected})
        try:
            broken = run_pipeline_locally(r["config"], data)
        except Exception:  # noqa: BLE001 - a crashing config is a fine starting point
            broken = None
        if broken == (output, expected):
            raise TaskError(f"pipeline source {r['id']!r}: the broken config already produces the expected output")
        metadata = {
            "source": "agentrl",
            "config_path": "pipeline.yaml",
            "output_path": output,
            "test_command": f"python3 runner.py pipeline.yaml && diff -u expected.csv {output} && echo 'OK: matches'",
        }
        tasks.append(
            Task(
                **_common(r, "pipeline"),
                files={**data, "pipeline.yaml": r["config"], "expected.csv": expected},
                hidden={"datasets": datasets},
                gold={"files": {"pipeline.yaml": r["gold"]}},
                metadata=metadata,
            )
        )
    return tasks


COMPILERS: dict[str, Callable[..., list[Task]]] = {
    "math": compile_math,
    "repair": compile_repair,
    "shell": compile_shell,
    "pipeline": compile_pipeline,
}


def build(name: str, *, backend: str = "bwrap", out_dir: Path = DATA_DIR) -> Path:
    """Compiles ``src/<name>.yaml`` into ``<out_dir>/<name>.jsonl``; returns the path."""
    if name not in COMPILERS:
        raise TaskError(f"authoring: unknown set {name!r}; sets: {sorted(COMPILERS)}")
    records = yaml.safe_load((SOURCES / f"{name}.yaml").read_text())
    if not isinstance(records, list):
        raise TaskError(f"{SOURCES / name}.yaml: expected a list of task records")
    tasks = COMPILERS[name](records, backend=backend)
    path = out_dir / f"{name}.jsonl"
    write_jsonl(tasks, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.authoring", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile envs/data/src/*.yaml into envs/data/*.jsonl")
    b.add_argument("--only", action="append", choices=sorted(COMPILERS), help="build only these sets")
    b.add_argument("--backend", default="bwrap", help="sandbox backend for reference runs (default bwrap)")
    args = parser.parse_args(argv)
    for name in args.only or sorted(COMPILERS):
        start = time.monotonic()
        print(f"[authoring] building {name} ...", flush=True)
        path = build(name, backend=args.backend)
        count = sum(1 for _ in path.open())
        print(f"[authoring] {name}: {count} tasks -> {path} ({time.monotonic() - start:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
