"""Compiles the human-written task sources (``envs/data/src/*.yaml``) into the shipped JSONL sets.

    python -m envs.quality.authoring build                 # every set with a registered compiler
    python -m envs.quality.authoring build --only repair   # one set

Tasks are written as YAML because code and CSV read naturally in block
literals; what ships and what environments load is JSONL (``envs/data/*.jsonl``,
``builtin:NAME``). Compilation derives what a person should not write by hand,
and each domain knows what that is: its compiler, registered with
:func:`envs.quality.hooks.register_compiler` under the set's name, gets the
source's records and returns the tasks. The shipped ones:

* ``math`` (:mod:`envs.domains.math.env`): the answer becomes hidden reference and gold;
* ``repair`` (:mod:`envs.domains.repair.authoring`): the gold patch, the hidden-test
  manifest and the fail-to-pass ids, from running the hidden tests as
  verification does on the gold and the original code in fresh sandboxes,
  cross-checked with plain pytest;
* ``shell`` (:mod:`envs.domains.shell.env`): the goal checks, those failing in the
  initial state (found in a sandbox);
* ``pipeline`` (:mod:`envs.domains.pipeline.env`): the expected output of every
  dataset, from running the gold config through the pipeline runner.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

import envs  # noqa: F401 - the domains register their compilers
from envs.quality.hooks import COMPILERS
from envs.tasks import DATA_DIR, TaskError, write_jsonl

SOURCES = DATA_DIR / "src"


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
    parser = argparse.ArgumentParser(prog="python -m envs.quality.authoring", description=__doc__.split("\n")[0])
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
